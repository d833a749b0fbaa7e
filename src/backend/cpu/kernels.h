// CPU compute kernels. Matrix products run directly on the quantized weight blocks: activations are
// quantized per token to 8-bit blocks (32 values for Q4_0/Q4_1/Q5_0/Q5_1/Q8_0, with block sums for the
// min / zero-point terms; 256 values with 16-value sums for Q4_K/Q6_K) and dotted with integer SIMD
// (AVX2, AVX-512 VNNI chosen at run time), accumulating in fp32. F32/F16/BF16 weights use fp32 FMA.
// Isa::Scalar dequantizes to fp32 instead (no activation rounding): the portable, most exact path.
//
// Batch invariance: for a given ISA, y[t][o] is bit-identical whatever n_tok is, whichever tile or
// thread (t, o) falls in, so the same prompt gives the same logits alone or inside a batch (how:
// cpu/kernels_internal.h). Different ISAs give (slightly) different bits.
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

// Scratch holds the quantized activations; size it at start-up from the largest (type, cols, n_tok)
// used (the size grows with cols and n_tok; 0 for float weights). matmul allocates nothing and aborts
// with a message if the scratch is smaller than matmul_scratch_bytes.
struct MatmulScratch {
  void* buf = nullptr;
  size_t bytes = 0;
};
size_t matmul_scratch_bytes(model::DType wtype, int64_t cols, int n_tok);

// y[t * ldy + o] = sum_i W[o, i] * x[t * ldx + i], for t < n_tok, o < W.rows(). Rows are split over
// the pool's threads (the caller works too). y must not overlap x or the scratch.
void matmul(const model::Tensor& W, const float* x, int n_tok, int64_t ldx, float* y, int64_t ldy,
            MatmulScratch scratch, ThreadPool& pool);

// One row of a tensor to fp32 (embedding lookup).
void get_row(const model::Tensor& W, int64_t row, float* out);

}  // namespace ss::cpu
