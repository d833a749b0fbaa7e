// Memory pressure level 3's action: EngineRouter sends new requests to a CPU fallback engine while
// the primary's KV pool has no room, and back to the primary once its level falls. Checked here: the
// routing rule over every combination of levels, --cpu-fallback's auto decision, and two engines
// under a load the primary's tiny pool cannot hold -- every request routed once, by the level the
// primary showed when it arrived, finishing on the engine that took it with the tokens it gets
// running alone.
#include <gtest/gtest.h>

#include <memory>
#include <random>

#include "engine/engine.h"
#include "fake_backend.h"

using namespace ss;
using namespace ss::engine;
using namespace ss::engine::testing;

namespace {
constexpr int kVocab = 97;
}  // namespace

TEST(EngineRouter, FallbackOnlyWhileThePrimaryIsAtLevelThreeAndTheFallbackHasRoom) {
  for (bool has : {false, true})
    for (int p = 0; p <= 3; ++p)
      for (int f = 0; f <= 3; ++f)
        for (int live = 0; live <= 5; ++live)
          for (int seats : {0, 4}) {
            RouteSignals s;
            s.has_fallback = has;
            s.primary_level = p;
            s.fallback_level = f;
            s.fallback_live = live;
            s.fallback_seats = seats;
            // Levels 0-2 slow work down on the primary; only "no room" (3) sends work below, and only
            // to a fallback with KV room and a free seat (0 seats: no bound).
            const bool seat_free = seats == 0 || live < seats;
            const Route want = has && p == 3 && f != 3 && seat_free ? Route::Fallback : Route::Primary;
            EXPECT_EQ(choose_route(s), want) << "fallback " << has << ", primary level " << p << ", fallback level "
                                             << f << ", live " << live << " of " << seats << " seats";
          }
}

TEST(EngineRouter, CpuFallbackFlag) {
  for (const char* n : {"auto", "on", "off"}) {
    auto m = parse_cpu_fallback_mode(n);
    ASSERT_TRUE(m.ok()) << n;
    EXPECT_STREQ(cpu_fallback_mode_name(*m), n);
  }
  for (const char* bad : {"", "yes", "ON", "cpu"}) {
    auto m = parse_cpu_fallback_mode(bad);
    ASSERT_FALSE(m.ok()) << bad;
    EXPECT_NE(m.message().find("auto, on or off"), std::string::npos) << m.message();
  }
  constexpr int64_t kGiB = int64_t{1} << 30;
  // auto: only below a GPU primary, and only when the host holds the CPU engine.
  EXPECT_FALSE(decide_cpu_fallback(CpuFallbackMode::Auto, false, 100 * kGiB, kGiB).enabled);
  EXPECT_NE(decide_cpu_fallback(CpuFallbackMode::Auto, false, 100 * kGiB, kGiB).why.find("nothing below"),
            std::string::npos);
  EXPECT_TRUE(decide_cpu_fallback(CpuFallbackMode::Auto, true, 2 * kGiB, 2 * kGiB).enabled);
  EXPECT_FALSE(decide_cpu_fallback(CpuFallbackMode::Auto, true, 2 * kGiB - 1, 2 * kGiB).enabled);
  EXPECT_FALSE(decide_cpu_fallback(CpuFallbackMode::Auto, true, -1, kGiB).enabled);  // MemAvailable unknown
  // on / off: as asked, on either device (on below a CPU primary is how it is tested without a GPU).
  for (bool gpu : {false, true}) {
    EXPECT_TRUE(decide_cpu_fallback(CpuFallbackMode::On, gpu, 0, kGiB).enabled);
    EXPECT_FALSE(decide_cpu_fallback(CpuFallbackMode::Off, gpu, 100 * kGiB, kGiB).enabled);
  }
}

TEST(EngineRouter, WithoutAFallbackEveryRequestGoesToThePrimary) {
  FakeBackend be(64, 4, kVocab);
  SchedulerConfig sc;
  auto e = make_engine(be, sc, kVocab);
  ASSERT_TRUE(e);
  EngineRouter router(*e);
  Collector c;
  std::atomic<Engine*> where{nullptr};
  auto p = router.add_request(make_request(spec({1, 2, 3}, 4), &c), &where);
  ASSERT_TRUE(p.ok()) << p.message();
  EXPECT_EQ(p->engine, e.get());
  EXPECT_EQ(where.load(), e.get());
  EXPECT_EQ(p->route, Route::Primary);
  EXPECT_EQ(router.fallback_requests(), 0);
  EXPECT_EQ(router.fallback_seats(), 0);
  run_all(*e);
  EXPECT_EQ(c.out[p->id].finish, FinishReason::Length);
  // A bad request is refused with the engine's error, not queued anywhere.
  auto bad = router.add_request(make_request(spec({}, 4), &c));
  EXPECT_FALSE(bad.ok());
}

// Requests arrive while both engines step. The primary's 16-block pool fills, its level reaches 3,
// and arrivals then go to the fallback until the level falls; each request finishes where it went.
TEST(EngineRouter, LevelThreeSendsNewWorkToTheFallbackAndItComesBackWhenTheLevelFalls) {
  std::mt19937 g(11);
  FakeBackend pbe(16, 4, kVocab), fbe(256, 4, kVocab);
  SchedulerConfig psc;
  psc.max_num_seqs = 8;
  psc.max_num_batched_tokens = 32;
  psc.pressure.enabled = true;
  psc.pressure.has_lower_backend = true;
  psc.pressure.host_memory = [](int64_t* a, int64_t* t) {
    *a = 90;
    *t = 100;
    return true;
  };
  SchedulerConfig fsc = psc;
  fsc.pressure.has_lower_backend = false;
  fsc.max_num_seqs = 4;
  fsc.max_model_len = 40;  // longer requests stay on the primary
  auto primary = make_engine(pbe, psc, kVocab);
  auto fallback = make_engine(fbe, fsc, kVocab);
  ASSERT_TRUE(primary && fallback);
  EngineRouter router(*primary, fallback.get(), fsc.max_num_seqs);
  EXPECT_EQ(router.fallback_seats(), 4);

  struct Sent {
    Spec spec;
    EngineRouter::Placed placed;
    int primary_level_at_arrival = 0;
    int fallback_live_at_arrival = 0;
    std::shared_ptr<Outcome> out = std::make_shared<Outcome>();
  };
  std::vector<Sent> sent;
  auto send = [&](Spec s) {
    Sent x;
    x.spec = s;
    x.primary_level_at_arrival = primary->stats().pressure_level;
    x.fallback_live_at_arrival = router.fallback_live();
    Request r = make_request(s, nullptr);
    auto out = x.out;
    r.on_event = [out](const TokenEvent& e) {
      if (e.token >= 0) out->tokens.push_back(e.token);
      out->finish = e.finish;
    };
    auto p = router.add_request(std::move(r));
    EXPECT_TRUE(p.ok()) << p.message();
    if (!p.ok()) return;
    x.placed = *p;
    sent.push_back(std::move(x));
  };
  auto step_both = [&] {
    if (primary->has_work()) {
      ASSERT_TRUE(primary->step().ok());
    }
    if (fallback->has_work()) {
      ASSERT_TRUE(fallback->step().ok());
    }
    ASSERT_TRUE(primary->check_invariants().ok());
    ASSERT_TRUE(fallback->check_invariants().ok());
  };
  bool long_sent = false;
  for (int i = 0; i < 48; ++i) {
    send(spec(random_tokens(g, 8 + static_cast<int>(g() % 8), kVocab), 6 + static_cast<int>(g() % 6)));
    if (!long_sent && primary->stats().pressure_level == 3) {  // too long for the fallback: stays on the primary
      send(spec(random_tokens(g, 36, kVocab), 8));
      long_sent = true;
    }
    step_both();
    step_both();
  }
  ASSERT_TRUE(long_sent) << "the primary's pool never filled";
  for (int i = 0; i < 10000 && (primary->has_work() || fallback->has_work()); ++i) step_both();
  ASSERT_FALSE(primary->has_work() || fallback->has_work());

  int to_fallback = 0;
  for (const Sent& x : sent) {
    const bool fb = x.placed.route == Route::Fallback;
    EXPECT_EQ(x.placed.engine, fb ? fallback.get() : primary.get());
    if (fb) {
      ++to_fallback;
      EXPECT_EQ(x.primary_level_at_arrival, 3) << "only a full primary sends work below";
      EXPECT_LT(x.fallback_live_at_arrival, fsc.max_num_seqs) << "the fallback had no free seat";
    } else if (x.spec.prompt.size() + x.spec.max_tokens <= 40 && x.fallback_live_at_arrival < fsc.max_num_seqs) {
      EXPECT_LT(x.primary_level_at_arrival, 3) << "a primary at level 3 kept work the fallback had room for";
    }
    EXPECT_EQ(x.out->finish, FinishReason::Length);
    EXPECT_EQ(x.out->tokens, run_alone(x.spec, kVocab).tokens);
  }
  EXPECT_GT(to_fallback, 0);
  EXPECT_LT(to_fallback, static_cast<int>(sent.size())) << "the primary took work too";
  EXPECT_EQ(router.fallback_requests(), to_fallback);
  EXPECT_EQ(router.fallback_live(), 0) << "every finishing event gave its seat back";
  const EngineStats ps = primary->stats();
  EXPECT_GT(ps.pressure_steps[3], 0);
  EXPECT_EQ(ps.pressure_no_lower_tier, 0) << "a fallback exists: level 3 has something below";
  EXPECT_EQ(ps.pressure_level, 0);
  // The load is gone: new work goes to the primary again.
  auto p = router.add_request(make_request(spec({5, 6, 7}, 3), nullptr));
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->route, Route::Primary);
  EXPECT_EQ(router.fallback_requests(), to_fallback);
  run_all(*primary);
}

// The fallback's seats are counted at routing, not from its stats (which change only when it
// steps): a burst at level 3 fills them and no more; the rest waits on the primary. A finished
// request gives its seat back, and so does one the fallback refuses.
TEST(EngineRouter, ABurstTakesOnlyTheFallbacksFreeSeats) {
  std::mt19937 g(5);
  FakeBackend pbe(8, 4, kVocab), fbe(256, 4, kVocab);
  SchedulerConfig psc;
  psc.max_num_seqs = 4;
  psc.max_num_batched_tokens = 32;
  psc.pressure.enabled = true;
  psc.pressure.has_lower_backend = true;
  psc.pressure.host_memory = [](int64_t* a, int64_t* t) {
    *a = 90;
    *t = 100;
    return true;
  };
  SchedulerConfig fsc = psc;
  fsc.max_num_seqs = 3;
  fsc.max_model_len = 30;
  auto primary = make_engine(pbe, psc, kVocab);
  auto fallback = make_engine(fbe, fsc, kVocab);
  ASSERT_TRUE(primary && fallback);
  EngineRouter router(*primary, fallback.get(), fsc.max_num_seqs);
  Collector pc, fc;
  // Fill the primary's 8 blocks (32 tokens) and step until its level shows 3.
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(router.add_request(make_request(spec(random_tokens(g, 14, kVocab), 6), &pc)).ok());
  for (int i = 0; i < 50 && primary->stats().pressure_level < 3; ++i) ASSERT_TRUE(primary->step().ok());
  ASSERT_EQ(primary->stats().pressure_level, 3);
  EXPECT_EQ(router.fallback_live(), 0);
  // Longer than the fallback's max_model_len: refused there, taken by the primary, seat given back.
  auto long_one = router.add_request(make_request(spec(random_tokens(g, 28, kVocab), 4), &pc));
  ASSERT_TRUE(long_one.ok());
  EXPECT_EQ(long_one->route, Route::Primary);
  EXPECT_EQ(router.fallback_live(), 0);
  std::vector<Route> routes;
  for (int i = 0; i < 6; ++i) {
    Collector* c = router.route() == Route::Fallback ? &fc : &pc;
    auto p = router.add_request(make_request(spec(random_tokens(g, 5, kVocab), 4), c));
    ASSERT_TRUE(p.ok());
    routes.push_back(p->route);
  }
  const std::vector<Route> want = {Route::Fallback, Route::Fallback, Route::Fallback,
                                   Route::Primary,  Route::Primary,  Route::Primary};
  EXPECT_EQ(routes, want);
  EXPECT_EQ(router.fallback_live(), 3);
  run_all(*fallback);  // its three finish: the seats come back while the primary is still full
  EXPECT_EQ(router.fallback_live(), 0);
  EXPECT_EQ(primary->stats().pressure_level, 3);
  EXPECT_EQ(router.route(), Route::Fallback);
  run_all(*primary);
  EXPECT_EQ(router.fallback_requests(), 3);
  for (const auto& [id, o] : fc.out) EXPECT_EQ(o.finish, FinishReason::Length) << id;
  for (const auto& [id, o] : pc.out) EXPECT_EQ(o.finish, FinishReason::Length) << id;
}
