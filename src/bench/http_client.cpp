// The network half of the load generator: streaming completions over Boost.Beast, one coroutine
// per client on a single io_context (timestamps are taken as bytes arrive, on that one thread).
#include <boost/asio.hpp>
#include <boost/beast.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>
#include <memory>
#include <thread>

#include "bench/bench.h"

namespace ss::bench {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;
using net::awaitable;
using net::use_awaitable;

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

void set_common_headers(http::request<http::string_body>& req, const ClientConfig& c) {
  req.set(http::field::host, c.url.host + ":" + c.url.port);
  req.set(http::field::user_agent, "selfserve-bench");
  if (!c.api_key.empty()) req.set(http::field::authorization, "Bearer " + c.api_key);
}

std::string error_text(const boost::system::error_code& ec) {
  if (ec == beast::error::timeout) return "timeout";
  if (ec == net::error::connection_refused) return "connection refused";
  if (ec == http::error::end_of_stream || ec == net::error::eof || ec == net::error::connection_reset ||
      ec == http::error::partial_message)
    return "connection closed";
  return "network: " + ec.message();
}

// One streaming completion. Never throws; the outcome is in `out`.
awaitable<void> stream_one(const ClientConfig& c, tcp::resolver::results_type eps, RequestSpec spec,
                           Clock::time_point level_start, RequestResult& out) {
  const auto t0 = Clock::now();
  out.start_s = seconds(t0 - level_start);
  out.prompt_tokens = spec.prompt_tokens;
  const auto deadline = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(c.timeout_s));
  beast::tcp_stream stream(co_await net::this_coro::executor);
  try {
    nlohmann::json body = {{"model", c.model},
                           {"prompt", spec.prompt},
                           {"max_tokens", spec.max_tokens},
                           {"stream", true},
                           {"stream_options", {{"include_usage", true}}}};
    if (c.ignore_eos) body["ignore_eos"] = true;
    body.update(c.extra_body);  // e.g. a response_format, top_p: the caller's fields win
    http::request<http::string_body> req{http::verb::post, c.url.base_path + "/v1/completions", 11};
    set_common_headers(req, c);
    req.set(http::field::content_type, "application/json");
    req.set(http::field::accept, "text/event-stream");
    req.body() = body.dump();
    req.prepare_payload();

    stream.expires_at(deadline);
    co_await stream.async_connect(eps, use_awaitable);
    stream.expires_at(deadline);
    co_await http::async_write(stream, req, use_awaitable);

    beast::flat_buffer buf;
    http::response_parser<http::buffer_body> p;
    p.body_limit(boost::none);
    stream.expires_at(deadline);
    co_await http::async_read_header(stream, buf, p, use_awaitable);
    out.http_status = static_cast<int>(p.get().result_int());

    Clock::time_point now = Clock::now();
    bool done = false;
    std::optional<std::string> stream_error;
    std::string error_body;
    SseParser sse([&](std::string_view data) {
      if (done || stream_error) return;
      ChunkInfo ch = parse_chunk(data);
      if (ch.error) {
        stream_error = *ch.error;
        return;
      }
      if (ch.done) {
        done = true;
        return;
      }
      if (!ch.text.empty()) {
        if (out.chunks == 0) out.ttft_s = seconds(now - t0);
        ++out.chunks;
      }
      if (ch.completion_tokens) {
        out.usage_reported = true;
        out.output_tokens = *ch.completion_tokens;
      }
      if (ch.prompt_tokens) out.prompt_tokens = *ch.prompt_tokens;
    });
    const bool streaming = out.http_status == 200;
    char tmp[16384];
    while (!p.is_done()) {
      p.get().body().data = tmp;
      p.get().body().size = sizeof tmp;
      stream.expires_at(deadline);
      auto [ec, n] = co_await http::async_read_some(stream, buf, p, net::as_tuple(use_awaitable));
      (void)n;
      if (ec == http::error::need_buffer) ec = {};
      now = Clock::now();
      const size_t got = sizeof tmp - p.get().body().size;
      if (streaming)
        sse.feed(std::string_view(tmp, got));
      else if (error_body.size() < 4096)
        error_body.append(tmp, std::min(got, 4096 - error_body.size()));
      if (ec) throw boost::system::system_error(ec);
      if (done || stream_error) break;  // [DONE] is the end; do not wait for the server's close
    }
    if (streaming && !done && !stream_error) sse.finish();
    out.e2e_s = seconds(now - t0);
    if (!streaming) {
      out.error = "http " + std::to_string(out.http_status);
    } else if (stream_error) {
      out.error = "stream error";
    } else if (!done) {
      out.error = "no [DONE]";
    } else {
      out.ok = true;
      if (!out.usage_reported) out.output_tokens = out.chunks;
      if (out.chunks == 0) out.ttft_s = out.e2e_s;
    }
  } catch (const boost::system::system_error& e) {
    out.ok = false;
    out.error = error_text(e.code());
    out.e2e_s = seconds(Clock::now() - t0);
  } catch (const std::exception& e) {
    out.ok = false;
    out.error = std::string("client: ") + e.what();
    out.e2e_s = seconds(Clock::now() - t0);
  }
  boost::system::error_code ignored;
  stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
  stream.socket().close(ignored);
}

awaitable<void> simple_request(const ClientConfig& c, tcp::resolver::results_type eps,
                               http::request<http::string_body> req, Expected<HttpReply>& out) {
  beast::tcp_stream stream(co_await net::this_coro::executor);
  try {
    stream.expires_after(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(c.timeout_s)));
    co_await stream.async_connect(eps, use_awaitable);
    co_await http::async_write(stream, req, use_awaitable);
    beast::flat_buffer buf;
    http::response_parser<http::string_body> p;
    p.body_limit(8u << 20);
    co_await http::async_read(stream, buf, p, use_awaitable);
    out = HttpReply{static_cast<int>(p.get().result_int()), std::move(p.get().body())};
  } catch (const boost::system::system_error& e) {
    out = make_error(c.url.host + ":" + c.url.port + ": " + error_text(e.code()));
  }
  boost::system::error_code ignored;
  stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
}

Expected<tcp::resolver::results_type> resolve(net::io_context& ioc, const Url& u) {
  tcp::resolver r(ioc);
  boost::system::error_code ec;
  auto eps = r.resolve(u.host, u.port, ec);
  if (ec) return make_error("cannot resolve " + u.host + ":" + u.port + ": " + ec.message());
  return eps;
}

Expected<HttpReply> do_simple(const ClientConfig& c, http::request<http::string_body> req) {
  net::io_context ioc;
  SS_ASSIGN(auto eps, resolve(ioc, c.url));
  set_common_headers(req, c);
  req.prepare_payload();
  Expected<HttpReply> out = make_error("no reply");
  net::co_spawn(ioc, simple_request(c, eps, std::move(req), out), net::detached);
  ioc.run();
  return out;
}

}  // namespace

Expected<Url> parse_url(const std::string& url) {
  constexpr std::string_view kHttp = "http://";
  if (url.rfind(kHttp, 0) != 0) return make_error("--url " + url + ": only http:// URLs are supported");
  std::string rest = url.substr(kHttp.size());
  Url u;
  const size_t slash = rest.find('/');
  std::string hostport = rest.substr(0, slash);
  u.base_path = slash == std::string::npos ? "" : rest.substr(slash);
  while (!u.base_path.empty() && u.base_path.back() == '/') u.base_path.pop_back();
  // The OpenAI convention is a base URL ending in /v1; we add /v1/... ourselves.
  if (u.base_path.size() >= 3 && u.base_path.compare(u.base_path.size() - 3, 3, "/v1") == 0)
    u.base_path.resize(u.base_path.size() - 3);
  if (!hostport.empty() && hostport.front() == '[') {  // [::1]:8000
    const size_t close = hostport.find(']');
    if (close == std::string::npos) return make_error("--url " + url + ": unterminated IPv6 address");
    u.host = hostport.substr(1, close - 1);
    u.port = close + 1 < hostport.size() && hostport[close + 1] == ':' ? hostport.substr(close + 2) : "80";
  } else {
    const size_t colon = hostport.rfind(':');
    u.host = hostport.substr(0, colon);
    u.port = colon == std::string::npos ? "80" : hostport.substr(colon + 1);
  }
  if (u.host.empty() || u.port.empty() || u.port.find_first_not_of("0123456789") != std::string::npos)
    return make_error("--url " + url + ": expected http://HOST[:PORT][/PATH]");
  return u;
}

Expected<HttpReply> http_get(const ClientConfig& c, const std::string& path) {
  http::request<http::string_body> req{http::verb::get, c.url.base_path + path, 11};
  return do_simple(c, std::move(req));
}

Expected<HttpReply> http_post_json(const ClientConfig& c, const std::string& path, const std::string& body) {
  http::request<http::string_body> req{http::verb::post, c.url.base_path + path, 11};
  req.set(http::field::content_type, "application/json");
  req.body() = body;
  return do_simple(c, std::move(req));
}

Expected<std::string> default_model(const ClientConfig& c) {
  SS_ASSIGN(auto r, http_get(c, "/v1/models"));
  if (r.status != 200) return make_error("GET /v1/models: HTTP " + std::to_string(r.status) + ": " + r.body.substr(0, 200));
  const auto j = nlohmann::json::parse(r.body, nullptr, false);
  if (j.is_object() && j.contains("data") && j["data"].is_array() && !j["data"].empty() &&
      j["data"][0].is_object() && j["data"][0].contains("id") && j["data"][0]["id"].is_string())
    return j["data"][0]["id"].get<std::string>();
  return make_error("GET /v1/models: no model listed; pass --model");
}

std::optional<TokenizeProbe> probe_tokenize(const ClientConfig& c, uint64_t seed) {
  constexpr int kWordsN = 400;
  std::mt19937_64 rng(seed ^ 0x9e3779b97f4a7c15ull);
  const nlohmann::json body = {{"model", c.model}, {"prompt", MixSampler::words(rng, kWordsN)}};
  auto r = http_post_json(c, "/tokenize", body.dump());
  if (!r.ok() || r->status != 200) return std::nullopt;
  const auto j = nlohmann::json::parse(r->body, nullptr, false);
  double n = 0;
  if (j.is_object() && j.contains("count") && j["count"].is_number())
    n = j["count"].get<double>();
  else if (j.is_object() && j.contains("tokens") && j["tokens"].is_array())
    n = static_cast<double>(j["tokens"].size());
  const double ratio = n / kWordsN;
  // Common English words of 2-7 letters: BPE gives ~1-1.5 tokens a word, a byte- or character-level
  // tokenizer (the synth models' makes ~4.4) at most one a letter plus the space; below 0.5 or above
  // 12 the answer is not a count of these words' tokens.
  if (ratio < 0.5 || ratio > 12.0) return std::nullopt;
  TokenizeProbe probe{ratio, 0};
  if (j.contains("max_model_len") && j["max_model_len"].is_number_integer())
    probe.max_model_len = j["max_model_len"].get<int64_t>();
  return probe;
}

LevelReport run_level(const ClientConfig& c, const LevelConfig& level, MixSampler& sampler) {
  net::io_context ioc;
  auto eps = resolve(ioc, c.url);
  const int n = std::max(0, level.num_requests);
  // Requests are drawn as they start, in order, so a level gets the same sequence however fast the
  // server is; the coroutine owns its prompt and frees it when done. A deque keeps results in place.
  std::deque<RequestResult> results;
  if (!eps.ok()) {
    std::vector<RequestResult> failed(1);
    failed[0].error = eps.message();
    return summarize(level, std::move(failed), 0.0);
  }
  int started = 0;
  const auto start = Clock::now();
  const auto stop_starting =
      start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(std::max(0.0, level.duration_s)));
  if (level.rate > 0) {
    // Open loop: Poisson arrivals (exponential gaps), each request its own coroutine.
    net::co_spawn(
        ioc,
        [&]() -> awaitable<void> {
          std::mt19937_64 rng(level.seed);
          std::exponential_distribution<double> gap(level.rate);
          net::steady_timer timer(co_await net::this_coro::executor);
          auto at = start;
          for (int i = 0; i < n; ++i) {
            if (Clock::now() >= stop_starting) break;
            ++started;
            net::co_spawn(co_await net::this_coro::executor,
                          stream_one(c, *eps, sampler.next(), start, results.emplace_back()), net::detached);
            at += std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(gap(rng)));
            if (at >= stop_starting) break;
            timer.expires_at(at);
            co_await timer.async_wait(use_awaitable);
          }
        },
        net::detached);
  } else {
    // Closed loop: `concurrency` clients, each sending its next request when the last one ends.
    for (int w = 0; w < std::max(1, level.concurrency); ++w)
      net::co_spawn(
          ioc,
          [&]() -> awaitable<void> {
            while (started < n && Clock::now() < stop_starting) {
              ++started;
              co_await stream_one(c, *eps, sampler.next(), start, results.emplace_back());
            }
          },
          net::detached);
  }
  ioc.run();
  const double wall = seconds(Clock::now() - start);
  return summarize(level, std::vector<RequestResult>(results.begin(), results.end()), wall);
}

RequestResult complete_once(const ClientConfig& c, const std::string& prompt, int max_tokens,
                            const nlohmann::json& extra) {
  RequestResult out;
  net::io_context ioc;
  auto eps = resolve(ioc, c.url);
  if (!eps.ok()) {
    out.error = eps.message();
    return out;
  }
  ClientConfig cc = c;
  cc.extra_body.update(extra);
  RequestSpec spec;
  spec.prompt = prompt;
  spec.max_tokens = max_tokens;
  net::co_spawn(ioc, stream_one(cc, *eps, std::move(spec), Clock::now(), out), net::detached);
  ioc.run();
  return out;
}

MultiTurnReport run_multi_turn(const ClientConfig& c, const MultiTurnConfig& m,
                               const std::function<void(const std::string&)>& progress) {
  MultiTurnReport rep;
  std::mt19937_64 rng(m.seed ^ 0x4d554c5449ull);
  const auto words_for = [&](int tokens) {
    return MixSampler::words(rng, std::max(1, static_cast<int>(tokens / std::max(0.1, m.tokens_per_word))));
  };
  const std::string run = std::to_string(m.seed) + "-" + std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());
  for (int i = 0; i < m.conversations; ++i) {
    const std::string salt = "mt-" + run + "-" + std::to_string(i);
    const std::string history = words_for(m.history_tokens);
    RequestResult t1 = complete_once(c, history, m.answer_tokens, {{"cache_salt", salt}});
    if (!t1.ok) {
      ++rep.errors["turn 1: " + t1.error];
      continue;
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(m.idle_s));
    const std::string returning = history + " " + words_for(m.message_tokens);
    RequestResult warm, cold;
    for (int k = 0; k < 2; ++k) {  // even conversations: warm first; odd: cold first
      if ((k == 0) == (i % 2 == 0))
        warm = complete_once(c, returning, m.answer_tokens, {{"cache_salt", salt}});
      else
        cold = complete_once(c, returning, m.answer_tokens, {{"cache_salt", salt + "-cold"}});
    }
    if (!warm.ok || !cold.ok) {
      ++rep.errors["returning turn: " + (warm.ok ? cold.error : warm.error)];
      continue;
    }
    rep.warm_ttft_s.push_back(warm.ttft_s);
    rep.cold_ttft_s.push_back(cold.ttft_s);
    rep.prompt_tokens.push_back(warm.prompt_tokens);
    if (progress) {
      char line[160];
      std::snprintf(line, sizeof line, "conversation %d: %lld prompt tokens, TTFT reused %.3f s, recomputed %.3f s", i,
                    static_cast<long long>(warm.prompt_tokens), warm.ttft_s, cold.ttft_s);
      progress(line);
    }
  }
  return rep;
}

}  // namespace ss::bench
