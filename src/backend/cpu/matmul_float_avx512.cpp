// F32/F16/BF16 weights on AVX-512: fp32 FMA, weights converted as they are loaded. A tile of R rows
// x NT tokens keeps R*NT accumulators so each weight vector feeds NT tokens and each activation
// vector R rows. Every (t, o) uses 16 lanes (lane l sums i = l mod 16 in order, the tail masked)
// and one _mm512_reduce_add_ps, whatever the tile, so the result is batch invariant. Tokens are
// processed in blocks that fit L2, so activations are not re-read from memory for every row tile.
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <utility>

#include "backend/cpu/kernels_internal.h"

namespace ss::cpu::detail::avx512 {

namespace {

using model::DType;

template <DType T>
inline __m512 load_w(const uint8_t* row, int64_t i, __mmask16 m) {
  if constexpr (T == DType::F32) {
    return _mm512_maskz_loadu_ps(m, reinterpret_cast<const float*>(row) + i);
  } else {
    const __m256i h = _mm256_maskz_loadu_epi16(m, row + 2 * i);
    if constexpr (T == DType::F16) return _mm512_cvtph_ps(h);
    else return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}

template <DType T, int R, int NT>
[[gnu::always_inline]] inline void step(const uint8_t* const* w, const float* const* x, int64_t i, __mmask16 m,
                                        __m512 (&acc)[NT][R]) {
  // Fully unrolled so the accumulators can live in registers (GCC keeps an array in memory otherwise).
  __m512 wv[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) wv[r] = load_w<T>(w[r], i, m);
#pragma GCC unroll 8
  for (int t = 0; t < NT; ++t) {
    const __m512 xv = _mm512_maskz_loadu_ps(m, x[t] + i);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[t][r] = _mm512_fmadd_ps(wv[r], xv, acc[t][r]);
  }
}

template <DType T, int R, int NT>
void tile(const uint8_t* const* w, const float* const* x, int64_t cols, float* const* out) {
  __m512 acc[NT][R];
#pragma GCC unroll 8
  for (int t = 0; t < NT; ++t)
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[t][r] = _mm512_setzero_ps();
  const int64_t main = cols / 16 * 16;
  for (int64_t i = 0; i < main; i += 16) step<T, R, NT>(w, x, i, 0xFFFF, acc);
  if (main < cols) step<T, R, NT>(w, x, main, static_cast<__mmask16>((1u << (cols - main)) - 1), acc);
#pragma GCC unroll 8
  for (int t = 0; t < NT; ++t)
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) out[t][r] = _mm512_reduce_add_ps(acc[t][r]);
}

// 4 x 6 = 24 accumulators + 4 weight vectors + 1 activation fit the 32 registers: 4 weight loads
// (and conversions) and 6 activation loads per 24 FMAs.
constexpr int kR = 4, kT = 6;
constexpr int64_t kL2Bytes = 512 * 1024;  // activation bytes per token block

using TileFn = void (*)(const uint8_t* const*, const float* const*, int64_t, float* const*);

// tiles[r-1][t-1]: edge tiles are the same code with fewer rows/tokens.
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

}  // namespace ss::cpu::detail::avx512
