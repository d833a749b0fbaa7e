// Helpers shared by the CLI subcommands.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "common/status.h"
#include "model/model.h"

namespace CLI {
class App;
}

namespace ss::cli {

// --kv-cache-dtype f16|f32|q8_0 on a subcommand (default f16).
void add_kv_dtype_option(CLI::App* cmd, backend::KvCacheConfig::DType* dtype);

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

// Peak resident set size of this process in bytes.
uint64_t peak_rss_bytes();

}  // namespace ss::cli
