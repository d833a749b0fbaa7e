// The engine over a fake backend: outputs equal running alone under batching, preemption and
// prefix reuse; budgets hold on every batch; cancellation, deadlines, lanes, chunked prefill.
#include "engine/engine.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <thread>

#include "fake_backend.h"

using namespace ss;
using namespace ss::engine;
using namespace ss::engine::testing;

namespace {
constexpr int kVocab = 97;

SchedulerConfig small_config(int max_seqs, int max_tokens) {
  SchedulerConfig sc;
  sc.max_num_seqs = max_seqs;
  sc.max_num_batched_tokens = max_tokens;
  return sc;
}
// With a long lane: prompts of long_threshold tokens or more, capped at long_cap per step.
SchedulerConfig lanes_config(int max_seqs, int max_tokens, int long_threshold, int long_cap) {
  SchedulerConfig sc = small_config(max_seqs, max_tokens);
  sc.long_prompt_threshold = long_threshold;
  sc.max_long_prefill_tokens = long_cap;
  return sc;
}
}  // namespace

// The engine's tokens are the model's, drawn by the reference sampler one position after another:
// the toy model's logits recomputed from the tokens alone, no engine, no cache, no batching.
TEST(Engine, SingleRequestMatchesTheModelSampledAlone) {
  std::mt19937 g(1);
  Spec s{random_tokens(g, 37, kVocab), 20, 0.7f, 42, {}};
  SamplingParams sp;
  sp.temperature = s.temperature;
  sp.seed = s.seed;
  backend::Sampler sampler(sp, kVocab);
  std::vector<int32_t> tokens = s.prompt, ref;
  for (int i = 0; i < s.max_tokens; ++i) {
    std::vector<float> l = reference_logits(tokens, static_cast<int>(tokens.size()) - 1, kVocab);
    const int32_t t = sampler.sample(l.data(), s.prompt, ref);
    ref.push_back(t);
    tokens.push_back(t);
  }
  Outcome o = run_alone(s, kVocab);
  EXPECT_EQ(o.tokens, ref);
  EXPECT_EQ(o.finish, FinishReason::Length);
  EXPECT_EQ(o.events_after_finish, 0);
}

// Decode-only step counters: a step that carries any prompt token is not one of them.
TEST(Engine, CountsStepsThatOnlyDecode) {
  std::mt19937 g(11);
  FakeBackend be(64, 16, kVocab);
  auto e = make_engine(be, small_config(4, 64), kVocab);
  Collector c;
  // Two requests admitted together: one prefill step samples the first token of each, then 9
  // steps decode both.
  ASSERT_TRUE(e->add_request(make_request(spec(random_tokens(g, 20, kVocab), 10), &c)).ok());
  ASSERT_TRUE(e->add_request(make_request(spec(random_tokens(g, 30, kVocab), 10), &c)).ok());
  run_all(*e);
  EngineStats st = e->stats();
  EXPECT_EQ(st.steps, 10);
  EXPECT_EQ(st.decode_steps, 9);
  EXPECT_EQ(st.decode_step_tokens, 18);
  EXPECT_GT(st.decode_step_seconds, 0.0);
  EXPECT_LE(st.decode_step_seconds, st.step_seconds);
  // A 100-token prompt arriving while a request decodes is chunked over two steps (64-token budget):
  // those steps carry prompt tokens and do not count, the other 11 do.
  ASSERT_TRUE(e->add_request(make_request(spec(random_tokens(g, 5, kVocab), 14), &c)).ok());
  ASSERT_TRUE(e->step().ok());  // the 5-token prompt
  ASSERT_TRUE(e->add_request(make_request(spec(random_tokens(g, 100, kVocab), 1), &c)).ok());
  run_all(*e);
  const EngineStats st2 = e->stats();
  EXPECT_EQ(st2.steps - st.steps, 14);
  EXPECT_EQ(st2.decode_steps - st.decode_steps, 11);
  EXPECT_EQ(st2.decode_step_tokens - st.decode_step_tokens, 11);
}

TEST(Engine, AdmissionErrorsAreClear) {
  FakeBackend be(4, 4, kVocab);  // 16 tokens of KV
  auto e = make_engine(be, small_config(4, 16), kVocab);
  auto too_big = e->add_request(make_request(spec(std::vector<int32_t>(10, 1), 7), nullptr));
  ASSERT_FALSE(too_big.ok());
  EXPECT_NE(too_big.message().find("KV cache holds 16"), std::string::npos) << too_big.message();
  EXPECT_FALSE(e->add_request(make_request(spec({}, 4), nullptr)).ok());
  EXPECT_FALSE(e->add_request(make_request(spec({1, kVocab}, 4), nullptr)).ok());
  EXPECT_FALSE(e->add_request(make_request(spec({1, 2}, 0), nullptr)).ok());
  Request bad = make_request(spec({1, 2}, 4), nullptr);
  bad.sampling.top_p = 2.0f;
  EXPECT_FALSE(e->add_request(std::move(bad)).ok());
  Request bias = make_request(spec({1, 2}, 4), nullptr);
  bias.sampling.logit_bias = {{kVocab, 1.0f}};
  auto out_of_vocab = e->add_request(std::move(bias));
  ASSERT_FALSE(out_of_vocab.ok());
  EXPECT_NE(out_of_vocab.message().find("logit_bias token id"), std::string::npos) << out_of_vocab.message();
  auto ok = e->add_request(make_request(spec(std::vector<int32_t>(10, 1), 6), nullptr, 77));
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(*ok, 77u);
  EXPECT_FALSE(e->add_request(make_request(spec({1}, 1), nullptr, 77)).ok()) << "duplicate live id";
  run_all(*e);
  EXPECT_TRUE(e->add_request(make_request(spec({1}, 1), nullptr, 77)).ok()) << "id free again once finished";

  EngineConfig cfg;
  cfg.scheduler = small_config(8, 4);
  EXPECT_FALSE(Engine::create(be, cfg).ok()) << "budget below max_num_seqs";
}

TEST(Engine, SharedSystemPromptReusesCachedBlocksWithSameOutputs) {
  std::mt19937 g(2);
  const auto sys = random_tokens(g, 48, kVocab);  // 3 blocks of 16
  std::vector<Spec> specs;
  for (int i = 0; i < 6; ++i) {
    Spec s{sys, 8, i % 2 ? 0.0f : 0.9f, static_cast<uint64_t>(i + 1), {}};
    auto tail = random_tokens(g, 3 + 5 * i, kVocab);
    s.prompt.insert(s.prompt.end(), tail.begin(), tail.end());
    specs.push_back(s);
  }
  FakeBackend be(64, 16, kVocab);
  be.max_tokens = 64;
  be.max_seqs = 8;
  auto e = make_engine(be, small_config(8, 64), kVocab);
  Collector c;
  std::vector<RequestId> ids;
  ids.push_back(*e->add_request(make_request(specs[0], &c)));
  run_all(*e);  // the first request publishes the system prompt's blocks
  EXPECT_EQ(e->stats().prefix_hit_tokens, 0);
  for (size_t i = 1; i < specs.size(); ++i) ids.push_back(*e->add_request(make_request(specs[i], &c)));
  run_all(*e);
  const EngineStats st = e->stats();
  EXPECT_EQ(st.prefix_hit_tokens, 5 * 48);
  EXPECT_GT(st.prefix_hit_rate, 0.5);
  EXPECT_EQ(st.kv_blocks_used, 0);
  EXPECT_GT(st.kv_blocks_cached, 3);
  for (size_t i = 0; i < specs.size(); ++i) EXPECT_EQ(c.out[ids[i]].tokens, run_alone(specs[i], kVocab).tokens) << i;

  // The very same prompt again (51 tokens) is all cached but its last token: 3 blocks reused.
  const int64_t hits_before = st.prefix_hit_tokens;
  const RequestId again = *e->add_request(make_request(specs[0], &c));
  run_all(*e);
  EXPECT_EQ(e->stats().prefix_hit_tokens - hits_before, 48);
  EXPECT_EQ(c.out[again].tokens, c.out[ids[0]].tokens);
}

// vLLM's min_tokens: the stop ids cannot be sampled before min_tokens outputs (their logits are
// masked), so a request whose greedy first token is a stop id runs on; after that, stops work.
TEST(Engine, MinTokensMasksStopIdsUntilThen) {
  std::mt19937 g(15);
  Spec s = spec(random_tokens(g, 20, kVocab), 12);
  const auto free_run = run_alone(s, kVocab).tokens;
  ASSERT_EQ(free_run.size(), 12u);
  FakeBackend be(64, 16, kVocab);
  auto e = make_engine(be, small_config(4, 64), kVocab);
  Collector c;
  Spec stopped = s;
  stopped.stop_ids = {free_run[0], free_run[1]};
  const RequestId plain = *e->add_request(make_request(stopped, &c));
  Request r = make_request(stopped, &c);
  r.min_tokens = 5;
  const RequestId held = *e->add_request(std::move(r));
  run_all(*e);
  EXPECT_EQ(c.out[plain].tokens, std::vector<int32_t>{free_run[0]});
  EXPECT_EQ(c.out[plain].finish, FinishReason::Stop);
  const auto& out = c.out[held].tokens;
  ASSERT_GE(out.size(), 5u);
  for (size_t i = 0; i < 4; ++i)
    EXPECT_TRUE(out[i] != free_run[0] && out[i] != free_run[1]) << "stop id sampled at output " << i;
  if (c.out[held].finish == FinishReason::Stop) {
    EXPECT_TRUE(out.back() == free_run[0] || out.back() == free_run[1]);
  }
  Request bad = make_request(s, nullptr);
  bad.min_tokens = 13;
  EXPECT_FALSE(e->add_request(std::move(bad)).ok()) << "min_tokens above max_tokens";
  Request bad_stop = make_request(s, nullptr);
  bad_stop.stop_ids = {kVocab};
  EXPECT_FALSE(e->add_request(std::move(bad_stop)).ok()) << "stop id outside the vocabulary";
}

// vLLM's cache_salt: the same prompt reuses cached blocks only under the same salt (an empty salt is
// the shared default), and the output is the same whichever blocks it got.
TEST(Engine, CacheSaltIsolatesPrefixReuse) {
  std::mt19937 g(12);
  Spec s{random_tokens(g, 49, kVocab), 6, 0.0f, 0, {}};  // 3 full blocks before the last token
  FakeBackend be(64, 16, kVocab);
  auto e = make_engine(be, small_config(4, 64), kVocab);
  Collector c;
  auto run = [&](const std::string& salt) {
    Request r = make_request(s, &c);
    r.cache_salt = salt;
    const int64_t before = e->stats().prefix_hit_tokens;
    const RequestId id = *e->add_request(std::move(r));
    run_all(*e);
    EXPECT_EQ(c.out[id].tokens, run_alone(s, kVocab).tokens) << "salt '" << salt << "'";
    return e->stats().prefix_hit_tokens - before;
  };
  EXPECT_EQ(run("tenant-a"), 0);
  EXPECT_EQ(run("tenant-a"), 48);
  EXPECT_EQ(run("tenant-b"), 0);
  EXPECT_EQ(run(""), 0);
  EXPECT_EQ(run(""), 48);
  EXPECT_EQ(run("tenant-b"), 48);
  EXPECT_NE(salted_root("tenant-a"), salted_root("tenant-b"));
  EXPECT_EQ(salted_root(""), kRootBlockHash);
}

// Request::prompt_logprobs (the server's echo + logprobs): every prompt token after the first is
// scored by the logits at the position before it, delivered once, with the first token's event. A
// prompt longer than Scheduler::kMaxPromptLogprobRows takes several steps; the cached prefix is not
// reused (each position needs its logits); the generated tokens are the plain request's.
TEST(Engine, PromptLogprobsScoreEveryPromptToken) {
  std::mt19937 g(14);
  const int n = 300;
  const Spec s = spec(random_tokens(g, n, kVocab), 3);
  FakeBackend be(128, 16, kVocab);
  auto e = make_engine(be, small_config(4, 512), kVocab);
  Collector c;
  const RequestId plain = *e->add_request(make_request(s, &c));
  run_all(*e);  // publishes the prompt's blocks
  std::vector<int> fed;
  be.on_batch = [&](const backend::StepBatch& b) { fed.push_back(static_cast<int>(b.tokens.size())); };
  Request r = make_request(s, &c);
  r.prompt_logprobs = 3;
  const int64_t hits = e->stats().prefix_hit_tokens;
  const RequestId scored = *e->add_request(std::move(r));
  run_all(*e);
  EXPECT_EQ(e->stats().prefix_hit_tokens, hits) << "a scored prompt reused cached blocks";
  ASSERT_GE(fed.size(), 3u);
  EXPECT_EQ(std::vector<int>(fed.begin(), fed.begin() + 3),
            (std::vector<int>{Scheduler::kMaxPromptLogprobRows, Scheduler::kMaxPromptLogprobRows,
                              n - 2 * Scheduler::kMaxPromptLogprobRows}));
  const Outcome& o = c.out[scored];
  EXPECT_EQ(o.tokens, c.out[plain].tokens);
  EXPECT_EQ(o.prompt_lp_events, 1);
  EXPECT_EQ(c.out[plain].prompt_lp_events, 0);
  expect_prompt_logprobs(s.prompt, o.prompt_lp, 3, kVocab, "scored");
  Request bad = make_request(s, nullptr);
  bad.prompt_logprobs = 65;
  EXPECT_FALSE(e->add_request(std::move(bad)).ok());
}

TEST(Engine, WholePromptCachedStillComputesLastToken) {
  std::mt19937 g(3);
  Spec s{random_tokens(g, 32, kVocab), 5, 0.0f, 0, {}};  // exactly 2 blocks
  FakeBackend be(32, 16, kVocab);
  auto e = make_engine(be, small_config(4, 64), kVocab);
  Collector c;
  const RequestId a = *e->add_request(make_request(s, &c));
  run_all(*e);
  const RequestId b = *e->add_request(make_request(s, &c));
  std::vector<int> fed;
  be.on_batch = [&](const backend::StepBatch& batch) { fed.push_back(static_cast<int>(batch.tokens.size())); };
  run_all(*e);
  EXPECT_EQ(e->stats().prefix_hit_tokens, 16);  // block 2 holds the last token: recomputed
  ASSERT_FALSE(fed.empty());
  EXPECT_EQ(fed[0], 16);
  EXPECT_EQ(c.out[b].tokens, c.out[a].tokens);
}

class Preemption : public ::testing::TestWithParam<bool> {};

TEST_P(Preemption, TinyKvBudgetStillCompletesEveryRequestExactly) {
  std::mt19937 g(4);
  std::vector<Spec> specs;
  const auto shared = random_tokens(g, 8, kVocab);
  for (int i = 0; i < 10; ++i) {
    Spec s;
    s.prompt = i % 3 == 0 ? shared : std::vector<int32_t>{};
    auto tail = random_tokens(g, 4 + (i * 5) % 11, kVocab);
    s.prompt.insert(s.prompt.end(), tail.begin(), tail.end());
    s.max_tokens = 10 + (i * 7) % 12;
    s.temperature = i % 2 ? 0.0f : 1.0f;
    s.seed = 1000 + i;
    specs.push_back(s);
  }
  FakeBackend be(10, 4, kVocab);  // 40 tokens of KV; each request alone needs up to 40
  be.max_tokens = 16;
  be.max_seqs = 6;
  SchedulerConfig sc = small_config(6, 16);
  sc.enable_prefix_caching = GetParam();
  auto e = make_engine(be, sc, kVocab);
  Collector c;
  std::vector<RequestId> ids;
  for (const Spec& s : specs) {
    auto id = e->add_request(make_request(s, &c));
    ASSERT_TRUE(id.ok()) << id.message();
    ids.push_back(*id);
  }
  // The oldest request is never the victim: once it decodes, it gains a token every step.
  size_t seen = 0;
  bool decoding = false;
  for (int step = 0; step < 2000 && e->has_work(); ++step) {
    ASSERT_TRUE(e->step().ok());
    ASSERT_TRUE(e->check_invariants().ok()) << e->check_invariants().message();
    const Outcome& first = c.out[ids[0]];
    if (decoding && first.finish == FinishReason::None) {
      EXPECT_EQ(first.tokens.size(), seen + 1) << "step " << step;
    }
    decoding = !first.tokens.empty();
    seen = first.tokens.size();
  }
  ASSERT_FALSE(e->has_work());
  const EngineStats st = e->stats();
  EXPECT_GT(st.preemptions, 0);
  EXPECT_EQ(st.kv_blocks_used, 0);
  EXPECT_EQ(st.finished_requests, 10);
  for (size_t i = 0; i < specs.size(); ++i) {
    const Outcome& o = c.out[ids[i]];
    EXPECT_EQ(o.finish, FinishReason::Length) << i;
    EXPECT_EQ(o.events_after_finish, 0);
    EXPECT_EQ(o.tokens, run_alone(specs[i], kVocab).tokens) << "request " << i;
  }
}
INSTANTIATE_TEST_SUITE_P(PrefixCaching, Preemption, ::testing::Bool());

TEST(Engine, CancelFlagAndAbortFreeBlocksWithinOneStep) {
  std::mt19937 g(5);
  FakeBackend be(32, 4, kVocab);
  auto e = make_engine(be, small_config(4, 64), kVocab);
  Collector c;
  Request r1 = make_request(spec(random_tokens(g, 10, kVocab), 50), &c);
  r1.cancel = make_cancel_token();
  CancelToken tok = r1.cancel;
  const RequestId a = *e->add_request(std::move(r1));
  const RequestId b = *e->add_request(make_request(spec(random_tokens(g, 10, kVocab), 50), &c));
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(e->step().ok());
  EXPECT_EQ(c.out[a].tokens.size(), 3u);
  const int used_two = e->stats().kv_blocks_used;
  EXPECT_GT(used_two, 0);
  tok->store(true);
  ASSERT_TRUE(e->step().ok());
  EXPECT_EQ(c.out[a].finish, FinishReason::Abort);
  EXPECT_EQ(c.out[a].tokens.size(), 3u) << "no token after the cancel";
  EXPECT_EQ(e->stats().num_running, 1);
  EXPECT_LT(e->stats().kv_blocks_used, used_two);
  ASSERT_TRUE(e->check_invariants().ok());

  e->abort(b);
  ASSERT_TRUE(e->step().ok());
  EXPECT_EQ(c.out[b].finish, FinishReason::Abort);
  EXPECT_EQ(e->stats().kv_blocks_used, 0);
  EXPECT_FALSE(e->has_work());

  // Aborting a request that is still queued (never scheduled).
  const RequestId w = *e->add_request(make_request(spec(random_tokens(g, 10, kVocab), 5), &c));
  e->abort(w);
  ASSERT_TRUE(e->step().ok());
  EXPECT_EQ(c.out[w].finish, FinishReason::Abort);
  EXPECT_TRUE(c.out[w].tokens.empty());
  EXPECT_FALSE(e->has_work());
  e->abort(12345);  // unknown: no-op
  ASSERT_TRUE(e->step().ok());
  EXPECT_EQ(c.out[a].events_after_finish + c.out[b].events_after_finish + c.out[w].events_after_finish, 0);
}

TEST(Engine, DeadlineFinishesWithTimeout) {
  std::mt19937 g(6);
  FakeBackend be(32, 4, kVocab);
  Clock::time_point now = Clock::now();
  EngineConfig cfg;
  cfg.scheduler = small_config(1, 8);  // one seat: the second request waits
  cfg.clock = [&] { return now; };
  auto e = std::move(Engine::create(be, cfg)).value();
  Collector c;
  Request r = make_request(spec(random_tokens(g, 6, kVocab), 50), &c);
  r.deadline = now + std::chrono::milliseconds(100);
  const RequestId a = *e->add_request(std::move(r));
  Request w = make_request(spec(random_tokens(g, 6, kVocab), 5), &c);
  w.deadline = now + std::chrono::milliseconds(50);
  const RequestId b = *e->add_request(std::move(w));
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(e->step().ok());
  EXPECT_EQ(c.out[a].tokens.size(), 4u);  // the prompt in one chunk, then 3 decodes
  EXPECT_EQ(c.out[b].finish, FinishReason::None);
  now += std::chrono::milliseconds(60);  // the waiting one is past its deadline
  ASSERT_TRUE(e->step().ok());
  EXPECT_EQ(c.out[b].finish, FinishReason::Timeout);
  EXPECT_TRUE(c.out[b].tokens.empty());
  EXPECT_EQ(c.out[a].finish, FinishReason::None);
  now += std::chrono::milliseconds(40);
  ASSERT_TRUE(e->step().ok());
  EXPECT_EQ(c.out[a].finish, FinishReason::Timeout);
  EXPECT_EQ(e->stats().kv_blocks_used, 0);
  EXPECT_FALSE(e->has_work());
}

// Stop ids end a request at once; a caller that finds a stop (the server's stop strings) asks the
// engine to stop it, which it does before the request samples again.
TEST(Engine, StopIdsAndStopRequests) {
  std::mt19937 g(7);
  Spec s{random_tokens(g, 12, kVocab), 10, 0.0f, 0, {}};
  const auto ref = run_alone(s, kVocab).tokens;
  ASSERT_EQ(ref.size(), 10u);
  FakeBackend be(32, 16, kVocab);
  auto e = make_engine(be, small_config(4, 64), kVocab);
  Collector c;
  Spec stop = s;
  stop.stop_ids = {ref[3]};
  const size_t first = std::find(ref.begin(), ref.end(), ref[3]) - ref.begin();
  const RequestId a = *e->add_request(make_request(stop, &c));
  Request stopped = make_request(s, &c);
  Engine* engine = e.get();
  auto cb = stopped.on_event;
  int seen = 0;
  stopped.on_event = [&, engine, cb](const TokenEvent& ev) {
    cb(ev);
    if (ev.token >= 0 && ++seen == 2) engine->stop_request(ev.id, FinishReason::Stop);
  };
  const RequestId b = *e->add_request(std::move(stopped));
  run_all(*e);
  EXPECT_EQ(c.out[a].finish, FinishReason::Stop);
  EXPECT_EQ(c.out[a].tokens, std::vector<int32_t>(ref.begin(), ref.begin() + first + 1));
  EXPECT_EQ(c.out[b].finish, FinishReason::Stop);
  EXPECT_EQ(c.out[b].tokens, std::vector<int32_t>(ref.begin(), ref.begin() + 2));
}

TEST(Engine, ChunkedPrefillInterleavesWithDecodes) {
  std::mt19937 g(8);
  FakeBackend be(64, 16, kVocab);
  be.max_tokens = 32;
  auto e = make_engine(be, small_config(4, 32), kVocab);
  Collector c;
  Spec dec{random_tokens(g, 5, kVocab), 60, 0.0f, 0, {}};
  const RequestId a = *e->add_request(make_request(dec, &c));
  ASSERT_TRUE(e->step().ok());  // a's prefill, first token
  Spec big{random_tokens(g, 400, kVocab), 3, 0.0f, 0, {}};
  const RequestId b = *e->add_request(make_request(big, &c));
  int prefill_steps = 0;
  while (c.out[b].tokens.empty()) {
    const size_t before = c.out[a].tokens.size();
    ASSERT_TRUE(e->step().ok());
    ++prefill_steps;
    EXPECT_EQ(c.out[a].tokens.size(), before + 1) << "the decode stalled at step " << prefill_steps;
  }
  EXPECT_EQ(prefill_steps, (400 + 30) / 31);  // 31 prefill tokens per step next to one decode
  run_all(*e);
  EXPECT_EQ(c.out[a].tokens, run_alone(dec, kVocab).tokens);
  EXPECT_EQ(c.out[b].tokens, run_alone(big, kVocab).tokens);
}

// max_prefill_tokens_with_decodes: next to a decode, a long prompt prefills in chunks of the cap (the
// backend rejects any larger batch); alone, it takes the whole token budget per step.
TEST(Engine, PrefillCappedWhileStreamsDecode) {
  std::mt19937 g(9);
  FakeBackend be(128, 16, kVocab);
  SchedulerConfig sc = small_config(4, 64);
  sc.max_prefill_tokens_with_decodes = 10;
  auto e = make_engine(be, sc, kVocab);
  Collector c;
  Spec dec{random_tokens(g, 5, kVocab), 60, 0.0f, 0, {}};
  const RequestId a = *e->add_request(make_request(dec, &c));
  ASSERT_TRUE(e->step().ok());  // a's prefill (no decode yet: uncapped), first token
  Spec big{random_tokens(g, 100, kVocab), 3, 0.0f, 0, {}};
  const RequestId b = *e->add_request(make_request(big, &c));
  be.max_tokens = 1 + 10;  // one decode + the cap
  int steps = 0;
  while (c.out[b].tokens.empty()) {
    const size_t before = c.out[a].tokens.size();
    ASSERT_TRUE(e->step().ok()) << "step " << steps;
    ++steps;
    EXPECT_EQ(c.out[a].tokens.size(), before + 1) << "the decode stalled at step " << steps;
  }
  EXPECT_EQ(steps, 10);  // 100 prompt tokens, 10 per step
  run_all(*e);
  EXPECT_EQ(c.out[a].tokens, run_alone(dec, kVocab).tokens);
  EXPECT_EQ(c.out[b].tokens, run_alone(big, kVocab).tokens);
  // Nothing decoding: the whole budget per step.
  be.max_tokens = 64;
  Spec big2{random_tokens(g, 128, kVocab), 2, 0.0f, 0, {}};
  const RequestId d = *e->add_request(make_request(big2, &c));
  steps = 0;
  while (c.out[d].tokens.empty()) {
    ASSERT_TRUE(e->step().ok());
    ++steps;
  }
  EXPECT_EQ(steps, 2);
  SchedulerConfig bad = small_config(4, 64);
  bad.max_prefill_tokens_with_decodes = -1;
  EXPECT_FALSE(bad.validate().ok());
}

TEST(Engine, LongPromptDoesNotStarveShortOnes) {
  std::mt19937 g(9);
  FakeBackend be(128, 16, kVocab);
  auto e = make_engine(be, lanes_config(8, 32, 64, 16), kVocab);
  Collector c;
  const RequestId lng = *e->add_request(make_request(spec(random_tokens(g, 600, kVocab), 4), &c));
  ASSERT_TRUE(e->step().ok());  // nothing else waits: the long prompt takes the whole budget
  std::vector<RequestId> shorts;
  for (int i = 0; i < 4; ++i) shorts.push_back(*e->add_request(make_request(spec(random_tokens(g, 10, kVocab), 3), &c)));
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(e->step().ok());
  for (RequestId s : shorts) EXPECT_FALSE(c.out[s].tokens.empty()) << "short request waited behind the long prefill";
  EXPECT_TRUE(c.out[lng].tokens.empty());
  run_all(*e);
  EXPECT_EQ(c.out[lng].finish, FinishReason::Length);
}

// The long-lane cap leaves the short lane room, but no more than it can use: with a 10-token short
// prompt waiting, a long prefill takes the rest of a 64-token budget, not just its cap of 16.
TEST(Engine, LongPrefillCapIsWorkConserving) {
  std::mt19937 g(13);
  FakeBackend be(256, 16, kVocab);
  auto e = make_engine(be, lanes_config(8, 64, 32, 16), kVocab);
  Collector c;
  // Per step: all tokens fed, and the long prompt's (the only positions >= 40).
  std::vector<std::pair<int, int>> fed;
  be.on_batch = [&](const backend::StepBatch& b) {
    fed.emplace_back(static_cast<int>(b.tokens.size()),
                     static_cast<int>(std::count_if(b.positions.begin(), b.positions.end(), [](int p) { return p >= 40; })));
  };
  const RequestId lng = *e->add_request(make_request(spec(random_tokens(g, 300, kVocab), 2), &c));
  ASSERT_TRUE(e->step().ok());  // alone: the whole budget
  const RequestId sh = *e->add_request(make_request(spec(random_tokens(g, 10, kVocab), 4), &c));
  ASSERT_TRUE(e->step().ok());  // the short prompt whole (10), the long one the other 54
  EXPECT_EQ(c.out[sh].tokens.size(), 1u) << "the short prompt was prefilled in one step";
  // Many short prompts waiting (6 x 20 tokens > the budget): the cap holds, 16 for the long one.
  for (int i = 0; i < 6; ++i) (void)e->add_request(make_request(spec(random_tokens(g, 20, kVocab), 2), &c));
  ASSERT_TRUE(e->step().ok());
  ASSERT_EQ(fed.size(), 3u);
  EXPECT_EQ(fed[0], std::make_pair(64, 24));  // positions 40..63 of the first 64
  EXPECT_EQ(fed[1], std::make_pair(64, 54));
  EXPECT_EQ(fed[2], std::make_pair(64, 16));  // 1 decode + 16 long + 47 of the shorts
  run_all(*e);
  EXPECT_EQ(c.out[lng].finish, FinishReason::Length);
}

// Two shorts arrive every step, so the short lane never empties; returns the step at which the
// long prompt produced its first token, or -1 if it had not within `limit` steps.
static int steps_until_long_served(int max_wait_steps, int limit) {
  std::mt19937 g(10);
  FakeBackend be(512, 16, kVocab);
  SchedulerConfig sc = small_config(8, 16);
  sc.long_prompt_threshold = 32;
  sc.max_wait_steps = max_wait_steps;
  auto e = make_engine(be, sc, kVocab);
  Collector c;
  const RequestId lng = *e->add_request(make_request(spec(random_tokens(g, 40, kVocab), 2), &c));
  for (int step = 0; step < limit; ++step) {
    for (int k = 0; k < 2; ++k) (void)e->add_request(make_request(spec(random_tokens(g, 12, kVocab), 2), &c));
    if (!e->step().ok()) return -2;
    if (!c.out[lng].tokens.empty()) return step;
  }
  return -1;
}

TEST(Engine, ShortStreamDoesNotStarveLongPrompt) {
  EXPECT_EQ(steps_until_long_served(1000, 40), -1) << "the load must starve a long prompt without promotion";
  const int s = steps_until_long_served(6, 40);
  EXPECT_GE(s, 0);
  EXPECT_LE(s, 6 + 5 + 1);  // promoted after 6 steps, then 40 tokens in chunks of 8 (shorts waiting)
}

// The engine drives any executor through the same five calls: it hands requests over, turns cancel
// tokens and stop requests into stop(), and delivers what poll() reports to each request's
// callback, nothing after a request's finish.
namespace {
class ScriptedExecutor final : public backend::Executor {
 public:
  std::string name() const override { return "scripted"; }
  Status check(const backend::SeqStart& s) const override {
    return s.prompt.empty() ? Status(make_error("the prompt is empty")) : Status();
  }
  void start(backend::SeqStart s) override { started.push_back(s.id); }
  void stop(backend::SeqId id, FinishReason why) override {
    stops.emplace_back(id, why);
    backend::SeqEvent e;
    e.id = id;
    e.finish = why;
    pending.push_back(e);
  }
  Status poll(std::vector<backend::SeqEvent>& out) override {
    ++polls;
    for (backend::SeqId id : started) {  // one token per live sequence per poll
      bool done = false;
      for (const auto& s : stops) done |= s.first == id;
      if (done) continue;
      backend::SeqEvent e;
      e.id = id;
      e.token = 7;
      out.push_back(e);
    }
    for (auto& e : pending) out.push_back(e);
    pending.clear();
    for (const auto& s : stops) {  // an executor that ran ahead: an event after the finish
      backend::SeqEvent late;
      late.id = s.first;
      late.token = 9;
      out.push_back(late);
    }
    return {};
  }
  bool has_work() const override { return true; }
  backend::ExecutorStats stats() const override {
    backend::ExecutorStats s;
    s.num_running = static_cast<int>(started.size() - stops.size());
    return s;
  }
  std::vector<backend::SeqId> started;
  std::vector<std::pair<backend::SeqId, FinishReason>> stops;
  std::vector<backend::SeqEvent> pending;
  int polls = 0;
};
}  // namespace

TEST(Engine, DrivesAnyExecutor) {
  auto owned = std::make_unique<ScriptedExecutor>();
  ScriptedExecutor& ex = *owned;
  auto made = Engine::create(std::move(owned));
  ASSERT_TRUE(made.ok());
  Engine& e = **made;
  EXPECT_FALSE(e.add_request(Request{}).ok());  // the executor's own check
  Collector c;
  Request a = make_request(spec({1, 2}, 5), &c), b = make_request(spec({3}, 5), &c);
  a.cancel = make_cancel_token();
  const CancelToken cancel_a = a.cancel;
  const RequestId ia = *e.add_request(std::move(a)), ib = *e.add_request(std::move(b));
  EXPECT_EQ(e.stats().num_waiting, 0);  // stats are a snapshot after the last step
  ASSERT_TRUE(e.step().ok());
  EXPECT_EQ(ex.started, (std::vector<backend::SeqId>{ia, ib}));
  EXPECT_EQ(c.out[ia].tokens.size(), 1u);
  cancel_a->store(true);
  e.stop_request(ia, FinishReason::Stop);  // the cancel token wins: Abort, and stop() only once
  e.stop_request(ib, FinishReason::Stop);
  ASSERT_TRUE(e.step().ok());
  EXPECT_EQ(ex.stops, (std::vector<std::pair<backend::SeqId, FinishReason>>{{ia, FinishReason::Abort},
                                                                             {ib, FinishReason::Stop}}));
  EXPECT_EQ(c.out[ia].finish, FinishReason::Abort);
  EXPECT_EQ(c.out[ib].finish, FinishReason::Stop);
  EXPECT_EQ(c.out[ia].events_after_finish + c.out[ib].events_after_finish, 0);
  EXPECT_FALSE(e.has_work());
  ASSERT_TRUE(e.step().ok());  // late events for finished requests go nowhere
  EXPECT_EQ(c.out[ia].events_after_finish + c.out[ib].events_after_finish, 0);
  EXPECT_EQ(c.out[ib].tokens, (std::vector<int32_t>{7}));
}
