// Running streams' decode while other conversations' KV goes down to a tier and comes back (issue
// 18: "demotion and restore must not slow running streams' decode by more than 5%"). The engine is
// driven directly on the CPU backend (or the CUDA one: --device cuda), with the server's defaults
// (512 MiB pool, 512 tokens a step, 32 sequences), and a clock the tool moves forward to make
// histories idle past the TTL at will.
//
// N streams decode throughout. Each round has two windows of W steps each, in alternating order:
//   control: at step W/3 a conversation returns whose history is still in the pool (a hit);
//   tiers:   at step 0 the clock jumps past the TTL, so the idle histories leave the pool for the
//            tier (demotions, at most 32 blocks a step), and at step W/3 a conversation returns
//            whose history is in the tier (its restore: loader thread, then one batched copy a
//            step of at most SchedulerConfig::max_restore_bytes_per_step; before 2026-12-06, at
//            most 32 blocks a step, one copy and one wait each).
// Both windows do the same compute (the returning turn's new message and its decodes); they differ
// by the tier traffic only. Reported: the streams' tokens per second in each kind of window, the
// mean step time of the steps that copied blocks, and what the windows moved.
//   bench_kv_tiers [--device cpu|cuda] [--kv-pool-mib N] [--restore-mib N] [--restore-ms N] MODEL STREAMS HISTORY_TOKENS ROUNDS WINDOW_STEPS THREADS [DISK_DIR|-] [null]
// Without DISK_DIR (or with -) the tier is host RAM (2 GiB; 8 GiB on cuda); with it, the disk tier
// alone (8 GiB bound). `null`: the tier windows do not jump the clock either (both kinds are control
// windows): the difference then measured is the method's noise on this machine.
// --device cuda (libselfserve_cuda.so beside the tool): the device's KV pool is the first tier, as in
// `serve --device cuda`; the pool is --kv-pool-mib (default 512 on cpu, 8192 on cuda: the 8B shape's
// 2 MiB blocks need room for the streams and a round's histories). On a GPU the process's CPU time
// counts the engine thread waiting on the device, so wall time (tok/s, median step) is the measure.
// --restore-mib, --restore-ms: SchedulerConfig::max_restore_bytes_per_step (default 64) and
// restore_ms_per_step (default 2; 0: off). `--restore-mib 11.25 --restore-ms 0` on the default model
// is the 32 blocks a step of before 2026-12-06.
#include <stdlib.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "engine/engine.h"
#include "model/model.h"

using namespace ss;
using Clock = std::chrono::steady_clock;

namespace {

struct WindowSums {
  int windows = 0;
  int64_t steps = 0, stream_tokens = 0, missed = 0;
  double seconds = 0;
  int64_t copy_steps = 0;  // steps that demoted or restored a block
  double copy_seconds = 0;
  int64_t demote_steps = 0, restore_steps = 0;  // of them, steps that demoted / restored only
  double demote_seconds = 0, restore_seconds = 0;
  int64_t demoted = 0, restored = 0;
  int64_t first_token_steps = 0;  // returning turn: steps from its arrival to its first token
  double cpu_seconds = 0;          // the process's CPU time (all its threads: backend, engine, loader, writer)
  std::vector<double> step_ms, copy_step_ms;  // for medians (a shared machine's bursts skew means)
};

double process_cpu_seconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return double(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + 1e-6 * double(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

int64_t demoted(const engine::EngineStats& s) { return s.kv_demoted_idle + s.kv_demoted_evicted; }
int64_t restored(const engine::EngineStats& s) { return s.kv_restored_host + s.kv_restored_disk; }

}  // namespace

int main(int argc0, char** argv0) {
  // The options, anywhere; the rest are positional, as before they existed.
  std::string device = "cpu";
  double pool_mib = 0, restore_mib = 0, restore_ms = -1;
  std::vector<char*> args;
  for (int i = 0; i < argc0; ++i) {
    const std::string a = argv0[i];
    if (a == "--device" && i + 1 < argc0) {
      device = argv0[++i];
      continue;
    }
    if (a == "--kv-pool-mib" && i + 1 < argc0) {
      pool_mib = std::atof(argv0[++i]);
      continue;
    }
    if (a == "--restore-mib" && i + 1 < argc0) {
      restore_mib = std::atof(argv0[++i]);
      continue;
    }
    if (a == "--restore-ms" && i + 1 < argc0) {
      restore_ms = std::atof(argv0[++i]);
      continue;
    }
    args.push_back(argv0[i]);
  }
  const int argc = static_cast<int>(args.size());
  char** argv = args.data();
  if (argc < 7 || argc > 9 || (device != "cpu" && device != "cuda")) {
    std::fprintf(stderr, "usage: bench_kv_tiers [--device cpu|cuda] [--kv-pool-mib N] [--restore-mib N] [--restore-ms N] MODEL STREAMS HISTORY_TOKENS ROUNDS "
                 "WINDOW_STEPS THREADS [DISK_DIR|-] [null]\n");
    return 2;
  }
  const bool cuda = device == "cuda";
  if (pool_mib <= 0) pool_mib = cuda ? 8192 : 512;
  const std::string path = argv[1];
  const int streams = std::atoi(argv[2]), history = std::atoi(argv[3]), rounds = std::atoi(argv[4]),
            window = std::atoi(argv[5]), threads = std::atoi(argv[6]);
  const std::string disk_dir = argc >= 8 && std::string(argv[7]) != "-" ? argv[7] : "";
  const bool null_run = argc == 9 && std::string(argv[8]) == "null";
  if (streams < 1 || history < 32 || rounds < 1 || window < 8 || threads < 1) {
    std::fprintf(stderr, "bench_kv_tiers: STREAMS >= 1, HISTORY_TOKENS >= 32, ROUNDS >= 1, WINDOW_STEPS >= 8, THREADS >= 1\n");
    return 2;
  }
  auto m = model::load_model(path);
  if (!m.ok()) {
    std::fprintf(stderr, "%s\n", m.message().c_str());
    return 1;
  }
  const model::ModelConfig& mc = (*m)->config;
  backend::BackendOptions bo;
  bo.threads = threads;
  bo.kv.block_size = 16;
  bo.max_batch_tokens = 512;
  bo.max_slots = 32;
  // The CPU layout's block size (f16, 16 slots) is the CUDA backend's bf16 block too, as serve's
  // --kv-cache-mib counts it.
  bo.kv.num_blocks = static_cast<int>(pool_mib * 1048576.0 /
                                      backend::cpu_kv_block_bytes(bo.kv, mc.n_layers, mc.n_kv_heads, mc.head_dim));
  auto be = cuda ? backend::make_cuda_backend(**m, bo) : backend::make_cpu_backend(**m, bo);
  if (!be.ok()) {
    std::fprintf(stderr, "%s\n", be.message().c_str());
    return 1;
  }
  std::atomic<int64_t> skew_ms{0};  // the engine's clock runs this far ahead of the real one
  const int64_t ttl_ms = 3600 * 1000;  // only the jumps below make a history idle past it
  engine::EngineConfig ec;
  ec.scheduler.max_num_seqs = 32;
  ec.scheduler.max_num_batched_tokens = 512;
  if (restore_mib > 0) ec.scheduler.max_restore_bytes_per_step = static_cast<int64_t>(restore_mib * 1048576.0);
  if (restore_ms >= 0) ec.scheduler.restore_ms_per_step = restore_ms;
  ec.scheduler.max_model_len = std::min(mc.max_context > 0 ? mc.max_context : 4096,
                                        (*be)->kv_config().num_blocks * (*be)->kv_config().block_size);
  ec.tiers.ttl_ms = ttl_ms;
  if (disk_dir.empty()) {
    ec.tiers.host_bytes = int64_t(cuda ? 8 : 2) << 30;
  } else {
    ec.tiers.disk_dir = disk_dir;
    ec.tiers.disk_bytes = int64_t(8) << 30;
    auto h = engine::model_file_hash(path);
    if (!h.ok()) {
      std::fprintf(stderr, "%s\n", h.message().c_str());
      return 1;
    }
    ec.tiers.model_hash = *h;
  }
  ec.clock = [&] { return Clock::now() + std::chrono::milliseconds(skew_ms.load()); };
  auto en = engine::Engine::create(**be, ec);
  if (!en.ok()) {
    std::fprintf(stderr, "%s\n", en.message().c_str());
    return 1;
  }
  engine::Engine& eng = **en;
  const int vocab = (*be)->vocab_size();
  std::mt19937 g(1234);
  auto random_tokens = [&](int n) {
    std::uniform_int_distribution<int32_t> d(100, vocab - 100);
    std::vector<int32_t> v(static_cast<size_t>(n));
    for (auto& t : v) t = d(g);
    return v;
  };

  // The streams: long greedy generations, never stopped by an end token (no stop ids).
  std::vector<int64_t> stream_tokens(static_cast<size_t>(streams), 0);
  std::vector<engine::RequestId> stream_ids;
  for (int i = 0; i < streams; ++i) {
    engine::Request r;
    r.prompt = random_tokens(32);
    r.sampling.temperature = 0;
    r.max_tokens = ec.scheduler.max_model_len - 64;
    r.on_event = [&, i](const engine::TokenEvent& e) {
      if (e.token >= 0) ++stream_tokens[static_cast<size_t>(i)];
    };
    auto id = eng.add_request(std::move(r));
    if (!id.ok()) {
      std::fprintf(stderr, "%s\n", id.message().c_str());
      return 1;
    }
    stream_ids.push_back(*id);
  }
  auto step = [&] {
    if (auto st = eng.step(); !st.ok()) {
      std::fprintf(stderr, "step: %s\n", st.message().c_str());
      std::exit(1);
    }
  };
  auto total_stream_tokens = [&] {
    int64_t n = 0;
    for (int64_t t : stream_tokens) n += t;
    return n;
  };
  while (total_stream_tokens() < streams) step();  // every stream is decoding

  // A greedy request whose tokens go to *out and whose end sets *done.
  auto add_greedy = [&](std::vector<int32_t> prompt, int max_tokens, std::vector<int32_t>* out, bool* done) {
    engine::Request r;
    r.prompt = std::move(prompt);
    r.sampling.temperature = 0;
    r.max_tokens = max_tokens;
    r.on_event = [out, done](const engine::TokenEvent& e) {
      if (e.token >= 0) out->push_back(e.token);
      if (e.finish != backend::FinishReason::None) *done = true;
    };
    if (auto id = eng.add_request(std::move(r)); !id.ok()) {
      std::fprintf(stderr, "%s\n", id.message().c_str());
      std::exit(1);
    }
  };
  // Runs a request to its end while the streams go on; returns its tokens.
  auto run_turn = [&](std::vector<int32_t> prompt, int max_tokens, int64_t* first_token_steps) {
    std::vector<int32_t> out;
    bool done = false;
    add_greedy(std::move(prompt), max_tokens, &out, &done);
    int64_t steps = 0;
    while (!done) {
      step();
      ++steps;
      if (first_token_steps && out.size() == 1 && *first_token_steps < 0) *first_token_steps = steps;
    }
    return out;
  };

  struct Conversation {
    std::vector<int32_t> history, returning;
  };
  auto first_turn = [&] {  // the history goes into the pool; the next turn is history + answer + message
    Conversation c;
    c.history = random_tokens(history);
    const auto answer = run_turn(c.history, 1, nullptr);
    c.returning = c.history;
    c.returning.insert(c.returning.end(), answer.begin(), answer.end());
    const auto msg = random_tokens(20);
    c.returning.insert(c.returning.end(), msg.begin(), msg.end());
    return c;
  };

  const int returning_tokens = 32;
  const int arrive = window / 3;  // the step of the window the returning turn arrives at
  WindowSums ctrl, tier;
  // One window of W timed steps. Tiers: the clock jumps at its start (the idle histories leave the
  // pool, 32 blocks a step), and the returning turn arrives at step W/3, once they have; control:
  // no jump, the same arrival. The turn should end inside the window (else it is finished after it,
  // untimed, and counted as unfinished).
  auto measure = [&](const Conversation& c, bool jump, WindowSums& w) {
    if (jump && !null_run) skew_ms += ttl_ms + 1000;
    std::vector<int32_t> out;
    bool done = false;
    int64_t first = -1;
    const engine::EngineStats s0 = eng.stats();
    const int64_t tokens0 = total_stream_tokens();
    int64_t prev_dem = demoted(s0), prev_res = restored(s0);
    const double cpu0 = process_cpu_seconds();
    for (int i = 0; i < window; ++i) {
      if (i == arrive) add_greedy(c.returning, returning_tokens, &out, &done);
      const auto t0 = Clock::now();
      step();
      const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
      w.seconds += dt;
      w.step_ms.push_back(1e3 * dt);
      const engine::EngineStats si = eng.stats();
      const bool dem = demoted(si) != prev_dem, res = restored(si) != prev_res;
      if (dem || res) {
        ++w.copy_steps;
        w.copy_seconds += dt;
        w.copy_step_ms.push_back(1e3 * dt);
      }
      if (dem && !res) ++w.demote_steps, w.demote_seconds += dt;
      if (res && !dem) ++w.restore_steps, w.restore_seconds += dt;
      prev_dem = demoted(si);
      prev_res = restored(si);
      if (first < 0 && !out.empty()) first = i + 1 - arrive;
    }
    w.cpu_seconds += process_cpu_seconds() - cpu0;
    const engine::EngineStats s1 = eng.stats();
    w.steps += window;
    w.stream_tokens += total_stream_tokens() - tokens0;
    w.demoted += demoted(s1) - demoted(s0);
    w.restored += restored(s1) - restored(s0);
    w.first_token_steps += first;
    ++w.windows;
    if (!done) ++w.missed;
    while (!done) step();
  };

  double load0[3] = {0, 0, 0}, load1[3] = {0, 0, 0};
  getloadavg(load0, 3);
  for (int r = 0; r < rounds; ++r) {
    const Conversation a = first_turn();  // returns from the tier
    if (r % 2 == 0) {
      const Conversation b = first_turn();  // returns from the pool
      measure(b, false, ctrl);
      measure(a, true, tier);
    } else {
      measure(a, true, tier);
      const Conversation b = first_turn();
      measure(b, false, ctrl);
    }
    std::fprintf(stderr, "round %d/%d done\n", r + 1, rounds);
  }
  getloadavg(load1, 3);
  for (engine::RequestId id : stream_ids) eng.abort(id);
  while (eng.has_work()) step();

  auto rate = [&](const WindowSums& w) { return w.seconds > 0 ? double(w.stream_tokens) / w.seconds : 0.0; };
  auto ms = [](double s, int64_t n) { return n > 0 ? 1e3 * s / double(n) : 0.0; };
  const double slow = rate(tier) > 0 ? rate(ctrl) / rate(tier) - 1.0 : 0.0;
  if (null_run) std::printf("NULL RUN: no clock jumps, both kinds of window are control windows\n");
  std::printf("device: %s (%s), KV pool %d blocks of %lld bytes\n", device.c_str(), (*be)->name().c_str(),
              (*be)->kv_config().num_blocks, static_cast<long long>((*be)->kv_block_bytes()));
  std::printf("tier: %s; %d streams; %d-token histories; %d rounds of %d-step windows; %d threads; restores "
              "at most %lld bytes and %.2f ms (0: no time bound) a step\n",
              disk_dir.empty() ? "host" : "disk", streams, history, rounds, window, threads,
              static_cast<long long>(ec.scheduler.max_restore_bytes_per_step), ec.scheduler.restore_ms_per_step);
  std::printf("load average: start %.2f %.2f %.2f, end %.2f %.2f %.2f\n", load0[0], load0[1], load0[2], load1[0],
              load1[1], load1[2]);
  for (const auto* w : {&ctrl, &tier}) {
    std::printf("%-8s windows %d: streams %.1f tok/s, step %.2f ms, copy steps %lld (%.2f ms each; demote-only %lld, "
                "%.2f ms; restore-only %lld, %.2f ms), demoted %lld, "
                "restored %lld, returning turn's first token after %.1f steps, unfinished %lld\n",
                w == &ctrl ? "control" : "tiers", w->windows, rate(*w), ms(w->seconds, w->steps),
                static_cast<long long>(w->copy_steps), ms(w->copy_seconds, w->copy_steps),
                static_cast<long long>(w->demote_steps), ms(w->demote_seconds, w->demote_steps),
                static_cast<long long>(w->restore_steps), ms(w->restore_seconds, w->restore_steps),
                static_cast<long long>(w->demoted), static_cast<long long>(w->restored),
                w->windows ? double(w->first_token_steps) / w->windows : 0.0, static_cast<long long>(w->missed));
  }
  std::printf("median step: control %.2f ms, tiers %.2f ms (%.1f%%), tiers' copy steps %.2f ms\n", median(ctrl.step_ms),
              median(tier.step_ms), 100.0 * (median(tier.step_ms) / std::max(1e-9, median(ctrl.step_ms)) - 1.0),
              median(tier.copy_step_ms));
  const double cpu_ctrl = ms(ctrl.cpu_seconds, ctrl.steps), cpu_tier = ms(tier.cpu_seconds, tier.steps);
  std::printf("process CPU time per step: control %.2f ms, tiers %.2f ms (%.1f%%)\n", cpu_ctrl, cpu_tier,
              100.0 * (cpu_tier / std::max(1e-9, cpu_ctrl) - 1.0));
  std::printf("streams' decode with tier traffic: %.1f%% slower than without\n", 100.0 * slow);
  {
    const engine::EngineStats es = eng.stats();
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    std::printf("restores' batched copies into the pool: %.2f GB/s (moving average)\n", es.kv_restore_copy_bytes_per_s / 1e9);
    std::printf("host tier: capacity %lld bytes, used %lld, %lld blocks; restored from host %lld, from disk %lld; "
                "peak RSS %lld MiB\n",
                static_cast<long long>(es.kv_host_capacity_bytes), static_cast<long long>(es.kv_host_used_bytes),
                static_cast<long long>(es.kv_host_blocks), static_cast<long long>(es.kv_restored_host),
                static_cast<long long>(es.kv_restored_disk), static_cast<long long>(ru.ru_maxrss / 1024));
  }
  std::printf("{\"device\":\"%s\",\"tier\":\"%s\",\"streams\":%d,\"history\":%d,\"rounds\":%d,\"window\":%d,\"ctrl_tok_s\":%.2f,"
              "\"tier_tok_s\":%.2f,\"slowdown\":%.4f,\"ctrl_step_ms\":%.3f,\"tier_step_ms\":%.3f,"
              "\"tier_copy_step_ms\":%.3f,\"tier_demote_step_ms\":%.3f,\"tier_restore_step_ms\":%.3f,"
              "\"ctrl_cpu_ms_per_step\":%.3f,\"tier_cpu_ms_per_step\":%.3f,\"demoted\":%lld,\"restored\":%lld}\n",
              device.c_str(), disk_dir.empty() ? "host" : "disk", streams, history, rounds, window, rate(ctrl), rate(tier), slow,
              ms(ctrl.seconds, ctrl.steps), ms(tier.seconds, tier.steps), ms(tier.copy_seconds, tier.copy_steps),
              ms(tier.demote_seconds, tier.demote_steps), ms(tier.restore_seconds, tier.restore_steps), cpu_ctrl, cpu_tier,
              static_cast<long long>(tier.demoted), static_cast<long long>(tier.restored));
  return 0;
}
