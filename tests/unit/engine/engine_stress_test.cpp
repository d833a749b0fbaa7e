// The engine under load: a run loop fed from several threads, backend failures, and a randomized
// workload (arrivals, cancels, deadlines, a tiny KV cache) checked against running each request alone.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <thread>

#include "engine/engine.h"
#include "fake_backend.h"

using namespace ss;
using namespace ss::engine;
using namespace ss::engine::testing;

namespace {
constexpr int kVocab = 97;
}

TEST(EngineLoop, ConcurrentClientsGetTheirOwnStreams) {
  FakeBackend be(48, 8, kVocab);
  SchedulerConfig sc;
  sc.max_num_seqs = 4;
  sc.max_num_batched_tokens = 24;
  be.max_tokens = 24;
  be.max_seqs = 4;
  auto e = make_engine(be, sc, kVocab);
  ASSERT_TRUE(e->start().ok());
  EXPECT_FALSE(e->start().ok()) << "already running";

  constexpr int kThreads = 3, kPerThread = 5;
  std::vector<Spec> specs(kThreads * kPerThread);
  std::mt19937 g(11);
  for (size_t i = 0; i < specs.size(); ++i)
    specs[i] = spec(random_tokens(g, 3 + static_cast<int>(i) * 3, kVocab), 6 + static_cast<int>(i % 7),
                    i % 2 ? 0.8f : 0.0f, i);
  std::vector<std::vector<int32_t>> got(specs.size());
  std::vector<FinishReason> why(specs.size(), FinishReason::None);
  std::vector<std::thread> clients;
  for (int t = 0; t < kThreads; ++t)
    clients.emplace_back([&, t] {
      for (int k = 0; k < kPerThread; ++k) {
        const size_t i = static_cast<size_t>(t * kPerThread + k);
        auto q = std::make_shared<EventQueue>();
        Request r = make_request(specs[i], nullptr);
        r.on_event = EventQueue::sink(q);
        if (!e->add_request(std::move(r)).ok()) return;
        TokenEvent ev;
        while (q->pop(ev, std::chrono::seconds(5))) {
          if (ev.token >= 0) got[i].push_back(ev.token);
          if (ev.finish != FinishReason::None) {
            why[i] = ev.finish;
            break;
          }
        }
      }
    });
  for (auto& c : clients) c.join();
  e->stop();
  EXPECT_FALSE(e->has_work());
  const EngineStats st = e->stats();
  EXPECT_EQ(st.finished_requests, kThreads * kPerThread);
  EXPECT_EQ(st.kv_blocks_used, 0);
  ASSERT_TRUE(e->check_invariants().ok());
  for (size_t i = 0; i < specs.size(); ++i) {
    EXPECT_EQ(why[i], FinishReason::Length) << i;
    EXPECT_EQ(got[i], run_alone(specs[i], kVocab).tokens) << i;
  }
  // After stop() the caller may drive it by hand.
  Collector c;
  const RequestId id = *e->add_request(make_request(specs[0], &c));
  run_all(*e);
  EXPECT_EQ(c.out[id].tokens, got[0]);
}

TEST(EngineLoop, BackendFailureFailsThatStepsRequestsOnly) {
  std::mt19937 g(12);
  FakeBackend be(32, 4, kVocab);
  auto e = make_engine(be, SchedulerConfig{}, kVocab);
  Collector c;
  const RequestId a = *e->add_request(make_request(spec(random_tokens(g, 9, kVocab), 20), &c));
  ASSERT_TRUE(e->step().ok());
  be.fail_next = true;
  Status st = e->step();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("injected failure"), std::string::npos) << st.message();
  EXPECT_EQ(c.out[a].finish, FinishReason::Error);
  EXPECT_NE(c.out[a].error.find("injected failure"), std::string::npos);
  EXPECT_EQ(e->stats().kv_blocks_used, 0);
  EXPECT_FALSE(e->stats().last_error.empty());
  ASSERT_TRUE(e->check_invariants().ok());
  const Spec s = spec(random_tokens(g, 9, kVocab), 5);
  const RequestId b = *e->add_request(make_request(s, &c));
  run_all(*e);
  EXPECT_EQ(c.out[b].tokens, run_alone(s, kVocab).tokens);
}

// Random arrivals, cancels, aborts and deadlines over a KV cache a few requests fill. Every batch
// respects the budgets (checked by the fake backend), invariants hold after every step, finished
// requests match running alone, and stopped ones produced a prefix of that.
TEST(EngineStress, RandomWorkloadMatchesRunningAlone) {
  for (uint32_t seed = 1; seed <= 4; ++seed) {
    std::mt19937 g(seed);
    const int bs = 4, blocks = 24;  // 96 tokens
    FakeBackend be(blocks, bs, kVocab);
    SchedulerConfig sc;
    sc.max_num_seqs = 5;
    sc.max_num_batched_tokens = 20;
    sc.long_prompt_threshold = 24;
    sc.max_long_prefill_tokens = 8;
    sc.max_wait_steps = 8;
    sc.enable_prefix_caching = seed % 2 == 1;
    be.max_tokens = sc.max_num_batched_tokens;
    be.max_seqs = sc.max_num_seqs;
    Clock::time_point now = Clock::now();
    EngineConfig cfg;
    cfg.scheduler = sc;
    cfg.clock = [&] { return now; };
    auto e = std::move(Engine::create(be, cfg)).value();
    std::vector<std::vector<int32_t>> systems;
    for (int i = 0; i < 3; ++i) systems.push_back(random_tokens(g, 4 + 7 * i, kVocab));

    Collector c;
    std::map<RequestId, Spec> specs;
    std::map<RequestId, CancelToken> cancels;
    std::map<RequestId, int> scored;  // Request::prompt_logprobs
    std::uniform_int_distribution<int> pct(0, 99);
    for (int step = 0; step < 5000 && (step < 250 || e->has_work()); ++step) {
      if (step < 250) {
        for (int k = pct(g) < 40 ? 1 + pct(g) % 2 : 0; k > 0; --k) {
          Spec s;
          if (pct(g) < 50) s.prompt = systems[pct(g) % 3];
          auto tail = random_tokens(g, 1 + pct(g) % 30, kVocab);
          s.prompt.insert(s.prompt.end(), tail.begin(), tail.end());
          s.max_tokens = 1 + pct(g) % std::min(30, blocks * bs - static_cast<int>(s.prompt.size()));
          s.temperature = pct(g) < 50 ? 0.0f : 1.0f;
          s.seed = static_cast<uint64_t>(pct(g));
          Request r = make_request(s, &c);
          const int k_prompt = pct(g) < 20 ? pct(g) % 3 : -1;
          r.prompt_logprobs = k_prompt;
          r.cancel = make_cancel_token();
          if (pct(g) < 10) r.deadline = now + std::chrono::milliseconds(pct(g));
          CancelToken tok = r.cancel;
          auto id = e->add_request(std::move(r));
          ASSERT_TRUE(id.ok()) << id.message();
          specs[*id] = s;
          cancels[*id] = tok;
          scored[*id] = k_prompt;
        }
        if (!specs.empty() && pct(g) < 5) {
          auto it = specs.begin();
          std::advance(it, pct(g) % specs.size());
          if (pct(g) < 50) cancels[it->first]->store(true);
          else e->abort(it->first);
        }
      }
      Status st = e->step();
      ASSERT_TRUE(st.ok()) << "seed " << seed << " step " << step << ": " << st.message();
      Status inv = e->check_invariants();
      ASSERT_TRUE(inv.ok()) << "seed " << seed << " step " << step << ": " << inv.message();
      now += std::chrono::milliseconds(1);
    }
    ASSERT_FALSE(e->has_work()) << "seed " << seed << ": running " << e->stats().num_running << " waiting "
                                << e->stats().num_waiting << " finished " << e->stats().finished_requests
                                << " steps " << e->stats().steps;
    EXPECT_EQ(e->stats().kv_blocks_used, 0);
    int completed = 0;
    for (const auto& [id, s] : specs) {
      const Outcome& o = c.out[id];
      ASSERT_NE(o.finish, FinishReason::None) << id;
      EXPECT_EQ(o.events_after_finish, 0);
      const auto ref = run_alone(s, kVocab).tokens;
      // Prompt logprobs arrive once, with the first token (preemptions and recomputation included).
      if (scored[id] >= 0 && !o.tokens.empty() && s.prompt.size() > 1) {  // one token: nothing to score
        EXPECT_EQ(o.prompt_lp_events, 1) << "seed " << seed << " request " << id;
        expect_prompt_logprobs(s.prompt, o.prompt_lp, scored[id], kVocab,
                               "seed " + std::to_string(seed) + " request " + std::to_string(id));
      } else {
        EXPECT_EQ(o.prompt_lp_events, 0) << "seed " << seed << " request " << id;
      }
      if (o.finish == FinishReason::Length) {
        ++completed;
        EXPECT_EQ(o.tokens, ref) << "seed " << seed << " request " << id;
      } else {
        ASSERT_TRUE(o.finish == FinishReason::Abort || o.finish == FinishReason::Timeout) << to_string(o.finish);
        ASSERT_LE(o.tokens.size(), ref.size());
        EXPECT_TRUE(std::equal(o.tokens.begin(), o.tokens.end(), ref.begin())) << "seed " << seed << " request " << id;
      }
    }
    EXPECT_GT(completed, 40) << "seed " << seed;
    if (getenv("SS_VERBOSE")) {
      const EngineStats st = e->stats();
      printf("seed %u: requests %zu completed %d steps %ld preemptions %ld hit %ld/%ld computed %ld gen %ld\n", seed,
             specs.size(), completed, (long)st.steps, (long)st.preemptions, (long)st.prefix_hit_tokens,
             (long)st.prefix_queried_tokens, (long)st.computed_tokens, (long)st.generation_tokens);
    }
    if (sc.enable_prefix_caching) {
      EXPECT_GT(e->stats().prefix_hit_tokens, 0);
    }
    EXPECT_GT(e->stats().preemptions, 0) << "seed " << seed << ": the cache should be too small to avoid preemption";
  }
}
