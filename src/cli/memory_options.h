// The flags that decide what memory the server takes, shared by `serve` and `inspect --memory` so
// that both compute the same backend, KV pool and tiers: threads, seats, batch, KV cache size and
// dtype, --memory-mode and the tier flags it sets defaults for (explicit flags win), the device.
#pragma once
#include <cstdint>
#include <map>
#include <string>

#include "backend/backend.h"
#include "cli/common.h"
#include "engine/engine.h"
#include "model/model.h"

namespace CLI {
class App;
}

namespace ss::cli {

struct MemoryArgs {
  int threads = 0;  // 0: one per physical core (selfserve topology)
  int max_num_seqs = 32;
  int max_num_batched_tokens = 512;
  int block_size = 16;
  int num_kv_blocks = 0;
  double kv_cache_mib = 0;
  backend::KvCacheConfig::DType kv_dtype = backend::KvCacheConfig::DType::F16;
  std::string memory_mode = "balanced";
  bool no_memory_pressure = false;  // level 0 always (A/B runs)
  int64_t kv_host_bytes = -1;    // -1: the mode's
  bool kv_host_compress = false;
  int64_t kv_cache_ttl_ms = -1;  // -1: the mode's
  std::string kv_disk_dir;
  int64_t kv_disk_bytes = -1;    // -1: the mode's (with --kv-disk-dir)
  DeviceArgs device;
};
void add_memory_options(CLI::App* cmd, MemoryArgs* a);

// What the flags resolve to for a model (no allocation yet).
struct MemoryPlan {
  engine::MemoryModeSettings mode;
  backend::BackendOptions backend;
  engine::KvTierConfig tiers;         // model_hash not set
  engine::PressureConfig pressure;
  std::string threads_source;         // "--threads", or where the default came from
};
Expected<MemoryPlan> plan_memory(const model::ModelConfig& mc, const MemoryArgs& a, bool quiet);

// Labels of selfserve_memory_mode_info, and the same as one line for the startup log.
std::map<std::string, std::string> memory_mode_labels(const MemoryPlan& p);
std::string memory_mode_line(const MemoryPlan& p);

}  // namespace ss::cli
