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
  // Level 3's CPU engine below the primary (engine.h, EngineRouter).
  std::string cpu_fallback = "auto";
  int cpu_fallback_threads = 0;       // 0: half of --threads or its default (at least 1)
  double cpu_fallback_kv_mib = 0;     // 0: kDefaultFallbackKvMib
  int cpu_fallback_max_num_seqs = 0;  // 0: min(--max-num-seqs, 8)
  DeviceArgs device;
};
void add_memory_options(CLI::App* cmd, MemoryArgs* a);

// What the flags resolve to for a model (no allocation yet).
struct MemoryPlan {
  engine::MemoryModeSettings mode;
  backend::BackendOptions backend;
  engine::KvTierConfig tiers;         // model_hash not set
  engine::PressureConfig pressure;    // has_lower_backend: cpu_fallback.enabled
  std::string threads_source;         // "--threads", or where the default came from
  struct CpuFallback {
    engine::CpuFallbackMode mode = engine::CpuFallbackMode::Auto;
    engine::CpuFallbackDecision decision;  // enabled, and why (the startup line)
    backend::BackendOptions backend;       // its threads and KV pool (always the CPU backend)
    int max_num_seqs = 8;
    int64_t need_bytes = 0;                // weights (mapped) + KV pool: what auto checks against MemAvailable
  } cpu_fallback;
};
// weight_bytes: the model's weight files (Model::file_bytes), what a CPU fallback engine maps.
Expected<MemoryPlan> plan_memory(const model::ModelConfig& mc, const MemoryArgs& a, bool quiet, uint64_t weight_bytes);

// Labels of selfserve_memory_mode_info, and the same as one line for the startup log.
std::map<std::string, std::string> memory_mode_labels(const MemoryPlan& p);
std::string memory_mode_line(const MemoryPlan& p);

}  // namespace ss::cli
