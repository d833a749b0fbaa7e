// Helpers shared by the CLI subcommands.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include <functional>

#include "backend/backend.h"
#include "common/status.h"
#include "engine/engine.h"
#include "model/model.h"

namespace CLI {
class App;
}

namespace ss::cli {

// --kv-cache-dtype f16|f32|q8_0 on a subcommand (default f16).
void add_kv_dtype_option(CLI::App* cmd, backend::KvCacheConfig::DType* dtype);

// --device auto|cuda|cpu, --gpu-memory-utilization, --weight-chunk-mb on a subcommand.
struct DeviceArgs {
  std::string device = "auto";  // auto: cuda when a usable GPU is present, else cpu
  double gpu_memory_utilization = 0.9;
  int weight_chunk_mb = 64;
  bool enforce_eager = false;
  bool gpu_native_quant = false;
  bool batch_invariant = false;
};
void add_device_options(CLI::App* cmd, DeviceArgs* d);
// The backend the flags ask for; `chosen` says which and why (for the startup line).
Expected<std::unique_ptr<backend::Backend>> make_backend(const model::Model& m, backend::BackendOptions bo,
                                                         const DeviceArgs& d, std::string* chosen);
bool wants_cuda(const DeviceArgs& d);  // cuda asked for, or auto with a usable GPU

// Progress line on stderr ("loading  42% ...") when stderr is a terminal or always when forced.
class Progress {
 public:
  explicit Progress(bool enabled) : enabled_(enabled) {}
  void operator()(const char* stage, uint64_t done, uint64_t total);
  void finish();

 private:
  bool enabled_;
  int last_pct_ = -1;
  std::string last_stage_;
};

// --model PATH, or the default model (fetched when missing); loads and validates it.
Expected<std::unique_ptr<model::Model>> open_model(const std::string& path_or_empty, model::LoadOptions opts,
                                                   bool quiet);

// One request through the engine on this thread (generate, bench offline): prefill in chunks of
// `prefill_chunk` tokens, then decode until a stop. on_token sees every sampled token.
struct OneRequestStats {
  int prompt_tokens = 0;
  int generated_tokens = 0;
  double prefill_seconds = 0;  // until the first token
  double decode_seconds = 0;   // from the first sampled token to the last
  engine::FinishReason finish = engine::FinishReason::None;
};
// persistent: --scheduling persistent (the resident loop; on CUDA the device loop).
Expected<OneRequestStats> run_one_request(backend::Backend& be, engine::Request req, int prefill_chunk,
                                          const std::function<void(int32_t)>& on_token, bool persistent = false,
                                          std::string* executor = nullptr);

// Peak resident set size of this process in bytes.
uint64_t peak_rss_bytes();

}  // namespace ss::cli
