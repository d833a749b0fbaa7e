// CPU compute kernels. Matrix products run directly on the quantized weight blocks: activations are
// quantized per token to 8-bit blocks (32 values for Q4_0/Q4_1/Q5_0/Q5_1/Q8_0, with block sums for the
// min / zero-point terms; 256 values with 16-value sums for the K types) and dotted with integer SIMD
// (AVX2, AVX-512 VNNI chosen at run time), accumulating in fp32. F32/F16/BF16 weights use fp32 FMA.
// Isa::Scalar dequantizes to fp32 instead (no activation rounding): the portable, most exact path.
//
// Batch invariance: for a given ISA, y[t][o] is bit-identical whatever n_tok is, whichever tile or
// thread (t, o) falls in, so the same prompt gives the same logits alone or inside a batch (how:
// cpu/kernels_internal.h). Different ISAs give (slightly) different bits.
#pragma once
#include <cstdint>
#include <string_view>

#include "backend/cpu/side_prefetch.h"
#include "common/thread_pool.h"
#include "model/model.h"

namespace ss::cpu {

enum class Isa { Scalar, Avx2, Avx512 };
Isa detected_isa();       // what the CPU runs
Isa active_isa();         // force_isa's choice, else SS_CPU_ISA's (clamped to detected), else detected
void force_isa(Isa isa);  // tests: run every path the machine supports
void clear_forced_isa();  // back to the default (SS_CPU_ISA or detected)
const char* isa_name(Isa isa);
bool parse_isa(std::string_view name, Isa* out);  // isa_name's inverse

// AMX-INT8 (Intel Sapphire Rapids and later): under Isa::Avx512 the packed kernels of Q4_0, Q4_1,
// Q5_0, Q5_1, Q4_K, Q5_K and Q6_K run their integer dots as tile multiplies once a product has 8-12
// tokens (batched decode, prefill); the integers are exact either way, so the bits are those of the
// VNNI kernels.
bool amx_available();      // the CPU has AMX-INT8 and the OS granted this process the tile state
bool amx_active();         // available, Isa::Avx512 active, not turned off (SS_CPU_AMX=0 or force_amx)
void force_amx(bool on);   // tests and benchmarks: off, or on where available
void clear_forced_amx();   // back to the default (SS_CPU_AMX, else on where available)

// GFNI (Ice Lake, Zen 4 and later): under Isa::Avx512 the packed kernels of the nibble types (Q4_0,
// Q4_1, Q5_0, Q5_1, IQ4_NL) move nibbles and Q5's 5th bits into place with vgf2p8affineqb, fewer
// ops than shifts and masks; the same bytes, so the same bits.
bool gfni_available();      // the CPU has GFNI
bool gfni_active();         // available and not turned off (SS_CPU_GFNI=0 or force_gfni)
void force_gfni(bool on);   // tests and benchmarks: off, or on where available
void clear_forced_gfni();   // back to the default (SS_CPU_GFNI, else on where available)

// Scratch holds the quantized activations; size it at start-up from the largest (type, cols, n_tok)
// used (the size grows with cols and n_tok; 0 for float weights). matmul allocates nothing and aborts
// with a message if the scratch is smaller than matmul_scratch_bytes.
// side: one cursor per pool thread (index = the pool's thread index) whose lines the packed products
// prefetch as they go, for the operation after them (side_prefetch.h); null: none.
struct MatmulScratch {
  void* buf = nullptr;
  size_t bytes = 0;
  SideCursor* side = nullptr;
};
size_t matmul_scratch_bytes(model::DType wtype, int64_t cols, int n_tok);

// y[t * ldy + o] = sum_i W[o, i] * x[t * ldx + i], for t < n_tok, o < W.rows(). Rows are split over
// the pool's threads (the caller works too). y must not overlap x or the scratch.
void matmul(const model::Tensor& W, const float* x, int n_tok, int64_t ldx, float* y, int64_t ldy,
            MatmulScratch scratch, ThreadPool& pool);

// A weight matrix re-laid out once, at load, for the packed kernels (AVX-512 VNNI; AVX2 reads each
// vector as two 8-row halves): per group of 16 output rows and per 32-value block (256-value
// super-block for the K types), the 16 rows' scales and then the quantized values with the 16 rows
// in the 16 lanes of each vector, so a kernel multiplies 16 rows by a token with no staging and no
// horizontal sums (layout: kernels_internal.h). Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K,
// Q6_K and IQ4_XS have a packed form; it takes the same bytes as the original, or 11% more (Q4_0),
// 1.5% more (IQ4_XS), 2.3% more (Q5_K).
struct PackedMatrix {
  model::DType type = model::DType::F32;
  int64_t rows = 0, cols = 0;
  size_t group_bytes = 0;         // one group of 16 rows, every block
  const uint8_t* data = nullptr;  // not owned: packed_bytes() bytes in the caller's buffer
  bool empty() const { return data == nullptr; }
};

// Bytes of W's packed form (a multiple of 64), or 0 when W's type has none or the active ISA has no
// packed kernel for it (AVX-512 and AVX2: every packed type; scalar: none). Callers pack many
// matrices into one buffer (cf. common/huge_buffer.h).
size_t packed_bytes(const model::Tensor& W);

// Packs W into dst: packed_bytes(W) bytes, 64-byte aligned and zero-filled. Rows are split over the
// pool. Returns an empty matrix when packed_bytes(W) == 0. matmul through it is bit-identical to
// matmul(W, ...).
PackedMatrix pack_weights(const model::Tensor& W, uint8_t* dst, ThreadPool& pool);

// matmul through P when it is non-empty and the active ISA has its packed kernel, else through W. Same
// contract. prequantized: see matmul_multi.
void matmul(const model::Tensor& W, const PackedMatrix& P, const float* x, int n_tok, int64_t ldx, float* y,
            int64_t ldy, MatmulScratch scratch, ThreadPool& pool, bool prequantized = false);

// Several products of the same activations (Q, K and V; gate and up), as one: when every matrix is
// packed with one type that the ISA has a packed kernel for, the activations are quantized once and all row groups
// share one pool dispatch; otherwise it is matmul per job. Results are those of matmul per job.
struct MatmulJob {
  const model::Tensor* W;
  const PackedMatrix* P;
  float* y;
  int64_t ldy;
};
//
// A caller that produces x in its own parallel loop over tokens can quantize each token there too
// (quantize_for_packed, same bits), so no thread waits while one quantizes them all: when
// packed_path(jobs) is true, matmul_multi(..., prequantized = true) takes the activations from the
// scratch as they are (all n_tok tokens must have been quantized into it for jobs[0]'s weight type).
void matmul_multi(const MatmulJob* jobs, int n_jobs, const float* x, int n_tok, int64_t ldx, MatmulScratch scratch,
                  ThreadPool& pool, bool prequantized = false);
bool packed_path(const MatmulJob* jobs, int n_jobs);
// Tokens [t0, t1) of x (n_tok tokens in all) into the scratch, for the packed path of weights of type
// `type` and `cols` columns. Tokens of one product may be quantized by different threads.
void quantize_for_packed(model::DType type, int64_t cols, const float* x, int64_t ldx, int n_tok, int t0, int t1,
                         MatmulScratch scratch);

// One row of a tensor to fp32 (embedding lookup).
void get_row(const model::Tensor& W, int64_t row, float* out);

}  // namespace ss::cpu
