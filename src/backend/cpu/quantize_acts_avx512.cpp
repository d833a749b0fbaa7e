// Activation quantization for the AVX-512 kernels (rule and layout: act_quant.h).
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "backend/cpu/kernels_internal.h"

namespace ss::cpu::detail::avx512 {

namespace {

// Rounds to nearest even (the MXCSR default, as act_quant.h specifies); |v| <= 127 by construction.
inline __m512i round_q(__m512 v, __m512 id) { return _mm512_cvtps_epi32(_mm512_mul_ps(v, id)); }

// vpdpbusd needs unsigned weights: Q8_0 is used as w ^ 0x80 = w + 128, nibble types as stored.
int zero_point(model::DType t) {
  switch (t) {
    case model::DType::Q4_0: return 8;
    case model::DType::Q5_0: return 16;
    case model::DType::Q8_0: case model::DType::IQ4_NL: return 128;
    default: return 0;
  }
}

void zero_token(const QActs& a, int t) {
  for (int64_t k = 0; k < a.cols; k += 4) std::memset(a.qs + a.qidx(t, k), 0, 4);
  for (int64_t b = 0; b < a.nb(); ++b) {
    const int64_t i = a.sidx(t, b);
    a.d[i] = a.s[i] = 0.0f;
    a.corr[i] = 0;
  }
}

// Scales of 16 blocks at once: the two divisions of act_scale dominate per-block work when done one
// block at a time. Vector division is IEEE-exact like the scalar one, so the bits are the same.
// Returns d; *id = 1/d (0 where d is 0).
inline __m512 scales16(__m512 amax, __m512* id) {
  const __m512 vd = _mm512_div_ps(amax, _mm512_set1_ps(127.0f));
  const __mmask16 nz = _mm512_cmp_ps_mask(vd, _mm512_setzero_ps(), _CMP_NEQ_OQ);
  *id = _mm512_maskz_div_ps(nz, _mm512_set1_ps(1.0f), vd);
  return vd;
}
inline void scales16(const float* amax, int n, float* d, float* id) {
  const __mmask16 m = static_cast<__mmask16>((1u << n) - 1);
  __m512 vid;
  _mm512_mask_storeu_ps(d, m, scales16(_mm512_maskz_loadu_ps(m, amax), &vid));
  _mm512_mask_storeu_ps(id, m, vid);
}

// 16 horizontal reductions at once: lane j of the result = op over the 16 lanes of v[j]. Four rounds
// of pairing (each: two shuffles and one op per pair) instead of 16 separate reductions (~8 ops each).
// Only for exact ops (max, integer add): the pairing order does not change the result.
template <class V, class Op>
inline V reduce16(V* v, Op op) {
  const auto f = [](V x) { return _mm512_castsi512_ps(reinterpret_cast<__m512i>(x)); };
  const auto i = [](__m512 x) { return reinterpret_cast<V>(_mm512_castps_si512(x)); };
  // Round 1: quarters 0-1 of w[j] hold block 2j's 8 partials, quarters 2-3 block 2j+1's.
  for (int j = 0; j < 8; ++j)
    v[j] = op(i(_mm512_shuffle_f32x4(f(v[2 * j]), f(v[2 * j + 1]), 0x44)),
              i(_mm512_shuffle_f32x4(f(v[2 * j]), f(v[2 * j + 1]), 0xEE)));
  // Round 2: quarter k of v[j] holds block 4j + k's 4 partials.
  for (int j = 0; j < 4; ++j)
    v[j] = op(i(_mm512_shuffle_f32x4(f(v[2 * j]), f(v[2 * j + 1]), 0x88)),
              i(_mm512_shuffle_f32x4(f(v[2 * j]), f(v[2 * j + 1]), 0xDD)));
  // Round 3: quarter k of v[j] holds blocks 8j + k (lanes 0-1) and 8j + 4 + k (lanes 2-3).
  for (int j = 0; j < 2; ++j)
    v[j] = op(i(_mm512_shuffle_ps(f(v[2 * j]), f(v[2 * j + 1]), _MM_SHUFFLE(1, 0, 1, 0))),
              i(_mm512_shuffle_ps(f(v[2 * j]), f(v[2 * j + 1]), _MM_SHUFFLE(3, 2, 3, 2))));
  // Round 4: lane 4k + m holds block 4m + k; then put block j in lane j.
  const V r = op(i(_mm512_shuffle_ps(f(v[0]), f(v[1]), _MM_SHUFFLE(2, 0, 2, 0))),
                 i(_mm512_shuffle_ps(f(v[0]), f(v[1]), _MM_SHUFFLE(3, 1, 3, 1))));
  const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  return i(_mm512_permutexvar_ps(idx, f(r)));
}

// n <= 16 blocks of one token from block b0, row-major (group 1, the decode path): the same rule and
// bits as the general loop below, with the per-block reductions and scalar stores done 16 at a time
// (measured: bench_kernels "quantize" line, docs/perf/serving.md).
void quantize32x16(const float* x, int64_t b0, int n, int t, int C, const QActs& a) {
  __m512 m[16];
  for (int j = 0; j < 16; ++j) {
    const float* xb = x + 32 * (b0 + j);
    m[j] = j < n ? _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(xb)), _mm512_abs_ps(_mm512_loadu_ps(xb + 16)))
                 : _mm512_setzero_ps();
  }
  const __m512 amax = reduce16(m, [](__m512 p, __m512 q) { return _mm512_max_ps(p, q); });
  __m512 vid;
  const __m512 vd = scales16(amax, &vid);
  alignas(64) float id[16];
  _mm512_store_ps(id, vid);
  __m512i sums[16];
  int8_t* dst = a.qs + a.qidx(t, 32 * b0);
  for (int j = 0; j < 16; ++j) {
    if (j >= n) {
      sums[j] = _mm512_setzero_si512();
      continue;
    }
    const float* xb = x + 32 * (b0 + j);
    const __m512 vid = _mm512_set1_ps(id[j]);
    const __m512i i0 = round_q(_mm512_loadu_ps(xb), vid), i1 = round_q(_mm512_loadu_ps(xb + 16), vid);
    sums[j] = _mm512_add_epi32(i0, i1);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 32 * j), _mm512_cvtsepi32_epi8(i0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 32 * j + 16), _mm512_cvtsepi32_epi8(i1));
  }
  const __m512i sum = reduce16(sums, [](__m512i p, __m512i q) { return _mm512_add_epi32(p, q); });
  const int64_t si = a.sidx(t, b0);
  const __mmask16 keep = static_cast<__mmask16>((1u << n) - 1);
  _mm512_mask_storeu_ps(a.d + si, keep, vd);
  _mm512_mask_storeu_ps(a.s + si, keep, _mm512_mul_ps(vd, _mm512_cvtepi32_ps(sum)));
  _mm512_mask_storeu_epi32(a.corr + si, keep, _mm512_mullo_epi32(_mm512_set1_epi32(C), sum));
}

void quantize32(const float* x, int t, int C, const QActs& a) {
  if (a.group == 1) {
    for (int64_t b0 = 0; b0 < a.nb(); b0 += 16)
      quantize32x16(x, b0, static_cast<int>(std::min<int64_t>(16, a.nb() - b0)), t, C, a);
    return;
  }
  for (int64_t b0 = 0; b0 < a.nb(); b0 += 16) {
    const int n = static_cast<int>(std::min<int64_t>(16, a.nb() - b0));
    alignas(64) float amax[16], d[16], id[16];
    for (int j = 0; j < n; ++j) {
      const float* xb = x + 32 * (b0 + j);
      amax[j] = _mm512_reduce_max_ps(
          _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(xb)), _mm512_abs_ps(_mm512_loadu_ps(xb + 16))));
    }
    scales16(amax, n, d, id);
    for (int j = 0; j < n; ++j) {
      const int64_t b = b0 + j;
      const __m512 vid = _mm512_set1_ps(id[j]);
      const __m512i i0 = round_q(_mm512_loadu_ps(x + 32 * b), vid), i1 = round_q(_mm512_loadu_ps(x + 32 * b + 16), vid);
      const int32_t sum = _mm512_reduce_add_epi32(_mm512_add_epi32(i0, i1));
      const __m256i q = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm512_cvtsepi32_epi8(i0)),
                                                _mm512_cvtsepi32_epi8(i1), 1);
      int8_t* dst = a.qs + a.qidx(t, 32 * b);
      if (a.group == 1) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), q);
      } else {  // 8 dwords, one per 4-value column of the token group
        const __m256i col = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(a.group));
        _mm256_i32scatter_epi32(dst, col, q, 4);
      }
      const int64_t si = a.sidx(t, b);
      a.d[si] = d[j];
      a.s[si] = d[j] * static_cast<float>(sum);
      a.corr[si] = C * sum;
    }
  }
}

void quantize256(const float* x, int t, const QActs& a) {
  int8_t* q = a.qs + a.qidx(t, 0);  // group 1: row-major
  int16_t* bsum = a.bsum + t * (a.cols / 16);
  for (int64_t b = 0; b < a.nb(); ++b, x += 256, q += 256, bsum += 16) {
    __m512 m = _mm512_setzero_ps();
    for (int j = 0; j < 16; ++j) m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(x + 16 * j)));
    float id;
    a.d[a.sidx(t, b)] = act_scale(_mm512_reduce_max_ps(m), &id);
    const __m512 vid = _mm512_set1_ps(id);
    for (int j = 0; j < 16; ++j) {
      const __m512i i = round_q(_mm512_loadu_ps(x + 16 * j), vid);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16 * j), _mm512_cvtsepi32_epi8(i));
      bsum[j] = static_cast<int16_t>(_mm512_reduce_add_epi32(i));
    }
  }
}

}  // namespace

int act_zero_point(model::DType wtype) { return zero_point(wtype); }

void quantize(model::DType wtype, const float* x, int64_t ldx, int t0, int t1, const QActs& a) {
  const int C = zero_point(wtype);
  for (int t = t0; t < t1; ++t) {
    if (t >= a.n_tok) zero_token(a, t);
    else if (a.qblock == 256) quantize256(x + t * ldx, t, a);
    else quantize32(x + t * ldx, t, C, a);
  }
}

}  // namespace ss::cpu::detail::avx512
