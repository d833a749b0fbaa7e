// Private to backend/cuda: the decode and prefill step's kernels as plain launch functions (device
// pointers + a stream; nothing synchronises, nothing allocates), for the CUDA backend and tools/gpu.
// Each is checked against a host reference in tests/gpu/kernels. A launch returns an error Status for
// bad arguments (checked on the host before launching) or a failed launch (file:line and CUDA's text).
//
// Conventions: bf16 weights and activations (stored as uint16_t bits), fp32 accumulation, an fp32
// residual stream. Matrices are row-major [rows][cols]; a projection y = W x has W [out][in] (as
// safetensors and GGUF store it). Token-major activations: x [n_tok][dim].
//
// Paged KV cache (bf16), per layer: [block][2][n_kv][kBlockTokens][hd] — a block holds K then V of
// kBlockTokens consecutive positions for every KV head; a head's 16 keys are 16*hd contiguous values,
// so a warp reading one key reads hd*2 contiguous bytes and a block's K for one head is 4 KiB at hd=128.
// A sequence's position p lives in block tables[seq][p / 16], slot p % 16 (tables: int32, row stride
// max_blocks).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "backend/sampling_rng.h"
#include "common/status.h"

namespace ss::cuda::kern {

using bf16_bits = uint16_t;
constexpr int kBlockTokens = 16;

// Status of a CUDA call: ok, or "file:line: what: cudaGetErrorString".
Status cuda_status(cudaError_t e, const char* what, const char* file, int line);
#define SS_CUDA_TRY(expr) SS_TRY(::ss::cuda::kern::cuda_status((expr), #expr, __FILE__, __LINE__))
// After a launch: the launch's own error (bad configuration, no device).
#define SS_CUDA_LAUNCHED() SS_CUDA_TRY(cudaGetLastError())

// --- embedding ------------------------------------------------------------------------------------
enum class TableType { F32, F16, BF16, Q8_0, Q4_0, Q4_1 };
// x[t][:] = dequantized row tokens[t] of table (rows of h elements; quantized rows: h % 32 == 0).
// Tokens outside [0, vocab) give a zero row (the host validates ids; the kernel never reads outside).
Status embed(const void* table, TableType type, int vocab, int h, const int32_t* tokens, int n_tok, float* x,
             cudaStream_t s);

// --- residual add + RMSNorm ---------------------------------------------------------------------
// Per token: if d, x += d (the residual add, x updated in place); out = bf16(x / rms(x) * w).
Status add_rmsnorm(float* x, const float* d, const float* w, int n_tok, int h, float eps, bf16_bits* out,
                   cudaStream_t s);

// --- RoPE + KV store ------------------------------------------------------------------------------
// qkv: [n_tok][(n_heads + 2 n_kv) * hd] fp32 (the fused projection's output). Per token: RoPE on q and
// k (the first rope_dim dims of each head; pairs (i, i + rope_dim/2) for NeoX "half", (2i, 2i+1) when
// interleaved), q written to q_out [n_tok][n_heads*hd] fp32, k and v stored bf16 in the layer's paged
// cache at position positions[t] of sequence seq_of_token[t] (a row of tables).
// rope_cs: [max_pos][rope_dim]: rope_dim/2 cosines then rope_dim/2 sines per position.
struct RopeKv {
  const float* qkv;
  const float* rope_cs;
  int rope_dim;
  bool interleaved;
  int n_heads, n_kv, hd;
  const int32_t* positions;     // [n_tok]
  const int32_t* seq_of_token;  // [n_tok]
  const int32_t* tables;        // [seqs][max_blocks]
  int max_blocks;
  float* q_out;
  bf16_bits* cache;             // this layer's block 0
  // Optional (null: none): the projection's bias over the (n_heads + 2 n_kv) * hd rows (Qwen2),
  // added first; per-head RMSNorm weights [hd] of q and of k (Qwen3), applied before RoPE with
  // norm_eps. The fused GEMV takes the bias but not the norms (a warp sees two dims of a head).
  const float* bias;
  const float *q_norm, *k_norm;
  float norm_eps;
};
Status rope_kv_store(const RopeKv& a, int n_tok, cudaStream_t s);

// --- GEMV / small-batch GEMM ----------------------------------------------------------------------
// y[b][n] = sum_k W[n][k] x[b][k] (+ y[b][n] when accumulate) for batch 1..8; W bf16 [N][K], x bf16
// [batch][K], y fp32 [batch][N]. K % 8 == 0 and 16-byte aligned W and x.
Status gemv_bf16(const bf16_bits* W, const bf16_bits* x, float* y, int N, int K, int batch, bool accumulate,
                 cudaStream_t s);
// A residual-adding projection with the next RMSNorm fused (batch 1..8): resid[b] += W x[b] (resid fp32
// [batch][N]), then out[b] = bf16(rmsnorm(resid[b]) * norm_w) over all N, done by the CTA that
// finishes last. counter: one device uint, zero before the first launch; each launch leaves it zero
// (so graph replays need no reset); launches sharing a counter must not overlap (one stream).
Status gemv_bf16_residual_rmsnorm(const bf16_bits* W, const bf16_bits* x, float* resid, int N, int K, int batch,
                                  const float* norm_w, float eps, bf16_bits* out, unsigned* counter, cudaStream_t s);
// The MLP's first half at batch 1..8 in one pass: W_gate_up [2F][K] (gate rows, then up rows), and
// act[b][i] = bf16(silu(gate_i . x_b) * (up_i . x_b)), act [batch][F]; no fp32 round trip, no
// separate SwiGLU launch.
Status gemv_bf16_swiglu(const bf16_bits* W_gate_up, const bf16_bits* x, bf16_bits* act, int F, int K, int batch,
                        cudaStream_t s);
// The QKV projection with RoPE and the KV store in its epilogue, batch 1..8 (token b = batch row b):
// W_qkv [(n_heads + 2 n_kv) * hd][K]; a's qkv is unused; q_out, cache, positions, tables as
// rope_kv_store. One launch instead of two and no fp32 qkv round trip.
Status gemv_bf16_qkv_rope(const bf16_bits* W_qkv, const bf16_bits* x, int K, int batch, const RopeKv& a,
                          cudaStream_t s);
// The same over GGUF blocks (model/quant.h: block_q8_0 / q4_0 / q4_1, 32 weights a block, K % 32 == 0;
// block_q4_K / q6_K, 256 a block, K % 256 == 0), dequantized in registers. W 4-byte aligned.
enum class QuantType { Q8_0, Q4_0, Q4_1, Q4_K, Q6_K };
Status gemv_quant(const void* W, QuantType type, const bf16_bits* x, float* y, int N, int K, int batch,
                  bool accumulate, cudaStream_t s);

// --- the decode layer at batch 1..8 (decode.cu) ---------------------------------------------------
// Weights as the decode kernels read them: bf16 rows, or GGUF Q4_0 / Q4_1 / Q8_0 rows repacked
// (pack_row) so a lane's share of a 32-weight chunk is one aligned word: quants [N][Kp/2] (Q4: each
// chunk's 32 nibbles as four 32-bit words, one a lane, the lane's 8 weights interleaved 0,2,4,6 |
// 1,3,5,7; four chunks' words of a lane adjacent) or [N][Kp] (Q8: a lane's 8 quants of two chunks
// adjacent), fp16 scales d [N][Kp/32] and, for Q4_1, mins m [N][Kp/32]; Kp = K rounded up to 256,
// the padding zero. The values are GGUF's bit for bit.
// Q4_K: Q4_1's 4-bit layout, its "scales" the GGUF super-block headers as they are (d, dmin and the
// twelve bytes of 6-bit sub-block scales and mins: 16 bytes a 256-weight super-block). Q6_K: the
// quants as int8 (q - 32) in Q8_0's layout, its "scales" 32 bytes a super-block (the sixteen int8
// sub-block scales, then d). The 5-bit types keep their quants as int8 in Q8_0's layout: Q5_0 as
// q - 16 with Q8_0's fp16 scales, Q5_1 as q with Q4_1's fp16 scales and mins, Q5_K as q with Q4_K's
// headers. Values as GGUF defines them (d * sc in fp32, exact).
//
// Two layouts of the packed rows on the device. Groups (the default; DevWeights::groups; to_groups):
// rows in aligned groups of 8, each group's 256-weight rounds one after another, a round's block
// holding the 8 rows' quants, then their scales, then their mins ([8][q] [8][d] [8][m] bytes,
// PackGeom), in one buffer. A warp's round of a 16-row tile reads two contiguous blocks (Q4_0: 1,152
// bytes each) instead of 16 runs of 128 bytes and 16 of 16 bytes in two arrays. Rows
// (SS_CUDA_QLAYOUT=rows, the A/B baseline): the three arrays above. Measured on an H100
// (2026-12-07, docs/perf/gpu.md): the 8B decode step 1.5-3.3% faster in groups for Q4_0, Q4_K and
// Q8_0, 1B ~1%, 135M the same.
enum class WFormat : int { BF16, Q4_0, Q4_1, Q8_0, Q4_K, Q6_K, Q5_0, Q5_1, Q5_K };
struct DevWeights {
  WFormat format = WFormat::BF16;
  const void* q = nullptr;       // bf16 [N][K], or the packed quants (groups: the blocked buffer)
  const uint16_t* d = nullptr;   // fp16 scales (quantized formats; K formats: the super-block headers); groups: null
  const uint16_t* m = nullptr;   // fp16 mins (Q4_1, Q5_1); groups: null
  bool groups = false;           // the packed formats in the blocked layout (to_groups)
};
inline bool is_k_format(WFormat f) { return f == WFormat::Q4_K || f == WFormat::Q6_K || f == WFormat::Q5_K; }
inline bool has_min_array(WFormat f) { return f == WFormat::Q4_1 || f == WFormat::Q5_1; }
inline DevWeights bf16_weights(const bf16_bits* w) { return DevWeights{WFormat::BF16, w, nullptr, nullptr}; }
int packed_k(int K);
size_t packed_q_bytes(WFormat f, int64_t N, int K);
size_t packed_scale_count(WFormat f, int64_t N, int K);  // uint16s per array (d, and m for Q4_1)
// One GGUF row of K weights (blocks of the format's type) into q (packed_q_bytes(f, 1, K) bytes),
// d and m (packed_scale_count(f, 1, K) each; m only for Q4_1 and Q5_1). K formats: K % 256 == 0.
Status pack_row(WFormat f, const void* gguf_row, int K, uint8_t* q, uint16_t* d, uint16_t* m);
// The inverse as floats (tests): h2f converts an fp16 bit pattern.
void unpack_row(WFormat f, const uint8_t* q, const uint16_t* d, const uint16_t* m, int K, float (*h2f)(uint16_t),
                float* out);
// Bytes a row holds a 256-weight round (in either layout): quants, scales (Q6_K: its 32-byte
// super-block; the K formats: their 16-byte headers; else 8 fp16), mins (Q4_1, Q5_1: 8 fp16).
struct PackGeom {
  int q, d, m;
};
__host__ __device__ constexpr PackGeom pack_geom(WFormat f) {
  const bool b8 = f == WFormat::Q8_0 || f == WFormat::Q6_K || f == WFormat::Q5_0 || f == WFormat::Q5_1 ||
                  f == WFormat::Q5_K;
  return PackGeom{b8 ? 256 : 128, f == WFormat::Q6_K ? 32 : 16, f == WFormat::Q4_1 || f == WFormat::Q5_1 ? 16 : 0};
}
// The blocked buffer of N rows (N rounded up to 8; the extra rows zero), and N rows packed by
// pack_row (q, d, m as it writes them, row after row) blocked into it.
size_t packed_bytes(WFormat f, int64_t N, int K);
void to_groups(WFormat f, int64_t N, int K, const uint8_t* q, const uint16_t* d, const uint16_t* m, uint8_t* out);
// Whether packed weights are uploaded in the groups layout (the default; SS_CUDA_QLAYOUT=rows: not).
bool groups_layout();
// Where row r's round R of one part (quants, scales or mins) starts, in either layout:
// base + (r / 8) grp + (r % 8) row + R round.
struct PartAt {
  const uint8_t* base = nullptr;
  int64_t grp = 0, row = 0, round = 0;
};
struct PackedAt {
  PartAt q, d, m;
};
__host__ __device__ inline const uint8_t* part_at(const PartAt& p, int64_t r, int64_t R) {
  return p.base + (r >> 3) * p.grp + (r & 7) * p.row + R * p.round;
}
// The parts of packed weights W with rows of K.
PackedAt packed_at(const DevWeights& W, int K);

// Five kernels a layer, each launched (pdl true) with programmatic dependent launch: it loads its
// first weight vectors, then waits for the previous kernel (griddepcontrol.wait) and computes. The
// products run on the tensor cores (mma m16n8k16: 16 weight rows x the batch as its 8 columns; the
// quantized formats dequantize into the A fragment in registers and apply each chunk's scale to the
// mma's fp32 partial), so batch 8 costs about what batch 1 does. The norm ops take the fp32
// residual `resid` [batch][K] and normalise it themselves (RMSNorm with norm_w, eps) into shared
// memory; batch x K <= 80 Ki. A row's arithmetic is the same at every batch size (batch
// invariance). bf16 W 16-byte aligned, K % 32 == 0.
// QKV: W [(n_heads + 2 n_kv) * hd][K]; RoPE, the bias (rk.bias) and the KV store as
// gemv_bf16_qkv_rope (rk.qkv unused; no per-head q/k norms); q unscaled.
Status dec_qkv(const DevWeights& W, const float* resid, const float* norm_w, float eps, int K, int batch,
               const RopeKv& rk, bool pdl, cudaStream_t s);
// An add's K split across CTAs (dec_add): where its 16-row tiles leave most warp slots idle, up to
// max_ks CTAs take a share of K each, store their partial tiles in `part`, and the tile's last CTA
// (a ticket in `tickets`) sums them in split order and adds. Chosen from the shape only, so a row's
// result does not depend on the batch. max_ks <= 1 or null: off. part: at least
// splitk_part_floats(N, max_ks) floats; tickets: at least ceil(N / 16), zero (left zero).
struct SplitK {
  float* part = nullptr;
  unsigned* tickets = nullptr;
  int64_t part_floats = 0;
  int n_tickets = 0;
  int max_ks = 0;
  // A split keeps at least this many 32-wide chunks of K a warp (kWarps warps a split): 4 let
  // Llama-3.2-1B's o_proj split and lose more to the partials' sum than it gained (2026-12-06); the
  // backend takes 8.
  int min_chunks_per_warp = 4;
};
int64_t splitk_part_floats(int N, int max_ks);
// resid[b][n] += sum_k W[n][k] x[b][k] (o_proj, down).
Status dec_add(const DevWeights& W, const bf16_bits* x, float* resid, int N, int K, int batch, bool pdl,
               cudaStream_t s, const SplitK* sk = nullptr);
// act[b][i] = bf16(silu(gate_i . xn_b) * (up_i . xn_b)), W [2F][K] (gate rows then up rows),
// xn_b = rmsnorm(resid[b]).
Status dec_gate_up(const DevWeights& W, const float* resid, const float* norm_w, float eps, bf16_bits* act, int F,
                   int K, int batch, bool pdl, cudaStream_t s);
// y[b][n] = W[n] . rmsnorm(resid[rows[b]]) (rows null: row b): the final norm and lm_head.
Status dec_norm_gemv(const DevWeights& W, const float* resid, const int32_t* rows, const float* norm_w, float eps,
                     float* y, int N, int K, int batch, bool pdl, cudaStream_t s);
// Whether the norm ops (dec_qkv, dec_gate_up, dec_norm_gemv) over weights of format f quantize their
// normalised input to 8-bit blocks and multiply on the integer tensor cores: every packed format when
// on (SS_CUDA_DEC_I8=1; decode.cu's kI8Default). Per 32 values d = amax / 127 and
// q = round-to-nearest-even(x * (1 / d)), from the fp32 normalised values (the CPU backend's rule,
// cpu/act_quant.h); the adds keep bf16 inputs.
bool dec_int8_acts(WFormat f);
// Tests: 1 / 0 turn the 8-bit activations on / off for every later launch; -1 back to the default.
void dec_set_int8_acts(int on);
// Tests: every later fused decode launch splits a tile's K over s warps (1, 2, 4 or 8; S in
// decode.cu) instead of the shape's choice; 0 back to the choice. A row's sums are then added in
// another order, so other bits, still independent of the batch.
void dec_set_s(int s);
// The current device's SM count, asked once per process (0 when there is no device).
int device_sm_count();
// Benchmarking only (SS_CUDA_CHAIN_TRACE=1): the next fused decode kernel launched (dec_*) stamps its
// phases into this slot of kChainPhases words (common.cuh's phase()); taken by that one launch.
constexpr int kChainPhases = 8;
void set_chain_slot(unsigned long long* slot);
// Benchmarking only: SS_CUDA_EMPTY=1 (read once, in decode.cu): the fused decode's kernels, attention
// included (Attention::empty), launch, wait and exit.
bool empty_kernels();

// --- the decode step as one persistent kernel (mega.cu) ----------------------------------------------
// Batch 1..kMegaMaxBatch, bf16 weights: embeddings in resid first (embed), then every layer (the
// decode layer's five operations above, in one cooperative launch of one CTA a SM, grid barriers
// or per-unit readiness counters between them, each CTA streaming its share of the weights through
// a shared-memory ring ahead of its compute), the final norm and lm_head into logits for rows[0 ..
// n_rows). The same arithmetic as dec_* (only the order of fp32 partial sums differs; it depends
// on the shape and the SM count, never on the batch). Attention for decode and prefill rows alike
// (row b sees ctx_len[b] keys).
constexpr int kMegaMaxBatch = 8;
struct MegaLayer {
  const bf16_bits *wqkv, *wo, *wgu, *wdown;  // as dec_qkv / dec_add / dec_gate_up take them
  const float *attn_norm, *ffn_norm, *bqkv;  // bqkv: null without a bias
  bf16_bits* cache;                          // this layer's paged KV (block 0)
};
struct MegaDecode {
  int L, H, I, V;
  float eps, scale;          // scale: the attention's (1/sqrt(hd))
  const MegaLayer* layers;   // device array [L]
  const bf16_bits* out_w;    // [V][H]
  const float* out_norm;
  RopeKv rk;                 // everything but cache and bias (per layer); q_out: [kMegaMaxBatch][n_heads*hd]
  const int32_t* ctx_len;    // [n_tok]: keys row b sees (its position + 1)
  float* resid;              // [n_tok][H]
  bf16_bits *att, *act;      // [n_tok][n_heads*hd], [n_tok][I]
  float* logits;             // [n_rows][V]
  const int32_t* rows;       // [n_rows]: the residual row of logits row r (null: r)
  void* work;                // mega_work_bytes(), zero once before the first launch; each launch leaves it so
  // Diagnostics (null: off), mega_trace_words(L) of them: CTA 0's %globaltimer at the end of each
  // part of layer l, [10 l + i]: 0 QKV (with its norm), 1 barrier, 2 attention, 3 barrier, 4 o_proj,
  // 5 barrier, 6 gate/up (with its norm), 7 barrier, 8 down, 9 barrier; [10 L] the start, [10 L + 1]
  // the end (after lm_head); [10 L + 2], [10 L + 3] before and after kMegaTraceProbe barriers with
  // no work between them, run first; [10 L + 4 + k] when the last CTA arrived at barrier k (the
  // probe's first, then five a layer).
  unsigned long long* trace = nullptr;
  // A grid barrier after every operation (the default), or readiness counters where a consumer
  // needs only some producers' output (false: SS_CUDA_MEGA_SYNC=counters; mega.cu's top).
  bool barriers = true;
  // SS_CUDA_MEGA_DEAL=rr: whole tiles dealt round-robin first (tile t to CTA t mod grid), QKV's in
  // KV-group order, the rest in even contiguous ranges (mega.cu's Split); else even ranges only.
  bool deal_rr = false;
};
constexpr int kMegaTraceProbe = 16;
__host__ __device__ constexpr int mega_trace_arrivals(int L) { return 10 * L + 4; }  // where the last arrivals start
constexpr int mega_trace_words(int L) { return mega_trace_arrivals(L) + kMegaTraceProbe + 5 * L; }
// Empty when the kernel runs this model, else why not (head dim 64/128, GQA groups <= 4, no q/k norms).
std::string mega_unsupported(const MegaDecode& shape);
size_t mega_work_bytes(const MegaDecode& shape);
Status mega_decode(const MegaDecode& a, int n_tok, int n_rows, cudaStream_t s);

// out[N][K] bf16 = the packed weights dequantized (the large-batch path multiplies bf16 with cuBLAS).
Status dequantize_weights(const DevWeights& W, int N, int K, bf16_bits* out, cudaStream_t s);

// Tensor-core GEMM through cuBLASLt for larger token batches: y[M][N] fp32 = x[M][K] bf16 * W[N][K]^T.
// One handle and workspace per stream owner; create once, reuse (graph capture: no allocation inside).
struct LtGemm;
Expected<LtGemm*> lt_create(size_t workspace_bytes);
void lt_destroy(LtGemm* g);
Status lt_gemm_bf16(LtGemm* g, const bf16_bits* W, const bf16_bits* x, float* y, int M, int N, int K,
                    bool accumulate, cudaStream_t s);

// --- activations ----------------------------------------------------------------------------------
// act[t][i] = bf16(silu(gu[t][i]) * gu[t][inter + i]) (gate then up, the fused projection's output).
Status swiglu(const float* gu, int n_tok, int inter, bf16_bits* act, cudaStream_t s);

// --- attention ------------------------------------------------------------------------------------
// Each query row attends, causally, to positions [0, ctx_len[q]) of sequence seq_of_query[q] through
// the paged cache (its own K/V already stored). GQA: one CTA per (query row, KV head, split) serves the
// group's n_heads / n_kv query heads; long contexts are split over up to max_splits CTAs (flash-
// decoding: each writes its partial softmax; a combine kernel merges). Decode: one row per sequence;
// prefill: one row per prompt token (ctx_len = position + 1), the prefix already cached.
// q: [n_q][n_heads*hd] fp32 (unscaled), out: [n_q][n_heads*hd] bf16; hd in {64, 128, 256}, group <= 8.
// The split count depends on max_splits and the row count only, never on ctx_len, so one captured
// graph serves every context length. A split covers max(64, ctx / splits) keys rounded up to whole
// blocks, so only the first ceil(ctx / that) splits hold keys (the rest exit at once) and a row's
// result depends on its context and `splits` only; max_splits is the workspace's stride (>= splits).
struct Attention {
  const float* q;
  const bf16_bits* cache;
  int n_heads, n_kv, hd;
  float scale;                  // usually 1/sqrt(hd)
  const int32_t* ctx_len;       // [n_q]
  const int32_t* seq_of_query;  // [n_q]
  const int32_t* tables;
  int max_blocks;
  bf16_bits* out;
  float* workspace;             // attention_workspace_floats(...) floats
  int max_splits;               // 1..64
  // [n_q * n_kv] uints, zero before the first launch and left zero by each: the last split CTA of a
  // (row, KV head) merges the splits itself (no combine launch). Null: a separate combine kernel.
  unsigned* split_counters;
  // Launched with programmatic dependent launch (see the decode layer below): the CTAs may start
  // while the previous kernel runs and wait for it before reading anything.
  bool pdl = false;
  // A CTA prefetches its keys and values to L2 before the wait (see attention.cu) only when the step's
  // K/V, estimated as every CTA reading as many keys as this one, fits in this many bytes: a batch
  // whose K/V is larger than L2 would only evict what other CTAs are about to read.
  int64_t l2_prefetch_bytes = INT64_MAX;
  // Splits a thread-block cluster (0: none; 2..16, dividing the launch's splits; needs
  // split_counters): a row whose live splits all fall in its first cluster (2..cluster of them)
  // merges them through distributed shared memory, with no workspace, fence or ticket; other rows
  // merge as without it. Which path a row takes depends on its context length only.
  int cluster = 0;
  // With a cluster: every split stores its result into the first CTA's shared memory and the cluster
  // passes one barrier, after which that CTA merges locally (no remote reads, no second barrier).
  // The same arithmetic in the same order: bit-identical to the other merges. Slower at 135M batch 1
  // on an H100 (2026-12-06: 0.632 -> 0.655 ms; the kernel no longer launches before QKV ends), so
  // off unless SS_CUDA_ATTN_PUSH=1.
  bool cluster_push = false;
  bool empty = false;  // benchmarking only (SS_CUDA_EMPTY=1): the grid launches, waits and exits
  unsigned long long* stamps = nullptr;  // the phase trace's slot (SS_CUDA_CHAIN_TRACE=1), else null
};
int64_t attention_workspace_floats(int n_q, int n_heads, int hd, int max_splits);
// Splits used for n_q rows on this many SMs: enough CTAs to cover the chip about twice.
int attention_splits(int n_q, int n_kv, int sm_count, int max_splits);
// The largest cluster of `want` or fewer splits (16, 8 or 0) this device can launch for the
// attention kernel of head dim hd and group g (cudaOccupancyMaxActiveClusters >= 1).
int attention_max_cluster(int want, int hd, int g);
Status attention(const Attention& a, int n_q, int splits, cudaStream_t s);

// --- prefill attention on tensor cores ------------------------------------------------------------
// Causal attention for query rows that come in runs of one sequence at consecutive positions (a
// prompt chunk), flash-attention style: a CTA takes a tile of up to kPrefillTileRows such rows and
// one query head, streams the sequence's keys and values through shared memory 64 at a time
// (cp.async, double-buffered) and runs Q K^T and P V as bf16 mma.sync with fp32 accumulation and an
// online softmax in registers. q (fp32) and P are rounded to bf16 for the tensor cores; the row
// kernel above keeps q in fp32, so the two differ by that rounding (at most 2^-8 of a score's terms).
// Head dims 64 and 128.
// pack_group: a CTA takes one KV head and every query head of its group, row r of the tile being
// position r / G and head r % G of the group (tiles of at most kPrefillTileRows / G positions:
// prefill_tiles' max_rows), so each K/V tile is read once for the whole group instead of once a
// head. A decode row (one position) then fills G of the 64 rows; the CTA count is n_kv x tiles.
constexpr int kPrefillTileRows = 64;
struct PrefillTile {
  int32_t row0, n_rows;  // rows row0 .. row0 + n_rows - 1 of the step, positions consecutive
  int32_t slot;          // their table row
  int32_t pad;
};
// Splits the T rows of a step into tiles: a tile ends where the table row changes, the position is not
// the previous one's + 1, or max_rows rows are reached. out has room for T; returns the count.
inline int prefill_tiles(const int32_t* slot_of_row, const int32_t* pos_of_row, int T, PrefillTile* out,
                         int max_rows = kPrefillTileRows) {
  int n = 0;
  for (int i = 0; i < T;) {
    int j = i + 1;
    while (j < T && j - i < max_rows && slot_of_row[j] == slot_of_row[i] && pos_of_row[j] == pos_of_row[j - 1] + 1)
      ++j;
    out[n++] = PrefillTile{i, j - i, slot_of_row[i], 0};
    i = j;
  }
  return n;
}
struct PrefillAttention {
  const float* q;  // [T][n_heads][hd]
  const bf16_bits* cache;
  int n_heads, n_kv, hd;
  float scale;              // usually 1/sqrt(hd); 1 when q comes pre-scaled
  const int32_t* ctx_len;   // [T]: the keys row i sees, positions [0, ctx_len[i]) (its position + 1)
  const int32_t* tables;
  int max_blocks;
  const PrefillTile* tiles;  // [n_tiles], device
  int n_tiles;
  bf16_bits* out;            // [T][n_heads][hd]
  bool pack_group = false;   // tiles of at most kPrefillTileRows / (n_heads / n_kv) positions
  // Tiles of at most 16 rows (a decode row's G rows with pack_group) split each key tile over the
  // CTA's four warps, 16 keys each, merged at the end; otherwise one warp computes, three wait.
  bool split_keys = false;
  // Where the tiles were made on the device (build_tiles, inside a graph): their count, read by the
  // kernel; n_tiles is then only the grid's bound (the step's rows), the CTAs past the count exit.
  const int32_t* n_tiles_dev = nullptr;
};
Status prefill_attention(const PrefillAttention& a, cudaStream_t s);
// prefill_tiles on the device (for steps whose rows the GPU wrote, the device loop's): the same
// tiles of the T rows into tiles[0 .. *n_tiles). One warp; T <= 65535.
Status build_tiles(const int32_t* slot_of_row, const int32_t* pos_of_row, int T, int max_rows, PrefillTile* tiles,
                   int32_t* n_tiles, cudaStream_t s);

// --- sampling -------------------------------------------------------------------------------------
// ids[r] = argmax of logits row r (V floats); ties: the lowest id; NaNs never win (an all-NaN row: 0).
Status argmax(const float* logits, int n_rows, int V, int32_t* ids, cudaStream_t s);

// Per row sampling parameters (a device array, one per row).
struct RowSampling {
  float temperature;   // <= 0: greedy
  int top_k;           // 0: off
  float top_p;         // 1: off
  float min_p;         // 0: off
  uint64_t seed;
  uint64_t counter;    // the draw's index (SplitMix64 counter)
};
// One token per row, the host reference sampler's rules (backend/cpu/sampler.cpp) on the device:
// the bitmask first when given (words_per_row uint32 words a row, bit t = token t allowed); greedy:
// the argmax (ties: lowest id); else weights w = exp(logit/T - max/T) and u = SplitMix64(seed,
// counter); without truncation the inverse CDF of u in id order; with top-k / top-p / min-p the
// candidates in (logit/T descending, id ascending) order: the first top_k, then the shortest prefix
// whose mass reaches top_p of theirs, then those with w >= min_p (at least one), and the inverse CDF
// in that order. The rows that truncate are sorted on the device (segmented radix sort; the others
// get empty segments, so greedy and plain-temperature rows cost the sort nothing) into `scratch`, of
// sample_scratch_bytes(n_rows, V) bytes, taken once outside the hot path.
size_t sample_scratch_bytes(int n_rows, int V);
Status sample(const float* logits, int n_rows, int V, const RowSampling* params, const uint32_t* bitmask,
              int words_per_row, void* scratch, size_t scratch_bytes, int32_t* ids, cudaStream_t s);
// Log-softmax of each row (after the bitmask when given): the chosen token's logprob and the k most
// likely (id, logprob), most likely first, ties by lower id. top_ids / top_lp: [n_rows][k], k <= 64.
Status logprobs(const float* logits, int n_rows, int V, const uint32_t* bitmask, int words_per_row,
                const int32_t* chosen, int k, float* chosen_lp, int32_t* top_ids, float* top_lp, cudaStream_t s);

// In-place edits of logits before sampling, one (row, token) each (no two alike), in the host
// sampler's order and float operations: banned (-inf), then + logit bias, then the repetition penalty
// (l > 0 ? l / rep : l * rep), then - (presence + frequency x count) (computed on the host).
struct LogitEdit {
  int32_t row, id;
  uint32_t flags;  // kEditBan | kEditAdd | kEditRep | kEditSub
  float add, rep, sub;
};
constexpr uint32_t kEditBan = 1, kEditAdd = 2, kEditRep = 4, kEditSub = 8;
Status edit_logits(float* logits, int V, const LogitEdit* edits, int n, cudaStream_t s);

// SplitMix64 uniform of draw `counter` of stream `seed`: the host sampler's own function.
using backend::sampling_uniform;

}  // namespace ss::cuda::kern
