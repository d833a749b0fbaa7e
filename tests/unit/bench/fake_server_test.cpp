// End to end against a tiny fake OpenAI server on 127.0.0.1 whose delays we know: the measured
// TTFT, TPOT, e2e and throughput must match them.
#include <gtest/gtest.h>

#include <boost/asio.hpp>
#include <boost/beast.hpp>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>

#include "bench/bench.h"

namespace ss::bench {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using namespace std::chrono_literals;

struct FakeOptions {
  std::chrono::milliseconds first_token{40}, gap{15};
  int tokenize_count = 500;  // what /tokenize answers for any prompt (the probe sends 400 words)
  bool chunked = true;       // else a close-delimited body
  bool usage = true;         // send the usage chunk
  bool split_events = false; // write each event in two pieces, 1 ms apart
  int status = 200;          // non-200: a JSON error body
  std::string api_key;       // required when non-empty
  // >= 0: a request whose cache_salt came before gets its first token this soon (a prefix cache)
  std::chrono::milliseconds seen_salt_first_token{-1};
};

class FakeServer {
 public:
  explicit FakeServer(FakeOptions o) : opt_(std::move(o)), acceptor_(ioc_, {net::ip::address_v4::loopback(), 0}) {
    port_ = acceptor_.local_endpoint().port();
    net::co_spawn(ioc_, accept_loop(), net::detached);
    thread_ = std::thread([this] { ioc_.run(); });
  }
  ~FakeServer() {
    ioc_.stop();
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int completions() const { return completions_; }
  nlohmann::json last_body() const {
    std::lock_guard<std::mutex> lk(mu_);
    return last_body_;
  }
  int max_in_flight() const { return max_in_flight_; }
  std::vector<nlohmann::json> bodies() const {
    std::lock_guard<std::mutex> lk(mu_);
    return bodies_;
  }

 private:
  net::awaitable<void> accept_loop() {
    for (;;) {
      auto [ec, sock] = co_await acceptor_.async_accept(net::as_tuple(net::use_awaitable));
      if (ec) co_return;
      net::co_spawn(ioc_, session(std::move(sock)), net::detached);
    }
  }

  net::awaitable<void> write(tcp::socket& s, const std::string& bytes) {
    co_await net::async_write(s, net::buffer(bytes), net::use_awaitable);
  }
  net::awaitable<void> send_body_piece(tcp::socket& s, const std::string& piece) {
    if (!opt_.chunked) co_return co_await write(s, piece);
    char hex[32];
    std::snprintf(hex, sizeof hex, "%zx\r\n", piece.size());
    co_await write(s, hex + piece + "\r\n");
  }
  net::awaitable<void> event(tcp::socket& s, const std::string& data) {
    const std::string ev = "data: " + data + "\n\n";
    if (!opt_.split_events) co_return co_await send_body_piece(s, ev);
    net::steady_timer t(s.get_executor());
    co_await send_body_piece(s, ev.substr(0, ev.size() / 2));
    t.expires_after(1ms);
    co_await t.async_wait(net::use_awaitable);
    co_await send_body_piece(s, ev.substr(ev.size() / 2));
  }

  net::awaitable<void> session(tcp::socket sock) {
    bool counted = false;
    try {
      beast::flat_buffer buf;
      http::request<http::string_body> req;
      co_await http::async_read(sock, buf, req, net::use_awaitable);
      auto reply = [&](int status, const std::string& body) -> net::awaitable<void> {
        http::response<http::string_body> res{static_cast<http::status>(status), 11};
        res.set(http::field::content_type, "application/json");
        res.body() = body;
        res.prepare_payload();
        co_await http::async_write(sock, res, net::use_awaitable);
      };
      if (req.target() == "/v1/models") {
        co_await reply(200, R"({"object":"list","data":[{"id":"fake-model","object":"model"}]})");
      } else if (req.target() == "/tokenize") {
        co_await reply(200, R"({"count":)" + std::to_string(opt_.tokenize_count) + R"(,"max_model_len":4096,"tokens":[]})");
      } else if (!opt_.api_key.empty() && req[http::field::authorization] != "Bearer " + opt_.api_key) {
        co_await reply(401, R"({"error":{"message":"bad key","type":"invalid_request_error"}})");
      } else if (opt_.status != 200) {
        co_await reply(opt_.status, R"({"error":{"message":"nope","type":"server_error"}})");
      } else {
        const auto body = nlohmann::json::parse(req.body());
        std::chrono::milliseconds first_token = opt_.first_token;
        {
          std::lock_guard<std::mutex> lk(mu_);
          last_body_ = body;
          if (opt_.seen_salt_first_token.count() >= 0 && body.contains("cache_salt"))
            for (const auto& b : bodies_)
              if (b.contains("cache_salt") && b["cache_salt"] == body["cache_salt"]) first_token = opt_.seen_salt_first_token;
          bodies_.push_back(body);
        }
        const int n = body.at("max_tokens").get<int>();
        const bool usage = opt_.usage && body.at("stream_options").at("include_usage").get<bool>();
        ++completions_;
        const int now = ++in_flight_;
        counted = true;
        if (now > max_in_flight_) max_in_flight_ = now;
        co_await write(sock, std::string("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n") +
                                 (opt_.chunked ? "Transfer-Encoding: chunked\r\n" : "") + "Connection: close\r\n\r\n");
        net::steady_timer t(sock.get_executor());
        // An empty first chunk (as chat's role chunk) must not count as the first token.
        co_await event(sock, R"({"choices":[{"index":0,"text":""}]})");
        for (int i = 0; i < n; ++i) {
          t.expires_after(i == 0 ? first_token : opt_.gap);
          co_await t.async_wait(net::use_awaitable);
          co_await event(sock, R"({"choices":[{"index":0,"text":" tok"}]})");
        }
        if (usage) co_await event(sock, R"({"choices":[],"usage":{"prompt_tokens":77,"completion_tokens":)" +
                                            std::to_string(n) + "}}");
        co_await event(sock, "[DONE]");
        if (opt_.chunked) co_await write(sock, "0\r\n\r\n");
        --in_flight_;
        counted = false;
      }
      boost::system::error_code ec;
      sock.shutdown(tcp::socket::shutdown_send, ec);
    } catch (const std::exception&) {
      if (counted) --in_flight_;
    }
  }

  FakeOptions opt_;
  net::io_context ioc_;
  tcp::acceptor acceptor_;
  std::thread thread_;
  int port_ = 0;
  std::atomic<int> completions_{0}, in_flight_{0}, max_in_flight_{0};
  mutable std::mutex mu_;
  nlohmann::json last_body_;
  std::vector<nlohmann::json> bodies_;
};

ClientConfig client_for(const std::string& url, double timeout_s = 5) {
  ClientConfig c;
  c.url = *parse_url(url);
  c.model = "fake-model";
  c.timeout_s = timeout_s;
  return c;
}

MixConfig fixed_output(int n) {
  MixConfig m;
  m.out_min = m.out_max = n;
  m.max_context = 4096;
  return m;
}

constexpr double kMs = 1e-3;

TEST(FakeServer, ClosedLoopMatchesKnownDelays) {
  FakeServer srv({});  // first token after 40 ms, then one every 15 ms
  const auto c = client_for(srv.url());
  MixSampler sampler(fixed_output(6), 1);
  const LevelReport r = run_level(c, {4, 0, 12, 30, 0}, sampler);
  ASSERT_EQ(r.ok, 12) << (r.error_kinds.empty() ? "" : r.error_kinds.begin()->first);
  EXPECT_EQ(r.errors, 0);
  EXPECT_EQ(srv.max_in_flight(), 4);
  EXPECT_EQ(r.output_tokens, 12 * 6);
  EXPECT_EQ(r.prompt_tokens, 12 * 77);  // from usage
  for (const auto& q : r.requests) EXPECT_TRUE(q.usage_reported);
  EXPECT_GE(r.ttft.p50, 40 * kMs);
  EXPECT_LT(r.ttft.p50, 40 * kMs + 25 * kMs);
  EXPECT_GE(r.tpot.p50, 15 * kMs * 0.9);
  EXPECT_LT(r.tpot.p50, 15 * kMs + 10 * kMs);
  const double e2e = 40 * kMs + 5 * 15 * kMs;  // 115 ms
  EXPECT_GE(r.e2e.p50, e2e);
  EXPECT_LT(r.e2e.p50, e2e + 40 * kMs);
  // 12 requests, 4 at a time: 3 rounds of ~115 ms.
  EXPECT_GT(r.wall_s, 3 * e2e);
  EXPECT_LT(r.wall_s, 3 * e2e + 0.15);
  EXPECT_NEAR(r.req_per_s, 12 / r.wall_s, 1e-9);
  EXPECT_GT(r.req_per_s, 4 / (e2e + 0.05));
  EXPECT_LE(r.req_per_s, 4 / e2e);
  EXPECT_NEAR(r.out_tok_per_s, 6 * r.req_per_s, 1e-9);
}

TEST(FakeServer, ExtraBodyFieldsReachEveryRequest) {
  FakeServer srv({});
  auto c = client_for(srv.url());
  c.extra_body = {{"response_format", {{"type", "json_object"}}}, {"top_p", 0.9}, {"ignore_eos", false}};
  MixSampler sampler(fixed_output(2), 3);
  const LevelReport r = run_level(c, {1, 0, 2, 30, 0}, sampler);
  ASSERT_EQ(r.ok, 2);
  const nlohmann::json b = srv.last_body();
  EXPECT_EQ(b.at("response_format").at("type"), "json_object");
  EXPECT_EQ(b.at("top_p"), 0.9);
  EXPECT_EQ(b.at("ignore_eos"), false) << "the caller's fields win";
  EXPECT_EQ(b.at("max_tokens"), 2);
  EXPECT_TRUE(b.at("stream").get<bool>());
}

TEST(FakeServer, NoUsageCloseDelimitedSplitEvents) {
  FakeOptions o;
  o.chunked = false;
  o.usage = false;
  o.split_events = true;
  o.first_token = 20ms;
  o.gap = 10ms;
  FakeServer srv(o);
  MixSampler sampler(fixed_output(5), 2);
  const LevelReport r = run_level(client_for(srv.url()), {2, 0, 4, 30, 0}, sampler);
  ASSERT_EQ(r.ok, 4);
  for (const auto& q : r.requests) {
    EXPECT_FALSE(q.usage_reported);
    EXPECT_EQ(q.output_tokens, 5);  // counted chunks
    EXPECT_EQ(q.chunks, 5);
  }
  EXPECT_GE(r.ttft.p50, 20 * kMs);
  EXPECT_GE(r.tpot.p50, 10 * kMs * 0.9);
  EXPECT_LT(r.tpot.p50, 10 * kMs + 10 * kMs);
}

TEST(FakeServer, PoissonArrivalsAndDurationBound) {
  FakeOptions o;
  o.first_token = 5ms;
  o.gap = 2ms;
  FakeServer srv(o);
  MixSampler s1(fixed_output(3), 3);
  LevelReport r = run_level(client_for(srv.url()), {0, 50.0, 20, 30, 9}, s1);
  EXPECT_EQ(r.ok, 20);
  // 20 arrivals at 50/s take ~0.4 s (a gamma(20) spread: well within 0.1..1.5 s).
  EXPECT_GT(r.wall_s, 0.1);
  EXPECT_LT(r.wall_s, 1.5);
  double last_start = 0;
  for (const auto& q : r.requests) last_start = std::max(last_start, q.start_s);
  EXPECT_GT(last_start, 0.05);
  // The duration bound stops a level that the request count would not.
  MixSampler s2(fixed_output(3), 3);
  const auto t0 = std::chrono::steady_clock::now();
  r = run_level(client_for(srv.url()), {2, 0, 100000, 0.3, 0}, s2);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(r.wall_s, 0.3 + 0.2);
  EXPECT_LT(took, 1.0);
  EXPECT_GT(r.ok, 4);
  EXPECT_EQ(r.errors, 0);
}

TEST(FakeServer, ErrorsAreCountedByKind) {
  FakeOptions o;
  o.status = 503;
  FakeServer bad(o);
  MixSampler s(fixed_output(3), 4);
  LevelReport r = run_level(client_for(bad.url()), {2, 0, 4, 30, 0}, s);
  EXPECT_EQ(r.ok, 0);
  EXPECT_EQ(r.errors, 4);
  EXPECT_EQ(r.error_kinds["http 503"], 4);

  FakeOptions slow;
  slow.first_token = 2000ms;
  FakeServer sl(slow);
  r = run_level(client_for(sl.url(), /*timeout_s=*/0.2), {2, 0, 2, 30, 0}, s);
  EXPECT_EQ(r.error_kinds["timeout"], 2);
  EXPECT_LT(r.wall_s, 1.0);

  int closed_port;
  {
    net::io_context ioc;
    tcp::acceptor a(ioc, {net::ip::address_v4::loopback(), 0});
    closed_port = a.local_endpoint().port();
  }
  r = run_level(client_for("http://127.0.0.1:" + std::to_string(closed_port)), {1, 0, 2, 30, 0}, s);
  EXPECT_EQ(r.error_kinds["connection refused"], 2);
}

TEST(FakeServer, ApiKeyModelsAndTokenize) {
  FakeOptions o;
  o.api_key = "sekret";
  o.first_token = 1ms;
  o.gap = 1ms;
  FakeServer srv(o);
  auto c = client_for(srv.url());
  c.model.clear();
  auto m = default_model(c);
  ASSERT_TRUE(m.ok()) << m.message();
  EXPECT_EQ(*m, "fake-model");
  c.model = *m;
  auto p = probe_tokenize(c, 0);
  ASSERT_TRUE(p);
  EXPECT_DOUBLE_EQ(p->tokens_per_word, 1.25);  // 500 tokens for 400 words
  EXPECT_EQ(p->max_model_len, 4096);
  MixSampler s(fixed_output(2), 5);
  LevelReport r = run_level(c, {1, 0, 2, 30, 0}, s);
  EXPECT_EQ(r.error_kinds["http 401"], 2);
  c.api_key = "sekret";
  r = run_level(c, {1, 0, 2, 30, 0}, s);
  EXPECT_EQ(r.ok, 2);
}

// --multi-turn against a server whose prefix cache we script: a salt seen before answers in 10 ms,
// a new one in 150 ms. The returning turn extends turn 1's prompt, goes out once under the
// conversation's salt and once under a fresh one (order alternating), and each TTFT lands in its list.
TEST(FakeServer, MultiTurnReusedAndRecomputedTurns) {
  FakeOptions o;
  o.first_token = 150ms;
  o.seen_salt_first_token = 10ms;
  FakeServer srv(o);
  auto c = client_for(srv.url());
  MultiTurnConfig m;
  m.conversations = 2;
  m.history_tokens = 200;
  m.message_tokens = 10;
  m.answer_tokens = 2;
  m.idle_s = 0.05;
  const MultiTurnReport r = run_multi_turn(c, m);
  ASSERT_TRUE(r.errors.empty());
  ASSERT_EQ(r.warm_ttft_s.size(), 2u);
  ASSERT_EQ(r.cold_ttft_s.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_GE(r.warm_ttft_s[i], 10 * kMs);
    EXPECT_LT(r.warm_ttft_s[i], 100 * kMs);
    EXPECT_GE(r.cold_ttft_s[i], 150 * kMs);
  }
  const auto b = srv.bodies();
  ASSERT_EQ(b.size(), 6u);
  for (int i = 0; i < 2; ++i) {
    const auto& t1 = b[3 * i];
    const auto& first = b[3 * i + 1];
    const auto& second = b[3 * i + 2];
    const auto& warm = i % 2 == 0 ? first : second;
    const auto& cold = i % 2 == 0 ? second : first;
    EXPECT_EQ(warm.at("cache_salt"), t1.at("cache_salt"));
    EXPECT_NE(cold.at("cache_salt"), t1.at("cache_salt"));
    EXPECT_EQ(warm.at("prompt"), cold.at("prompt"));
    const std::string history = t1.at("prompt"), returning = warm.at("prompt");
    EXPECT_GT(returning.size(), history.size());
    EXPECT_EQ(returning.compare(0, history.size(), history), 0) << "the returning turn extends the history";
  }
  EXPECT_NE(b[0].at("cache_salt"), b[3].at("cache_salt"));  // conversations do not share a salt
}

// The probe keeps what a real tokenizer measures, also far from English BPE's ~1.3 tokens a word
// (a byte-level or small-vocabulary tokenizer: the random-weights models' synth tokenizer makes ~4.4),
// and refuses only answers that cannot be a count of these words' tokens.
TEST(FakeServer, TokenizeProbeTakesAnyPlausibleRatio) {
  for (auto [count, ok, ratio] : {std::tuple{1760, true, 4.4}, std::tuple{3200, true, 8.0}, std::tuple{0, false, 0.0},
                                  std::tuple{40, false, 0.0}, std::tuple{40000, false, 0.0}}) {
    FakeOptions o;
    o.tokenize_count = count;
    FakeServer srv(o);
    auto c = client_for(srv.url());
    c.model = "fake-model";
    auto p = probe_tokenize(c, 0);
    ASSERT_EQ(p.has_value(), ok) << count << " tokens";
    if (ok) {
      EXPECT_DOUBLE_EQ(p->tokens_per_word, ratio) << count << " tokens";
    }
  }
}

}  // namespace
}  // namespace ss::bench
