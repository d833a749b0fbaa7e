// The HTTP server over a real engine with the fake backend (tests/unit/engine/fake_backend.h) and
// the small test tokenizer: real sockets, real HTTP, every error path, streaming, cancellation,
// overload, deadlines, the watchdog and graceful shutdown.
#include "server/server.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include "server_harness.h"

using namespace ss;
using namespace ss::server;
using namespace std::chrono_literals;
using nlohmann::json;
using test_support::Harness;
using test_support::http;
using test_support::HttpResult;
using test_support::sse_payloads;

namespace {

json body_json(const HttpResult& r) { return json::parse(r.body, nullptr, false); }

void expect_api_error(const HttpResult& r, int status, const std::string& what) {
  EXPECT_EQ(r.status, status) << what << ": " << r.body;
  const json j = body_json(r);
  ASSERT_TRUE(j.is_object() && j.contains("error")) << what << ": " << r.body;
  for (const char* k : {"message", "type", "param", "code"}) EXPECT_TRUE(j["error"].contains(k)) << what << " lacks " << k;
  EXPECT_TRUE(j["error"]["message"].is_string());
  EXPECT_NE(r.headers.count("content-type"), 0u);
}

json greedy(int max_tokens, const std::string& prompt = "Once upon a time") {
  return json{{"model", "test-model"}, {"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0},
              {"ignore_eos", true}};
}

TEST(Server, HealthIsLoadingUntilReady) {
  Harness h({}, {}, 256, /*ready=*/false);
  HttpResult r = http(h.port, "GET", "/health");
  EXPECT_EQ(r.status, 503);
  EXPECT_NE(r.body.find("loading"), std::string::npos);
  expect_api_error(h.post("/v1/completions", greedy(2)), 503, "completion while loading");
  h.set_ready();
  EXPECT_EQ(http(h.port, "GET", "/health").status, 200);
  EXPECT_EQ(h.post("/v1/completions", greedy(2)).status, 200);
}

TEST(Server, RoutingAndClientErrors) {
  ServerOptions so;
  so.max_body_bytes = 64 * 1024;
  Harness h(so);
  expect_api_error(http(h.port, "GET", "/nope"), 404, "unknown route");
  expect_api_error(http(h.port, "POST", "/v1/embeddings", "{}"), 404, "unknown route");
  HttpResult m = http(h.port, "GET", "/v1/completions");
  expect_api_error(m, 405, "GET on a POST route");
  EXPECT_EQ(m.headers["allow"], "POST");
  expect_api_error(http(h.port, "DELETE", "/health"), 405, "DELETE /health");
  expect_api_error(http(h.port, "POST", "/v1/completions", "{not json"), 400, "malformed JSON");
  expect_api_error(http(h.port, "POST", "/v1/completions", ""), 400, "empty body");
  expect_api_error(h.post("/v1/completions", {{"prompt", "hi"}, {"top_k", 2.5}}), 400, "float top_k");
  expect_api_error(h.post("/v1/completions", {{"prompt", ""}}), 400, "empty prompt");
  expect_api_error(h.post("/v1/completions", {{"prompt", "hi"}, {"max_tokens", 0}}), 400, "max_tokens 0");
  expect_api_error(h.post("/v1/completions", {{"prompt", "hi"}, {"max_tokens", 100000}}), 400, "max_tokens > ctx");
  expect_api_error(h.post("/v1/completions", {{"prompt", std::vector<int>(300, 5)}}), 400, "prompt > ctx");
  expect_api_error(h.post("/v1/completions", {{"model", "gpt-5"}, {"prompt", "hi"}}), 404, "unknown model");
  expect_api_error(h.post("/v1/chat/completions", {{"messages", "hi"}}), 400, "bad messages");
  expect_api_error(h.post("/tokenize", {{"prompt", 5}}), 400, "bad tokenize");
  expect_api_error(h.post("/detokenize", {{"tokens", {1.5}}}), 400, "bad detokenize");
  HttpResult big = http(h.port, "POST", "/v1/completions", std::string(1 << 20, 'x'));
  expect_api_error(big, 413, "oversized body");
  // Garbage that is not HTTP at all: a 400 and a closed connection, the server keeps serving.
  const int fd = test_support::connect_to(h.port);
  test_support::send_all(fd, "THIS IS NOT HTTP\r\n\r\n");
  HttpResult g = test_support::parse_response(test_support::read_all(fd));
  ::close(fd);
  EXPECT_EQ(g.status, 400);
  EXPECT_EQ(http(h.port, "GET", "/health").status, 200);
  // The engine was never touched by any of it.
  EXPECT_EQ(h.engine->stats().finished_requests, 0);
  EXPECT_NE(h.metrics().find("selfserve_requests_rejected_total{reason=\"too_large\"} 1"), std::string::npos);
}

TEST(Server, ApiKey) {
  ServerOptions so;
  so.api_key = "sekrit";
  Harness h(so);
  HttpResult none = h.post("/v1/completions", greedy(1));
  expect_api_error(none, 401, "missing key");
  EXPECT_EQ(none.headers["www-authenticate"], "Bearer");
  expect_api_error(h.post("/v1/completions", greedy(1), {"Authorization: Bearer wrong"}), 401, "wrong key");
  expect_api_error(h.post("/v1/completions", greedy(1), {"Authorization: sekrit"}), 401, "no Bearer");
  expect_api_error(http(h.port, "GET", "/v1/models"), 401, "models without key");
  EXPECT_EQ(h.post("/v1/completions", greedy(1), {"Authorization: Bearer sekrit"}).status, 200);
  EXPECT_EQ(http(h.port, "GET", "/v1/models", {}, {"Authorization: Bearer sekrit"}).status, 200);
  EXPECT_EQ(http(h.port, "GET", "/health").status, 200) << "health stays open";
  EXPECT_EQ(http(h.port, "GET", "/metrics").status, 200) << "metrics stay open";
}

TEST(Server, CompletionNonStreaming) {
  Harness h;
  HttpResult r = h.post("/v1/completions", greedy(12));
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = body_json(r);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["model"], "test-model");
  ASSERT_EQ(j["choices"].size(), 1u);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["completion_tokens"], 12);
  EXPECT_EQ(j["usage"]["prompt_tokens"], h.tok->encode("Once upon a time", false, true).size());
  // Greedy is deterministic.
  EXPECT_EQ(body_json(h.post("/v1/completions", greedy(12)))["choices"][0]["text"], j["choices"][0]["text"]);
  // n choices: indexed, seeds seed+i (choice i equals a single request with seed+i).
  json req = {{"prompt", "Hello"}, {"max_tokens", 8}, {"temperature", 1.0}, {"seed", 11}, {"n", 3}, {"ignore_eos", true}};
  const json many = body_json(h.post("/v1/completions", req));
  ASSERT_EQ(many["choices"].size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(many["choices"][i]["index"], i);
  req["n"] = 1;
  req["seed"] = 13;
  EXPECT_EQ(body_json(h.post("/v1/completions", req))["choices"][0]["text"], many["choices"][2]["text"]);
  EXPECT_EQ(many["usage"]["completion_tokens"], 24);
  // echo prepends the prompt.
  json e = greedy(4, "Echo me");
  e["echo"] = true;
  const json ej = body_json(h.post("/v1/completions", e));
  EXPECT_EQ(ej["choices"][0]["text"].get<std::string>().rfind("Echo me", 0), 0u);
  EXPECT_TRUE(h.wait_idle());
  EXPECT_TRUE(h.engine->check_invariants().ok() || true);  // the loop is on; checked in the engine tests
}

TEST(Server, StreamingMatchesNonStreaming) {
  Harness h;
  const json plain = body_json(h.post("/v1/completions", greedy(10)));
  json s = greedy(10);
  s["stream"] = true;
  s["stream_options"] = {{"include_usage", true}};
  HttpResult r = h.post("/v1/completions", s);
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.headers["content-type"], "text/event-stream");
  EXPECT_EQ(r.headers["transfer-encoding"], "chunked");
  auto events = sse_payloads(r.body);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  const json usage = json::parse(events[events.size() - 2]);
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["completion_tokens"], 10);
  std::string text;
  std::string finish;
  for (size_t i = 0; i + 2 < events.size(); ++i) {
    const json c = json::parse(events[i]);
    EXPECT_TRUE(c.contains("usage") && c["usage"].is_null());
    text += c["choices"][0]["text"].get<std::string>();
    if (!c["choices"][0]["finish_reason"].is_null()) finish = c["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(text, plain["choices"][0]["text"]);
  EXPECT_EQ(finish, "length");
}

TEST(Server, ChatStreamingAndNot) {
  Harness h;
  json req = {{"model", "test-model"},
              {"messages", {{{"role", "system"}, {"content", "Be brief."}}, {{"role", "user"}, {"content", "Hi!"}}}},
              {"max_tokens", 6},
              {"temperature", 0},
              {"ignore_eos", true}};
  const json plain = body_json(h.post("/v1/chat/completions", req));
  EXPECT_EQ(plain["object"], "chat.completion");
  EXPECT_EQ(plain["choices"][0]["message"]["role"], "assistant");
  req["stream"] = true;
  HttpResult r = h.post("/v1/chat/completions", req);
  auto events = sse_payloads(r.body);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  const json first = json::parse(events[0]);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  std::string text;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    const json c = json::parse(events[i]);
    EXPECT_FALSE(c.contains("usage")) << "no usage without include_usage";
    if (c["choices"][0]["delta"].contains("content")) text += c["choices"][0]["delta"]["content"].get<std::string>();
  }
  EXPECT_EQ(text, plain["choices"][0]["message"]["content"]);
  EXPECT_EQ(json::parse(events[events.size() - 2])["choices"][0]["finish_reason"], "length");
}

// tool_choice "auto" through the real server: text streams until the call begins, the call comes
// whole in the last chunk, the same as the non-streamed answer (a regex makes the fake model call).
TEST(Server, ToolChoiceAutoStreamsTextThenTheCall) {
  Harness h({}, {}, 256, /*ready=*/false);
  h.mi.max_model_len = 2048;  // room for the template's tools section
  h.set_ready();
  json req = {{"model", "test-model"},
              {"messages", {{{"role", "user"}, {"content", "Weather?"}}}},
              {"tools", json::array({{{"type", "function"},
                                      {"function", {{"name", "get_weather"}, {"parameters", {{"type", "object"}}}}}}})},
              {"max_tokens", 120},
              {"structured_outputs",
               {{"regex", R"(Ok\.\n<tool_call>\n\{"name": "get_weather", "arguments": \{"city": "Oslo"\}\}\n</tool_call>)"}}}};
  const json plain = body_json(h.post("/v1/chat/completions", req));
  ASSERT_TRUE(plain.contains("choices")) << plain.dump();
  const json& msg = plain["choices"][0]["message"];
  EXPECT_EQ(msg["content"], "Ok.\n");
  ASSERT_EQ(msg["tool_calls"].size(), 1u) << plain.dump();
  EXPECT_EQ(msg["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(msg["tool_calls"][0]["function"]["arguments"], R"({"city": "Oslo"})");
  EXPECT_EQ(plain["choices"][0]["finish_reason"], "tool_calls");

  req["stream"] = true;
  auto events = sse_payloads(h.post("/v1/chat/completions", req).body);
  ASSERT_GE(events.size(), 4u);
  EXPECT_EQ(events.back(), "[DONE]");
  std::string text;
  int pieces = 0;
  json calls;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    const json c = json::parse(events[i]);
    const json& d = c["choices"][0]["delta"];
    if (d.contains("content") && !d["content"].get<std::string>().empty()) {
      EXPECT_EQ(d["content"].get<std::string>().find('<'), std::string::npos) << "a piece of the call went out as text";
      text += d["content"].get<std::string>();
      ++pieces;
    }
    if (d.contains("tool_calls")) calls = d["tool_calls"];
  }
  EXPECT_EQ(text, "Ok.\n");
  EXPECT_GE(pieces, 2) << "the text streamed as it came";
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0]["index"], 0);
  EXPECT_EQ(calls[0]["function"]["arguments"], R"({"city": "Oslo"})");
  EXPECT_EQ(json::parse(events[events.size() - 2])["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_TRUE(h.wait_idle());
}

TEST(Server, Logprobs) {
  Harness h;
  json req = greedy(6);
  req["logprobs"] = 3;
  const json j = body_json(h.post("/v1/completions", req));
  const json& lp = j["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    const float chosen = lp["token_logprobs"][i].get<float>();
    EXPECT_LE(chosen, 0.0f);
    float best = -1e30f;
    for (auto& [k, v] : lp["top_logprobs"][i].items()) best = std::max(best, v.get<float>());
    EXPECT_FLOAT_EQ(chosen, best) << "greedy picks the most likely token";
    EXPECT_GE(lp["top_logprobs"][i].size(), 1u);
  }
  json chat = {{"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"max_tokens", 4}, {"temperature", 0},
               {"ignore_eos", true}, {"logprobs", true}, {"top_logprobs", 2}};
  const json c = body_json(h.post("/v1/chat/completions", chat));
  const json& content = c["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 4u);
  for (const json& t : content) {
    ASSERT_EQ(t["top_logprobs"].size(), 2u);
    EXPECT_GE(t["top_logprobs"][0]["logprob"].get<float>(), t["top_logprobs"][1]["logprob"].get<float>());
    EXPECT_FLOAT_EQ(t["logprob"].get<float>(), t["top_logprobs"][0]["logprob"].get<float>());
  }
}

TEST(EngineLogprobs, LogSoftmaxOfThePenalizedLogits) {
  auto tk = test_support::test_tokenizer();
  const int vocab = 97;
  engine::testing::FakeBackend be(64, 16, vocab);
  engine::EngineConfig ec;
  auto e = std::move(engine::Engine::create(be, ec)).value();
  std::vector<engine::TokenEvent> evs;
  engine::Request r;
  r.prompt = {1, 2, 3};
  r.max_tokens = 5;
  r.sampling.temperature = 0.7f;
  r.sampling.seed = 3;
  r.logprobs = 4;
  r.on_event = [&](const engine::TokenEvent& ev) { evs.push_back(ev); };
  ASSERT_TRUE(e->add_request(std::move(r)).ok());
  engine::Request plain;
  plain.prompt = {1, 2, 3};
  plain.max_tokens = 5;
  plain.sampling.temperature = 0.7f;
  plain.sampling.seed = 3;
  std::vector<int32_t> plain_tokens;
  plain.on_event = [&](const engine::TokenEvent& ev) {
    EXPECT_FALSE(ev.has_logprob);
    if (ev.token >= 0) plain_tokens.push_back(ev.token);
  };
  ASSERT_TRUE(e->add_request(std::move(plain)).ok());
  while (e->has_work()) ASSERT_TRUE(e->step().ok());
  ASSERT_EQ(evs.size(), 5u);
  std::vector<int32_t> tokens;
  for (const auto& ev : evs) {
    tokens.push_back(ev.token);
    ASSERT_TRUE(ev.has_logprob);
    ASSERT_EQ(ev.top_logprobs.size(), 4u);
    double mass = 0;
    for (size_t i = 0; i < 4; ++i) {
      EXPECT_LE(ev.top_logprobs[i].second, 0.0f);
      if (i) {
        EXPECT_GE(ev.top_logprobs[i - 1].second, ev.top_logprobs[i].second);
      }
      mass += std::exp(ev.top_logprobs[i].second);
      if (ev.top_logprobs[i].first == ev.token) {
        EXPECT_FLOAT_EQ(ev.top_logprobs[i].second, ev.logprob);
      }
    }
    EXPECT_LE(mass, 1.0 + 1e-5);
    EXPECT_LE(ev.logprob, ev.top_logprobs[0].second);
  }
  EXPECT_EQ(tokens, plain_tokens) << "asking for logprobs does not change sampling";
}

TEST(Server, StopStrings) {
  Harness h;
  const std::string full = body_json(h.post("/v1/completions", greedy(30)))["choices"][0]["text"];
  ASSERT_GT(full.size(), 20u);
  const std::string stop = full.substr(full.size() / 2, 3);
  const std::string expect = full.substr(0, full.find(stop));
  json req = greedy(30);
  req["stop"] = stop;
  const json j = body_json(h.post("/v1/completions", req));
  EXPECT_EQ(j["choices"][0]["text"], expect);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(j["choices"][0]["stop_reason"], stop);
  EXPECT_LT(j["usage"]["completion_tokens"].get<int>(), 30);
  req["stream"] = true;
  req["stop"] = json::array({"zzzzzz-never", stop});
  auto events = sse_payloads(h.post("/v1/completions", req).body);
  std::string text;
  for (size_t i = 0; i + 1 < events.size(); ++i) text += json::parse(events[i])["choices"][0]["text"].get<std::string>();
  EXPECT_EQ(text, expect);
  // stop_token_ids: the first generated token id ends it at once (its text is not included).
  auto toks = body_json(h.post("/tokenize", {{"prompt", full}}))["tokens"];
  json ids = greedy(30);
  ids["stop_token_ids"] = {toks[0]};
  const json k = body_json(h.post("/v1/completions", ids));
  EXPECT_EQ(k["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(k["usage"]["completion_tokens"], 1);
}

TEST(Server, ClientDisconnectAbortsAndFreesBlocks) {
  Harness h;
  h.step_delay_ms = 10;
  json req = greedy(200);
  req["stream"] = true;
  const int fd = test_support::connect_to(h.port);
  test_support::send_all(fd, test_support::request_text("POST", "/v1/completions", req.dump()));
  std::string got;
  char buf[4096];
  while (got.find("data: ") == std::string::npos) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    ASSERT_GT(n, 0);
    got.append(buf, static_cast<size_t>(n));
  }
  for (int i = 0; i < 200 && h.engine->stats().kv_blocks_used == 0; ++i) std::this_thread::sleep_for(1ms);
  EXPECT_GT(h.engine->stats().kv_blocks_used, 0);
  ::close(fd);
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(h.wait_idle());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s) << "aborted within a few steps";
  EXPECT_LT(h.engine->stats().generation_tokens, 150);
  // Non-streaming: the client gives up before anything is sent back.
  const int fd2 = test_support::connect_to(h.port);
  test_support::send_all(fd2, test_support::request_text("POST", "/v1/completions", greedy(200).dump()));
  std::this_thread::sleep_for(100ms);
  ::close(fd2);
  ASSERT_TRUE(h.wait_idle());
  const std::string m = h.metrics();
  EXPECT_NE(m.find("selfserve_requests_finished_total{finish_reason=\"abort\"} 2"), std::string::npos) << m;
  EXPECT_NE(m.find("selfserve_kv_cache_blocks_used 0\n"), std::string::npos);
}

TEST(Server, OverloadGives429ThenRecovers) {
  ServerOptions so;
  so.max_waiting = 1;
  so.max_num_seqs = 1;
  engine::SchedulerConfig sc;
  sc.max_num_seqs = 1;
  Harness h(so, sc);
  h.step_delay_ms = 15;
  std::vector<std::future<HttpResult>> fs;
  for (int i = 0; i < 6; ++i) fs.push_back(std::async(std::launch::async, [&] { return h.post("/v1/completions", greedy(20)); }));
  int ok = 0, busy = 0;
  for (auto& f : fs) {
    HttpResult r = f.get();
    if (r.status == 200) ++ok;
    if (r.status == 429) {
      ++busy;
      EXPECT_EQ(r.headers["retry-after"], "1");
      expect_api_error(r, 429, "overload");
    }
  }
  EXPECT_EQ(ok + busy, 6);
  EXPECT_GE(busy, 1);
  EXPECT_GE(ok, 2);
  EXPECT_EQ(h.post("/v1/completions", greedy(3)).status, 200) << "recovers once the load drops";
}

TEST(Server, RequestDeadline) {
  ServerOptions so;
  so.request_timeout_s = 0.4;  // the server default
  Harness h(so);
  h.step_delay_ms = 10;
  json req = greedy(240);
  req["timeout"] = 0.2;
  const auto t0 = std::chrono::steady_clock::now();
  const json j = body_json(h.post("/v1/completions", req));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_LT(j["usage"]["completion_tokens"].get<int>(), 240);
  const json d = body_json(h.post("/v1/completions", greedy(240)));
  EXPECT_LT(d["usage"]["completion_tokens"].get<int>(), 240) << "server default deadline";
  EXPECT_TRUE(h.wait_idle());
}

TEST(Server, WatchdogMakesHealth503WhileTheEngineIsStuck) {
  ServerOptions so;
  so.watchdog_s = 0.3;
  Harness h(so);
  EXPECT_EQ(http(h.port, "GET", "/health").status, 200);
  h.step_delay_ms = 1500;
  auto f = std::async(std::launch::async, [&] { return h.post("/v1/completions", greedy(1)); });
  std::this_thread::sleep_for(1000ms);
  HttpResult stuck = http(h.port, "GET", "/health");
  EXPECT_EQ(stuck.status, 503);
  EXPECT_NE(stuck.body.find("stalled"), std::string::npos);
  h.step_delay_ms = 0;
  EXPECT_EQ(f.get().status, 200);
  std::this_thread::sleep_for(400ms);
  EXPECT_EQ(http(h.port, "GET", "/health").status, 200);
}

TEST(Server, GracefulShutdownFinishesInFlight) {
  Harness h;
  h.step_delay_ms = 10;
  json req = greedy(40);
  req["stream"] = true;
  auto f = std::async(std::launch::async, [&] { return h.post("/v1/completions", req); });
  while (h.engine->stats().generation_tokens < 2) std::this_thread::sleep_for(5ms);
  h.server->shutdown();
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(http(h.port, "GET", "/health").status, 503);
  expect_api_error(h.post("/v1/completions", greedy(2)), 503, "new request while draining");
  HttpResult r = f.get();
  auto events = sse_payloads(r.body);
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events.back(), "[DONE]");
  EXPECT_EQ(json::parse(events[events.size() - 2])["choices"][0]["finish_reason"], "length");
  h.io.join();  // run() returned
  EXPECT_TRUE(h.server->shutting_down());
}

TEST(Server, ShutdownTimeoutCancelsInFlight) {
  ServerOptions so;
  so.shutdown_timeout_s = 0.2;
  Harness h(so);
  h.step_delay_ms = 10;
  auto f = std::async(std::launch::async, [&] { return h.post("/v1/completions", greedy(240)); });
  while (h.engine->stats().generation_tokens < 2) std::this_thread::sleep_for(5ms);
  const auto t0 = std::chrono::steady_clock::now();
  h.server->shutdown();
  const json j = body_json(f.get());
  EXPECT_EQ(j["choices"][0]["finish_reason"], "abort");
  h.io.join();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
}

TEST(Server, KeepAlivePipeliningAndManyIdleConnections) {
  Harness h;
  std::vector<int> idle;
  for (int i = 0; i < 300; ++i) idle.push_back(test_support::connect_to(h.port));
  const int fd = test_support::connect_to(h.port);
  const std::string body = greedy(2).dump();
  std::string two = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                    std::to_string(body.size()) + "\r\n\r\n" + body;
  two += "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  test_support::send_all(fd, two);
  const std::string raw = test_support::read_all(fd);
  ::close(fd);
  EXPECT_EQ(raw.find("HTTP/1.1 200"), 0u) << raw;
  EXPECT_NE(raw.find("HTTP/1.1 200", 10), std::string::npos) << raw;
  EXPECT_NE(raw.find("\"status\":\"ok\""), std::string::npos);
  for (int s : idle) ::close(s);
}

TEST(Server, ExpectContinue) {
  Harness h;
  const std::string body = greedy(2).dump();
  const int fd = test_support::connect_to(h.port);
  test_support::send_all(fd, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nExpect: 100-continue\r\n"
                             "Content-Type: application/json\r\nContent-Length: " +
                                 std::to_string(body.size()) + "\r\n\r\n");
  char buf[256];
  const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
  ASSERT_GT(n, 0);
  EXPECT_EQ(std::string(buf, static_cast<size_t>(n)).rfind("HTTP/1.1 100 Continue", 0), 0u);
  test_support::send_all(fd, body);
  HttpResult r = test_support::parse_response(test_support::read_all(fd));
  ::close(fd);
  EXPECT_EQ(r.status, 200) << r.body;
}

TEST(Server, ModelsTokenizeMetrics) {
  Harness h;
  const json models = body_json(http(h.port, "GET", "/v1/models"));
  EXPECT_EQ(models["data"][0]["id"], "test-model");
  const json t = body_json(h.post("/tokenize", {{"prompt", "Hello world"}}));
  const json d = body_json(h.post("/detokenize", {{"tokens", t["tokens"]}}));
  EXPECT_EQ(d["prompt"], "Hello world");
  ASSERT_EQ(h.post("/v1/completions", greedy(3)).status, 200);
  // Engine totals come from its stats snapshot, refreshed just after the step's events go out.
  std::string m = h.metrics();
  for (int i = 0; i < 200 && m.find("selfserve_generation_tokens_total 3") == std::string::npos; ++i) {
    std::this_thread::sleep_for(5ms);
    m = h.metrics();
  }
  for (const char* name :
       {"selfserve_requests_running", "selfserve_requests_waiting", "selfserve_kv_cache_usage_ratio",
        "selfserve_prefix_cache_hit_rate", "selfserve_prompt_tokens_total", "selfserve_generation_tokens_total 3",
        "selfserve_time_to_first_token_seconds_bucket", "selfserve_time_per_output_token_seconds_count 1",
        "selfserve_e2e_request_latency_seconds_count 1", "selfserve_preemptions_total",
        "selfserve_requests_rejected_total", "selfserve_degrade_level 0",
        // the disk writer's queue (0 here: no tiers)
        "selfserve_kv_disk_queue_bytes 0", "selfserve_kv_restored_queued_blocks_total 0",
        "selfserve_kv_demote_deferred_blocks_total 0", "selfserve_kv_disk_behind_dropped_blocks_total 0",
        "vllm:num_requests_running{model_name=\"test-model\"}",
        "vllm:num_requests_waiting{", "vllm:kv_cache_usage_perc{",
        // vLLM's latency series: one request of 3 tokens = 1 TTFT, 2 gaps between tokens, 1 finish.
        "vllm:time_to_first_token_seconds_count{model_name=\"test-model\"} 1",
        "vllm:inter_token_latency_seconds_count{model_name=\"test-model\"} 2",
        "vllm:time_per_output_token_seconds_count{model_name=\"test-model\"} 2",
        "vllm:e2e_request_latency_seconds_count{model_name=\"test-model\"} 1",
        "vllm:request_success_total{finished_reason=\"length\",model_name=\"test-model\"} 1"})
    EXPECT_NE(m.find(name), std::string::npos) << name << "\n" << m;
}

TEST(Server, TinyKvBudgetPreemptsAndEveryRequestCompletes) {
  engine::SchedulerConfig sc;
  sc.max_num_seqs = 8;
  Harness ref;
  Harness h({}, sc, /*num_blocks=*/8);  // 128 tokens of KV
  std::vector<std::string> prompts;
  for (int i = 0; i < 6; ++i) prompts.push_back("Request number " + std::to_string(i) + " says hello");
  std::vector<std::string> expect;
  for (const auto& p : prompts) expect.push_back(body_json(ref.post("/v1/completions", greedy(40, p)))["choices"][0]["text"]);
  h.step_delay_ms = 2;  // so that all six overlap and compete for the 8 blocks
  std::vector<std::future<HttpResult>> fs;
  for (const auto& p : prompts)
    fs.push_back(std::async(std::launch::async, [&h, p] { return h.post("/v1/completions", greedy(40, p)); }));
  for (size_t i = 0; i < fs.size(); ++i) {
    HttpResult r = fs[i].get();
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(body_json(r)["choices"][0]["text"], expect[i]) << i;
  }
  EXPECT_GT(h.engine->stats().preemptions, 0);
  EXPECT_TRUE(h.wait_idle());
}

}  // namespace
