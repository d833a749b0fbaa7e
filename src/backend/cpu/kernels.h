// CPU compute kernels. Matrix products run directly on the quantized weight blocks: activations are
// quantized per token to 8-bit blocks (Q8_0 / Q8_1 / Q8_K as the weight type needs) and dotted with
// integer SIMD (AVX2, AVX-512/VNNI chosen at run time), accumulating in fp32.
//
// Batch invariance: y[t][o] is bit-identical whatever n_tok is and whichever tile (t, o) falls in,
// so the same prompt gives the same logits alone or inside a batch.
#pragma once
#include <cstdint>

#include "common/thread_pool.h"
#include "model/model.h"

namespace ss::cpu {

enum class Isa { Scalar, Avx2, Avx512 };
Isa detected_isa();
Isa active_isa();
void force_isa(Isa isa);  // tests: run every path the machine supports
const char* isa_name(Isa isa);

// Scratch sizes are computed from the largest shapes at start-up; matmul allocates nothing.
struct MatmulScratch {
  void* buf = nullptr;
  size_t bytes = 0;
};
size_t matmul_scratch_bytes(model::DType wtype, int64_t cols, int n_tok);

// y[t * ldy + o] = sum_i W[o, i] * x[t * ldx + i], for t < n_tok, o < W.rows().
void matmul(const model::Tensor& W, const float* x, int n_tok, int64_t ldx, float* y, int64_t ldy,
            MatmulScratch scratch, ThreadPool& pool);

// One row of a tensor to fp32 (embedding lookup).
void get_row(const model::Tensor& W, int64_t row, float* out);

}  // namespace ss::cpu
