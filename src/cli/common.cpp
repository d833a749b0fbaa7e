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
                                          const std::function<void(int32_t)>& on_token, bool persistent,
                                          std::string* executor) {
  engine::EngineConfig ec;
  ec.scheduler.max_num_seqs = 1;
  ec.scheduler.max_num_batched_tokens = std::max(1, prefill_chunk);
  ec.scheduler.enable_prefix_caching = false;  // every run computes its prompt (benchmarks repeat it)
  if (persistent) {
    ec.scheduling = engine::EngineConfig::Scheduling::Persistent;
    ec.scheduler.max_model_len = static_cast<int>(req.prompt.size()) + req.max_tokens + 1;
  }
  SS_ASSIGN(auto engine, engine::Engine::create(be, ec));
  if (executor) *executor = engine->executor_name();
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

void add_device_options(CLI::App* cmd, DeviceArgs* d) {
  cmd->add_option("--device", d->device, "auto (cuda when a usable GPU is present, else cpu), cuda or cpu")
      ->check(CLI::IsMember({"auto", "cuda", "cpu"}))
      ->capture_default_str();
  cmd->add_option("--gpu-memory-utilization", d->gpu_memory_utilization,
                  "CUDA: this process's share of the GPU's memory for weights, KV cache and scratch (as vLLM: "
                  "servers sharing a card each take their own share of it)")
      ->check(CLI::Range(0.05, 1.0))
      ->capture_default_str();
  cmd->add_option("--weight-chunk-mb", d->weight_chunk_mb, "CUDA: size of each pinned buffer weights are uploaded through")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  cmd->add_flag("--enforce-eager", d->enforce_eager, "CUDA: no CUDA graphs (every step launched kernel by kernel)");
  cmd->add_flag("--gpu-native-quant", d->gpu_native_quant,
                "CUDA: keep GGUF weights quantized on the GPU (Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q4_K/Q5_K/Q6_K; default: bf16 at "
                "load, unless bf16 would take over 80% of --gpu-memory-utilization's share)");
  cmd->add_flag("--batch-invariant", d->batch_invariant,
                "CUDA: a request's output bit for bit the same at any load, prompt chunking or preemption (steps "
                "past 8 rows run 8 at a time: large batches and prefill slower; the CPU backend always is)");
}

bool wants_cuda(const DeviceArgs& d) {
  return d.device == "cuda" || (d.device == "auto" && !backend::cuda_device_summary().empty());
}

Expected<std::unique_ptr<backend::Backend>> make_backend(const model::Model& m, backend::BackendOptions bo,
                                                         const DeviceArgs& d, std::string* chosen) {
  bo.gpu_memory_utilization = d.gpu_memory_utilization;
  bo.weight_chunk_mb = d.weight_chunk_mb;
  bo.enforce_eager = d.enforce_eager;
  bo.gpu_native_quant = d.gpu_native_quant;
  bo.batch_invariant = d.batch_invariant;
  // --device cpu never touches the driver: probing it (cuInit, the plugin with cudart and cuBLAS)
  // costs a CPU run hundreds of MB of RSS on a GPU machine.
  const std::string gpu = d.device == "cpu" ? std::string() : backend::cuda_device_summary();
  if (d.device == "cuda" || (d.device == "auto" && !gpu.empty())) {
    if (chosen)
      *chosen = "cuda (" + (gpu.empty() ? std::string("no usable GPU") : gpu) + ")" +
                (d.batch_invariant ? ", batch-invariant" : "");
    return backend::make_cuda_backend(m, bo);
  }
  if (chosen) *chosen = d.device == "cpu" ? "cpu (--device cpu)" : "cpu (no usable GPU)";
  return backend::make_cpu_backend(m, bo);
}

}  // namespace ss::cli
