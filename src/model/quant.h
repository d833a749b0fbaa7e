// Tensor element types and GGUF quantized block layouts (ggml-common.h is the reference).
// A row of a quantized tensor is a sequence of blocks; `cols` must be a multiple of the block size.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace ss::model {

// Values are the GGML type ids as stored in GGUF files.
enum class DType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,   // activations only (not a weight type we load)
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,  // activations only
  IQ4_NL = 20,
  IQ4_XS = 23,
  BF16 = 30,
};

constexpr int QK4_0 = 32, QK4_1 = 32, QK5_0 = 32, QK5_1 = 32, QK8_0 = 32, QK8_1 = 32, QK_K = 256;
constexpr int K_SCALE_SIZE = 12, QK4_NL = 32;

// The 16 levels of the non-linear 4-bit types (IQ4_NL, IQ4_XS); ggml's kvalues_iq4nl.
constexpr int8_t kIq4nlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

using half_bits = uint16_t;  // IEEE fp16 stored as bits

struct block_q4_0 { half_bits d; uint8_t qs[QK4_0 / 2]; };
struct block_q4_1 { half_bits d, m; uint8_t qs[QK4_1 / 2]; };
struct block_q5_0 { half_bits d; uint8_t qh[4]; uint8_t qs[QK5_0 / 2]; };
struct block_q5_1 { half_bits d, m; uint8_t qh[4]; uint8_t qs[QK5_1 / 2]; };
struct block_q8_0 { half_bits d; int8_t qs[QK8_0]; };
// Q8_1: d and s = d * sum(qs), both fp16 in ggml; we keep them as float (activation-side only).
struct block_q8_1 { float d, s; int8_t qs[QK8_1]; };
// Q2_K: 16 sub-blocks of 16, y = d*(sc&15)*q - dmin*(sc>>4), q 2-bit.
struct block_q2_K { uint8_t scales[QK_K / 16]; uint8_t qs[QK_K / 4]; half_bits d, dmin; };
// Q3_K: 16 sub-blocks of 16, y = d*(sc-32)*(q-4*!h), 6-bit sc packed in 12 bytes, q 2-bit + hmask bit h.
struct block_q3_K { uint8_t hmask[QK_K / 8]; uint8_t qs[QK_K / 4]; uint8_t scales[12]; half_bits d; };
struct block_q4_K { half_bits d, dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qs[QK_K / 2]; };
// Q5_K: Q4_K's scales with a 5th bit per value in qh.
struct block_q5_K { half_bits d, dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qh[QK_K / 8]; uint8_t qs[QK_K / 2]; };
struct block_q6_K { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; half_bits d; };
struct block_q8_K { float d; int8_t qs[QK_K]; int16_t bsums[QK_K / 16]; };
// IQ4_NL: y = d * kIq4nlValues[nibble]; IQ4_XS: the same in 8 sub-blocks of 32 with 6-bit scales (ls-32).
struct block_iq4_nl { half_bits d; uint8_t qs[QK4_NL / 2]; };
struct block_iq4_xs { half_bits d; uint16_t scales_h; uint8_t scales_l[QK_K / 64]; uint8_t qs[QK_K / 2]; };

static_assert(sizeof(block_q4_0) == 18);
static_assert(sizeof(block_q4_1) == 20);
static_assert(sizeof(block_q5_0) == 22);
static_assert(sizeof(block_q5_1) == 24);
static_assert(sizeof(block_q8_0) == 34);
static_assert(sizeof(block_q4_K) == 144);
static_assert(sizeof(block_q6_K) == 210);
static_assert(sizeof(block_q2_K) == 84);
static_assert(sizeof(block_q3_K) == 110);
static_assert(sizeof(block_q5_K) == 176);
static_assert(sizeof(block_iq4_nl) == 18);
static_assert(sizeof(block_iq4_xs) == 136);

struct DTypeInfo {
  std::string_view name;  // "Q4_K", ...
  int block_size;         // elements per block (1 for float types)
  int block_bytes;        // bytes per block
  bool weight_type;       // may appear as a model weight
};

// nullptr when `id` is not a type we know.
const DTypeInfo* dtype_info(uint32_t id);
inline const DTypeInfo& info(DType t) { return *dtype_info(static_cast<uint32_t>(t)); }
std::string_view dtype_name(DType t);
// Bytes of one row of `cols` elements; cols must be a multiple of the block size.
size_t row_bytes(DType t, int64_t cols);

float fp16_to_fp32(half_bits h);
half_bits fp32_to_fp16(float f);
float bf16_to_fp32(uint16_t b);
uint16_t fp32_to_bf16(float f);  // round to nearest even

// Reference (scalar, obviously-correct) dequantization of n elements (a multiple of the block size)
// starting at the beginning of a row. Used by tests, by value checks and as the slow path.
void dequantize_row(DType t, const void* src, float* dst, int64_t n);

}  // namespace ss::model
