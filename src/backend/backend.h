// The backend folder's public header: one interface, implemented by cpu/ and cuda/.
// An executor plans each step and hands the backend one flat batch; the backend runs the forward
// pass over a paged KV cache it owns, samples the rows that want a token (sampling.h) and returns
// token ids, plus only the log-probability rows asked for. Executors (executor.h) sit on top.
// Others include this header only; it brings executor.h and sampling.h along.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/executor.h"
#include "backend/resident/runner.h"
#include "backend/sampling.h"
#include "common/status.h"
#include "common/thread_pool.h"

namespace ss::model {
class Model;
}

namespace ss::backend {

struct KvCacheConfig {
  int num_blocks = 0;   // blocks per layer
  int block_size = 16;  // tokens per block
  // Element type of the cached K/V. F16 halves the memory and the bytes decode reads per token;
  // F32 keeps attention at full precision (tests that compare against fp32 references use it); Q8
  // (int8 with a scale per token and KV head, as llama.cpp's q8_0 cache) halves F16's bytes again at
  // a small cost in accuracy -- opt-in, like --cache-type-k q8_0 there and --kv-cache-dtype fp8 in vLLM.
  enum class DType { F32, F16, Q8 } dtype = DType::F16;
};
// "f32", "f16", "q8_0"; parse_kv_dtype returns false for anything else.
const char* kv_dtype_name(KvCacheConfig::DType t);
bool parse_kv_dtype(const std::string& s, KvCacheConfig::DType* out);
// Bytes of one KV block (every layer's K and V) in the CPU backend's layout (blocks padded to 16 slots).
int64_t cpu_kv_block_bytes(const KvCacheConfig& kv, int n_layers, int n_kv_heads, int head_dim);

// A row of the batch whose token is drawn: the logits of token `token` (an index into
// StepBatch::tokens), sampled with `params` for the request's output position `n` (the RNG
// counter). The spans and pointers stay valid for the step.
struct SampleRow {
  int32_t token = 0;
  const SamplingParams* params = nullptr;
  uint64_t n = 0;
  std::span<const int32_t> prompt;  // penalties: the request's prompt and output so far
  std::span<const int32_t> output;
  std::span<const int32_t> banned;  // ids set to -inf first (the stop ids before min_tokens)
  TokenMask* mask = nullptr;        // optional grammar
  int logprobs = -1;                // >= 0: the chosen token's logprob plus the top k
};

// A prompt position to score (OpenAI's echo + logprobs): the raw logits' log-softmax at token
// `token`, for `target` (the prompt token after it), plus the top k.
struct ScoreRow {
  int32_t token = 0;
  int32_t target = 0;
  int top_k = 0;
};

// A change to one slot's block table, applied before the step: entries [first, first + count) of
// slot `slot` become edit_blocks[offset, offset + count) and the table ends there. Appending a
// block, starting a sequence (first = 0) and dropping a table (first = 0, count = 0) are all edits.
struct TableEdit {
  int32_t slot = 0;
  int32_t first = 0;
  int32_t count = 0;
  int32_t offset = 0;
};

// One step, flat. Token i belongs to batch sequence seq_index[i], sits at position positions[i],
// and its K/V is stored in block table(seq_slot[s])[positions[i] / block_size] at slot
// positions[i] % block_size. A backend keeps one block table per slot across steps
// (max_slots() of them); the batch carries only the edits. Attention for token i covers positions
// 0..positions[i] of its sequence (causal): K/V of earlier positions must already be in the cache
// or in this batch.
struct StepBatch {
  std::vector<int32_t> tokens;
  std::vector<int32_t> positions;
  std::vector<int32_t> seq_index;
  std::vector<int32_t> seq_slot;     // per batch sequence
  std::vector<TableEdit> table_edits;
  std::vector<int32_t> edit_blocks;
  std::vector<SampleRow> sample_rows;
  std::vector<ScoreRow> score_rows;
  std::vector<int32_t> logits_rows;  // raw logits wanted back (tests, tools), indices into tokens

  void clear();  // keeps capacity
  // Appends an edit setting slot's table to `blocks` from entry `first` on.
  void edit_table(int32_t slot, int32_t first, std::span<const int32_t> blocks);
};

struct StepOutput {
  std::vector<int32_t> tokens;         // one per sample row
  std::vector<RowLogprobs> logprobs;   // one per sample row (filled where it asked for logprobs)
  std::vector<RowLogprobs> scores;     // one per score row (chosen: the target's logprob)
  std::vector<float> logits;           // logits_rows.size() x vocab
};

// Keeps the block table of each slot; backends apply a batch's edits through it.
class BlockTables {
 public:
  explicit BlockTables(int slots = 0) : tables_(static_cast<size_t>(slots)) {}
  Status apply(const StepBatch& b, int num_blocks);
  std::span<const int32_t> of(int slot) const { return tables_[static_cast<size_t>(slot)]; }
  int size() const { return static_cast<int>(tables_.size()); }

 private:
  std::vector<std::vector<int32_t>> tables_;
};

// Time per stage, summed over steps while profiling is on (what a backend can attribute; stages it
// does not have stay 0).
struct StepProfile {
  double matmul_s = 0;     // every projection except lm_head (includes activation quantization)
  double lm_head_s = 0;    // final norm + output projection
  double attention_s = 0;  // the attention stage (scores, softmax, weighted V)
  double rope_kv_s = 0;    // bias, q/k norm, RoPE, K/V cache writes
  double other_s = 0;      // embedding, RMSNorm + residual, SwiGLU, gathers, validation, sampling
  int64_t forwards = 0;
  int64_t tokens = 0;
  int64_t prefetched_kv_bytes = 0;  // CPU: K/V lines the products prefetched for the attention after them
  double total() const { return matmul_s + lm_head_s + attention_s + rope_kv_s + other_s; }
};

// Memory a backend holds, by class: read-only weights (as the backend keeps them, e.g. repacked),
// the read-write KV pool (all of it, used or not: the engine knows the use) and temporary scratch
// (activations, logits, per-thread buffers; grows when a bigger batch arrives). `where`: "host"
// for RAM, "device" for GPU memory.
struct BackendMemory {
  int64_t weights_bytes = 0;
  int64_t kv_pool_bytes = 0;
  int64_t scratch_bytes = 0;
  std::string where = "host";
  int64_t host_registered_bytes = 0;  // host memory page-locked for KV block copies (register_host_memory)
};

struct BackendOptions {
  int threads = 0;  // 0: all cores
  KvCacheConfig kv;  // kv.num_blocks 0: enough for one sequence of min(max_context, 4096) tokens
  // Scratch is sized for this many tokens per step at start-up; a bigger batch grows it (allocates).
  int max_batch_tokens = 512;
  int max_slots = 256;  // block tables kept (sequences that can be live in the KV cache at once)
  // CUDA: the share of the GPU's memory to take (weights, KV cache, scratch) when kv.num_blocks is
  // 0, and the size of each pinned staging buffer weights are uploaded through.
  double gpu_memory_utilization = 0.9;
  int weight_chunk_mb = 64;
  bool enforce_eager = false;  // CUDA: no graphs (every step kernel by kernel)
  // CUDA: every row computed exactly as it is at batch 1, whatever shares its step (the CPU backend
  // always is): steps past the fused path's 8 rows, prompts included, run it 8 rows at a time instead
  // of the tensor-core GEMMs and attention tiles. A sequence's greedy text then does not depend on
  // the load, on how its prompt was chunked or on a preemption's recompute; large batches and
  // prefill are slower (each 8 rows read the weights again). As vLLM's VLLM_BATCH_INVARIANT.
  bool batch_invariant = false;
  // CUDA: keep Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 / Q4_K / Q5_K / Q6_K projection weights quantized on the device (repacked; steps of
  // <= 8 tokens read them directly, larger steps dequantize a matrix at a time for cuBLAS) instead of
  // converting every weight to bf16 at load. Off, the backend still keeps them packed where bf16
  // copies would crowd the memory share (cuda/memory_budget.h, keep_weights_quantized).
  bool gpu_native_quant = false;
  // CUDA: sample every row on the device (bans, logit bias, penalties, grammar bitmask, logprobs; the
  // host sampler's weights bit for bit, its double sums in another order, so a draw can differ only
  // within ~1e-16 of a boundary) instead of copying the logits of rows other than plain greedy
  // back and sampling them on the host. On by default since the H200 run of 2026-12-05 (its exactness
  // test passed; sampled 1B decode at batch 64 3.5x faster); SS_CUDA_DEVICE_SAMPLING=0 or 1 overrides.
  bool gpu_device_sampling = true;
};

// One block of a batched KV copy (Backend::read_kv_blocks / write_kv_blocks): pool block `block`
// and its kv_block_bytes() bytes on the host.
struct KvBlockOut {
  int32_t block = 0;
  std::span<uint8_t> bytes;
};
struct KvBlockIn {
  int32_t block = 0;
  std::span<const uint8_t> bytes;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual const KvCacheConfig& kv_config() const = 0;
  virtual int vocab_size() const = 0;  // logits per row
  virtual int max_slots() const = 0;
  // Runs one step: applies the table edits, computes every token's K/V, samples the sample rows,
  // scores the score rows and copies out the raw logits rows. `out` is resized to the rows.
  virtual Status step(const StepBatch& batch, StepOutput& out) = 0;

  // One KV block moved out of and back into the cache (the engine's host and disk tiers, which
  // keep blocks that leave the pool): every layer's K and V of block `block`, kv_block_bytes()
  // bytes in the backend's own layout, so a block written back is bit-identical to the one read.
  // Called between steps, on the executor's thread. kv_block_bytes() 0: no block copies (no tiers).
  virtual int64_t kv_block_bytes() const { return 0; }
  virtual Status read_kv_block(int32_t /*block*/, std::span<uint8_t> /*out*/) {
    return make_error("backend " + name() + " cannot copy KV blocks out");
  }
  virtual Status write_kv_block(int32_t /*block*/, std::span<const uint8_t> /*in*/) {
    return make_error("backend " + name() + " cannot copy KV blocks in");
  }
  // Many blocks in one call (a returning history's restore, a step's worth at once). Every entry is
  // checked first (check_kv_block_copies: the block in range, exactly kv_block_bytes() bytes); a bad
  // one is an error that names it, and nothing is copied. All are copied when the call returns, and
  // the host bytes may be reused then. The default is a loop over read_kv_block / write_kv_block
  // (the CPU backend: a memcpy each); CUDA issues every copy, then waits once.
  virtual Status read_kv_blocks(std::span<const KvBlockOut> blocks);
  virtual Status write_kv_blocks(std::span<const KvBlockIn> blocks);
  // Host memory that KV blocks are copied out of and into (the tiers' arena, allocated once): a
  // backend whose copies can use it in place registers it (CUDA: page-locked, so a block moves by
  // DMA with no staging copy); the default does nothing. Registering is an optimisation: a backend
  // that cannot register says why on stderr and copies as before. unregister_host_memory(p) before
  // the memory goes. Not concurrent with the block copies.
  virtual void register_host_memory(void* /*p*/, size_t /*bytes*/) {}
  virtual void unregister_host_memory(void* /*p*/) {}

  // Bytes held per memory class (BackendMemory); a backend that cannot tell reports zeros. Called
  // on the executor's thread (scratch may grow during a step).
  virtual BackendMemory memory() const { return {}; }

  // The resident loop (issue 17) run by the backend itself, its control plane on the device, over
  // `share` of the KV blocks and block-table slots; null when the backend has none (a host thread
  // then drives step(): engine/resident_executor.h). Created at most once, on the executor's thread.
  virtual Expected<std::unique_ptr<resident::LoopRunner>> make_loop_runner(const resident::Geometry& /*g*/,
                                                                          const resident::LoopShare& /*share*/) {
    return std::unique_ptr<resident::LoopRunner>();
  }

  // Stage timing for benchmarks (bench decode); a backend without it reports nothing.
  virtual void set_profiling(bool /*on*/, bool /*thread_cpu_time*/ = false) {}
  virtual StepProfile profile() const { return {}; }
  virtual void reset_profile() {}
};

Expected<std::unique_ptr<Backend>> make_cpu_backend(const model::Model& model, const BackendOptions& opts);
// The GPU backend (device 0); an error when selfserve was built without CUDA or no device is usable.
Expected<std::unique_ptr<Backend>> make_cuda_backend(const model::Model& model, const BackendOptions& opts);
// "NVIDIA H200, 143771 MiB, 132 SMs, compute 9.0" for device 0; empty when there is none (or no CUDA build).
std::string cuda_device_summary();

// Checks what every backend needs of a batch before it touches memory: tokens, positions and
// sequences consistent, slots and blocks in range, every position's block present in its table,
// sample / score / logits rows in range. `tables`: the tables after the batch's edits.
Status validate_batch(const StepBatch& b, const BlockTables& tables, int num_blocks, int block_size, int vocab);

// What every backend checks of a batched KV copy before it copies anything: each block in
// [0, num_blocks) and each entry exactly block_bytes bytes. The error names the first bad entry.
Status check_kv_block_copies(std::span<const KvBlockOut> blocks, int num_blocks, int64_t block_bytes, const std::string& who);
Status check_kv_block_copies(std::span<const KvBlockIn> blocks, int num_blocks, int64_t block_bytes, const std::string& who);

// Samples and scores rows on the host from logits the caller computed: row r of `logits` (vocab
// floats, modified in place) belongs to sample row r, then score row r - sample_rows.size(). Rows
// are pulled from a shared counter by `pool`'s threads (null: inline), each thread with its own
// RowSampler (samplers[thread], at least pool's size of them).
void sample_on_host(const StepBatch& b, float* logits, int vocab, std::vector<RowSampler>& samplers, ThreadPool* pool,
                    StepOutput& out);

}  // namespace ss::backend
