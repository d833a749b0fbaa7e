// Activation quantization for the AVX2 kernels (rule and layout: act_quant.h; same bits as AVX-512).
#include <immintrin.h>

#include <cstring>

#include "backend/cpu/kernels_internal.h"

namespace ss::cpu::detail::avx2 {

namespace {

inline float hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

inline int32_t hsum(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(s);
}

inline __m256 vabs(__m256 v) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v); }

// Rounds to nearest even (the MXCSR default, as act_quant.h specifies); |v| <= 127 by construction.
inline __m256i round_q(__m256 v, __m256 id) { return _mm256_cvtps_epi32(_mm256_mul_ps(v, id)); }

// 32 int32 -> 32 int8 in order (the packs interleave 128-bit lanes; the permute undoes it).
inline __m256i narrow(__m256i a, __m256i b, __m256i c, __m256i d) {
  const __m256i x = _mm256_packs_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, d));
  return _mm256_permutevar8x32_epi32(x, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// maddubs needs unsigned weights: nibble types are stored as w + C; Q8_0 uses the sign trick instead.
int zero_point(model::DType t) {
  switch (t) {
    case model::DType::Q4_0: return 8;
    case model::DType::Q5_0: return 16;
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

void quantize32(const float* x, int t, int C, const QActs& a) {
  for (int64_t b = 0; b < a.nb(); ++b) {
    __m256 v[4];
    for (int j = 0; j < 4; ++j) v[j] = _mm256_loadu_ps(x + 32 * b + 8 * j);
    float id;
    const float d = act_scale(hmax(_mm256_max_ps(_mm256_max_ps(vabs(v[0]), vabs(v[1])),
                                                 _mm256_max_ps(vabs(v[2]), vabs(v[3])))), &id);
    const __m256 vid = _mm256_set1_ps(id);
    __m256i i[4];
    for (int j = 0; j < 4; ++j) i[j] = round_q(v[j], vid);
    const int32_t sum = hsum(_mm256_add_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3])));
    const __m256i q = narrow(i[0], i[1], i[2], i[3]);
    if (a.group == 1) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(a.qs + a.qidx(t, 32 * b)), q);
    } else {
      alignas(32) int32_t w[8];
      _mm256_store_si256(reinterpret_cast<__m256i*>(w), q);
      int8_t* dst = a.qs + a.qidx(t, 32 * b);
      for (int j = 0; j < 8; ++j) std::memcpy(dst + j * a.group * 4, &w[j], 4);
    }
    const int64_t si = a.sidx(t, b);
    a.d[si] = d;
    a.s[si] = d * static_cast<float>(sum);
    a.corr[si] = C * sum;
  }
}

void quantize256(const float* x, int t, const QActs& a) {
  int8_t* q = a.qs + a.qidx(t, 0);  // group 1: row-major
  int16_t* bsum = a.bsum + t * (a.cols / 16);
  for (int64_t b = 0; b < a.nb(); ++b, x += 256, q += 256, bsum += 16) {
    __m256 m = _mm256_setzero_ps();
    for (int j = 0; j < 32; ++j) m = _mm256_max_ps(m, vabs(_mm256_loadu_ps(x + 8 * j)));
    float id;
    a.d[a.sidx(t, b)] = act_scale(hmax(m), &id);
    const __m256 vid = _mm256_set1_ps(id);
    for (int j = 0; j < 8; ++j) {
      __m256i i[4];
      for (int k = 0; k < 4; ++k) i[k] = round_q(_mm256_loadu_ps(x + 32 * j + 8 * k), vid);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + 32 * j), narrow(i[0], i[1], i[2], i[3]));
      bsum[2 * j] = static_cast<int16_t>(hsum(_mm256_add_epi32(i[0], i[1])));
      bsum[2 * j + 1] = static_cast<int16_t>(hsum(_mm256_add_epi32(i[2], i[3])));
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

}  // namespace ss::cpu::detail::avx2
