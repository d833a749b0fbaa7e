// 32-value block types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL) on AVX2: vpmaddubsw (unsigned weight bytes x
// signed activation bytes -> 16-bit pairs, which cannot overflow for 4/5-bit values) then vpmaddwd by
// ones into 32-bit lanes. Nibble types are used as stored (w + C; the quantizer's C * sum(aq) comes off);
// Q8_0 uses |w| x sign(a, w) to stay unsigned.
// Same two kernels as the AVX-512 file (per token with lanes = 8 rows; tiled with lanes = 8 tokens),
// bit-identical per (t, o) (contract: kernels_internal.h).
#include <immintrin.h>

#include <algorithm>

#include "backend/cpu/kernels_internal.h"

namespace ss::cpu::detail::avx2 {

namespace {

using model::DType;

// Block layout: bytes per block, offsets of qs and qh; nib: 4-bit values (else Q8_0 bytes); five: a 5th
// bit in qh; min: has the m term; zp: the kernel's integer dot needs the C * sum(aq) correction.
// nl: nibbles index the IQ4_NL levels (signed bytes, as Q8_0's).
struct Layout {
  int bytes, qs, qh;
  bool nib, five, min, zp, nl = false;
};
template <DType T>
constexpr Layout kFmt{};
template <> constexpr Layout kFmt<DType::Q4_0>{18, 2, 0, true, false, false, true};
template <> constexpr Layout kFmt<DType::Q4_1>{20, 4, 0, true, false, true, false};
template <> constexpr Layout kFmt<DType::Q5_0>{22, 6, 2, true, true, false, true};
template <> constexpr Layout kFmt<DType::Q5_1>{24, 8, 4, true, true, true, false};
template <> constexpr Layout kFmt<DType::Q8_0>{34, 2, 0, false, false, false, false};
template <> constexpr Layout kFmt<DType::IQ4_NL>{18, 2, 0, true, false, false, false, true};
// Weight bytes are signed (|w| x sign(a, w) keeps vpmaddubsw unsigned x signed).
template <DType T>
constexpr bool kSigned = !kFmt<T>.nib || kFmt<T>.nl;

// One block as 32 bytes in element order: unsigned values for nibble types, Q8_0 as stored (signed).
template <DType T>
inline __m256i unpack_block(const uint8_t* blk) {
  constexpr Layout F = kFmt<T>;
  if constexpr (F.nib) {
    const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + F.qs));
    __m256i v = _mm256_and_si256(_mm256_inserti128_si256(_mm256_castsi128_si256(x), _mm_srli_epi16(x, 4), 1),
                                 _mm256_set1_epi8(0x0F));
    if constexpr (F.five) {  // bit j of qh -> 0x10 in byte j
      const __m256i bits = _mm256_set1_epi64x(0x7FBFDFEFF7FBFDFE);
      const __m256i h = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(load_as<uint32_t>(blk + F.qh))),
                                            _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202,
                                                               0x0303030303030303));
      const __m256i set = _mm256_cmpeq_epi8(_mm256_or_si256(h, bits), _mm256_set1_epi8(-1));
      v = _mm256_or_si256(v, _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
    }
    if constexpr (F.nl)
      v = _mm256_shuffle_epi8(
          _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(model::kIq4nlValues))), v);
    return v;
  } else {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + F.qs));
  }
}

// 16 int16 pair sums of w . a (w as unpack_block gives it, a signed).
template <DType T>
inline __m256i pairs(__m256i w, __m256i a) {
  if constexpr (!kSigned<T>) return _mm256_maddubs_epi16(w, a);
  else return _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(a, w));
}

// 8 int32 partial sums of w . a.
template <DType T>
inline __m256i dot4(__m256i w, __m256i a) {
  return _mm256_madd_epi16(pairs<T>(w, a), _mm256_set1_epi16(1));
}

// p[r]: row r's 8 partial sums over one block. Returns the 8 block sums, lanes = rows.
inline __m256i reduce_rows(const __m256i* p) {
  const __m256i q0 = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
  const __m256i q1 = _mm256_hadd_epi32(_mm256_hadd_epi32(p[4], p[5]), _mm256_hadd_epi32(p[6], p[7]));
  return _mm256_add_epi32(_mm256_permute2x128_si256(q0, q1, 0x20), _mm256_permute2x128_si256(q0, q1, 0x31));
}

// The per-block float step of the contract; both kernels call exactly this, lane for lane.
template <DType T>
inline __m256 block_step(__m256 acc, __m256i I, __m256 dw, __m256 mw, __m256 da, __m256 sa, __m256i corr) {
  if constexpr (kFmt<T>.zp) I = _mm256_sub_epi32(I, corr);
  acc = _mm256_fmadd_ps(_mm256_mul_ps(dw, da), _mm256_cvtepi32_ps(I), acc);
  if constexpr (kFmt<T>.min) acc = _mm256_fmadd_ps(mw, sa, acc);
  return acc;
}

// Low / high fp16 of each 32-bit lane to fp32.
inline __m256 half_lo(__m256i h) {
  const __m256i l = _mm256_and_si256(h, _mm256_set1_epi32(0xFFFF));
  return _mm256_cvtph_ps(_mm_packus_epi32(_mm256_castsi256_si128(l), _mm256_extracti128_si256(l, 1)));
}
inline __m256 half_hi(__m256i h) {
  const __m256i l = _mm256_srli_epi32(h, 16);
  return _mm256_cvtph_ps(_mm_packus_epi32(_mm256_castsi256_si128(l), _mm256_extracti128_si256(l, 1)));
}

template <DType T>
void rows_per_token(const model::Tensor& W, const QActs& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  constexpr Layout F = kFmt<T>;
  const int64_t nb = W.cols() / 32;
  const int64_t rs = static_cast<int64_t>(W.row_stride());
  const auto* base = static_cast<const uint8_t*>(W.data);
  for (int64_t o0 = r0; o0 < r1; o0 += 8) {
    const int nr = static_cast<int>(std::min<int64_t>(8, r1 - o0));
    const uint8_t* row[8];
    alignas(32) int32_t off[8];
    for (int r = 0; r < 8; ++r) {  // rows past the end repeat the last one; their lanes are dropped
      off[r] = static_cast<int32_t>(std::min(r, nr - 1) * rs);
      row[r] = base + o0 * rs + off[r];
    }
    const __m256i vidx = _mm256_load_si256(reinterpret_cast<const __m256i*>(off));
    const uint8_t* grp = base + o0 * rs;
    const __m256i keep = _mm256_cmpgt_epi32(_mm256_set1_epi32(nr), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    for (int t = 0; t < a.n_tok; ++t) {
      const int8_t* at = a.qs + a.qidx(t, 0);
      const int64_t s0 = a.sidx(t, 0);
      __m256 acc = _mm256_setzero_ps();
      for (int64_t b = 0; b < nb; ++b) {
        const __m256i av = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at + 32 * b));
        __m256i p[8];
        for (int r = 0; r < 8; ++r) p[r] = dot4<T>(unpack_block<T>(row[r] + b * F.bytes), av);
        const __m256i h = _mm256_i32gather_epi32(reinterpret_cast<const int*>(grp + b * F.bytes), vidx, 1);
        acc = block_step<T>(acc, reduce_rows(p), half_lo(h), F.min ? half_hi(h) : _mm256_setzero_ps(),
                            _mm256_set1_ps(a.d[s0 + b]), _mm256_set1_ps(a.s[s0 + b]),
                            _mm256_set1_epi32(a.corr[s0 + b]));
      }
      _mm256_maskstore_ps(y + t * ldy + o0, keep, acc);
    }
  }
}

// Values of a row unpacked per call; bounds the stack at R * kChunk bytes. Longer rows carry the
// accumulator through y between chunks (a float round trip is exact, so the contract holds).
constexpr int64_t kChunk = 4096;
constexpr int64_t kL2Bytes = 512 * 1024;  // activation bytes per token block

template <DType T, int R>
void rows_tiled(const model::Tensor& W, const QActs& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  constexpr Layout F = kFmt<T>;
  constexpr int G = 8;
  const int64_t cols = W.cols();
  const int64_t rs = static_cast<int64_t>(W.row_stride());
  const auto* base = static_cast<const uint8_t*>(W.data);
  const int ng = a.n_pad() / G;
  alignas(64) uint8_t wq[R][kChunk];
  alignas(64) float dw[R][kChunk / 32], mw[R][kChunk / 32];
  alignas(64) float tile[R][G];

  // Token blocks whose activations stay in L2 while every row tile passes over them.
  const int gb = static_cast<int>(std::max<int64_t>(1, kL2Bytes / (cols * G)));
  for (int gb0 = 0; gb0 < ng; gb0 += gb)
  for (int64_t o0 = r0; o0 < r1; o0 += R) {
    const int nr = static_cast<int>(std::min<int64_t>(R, r1 - o0));
    for (int64_t c0 = 0; c0 < cols; c0 += kChunk) {
      const int64_t b0 = c0 / 32, nbc = (std::min(cols, c0 + kChunk) - c0) / 32;
      for (int r = 0; r < R; ++r) {  // rows past the end repeat the last one; never stored
        const uint8_t* row = base + (o0 + std::min(r, nr - 1)) * rs + b0 * F.bytes;
        for (int64_t b = 0; b < nbc; ++b) {
          const uint8_t* blk = row + b * F.bytes;
          _mm256_store_si256(reinterpret_cast<__m256i*>(wq[r] + 32 * b), unpack_block<T>(blk));
          dw[r][b] = _cvtsh_ss(load_as<uint16_t>(blk));
          mw[r][b] = F.min ? _cvtsh_ss(load_as<uint16_t>(blk + 2)) : 0.0f;
        }
      }
      for (int g = gb0; g < std::min(ng, gb0 + gb); ++g) {
        const int nt = std::min(G, a.n_tok - g * G);
        __m256 acc[R];
        for (int r = 0; r < R; ++r) {
          if (c0 == 0) {
            acc[r] = _mm256_setzero_ps();
          } else {
            for (int l = 0; l < G; ++l) tile[r][l] = l < nt && r < nr ? y[(g * G + l) * ldy + o0 + r] : 0.0f;
            acc[r] = _mm256_load_ps(tile[r]);
          }
        }
        const int8_t* ab = a.qs + a.qidx(g * G, c0);
        const int64_t sb = a.sidx(g * G, b0);
        for (int64_t b = 0; b < nbc; ++b, ab += 8 * 32) {
          // 16-bit pair products are summed in 16 bits for kSum16 steps before widening (no overflow:
          // Q4 8 x 3810, Q5 4 x 7874 < 32767; Q8_0's |w| x a pairs reach 32512, so 1).
          constexpr int kSum16 = kSigned<T> ? 1 : F.five ? 4 : 8;
          __m256i isum[R];
          for (int r = 0; r < R; ++r) isum[r] = _mm256_setzero_si256();
          for (int k0 = 0; k0 < 8; k0 += kSum16) {
            __m256i p[R];
            for (int k = k0; k < k0 + kSum16; ++k) {
              const __m256i av = _mm256_load_si256(reinterpret_cast<const __m256i*>(ab + 32 * k));
              for (int r = 0; r < R; ++r) {
                const __m256i q = pairs<T>(_mm256_set1_epi32(load_as<int32_t>(wq[r] + 32 * b + 4 * k)), av);
                p[r] = k == k0 ? q : _mm256_add_epi16(p[r], q);
              }
            }
            for (int r = 0; r < R; ++r)
              isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(p[r], _mm256_set1_epi16(1)));
          }
          const __m256 da = _mm256_load_ps(a.d + sb + b * G), sa = _mm256_load_ps(a.s + sb + b * G);
          const __m256i corr = _mm256_load_si256(reinterpret_cast<const __m256i*>(a.corr + sb + b * G));
          for (int r = 0; r < R; ++r)
            acc[r] = block_step<T>(acc[r], isum[r], _mm256_set1_ps(dw[r][b]),
                                   _mm256_set1_ps(mw[r][b]), da, sa, corr);
        }
        for (int r = 0; r < nr; ++r) {
          _mm256_store_ps(tile[r], acc[r]);
          for (int l = 0; l < nt; ++l) y[(g * G + l) * ldy + o0 + r] = tile[r][l];
        }
      }
    }
  }
}

template <DType T>
void rows_t(const model::Tensor& W, const QActs& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  if (a.group == 1) rows_per_token<T>(W, a, y, ldy, r0, r1);
  else rows_tiled<T, 4>(W, a, y, ldy, r0, r1);
}

}  // namespace

// The tiled kernel stages every weight row once per call; below ~5 tokens the per-token kernel wins
// (measured: docs/perf/cpu-kernels.md).
int act_group(model::DType wtype, int n_tok) { return is_k_type(wtype) || n_tok < 5 ? 1 : 8; }

void rows_q32(const model::Tensor& W, const QActs& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  switch (W.type) {
    case DType::Q4_0: return rows_t<DType::Q4_0>(W, a, y, ldy, r0, r1);
    case DType::Q4_1: return rows_t<DType::Q4_1>(W, a, y, ldy, r0, r1);
    case DType::Q5_0: return rows_t<DType::Q5_0>(W, a, y, ldy, r0, r1);
    case DType::Q5_1: return rows_t<DType::Q5_1>(W, a, y, ldy, r0, r1);
    case DType::Q8_0: return rows_t<DType::Q8_0>(W, a, y, ldy, r0, r1);
    case DType::IQ4_NL: return rows_t<DType::IQ4_NL>(W, a, y, ldy, r0, r1);
    default: return;
  }
}

}  // namespace ss::cpu::detail::avx2
