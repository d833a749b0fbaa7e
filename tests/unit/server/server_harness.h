// A Server over a real engine with the fake backend (tests/unit/engine/fake_backend.h) and the small
// test tokenizer, on a free port, for the tests of this folder that speak HTTP to it.
#pragma once
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "../engine/fake_backend.h"
#include "server/server.h"
#include "test_util.h"

namespace ss::server::test_support {

struct Harness {
  std::unique_ptr<tok::Tokenizer> tok = test_support::test_tokenizer();
  std::unique_ptr<engine::testing::FakeBackend> be;
  std::unique_ptr<engine::Engine> engine;
  std::unique_ptr<Server> server;
  std::thread io;
  ModelInfo mi;
  int port = 0;
  std::atomic<int> step_delay_ms{0};

  explicit Harness(ServerOptions so = {}, engine::SchedulerConfig sc = {}, int num_blocks = 256, bool ready = true) {
    so.port = 0;
    so.handle_signals = false;
    if (so.shutdown_timeout_s == ServerOptions{}.shutdown_timeout_s) so.shutdown_timeout_s = 5;
    const int vocab = tok->vocab_size();
    be = std::make_unique<engine::testing::FakeBackend>(num_blocks, 16, vocab);
    be->on_batch = [this](const backend::StepBatch&) {
      if (int d = step_delay_ms.load()) std::this_thread::sleep_for(std::chrono::milliseconds(d));
    };
    engine::EngineConfig ec;
    ec.scheduler = sc;
    engine = std::move(engine::Engine::create(*be, ec)).value();
    EXPECT_TRUE(engine->start().ok());
    auto s = Server::create(so);
    EXPECT_TRUE(s.ok()) << (s.ok() ? "" : s.message());
    server = std::move(s).value();
    port = server->port();
    mi.id = "test-model";
    mi.max_model_len = std::min(256, num_blocks * 16);
    mi.vocab_size = vocab;
    mi.tokenizer = tok.get();
    mi.chat_template = tok->chat_template();
    mi.created = 1;
    io = std::thread([this] { (void)server->run(); });
    if (ready) set_ready();
  }
  void set_ready() { server->set_ready(*engine, mi); }
  void stop() {
    if (io.joinable()) {
      server->shutdown();
      io.join();
    }
    if (engine) engine->stop();
    engine.reset();
    server.reset();
  }
  ~Harness() { stop(); }

  HttpResult post(const std::string& target, const nlohmann::json& body, const std::vector<std::string>& headers = {}) {
    return http(port, "POST", target, body.dump(), headers);
  }
  std::string metrics() { return http(port, "GET", "/metrics").body; }
  bool wait_idle(std::chrono::milliseconds limit = std::chrono::milliseconds(3000)) {
    const auto end = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < end) {
      const auto s = engine->stats();
      if (!engine->has_work() && s.kv_blocks_used == 0) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  }
};

}  // namespace ss::server::test_support
