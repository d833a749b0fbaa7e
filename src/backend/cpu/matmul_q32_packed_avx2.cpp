// 32-value block types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL) through their packed form (PackedMatrix, layout in
// kernels_internal.h) on AVX2, for CPUs without AVX-512. As matmul_qk_packed_avx2.cpp, each 64-byte
// packed vector is read as two 8-row halves (bytes 0..31: rows 0..7, 32..63: rows 8..15), one AVX2
// vector each with a row per 32-bit lane, so the lanes are output rows: no staging buffer and no
// horizontal sums. With no vpdpbusd, vpmaddubsw (unsigned weight x signed activation pairs) then
// vpmaddwd by ones give the exact 4-value integers; nibble types are used as stored (w + C, the
// quantizer's C * sum(aq) comes off as in the unpacked kernel), Q8_0's stored w ^ 0x80 is turned back
// into w and multiplied as |w| x sign(a, w) (255 x 127 pairs would saturate int16). IQ4_NL's nibbles
// are looked up into its signed levels (vpshufb) and then multiplied as Q8_0's bytes.
// The integer per block and the float step are those of matmul_q32_avx2.cpp's block_step, so the results
// are bit-identical to the unpacked AVX2 kernel (and batch invariant the same way).
#include <immintrin.h>

#include <algorithm>

#include "backend/cpu/kernels_internal.h"

namespace ss::cpu::detail::avx2 {

namespace {

using model::DType;

// Per type: scale header bytes (32, or 64 with the min), 5th bits, a min term, the C * sum(aq) correction;
// nl: Q4_0's nibble vectors indexing the IQ4_NL levels, used as Q8_0's signed bytes (so nib is false).
struct Packed32 {
  int header;
  bool nib, five, min, zp, nl = false;
};
template <DType T>
constexpr Packed32 kPk{};
template <> constexpr Packed32 kPk<DType::Q4_0>{32, true, false, false, true};
template <> constexpr Packed32 kPk<DType::Q4_1>{64, true, false, true, false};
template <> constexpr Packed32 kPk<DType::Q5_0>{32, true, true, false, true};
template <> constexpr Packed32 kPk<DType::Q5_1>{64, true, true, true, false};
template <> constexpr Packed32 kPk<DType::Q8_0>{32, false, false, false, false};
template <> constexpr Packed32 kPk<DType::IQ4_NL>{32, false, false, false, false, true};

// Signed value vector k (values 4k..4k+3 of each of the 8 rows of half h) of a block at p: Q8_0's stored
// w ^ 0x80 turned back into w, or IQ4_NL's level of nibble vector k % 4 (low nibbles for k < 4).
template <DType T>
[[gnu::always_inline]] inline __m256i signed_vector(const uint8_t* p, int k, int h) {
  constexpr Packed32 F = kPk<T>;
  if constexpr (F.nl) {
    const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + F.header + 64 * (k % 4) + 32 * h));
    const __m256i nib = _mm256_and_si256(k < 4 ? w : _mm256_srli_epi16(w, 4), _mm256_set1_epi8(0x0F));
    return _mm256_shuffle_epi8(
        _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(model::kIq4nlValues))), nib);
  } else {
    return _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + F.header + 64 * k + 32 * h)),
                            _mm256_set1_epi8(static_cast<char>(0x80)));
  }
}

// NT tokens from t0 over the halves [h0, h0 + NH) of one row group (gp: its first block); nr: the
// group's valid rows. Both halves in one pass share each token's activation broadcasts.
template <DType T, int NT, int NH>
[[gnu::always_inline]] inline void packed_tokens(const uint8_t* gp, int64_t nb, const QActs& a, int t0, float* y,
                                                 int64_t ldy, int64_t o0, int h0, int nr) {
  constexpr Packed32 F = kPk<T>;
  constexpr int kBlock = packed_format(T).block_bytes;
  const int64_t cols = a.cols;
  const int8_t* at[NT];
  const float* ad[NT];
  const float* as[NT];
  const int32_t* ac[NT];
  __m256 acc[NH][NT];
  for (int i = 0; i < NT; ++i) {
    at[i] = a.qs + (t0 + i) * cols;
    ad[i] = a.d + (t0 + i) * nb;
    as[i] = a.s + (t0 + i) * nb;
    ac[i] = a.corr + (t0 + i) * nb;
    for (int h = 0; h < NH; ++h) acc[h][i] = _mm256_setzero_ps();
  }
  const __m256i low4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* p = gp + b * kBlock;
    __m256i isum[NH][NT];
    for (int h = 0; h < NH; ++h)
      for (int i = 0; i < NT; ++i) isum[h][i] = _mm256_setzero_si256();
    if constexpr (F.nib) {
      // 16-bit pair sums stay exact over all 8 products of a Q4 block (8 x 3810) and over 4 of a Q5
      // block (4 x 7874 < 32767), so Q4 widens once per block and Q5 twice.
      constexpr int kSum16 = F.five ? 2 : 4;  // vectors j per widening (2 products each)
      __m256i p16[NH][NT];
      for (int h = 0; h < NH; ++h)
        for (int i = 0; i < NT; ++i) p16[h][i] = _mm256_setzero_si256();
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {
        __m256i lo[NH], hi[NH];
        for (int h = 0; h < NH; ++h) {
          const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + F.header + 64 * j + 32 * (h0 + h)));
          lo[h] = _mm256_and_si256(w, low4);
          hi[h] = _mm256_and_si256(_mm256_srli_epi16(w, 4), low4);
          if constexpr (F.five) {  // bits j and 4 + j of the 5th-bit vector to 0x10 (16-bit shifts cannot
                                   // carry a neighbour byte's bit into bit 4 here)
            const __m256i hb =
                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + F.header + 256 + 32 * (h0 + h)));
            const __m256i bit5 = _mm256_set1_epi8(0x10);
            lo[h] = _mm256_or_si256(lo[h], _mm256_and_si256(_mm256_slli_epi16(hb, 4 - j), bit5));
            hi[h] = _mm256_or_si256(hi[h], _mm256_and_si256(_mm256_srli_epi16(hb, j), bit5));
          }
        }
        for (int i = 0; i < NT; ++i) {
          const int8_t* x = at[i] + 32 * b + 4 * j;
          const __m256i xl = _mm256_set1_epi32(load_as<int32_t>(x)), xh = _mm256_set1_epi32(load_as<int32_t>(x + 16));
          for (int h = 0; h < NH; ++h) {
            const __m256i q = _mm256_add_epi16(_mm256_maddubs_epi16(lo[h], xl), _mm256_maddubs_epi16(hi[h], xh));
            p16[h][i] = j % kSum16 == 0 ? q : _mm256_add_epi16(p16[h][i], q);
            if (j % kSum16 == kSum16 - 1)
              isum[h][i] = _mm256_add_epi32(isum[h][i], _mm256_madd_epi16(p16[h][i], ones));
          }
        }
      }
    } else {
#pragma GCC unroll 8
      for (int k = 0; k < 8; ++k) {
        __m256i w[NH], aw[NH];
        for (int h = 0; h < NH; ++h) {
          w[h] = signed_vector<T>(p, k, h0 + h);
          aw[h] = _mm256_abs_epi8(w[h]);
        }
        for (int i = 0; i < NT; ++i) {
          const __m256i x = _mm256_set1_epi32(load_as<int32_t>(at[i] + 32 * b + 4 * k));
          for (int h = 0; h < NH; ++h) {
            const __m256i q = _mm256_madd_epi16(_mm256_maddubs_epi16(aw[h], _mm256_sign_epi8(x, w[h])), ones);
            isum[h][i] = _mm256_add_epi32(isum[h][i], q);
          }
        }
      }
    }
    for (int h = 0; h < NH; ++h) {
      const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * (h0 + h))));
      [[maybe_unused]] const __m256 mw =
          F.min ? _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 32 + 16 * (h0 + h)))) : dw;
      for (int i = 0; i < NT; ++i) {  // matmul_q32_avx2.cpp's block_step
        __m256i I = isum[h][i];
        if constexpr (F.zp) I = _mm256_sub_epi32(I, _mm256_set1_epi32(ac[i][b]));
        acc[h][i] = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(ad[i][b])), _mm256_cvtepi32_ps(I), acc[h][i]);
        if constexpr (F.min) acc[h][i] = _mm256_fmadd_ps(mw, _mm256_set1_ps(as[i][b]), acc[h][i]);
      }
    }
  }
  for (int h = 0; h < NH; ++h) {
    const int n = std::clamp(nr - 8 * (h0 + h), 0, 8);  // valid rows of this half
    const __m256i keep = _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    for (int i = 0; i < NT; ++i) _mm256_maskstore_ps(y + (t0 + i) * ldy + o0 + 8 * (h0 + h), keep, acc[h][i]);
  }
}

template <int N, class F>
[[gnu::always_inline]] inline void with_tokens(int n, F&& f) {
  if constexpr (N > 1)
    if (n < N) return with_tokens<N - 1>(n, f);
  f.template operator()<N>();
}

// Over many tokens: block-outer over one half, so each block's weights are unpacked once for up to
// kChunkTokens tokens (nibble types: lo/hi in 8 registers; Q8_0: w and |w| in a 512-byte buffer), the
// tokens' float accumulators in L1. Per (token, block) the integer and the float step are
// packed_tokens' exactly.
constexpr int kChunkTokens = 64;

template <DType T>
void block_outer(const uint8_t* gp, int64_t nb, const QActs& a, float* y, int64_t ldy, int64_t o0, int h, int nr) {
  constexpr Packed32 F = kPk<T>;
  constexpr int kBlock = packed_format(T).block_bytes;
  const int64_t cols = a.cols;
  const __m256i low4 = _mm256_set1_epi8(0x0F), bit5 = _mm256_set1_epi8(0x10), ones = _mm256_set1_epi16(1);
  const int n = std::clamp(nr - 8 * h, 0, 8);
  const __m256i keep = _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  alignas(32) float accb[kChunkTokens][8];
  alignas(32) uint8_t w8[8][32], aw8[8][32];  // Q8_0: w and |w| of the block's 8 vectors
  for (int t0 = 0; t0 < a.n_tok; t0 += kChunkTokens) {
    const int nt = std::min(kChunkTokens, a.n_tok - t0);
    for (int i = 0; i < nt; ++i) _mm256_store_ps(accb[i], _mm256_setzero_ps());
    // per_block lines per 16 rows x 4 tokens of a block: 8 rows x nt tokens here
    const SideSpread side = side_take(a.side, (nb * nt + 7) / 8, nb);
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* p = gp + b * kBlock;
      side.at(b);
      __m256i lo[4], hi[4];
      if constexpr (F.nib) {
        [[maybe_unused]] const __m256i hb =
            F.five ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + F.header + 256 + 32 * h)) : low4;
        for (int j = 0; j < 4; ++j) {
          const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + F.header + 64 * j + 32 * h));
          lo[j] = _mm256_and_si256(w, low4);
          hi[j] = _mm256_and_si256(_mm256_srli_epi16(w, 4), low4);
          if constexpr (F.five) {
            lo[j] = _mm256_or_si256(lo[j], _mm256_and_si256(_mm256_slli_epi16(hb, 4 - j), bit5));
            hi[j] = _mm256_or_si256(hi[j], _mm256_and_si256(_mm256_srli_epi16(hb, j), bit5));
          }
        }
      } else {
        for (int k = 0; k < 8; ++k) {
          const __m256i w = signed_vector<T>(p, k, h);
          _mm256_store_si256(reinterpret_cast<__m256i*>(w8[k]), w);
          _mm256_store_si256(reinterpret_cast<__m256i*>(aw8[k]), _mm256_abs_epi8(w));
        }
      }
      const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * h)));
      [[maybe_unused]] const __m256 mw =
          F.min ? _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 32 + 16 * h))) : dw;
      for (int i = 0; i < nt; ++i) {
        const int t = t0 + i;
        const int8_t* x = a.qs + t * cols + 32 * b;
        __m256i I = _mm256_setzero_si256();
        if constexpr (F.nib) {
          // 16-bit pair sums: all 8 products of a Q4 block (8 x 3810), 4 of a Q5 block (4 x 7874).
          constexpr int kSum16 = F.five ? 2 : 4;  // vectors j per widening
          for (int j0 = 0; j0 < 4; j0 += kSum16) {
            __m256i p16 = _mm256_setzero_si256();
            for (int j = j0; j < j0 + kSum16; ++j)
              p16 = _mm256_add_epi16(
                  p16, _mm256_add_epi16(_mm256_maddubs_epi16(lo[j], _mm256_set1_epi32(load_as<int32_t>(x + 4 * j))),
                                        _mm256_maddubs_epi16(hi[j], _mm256_set1_epi32(load_as<int32_t>(x + 16 + 4 * j)))));
            I = _mm256_add_epi32(I, _mm256_madd_epi16(p16, ones));
          }
        } else {
          for (int k = 0; k < 8; ++k) {
            const __m256i w = _mm256_load_si256(reinterpret_cast<const __m256i*>(w8[k]));
            const __m256i aw = _mm256_load_si256(reinterpret_cast<const __m256i*>(aw8[k]));
            const __m256i xs = _mm256_sign_epi8(_mm256_set1_epi32(load_as<int32_t>(x + 4 * k)), w);
            I = _mm256_add_epi32(I, _mm256_madd_epi16(_mm256_maddubs_epi16(aw, xs), ones));
          }
        }
        const int64_t si = t * nb + b;
        if constexpr (F.zp) I = _mm256_sub_epi32(I, _mm256_set1_epi32(a.corr[si]));
        __m256 acc = _mm256_load_ps(accb[i]);
        acc = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(a.d[si])), _mm256_cvtepi32_ps(I), acc);
        if constexpr (F.min) acc = _mm256_fmadd_ps(mw, _mm256_set1_ps(a.s[si]), acc);
        _mm256_store_ps(accb[i], acc);
      }
    }
    for (int i = 0; i < nt; ++i) _mm256_maskstore_ps(y + (t0 + i) * ldy + o0 + 8 * h, keep, _mm256_load_ps(accb[i]));
  }
}

// Tokens per pass: over both halves of a group 2 (per token and half a float and an integer
// accumulator and the 16-bit pair sums, beside the weights, in AVX2's 16 registers), so each broadcast
// activation feeds both halves. From kBlockOuterFrom tokens block_outer, which unpacks each block once
// for all of them, is faster (ffn_down, 1 thread: at 3-4 tokens the passes were up to 10% faster for
// Q4_1/Q8_0, at 8 block_outer by 7-10%, at 16 and 512 by 3-13%); Q5_0/Q5_1 rebuild their 5-bit
// values per pass, as many instructions as 2 tokens' products, so they switch above 2.
constexpr int kTokens = 2;
template <DType T>
constexpr int kBlockOuterFrom = kPk<T>.five ? 3 : 5;

template <DType T>
void rows_packed_t(const PackedMatrix& P, const QActs& a, float* y, int64_t ldy, int64_t g0, int64_t g1) {
  const int64_t nb = P.cols / 32;
  for (int64_t g = g0; g < g1; ++g) {
    const uint8_t* gp = P.data + g * P.group_bytes;
    const int64_t o0 = g * kPackRows;
    const int nr = static_cast<int>(std::min<int64_t>(kPackRows, P.rows - o0));
    if (a.n_tok >= kBlockOuterFrom<T>) {
      for (int h = 0; h < 2 && 8 * h < nr; ++h) block_outer<T>(gp, nb, a, y, ldy, o0, h, nr);
      continue;
    }
    for (int t = 0; t < a.n_tok; t += kTokens)
      with_tokens<kTokens>(std::min(kTokens, a.n_tok - t), [&]<int NT>() {
        if (nr > 8) packed_tokens<T, NT, 2>(gp, nb, a, t, y, ldy, o0, 0, nr);
        else packed_tokens<T, NT, 1>(gp, nb, a, t, y, ldy, o0, 0, nr);
      });
  }
}

}  // namespace

void rows_packed(const PackedMatrix& P, const QActs& a, float* y, int64_t ldy, int64_t g0, int64_t g1) {
  switch (P.type) {
    case DType::Q4_0: return rows_packed_t<DType::Q4_0>(P, a, y, ldy, g0, g1);
    case DType::Q4_1: return rows_packed_t<DType::Q4_1>(P, a, y, ldy, g0, g1);
    case DType::Q5_0: return rows_packed_t<DType::Q5_0>(P, a, y, ldy, g0, g1);
    case DType::Q5_1: return rows_packed_t<DType::Q5_1>(P, a, y, ldy, g0, g1);
    case DType::Q8_0: return rows_packed_t<DType::Q8_0>(P, a, y, ldy, g0, g1);
    case DType::IQ4_NL: return rows_packed_t<DType::IQ4_NL>(P, a, y, ldy, g0, g1);
    case DType::Q2_K: case DType::Q3_K: case DType::Q4_K: case DType::Q5_K: case DType::Q6_K: case DType::IQ4_XS:
      return rows_packed_k(P, a, y, ldy, g0, g1);
    default: return;
  }
}

}  // namespace ss::cpu::detail::avx2
