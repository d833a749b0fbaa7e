// Memory pressure: a level 0..3 computed at the start of every scheduler step from the KV pool's
// use, the host's available memory (MemAvailable / MemTotal) and the waiting queue, against
// watermarks that --memory-mode sets. The scheduler slows work down as the level rises and never
// drops or preempts a running request for it:
//   1: cached KV blocks leave the pool for the tiers sooner (the TTL shortened) and prefill chunks
//      shrink (less KV claimed per step, shorter steps for the running streams);
//   2: the running-sequence cap is lowered; new work waits in the queue;
//   3: the pool has no room. With a CPU engine below (EngineRouter, engine.h) new requests go
//      there until the level falls; without one (a CPU primary, or --cpu-fallback off) the step is
//      counted as no_lower_tier (and logged once by the server).
// See docs/perf/memory.md.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "common/status.h"

namespace ss::engine {

enum class MemoryMode : uint8_t { Aggressive, Balanced, Conservative };
const char* memory_mode_name(MemoryMode m);  // "aggressive", "balanced", "conservative"
bool parse_memory_mode(std::string_view s, MemoryMode* out);

// Level n (1..3) is reached when any signal reaches its n-th watermark: KV use >= kv[n-1], host
// available fraction <= host_available[n-1], waiting requests >= queue_per_seat[n-1] * max_num_seqs
// (the queue alone reaches at most level 2: a long queue is not a lack of memory).
struct PressureWatermarks {
  std::array<double, 3> kv{0.85, 0.95, 1.0};
  std::array<double, 3> host_available{0.10, 0.05, 0.02};
  std::array<double, 2> queue_per_seat{2.0, 8.0};
  // A level is left only once every signal is this far back below it (KV and host as fractions,
  // the queue as a share of its watermark), so the level does not flap around a watermark.
  double hysteresis = 0.05;
  Status validate() const;
};

// What the level acts on, and how hard.
struct PressureConfig {
  bool enabled = false;  // off: level 0 always (the server turns it on; library users opt in)
  PressureWatermarks watermarks;
  double ttl_factor = 0.25;      // level >= 1: the tiers' TTL times this
  double prefill_factor = 0.5;   // level >= 1: prefill tokens per step times this (at least a block)
  double seat_factor = 0.5;      // level >= 2: running sequences capped at max_num_seqs times this (>= 1)
  bool has_lower_backend = false;  // level 3: a CPU fallback engine takes new work (EngineRouter)
  // Host memory {available, total} in bytes; false when unknown. Empty: /proc/meminfo, read at
  // most every 250 ms. Tests inject one.
  std::function<bool(int64_t* available, int64_t* total)> host_memory;
  Status validate() const;
};

// The signals of one step.
struct PressureInputs {
  double kv_use = 0;                // referenced KV blocks / all blocks
  double host_available = 1;        // MemAvailable / MemTotal (1 when unknown)
  int waiting = 0;                  // requests waiting for admission
  int max_num_seqs = 1;
};

// The level the inputs reach alone (no history).
int pressure_level(const PressureInputs& in, const PressureWatermarks& wm);
// The level after a step at `previous`: up at once, down only past the hysteresis.
int next_pressure_level(const PressureInputs& in, const PressureWatermarks& wm, int previous);

// What --memory-mode sets together; explicit flags win over each field.
struct MemoryModeSettings {
  MemoryMode mode = MemoryMode::Balanced;
  PressureWatermarks watermarks;
  int64_t kv_ttl_ms = 30000;
  double host_tier_ram_fraction = 0;  // host KV tier: this share of MemTotal (0: no host tier)
  int64_t disk_tier_bytes = 0;        // the disk tier's bound when --kv-disk-dir is given alone
};
MemoryModeSettings memory_mode_settings(MemoryMode m);

// {MemAvailable, MemTotal} from /proc/meminfo; false when it cannot be read.
bool read_host_memory(int64_t* available, int64_t* total);

// --cpu-fallback: whether level 3 gets a CPU engine below the primary (EngineRouter, engine.h).
enum class CpuFallbackMode : uint8_t { Auto, On, Off };
const char* cpu_fallback_mode_name(CpuFallbackMode m);  // "auto", "on", "off"
Expected<CpuFallbackMode> parse_cpu_fallback_mode(std::string_view s);  // an error names the choices
struct CpuFallbackDecision {
  bool enabled = false;
  std::string why;  // one line for the startup log
};
// auto: on when the primary runs on a GPU and the host's available memory (negative: unknown, off)
// holds `need_bytes` (the CPU engine's weights, mapped, and its KV pool); off on a CPU primary,
// which has nothing below it. on / off: as asked, whatever the device.
CpuFallbackDecision decide_cpu_fallback(CpuFallbackMode mode, bool primary_on_gpu, int64_t host_available_bytes,
                                        int64_t need_bytes);

// Counters of the actions taken (cumulative) and of the steps run at each level.
struct PressureCounters {
  int64_t demoted_early = 0;       // blocks that left the pool under the shortened TTL
  int64_t prefill_shrunk = 0;      // steps whose prefill budget was cut
  int64_t admissions_capped = 0;   // steps in which waiting work stayed queued at the lowered cap
  int64_t no_lower_tier = 0;       // steps at level 3 with no backend below to serve new work
  std::array<int64_t, 4> steps_at_level{};
};

}  // namespace ss::engine
