#include "engine/memory_pressure.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

namespace ss::engine {

const char* memory_mode_name(MemoryMode m) {
  switch (m) {
    case MemoryMode::Aggressive: return "aggressive";
    case MemoryMode::Balanced: return "balanced";
    case MemoryMode::Conservative: return "conservative";
  }
  return "?";
}

bool parse_memory_mode(std::string_view s, MemoryMode* out) {
  for (MemoryMode m : {MemoryMode::Aggressive, MemoryMode::Balanced, MemoryMode::Conservative})
    if (s == memory_mode_name(m)) {
      *out = m;
      return true;
    }
  return false;
}

const char* cpu_fallback_mode_name(CpuFallbackMode m) {
  switch (m) {
    case CpuFallbackMode::Auto: return "auto";
    case CpuFallbackMode::On: return "on";
    case CpuFallbackMode::Off: return "off";
  }
  return "?";
}

Expected<CpuFallbackMode> parse_cpu_fallback_mode(std::string_view s) {
  for (CpuFallbackMode m : {CpuFallbackMode::Auto, CpuFallbackMode::On, CpuFallbackMode::Off})
    if (s == cpu_fallback_mode_name(m)) return m;
  return make_error("--cpu-fallback must be auto, on or off, got '" + std::string(s) + "'");
}

CpuFallbackDecision decide_cpu_fallback(CpuFallbackMode mode, bool primary_on_gpu, int64_t host_available_bytes,
                                        int64_t need_bytes) {
  const auto mib = [](int64_t b) { return std::to_string(b >> 20) + " MiB"; };
  switch (mode) {
    case CpuFallbackMode::On:
      return {true, "on (--cpu-fallback on)"};
    case CpuFallbackMode::Off:
      return {false, "off (--cpu-fallback off)"};
    case CpuFallbackMode::Auto:
      break;
  }
  if (!primary_on_gpu) return {false, "off (auto: the primary runs on the CPU backend, which has nothing below it)"};
  if (host_available_bytes < 0) return {false, "off (auto: the host's available memory is unknown)"};
  if (host_available_bytes < need_bytes)
    return {false, "off (auto: the CPU engine needs " + mib(need_bytes) + " of host memory, " +
                       mib(host_available_bytes) + " available)"};
  return {true, "on (auto: GPU primary; the CPU engine's " + mib(need_bytes) + " fit in " +
                    mib(host_available_bytes) + " of available host memory)"};
}

Status PressureWatermarks::validate() const {
  for (int i = 0; i < 3; ++i) {
    if (!(kv[i] > 0 && kv[i] <= 1)) return make_error("KV watermarks must be in (0, 1]");
    if (!(host_available[i] >= 0 && host_available[i] < 1))
      return make_error("host-memory watermarks must be in [0, 1)");
    if (i > 0 && (kv[i] < kv[i - 1] || host_available[i] > host_available[i - 1]))
      return make_error("watermarks must tighten from level 1 to level 3");
  }
  if (!(queue_per_seat[0] > 0 && queue_per_seat[1] >= queue_per_seat[0]))
    return make_error("queue watermarks must be > 0 and rise from level 1 to level 2");
  if (!(hysteresis >= 0 && hysteresis < 0.5)) return make_error("the pressure hysteresis must be in [0, 0.5)");
  return {};
}

Status PressureConfig::validate() const {
  SS_TRY(watermarks.validate());
  if (!(ttl_factor > 0 && ttl_factor <= 1)) return make_error("pressure ttl_factor must be in (0, 1]");
  if (!(prefill_factor > 0 && prefill_factor <= 1)) return make_error("pressure prefill_factor must be in (0, 1]");
  if (!(seat_factor > 0 && seat_factor <= 1)) return make_error("pressure seat_factor must be in (0, 1]");
  return {};
}

namespace {
int level_with(const PressureInputs& in, const PressureWatermarks& wm, double relax) {
  int level = 0;
  for (int n = 3; n >= 1 && level == 0; --n) {
    const bool kv = in.kv_use >= wm.kv[n - 1] - relax;
    const bool host = in.host_available <= wm.host_available[n - 1] + relax;
    const bool queue = n <= 2 && in.waiting > 0 &&
                       double(in.waiting) >= wm.queue_per_seat[n - 1] * std::max(1, in.max_num_seqs) * (1.0 - relax);
    if (kv || host || queue) level = n;
  }
  return level;
}
}  // namespace

int pressure_level(const PressureInputs& in, const PressureWatermarks& wm) { return level_with(in, wm, 0.0); }

int next_pressure_level(const PressureInputs& in, const PressureWatermarks& wm, int previous) {
  const int now = level_with(in, wm, 0.0);
  if (now >= previous) return now;
  // Going down: stay as high as the relaxed watermarks still reach, never above where we were.
  return std::max(now, std::min(previous, level_with(in, wm, wm.hysteresis)));
}

MemoryModeSettings memory_mode_settings(MemoryMode m) {
  MemoryModeSettings s;
  s.mode = m;
  switch (m) {
    case MemoryMode::Aggressive:  // use memory for throughput: act late, keep cached KV long, a big host tier
      s.watermarks.kv = {0.95, 0.99, 1.0};
      s.watermarks.host_available = {0.05, 0.03, 0.01};
      s.watermarks.queue_per_seat = {4.0, 16.0};
      s.kv_ttl_ms = 120000;
      s.host_tier_ram_fraction = 0.25;
      s.disk_tier_bytes = int64_t(16) << 30;
      break;
    case MemoryMode::Balanced:  // today's defaults: TTL 30 s, no host tier unless asked for
      s.watermarks.kv = {0.85, 0.95, 1.0};
      s.watermarks.host_available = {0.10, 0.05, 0.02};
      s.watermarks.queue_per_seat = {2.0, 8.0};
      s.kv_ttl_ms = 30000;
      s.host_tier_ram_fraction = 0;
      s.disk_tier_bytes = int64_t(4) << 30;
      break;
    case MemoryMode::Conservative:  // keep headroom: act early, let cached KV go soon, small tiers
      s.watermarks.kv = {0.70, 0.85, 0.95};
      s.watermarks.host_available = {0.20, 0.10, 0.05};
      s.watermarks.queue_per_seat = {1.0, 4.0};
      s.kv_ttl_ms = 10000;
      s.host_tier_ram_fraction = 0;
      s.disk_tier_bytes = int64_t(1) << 30;
      break;
  }
  return s;
}

bool read_host_memory(int64_t* available, int64_t* total) {
  FILE* f = std::fopen("/proc/meminfo", "r");
  if (!f) return false;
  char line[256];
  long long avail = -1, tot = -1;
  while (std::fgets(line, sizeof line, f)) {
    long long v = 0;
    if (std::sscanf(line, "MemTotal: %lld kB", &v) == 1) tot = v;
    else if (std::sscanf(line, "MemAvailable: %lld kB", &v) == 1) avail = v;
  }
  std::fclose(f);
  if (avail < 0 || tot <= 0) return false;
  *available = avail * 1024;
  *total = tot * 1024;
  return true;
}

}  // namespace ss::engine
