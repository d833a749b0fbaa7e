// selfserve inspect PATH: what a model file holds and whether it is valid; selfserve fetch.
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/default_model.h"
#include "cli/memory_options.h"
#include "engine/engine.h"
#include "tokenizer/tokenizer.h"

#include <nlohmann/json.hpp>

namespace ss::cli {
namespace {

struct InspectArgs {
  std::string path;
  bool check_values = false;
  std::string sha256;
  bool memory = false;
  bool json = false;
  MemoryArgs mem;
};

// What `serve` would take with the same flags: the same plan, the same backend, warmed up by the
// same one-token request the server runs before it opens, so the numbers equal its /metrics.
void run_inspect_memory(const InspectArgs& a) {
  auto m = open_model(a.path, {}, true);
  if (!m.ok()) return fail(m.message());
  auto plan = plan_memory((*m)->config, a.mem, true, (*m)->file_bytes);
  if (!plan.ok()) return fail(plan.message());
  std::string device;
  auto be = make_backend(**m, plan->backend, a.mem.device, &device);
  if (!be.ok()) return fail(be.message());
  engine::Request warm;
  warm.prompt = {(*m)->tokenizer->bos_id() >= 0 ? (*m)->tokenizer->bos_id() : 0};
  warm.max_tokens = 2;
  warm.sampling.temperature = 0;
  if (auto r = run_one_request(**be, std::move(warm), 1, {}); !r.ok()) return fail("warm-up: " + r.message());
  const backend::BackendMemory mem = (*be)->memory();
  const backend::KvCacheConfig& kv = (*be)->kv_config();
  const auto& t = plan->tiers;
  const int64_t block_bytes = (*be)->kv_block_bytes() > 0 ? (*be)->kv_block_bytes()
                                                          : (kv.num_blocks > 0 ? mem.kv_pool_bytes / kv.num_blocks : 0);
  if (a.json) {
    nlohmann::json j = {{"backend", (*be)->name()},
                        {"where", mem.where},
                        {"threads", plan->backend.threads},
                        {"weights_bytes", mem.weights_bytes},
                        {"kv_pool_bytes", mem.kv_pool_bytes},
                        {"kv_blocks", kv.num_blocks},
                        {"kv_block_tokens", kv.block_size},
                        {"kv_block_bytes", block_bytes},
                        {"kv_dtype", backend::kv_dtype_name(kv.dtype)},
                        {"scratch_bytes", mem.scratch_bytes},
                        {"kv_host_tier_bytes", t.host_bytes},
                        {"kv_disk_tier_bytes", t.disk_bytes},
                        {"kv_cache_ttl_ms", t.ttl_ms},
                        {"memory_mode", memory_mode_labels(*plan)}};
    const auto& fb = plan->cpu_fallback;
    j["cpu_fallback"] = {{"enabled", fb.decision.enabled},
                         {"why", fb.decision.why},
                         {"threads", fb.backend.threads},
                         {"kv_blocks", fb.backend.kv.num_blocks},
                         {"max_num_seqs", fb.max_num_seqs},
                         {"host_bytes", fb.need_bytes}};  // weights (the model file, mapped) + KV pool
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  const auto mib = [](int64_t b) { return double(b) / 1048576.0; };
  std::printf("backend   %s (%s memory), %d threads (%s)\n", (*be)->name().c_str(), mem.where.c_str(),
              plan->backend.threads, plan->threads_source.c_str());
  std::printf("weights   %14lld bytes  %9.1f MiB  read-only\n", static_cast<long long>(mem.weights_bytes),
              mib(mem.weights_bytes));
  std::printf("KV pool   %14lld bytes  %9.1f MiB  %d blocks of %d tokens (%s), %lld bytes a block\n",
              static_cast<long long>(mem.kv_pool_bytes), mib(mem.kv_pool_bytes), kv.num_blocks, kv.block_size,
              backend::kv_dtype_name(kv.dtype),
              static_cast<long long>(block_bytes));
  std::printf("scratch   %14lld bytes  %9.1f MiB  after the warm-up step (grows with bigger batches)\n",
              static_cast<long long>(mem.scratch_bytes), mib(mem.scratch_bytes));
  std::printf("total     %14lld bytes  %9.1f MiB\n",
              static_cast<long long>(mem.weights_bytes + mem.kv_pool_bytes + mem.scratch_bytes),
              mib(mem.weights_bytes + mem.kv_pool_bytes + mem.scratch_bytes));
  std::printf("KV tiers  host %lld bytes%s, disk %s, idle TTL %lld ms\n", static_cast<long long>(t.host_bytes),
              t.host_compress ? " (zstd)" : "",
              t.disk_dir.empty() ? "off" : (t.disk_dir + " (" + std::to_string(t.disk_bytes) + " bytes)").c_str(),
              static_cast<long long>(t.ttl_ms));
  std::printf("%s\n", memory_mode_line(*plan).c_str());
  if (plan->cpu_fallback.decision.enabled) {
    const auto& fb = plan->cpu_fallback;
    std::printf("CPU fallback engine (level 3): %d threads, %d KV blocks, max_num_seqs %d; ~%.1f MiB of host memory "
                "(the model file mapped + its KV pool)\n",
                fb.backend.threads, fb.backend.kv.num_blocks, fb.max_num_seqs, mib(fb.need_bytes));
  }
}

void run_inspect(const InspectArgs& a) {
  if (a.memory) return run_inspect_memory(a);
  std::string path = a.path;
  if (path.empty()) {
    auto p = ensure_default_model(false);
    if (!p.ok()) return fail(p.message());
    path = *p;
  }
  model::LoadOptions lo;
  lo.check_values = a.check_values;
  if (!a.sha256.empty()) lo.verify_sha256 = a.sha256;
  bool ok = false;
  const std::string report = model::inspect_report(path, lo, &ok);
  std::fwrite(report.data(), 1, report.size(), stdout);
  if (!ok) set_exit_code(1);
}

}  // namespace

void register_inspect(CLI::App& app) {
  auto a = std::make_shared<InspectArgs>();
  auto* c = app.add_subcommand("inspect", "Architecture, hyper-parameters, tokenizer, tensors and validation verdict");
  c->add_option("path", a->path, "GGUF file or Hugging Face folder (default: the embedded model)");
  c->add_flag("--check-values", a->check_values, "Scan every weight for NaN/Inf");
  c->add_option("--verify-sha256", a->sha256, "Expected sha256 of the file (hex)");
  c->add_flag("--memory", a->memory,
              "What `serve` with the same flags would take: weights, KV pool (bytes, blocks), scratch, tiers");
  c->add_flag("--json", a->json, "With --memory: one JSON object");
  add_memory_options(c, &a->mem);
  c->callback([a] { run_inspect(*a); });

}

void register_fetch(CLI::App& app) {
  auto* f = app.add_subcommand("fetch", "Fetch the embedded default model into the cache and print its path");
  f->callback([] {
    auto p = ensure_default_model(false);
    if (!p.ok()) return fail(p.message());
    std::printf("%s\n", p->c_str());
  });
}

}  // namespace ss::cli
