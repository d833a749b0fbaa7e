// Portable matmul: dequantize a chunk of a weight row to fp32 and dot it with every token.
// Each (t, o) sums its chunks in row order, each chunk left to right, whatever tile it falls in,
// so the result does not depend on n_tok or on the thread split.
#include <algorithm>

#include "backend/cpu/kernels_internal.h"

namespace ss::cpu::detail {

void matmul_scalar(const model::Tensor& W, const float* x, int n_tok, int64_t ldx, float* y, int64_t ldy,
                   MatmulScratch, ThreadPool& pool) {
  const int64_t rows = W.rows(), cols = W.cols();
  const model::DTypeInfo& ti = model::info(W.type);
  // A chunk is one quant block, or 256 elements of a float type: small enough for the stack.
  constexpr int kChunk = 256;
  const int64_t chunk = ti.block_size > 1 ? ti.block_size : kChunk;
  const size_t row_stride = W.row_stride();
  const auto* base = static_cast<const uint8_t*>(W.data);
  constexpr int kTok = 8;  // tokens sharing one dequantized chunk

  pool.parallel_for(rows, 4, [&](int64_t r0, int64_t r1, int) {
    float w[kChunk];
    for (int64_t o = r0; o < r1; ++o) {
      const uint8_t* row = base + o * row_stride;
      for (int t0 = 0; t0 < n_tok; t0 += kTok) {
        const int nt = std::min(kTok, n_tok - t0);
        float acc[kTok] = {};
        for (int64_t c = 0; c < cols; c += chunk) {
          const int64_t n = std::min(chunk, cols - c);
          const size_t off = static_cast<size_t>(c / ti.block_size) * ti.block_bytes;
          model::dequantize_row(W.type, row + off, w, n);
          for (int t = 0; t < nt; ++t) {
            const float* xt = x + (t0 + t) * ldx + c;
            float s = 0.0f;
            for (int64_t i = 0; i < n; ++i) s += w[i] * xt[i];
            acc[t] += s;
          }
        }
        for (int t = 0; t < nt; ++t) y[(t0 + t) * ldy + o] = acc[t];
      }
    }
  });
}

}  // namespace ss::cpu::detail
