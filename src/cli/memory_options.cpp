#include "cli/memory_options.h"

#include <algorithm>
#include <cstdio>

#include <CLI/CLI.hpp>

#include "cli/default_model.h"
#include "topology/topology.h"

namespace ss::cli {

namespace {
constexpr double kDefaultKvMib = 512;
// The CPU fallback's pool: modest, it serves the overflow of a full GPU pool, not a second server
// (256 MiB holds ~11,000 tokens of the default model at f16).
constexpr double kDefaultFallbackKvMib = 256;
constexpr int kDefaultFallbackSeats = 8;

std::string join3(const double* v, int n) {
  std::string s;
  char buf[32];
  for (int i = 0; i < n; ++i) {
    std::snprintf(buf, sizeof buf, "%s%g", i ? "," : "", v[i]);
    s += buf;
  }
  return s;
}
}  // namespace

void add_memory_options(CLI::App* c, MemoryArgs* a) {
  c->add_option("--threads", a->threads,
                "CPU threads for the forward pass (default: one per physical core, from `selfserve topology`)");
  c->add_option("--max-num-seqs", a->max_num_seqs, "Sequences per engine step")
      ->check(CLI::Range(1, 4096))->capture_default_str();
  c->add_option("--max-num-batched-tokens", a->max_num_batched_tokens, "Tokens per engine step")
      ->check(CLI::Range(1, 1 << 20))->capture_default_str();
  c->add_option("--block-size", a->block_size, "Tokens per KV block")->check(CLI::Range(1, 1024))->capture_default_str();
  auto* nb = c->add_option("--num-kv-blocks", a->num_kv_blocks, "KV cache blocks")->check(CLI::Range(1, 1 << 24));
  c->add_option("--kv-cache-mib", a->kv_cache_mib, "KV cache size in MiB (default 512)")
      ->check(CLI::PositiveNumber)->excludes(nb);
  add_kv_dtype_option(c, &a->kv_dtype);
  c->add_option("--memory-mode", a->memory_mode,
                "Memory pressure watermarks, KV idle TTL and tier sizes together: aggressive (act late, long TTL, "
                "a host tier of 1/4 of RAM), balanced, conservative (act early, short TTL); explicit flags win")
      ->check(CLI::IsMember({"aggressive", "balanced", "conservative"}))->capture_default_str();
  c->add_flag("--no-memory-pressure", a->no_memory_pressure,
              "Never raise the memory pressure level (no early demotion, prefill shrinking or seat cap)");
  c->add_option("--kv-host-bytes", a->kv_host_bytes,
                "Host-RAM tier for KV blocks leaving the cache (evicted, or idle past --kv-cache-ttl-ms); 0: none "
                "(default: --memory-mode's)")
      ->check(CLI::NonNegativeNumber);
  c->add_flag("--kv-host-compress", a->kv_host_compress, "zstd-compress the host (and disk) tier's blocks");
  c->add_option("--kv-cache-ttl-ms", a->kv_cache_ttl_ms,
                "With a tier: cached KV blocks idle this long move from the cache to the tiers (0: never; "
                "default: --memory-mode's, 30000 balanced)")
      ->check(CLI::NonNegativeNumber);
  c->add_option("--kv-disk-dir", a->kv_disk_dir,
                "Disk tier for KV blocks (kept across restarts; bound to the model file, KV dtype and block size)");
  c->add_option("--kv-disk-bytes", a->kv_disk_bytes, "The disk tier's bound in bytes (default: --memory-mode's)")
      ->check(CLI::NonNegativeNumber);
  c->add_option("--cpu-fallback", a->cpu_fallback,
                "Memory pressure level 3 (the KV pool has no room): serve new requests on a second engine on the CPU "
                "backend (same model) until the level falls. auto: on when the primary runs on a GPU and host memory "
                "holds the CPU engine's weights and KV pool; on: always (also below a CPU primary); off: new requests "
                "wait")
      ->check(CLI::IsMember({"auto", "on", "off"}))->capture_default_str();
  c->add_option("--cpu-fallback-threads", a->cpu_fallback_threads,
                "The CPU fallback engine's forward-pass threads (default: half of --threads or its default, at least 1)")
      ->check(CLI::Range(1, 4096));
  c->add_option("--cpu-fallback-kv-mib", a->cpu_fallback_kv_mib, "The CPU fallback engine's KV cache in MiB (default 256)")
      ->check(CLI::PositiveNumber);
  c->add_option("--cpu-fallback-max-num-seqs", a->cpu_fallback_max_num_seqs,
                "The CPU fallback engine's running sequences (default: --max-num-seqs, at most 8)")
      ->check(CLI::Range(1, 4096));
  add_device_options(c, &a->device);
}

Expected<MemoryPlan> plan_memory(const model::ModelConfig& mc, const MemoryArgs& a, bool quiet, uint64_t weight_bytes) {
  (void)quiet;
  MemoryPlan p;
  engine::MemoryMode mode;
  if (!engine::parse_memory_mode(a.memory_mode, &mode))
    return make_error("--memory-mode must be aggressive, balanced or conservative, got '" + a.memory_mode + "'");
  p.mode = engine::memory_mode_settings(mode);

  backend::BackendOptions& bo = p.backend;
  bo.threads = a.threads;
  if (a.threads > 0) {
    p.threads_source = "--threads";
  } else {
    const auto t = topology::load_or_measure(selfserve_home() + "/topology.json");
    bo.threads = topology::default_threads(t.topology);
    p.threads_source = "one per physical core; topology " +
                       std::string(t.from_cache ? "from the cache" : "measured, " + t.why);
  }
  bo.kv.block_size = a.block_size;
  bo.kv.dtype = a.kv_dtype;
  bo.max_batch_tokens = a.max_num_batched_tokens;
  bo.max_slots = a.max_num_seqs;
  bo.gpu_memory_utilization = a.device.gpu_memory_utilization;
  bo.weight_chunk_mb = a.device.weight_chunk_mb;
  bo.enforce_eager = a.device.enforce_eager;
  const bool cuda = wants_cuda(a.device);
  if (a.num_kv_blocks > 0) {
    bo.kv.num_blocks = a.num_kv_blocks;
  } else if (cuda && a.kv_cache_mib <= 0) {
    bo.kv.num_blocks = 0;  // the GPU backend sizes its cache from --gpu-memory-utilization
  } else {
    const int64_t block_bytes = backend::cpu_kv_block_bytes(bo.kv, mc.n_layers, mc.n_kv_heads, mc.head_dim);
    const double mib = a.kv_cache_mib > 0 ? a.kv_cache_mib : kDefaultKvMib;
    bo.kv.num_blocks = static_cast<int>(
        std::max<int64_t>(1, static_cast<int64_t>(mib * 1048576.0) / std::max<int64_t>(1, block_bytes)));
  }

  engine::KvTierConfig& t = p.tiers;
  t.ttl_ms = a.kv_cache_ttl_ms >= 0 ? a.kv_cache_ttl_ms : p.mode.kv_ttl_ms;
  if (a.kv_host_bytes >= 0) {
    t.host_bytes = a.kv_host_bytes;
  } else if (p.mode.host_tier_ram_fraction > 0) {
    int64_t avail = 0, total = 0;
    if (engine::read_host_memory(&avail, &total))
      t.host_bytes = static_cast<int64_t>(double(total) * p.mode.host_tier_ram_fraction);
  }
  t.host_compress = a.kv_host_compress;
  t.disk_dir = a.kv_disk_dir;
  if (!a.kv_disk_dir.empty()) t.disk_bytes = a.kv_disk_bytes >= 0 ? a.kv_disk_bytes : p.mode.disk_tier_bytes;

  p.pressure.enabled = !a.no_memory_pressure;
  p.pressure.watermarks = p.mode.watermarks;

  // Level 3's CPU engine: the primary's KV layout and batch, its own threads, pool and seats.
  MemoryPlan::CpuFallback& fb = p.cpu_fallback;
  SS_ASSIGN(fb.mode, engine::parse_cpu_fallback_mode(a.cpu_fallback));
  backend::BackendOptions& fo = fb.backend;
  fo.threads = a.cpu_fallback_threads > 0 ? a.cpu_fallback_threads : std::max(1, bo.threads / 2);
  fo.kv.block_size = a.block_size;
  fo.kv.dtype = a.kv_dtype;
  fb.max_num_seqs = a.cpu_fallback_max_num_seqs > 0 ? a.cpu_fallback_max_num_seqs
                                                    : std::min(a.max_num_seqs, kDefaultFallbackSeats);
  fo.max_slots = fb.max_num_seqs;
  fo.max_batch_tokens = a.max_num_batched_tokens;
  const int64_t fb_block_bytes = backend::cpu_kv_block_bytes(fo.kv, mc.n_layers, mc.n_kv_heads, mc.head_dim);
  const double fb_mib = a.cpu_fallback_kv_mib > 0 ? a.cpu_fallback_kv_mib : kDefaultFallbackKvMib;
  const int64_t fb_blocks =
      std::max<int64_t>(1, static_cast<int64_t>(std::min(fb_mib, 1e12) * 1048576.0) / std::max<int64_t>(1, fb_block_bytes));
  if (fb_blocks > (int64_t{1} << 24)) {
    char mib[32];
    std::snprintf(mib, sizeof mib, "%g", fb_mib);
    return make_error(std::string("--cpu-fallback-kv-mib ") + mib + " is " + std::to_string(fb_blocks) +
                      " KV blocks; at most 16777216");
  }
  fo.kv.num_blocks = static_cast<int>(fb_blocks);
  fb.need_bytes = static_cast<int64_t>(weight_bytes) + int64_t{fo.kv.num_blocks} * fb_block_bytes;
  int64_t avail = -1, total = 0;
  if (!engine::read_host_memory(&avail, &total)) avail = -1;
  fb.decision = engine::decide_cpu_fallback(fb.mode, cuda, avail, fb.need_bytes);
  p.pressure.has_lower_backend = fb.decision.enabled;
  return p;
}

std::map<std::string, std::string> memory_mode_labels(const MemoryPlan& p) {
  const auto& w = p.pressure.watermarks;
  return {{"mode", engine::memory_mode_name(p.mode.mode)},
          {"pressure", p.pressure.enabled ? "on" : "off"},
          {"kv_watermarks", join3(w.kv.data(), 3)},
          {"host_available_watermarks", join3(w.host_available.data(), 3)},
          {"queue_per_seat_watermarks", join3(w.queue_per_seat.data(), 2)},
          {"kv_cache_ttl_ms", std::to_string(p.tiers.ttl_ms)},
          {"kv_host_bytes", std::to_string(p.tiers.host_bytes)},
          {"kv_disk_bytes", std::to_string(p.tiers.disk_bytes)},
          {"cpu_fallback", p.cpu_fallback.decision.enabled ? "on" : "off"},
          {"cpu_fallback_flag", engine::cpu_fallback_mode_name(p.cpu_fallback.mode)}};
}

std::string memory_mode_line(const MemoryPlan& p) {
  const auto l = memory_mode_labels(p);
  return "memory mode " + l.at("mode") + ": pressure " + l.at("pressure") + ", watermarks KV use " + l.at("kv_watermarks") +
         ", host available <= " + l.at("host_available_watermarks") + ", queue per seat " +
         l.at("queue_per_seat_watermarks") + " (levels 1,2,3); KV idle TTL " + l.at("kv_cache_ttl_ms") +
         " ms; host tier " + l.at("kv_host_bytes") + " bytes; disk tier " +
         (p.tiers.disk_dir.empty() ? std::string("off") : l.at("kv_disk_bytes") + " bytes") +
         "; CPU fallback at level 3 " + p.cpu_fallback.decision.why;
}

}  // namespace ss::cli
