// F32/F16/BF16 weights on AVX2: fp32 FMA, weights converted as they are loaded; R rows x NT tokens
// per tile. Every (t, o) uses 8 lanes (lane l sums i = l mod 8 in order; the tail is zero-padded
// through a stack copy) and one fixed horizontal sum, whatever the tile: batch invariant.
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <utility>
#include <cstring>

#include "backend/cpu/kernels_internal.h"

namespace ss::cpu::detail::avx2 {

namespace {

using model::DType;

template <DType T>
inline __m256 load_w(const uint8_t* p) {
  if constexpr (T == DType::F32) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
  } else {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    if constexpr (T == DType::F16) return _mm256_cvtph_ps(h);
    else return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Fully unrolled so the accumulators can live in registers (GCC keeps an array in memory otherwise).
template <DType T, int R, int NT>
[[gnu::always_inline]] inline void step(const uint8_t* const* wp, const float* const* xp, __m256 (&acc)[NT][R]) {
  __m256 wv[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) wv[r] = load_w<T>(wp[r]);
#pragma GCC unroll 8
  for (int t = 0; t < NT; ++t) {
    const __m256 xv = _mm256_loadu_ps(xp[t]);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[t][r] = _mm256_fmadd_ps(wv[r], xv, acc[t][r]);
  }
}

template <DType T, int R, int NT>
void tile(const uint8_t* const* w, const float* const* x, int64_t cols, float* const* out) {
  constexpr int64_t es = T == DType::F32 ? 4 : 2;
  __m256 acc[NT][R];
#pragma GCC unroll 8
  for (int t = 0; t < NT; ++t)
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[t][r] = _mm256_setzero_ps();
  const int64_t main = cols / 8 * 8;
  for (int64_t i = 0; i < main; i += 8) {
    const uint8_t* wp[R];
    const float* xp[NT];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) wp[r] = w[r] + i * es;
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) xp[t] = x[t] + i;
    step<T, R, NT>(wp, xp, acc);
  }
  if (main < cols) {  // zero-padded tail, same lanes
    alignas(32) uint8_t wt[R][32] = {};
    alignas(32) float xt[NT][8] = {};
    const uint8_t* wp[R];
    const float* xp[NT];
    for (int r = 0; r < R; ++r) {
      std::memcpy(wt[r], w[r] + main * es, static_cast<size_t>((cols - main) * es));
      wp[r] = wt[r];
    }
    for (int t = 0; t < NT; ++t) {
      std::memcpy(xt[t], x[t] + main, static_cast<size_t>(cols - main) * 4);
      xp[t] = xt[t];
    }
    step<T, R, NT>(wp, xp, acc);
  }
#pragma GCC unroll 8
  for (int t = 0; t < NT; ++t)
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) out[t][r] = hsum(acc[t][r]);
}

// 3 x 4 = 12 accumulators + 3 weight vectors + 1 activation fit the 16 registers.
constexpr int kR = 3, kT = 4;
constexpr int64_t kL2Bytes = 512 * 1024;  // activation bytes per token block

using TileFn = void (*)(const uint8_t* const*, const float* const*, int64_t, float* const*);

// tiles[(r-1) * kT + t-1]: edge tiles are the same code with fewer rows/tokens.
template <DType T, int... I>
constexpr auto make_tiles(std::integer_sequence<int, I...>) {
  return std::array<TileFn, kR * kT>{tile<T, I / kT + 1, I % kT + 1>...};
}

template <DType T>
void rows_typed(const model::Tensor& W, const float* x, int64_t ldx, int n_tok, float* y, int64_t ldy,
                int64_t r0, int64_t r1) {
  static constexpr auto tiles = make_tiles<T>(std::make_integer_sequence<int, kR * kT>{});
  const int64_t cols = W.cols();
  // Token blocks whose activations stay in L2 while every row tile passes over them.
  const int tb = static_cast<int>(std::max<int64_t>(kT, (kL2Bytes / (cols * 4)) / kT * kT));
  for (int tb0 = 0; tb0 < n_tok; tb0 += tb)
  for (int64_t o0 = r0; o0 < r1; o0 += kR) {
    const int nr = static_cast<int>(std::min<int64_t>(kR, r1 - o0));
    const uint8_t* w[kR];
    for (int r = 0; r < nr; ++r) w[r] = W.row(o0 + r);
    for (int t0 = tb0; t0 < std::min(n_tok, tb0 + tb); t0 += kT) {
      const int nt = std::min(kT, n_tok - t0);
      const float* xs[kT];
      float res[kT][kR];
      float* outs[kT];
      for (int t = 0; t < nt; ++t) {
        xs[t] = x + (t0 + t) * ldx;
        outs[t] = res[t];
      }
      tiles[(nr - 1) * kT + nt - 1](w, xs, cols, outs);
      for (int t = 0; t < nt; ++t)
        for (int r = 0; r < nr; ++r) y[(t0 + t) * ldy + o0 + r] = res[t][r];
    }
  }
}

}  // namespace

void rows_f(const model::Tensor& W, const float* x, int64_t ldx, int n_tok, float* y, int64_t ldy, int64_t r0,
            int64_t r1) {
  switch (W.type) {
    case DType::F32: return rows_typed<DType::F32>(W, x, ldx, n_tok, y, ldy, r0, r1);
    case DType::F16: return rows_typed<DType::F16>(W, x, ldx, n_tok, y, ldy, r0, r1);
    case DType::BF16: return rows_typed<DType::BF16>(W, x, ldx, n_tok, y, ldy, r0, r1);
    default: return;
  }
}

}  // namespace ss::cpu::detail::avx2
