// The backend folder's public header: one interface, implemented by cpu/ and (later) cuda/.
// The engine plans each step and hands the backend one flat batch; the backend runs the forward
// pass over a paged KV cache it owns and returns logits for the positions that want them.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

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

// One step. Token i belongs to sequence seq_index[i], sits at position positions[i], and its K/V is
// stored in block block_tables[seq][positions[i] / block_size] at slot positions[i] % block_size.
// Attention for token i covers positions 0..positions[i] of its sequence (causal): K/V of earlier
// positions must already be in the cache or in this batch.
struct StepBatch {
  std::vector<int32_t> tokens;
  std::vector<int32_t> positions;
  std::vector<int32_t> seq_index;
  std::vector<std::vector<int32_t>> block_tables;
  std::vector<int32_t> logits_rows;  // indices into tokens; logits come back in this order
};

struct BackendOptions {
  int threads = 0;  // 0: all cores
  KvCacheConfig kv;  // kv.num_blocks 0: enough for one sequence of min(max_context, 4096) tokens
  // Scratch is sized for this many tokens per step at start-up; a bigger batch grows it (allocates).
  int max_batch_tokens = 512;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual const KvCacheConfig& kv_config() const = 0;
  // logits: logits_rows.size() x vocab floats, written in full.
  virtual Status forward(const StepBatch& batch, float* logits) = 0;
  // Runs fn(ctx, i) for i in [0, n) on the backend's host threads, if it has any, and waits (the
  // engine samples each sequence's token this way). The calls must be independent.
  virtual void parallel_for(int n, void (*fn)(void* ctx, int i), void* ctx) {
    for (int i = 0; i < n; ++i) fn(ctx, i);
  }
};

Expected<std::unique_ptr<Backend>> make_cpu_backend(const model::Model& model, const BackendOptions& opts);

}  // namespace ss::backend
