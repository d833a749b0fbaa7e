// Memory pressure: the level computation against each mode's watermarks (a signal at a watermark
// reaches that level, just below it does not; the queue alone stops at 2; the hysteresis), the
// modes ordered as documented, and the scheduler under a tiny KV pool: levels reached, each
// action taken and counted, the batches within the lowered limits, and every request's tokens the
// ones it gets running alone (nothing dropped or changed).
#include "engine/memory_pressure.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "engine/engine.h"
#include "fake_backend.h"

using namespace ss;
using namespace ss::engine;
using namespace ss::engine::testing;

namespace {
constexpr int kVocab = 97;
const MemoryMode kModes[] = {MemoryMode::Aggressive, MemoryMode::Balanced, MemoryMode::Conservative};

PressureInputs idle(int seats = 8) {
  PressureInputs in;
  in.kv_use = 0;
  in.host_available = 0.9;
  in.waiting = 0;
  in.max_num_seqs = seats;
  return in;
}
}  // namespace

TEST(MemoryPressure, EachSignalReachesTheLevelOfItsWatermark) {
  for (MemoryMode m : kModes) {
    const PressureWatermarks wm = memory_mode_settings(m).watermarks;
    ASSERT_TRUE(wm.validate().ok()) << memory_mode_name(m);
    EXPECT_EQ(pressure_level(idle(), wm), 0);
    for (int n = 1; n <= 3; ++n) {
      PressureInputs in = idle();
      in.kv_use = wm.kv[n - 1];
      EXPECT_EQ(pressure_level(in, wm), n) << memory_mode_name(m) << " KV at watermark " << n;
      in.kv_use = wm.kv[n - 1] - 1e-6;
      EXPECT_EQ(pressure_level(in, wm), n - 1) << memory_mode_name(m) << " KV just below watermark " << n;
      in = idle();
      in.host_available = wm.host_available[n - 1];
      EXPECT_EQ(pressure_level(in, wm), n) << memory_mode_name(m) << " host at watermark " << n;
      in.host_available = wm.host_available[n - 1] + 1e-6;
      EXPECT_EQ(pressure_level(in, wm), n - 1) << memory_mode_name(m) << " host just above watermark " << n;
    }
    // The queue: level 1 and 2 at its watermarks, never 3 however long it grows.
    PressureInputs in = idle(8);
    in.waiting = static_cast<int>(wm.queue_per_seat[0] * 8);
    EXPECT_EQ(pressure_level(in, wm), 1) << memory_mode_name(m);
    in.waiting -= 1;
    EXPECT_EQ(pressure_level(in, wm), 0) << memory_mode_name(m);
    in.waiting = static_cast<int>(wm.queue_per_seat[1] * 8);
    EXPECT_EQ(pressure_level(in, wm), 2) << memory_mode_name(m);
    in.waiting = 1000000;
    EXPECT_EQ(pressure_level(in, wm), 2) << memory_mode_name(m);
    // The highest signal wins.
    in = idle();
    in.kv_use = wm.kv[0];
    in.host_available = wm.host_available[2];
    EXPECT_EQ(pressure_level(in, wm), 3) << memory_mode_name(m);
  }
}

TEST(MemoryPressure, LevelRisesAtOnceAndFallsOnlyPastTheHysteresis) {
  const PressureWatermarks wm = memory_mode_settings(MemoryMode::Balanced).watermarks;
  PressureInputs in = idle();
  in.kv_use = wm.kv[1];
  EXPECT_EQ(next_pressure_level(in, wm, 0), 2);
  in.kv_use = wm.kv[1] - wm.hysteresis / 2;  // below the watermark, inside the band: stays
  EXPECT_EQ(next_pressure_level(in, wm, 2), 2);
  EXPECT_EQ(pressure_level(in, wm), 1);  // a fresh look would say 1
  in.kv_use = wm.kv[1] - wm.hysteresis - 1e-6;  // past the band: down to what the signal reaches
  EXPECT_EQ(next_pressure_level(in, wm, 2), pressure_level(in, wm));
  in.kv_use = 0;
  EXPECT_EQ(next_pressure_level(in, wm, 3), 0);
  // Never above where it was, even inside a higher band.
  in.kv_use = wm.kv[2] - wm.hysteresis / 2;
  EXPECT_EQ(next_pressure_level(in, wm, 1), std::max(1, pressure_level(in, wm)));
}

TEST(MemoryPressure, ModesOrderWatermarksTtlAndTiers) {
  const auto a = memory_mode_settings(MemoryMode::Aggressive), b = memory_mode_settings(MemoryMode::Balanced),
             c = memory_mode_settings(MemoryMode::Conservative);
  for (int i = 0; i < 3; ++i) {  // conservative acts on less KV use and more free host memory
    EXPECT_LE(c.watermarks.kv[i], b.watermarks.kv[i]);
    EXPECT_LE(b.watermarks.kv[i], a.watermarks.kv[i]);
    EXPECT_GE(c.watermarks.host_available[i], b.watermarks.host_available[i]);
    EXPECT_GE(b.watermarks.host_available[i], a.watermarks.host_available[i]);
  }
  for (int i = 0; i < 2; ++i) {
    EXPECT_LE(c.watermarks.queue_per_seat[i], b.watermarks.queue_per_seat[i]);
    EXPECT_LE(b.watermarks.queue_per_seat[i], a.watermarks.queue_per_seat[i]);
  }
  EXPECT_LT(c.kv_ttl_ms, b.kv_ttl_ms);
  EXPECT_LT(b.kv_ttl_ms, a.kv_ttl_ms);
  EXPECT_EQ(b.kv_ttl_ms, 30000);  // balanced keeps the flags' historical defaults
  EXPECT_EQ(b.host_tier_ram_fraction, 0.0);
  EXPECT_GT(a.host_tier_ram_fraction, 0.0);
  EXPECT_LE(c.disk_tier_bytes, b.disk_tier_bytes);
  EXPECT_LE(b.disk_tier_bytes, a.disk_tier_bytes);
  for (const char* n : {"aggressive", "balanced", "conservative"}) {
    MemoryMode m;
    ASSERT_TRUE(parse_memory_mode(n, &m));
    EXPECT_STREQ(memory_mode_name(m), n);
  }
  MemoryMode m;
  EXPECT_FALSE(parse_memory_mode("frugal", &m));
  PressureWatermarks bad = b.watermarks;
  bad.kv = {0.9, 0.8, 1.0};
  EXPECT_FALSE(bad.validate().ok());
  PressureConfig pc;
  pc.seat_factor = 0;
  EXPECT_FALSE(pc.validate().ok());
}

TEST(MemoryPressure, HostMemoryReadsProcMeminfo) {
  int64_t avail = 0, total = 0;
  ASSERT_TRUE(read_host_memory(&avail, &total));
  EXPECT_GT(total, 0);
  EXPECT_GT(avail, 0);
  EXPECT_LE(avail, total);
}

// A tiny KV pool and more work than it holds: the level climbs, every action is taken, batches stay
// inside the lowered limits, nothing is dropped, and every output is the one the request gets alone.
TEST(MemoryPressure, SchedulerSlowsDownUnderATinyPoolAndCompletesEverything) {
  std::mt19937 g(7);
  constexpr int kBlocks = 24, kBlockSize = 4, kSeats = 8, kBudget = 64;
  FakeBackend be(kBlocks, kBlockSize, kVocab);
  SchedulerConfig sc;
  sc.max_num_seqs = kSeats;
  sc.max_num_batched_tokens = kBudget;
  sc.pressure.enabled = true;
  sc.pressure.watermarks = memory_mode_settings(MemoryMode::Balanced).watermarks;
  int64_t host_avail = 90;  // the test moves the host's free memory
  sc.pressure.host_memory = [&](int64_t* a, int64_t* t) {
    *a = host_avail;
    *t = 100;
    return true;
  };
  const int seat_cap = std::max(1, static_cast<int>(kSeats * sc.pressure.seat_factor));
  const int prefill_cap = static_cast<int>(kBudget * sc.pressure.prefill_factor);
  auto e = make_engine(be, sc, kVocab);
  ASSERT_TRUE(e);
  Collector c;
  std::vector<std::pair<RequestId, Spec>> reqs;
  for (int i = 0; i < 40; ++i) {
    Spec s = spec(random_tokens(g, 6 + static_cast<int>(g() % 20), kVocab), 4 + static_cast<int>(g() % 8));
    reqs.push_back({*e->add_request(make_request(s, &c)), s});
  }
  // Per batch: tokens beyond one per sequence (at least the prefill tokens: a 1-token prefill chunk
  // counts as a decode here, so this never over-counts).
  int extra_tokens = 0;
  be.on_batch = [&](const backend::StepBatch& b) {
    std::vector<int> per_seq(b.seq_slot.size(), 0);
    for (int32_t i : b.seq_index) ++per_seq[static_cast<size_t>(i)];
    extra_tokens = 0;
    for (int n : per_seq) extra_tokens += n > 1 ? n : 0;
  };
  int steps = 0, prev_running = 0;
  while (e->has_work() && steps < 20000) {
    if (steps == 30) host_avail = 3;  // host memory nearly gone: level 2 from the host alone
    if (steps == 60) host_avail = 90;
    extra_tokens = 0;
    ASSERT_TRUE(e->step().ok());
    ++steps;
    ASSERT_TRUE(e->check_invariants().ok());
    const EngineStats s = e->stats();  // pressure_level: the level this step ran at
    if (s.pressure_level >= 1) {
      EXPECT_LE(extra_tokens, prefill_cap) << "step " << steps;
    }
    if (s.pressure_level >= 2) {  // no admission past the lowered cap (running ones stay)
      EXPECT_LE(s.num_running, std::max(seat_cap, prev_running)) << "step " << steps;
    }
    if (steps >= 31 && steps <= 60) {
      EXPECT_GE(s.pressure_level, 2) << "host memory at 3% (step " << steps << ")";
    }
    prev_running = s.num_running;
  }
  ASSERT_FALSE(e->has_work());
  const EngineStats s = e->stats();
  for (const auto& [id, sp] : reqs) {
    EXPECT_EQ(c.out[id].finish, FinishReason::Length) << "request " << id;
    EXPECT_EQ(c.out[id].tokens, run_alone(sp, kVocab).tokens) << "request " << id;
  }
  EXPECT_GT(s.pressure_steps[1] + s.pressure_steps[2] + s.pressure_steps[3], 0);
  EXPECT_GT(s.pressure_steps[2], 0);
  EXPECT_GT(s.pressure_steps[3], 0) << "a 24-block pool under 40 requests fills up";
  EXPECT_GT(s.pressure_prefill_shrunk, 0);
  EXPECT_GT(s.pressure_admissions_capped, 0);
  EXPECT_GT(s.pressure_no_lower_tier, 0);
  EXPECT_EQ(s.pressure_demoted_early, 0);  // no tiers: nothing to demote to
  EXPECT_EQ(s.pressure_level, 0) << "the load is gone";
  EXPECT_EQ(s.pressure_steps[0] + s.pressure_steps[1] + s.pressure_steps[2] + s.pressure_steps[3], s.steps);
}

// Level 1 shortens the TTL: blocks idle for a quarter of it leave the pool for the host tier while
// work runs (at level 0 they stay), are counted as early demotions, and come back bit-exact.
TEST(MemoryPressure, LevelOneDemotesIdleBlocksEarly) {
  std::mt19937 g(3);
  Clock::time_point now = Clock::now();
  FakeBackend be(64, 16, kVocab);
  EngineConfig cfg;
  cfg.scheduler.max_num_seqs = 4;
  cfg.scheduler.max_num_batched_tokens = 64;
  cfg.scheduler.pressure.enabled = true;
  int64_t host_avail = 90;
  cfg.scheduler.pressure.host_memory = [&](int64_t* a, int64_t* t) {
    *a = host_avail;
    *t = 100;
    return true;
  };
  cfg.tiers.host_bytes = 1 << 20;
  cfg.tiers.ttl_ms = 30000;
  cfg.clock = [&] { return now; };
  auto e = std::move(Engine::create(be, cfg)).value();
  Collector c;
  const Spec t1 = spec(random_tokens(g, 70, kVocab), 10);
  const RequestId id1 = *e->add_request(make_request(t1, &c));
  run_all(*e);
  const int cached = e->stats().kv_blocks_cached;
  ASSERT_EQ(cached, (70 + 10 - 1) / 16);
  const Spec busy = spec(random_tokens(g, 5, kVocab), 40);  // keeps steps running
  const RequestId idb = *e->add_request(make_request(busy, &c));
  ASSERT_TRUE(e->step().ok());
  now += std::chrono::seconds(10);  // past ttl * ttl_factor (7.5 s), not past the TTL
  ASSERT_TRUE(e->step().ok());
  EXPECT_EQ(e->stats().pressure_level, 0);
  EXPECT_EQ(e->stats().kv_demoted_idle, 0);
  EXPECT_GE(e->stats().kv_blocks_cached, cached);
  host_avail = 8;  // level 1 (balanced: host available <= 10%)
  ASSERT_TRUE(e->step().ok());
  EXPECT_EQ(e->stats().pressure_level, 1);
  EXPECT_EQ(e->stats().pressure_demoted_early, cached);
  EXPECT_EQ(e->stats().kv_host_blocks, cached);
  host_avail = 90;
  run_all(*e);
  EXPECT_EQ(c.out[idb].tokens, run_alone(busy, kVocab).tokens);
  Spec t2 = t1;  // the returning turn finds its history in the host tier
  t2.prompt.insert(t2.prompt.end(), c.out[id1].tokens.begin(), c.out[id1].tokens.end());
  const RequestId id2 = *e->add_request(make_request(t2, &c));
  run_all(*e);
  EXPECT_EQ(c.out[id2].tokens, run_alone(t2, kVocab).tokens);
  EXPECT_EQ(e->stats().kv_restored_host, cached);
}
