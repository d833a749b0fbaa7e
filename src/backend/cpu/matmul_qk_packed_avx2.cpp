// Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS through their packed form (PackedMatrix, layout in kernels_internal.h) on
// AVX2, for CPUs without AVX-512: a 64-byte packed vector holds 16 rows x 4 bytes, so its low 32 bytes
// are rows 0..7 and its high 32 bytes rows 8..15, and each half is one AVX2 vector with a row per
// 32-bit lane. With no vpdpbusd, vpmaddubsw (pairs; |63 x 127 x 2| fits int16) then vpmaddwd by ones
// give the exact 4-value integers (IQ4_XS's signed levels as |w| x sign(a, w)). The integers and the
// float step per super-block are those of matmul_qk_avx2.cpp's rows_k, so the results are
// bit-identical to the unpacked AVX2 kernel (and batch invariant the same way).
#include <immintrin.h>

#include <algorithm>

#include "backend/cpu/kernels_internal.h"

namespace ss::cpu::detail::avx2 {

namespace {

using model::DType;

inline int32_t pair16(int lo, int hi) {
  return static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint16_t>(lo)) |
                              (static_cast<uint32_t>(static_cast<uint16_t>(hi)) << 16));
}

// NT tokens from t0 over half h (rows 8h .. 8h+7) of one row group (gp: its first super-block).
template <DType T, int NT>
[[gnu::always_inline]] inline void packed_k_tokens(const uint8_t* gp, int64_t nsb, const QActs& a, int t0,
                                                   float* y, int64_t ldy, int64_t o0, int h, int nr,
                                                   const SideSpread& side) {
  constexpr int kBlock = packed_format(T).block_bytes;
  const int64_t cols = a.cols;
  const int8_t* at[NT];
  const float* ad[NT];
  const int16_t* bs[NT];
  __m256 acc[NT];
  for (int i = 0; i < NT; ++i) {
    at[i] = a.qs + (t0 + i) * cols;
    ad[i] = a.d + (t0 + i) * nsb;
    bs[i] = a.bsum + (t0 + i) * (cols / 16);
    acc[i] = _mm256_setzero_ps();
  }
  const __m256i low4 = _mm256_set1_epi8(0x0F), hi2 = _mm256_set1_epi8(0x30), ones = _mm256_set1_epi16(1);
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const uint8_t* p = gp + sb * kBlock;
    side.at(sb);
    __m256i isum[NT], off[NT];
    for (int i = 0; i < NT; ++i) isum[i] = off[i] = _mm256_setzero_si256();
    if constexpr (T == DType::Q6_K) {  // as matmul_qk_packed_avx512.cpp: chunk c = 4j + u of sub-block j
      for (int j = 0; j < 16; ++j) {
        const int q = j / 4;  // the quarter: which nibble and which 2 high bits
        __m256i I[NT];
        for (int i = 0; i < NT; ++i) I[i] = _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int u = 0; u < 4; ++u) {
          const int c = 4 * j + u;
          const __m256i nl = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 288 + 64 * (c % 32) + 32 * h));
          const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2336 + 64 * (c % 16) + 32 * h));
          const __m256i lo = q < 2 ? _mm256_and_si256(nl, low4) : _mm256_and_si256(_mm256_srli_epi16(nl, 4), low4);
          const __m256i hs = q == 0   ? _mm256_slli_epi16(hb, 4)
                             : q == 1 ? _mm256_slli_epi16(hb, 2)
                             : q == 2 ? hb
                                      : _mm256_srli_epi16(hb, 2);
          const __m256i w = _mm256_or_si256(lo, _mm256_and_si256(hs, hi2));
          for (int i = 0; i < NT; ++i) {
            const __m256i pr = _mm256_maddubs_epi16(w, _mm256_set1_epi32(load_as<int32_t>(at[i] + 256 * sb + 4 * c)));
            I[i] = _mm256_add_epi32(I[i], _mm256_madd_epi16(pr, ones));
          }
        }
        const __m256i sp =
            _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 32 + 32 * (j / 2) + 16 * h)));
        const __m256i sc = j % 2 ? _mm256_srai_epi32(sp, 16) : _mm256_srai_epi32(_mm256_slli_epi32(sp, 16), 16);
        for (int i = 0; i < NT; ++i) isum[i] = _mm256_add_epi32(isum[i], _mm256_mullo_epi32(I[i], sc));
      }
      for (int k = 0; k < 8; ++k) {  // values are stored + 32: 32 sc_j times the 16-value sums
        const __m256i sp = _mm256_slli_epi16(
            _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 32 + 32 * k + 16 * h))), 5);
        for (int i = 0; i < NT; ++i)
          off[i] = _mm256_add_epi32(
              off[i], _mm256_madd_epi16(sp, _mm256_set1_epi32(load_as<int32_t>(bs[i] + 16 * sb + 2 * k))));
      }
      const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * h)));
      for (int i = 0; i < NT; ++i)
        acc[i] = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(ad[i][sb])),
                                 _mm256_cvtepi32_ps(_mm256_sub_epi32(isum[i], off[i])), acc[i]);
      continue;
    }
    if constexpr (T == DType::Q2_K || T == DType::Q3_K) {  // as the AVX-512 kernel: 16 sub-blocks of 16
      // Per sub-block, the 4 planes' vpmaddubsw pairs add up in int16 (|7 x 127 x 2 x 4| fits), then one
      // vpmaddwd by the row's (sc, sc) gives sc_j I_j exactly, without vpmulld.
      constexpr bool three = T == DType::Q3_K;
      constexpr int lo_off = three ? 224 : 320;
      const __m256i m3 = _mm256_set1_epi8(3), bit2 = _mm256_set1_epi8(4), ff = _mm256_set1_epi32(0xFF);
      [[maybe_unused]] __m256i s3[4];  // Q3_K: the 6-bit scales per lane, byte b of s3[k] = scale 4k + b (ggml's unpacking)
      if constexpr (three) {
        const __m256i a0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 + 32 * h));
        const __m256i a1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 96 + 32 * h));
        const __m256i tb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 160 + 32 * h));
        const __m256i k1 = _mm256_set1_epi32(0x03030303), k2 = _mm256_set1_epi32(0x0f0f0f0f);
        s3[0] = _mm256_or_si256(_mm256_and_si256(a0, k2), _mm256_slli_epi32(_mm256_and_si256(tb, k1), 4));
        s3[1] = _mm256_or_si256(_mm256_and_si256(a1, k2),
                                _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(tb, 2), k1), 4));
        s3[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(a0, 4), k2),
                                _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(tb, 4), k1), 4));
        s3[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(a1, 4), k2),
                                _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(tb, 6), k1), 4));
      }
      for (int jp = 0; jp < 8; ++jp) {
        [[maybe_unused]] const __m256i H =
            three ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 1248 + 64 * jp + 32 * h)) : __m256i{};
#pragma GCC unroll 2
        for (int e = 0; e < 2; ++e) {
          const int j = 2 * jp + e;
          __m256i P16[NT];
          for (int i = 0; i < NT; ++i) P16[i] = _mm256_setzero_si256();
          const __m256i L = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + lo_off + 64 * j + 32 * h));
#pragma GCC unroll 4
          for (int k = 0; k < 4; ++k) {
            __m256i q = _mm256_and_si256(_mm256_srli_epi16(L, 2 * k), m3);
            if constexpr (three) {  // high bit 4e + k to bit 2 (16-bit shifts by <= 5 stay in the byte here)
              const int b = 4 * e + k;
              const __m256i hb = b >= 2 ? _mm256_srli_epi16(H, b - 2) : _mm256_slli_epi16(H, 2 - b);
              q = _mm256_or_si256(q, _mm256_and_si256(hb, bit2));
            }
            for (int i = 0; i < NT; ++i)
              P16[i] = _mm256_add_epi16(
                  P16[i], _mm256_maddubs_epi16(q, _mm256_set1_epi32(load_as<int32_t>(at[i] + 256 * sb + 16 * j + 4 * k))));
          }
          __m256i sc;  // int32 per row
          if constexpr (three) {
            sc = _mm256_sub_epi32(_mm256_and_si256(_mm256_srli_epi32(s3[j / 4], 8 * (j % 4)), ff), _mm256_set1_epi32(32));
          } else {
            const __m256i sp =
                _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 64 + 32 * (j / 2) + 16 * h)));
            sc = _mm256_and_si256(j % 2 ? _mm256_srli_epi32(sp, 16) : sp, _mm256_set1_epi32(15));
          }
          const __m256i sc2 = _mm256_or_si256(_mm256_and_si256(sc, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(sc, 16));
          for (int i = 0; i < NT; ++i) isum[i] = _mm256_add_epi32(isum[i], _mm256_madd_epi16(P16[i], sc2));
        }
      }
      for (int k = 0; k < 8; ++k) {  // Q2_K: m_j; Q3_K: 4 sc_j (values stored + 4); times the 16-value sums
        __m256i sp;
        if constexpr (three) {
          const __m256i x = _mm256_srli_epi32(s3[k / 2], 16 * (k % 2));
          const __m256i pr =
              _mm256_or_si256(_mm256_and_si256(x, ff), _mm256_and_si256(_mm256_slli_epi32(x, 8), _mm256_set1_epi32(0xFF0000)));
          sp = _mm256_slli_epi16(_mm256_sub_epi16(pr, _mm256_set1_epi16(32)), 2);
        } else {
          sp = _mm256_srli_epi16(
              _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 64 + 32 * k + 16 * h))), 4);
        }
        for (int i = 0; i < NT; ++i)
          off[i] = _mm256_add_epi32(
              off[i], _mm256_madd_epi16(sp, _mm256_set1_epi32(load_as<int32_t>(bs[i] + 16 * sb + 2 * k))));
      }
      const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * h)));
      if constexpr (three) {
        for (int i = 0; i < NT; ++i)
          acc[i] = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(ad[i][sb])),
                                   _mm256_cvtepi32_ps(_mm256_sub_epi32(isum[i], off[i])), acc[i]);
      } else {
        const __m256 mw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 32 + 16 * h)));
        for (int i = 0; i < NT; ++i) {
          const __m256 da = _mm256_set1_ps(ad[i][sb]);
          acc[i] = _mm256_fmadd_ps(_mm256_mul_ps(dw, da), _mm256_cvtepi32_ps(isum[i]), acc[i]);
          acc[i] = _mm256_fnmadd_ps(_mm256_mul_ps(mw, da), _mm256_cvtepi32_ps(off[i]), acc[i]);
        }
      }
      continue;
    }
    if constexpr (T == DType::IQ4_XS) {  // as the AVX-512 kernel, but signed: 127 x 127 pairs, one per widening
      const __m256i table =
          _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(model::kIq4nlValues)));
      for (int j = 0; j < 8; ++j) {
        __m256i I[NT];
        for (int i = 0; i < NT; ++i) I[i] = _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int v = 0; v < 4; ++v) {
          const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 160 + 256 * j + 64 * v + 32 * h));
          const __m256i lo = _mm256_shuffle_epi8(table, _mm256_and_si256(w, low4));
          const __m256i hi = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(w, 4), low4));
          const __m256i alo = _mm256_abs_epi8(lo), ahi = _mm256_abs_epi8(hi);
          for (int i = 0; i < NT; ++i) {
            const int8_t* x = at[i] + 256 * sb + 32 * j + 4 * v;
            const __m256i pl = _mm256_maddubs_epi16(alo, _mm256_sign_epi8(_mm256_set1_epi32(load_as<int32_t>(x)), lo));
            const __m256i ph =
                _mm256_maddubs_epi16(ahi, _mm256_sign_epi8(_mm256_set1_epi32(load_as<int32_t>(x + 16)), hi));
            I[i] = _mm256_add_epi32(I[i], _mm256_add_epi32(_mm256_madd_epi16(pl, ones), _mm256_madd_epi16(ph, ones)));
          }
        }
        const __m256i sp =
            _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 32 + 32 * (j / 2) + 16 * h)));
        const __m256i sc = j % 2 ? _mm256_srai_epi32(sp, 16) : _mm256_srai_epi32(_mm256_slli_epi32(sp, 16), 16);
        for (int i = 0; i < NT; ++i) isum[i] = _mm256_add_epi32(isum[i], _mm256_mullo_epi32(I[i], sc));
      }
      const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * h)));
      for (int i = 0; i < NT; ++i)
        acc[i] = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(ad[i][sb])), _mm256_cvtepi32_ps(isum[i]), acc[i]);
      continue;
    }
    const __m256i bit4 = _mm256_set1_epi8(0x10);
    for (int j = 0; j < 8; ++j) {
      __m256i I[NT];
      for (int i = 0; i < NT; ++i) I[i] = _mm256_setzero_si256();
      [[maybe_unused]] const __m256i h5 =
          T == DType::Q5_K ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2368 + 64 * j + 32 * h))
                           : __m256i{};
#pragma GCC unroll 4
      for (int v = 0; v < 4; ++v) {
        const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 320 + 256 * j + 64 * v + 32 * h));
        __m256i lo = _mm256_and_si256(w, low4), hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), low4);
        if constexpr (T == DType::Q5_K) {  // 5th bits v and 4 + v of each byte to bit 4 (31 x 127 x 2 x 2 fits int16)
          lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16(h5, 4 - v), bit4));
          hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_srli_epi16(h5, v), bit4));
        }
        for (int i = 0; i < NT; ++i) {
          const int8_t* x = at[i] + 256 * sb + 32 * j + 4 * v;
          const __m256i pl = _mm256_maddubs_epi16(lo, _mm256_set1_epi32(load_as<int32_t>(x)));
          const __m256i ph = _mm256_maddubs_epi16(hi, _mm256_set1_epi32(load_as<int32_t>(x + 16)));
          I[i] = _mm256_add_epi32(I[i], _mm256_madd_epi16(_mm256_add_epi16(pl, ph), ones));
        }
      }
      const __m256i sc =
          _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 64 + 16 * j + 8 * h)));
      for (int i = 0; i < NT; ++i) isum[i] = _mm256_add_epi32(isum[i], _mm256_mullo_epi32(I[i], sc));
    }
    for (int k = 0; k < 4; ++k) {  // m_j times the sub-block sums S_j (two 16-value sums each)
      const __m256i mp =
          _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 192 + 32 * k + 16 * h)));
      for (int i = 0; i < NT; ++i) {
        const int16_t* b = bs[i] + 16 * sb + 4 * k;
        off[i] = _mm256_add_epi32(off[i], _mm256_madd_epi16(mp, _mm256_set1_epi32(pair16(b[0] + b[1], b[2] + b[3]))));
      }
    }
    const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * h)));
    const __m256 mw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 32 + 16 * h)));
    for (int i = 0; i < NT; ++i) {
      const __m256 da = _mm256_set1_ps(ad[i][sb]);
      acc[i] = _mm256_fmadd_ps(_mm256_mul_ps(dw, da), _mm256_cvtepi32_ps(isum[i]), acc[i]);
      acc[i] = _mm256_fnmadd_ps(_mm256_mul_ps(mw, da), _mm256_cvtepi32_ps(off[i]), acc[i]);
    }
  }
  const int n = std::clamp(nr - 8 * h, 0, 8);  // valid rows of this half
  const __m256i keep = _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  for (int i = 0; i < NT; ++i) _mm256_maskstore_ps(y + (t0 + i) * ldy + o0 + 8 * h, keep, acc[i]);
}

template <int N, class F>
[[gnu::always_inline]] inline void with_tokens(int n, F&& f) {
  if constexpr (N > 1)
    if (n < N) return with_tokens<N - 1>(n, f);
  f.template operator()<N>();
}

// Tokens per pass over a half group: per token an integer, an offset and a float accumulator, and the
// sub-block's integers, beside the weights in AVX2's 16 registers (2 tokens). Q6_K takes 4 (some
// spills) so that its 6-bit unpacking is shared by more tokens: at 2 it was 27% slower than the
// unpacked kernel at 16 and 512 tokens (bench_kernels ffn_down, 1 thread); at 4 it is on par there.
// Q3_K likewise (its 3-bit values rebuilt per pass): 1.03-1.05x the unpacked kernel at 16 and 512
// tokens with 2, 1.2x with 4; Q2_K's 2-bit planes are cheap and 4 was no faster than 2.
template <DType T>
constexpr int kTokens = T == DType::Q6_K || T == DType::Q3_K ? 4 : 2;

template <DType T>
void rows_packed_t(const PackedMatrix& P, const QActs& a, float* y, int64_t ldy, int64_t g0, int64_t g1) {
  const int64_t nsb = P.cols / 256;
  for (int64_t g = g0; g < g1; ++g) {
    const uint8_t* gp = P.data + g * P.group_bytes;
    const int64_t o0 = g * kPackRows;
    const int nr = static_cast<int>(std::min<int64_t>(kPackRows, P.rows - o0));
    for (int h = 0; h < 2 && 8 * h < nr; ++h)
      for (int t = 0; t < a.n_tok; t += kTokens<T>) {
        const int nt = std::min(kTokens<T>, a.n_tok - t);
        // per_block lines per 16 rows x 4 tokens of 32 columns: 8 rows x nt tokens of 256 here
        const SideSpread side = side_take(a.side, int64_t{nt} * nsb, nsb);
        with_tokens<kTokens<T>>(nt, [&]<int NT>() { packed_k_tokens<T, NT>(gp, nsb, a, t, y, ldy, o0, h, nr, side); });
      }
  }
}

}  // namespace

void rows_packed_k(const PackedMatrix& P, const QActs& a, float* y, int64_t ldy, int64_t g0, int64_t g1) {
  switch (P.type) {
    case DType::Q2_K: return rows_packed_t<DType::Q2_K>(P, a, y, ldy, g0, g1);
    case DType::Q3_K: return rows_packed_t<DType::Q3_K>(P, a, y, ldy, g0, g1);
    case DType::Q4_K: return rows_packed_t<DType::Q4_K>(P, a, y, ldy, g0, g1);
    case DType::Q5_K: return rows_packed_t<DType::Q5_K>(P, a, y, ldy, g0, g1);
    case DType::Q6_K: return rows_packed_t<DType::Q6_K>(P, a, y, ldy, g0, g1);
    case DType::IQ4_XS: return rows_packed_t<DType::IQ4_XS>(P, a, y, ldy, g0, g1);
    default: return;
  }
}

}  // namespace ss::cpu::detail::avx2
