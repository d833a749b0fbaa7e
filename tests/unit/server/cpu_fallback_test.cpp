// The server over an EngineRouter with a CPU fallback engine beside the primary (both over the fake
// backend here). The primary is held at memory pressure level 3 by a host-memory reading of 1%, so
// every new request goes to the fallback while it has a free seat: its text is the one a server
// without a fallback gives, stop strings stop it on the engine that runs it, a client that leaves
// aborts it there, and /metrics counts it.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "server_harness.h"

using namespace ss;
using namespace ss::server;
using namespace std::chrono_literals;
using nlohmann::json;
using test_support::Harness;

namespace {

json body_json(const test_support::HttpResult& r) { return json::parse(r.body, nullptr, false); }

json greedy(int max_tokens, const std::string& prompt = "Once upon a time") {
  return json{{"model", "test-model"}, {"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0},
              {"ignore_eos", true}};
}

engine::SchedulerConfig at_level_three() {
  engine::SchedulerConfig sc;
  sc.pressure.enabled = true;
  sc.pressure.has_lower_backend = true;
  sc.pressure.host_memory = [](int64_t* a, int64_t* t) {
    *a = 1;  // 1% available: level 3 from the host signal alone
    *t = 100;
    return true;
  };
  return sc;
}

// The harness's engine is the primary; a second engine over its own fake backend is the fallback.
struct WithFallback {
  static constexpr int kSeats = 2;
  Harness h{ServerOptions{}, at_level_three(), 256, /*ready=*/false};
  std::unique_ptr<engine::testing::FakeBackend> fbe;
  std::unique_ptr<engine::Engine> fallback;
  std::unique_ptr<engine::EngineRouter> router;
  std::atomic<int> fallback_delay_ms{0};

  WithFallback() {
    fbe = std::make_unique<engine::testing::FakeBackend>(256, 16, h.tok->vocab_size());
    fbe->on_batch = [this](const backend::StepBatch&) {
      if (int d = fallback_delay_ms.load()) std::this_thread::sleep_for(std::chrono::milliseconds(d));
    };
    engine::EngineConfig ec;
    ec.scheduler.max_num_seqs = kSeats;
    fallback = std::move(engine::Engine::create(*fbe, ec)).value();
    EXPECT_TRUE(fallback->start().ok());
    router = std::make_unique<engine::EngineRouter>(*h.engine, fallback.get(), kSeats);
    // One step on the primary so its stats carry the level.
    auto q = std::make_shared<engine::EventQueue>();
    engine::Request r;
    r.prompt = {1, 2, 3};
    r.max_tokens = 1;
    r.on_event = engine::EventQueue::sink(q);
    EXPECT_TRUE(h.engine->add_request(std::move(r)).ok());
    engine::TokenEvent e;
    while (q->pop(e, 5s) && e.finish == engine::FinishReason::None) {
    }
    // The stats snapshot is taken after the step that delivered the event: wait for it.
    for (int i = 0; i < 1000 && (h.engine->has_work() || h.engine->stats().pressure_level != 3); ++i)
      std::this_thread::sleep_for(1ms);
    EXPECT_EQ(h.engine->stats().pressure_level, 3);
    h.server->set_ready(*router, h.mi);
  }
  ~WithFallback() {
    h.server->shutdown();
    if (h.io.joinable()) h.io.join();
    fallback->stop();
    fallback.reset();
    h.stop();
  }
  bool fallback_idle(std::chrono::milliseconds limit = 3000ms) {
    const auto end = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < end) {
      if (!fallback->has_work() && fallback->stats().kv_blocks_used == 0 && router->fallback_live() == 0) return true;
      std::this_thread::sleep_for(5ms);
    }
    return false;
  }
};

double metric(const std::string& text, const std::string& name) {
  const size_t at = text.find("\n" + name + " ");
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + name.size() + 2));
}

}  // namespace

TEST(CpuFallback, AtLevelThreeANewRequestRunsOnTheFallbackWithTheSameText) {
  std::string want;
  {
    Harness ref;  // no pressure, no fallback: the reference
    want = body_json(ref.post("/v1/completions", greedy(30)))["choices"][0]["text"];
  }
  WithFallback w;
  const int64_t primary_tokens = w.h.engine->stats().generation_tokens;
  const json j = body_json(w.h.post("/v1/completions", greedy(30)));
  EXPECT_EQ(j["choices"][0]["text"], want);
  EXPECT_EQ(w.h.engine->stats().generation_tokens, primary_tokens) << "the primary ran none of it";
  ASSERT_TRUE(w.fallback_idle());
  const std::string m = w.h.metrics();
  EXPECT_EQ(metric(m, "selfserve_cpu_fallback_requests_total"), 1) << m;
  EXPECT_EQ(metric(m, "selfserve_cpu_fallback_generation_tokens_total"), 30) << m;
  EXPECT_EQ(metric(m, "selfserve_memory_pressure_level"), 3) << m;
}

TEST(CpuFallback, StopStringsAndDisconnectsReachTheEngineThatRunsTheRequest) {
  std::string full;
  {
    Harness ref;
    full = body_json(ref.post("/v1/completions", greedy(30)))["choices"][0]["text"];
  }
  ASSERT_GT(full.size(), 20u);
  const std::string stop = full.substr(full.size() / 2, 3);
  WithFallback w;
  json req = greedy(30);
  req["stop"] = stop;
  const json j = body_json(w.h.post("/v1/completions", req));
  EXPECT_EQ(j["choices"][0]["text"], full.substr(0, full.find(stop)));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  ASSERT_TRUE(w.fallback_idle());
  // Stopped on the fallback: it generated fewer than the 30 tokens asked for.
  EXPECT_LT(w.fallback->stats().generation_tokens, 30);

  // A streaming client that leaves: the fallback aborts the request within a few of its steps.
  w.fallback_delay_ms = 10;
  json s = greedy(200);
  s["stream"] = true;
  const int fd = test_support::connect_to(w.h.port);
  test_support::send_all(fd, test_support::request_text("POST", "/v1/completions", s.dump()));
  std::string got;
  char buf[4096];
  while (got.find("data: ") == std::string::npos) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    ASSERT_GT(n, 0);
    got.append(buf, static_cast<size_t>(n));
  }
  EXPECT_EQ(w.router->fallback_live(), 1);
  ::close(fd);
  ASSERT_TRUE(w.fallback_idle(1500ms)) << "aborted on the fallback";
  EXPECT_LT(w.fallback->stats().generation_tokens, 30 + 150);
  const std::string m = w.h.metrics();
  EXPECT_EQ(metric(m, "selfserve_cpu_fallback_requests_total"), 2) << m;
}
