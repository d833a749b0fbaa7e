// Weight quantization into GGUF block layouts (the inverse of quant.h's dequantize_row).
#pragma once
#include <cstdint>

#include "model/quant.h"

namespace ss::model {

// Quantizes n elements (a multiple of the block size) into t's block layout (F32/F16/BF16 convert).
// Q4_0..Q8_0 follow ggml's quantize_row_*_ref arithmetic; Q4_K/Q6_K use a plain per-sub-block
// min/max (no iterative scale search), so their bytes differ from llama.cpp's but decode with the
// same formula. Deterministic: the same input gives the same bytes on any IEEE machine.
// Returns false for a type that is not a weight type, or n not whole blocks.
bool quantize_row(DType t, const float* src, void* dst, int64_t n);

}  // namespace ss::model
