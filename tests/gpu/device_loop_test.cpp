// The CUDA backend's resident loop (issue 17, backend/cuda/loop_runner.cu) on the GPU (CTest label
// `gpu`; skipped without a device): the scheduler kernel admits, plans, steps, samples, stops and
// streams by itself. Checked against host scheduling on the same backend (the graphs path, whose
// logits tests/gpu/cuda_backend_test.cpp checks against transformers): the same greedy tokens and
// finish reasons for a batch of prompts of different lengths (prefill chunks through the loop's
// bucket graphs, decode rows, max_tokens and stop ids on the device); a cancel ends a sequence and
// returns its blocks; a deadline ends one with Timeout; a request the loop cannot sample (a
// temperature) runs on the host executor between the loop's steps.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "engine/engine.h"
#include "model/model.h"

namespace {

using ss::backend::BackendOptions;
using ss::backend::FinishReason;
using ss::engine::EngineConfig;

const std::string kData = std::string(SS_SOURCE_DIR) + "/tests/data";

#define SKIP_WITHOUT_GPU()                            \
  do {                                                \
    if (ss::backend::cuda_device_summary().empty()) { \
      GTEST_SKIP() << "no CUDA device";               \
    }                                                 \
  } while (0)

std::unique_ptr<ss::model::Model> load(const std::string& path) {
  ss::model::LoadOptions lo;
  lo.load_tokenizer = false;
  auto m = ss::model::load_model(path, lo);
  EXPECT_TRUE(m.ok()) << (m.ok() ? "" : m.message());
  return m.ok() ? std::move(m).value() : nullptr;
}

// Prompt ids of the reference sequences (real token ids of the tiny models' vocabulary).
std::vector<std::vector<int32_t>> ref_prompts(const std::string& name) {
  std::ifstream jf(kData + "/reference/" + name + ".json");
  const auto j = nlohmann::json::parse(jf);
  std::vector<std::vector<int32_t>> out;
  for (const auto& s : j["sequences"]) out.push_back(s["ids"].get<std::vector<int32_t>>());
  return out;
}

struct Req {
  std::vector<int32_t> prompt;
  int max_tokens = 16;
  std::vector<int32_t> stop_ids;
  float temperature = 0.0f;
};

struct Result {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<FinishReason> finish;
  std::string executor;
};

struct Rig {
  std::unique_ptr<ss::backend::Backend> be;
  std::unique_ptr<ss::engine::Engine> engine;
};

Rig make_rig(const ss::model::Model& m, bool persistent) {
  Rig r;
  BackendOptions o;
  o.kv.num_blocks = 256;
  o.kv.block_size = 16;
  o.max_batch_tokens = 128;
  o.max_slots = 16;
  auto be = ss::backend::make_cuda_backend(m, o);
  EXPECT_TRUE(be.ok()) << (be.ok() ? "" : be.message());
  if (!be.ok()) return r;
  r.be = std::move(be).value();
  EngineConfig ec;
  ec.scheduler.max_num_seqs = 8;
  ec.scheduler.max_num_batched_tokens = 128;
  ec.scheduler.max_model_len = 1024;
  ec.scheduling = persistent ? EngineConfig::Scheduling::Persistent : EngineConfig::Scheduling::Host;
  auto e = ss::engine::Engine::create(*r.be, ec);
  EXPECT_TRUE(e.ok()) << (e.ok() ? "" : e.message());
  if (e.ok()) r.engine = std::move(e).value();
  return r;
}

Result run(const ss::model::Model& m, bool persistent, const std::vector<Req>& reqs) {
  Result res;
  Rig rig = make_rig(m, persistent);
  if (!rig.engine) return res;
  res.executor = rig.engine->executor_name();
  res.tokens.resize(reqs.size());
  res.finish.assign(reqs.size(), FinishReason::None);
  for (size_t i = 0; i < reqs.size(); ++i) {
    ss::engine::Request r;
    r.prompt = reqs[i].prompt;
    r.max_tokens = reqs[i].max_tokens;
    r.stop_ids = reqs[i].stop_ids;
    r.sampling.temperature = reqs[i].temperature;
    r.sampling.seed = 7;
    r.on_event = [&res, i](const ss::engine::TokenEvent& ev) {
      if (ev.token >= 0) res.tokens[i].push_back(ev.token);
      if (ev.finish != FinishReason::None) res.finish[i] = ev.finish;
    };
    EXPECT_TRUE(rig.engine->add_request(std::move(r)).ok());
  }
  const auto t0 = std::chrono::steady_clock::now();
  while (rig.engine->has_work() && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60)) {
    const auto st = rig.engine->step();
    EXPECT_TRUE(st.ok()) << st.message();
    if (!st.ok()) break;
  }
  EXPECT_FALSE(rig.engine->has_work()) << "the loop did not finish in 60 s";
  return res;
}

std::vector<Req> mixed_batch(const std::vector<std::vector<int32_t>>& ids) {
  std::vector<Req> reqs;
  const auto cut = [&](size_t which, size_t n) {
    const auto& p = ids[which];
    return std::vector<int32_t>(p.begin(), p.begin() + static_cast<long>(std::min(n, p.size())));
  };
  // 1 to 300 tokens: single-row steps, chunks up to the 128-token bucket, prompts split over steps.
  const size_t last = ids.size() - 1;  // the 300-token sequence
  for (auto [which, n] : std::vector<std::pair<size_t, size_t>>{{0, 1}, {1, 5}, {2, 37}, {last, 128}, {last, 129}, {last, 300}})
    reqs.push_back({cut(which, n), 24, {}, 0.0f});
  reqs.push_back({cut(last, 128), 24, {}, 0.0f});  // the same prompt as request 3: the same tokens
  return reqs;
}

// A greedy request for 10 tokens of `prompt` (the API's default temperature is 1), run on e to its end.
struct Followup {
  std::vector<int32_t> tokens;
  FinishReason finish = FinishReason::None;
};
Followup greedy_followup(ss::engine::Engine& e, const std::vector<int32_t>& prompt,
                         std::chrono::steady_clock::time_point until) {
  Followup f;
  ss::engine::Request d;
  d.prompt = prompt;
  d.max_tokens = 10;
  d.sampling.temperature = 0.0f;
  d.on_event = [&f](const ss::engine::TokenEvent& ev) {
    if (ev.token >= 0) f.tokens.push_back(ev.token);
    if (ev.finish != FinishReason::None) f.finish = ev.finish;
  };
  EXPECT_TRUE(e.add_request(std::move(d)).ok());
  while (e.has_work() && std::chrono::steady_clock::now() < until) {
    const auto st = e.step();
    EXPECT_TRUE(st.ok()) << st.message();
    if (!st.ok()) break;
  }
  return f;
}

class DeviceLoop : public ::testing::TestWithParam<const char*> {};

TEST_P(DeviceLoop, GreedyTokensAndFinishesEqualHostScheduling) {
  SKIP_WITHOUT_GPU();
  auto model = load(kData + "/models/" + GetParam());
  ASSERT_NE(model, nullptr);
  std::vector<Req> reqs = mixed_batch(ref_prompts(GetParam()));
  const Result host = run(*model, false, reqs);
  ASSERT_EQ(host.tokens.size(), reqs.size());
  // Stop ids the host run shows are reached: the 6th token of request 1 and the 3rd of request 2
  // (each stops at its first occurrence, which may come earlier).
  reqs[1].stop_ids = {host.tokens[1][5]};
  reqs[2].stop_ids = {host.tokens[2][2], host.tokens[0][0]};
  const Result host2 = run(*model, false, reqs);
  const Result dev = run(*model, true, reqs);
  EXPECT_NE(dev.executor.find("device loop"), std::string::npos) << dev.executor;
  EXPECT_EQ(host2.finish[1], FinishReason::Stop);
  EXPECT_EQ(host2.finish[0], FinishReason::Length);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(dev.tokens[i], host2.tokens[i]) << "request " << i << " (" << reqs[i].prompt.size() << " prompt tokens)";
    EXPECT_EQ(dev.finish[i], host2.finish[i]) << "request " << i;
  }
  EXPECT_EQ(dev.tokens[reqs.size() - 1], dev.tokens[3]);
}

// Sampled sequences run in the loop too (its sampling graphs: kern::sample with each row's
// parameters and counter), with the draws the host's sampler makes on the host path's logits: the
// same tokens, short of a draw within ~1e-7 of a CDF boundary (device and host exp differ in the
// last bits; not expected in these few hundred draws).
TEST_P(DeviceLoop, SampledTokensEqualHostScheduling) {
  SKIP_WITHOUT_GPU();
  auto model = load(kData + "/models/" + GetParam());
  ASSERT_NE(model, nullptr);
  const auto ids = ref_prompts(GetParam());
  std::vector<Req> reqs;
  for (size_t i = 0; i < ids.size(); ++i) reqs.push_back({ids[i], 20, {}, 0.6f + 0.2f * static_cast<float>(i % 3)});
  reqs.push_back({ids[0], 20, {}, 0.0f});  // a greedy row in the same steps
  const Result host = run(*model, false, reqs);
  const Result dev = run(*model, true, reqs);
  EXPECT_NE(dev.executor.find("device loop"), std::string::npos) << dev.executor;
  EXPECT_EQ(dev.executor.find("greedy only"), std::string::npos) << dev.executor;
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(dev.tokens[i], host.tokens[i]) << "request " << i << " T=" << reqs[i].temperature;
    EXPECT_EQ(dev.finish[i], host.finish[i]) << "request " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(TinyModels, DeviceLoop, ::testing::Values("llama3-tiny", "qwen3-tiny"));

TEST(DeviceLoopControl, CancelDeadlineAndHostFallback) {
  SKIP_WITHOUT_GPU();
  auto model = load(kData + "/models/llama3-tiny");
  ASSERT_NE(model, nullptr);
  const auto ids = ref_prompts("llama3-tiny");
  Rig rig = make_rig(*model, true);
  ASSERT_NE(rig.engine, nullptr);
  auto& e = *rig.engine;
  std::vector<int32_t> toks_a, toks_b, toks_c;
  FinishReason fa = FinishReason::None, fb = FinishReason::None, fc = FinishReason::None;
  auto sink = [](std::vector<int32_t>* t, FinishReason* f) {
    return [t, f](const ss::engine::TokenEvent& ev) {
      if (ev.token >= 0) t->push_back(ev.token);
      if (ev.finish != FinishReason::None) *f = ev.finish;
    };
  };
  ss::engine::Request a;  // cancelled after a few tokens
  a.prompt = ids[0];
  a.max_tokens = 600;
  a.on_event = sink(&toks_a, &fa);
  // b: a deadline 3 ms out. The tiny model's context (512 positions) ends b by length after ~490
  // tokens, which the device loop runs in well under the 300 ms this test first gave it; 3 ms is
  // short of that at any step time the loop reaches (and a deadline passed before b's first token
  // is a timeout as well).
  ss::engine::Request b;
  b.prompt = ids[1];
  b.max_tokens = 600;
  b.deadline = ss::backend::Clock::now() + std::chrono::milliseconds(3);
  b.on_event = sink(&toks_b, &fb);
  ss::engine::Request c;  // a repetition penalty, which the loop does not apply: the host executor's
  c.prompt = ids[2];
  c.max_tokens = 12;
  c.sampling.temperature = 0.8f;
  c.sampling.seed = 3;
  c.sampling.repetition_penalty = 1.1f;
  c.on_event = sink(&toks_c, &fc);
  auto ida = e.add_request(std::move(a));
  ASSERT_TRUE(ida.ok());
  ASSERT_TRUE(e.add_request(std::move(b)).ok());
  ASSERT_TRUE(e.add_request(std::move(c)).ok());
  const auto t0 = std::chrono::steady_clock::now();
  bool cancelled = false;
  while (e.has_work() && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30)) {
    const auto st = e.step();
    ASSERT_TRUE(st.ok()) << st.message();
    if (!cancelled && toks_a.size() >= 5) {
      e.abort(*ida);
      cancelled = true;
    }
  }
  ASSERT_FALSE(e.has_work());
  EXPECT_EQ(fa, FinishReason::Abort);
  EXPECT_GE(toks_a.size(), 5u);
  EXPECT_LT(toks_a.size(), 600u);
  EXPECT_EQ(fb, FinishReason::Timeout);
  EXPECT_LT(toks_b.size(), 600u);
  EXPECT_EQ(fc, FinishReason::Length);
  EXPECT_EQ(toks_c.size(), 12u);
  const auto s = e.stats();
  EXPECT_EQ(s.kv_blocks_used, 0) << "every finished sequence's blocks came back";
  EXPECT_EQ(s.num_running, 0);
  ASSERT_TRUE(e.check_invariants().ok());
  // And the loop still serves: a greedy request after all that gets the host scheduling's tokens.
  const Followup again = greedy_followup(e, ids[0], t0 + std::chrono::seconds(40));
  EXPECT_EQ(again.finish, FinishReason::Length);
  // The loop's chain stops first (the engine's runner pauses it when destroyed): the reference run's
  // backend allocates and frees device and pinned memory, which synchronises the whole device and
  // would wait for ever on a chain that only ends at its stop flag (the H200 run of 2026-12-05 hung
  // here, after both loops above had passed).
  rig.engine.reset();
  rig.be.reset();
  const Result host = run(*model, false, {{ids[0], 10, {}, 0.0f}});
  ASSERT_EQ(host.tokens.size(), 1u);
  EXPECT_EQ(again.tokens, host.tokens[0]);
}

}  // namespace

namespace {

// After each way a sequence can end in the loop (its length, a cancel, a deadline, a request that ran
// on the host executor between the loop's steps), the next greedy request on the same engine gets the
// host scheduling's tokens: the ended sequence's slot, blocks and sampling state are all let go of.
TEST(DeviceLoopControl, ServesAGreedyRequestAfterEachKindOfEnd) {
  SKIP_WITHOUT_GPU();
  auto model = load(kData + "/models/llama3-tiny");
  ASSERT_NE(model, nullptr);
  const auto ids = ref_prompts("llama3-tiny");
  const Result host = run(*model, false, {{ids[0], 10, {}, 0.0f}});  // before any loop runs
  ASSERT_EQ(host.tokens.size(), 1u);
  for (const char* how : {"length", "abort", "timeout", "host", "none"}) {
    Rig rig = make_rig(*model, true);
    ASSERT_NE(rig.engine, nullptr);
    auto& e = *rig.engine;
    std::vector<int32_t> first;
    FinishReason ff = FinishReason::None;
    ss::engine::Request a;
    a.prompt = ids[1];
    a.max_tokens = std::string(how) == "length" ? 7 : 600;
    if (std::string(how) == "timeout") a.deadline = ss::backend::Clock::now() + std::chrono::milliseconds(3);
    if (std::string(how) == "host") {
      a.max_tokens = 12;
      a.sampling.temperature = 0.8f;
      a.sampling.seed = 3;
      a.sampling.repetition_penalty = 1.1f;
    }
    a.on_event = [&](const ss::engine::TokenEvent& ev) {
      if (ev.token >= 0) first.push_back(ev.token);
      if (ev.finish != FinishReason::None) ff = ev.finish;
    };
    const auto t0 = std::chrono::steady_clock::now();
    if (std::string(how) != "none") {
      auto id = e.add_request(std::move(a));
      ASSERT_TRUE(id.ok());
      bool cancelled = false;
      while (e.has_work() && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30)) {
        ASSERT_TRUE(e.step().ok()) << how;
        if (std::string(how) == "abort" && !cancelled && first.size() >= 5) {
          e.abort(*id);
          cancelled = true;
        }
      }
      ASSERT_FALSE(e.has_work()) << how;
      EXPECT_NE(ff, FinishReason::None) << how;
    }
    const Followup again = greedy_followup(e, ids[0], t0 + std::chrono::seconds(40));
    EXPECT_EQ(again.finish, FinishReason::Length) << how;
    EXPECT_EQ(again.tokens, host.tokens[0]) << "after a sequence that ended by " << how << " (" << first.size() << " tokens)";
  }
}

// A chain that does not stop when asked (SS_CUDA_LOOP_PAUSE_LIMIT_MS=0: pause() gives up at once, as
// after a wedged chain's 10 s): the engine's teardown returns in bounded time, leaves the runner's
// and the backend's device memory to the process's exit and says so, instead of waiting on the
// chain for ever. The chain, its stop flag set, ends by itself afterwards.
TEST(DeviceLoopControl, TeardownAfterAChainThatDoesNotStopLeaksInsteadOfHanging) {
  SKIP_WITHOUT_GPU();
  auto model = load(kData + "/models/llama3-tiny");
  ASSERT_NE(model, nullptr);
  const auto ids = ref_prompts("llama3-tiny");
  Rig rig = make_rig(*model, true);
  ASSERT_NE(rig.engine, nullptr);
  ASSERT_NE(rig.engine->executor_name().find("device loop"), std::string::npos) << rig.engine->executor_name();
  const Followup f = greedy_followup(*rig.engine, ids[0], std::chrono::steady_clock::now() + std::chrono::seconds(30));
  EXPECT_EQ(f.finish, FinishReason::Length);  // the loop served before
  ::setenv("SS_CUDA_LOOP_PAUSE_LIMIT_MS", "0", 1);
  ::testing::internal::CaptureStderr();
  const auto t0 = std::chrono::steady_clock::now();
  rig.engine.reset();
  rig.be.reset();
  const auto took = std::chrono::steady_clock::now() - t0;
  const std::string err = ::testing::internal::GetCapturedStderr();
  ::unsetenv("SS_CUDA_LOOP_PAUSE_LIMIT_MS");
  EXPECT_LT(took, std::chrono::seconds(5));
  EXPECT_NE(err.find("did not stop within 0 ms of the stop flag"), std::string::npos) << err;
  EXPECT_NE(err.find("its memory is left to the process's exit"), std::string::npos) << err;
  EXPECT_NE(err.find("the CUDA backend is not freed"), std::string::npos) << err;
  // A fresh backend and loop still serve the same tokens (the old chain has ended by now or ends
  // soon: its stop flag is set).
  Rig again = make_rig(*model, true);
  ASSERT_NE(again.engine, nullptr);
  const Followup g = greedy_followup(*again.engine, ids[0], std::chrono::steady_clock::now() + std::chrono::seconds(30));
  EXPECT_EQ(g.tokens, f.tokens);
}

}  // namespace
