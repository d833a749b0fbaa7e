#include "cli/common.h"

#include <algorithm>
#include <chrono>

#include <sys/resource.h>
#include <unistd.h>

#include <CLI/CLI.hpp>

#include <cstdio>
#include <vector>

#include "cli/default_model.h"

namespace ss::cli {

void Progress::operator()(const char* stage, uint64_t done, uint64_t total) {
  if (!enabled_ || total == 0) return;
  const int pct = static_cast<int>(done * 100 / total);
  if (pct == last_pct_ && last_stage_ == stage) return;
  last_pct_ = pct;
  last_stage_ = stage;
  std::fprintf(stderr, "\r%-12s %3d%%", stage, pct);
  std::fflush(stderr);
}

void Progress::finish() {
  if (enabled_ && last_pct_ >= 0) std::fprintf(stderr, "\r%-20s\r", "");
  last_pct_ = -1;
}

Expected<std::unique_ptr<model::Model>> open_model(const std::string& path_or_empty, model::LoadOptions opts,
                                                   bool quiet) {
  std::string path = path_or_empty;
  if (path.empty()) {
    SS_ASSIGN(path, ensure_default_model(quiet));
  }
  Progress progress(!quiet && isatty(STDERR_FILENO));
  if (!opts.progress) opts.progress = [&](const char* s, uint64_t d, uint64_t t) { progress(s, d, t); };
  auto m = model::load_model(path, opts);
  progress.finish();
  return m;
}

void add_kv_dtype_option(CLI::App* cmd, backend::KvCacheConfig::DType* dtype) {
  using T = backend::KvCacheConfig::DType;
  std::vector<std::string> names;
  for (T t : {T::F16, T::F32, T::Q8}) names.push_back(backend::kv_dtype_name(t));
  cmd->add_option_function<std::string>(
         "--kv-cache-dtype", [dtype](const std::string& s) { backend::parse_kv_dtype(s, dtype); },
         "KV cache element type: f16, f32, or q8_0 (8-bit with a scale per token and KV head: half of f16's "
         "memory and decode reads, slightly less accurate)")
      ->check(CLI::IsMember(names))
      ->default_str(backend::kv_dtype_name(*dtype));
}

uint64_t peak_rss_bytes() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<uint64_t>(ru.ru_maxrss) * 1024;  // Linux reports KiB
}

Expected<OneRequestStats> run_one_request(backend::Backend& be, engine::Request req, int prefill_chunk,
                                          const std::function<void(int32_t)>& on_token) {
  engine::EngineConfig ec;
  ec.scheduler.max_num_seqs = 1;
  ec.scheduler.max_num_batched_tokens = std::max(1, prefill_chunk);
  ec.scheduler.enable_prefix_caching = false;  // every run computes its prompt (benchmarks repeat it)
  SS_ASSIGN(auto engine, engine::Engine::create(be, ec));
  OneRequestStats st;
  st.prompt_tokens = static_cast<int>(req.prompt.size());
  using clock = std::chrono::steady_clock;
  clock::time_point first{}, last{};
  std::string error;
  req.on_event = [&](const engine::TokenEvent& e) {
    if (e.token >= 0) {
      last = clock::now();
      if (st.generated_tokens++ == 0) first = last;
      if (on_token) on_token(e.token);
    }
    if (e.finish != engine::FinishReason::None) {
      st.finish = e.finish;
      error = e.error;
    }
  };
  const auto t0 = clock::now();
  SS_TRY(engine->add_request(std::move(req)));
  while (engine->has_work()) SS_TRY(engine->step());
  if (st.finish == engine::FinishReason::Error) return make_error(error);
  if (st.generated_tokens > 0) {
    st.prefill_seconds = std::chrono::duration<double>(first - t0).count();
    st.decode_seconds = std::chrono::duration<double>(last - first).count();
  }
  return st;
}

}  // namespace ss::cli
