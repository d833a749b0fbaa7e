// Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS through their packed form (PackedMatrix, layout in kernels_internal.h) on AVX-512 VNNI:
// the 16 lanes are 16 output rows, so the weights stream through vpdpbusd with the token's 4
// activation bytes broadcast, with no staging buffer and no horizontal sums (as the q32 packed
// kernels). Per sub-block the exact integer dot I_j is scaled by its row's sc_j (vpmulld) into the
// super-block's integer; the min / offset term comes from the activation sums by vpdpwssd. These
// integers and the float step per super-block are those of matmul_qk_avx512.cpp's rows_k, so the
// results are bit-identical to the unpacked kernel (and batch invariant in the same way).
#include <immintrin.h>

#include <algorithm>

#include "backend/cpu/amx_tiles.h"
#include "backend/cpu/kernels_internal.h"

namespace ss::cpu::detail::avx512 {

namespace {

using model::DType;

// Two int16 as one int32 lane (low, high), for vpdpwssd against int16 pairs.
inline int32_t pair16(int lo, int hi) {
  return static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint16_t>(lo)) |
                              (static_cast<uint32_t>(static_cast<uint16_t>(hi)) << 16));
}

// NT tokens from t0 over one row group (gp: its first super-block); keep: the group's valid rows.
// pf: the next group, prefetched a super-block's worth per super-block (null: none).
template <DType T, int NT>
[[gnu::always_inline]] inline void packed_k_tokens(const uint8_t* gp, int64_t nsb, const QActs& a, int t0, float* y,
                                                   int64_t ldy, int64_t o0, __mmask16 keep, const uint8_t* pf,
                                                   const SideSpread& side) {
  constexpr int kBlock = packed_format(T).block_bytes;
  constexpr int kLines = (kBlock + 63) / 64;
  const int64_t cols = a.cols;
  const int8_t* at[NT];
  const float* ad[NT];
  const int16_t* bs[NT];
  __m512 acc[NT];
  for (int i = 0; i < NT; ++i) {
    at[i] = a.qs + (t0 + i) * cols;
    ad[i] = a.d + (t0 + i) * nsb;
    bs[i] = a.bsum + (t0 + i) * (cols / 16);
    acc[i] = _mm512_setzero_ps();
  }
  const __m512i low4 = _mm512_set1_epi8(0x0F), hi2 = _mm512_set1_epi8(0x30);
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const uint8_t* p = gp + sb * kBlock;
    if (pf) {  // to L2 for any token count (prefetch_next_weights with n_tok 2: kernels_internal.h)
      for (int l = 0; l < kLines; ++l) prefetch_next_weights(pf + sb * kBlock + 64 * l, 2);
    }
    side.at(sb);
    __m512i isum[NT], off[NT];
    for (int i = 0; i < NT; ++i) isum[i] = off[i] = _mm512_setzero_si512();
    if constexpr (T == DType::Q4_K || T == DType::Q5_K) {
      const __m512i bit4 = _mm512_set1_epi8(0x10);
      for (int j = 0; j < 8; ++j) {
        __m512i I[NT];
        for (int i = 0; i < NT; ++i) I[i] = _mm512_setzero_si512();
        [[maybe_unused]] const __m512i h5 = T == DType::Q5_K ? _mm512_loadu_si512(p + 2368 + 64 * j) : __m512i{};
#pragma GCC unroll 4
        for (int v = 0; v < 4; ++v) {
          const __m512i w = _mm512_loadu_si512(p + 320 + 256 * j + 64 * v);
          __m512i lo = _mm512_and_si512(w, low4), hi = _mm512_and_si512(_mm512_srli_epi16(w, 4), low4);
          if constexpr (T == DType::Q5_K) {  // 5th bits v and 4 + v of each byte to bit 4 (16-bit shifts
                                             // cannot carry a neighbour's bit into bit 4 here)
            lo = _mm512_or_si512(lo, _mm512_and_si512(_mm512_slli_epi16(h5, 4 - v), bit4));
            hi = _mm512_or_si512(hi, _mm512_and_si512(_mm512_srli_epi16(h5, v), bit4));
          }
          for (int i = 0; i < NT; ++i) {
            const int8_t* x = at[i] + 256 * sb + 32 * j + 4 * v;
            I[i] = _mm512_dpbusd_epi32(I[i], lo, _mm512_set1_epi32(load_as<int32_t>(x)));
            I[i] = _mm512_dpbusd_epi32(I[i], hi, _mm512_set1_epi32(load_as<int32_t>(x + 16)));
          }
        }
        const __m512i sc = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 64 + 16 * j)));
        for (int i = 0; i < NT; ++i) isum[i] = _mm512_add_epi32(isum[i], _mm512_mullo_epi32(I[i], sc));
      }
      for (int k = 0; k < 4; ++k) {  // m_j times the sub-block sums S_j (two 16-value sums each)
        const __m512i mp =
            _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 192 + 32 * k)));
        for (int i = 0; i < NT; ++i) {
          const int16_t* b = bs[i] + 16 * sb + 4 * k;
          off[i] = _mm512_dpwssd_epi32(off[i], mp, _mm512_set1_epi32(pair16(b[0] + b[1], b[2] + b[3])));
        }
      }
      const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
      const __m512 mw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32)));
      for (int i = 0; i < NT; ++i) {
        const __m512 da = _mm512_set1_ps(ad[i][sb]);
        acc[i] = _mm512_fmadd_ps(_mm512_mul_ps(dw, da), _mm512_cvtepi32_ps(isum[i]), acc[i]);
        acc[i] = _mm512_fnmadd_ps(_mm512_mul_ps(mw, da), _mm512_cvtepi32_ps(off[i]), acc[i]);
      }
    } else if constexpr (T == DType::Q2_K) {  // 16 sub-blocks of 16: value plane k = bits 2k..2k+1
      const __m512i m3 = _mm512_set1_epi8(3), low4w = _mm512_set1_epi32(15);
      for (int j = 0; j < 16; ++j) {
        __m512i I[NT];
        for (int i = 0; i < NT; ++i) I[i] = _mm512_setzero_si512();
        const __m512i w = _mm512_loadu_si512(p + 320 + 64 * j);
#pragma GCC unroll 4
        for (int k = 0; k < 4; ++k) {
          const __m512i q = _mm512_and_si512(_mm512_srli_epi16(w, 2 * k), m3);
          for (int i = 0; i < NT; ++i)
            I[i] = _mm512_dpbusd_epi32(I[i], q, _mm512_set1_epi32(load_as<int32_t>(at[i] + 256 * sb + 16 * j + 4 * k)));
        }
        // Row r's scale bytes j & ~1, j | 1 as one int32 lane (low, high int16); sc = low nibble.
        const __m512i sp = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 64 + 32 * (j / 2))));
        const __m512i sc = _mm512_and_si512(j % 2 ? _mm512_srli_epi32(sp, 16) : sp, low4w);
        for (int i = 0; i < NT; ++i) isum[i] = _mm512_add_epi32(isum[i], _mm512_mullo_epi32(I[i], sc));
      }
      for (int k = 0; k < 8; ++k) {  // m_j (high nibbles) times the 16-value sums S_j, two sub-blocks at a time
        const __m512i mp = _mm512_srli_epi16(
            _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 64 + 32 * k))), 4);
        for (int i = 0; i < NT; ++i)
          off[i] = _mm512_dpwssd_epi32(off[i], mp, _mm512_set1_epi32(load_as<int32_t>(bs[i] + 16 * sb + 2 * k)));
      }
      const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
      const __m512 mw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32)));
      for (int i = 0; i < NT; ++i) {
        const __m512 da = _mm512_set1_ps(ad[i][sb]);
        acc[i] = _mm512_fmadd_ps(_mm512_mul_ps(dw, da), _mm512_cvtepi32_ps(isum[i]), acc[i]);
        acc[i] = _mm512_fnmadd_ps(_mm512_mul_ps(mw, da), _mm512_cvtepi32_ps(off[i]), acc[i]);
      }
    } else if constexpr (T == DType::Q3_K) {  // Q2_K's planes plus a high bit (u = q + 4h), Q6_K's offset form
      // The 16 6-bit scales, per lane as ggml unpacks one row's 12 bytes: byte b of s[k] = scale 4k + b.
      const __m512i a0 = _mm512_loadu_si512(p + 32), a1 = _mm512_loadu_si512(p + 96), tb = _mm512_loadu_si512(p + 160);
      const __m512i k1 = _mm512_set1_epi32(0x03030303), k2 = _mm512_set1_epi32(0x0f0f0f0f);
      const __m512i s[4] = {
          _mm512_or_si512(_mm512_and_si512(a0, k2), _mm512_slli_epi32(_mm512_and_si512(tb, k1), 4)),
          _mm512_or_si512(_mm512_and_si512(a1, k2), _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(tb, 2), k1), 4)),
          _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(a0, 4), k2),
                          _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(tb, 4), k1), 4)),
          _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(a1, 4), k2),
                          _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(tb, 6), k1), 4))};
      const __m512i m3 = _mm512_set1_epi8(3), bit2 = _mm512_set1_epi8(4), ff = _mm512_set1_epi32(0xFF);
      for (int jp = 0; jp < 8; ++jp) {  // sub-blocks 2jp, 2jp + 1 share a high-bit vector
        const __m512i H = _mm512_loadu_si512(p + 1248 + 64 * jp);
#pragma GCC unroll 2
        for (int e = 0; e < 2; ++e) {
          const int j = 2 * jp + e;
          __m512i I[NT];
          for (int i = 0; i < NT; ++i) I[i] = _mm512_setzero_si512();
          const __m512i L = _mm512_loadu_si512(p + 224 + 64 * j);
#pragma GCC unroll 4
          for (int k = 0; k < 4; ++k) {  // high bit 4e + k to bit 2 (16-bit shifts by <= 5 stay in the byte here)
            const int b = 4 * e + k;
            const __m512i hb = b >= 2 ? _mm512_srli_epi16(H, b - 2) : _mm512_slli_epi16(H, 2 - b);
            const __m512i q =
                _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(L, 2 * k), m3), _mm512_and_si512(hb, bit2));
            for (int i = 0; i < NT; ++i)
              I[i] = _mm512_dpbusd_epi32(I[i], q, _mm512_set1_epi32(load_as<int32_t>(at[i] + 256 * sb + 16 * j + 4 * k)));
          }
          const __m512i sc =
              _mm512_sub_epi32(_mm512_and_si512(_mm512_srli_epi32(s[j / 4], 8 * (j % 4)), ff), _mm512_set1_epi32(32));
          for (int i = 0; i < NT; ++i) isum[i] = _mm512_add_epi32(isum[i], _mm512_mullo_epi32(I[i], sc));
        }
      }
      for (int k = 0; k < 8; ++k) {  // values are stored + 4: 4 sc_j times the 16-value sums, pairs (2k, 2k + 1)
        const __m512i x = _mm512_srli_epi32(s[k / 2], 16 * (k % 2));
        const __m512i pr = _mm512_or_si512(_mm512_and_si512(x, ff), _mm512_and_si512(_mm512_slli_epi32(x, 8), _mm512_set1_epi32(0xFF0000)));
        const __m512i sp = _mm512_slli_epi16(_mm512_sub_epi16(pr, _mm512_set1_epi16(32)), 2);
        for (int i = 0; i < NT; ++i)
          off[i] = _mm512_dpwssd_epi32(off[i], sp, _mm512_set1_epi32(load_as<int32_t>(bs[i] + 16 * sb + 2 * k)));
      }
      const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
      for (int i = 0; i < NT; ++i)
        acc[i] = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(ad[i][sb])),
                                 _mm512_cvtepi32_ps(_mm512_sub_epi32(isum[i], off[i])), acc[i]);
    } else if constexpr (T == DType::IQ4_XS) {  // levels + 128 (u8): the dot's 128 sum(a) comes off
      const __m512i table =
          _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(model::kIq4nlValues)));
      const __m512i x80 = _mm512_set1_epi8(static_cast<char>(0x80));
      for (int j = 0; j < 8; ++j) {
        __m512i I[NT];
        for (int i = 0; i < NT; ++i) I[i] = _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int v = 0; v < 4; ++v) {
          const __m512i w = _mm512_loadu_si512(p + 160 + 256 * j + 64 * v);
          const __m512i lo = _mm512_xor_si512(_mm512_shuffle_epi8(table, _mm512_and_si512(w, low4)), x80);
          const __m512i hi =
              _mm512_xor_si512(_mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16(w, 4), low4)), x80);
          for (int i = 0; i < NT; ++i) {
            const int8_t* x = at[i] + 256 * sb + 32 * j + 4 * v;
            I[i] = _mm512_dpbusd_epi32(I[i], lo, _mm512_set1_epi32(load_as<int32_t>(x)));
            I[i] = _mm512_dpbusd_epi32(I[i], hi, _mm512_set1_epi32(load_as<int32_t>(x + 16)));
          }
        }
        const __m512i sp = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 + 32 * (j / 2))));
        const __m512i sc = j % 2 ? _mm512_srai_epi32(sp, 16) : _mm512_srai_epi32(_mm512_slli_epi32(sp, 16), 16);
        for (int i = 0; i < NT; ++i) isum[i] = _mm512_add_epi32(isum[i], _mm512_mullo_epi32(I[i], sc));
      }
      for (int k = 0; k < 4; ++k) {  // 128 sc_j times the sub-block sums S_j
        const __m512i sp = _mm512_slli_epi16(
            _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 + 32 * k))), 7);
        for (int i = 0; i < NT; ++i) {
          const int16_t* b = bs[i] + 16 * sb + 4 * k;
          off[i] = _mm512_dpwssd_epi32(off[i], sp, _mm512_set1_epi32(pair16(b[0] + b[1], b[2] + b[3])));
        }
      }
      const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
      for (int i = 0; i < NT; ++i)
        acc[i] = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(ad[i][sb])),
                                 _mm512_cvtepi32_ps(_mm512_sub_epi32(isum[i], off[i])), acc[i]);
    } else {  // Q6_K: chunk c (values 4c..4c+3) = low nibbles of vector c % 32 (high half from c >= 32)
              // | bits 2(c / 16) of high-bit vector c % 16; sub-block j = chunks 4j..4j+3.
      for (int j = 0; j < 16; ++j) {
        const int q = j / 4;  // the quarter: which nibble and which 2 high bits
        __m512i I[NT];
        for (int i = 0; i < NT; ++i) I[i] = _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int u = 0; u < 4; ++u) {
          const int c = 4 * j + u;
          const __m512i nl = _mm512_loadu_si512(p + 288 + 64 * (c % 32));
          const __m512i h = _mm512_loadu_si512(p + 2336 + 64 * (c % 16));
          const __m512i lo = q < 2 ? _mm512_and_si512(nl, low4) : _mm512_and_si512(_mm512_srli_epi16(nl, 4), low4);
          const __m512i hb = q == 0 ? _mm512_slli_epi16(h, 4) : q == 1 ? _mm512_slli_epi16(h, 2) : q == 2 ? h : _mm512_srli_epi16(h, 2);
          const __m512i w = _mm512_or_si512(lo, _mm512_and_si512(hb, hi2));
          for (int i = 0; i < NT; ++i)
            I[i] = _mm512_dpbusd_epi32(I[i], w, _mm512_set1_epi32(load_as<int32_t>(at[i] + 256 * sb + 4 * c)));
        }
        const __m512i sp = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 + 32 * (j / 2))));
        const __m512i sc = j % 2 ? _mm512_srai_epi32(sp, 16) : _mm512_srai_epi32(_mm512_slli_epi32(sp, 16), 16);
        for (int i = 0; i < NT; ++i) isum[i] = _mm512_add_epi32(isum[i], _mm512_mullo_epi32(I[i], sc));
      }
      for (int k = 0; k < 8; ++k) {  // values are stored + 32: 32 sc_j times the 16-value sums
        const __m512i sp = _mm512_slli_epi16(
            _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 + 32 * k))), 5);
        for (int i = 0; i < NT; ++i)
          off[i] = _mm512_dpwssd_epi32(off[i], sp, _mm512_set1_epi32(load_as<int32_t>(bs[i] + 16 * sb + 2 * k)));
      }
      const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
      for (int i = 0; i < NT; ++i)
        acc[i] = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(ad[i][sb])),
                                 _mm512_cvtepi32_ps(_mm512_sub_epi32(isum[i], off[i])), acc[i]);
    }
  }
  for (int i = 0; i < NT; ++i) _mm512_mask_storeu_ps(y + (t0 + i) * ldy + o0, keep, acc[i]);
}

// f.template operator()<n>() for a run-time n in [1, N].
template <int N, class F>
[[gnu::always_inline]] inline void with_tokens(int n, F&& f) {
  if constexpr (N > 1)
    if (n < N) return with_tokens<N - 1>(n, f);
  f.template operator()<N>();
}

// Tokens per pass over a group: NT integer, offset and float accumulators beside the weights. Each
// pass rebuilds the weight bytes, so more tokens per pass share that work: 8 for the types whose
// rebuild is dearest (Q6_K, Q3_K: a high-bit plane; IQ4_XS: a table lookup), 4 for the rest, where 8
// was no faster (Q5_K, Q2_K) or slower (Q4_K +5%). bench_kernels --threads 1 --ntok 16 ffn_down, Zen 4,
// weights in cache, 4 -> 8: Q6_K 110 -> 98 us, Q3_K 111 -> 100, IQ4_XS 94 -> 90.5 (2026-12-05).
template <DType T>
constexpr int kTokens = T == DType::Q6_K || T == DType::Q3_K || T == DType::IQ4_XS ? 8 : 4;

template <DType T>
void rows_packed_kt(const PackedMatrix& P, const QActs& a, float* y, int64_t ldy, int64_t g0, int64_t g1) {
  const int64_t nsb = P.cols / 256;
  for (int64_t g = g0; g < g1; ++g) {
    const uint8_t* gp = P.data + g * P.group_bytes;
    const int64_t o0 = g * kPackRows;
    const int nr = static_cast<int>(std::min<int64_t>(kPackRows, P.rows - o0));
    const __mmask16 keep = static_cast<__mmask16>((1u << nr) - 1);
    for (int t = 0; t < a.n_tok; t += kTokens<T>) {
      const uint8_t* pf = t == 0 && g + 1 < g1 ? gp + P.group_bytes : nullptr;  // the first pass fetches ahead
      const SideSpread side = side_take(a.side, 8 * nsb, nsb);  // a super-block is 8 blocks of 32
      with_tokens<kTokens<T>>(std::min(kTokens<T>, a.n_tok - t),
                           [&]<int NT>() { packed_k_tokens<T, NT>(gp, nsb, a, t, y, ldy, o0, keep, pf, side); });
    }
  }
}

// ---- AMX-INT8 for Q4_K, Q5_K and Q6_K (see matmul_q32_avx512.cpp for the tile scheme) -------------
// Per super-block, each sub-block's integer dot I_j for 16 tokens x 16 rows is one tile multiply (A:
// the tokens' sub-block activation bytes, B: the sub-block's weight bytes as packed lanes, decoded
// once per super-block and group). The super-block integer sum_j sc_j I_j is then summed per token
// with vpmulld, and the float step is that of packed_k_tokens. Q6_K's B holds the signed values
// (q - 32, TDPBSSD), so its integer is directly isum - off of the VNNI kernel; Q4_K/Q5_K keep the
// unsigned values and the same min term. Exact integers, same float step: the same bits.
// Tiles: amx_configure(nt, kb) (amx_tiles.h), kb the sub-block's values.

template <DType T>
struct KSub {
  static constexpr int n = T == DType::Q6_K ? 16 : 8;  // sub-blocks per super-block
  static constexpr int kb = 256 / n;                   // values per sub-block
};

// Super-block p of a group as B tiles in u (sub-block j at u + 16 * kb * j: kb / 4 rows of 64 bytes), and its sub-block scales
// as int32 vectors in sc (sc + 16 j).
template <DType T>
SS_AMX inline void amx_decode_k(const uint8_t* p, uint8_t* u, int32_t* sc) {
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  if constexpr (T == DType::Q6_K) {
    const __m512i hi2 = _mm512_set1_epi8(0x30), off = _mm512_set1_epi8(32);
    for (int c = 0; c < 64; ++c) {  // chunk c (values 4c..4c+3) is B row c % 4 of sub-block c / 4
      const int q = c / 16;
      const __m512i nl = _mm512_loadu_si512(p + 288 + 64 * (c % 32));
      const __m512i h = _mm512_loadu_si512(p + 2336 + 64 * (c % 16));
      const __m512i lo = q < 2 ? _mm512_and_si512(nl, low4) : _mm512_and_si512(_mm512_srli_epi16(nl, 4), low4);
      const __m512i hb = q == 0 ? _mm512_slli_epi16(h, 4) : q == 1 ? _mm512_slli_epi16(h, 2) : q == 2 ? h : _mm512_srli_epi16(h, 2);
      _mm512_store_si512(u + 64 * c, _mm512_sub_epi8(_mm512_or_si512(lo, _mm512_and_si512(hb, hi2)), off));
    }
    for (int j = 0; j < 16; ++j) {
      const __m512i sp = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 + 32 * (j / 2))));
      _mm512_store_si512(sc + 16 * j, j % 2 ? _mm512_srai_epi32(sp, 16) : _mm512_srai_epi32(_mm512_slli_epi32(sp, 16), 16));
    }
  } else {
    const __m512i bit4 = _mm512_set1_epi8(0x10);
    for (int j = 0; j < 8; ++j) {
      [[maybe_unused]] const __m512i h5 = T == DType::Q5_K ? _mm512_loadu_si512(p + 2368 + 64 * j) : __m512i{};
      for (int v = 0; v < 4; ++v) {  // B rows v (values 32j + 4v..) and 4 + v (values 32j + 16 + 4v..)
        const __m512i w = _mm512_loadu_si512(p + 320 + 256 * j + 64 * v);
        __m512i lo = _mm512_and_si512(w, low4), hi = _mm512_and_si512(_mm512_srli_epi16(w, 4), low4);
        if constexpr (T == DType::Q5_K) {
          lo = _mm512_or_si512(lo, _mm512_and_si512(_mm512_slli_epi16(h5, 4 - v), bit4));
          hi = _mm512_or_si512(hi, _mm512_and_si512(_mm512_srli_epi16(h5, v), bit4));
        }
        _mm512_store_si512(u + 512 * j + 64 * v, lo);
        _mm512_store_si512(u + 512 * j + 256 + 64 * v, hi);
      }
      _mm512_store_si512(sc + 16 * j,
                         _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 64 + 16 * j))));
    }
  }
}

constexpr int kAmxTokensK = 16;

// Tokens [t0, t0 + nt) over one group, NT >= nt accumulators (extra lanes repeat the last token and
// are never stored).
template <DType T, int NT>
SS_AMX void amx_k_tokens(const uint8_t* gp, int64_t nsb, const QActs& a, int t0, int nt, float* y, int64_t ldy,
                         int64_t o0, __mmask16 keep, const uint8_t* pf, const SideSpread& side) {
  constexpr int kBlock = packed_format(T).block_bytes;
  constexpr int kLines = (kBlock + 63) / 64;
  constexpr int NS = KSub<T>::n, KB = KSub<T>::kb;
  const int64_t cols = a.cols;
  const float* ad[NT];
  const int16_t* bs[NT];
  __m512 acc[NT];
  for (int i = 0; i < NT; ++i) {
    const int t = t0 + (i < nt ? i : nt - 1);
    ad[i] = a.d + t * nsb;
    bs[i] = a.bsum + t * (cols / 16);
    acc[i] = _mm512_setzero_ps();
  }
  // Decoded super-blocks alternate between two slots, one super-block ahead of their tile loads (a
  // tile load of bytes still in the store buffer stalls).
  alignas(64) uint8_t u[2][4096];
  alignas(64) int32_t sc[2][16 * 16];
  alignas(64) int32_t cb[NS][kAmxTokensK * 16];
  amx_decode_k<T>(gp, u[0], sc[0]);
  const int8_t* aq = a.qs + t0 * cols;
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const uint8_t* p = gp + sb * kBlock;
    const uint8_t* ub = u[sb % 2];
    for (int j = 0; j < NS; j += 2) {
      _tile_loadd(0, aq + 256 * sb + KB * j, cols);
      _tile_loadd(1, ub + 16 * KB * j, 64);
      _tile_zero(2);
      _tile_loadd(3, aq + 256 * sb + KB * (j + 1), cols);
      _tile_loadd(4, ub + 16 * KB * (j + 1), 64);
      _tile_zero(5);
      if constexpr (T == DType::Q6_K) {
        _tile_dpbssd(2, 0, 1);
        _tile_dpbssd(5, 3, 4);
      } else {
        _tile_dpbsud(2, 0, 1);
        _tile_dpbsud(5, 3, 4);
      }
      _tile_stored(2, cb[j], 64);
      _tile_stored(5, cb[j + 1], 64);
    }
    if (sb + 1 < nsb) amx_decode_k<T>(p + kBlock, u[(sb + 1) % 2], sc[(sb + 1) % 2]);
    const int32_t* s = sc[sb % 2];
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    [[maybe_unused]] const __m512 mw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32)));
    for (int i = 0; i < NT; ++i) {
      // The next group's lines of this super-block (to L2) and the side stream's, a share a token
      // instead of all at once: a burst of 50-90 prefetches waits on the fill buffers.
      if (pf)
        for (int l = i * kLines / NT; l < (i + 1) * kLines / NT; ++l) prefetch_next_weights(pf + sb * kBlock + 64 * l, a.n_tok);
      side.at_part(sb, i, NT);
      __m512i isum = _mm512_setzero_si512();
      for (int j = 0; j < NS; ++j)
        isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(_mm512_load_si512(cb[j] + 16 * i), _mm512_load_si512(s + 16 * j)));
      const __m512 da = _mm512_set1_ps(ad[i][sb]);
      acc[i] = _mm512_fmadd_ps(_mm512_mul_ps(dw, da), _mm512_cvtepi32_ps(isum), acc[i]);
      if constexpr (T != DType::Q6_K) {  // m_j times the sub-block sums S_j, as packed_k_tokens
        __m512i off = _mm512_setzero_si512();
        for (int k = 0; k < 4; ++k) {
          const __m512i mp =
              _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 192 + 32 * k)));
          const int16_t* b = bs[i] + 16 * sb + 4 * k;
          off = _mm512_dpwssd_epi32(off, mp, _mm512_set1_epi32(pair16(b[0] + b[1], b[2] + b[3])));
        }
        acc[i] = _mm512_fnmadd_ps(_mm512_mul_ps(mw, da), _mm512_cvtepi32_ps(off), acc[i]);
      }
    }
  }
  for (int i = 0; i < NT; ++i)
    if (i < nt) _mm512_mask_storeu_ps(y + (t0 + i) * ldy + o0, keep, acc[i]);
}

template <DType T>
SS_AMX void rows_packed_amx_k(const PackedMatrix& P, const QActs& a, float* y, int64_t ldy, int64_t g0, int64_t g1) {
  const int64_t nsb = P.cols / 256;
  amx_walk_groups(P, a.n_tok, kAmxTokensK, KSub<T>::kb, g0, g1,
                  [&](const uint8_t* gp, int64_t o0, __mmask16 keep, int t, int nt, const uint8_t* pf) SS_AMX {
                    // The side stream's lines of two 4-token VNNI passes (per_block per 16 rows x 32
                    // columns: cpu_backend.cpp), spread over its super-blocks: half of what the VNNI
                    // passes a 16-token pass replaces take. At that full share the AMX products were
                    // ~2.2 ms a step slower and attention ~1 ms faster (16 streams, Q4_K_M, AMX Xeon,
                    // a build beside); a quarter was even there. On a quiet machine, with each thread
                    // prefetching the K/V of the rows it attends (cpu_backend.cpp), half gains ~0.4 ms
                    // a step over a quarter (docs/perf/cpu.md, 2026-12-07).
                    const SideSpread side = side_take(a.side, 16 * nsb, nsb);
                    if (nt > 12) amx_k_tokens<T, 16>(gp, nsb, a, t, nt, y, ldy, o0, keep, pf, side);
                    else if (nt > 8) amx_k_tokens<T, 12>(gp, nsb, a, t, nt, y, ldy, o0, keep, pf, side);
                    else if (nt > 4) amx_k_tokens<T, 8>(gp, nsb, a, t, nt, y, ldy, o0, keep, pf, side);
                    else amx_k_tokens<T, 4>(gp, nsb, a, t, nt, y, ldy, o0, keep, pf, side);
                  });
}

}  // namespace

void rows_packed_k(const PackedMatrix& P, const QActs& a, float* y, int64_t ldy, int64_t g0, int64_t g1) {
  if (a.n_tok >= kAmxMinTokensK && amx_active()) {
    if (P.type == DType::Q4_K) return rows_packed_amx_k<DType::Q4_K>(P, a, y, ldy, g0, g1);
    if (P.type == DType::Q5_K) return rows_packed_amx_k<DType::Q5_K>(P, a, y, ldy, g0, g1);
    if (P.type == DType::Q6_K) return rows_packed_amx_k<DType::Q6_K>(P, a, y, ldy, g0, g1);
  }
  if (P.type == DType::Q2_K) rows_packed_kt<DType::Q2_K>(P, a, y, ldy, g0, g1);
  else if (P.type == DType::Q3_K) rows_packed_kt<DType::Q3_K>(P, a, y, ldy, g0, g1);
  else if (P.type == DType::Q4_K) rows_packed_kt<DType::Q4_K>(P, a, y, ldy, g0, g1);
  else if (P.type == DType::Q5_K) rows_packed_kt<DType::Q5_K>(P, a, y, ldy, g0, g1);
  else if (P.type == DType::Q6_K) rows_packed_kt<DType::Q6_K>(P, a, y, ldy, g0, g1);
  else if (P.type == DType::IQ4_XS) rows_packed_kt<DType::IQ4_XS>(P, a, y, ldy, g0, g1);
}

}  // namespace ss::cpu::detail::avx512
