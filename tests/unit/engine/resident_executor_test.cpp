// The resident loop (backend/resident/loop.h) and the executor that feeds it, over the paging-checking
// fake backend: every sequence's tokens equal the model sampled alone (the host executor's run of it
// alone, which engine_test checks against the toy model itself), under batching, chunked prefill,
// block pressure and churn; nothing is delivered after stop(); every block comes back.
#include "engine/resident_executor.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <random>
#include <thread>

#include "fake_backend.h"

using namespace ss;
using namespace ss::engine;
using namespace ss::engine::testing;

namespace {
constexpr int kVocab = 97;

std::unique_ptr<Engine> resident_engine(backend::Backend& be, int max_slots, int max_rows, int max_len) {
  auto ex = std::make_unique<ResidentExecutor>(make_host_loop_runner(be, max_slots, max_rows, max_len));
  auto e = Engine::create(std::move(ex));
  EXPECT_TRUE(e.ok()) << (e.ok() ? "" : e.message());
  return e.ok() ? std::move(e).value() : nullptr;
}

// The model alone, as the reference sampler draws it: stop ids banned before min_tokens, the stop
// id emitted, max_tokens.
std::vector<int32_t> model_alone(const Spec& s, int min_tokens) {
  SamplingParams sp;
  sp.temperature = s.temperature;
  sp.seed = s.seed;
  backend::Sampler sampler(sp, kVocab);
  std::vector<int32_t> tokens = s.prompt, out;
  while (static_cast<int>(out.size()) < s.max_tokens) {
    std::vector<float> l = reference_logits(tokens, static_cast<int>(tokens.size()) - 1, kVocab);
    if (static_cast<int>(out.size()) < min_tokens)
      for (int32_t t : s.stop_ids) l[static_cast<size_t>(t)] = -INFINITY;
    const int32_t t = sampler.sample(l.data(), s.prompt, out);
    out.push_back(t);
    tokens.push_back(t);
    if (std::find(s.stop_ids.begin(), s.stop_ids.end(), t) != s.stop_ids.end()) break;
  }
  return out;
}

std::vector<Spec> mixed_specs(std::mt19937& g, int n) {
  std::vector<Spec> v;
  for (int i = 0; i < n; ++i) {
    Spec s = spec(random_tokens(g, 1 + static_cast<int>(g() % 70), kVocab), 1 + static_cast<int>(g() % 40),
                  i % 3 == 0 ? 0.0f : 0.8f, 1000 + i);
    if (i % 4 == 1) s.stop_ids = {static_cast<int32_t>(g() % kVocab), static_cast<int32_t>(g() % kVocab)};
    v.push_back(s);
  }
  return v;
}
}  // namespace

TEST(ResidentExecutor, TokensMatchTheModelSampledAloneUnderBatchingAndChunkedPrefill) {
  std::mt19937 g(7);
  const std::vector<Spec> specs = mixed_specs(g, 14);
  FakeBackend be(256, 16, kVocab);
  be.max_tokens = 24;  // the loop's row budget: prompts go through in chunks beside the decodes
  auto e = resident_engine(be, 8, 24, 512);
  Collector c;
  std::vector<RequestId> ids;
  for (const Spec& s : specs) {
    auto id = e->add_request(make_request(s, &c));
    ASSERT_TRUE(id.ok()) << id.message();
    ids.push_back(*id);
  }
  run_all(*e);
  for (size_t i = 0; i < specs.size(); ++i) {
    const Outcome& o = c.out[ids[i]];
    EXPECT_EQ(o.tokens, model_alone(specs[i], 0)) << "request " << i;
    const bool stopped = !specs[i].stop_ids.empty() && !o.tokens.empty() &&
                         std::find(specs[i].stop_ids.begin(), specs[i].stop_ids.end(), o.tokens.back()) != specs[i].stop_ids.end();
    EXPECT_EQ(o.finish, stopped ? FinishReason::Stop : FinishReason::Length) << "request " << i;
    EXPECT_EQ(o.events_after_finish, 0);
  }
  EXPECT_EQ(e->stats().kv_blocks_used, 0);
}

TEST(ResidentExecutor, MinTokensBansStopIdsUntilThen) {
  std::mt19937 g(11);
  FakeBackend be(64, 16, kVocab);
  auto e = resident_engine(be, 4, 64, 256);
  Collector c;
  // Stop on the token the model would draw first: without min_tokens it stops at once.
  Spec s = spec(random_tokens(g, 9, kVocab), 12);
  s.stop_ids = {model_alone(s, 0).front()};
  Request r = make_request(s, &c);
  r.min_tokens = 5;
  auto id = e->add_request(std::move(r));
  ASSERT_TRUE(id.ok());
  run_all(*e);
  const std::vector<int32_t> want = model_alone(s, 5);
  EXPECT_EQ(c.out[*id].tokens, want);
  EXPECT_GE(c.out[*id].tokens.size(), 5u);
}

// A pool too small for two at once: sequences wait for room (never dropped, never preempted) and
// each still produces exactly its tokens alone.
TEST(ResidentExecutor, WaitsForRoomInsteadOfDropping) {
  std::mt19937 g(3);
  FakeBackend be(10, 4, kVocab);  // 40 tokens of KV
  auto e = resident_engine(be, 8, 32, 40);
  Collector c;
  std::vector<Spec> specs;
  std::vector<RequestId> ids;
  for (int i = 0; i < 6; ++i) {
    specs.push_back(spec(random_tokens(g, 5 + i * 3, kVocab), 12 + i, 0.5f, 77 + i));
    auto id = e->add_request(make_request(specs.back(), &c));
    ASSERT_TRUE(id.ok()) << id.message();
    ids.push_back(*id);
  }
  run_all(*e);
  for (size_t i = 0; i < specs.size(); ++i) {
    EXPECT_EQ(c.out[ids[i]].tokens, model_alone(specs[i], 0)) << "request " << i;
    EXPECT_EQ(c.out[ids[i]].finish, FinishReason::Length);
  }
}

// stop(): the sequence's last event is the given reason with no token, nothing follows it, and
// the others run on unchanged; under random churn every request ends exactly once and every
// block comes back.
TEST(ResidentExecutor, StopDeliversNothingAfterItAndChurnLosesNothing) {
  std::mt19937 g(5);
  FakeBackend be(48, 8, kVocab);
  // A step as slow as a small model's on a GPU, so that sequences are still running when stopped.
  be.on_batch = [](const backend::StepBatch&) { std::this_thread::sleep_for(std::chrono::microseconds(300)); };
  auto ex = std::make_unique<ResidentExecutor>(make_host_loop_runner(be, 6, 40, 128));
  ResidentExecutor* rex = ex.get();
  std::map<backend::SeqId, std::vector<backend::SeqEvent>> events;
  std::map<backend::SeqId, Spec> specs;
  std::map<backend::SeqId, bool> stopped;
  backend::SeqId next = 1;
  std::vector<backend::SeqEvent> out;
  for (int round = 0; round < 400 || rex->has_work(); ++round) {
    ASSERT_LT(round, 20000) << "not done";
    if (round < 400 && g() % 3 == 0) {
      backend::SeqStart s;
      s.id = next++;
      Spec sp = spec(random_tokens(g, 1 + static_cast<int>(g() % 30), kVocab), 1 + static_cast<int>(g() % 30),
                     g() % 2 ? 0.0f : 0.9f, g());
      s.prompt = sp.prompt;
      s.max_tokens = sp.max_tokens;
      s.sampling.temperature = sp.temperature;
      s.sampling.seed = sp.seed;
      ASSERT_TRUE(rex->check(s).ok());
      specs[s.id] = sp;
      rex->start(std::move(s));
    }
    if (round < 400 && g() % 5 == 0) {  // stop one that has not finished yet, started or waiting
      std::vector<backend::SeqId> open;
      for (backend::SeqId id = 1; id < next; ++id)
        if (!stopped[id] && (events[id].empty() || events[id].back().finish == FinishReason::None)) open.push_back(id);
      if (!open.empty()) {
        const backend::SeqId victim = open[g() % open.size()];
        stopped[victim] = true;
        rex->stop(victim, FinishReason::Abort);
      }
    }
    out.clear();
    Status st = rex->poll(out);
    ASSERT_TRUE(st.ok()) << st.message();
    ASSERT_TRUE(rex->check_invariants().ok()) << rex->check_invariants().message();
    for (auto& ev : out) {
      auto& v = events[ev.id];
      ASSERT_TRUE(v.empty() || v.back().finish == FinishReason::None) << "event after the end of " << ev.id;
      if (stopped[ev.id]) {
        ASSERT_EQ(ev.token, -1) << "a token after stop() for " << ev.id;
      }
      v.push_back(ev);
    }
  }
  int n_stopped = 0;
  for (const auto& [id, sp] : specs) {
    const auto& v = events[id];
    ASSERT_FALSE(v.empty()) << id;
    ASSERT_NE(v.back().finish, FinishReason::None) << id;
    std::vector<int32_t> toks;
    for (const auto& ev : v)
      if (ev.token >= 0) toks.push_back(ev.token);
    const std::vector<int32_t> want = model_alone(sp, 0);
    if (stopped[id]) {
      ++n_stopped;
      EXPECT_EQ(v.back().finish, FinishReason::Abort) << id;
      EXPECT_EQ(v.back().token, -1);
      ASSERT_LE(toks.size(), want.size());
      EXPECT_TRUE(std::equal(toks.begin(), toks.end(), want.begin())) << "a stopped sequence's tokens, " << id;
    } else {
      EXPECT_EQ(toks, want) << id;
      EXPECT_EQ(v.back().finish, FinishReason::Length) << id;
    }
  }
  EXPECT_GT(n_stopped, 30);
  EXPECT_EQ(rex->stats().kv_blocks_used, 0);
  EXPECT_EQ(rex->stats().num_running, 0);
}

// The prefix cache: a prompt that extends a finished one's starts from its cached blocks (shared,
// read-only, the paging-checking backend verifying every cell it reads), every request still gets
// the toy model's own tokens, a different cache salt shares nothing, and a pool too small to keep
// everything evicts the least recently used unreferenced blocks instead of refusing work.
TEST(ResidentExecutor, PrefixCacheSharesFinishedBlocksExactly) {
  std::mt19937 g(14);
  FakeBackend be(48, 4, kVocab);
  std::atomic<int64_t> computed{0};
  be.on_batch = [&](const backend::StepBatch& b) { computed += static_cast<int64_t>(b.tokens.size()); };
  auto ex = std::make_unique<ResidentExecutor>(make_host_loop_runner(be, 4, 16, 96), nullptr, true);
  ResidentExecutor* rex = ex.get();
  auto e = Engine::create(std::move(ex));
  ASSERT_TRUE(e.ok());
  Collector c;
  const std::vector<int32_t> base = random_tokens(g, 30, kVocab);
  const Spec first = spec(base, 8, 0.8f, 3);
  auto id0 = (*e)->add_request(make_request(first, &c));
  ASSERT_TRUE(id0.ok());
  run_all(**e);
  EXPECT_EQ(c.out[*id0].tokens, model_alone(first, 0));
  const int64_t before = computed.load();
  // The same prompt, the prompt extended, and the same prompt under another salt.
  std::vector<int32_t> longer = base;
  for (int i = 0; i < 9; ++i) longer.push_back(static_cast<int32_t>(g() % kVocab));
  const std::vector<Spec> next = {spec(base, 8, 0.0f), spec(longer, 6, 0.5f, 9), spec(base, 5, 0.0f)};
  std::vector<RequestId> ids;
  for (size_t i = 0; i < next.size(); ++i) {
    Request r = make_request(next[i], &c);
    if (i == 2) r.cache_salt = "tenant-b";
    auto id = (*e)->add_request(std::move(r));
    ASSERT_TRUE(id.ok());
    ids.push_back(*id);
  }
  run_all(**e);
  for (size_t i = 0; i < next.size(); ++i) EXPECT_EQ(c.out[ids[i]].tokens, model_alone(next[i], 0)) << "request " << i;
  const auto st = (*e)->stats();
  // 28 of the 30 prompt tokens (7 blocks of 4; the last token's block is computed) for the first two.
  EXPECT_EQ(st.prefix_hit_tokens, 28 + 28);
  EXPECT_EQ(st.prefix_queried_tokens, 30 + 30 + 39 + 30);
  EXPECT_EQ(computed.load() - before, (30 - 28) + (39 - 28) + 30 + (8 - 1) + (6 - 1) + (5 - 1));
  EXPECT_EQ(st.kv_blocks_used, 0);
  EXPECT_GT(st.kv_blocks_cached, 0);
  ASSERT_TRUE(rex->check_invariants().ok());

  // Many different prompts through a pool that holds a fraction of them: evictions, no refusals.
  std::vector<Spec> many;
  std::vector<RequestId> many_ids;
  for (int i = 0; i < 24; ++i) {
    many.push_back(spec(random_tokens(g, 10 + static_cast<int>(g() % 30), kVocab), 1 + static_cast<int>(g() % 12)));
    if (i % 3 == 2) many.back().prompt = many[static_cast<size_t>(i) - 1].prompt;  // a repeat: a hit when still cached
    auto id = (*e)->add_request(make_request(many.back(), &c));
    ASSERT_TRUE(id.ok());
    many_ids.push_back(*id);
  }
  run_all(**e);
  for (size_t i = 0; i < many.size(); ++i) EXPECT_EQ(c.out[many_ids[i]].tokens, model_alone(many[i], 0)) << "many " << i;
  EXPECT_EQ((*e)->stats().kv_blocks_used, 0);
  EXPECT_LE((*e)->stats().kv_blocks_cached, 48);
  ASSERT_TRUE(rex->check_invariants().ok());
}

// The executor reports the loop's steps (the server's watchdog reads progress from them): one per
// forward pass the loop ran.
TEST(ResidentExecutor, StepsAreTheLoopsForwardPasses) {
  std::mt19937 g(12);
  FakeBackend be(64, 16, kVocab);
  std::atomic<int64_t> batches{0};
  be.on_batch = [&](const backend::StepBatch&) { ++batches; };
  auto e = resident_engine(be, 4, 32, 256);
  Collector c;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(e->add_request(make_request(spec(random_tokens(g, 20, kVocab), 9), &c)).ok());
  run_all(*e);
  EXPECT_GT(batches.load(), 9);
  EXPECT_EQ(e->stats().steps, batches.load());
}

TEST(ResidentExecutor, DeadlineFinishesWithTimeout) {
  std::mt19937 g(9);
  FakeBackend be(256, 16, kVocab);
  be.on_batch = [](const backend::StepBatch&) { std::this_thread::sleep_for(std::chrono::milliseconds(2)); };
  auto ex = std::make_unique<ResidentExecutor>(make_host_loop_runner(be, 4, 64, 4096));
  backend::SeqStart s;
  s.id = 1;
  s.prompt = random_tokens(g, 10, kVocab);
  s.max_tokens = 1000000;  // would run to the context limit (4,000 steps of at least 2 ms)
  s.deadline = Clock::now() + std::chrono::milliseconds(30);
  ex->start(s);
  std::vector<backend::SeqEvent> out;
  const auto t0 = Clock::now();
  while (ex->has_work() && Clock::now() - t0 < std::chrono::seconds(20)) ASSERT_TRUE(ex->poll(out).ok());
  ASSERT_FALSE(out.empty());
  EXPECT_EQ(out.back().finish, FinishReason::Timeout);
  EXPECT_EQ(out.back().token, -1);
}

// A deadline passes while the sequence still waits for room: it ends then, not when admitted.
TEST(ResidentExecutor, DeadlineEndsAWaitingSequenceToo) {
  std::mt19937 g(10);
  FakeBackend be(4, 4, kVocab);  // 16 tokens: room for one sequence at a time
  be.on_batch = [](const backend::StepBatch&) { std::this_thread::sleep_for(std::chrono::milliseconds(2)); };
  ResidentExecutor ex(make_host_loop_runner(be, 4, 16, 16));
  backend::SeqStart a;
  a.id = 1;
  a.prompt = random_tokens(g, 4, kVocab);
  a.max_tokens = 12;  // holds all 4 blocks for ~12 steps of >= 2 ms
  backend::SeqStart b = a;
  b.id = 2;
  b.deadline = Clock::now() + std::chrono::milliseconds(5);
  ex.start(a);
  ex.start(b);
  std::vector<backend::SeqEvent> out;
  std::map<backend::SeqId, backend::SeqEvent> last;
  std::vector<backend::SeqId> finish_order;
  const auto t0 = Clock::now();
  while (ex.has_work() && Clock::now() - t0 < std::chrono::seconds(20)) {
    out.clear();
    ASSERT_TRUE(ex.poll(out).ok());
    for (const auto& ev : out) {
      last[ev.id] = ev;
      if (ev.finish != FinishReason::None) finish_order.push_back(ev.id);
    }
  }
  EXPECT_EQ(last[1].finish, FinishReason::Length);
  EXPECT_EQ(last[2].finish, FinishReason::Timeout);
  EXPECT_EQ(last[2].token, -1);
  EXPECT_EQ(finish_order, (std::vector<backend::SeqId>{2, 1}));  // while 1 still held the pool
}

TEST(ResidentExecutor, SaysClearlyWhatItCannotRun) {
  FakeBackend be(8, 16, kVocab);
  ResidentExecutor ex(make_host_loop_runner(be, 4, 64, 100));
  backend::SeqStart ok;
  ok.id = 1;
  ok.prompt = {1, 2, 3};
  ok.max_tokens = 4;
  EXPECT_TRUE(ex.check(ok).ok());
  auto err = [&](backend::SeqStart s) {
    Status st = ex.check(s);
    EXPECT_FALSE(st.ok());
    return st.ok() ? std::string() : st.message();
  };
  backend::SeqStart s = ok;
  s.prompt.clear();
  EXPECT_NE(err(s).find("empty"), std::string::npos);
  s = ok;
  s.prompt.assign(100, 1);
  EXPECT_NE(err(s).find("context"), std::string::npos);
  s = ok;
  s.prompt = {1, kVocab};
  EXPECT_NE(err(s).find("vocabulary"), std::string::npos);
  s = ok;
  s.sampling.repetition_penalty = 1.1f;
  EXPECT_NE(err(s).find("--scheduling host"), std::string::npos);
  s = ok;
  s.logprobs = 2;
  EXPECT_NE(err(s).find("logprobs"), std::string::npos);
  s = ok;
  s.stop_ids.assign(9, 1);
  EXPECT_NE(err(s).find("stop ids"), std::string::npos);
  s = ok;
  s.max_tokens = 0;
  EXPECT_NE(err(s).find("max_tokens"), std::string::npos);
}

// The control plane alone.
namespace {
struct Plane {
  explicit Plane(int slots = 4, int bs = 4, int max_blocks = 8, int rows = 16)
      : slots_(slots), tables_(static_cast<size_t>(slots) * max_blocks, -1), prompts_(static_cast<size_t>(slots) * bs * max_blocks, 0),
        tok_(rows), pos_(rows), slot_(rows), samp_(rows) {
    st.geo = resident::Geometry{slots, bs, max_blocks, bs * max_blocks, rows, kVocab};
    st.slots = slots_.data();
    st.tables = tables_.data();
    st.prompts = prompts_.data();
    r = resident::StepRows{tok_.data(), pos_.data(), slot_.data(), samp_.data(), 0, 0};
  }
  resident::State st;
  resident::StepRows r;
  std::vector<resident::Completion> out;
  std::vector<resident::Slot> slots_;
  std::vector<int32_t> tables_, prompts_, tok_, pos_, slot_;
  std::vector<uint8_t> samp_;
  void apply(const resident::Submit& m) {
    resident::apply(st, m, [&](const resident::Completion& c) { out.push_back(c); });
  }
};
resident::Submit admit(int slot, uint64_t id, int prompt_len, int max_tokens) {
  resident::Submit m;
  m.kind = resident::MsgKind::Admit;
  m.slot = slot;
  m.id = id;
  m.prompt_len = prompt_len;
  m.max_tokens = max_tokens;
  return m;
}
}  // namespace

TEST(ResidentLoop, RejectsMalformedAdmitsAndLeavesTheSlotsAlone) {
  Plane p;
  p.apply(admit(0, 1, 3, 4));
  ASSERT_TRUE(p.out.empty());
  ASSERT_TRUE(p.st.slots[0].live);
  resident::Submit bad[] = {admit(0, 2, 3, 4) /* slot in use */, admit(9, 3, 3, 4), admit(-1, 4, 3, 4),
                            admit(1, 5, 0, 4), admit(1, 6, 32, 4) /* no room for output */, admit(1, 7, 3, 0)};
  resident::Submit many_stops = admit(1, 8, 3, 4);
  many_stops.n_stop = resident::kMaxStopIds + 1;
  resident::Submit bad_stop = admit(1, 9, 3, 4);
  bad_stop.n_stop = 1, bad_stop.stop_ids[0] = kVocab;
  resident::Submit min_over = admit(1, 10, 3, 4);
  min_over.min_tokens = 5;
  for (const auto& m : bad) p.apply(m);
  p.apply(many_stops), p.apply(bad_stop), p.apply(min_over);
  ASSERT_EQ(p.out.size(), 9u);
  for (const auto& c : p.out) EXPECT_EQ(c.finish, resident::Finish::Rejected);
  EXPECT_EQ(p.out[0].n_blocks, -1);  // the slot in use is not handed back
  EXPECT_EQ(p.st.slots[0].id, 1u);
  for (int i = 1; i < 4; ++i) EXPECT_FALSE(p.st.slots[i].live);
}

TEST(ResidentLoop, ASequenceWithoutABlockWaitsAndResumes) {
  Plane p;
  p.prompts_[0] = 5, p.prompts_[1] = 6;
  p.apply(admit(0, 1, 2, 3));
  auto none = [](int32_t*) { return false; };
  auto emit = [&](const resident::Completion& c) { p.out.push_back(c); };
  resident::plan(p.st, p.r, 0, none, emit);
  EXPECT_EQ(p.r.n, 0);
  EXPECT_TRUE(p.st.slots[0].live);
  EXPECT_EQ(p.st.stalls, 1);
  int next = 40;
  auto some = [&](int32_t* b) { *b = next++; return true; };
  resident::plan(p.st, p.r, 0, some, emit);
  ASSERT_EQ(p.r.n, 2);
  EXPECT_EQ(p.r.tokens[0], 5);
  EXPECT_EQ(p.r.tokens[1], 6);
  EXPECT_EQ(p.r.n_sample, 1);
  EXPECT_EQ(p.tables_[0], 40);
  const int32_t drawn[] = {7};
  resident::commit(p.st, p.r, drawn, emit);
  ASSERT_EQ(p.out.size(), 1u);
  EXPECT_EQ(p.out[0].token, 7);
  EXPECT_EQ(p.out[0].len, 2);
  EXPECT_EQ(p.out[0].finish, resident::Finish::None);
  // The next step decodes 7 at position 2; a deadline already past ends it first, without a token.
  p.st.slots[0].deadline_ns = 10;
  resident::plan(p.st, p.r, 11, some, emit);
  EXPECT_EQ(p.r.n, 0);
  ASSERT_EQ(p.out.size(), 2u);
  EXPECT_EQ(p.out[1].finish, resident::Finish::Timeout);
  EXPECT_EQ(p.out[1].token, -1);
  EXPECT_EQ(p.out[1].n_blocks, 1);
}

// An engine config for --scheduling persistent with these seats and step tokens.
EngineConfig persistent_config(int max_num_seqs, int max_num_batched_tokens) {
  EngineConfig cfg;
  cfg.scheduling = EngineConfig::Scheduling::Persistent;
  cfg.scheduler.max_num_seqs = max_num_seqs;
  cfg.scheduler.max_num_batched_tokens = max_num_batched_tokens;
  return cfg;
}

// --scheduling persistent: the loop takes what it can, a host executor beside it the rest (here:
// repetition penalties), both over one backend (split blocks and slots, steps interleaved on the
// loop's thread); every request's tokens equal its run alone on the host executor.
TEST(PersistentScheduling, RoutesWhatTheLoopCannotRunToTheHostExecutor) {
  std::mt19937 g(21);
  auto request = [&](int i) {
    Request r = make_request(spec(random_tokens(g, 3 + i * 5, kVocab), 6 + i, i % 2 ? 0.7f : 0.0f, 500 + i), nullptr);
    if (i % 3 == 0) r.sampling.repetition_penalty = 1.3f;  // not in the loop yet
    return r;
  };
  std::vector<Request> reqs;
  for (int i = 0; i < 10; ++i) reqs.push_back(request(i));
  FakeBackend be(128, 8, kVocab, 32);
  const EngineConfig cfg = persistent_config(8, 32);
  auto e = Engine::create(be, cfg);
  ASSERT_TRUE(e.ok()) << e.message();
  EXPECT_NE((*e)->executor_name().find("persistent"), std::string::npos);
  Collector c;
  std::vector<RequestId> ids;
  for (Request r : reqs) {
    r.on_event = c.callback();
    auto id = (*e)->add_request(std::move(r));
    ASSERT_TRUE(id.ok()) << id.message();
    ids.push_back(*id);
  }
  run_all(**e);
  for (size_t i = 0; i < reqs.size(); ++i) {
    FakeBackend solo(128, 8, kVocab);
    EngineConfig sc;
    sc.scheduler.enable_prefix_caching = false;
    auto alone = Engine::create(solo, sc);
    ASSERT_TRUE(alone.ok());
    Collector ca;
    Request r = reqs[i];
    r.on_event = ca.callback();
    auto id = (*alone)->add_request(std::move(r));
    ASSERT_TRUE(id.ok());
    run_all(**alone);
    EXPECT_EQ(c.out[ids[i]].tokens, ca.out[*id].tokens) << "request " << i;
    EXPECT_EQ(c.out[ids[i]].finish, ca.out[*id].finish) << "request " << i;
    EXPECT_EQ(c.out[ids[i]].events_after_finish, 0);
  }
}

// Seats: a backend sized by persistent_backend_slots gives the loop every one of --max-num-seqs (the
// GPU serving run of 2026-12-05 saturated at half of them: 16 of 32), and the host executor its
// reserve; a backend with fewer slots splits them. Counted as the largest step of greedy rows.
TEST(PersistentScheduling, TheLoopGetsEveryConfiguredSeat) {
  EXPECT_EQ(persistent_host_seats(32), 8);
  EXPECT_EQ(persistent_backend_slots(32), 40);
  EXPECT_EQ(persistent_backend_slots(1), 2);
  for (const bool sized : {true, false}) {
    std::mt19937 g(41);
    FakeBackend be(256, 8, kVocab, sized ? persistent_backend_slots(8) : 8);
    std::atomic<size_t> widest{0};
    // The loop thread starts on the first admission while the engine's step is still submitting the
    // others, and a fake step takes microseconds: its batches wait (at most 2 s) until that first
    // step has submitted all eight (on a loaded machine the loop otherwise ran them one at a time).
    std::atomic<bool> submitted{false};
    be.on_batch = [&](const backend::StepBatch& b) {
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
      while (!submitted.load() && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      size_t w = widest.load();
      while (b.seq_slot.size() > w && !widest.compare_exchange_weak(w, b.seq_slot.size())) {
      }
    };
    const EngineConfig cfg = persistent_config(8, 64);
    auto e = Engine::create(be, cfg);
    ASSERT_TRUE(e.ok()) << e.message();
    Collector c;
    for (int i = 0; i < 8; ++i) {
      Request r = make_request(spec(random_tokens(g, 3, kVocab), 24, 0.0f, 900 + i), nullptr);
      r.on_event = c.callback();
      ASSERT_TRUE((*e)->add_request(std::move(r)).ok());
    }
    const Status first = (*e)->step();  // admits: every request submitted to the loop
    submitted.store(true);
    ASSERT_TRUE(first.ok()) << first.message();
    run_all(**e);
    EXPECT_EQ(c.out.size(), 8u);
    for (const auto& [id, o] : c.out) EXPECT_EQ(o.tokens.size(), 24u) << id;
    if (sized) EXPECT_EQ(widest.load(), 8u) << "the loop ran fewer than its 8 seats at once";
    else EXPECT_EQ(widest.load(), 4u) << "8 slots: the loop's half";
  }
}

// The GPU test DeviceLoopControl.CancelDeadlineAndHostFallback on the host loop: under --scheduling
// persistent a request cancelled after five tokens, one whose deadline passes mid-stream and a
// sampled one with a repetition penalty (the host executor's, stepped between the loop's steps) run
// together; each ends as it should, every block comes back, and the loop still serves afterwards.
TEST(PersistentScheduling, CancelDeadlineAndHostFallbackTogether) {
  std::mt19937 g(31);
  struct SlowBackend : FakeBackend {  // a step takes 100 us or more, so the deadline passes mid-stream
    using FakeBackend::FakeBackend;
    Status step(const backend::StepBatch& b, backend::StepOutput& out) override {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
      return FakeBackend::step(b, out);
    }
  };
  SlowBackend be(512, 8, kVocab, 32);
  const EngineConfig cfg = persistent_config(8, 32);
  auto made = Engine::create(be, cfg);
  ASSERT_TRUE(made.ok()) << made.message();
  Engine& e = **made;
  Collector c;
  Request a = make_request(spec(random_tokens(g, 9, kVocab), 600, 0.0f, 1), &c);
  Request b = make_request(spec(random_tokens(g, 20, kVocab), 600, 0.0f, 2), &c);
  b.deadline = backend::Clock::now() + std::chrono::milliseconds(30);
  Request h = make_request(spec(random_tokens(g, 14, kVocab), 12, 0.8f, 3), &c);
  h.sampling.repetition_penalty = 1.1f;
  auto ida = e.add_request(std::move(a));
  auto idb = e.add_request(std::move(b));
  auto idh = e.add_request(std::move(h));
  ASSERT_TRUE(ida.ok() && idb.ok() && idh.ok());
  const auto t0 = std::chrono::steady_clock::now();
  bool cancelled = false;
  while (e.has_work() && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30)) {
    const Status st = e.step();
    ASSERT_TRUE(st.ok()) << st.message();
    if (!cancelled && c.out[*ida].tokens.size() >= 5) {
      e.abort(*ida);
      cancelled = true;
    }
  }
  ASSERT_FALSE(e.has_work());
  EXPECT_EQ(c.out[*ida].finish, FinishReason::Abort);
  EXPECT_GE(c.out[*ida].tokens.size(), 5u);
  EXPECT_EQ(c.out[*idb].finish, FinishReason::Timeout);
  EXPECT_LT(c.out[*idb].tokens.size(), 600u);
  EXPECT_EQ(c.out[*idh].finish, FinishReason::Length);
  EXPECT_EQ(c.out[*idh].tokens.size(), 12u);
  const auto s = e.stats();
  EXPECT_EQ(s.kv_blocks_used, 0);
  EXPECT_EQ(s.num_running, 0);
  ASSERT_TRUE(e.check_invariants().ok());
  Request d = make_request(spec(random_tokens(g, 9, kVocab), 10, 0.0f, 4), &c);
  auto idd = e.add_request(std::move(d));
  ASSERT_TRUE(idd.ok());
  run_all(e);
  EXPECT_EQ(c.out[*idd].finish, FinishReason::Length);
  EXPECT_EQ(c.out[*idd].tokens.size(), 10u);
}
