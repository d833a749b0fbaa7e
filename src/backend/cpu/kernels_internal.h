// Private to cpu/: what each ISA file provides to the dispatcher in kernels.cpp.
//
// The batch-invariance contract every quantized SIMD kernel follows, per output (t, o): walk the
// weight blocks b in order with one fp32 accumulator (starting at 0):
//   32-value blocks: I = exact integer sum_i wq_i * aq_i;  acc = fma(dw*da, float(I), acc);
//                    Q4_1/Q5_1 then acc = fma(mw, d*sum(aq), acc).
//   Q4_K: acc = fma(d*da, float(sum_j sc_j I_j), acc); acc = fnmadd(dmin*da, float(sum_j m_j S_j), acc).
//   Q6_K: acc = fma(d*da, float(sum_j sc_j I_j), acc) with I_j over the signed 6-bit values.
//   Q5_K, Q2_K: as Q4_K (Q2_K: 16-value sub-blocks, 4-bit sc and m). Q3_K: as Q6_K (values q - 4).
//   IQ4_XS: acc = fma(d*da, float(sum_j (ls_j - 32) I_j), acc), I_j over the non-linear levels.
//   IQ4_NL: as Q8_0, the weights being the levels its nibbles index.
// Integers are exact however they are computed, so a tile, an edge tile or the 1-token path (and any
// thread) produce the same bits; only the lane a (t, o) occupies differs, and lanes do not interact.
// Float weights: 16 (AVX-512) or 8 (AVX2) lane accumulators, lane l summing i = l mod width in order,
// then one fixed horizontal reduction.
#pragma once
#include <cstdint>

#include "backend/cpu/act_quant.h"
#include "backend/cpu/kernels.h"

namespace ss::cpu::detail {

// Same contract as ss::cpu::matmul. Dequantize-and-dot in fp32; the portable fallback.
void matmul_scalar(const model::Tensor& W, const float* x, int n_tok, int64_t ldx, float* y, int64_t ldy,
                   MatmulScratch scratch, ThreadPool& pool);

// One ISA's kernels, picked by kernels.cpp.
struct KernelSet {
  // Token-interleave group of the activations (1 = row-major, for the per-token kernels).
  int (*act_group)(model::DType wtype, int n_tok);
  // Quantizes tokens [t0, t1) (t1 <= a.n_pad(); tokens >= a.n_tok become zeros).
  void (*quantize)(model::DType wtype, const float* x, int64_t ldx, int t0, int t1, const QActs& a);
  // y rows [r0, r1) for all a.n_tok tokens: 32-value block types, K types.
  void (*rows_q32)(const model::Tensor& W, const QActs& a, float* y, int64_t ldy, int64_t r0, int64_t r1);
  void (*rows_qk)(const model::Tensor& W, const QActs& a, float* y, int64_t ldy, int64_t r0, int64_t r1);
  // Float weights (F32/F16/BF16), straight from x.
  void (*rows_f)(const model::Tensor& W, const float* x, int64_t ldx, int n_tok, float* y, int64_t ldy,
                 int64_t r0, int64_t r1);
};

// PackedMatrix layout. Row group g (rows 16g .. 16g+15; rows past the end are zeros) is group_bytes
// long; its blocks follow each other, block_bytes each:
//   fp16 d of the 16 rows (32 bytes); Q4_1 only: fp16 m of the 16 rows (32 bytes);
//   nibble types: 4 vectors of 64 bytes, vector j lane r = bytes 4j .. 4j+3 of row r's 16 packed bytes
//     (low nibbles: values 4j .. 4j+3, high nibbles: values 16+4j .. 16+4j+3), as stored (w + C);
//   IQ4_NL: Q4_0's layout (its block is Q4_0's: fp16 d, 16 bytes of nibbles), the nibbles indexing the
//     non-linear levels;
//   Q8_0: 8 vectors of 64 bytes, vector k lane r = values 4k .. 4k+3 of row r, as w ^ 0x80 = w + 128.
//   Q5_0/Q5_1: the nibble layout (Q5_1's header as Q4_1's), then one vector of 5th bits: lane r byte i,
//     bit j = the 5th bit of value 4j + i, bit 4 + j = that of value 16 + 4j + i.
//
// K types: one block per 256-value super-block (values 256 sb ..), 16 rows (r) in the lanes:
//   Q4_K: fp16 d[16] | fp16 dmin[16] | u8 sc[8 sub-blocks][16] | u8 m[4 pairs][16][2] (m_2k, m_2k+1) |
//         nibbles: sub-block j, vector v (offset 320 + 256 j + 64 v), lane r byte i =
//         value 32j + 4v + i | value 32j + 16 + 4v + i << 4 (6-bit scales unpacked, values as in Q4_1).
//   Q6_K: fp16 d[16] | i8 sc[8 pairs][16][2] (sc_2k, sc_2k+1) | low nibbles: vector m < 32 (offset
//         288 + 64 m), lane r byte i = lo4(q[4m + i]) | lo4(q[4(m + 32) + i]) << 4 | high bits:
//         vector m < 16 (offset 2336 + 64 m), lane r byte i = hi2 of q[4m + i], q[4(m+16) + i],
//         q[4(m+32) + i], q[4(m+48) + i] at bits 0, 2, 4, 6 (q: the stored 6-bit value, w + 32).
//   Q5_K: Q4_K's block, then the 5th bits: sub-block j (offset 2368 + 64 j), lane r byte i, bit v =
//         that of value 32j + 4v + i, bit 4 + v = that of value 32j + 16 + 4v + i (64 bytes per 16
//         rows more than the file).
//   IQ4_XS: fp16 d[16] | i8 (ls - 32)[4 pairs][16][2] | nibbles as Q4_K's (offset 160); 2 bytes more
//         per row than the file (the 6-bit scales unpacked).
//   Q2_K: fp16 d[16] | fp16 dmin[16] | u8 scale bytes (sc | m << 4, as in the file)[8 pairs][16][2] |
//         2-bit values: sub-block j (16 values, offset 320 + 64 j), lane r byte i, bits 2k..2k+1 =
//         value 16j + 4k + i.
//   Q3_K: fp16 d[16] | the 12 scale bytes as 3 vectors (offset 32 + 64 k, lane r = bytes 4k..4k+3 of
//         row r's, unpacked in the lanes as ggml does per row) | low 2 bits as Q2_K's (offset 224) |
//         high bits: vector m < 8 (offset 1248 + 64 m), lane r byte i, bit b = that of value 32m + 4b + i
//         (values stored as u = q + 4h = w + 4, in 0..7).
//   Q2_K, Q3_K, Q4_K and Q6_K take exactly the bytes of the 16 original rows.
struct PackedFormat {
  int header;       // bytes of scales before the vectors
  int vectors;      // 64-byte vectors per block
  int block_bytes;  // header + 64 * vectors
  int values = 32;  // values per block
};
constexpr PackedFormat packed_format(model::DType t) {
  switch (t) {
    case model::DType::Q4_0: return {32, 4, 32 + 256};
    case model::DType::Q4_1: return {64, 4, 64 + 256};
    case model::DType::Q5_0: return {32, 5, 32 + 320};
    case model::DType::Q5_1: return {64, 5, 64 + 320};
    case model::DType::IQ4_NL: return {32, 4, 32 + 256};
    case model::DType::Q8_0: return {32, 8, 32 + 512};
    case model::DType::Q2_K: return {320, 16, 320 + 1024, 256};
    case model::DType::Q3_K: return {224, 24, 224 + 1536, 256};
    case model::DType::Q4_K: return {320, 32, 320 + 2048, 256};
    case model::DType::Q5_K: return {320, 40, 320 + 2560, 256};
    case model::DType::Q6_K: return {288, 48, 288 + 3072, 256};
    case model::DType::IQ4_XS: return {160, 32, 160 + 2048, 256};
    default: return {0, 0, 0};
  }
}
constexpr int kPackRows = 16;
// Tokens from which the packed kernels use AMX tiles where amx_active() (below, VNNI). A tile pass
// costs about the same for 1 or 16 tokens; measured crossovers (bench_kernels, one thread, ffn_down):
// Q8_0 ~12 tokens, Q5_0 ~8; Q6_K and Q4_K ~8.
constexpr int kAmxMinTokens = 12;   // Q4_0, Q4_1, Q5_0, Q5_1 (Q8_0: VNNI always)
constexpr int kAmxMinTokensK = 8;   // Q4_K, Q5_K, Q6_K

// The packed kernel: y rows of row groups [g0, g1) for all a.n_tok tokens (a.group == 1).
namespace avx512 {
void rows_packed(const PackedMatrix& P, const QActs& a, float* y, int64_t ldy, int64_t g0, int64_t g1);
void rows_packed_k(const PackedMatrix& P, const QActs& a, float* y, int64_t ldy, int64_t g0, int64_t g1);
}
// AVX2: the same layout read as two 8-row halves per group.
namespace avx2 {
void rows_packed(const PackedMatrix& P, const QActs& a, float* y, int64_t ldy, int64_t g0, int64_t g1);
void rows_packed_k(const PackedMatrix& P, const QActs& a, float* y, int64_t ldy, int64_t g0, int64_t g1);
}
// Whether `isa` has a packed kernel for type t (AVX-512 and AVX2: every type with a packed_format).
constexpr bool has_packed_kernel(model::DType t, Isa isa) {
  return packed_format(t).block_bytes != 0 && (isa == Isa::Avx512 || isa == Isa::Avx2);
}

#define SS_DECLARE_ISA(ns)                                                                              \
  namespace ns {                                                                                        \
  int act_group(model::DType wtype, int n_tok);                                                         \
  void quantize(model::DType wtype, const float* x, int64_t ldx, int t0, int t1, const QActs& a);      \
  int act_zero_point(model::DType wtype); /* the C of quantize's corr = C * sum(q) (0: corr is 0) */   \
  void rows_q32(const model::Tensor& W, const QActs& a, float* y, int64_t ldy, int64_t r0, int64_t r1); \
  void rows_qk(const model::Tensor& W, const QActs& a, float* y, int64_t ldy, int64_t r0, int64_t r1);  \
  void rows_f(const model::Tensor& W, const float* x, int64_t ldx, int n_tok, float* y, int64_t ldy,    \
              int64_t r0, int64_t r1);                                                                  \
  }
SS_DECLARE_ISA(avx2)
SS_DECLARE_ISA(avx512)
#undef SS_DECLARE_ISA

// A line of the next row group's weights, fetched while this group computes (AVX-512 packed VNNI
// kernels). For a batch (n_tok > 1) to L2 (prefetcht1): at 16 tokens with the weights from DRAM,
// prefetcht0 left Q4_K and Q6_K ffn_down 22-27% and the Q8_0 lm_head ~10% slower (bench_kernels
// --cold, Zen 4). For one token to L1, as before: the streaming lm_head was slower with prefetcht1.
// The 32-value nibble types pass n_tok = 1 (L1): Q4_1 at 16 tokens was ~2% slower to L2. The K types
// pass 2 (L2) for one token too: their 2.1-3.3 KB super-blocks per group are fetched a whole group (6
// super-blocks of ffn_down) ahead, and to L1 that evicted the current group; bench_kernels --cold
// --ntok 1 ffn_down, one thread: Q6_K 72 -> 37 us, Q5_K 43 -> 23, IQ4_XS 26 -> 17 (Zen 4, 2026-12-05).
[[gnu::always_inline]] inline void prefetch_next_weights(const void* p, int n_tok) {
  if (n_tok > 1) __builtin_prefetch(p, 0, 2);
  else __builtin_prefetch(p, 0, 3);
}

// Unaligned little-endian loads (mapped tensor data is only 2-byte aligned).
template <class T>
inline T load_as(const void* p) {
  T v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}

// 256-value super-block types: activations in 256-value blocks with 16-value sums, rows_qk kernels
// (one kernel for every n_tok, activations row-major). IQ4_NL runs in rows_q32 as a Q8_0 whose bytes
// come from a table.
inline bool is_k_type(model::DType t) {
  using model::DType;
  return t == DType::Q2_K || t == DType::Q3_K || t == DType::Q4_K || t == DType::Q5_K || t == DType::Q6_K ||
         t == DType::IQ4_XS;
}
inline bool is_float_type(model::DType t) {
  return t == model::DType::F32 || t == model::DType::F16 || t == model::DType::BF16;
}

}  // namespace ss::cpu::detail
