#include "server/server.h"

#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <random>
#include <unordered_map>

#include "server/choice_stream.h"

namespace ss::server {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using net::awaitable;
using net::use_awaitable;
using Clock = std::chrono::steady_clock;
using HttpRequest = http::request<http::string_body>;
using HttpResponse = http::response<http::string_body>;
constexpr auto nothrow = net::as_tuple(net::use_awaitable);

namespace {

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

int64_t unix_now() { return static_cast<int64_t>(std::time(nullptr)); }

bool same_secret(const std::string& a, const std::string& b) {  // constant time in the content
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace

namespace detail {

// Lives on the io thread; the engine side reaches it only through a posted wake-up.
struct Waiter {
  explicit Waiter(net::any_io_executor ex) : timer(ex) {}
  net::steady_timer timer;
  bool client_gone = false;
};

// Engine thread -> io thread. push() never blocks on the event loop.
struct Mailbox {
  net::any_io_executor ex;
  std::weak_ptr<Waiter> waiter;
  std::mutex mu;
  std::vector<Delta> q;
  bool wake_pending = false;

  void push(Delta d) {
    bool post = false;
    {
      std::lock_guard<std::mutex> lk(mu);
      q.push_back(std::move(d));
      post = !wake_pending;
      wake_pending = true;
    }
    if (post)
      net::post(ex, [w = waiter] {
        if (auto s = w.lock()) s->timer.cancel();
      });
  }
  // A wake-up posted while the coroutine was busy (e.g. writing) cancels no wait and is lost; so the
  // coroutine checks this right before it waits (no suspension in between, and an empty queue means
  // the next push posts a fresh wake-up).
  bool has_pending() {
    std::lock_guard<std::mutex> lk(mu);
    return !q.empty();
  }
  void take(std::vector<Delta>& out) {
    std::lock_guard<std::mutex> lk(mu);
    out.swap(q);
    q.clear();
    wake_pending = false;
  }
};

}  // namespace detail

using namespace detail;

struct Server::Impl {
  // A request in flight: its engine ids and cancel tokens (io thread).
  struct Job {
    uint64_t id = 0;
    std::vector<engine::RequestId> engine_ids;
    std::vector<engine::CancelToken> cancels;
    std::vector<bool> finished;
    bool cancelled_by_server = false;
    std::shared_ptr<Waiter> waiter;
  };

  explicit Impl(const ServerOptions& o) : opts(o) {}
  ~Impl() {
    // Pool first (its pending work holds coroutine frames and io work), then every io object, then
    // the io_context itself (destroying the suspended coroutines while the rest is still alive).
    if (pool) {
      pool->stop();
      pool->join();
    }
    pool.reset();
    tick.reset();
    signals.reset();
    acceptor.reset();
    io.reset();
  }

  ServerOptions opts;
  std::unique_ptr<net::io_context> io;
  std::unique_ptr<net::thread_pool> pool;
  std::unique_ptr<tcp::acceptor> acceptor;
  std::unique_ptr<net::signal_set> signals;
  std::unique_ptr<net::steady_timer> tick;
  int bound_port = 0;

  // Set once by set_ready (before `ready` is released), then read-only.
  std::atomic<bool> ready{false};
  engine::Engine* engine = nullptr;
  ModelInfo model;

  std::atomic<bool> draining{false};
  std::atomic<bool> stopped{false};
  bool forced = false;                                     // io thread
  std::unordered_map<uint64_t, std::shared_ptr<Job>> jobs;  // io thread
  uint64_t next_job = 1;
  std::mt19937_64 seed_rng{std::random_device{}()};
  std::atomic<int> inflight_choices{0};

  // Watchdog (io thread).
  int64_t last_steps = -1;
  Clock::time_point last_progress = Clock::now();
  bool stalled = false;

  MetricsRegistry reg;
  // Series the server itself updates; the engine's gauges and totals are read from its snapshot
  // at scrape time (engine_metrics).
  struct {
    prometheus::Gauge *degrade, *connections, *healthy;
  } m{};
  std::unique_ptr<RequestMetrics> request_metrics;  // the per-request latency series
  std::shared_ptr<prometheus::Collectable> engine_metrics;

  void init_metrics();
  std::vector<prometheus::MetricFamily> engine_families() const;
  void reject(const char* reason) {
    reg.counter("selfserve_requests_rejected_total", "Requests refused before reaching the engine, by reason",
                {{"reason", reason}})
        .Increment();
  }

  awaitable<void> accept_loop();
  awaitable<void> session(tcp::socket sock);
  awaitable<bool> dispatch(beast::tcp_stream& stream, HttpRequest& req);
  awaitable<bool> handle_generate(beast::tcp_stream& stream, HttpRequest& req, Endpoint ep);
  std::optional<ApiError> overload(int num_choices);
  std::optional<ApiError> submit(const GenerationRequest& g, Job& job, const std::shared_ptr<Mailbox>& mb);
  awaitable<bool> handle_simple(beast::tcp_stream& stream, HttpRequest& req, bool tokenize);
  awaitable<void> tick_loop();
  awaitable<void> drain();
  void begin_shutdown();
  void cancel_all_jobs();

  template <class F>
  awaitable<std::invoke_result_t<F>> on_pool(F fn) {
    using R = std::invoke_result_t<F>;
    auto r = co_await net::co_spawn(
        *pool, [&]() -> awaitable<std::optional<R>> { co_return std::optional<R>(fn()); }, use_awaitable);
    co_return std::move(*r);
  }

  HttpResponse make(const HttpRequest& req, http::status st, std::string body,
                    const char* content_type = "application/json") {
    HttpResponse res{st, req.version()};
    res.set(http::field::server, "selfserve");
    res.set(http::field::content_type, content_type);
    res.keep_alive(req.keep_alive());
    res.body() = std::move(body);
    res.prepare_payload();
    return res;
  }
  HttpResponse make_error(const HttpRequest& req, const ApiError& e) {
    return make(req, static_cast<http::status>(e.status), error_body(e));
  }
  awaitable<bool> write(beast::tcp_stream& stream, HttpResponse res) {
    const bool keep = res.keep_alive();
    stream.expires_after(std::chrono::seconds(60));
    auto [ec, n] = co_await http::async_write(stream, res, nothrow);
    stream.expires_never();
    co_return keep && !ec && !stopped.load();
  }
};

// The engine's numbers, read at scrape time (a collectable, in prometheus-cpp's terms).
class EngineMetrics final : public prometheus::Collectable {
 public:
  explicit EngineMetrics(const Server::Impl& s) : s_(s) {}
  std::vector<prometheus::MetricFamily> Collect() const override { return s_.engine_families(); }

 private:
  const Server::Impl& s_;
};

void Server::Impl::init_metrics() {
  request_metrics = std::make_unique<RequestMetrics>(reg);
  m.degrade = &reg.gauge("selfserve_degrade_level", "Load-shedding level (0: full service)");
  m.connections = &reg.gauge("selfserve_http_connections", "Open HTTP connections");
  m.healthy = &reg.gauge("selfserve_healthy", "1 when /health answers 200");
  reg.counter("selfserve_requests_rejected_total", "Requests refused before reaching the engine, by reason",
              {{"reason", "overload"}});
  engine_metrics = std::make_shared<EngineMetrics>(*this);
  reg.add_collectable(engine_metrics);
}

std::vector<prometheus::MetricFamily> Server::Impl::engine_families() const {
  // Zeros until the model is loaded, so every series exists from the first scrape.
  const bool is_ready = ready.load(std::memory_order_acquire);
  const engine::EngineStats s = is_ready ? engine->stats() : engine::EngineStats{};
  const auto n = [](auto v) { return static_cast<double>(v); };
  std::vector<prometheus::MetricFamily> f = {
      gauge_family("selfserve_requests_running", "Requests in the engine's running set", n(s.num_running)),
      gauge_family("selfserve_requests_waiting", "Requests waiting for admission (including preempted ones)",
                   n(s.num_waiting)),
      gauge_family("selfserve_kv_cache_usage_ratio", "Referenced KV blocks / all KV blocks (0..1)", s.kv_usage),
      gauge_family("selfserve_kv_cache_blocks_total", "KV cache blocks", n(s.kv_blocks_total)),
      gauge_family("selfserve_kv_cache_blocks_used", "KV cache blocks held by live requests", n(s.kv_blocks_used)),
      gauge_family("selfserve_kv_cache_blocks_cached", "KV cache blocks in the prefix index", n(s.kv_blocks_cached)),
      gauge_family("selfserve_prefix_cache_hit_rate", "Prefix-cache hit tokens / queried prompt tokens",
                   s.prefix_hit_rate),
      counter_family("selfserve_prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache",
                     n(s.prefix_queried_tokens)),
      counter_family("selfserve_prefix_cache_hits_total", "Prompt tokens found in the prefix cache",
                     n(s.prefix_hit_tokens)),
      counter_family("selfserve_prompt_tokens_total", "Prompt tokens of admitted requests", n(s.prompt_tokens)),
      counter_family("selfserve_generation_tokens_total", "Generated tokens", n(s.generation_tokens)),
      counter_family("selfserve_preemptions_total", "Requests preempted for lack of KV blocks", n(s.preemptions)),
      counter_family("selfserve_engine_steps_total", "Engine steps run", n(s.steps)),
      gauge_family("selfserve_kv_paging_waste_ratio",
                   "Empty slots in the KV blocks held by running requests / slots held (now)", s.kv_paging_waste),
      counter_family("selfserve_kv_slots_held_total", "KV slots held by running requests, summed over steps",
                     n(s.kv_slots_held_sum)),
      counter_family("selfserve_kv_slots_filled_total", "Of those, slots holding a token, summed over steps",
                     n(s.kv_slots_filled_sum)),
      counter_family("selfserve_engine_step_seconds_total", "Wall time of engine steps that ran a batch",
                     s.step_seconds),
      counter_family("selfserve_engine_forward_seconds_total", "Of that, time in the backend's forward",
                     s.forward_seconds),
      counter_family("selfserve_engine_decode_steps_total", "Engine steps that only decoded (no prompt tokens)",
                     n(s.decode_steps)),
      counter_family("selfserve_engine_decode_step_seconds_total", "Wall time of the steps that only decoded",
                     s.decode_step_seconds),
      counter_family("selfserve_engine_decode_step_tokens_total", "Tokens sampled by the steps that only decoded",
                     n(s.decode_step_tokens)),
  };
  if (is_ready) {  // vLLM's names carry the model's name
    const Labels l = {{"model_name", model.id}};
    f.push_back(gauge_family("vllm:num_requests_running", "Requests running (vLLM-compatible name)", n(s.num_running), l));
    f.push_back(gauge_family("vllm:num_requests_waiting", "Requests waiting (vLLM-compatible name)", n(s.num_waiting), l));
    f.push_back(gauge_family("vllm:kv_cache_usage_perc", "KV cache usage, 0..1 (vLLM-compatible name)", s.kv_usage, l));
    f.push_back(gauge_family("vllm:gpu_cache_usage_perc", "KV cache usage, 0..1 (older vLLM name)", s.kv_usage, l));
    f.push_back(counter_family("vllm:prompt_tokens_total", "Prompt tokens (vLLM-compatible name)", n(s.prompt_tokens), l));
    f.push_back(
        counter_family("vllm:generation_tokens_total", "Generated tokens (vLLM-compatible name)", n(s.generation_tokens), l));
    f.push_back(counter_family("vllm:num_preemptions_total", "Preemptions (vLLM-compatible name)", n(s.preemptions), l));
  }
  return f;
}

awaitable<void> Server::Impl::tick_loop() {
  while (!stopped.load()) {
    tick->expires_after(std::chrono::milliseconds(200));
    co_await tick->async_wait(nothrow);
    if (stopped.load()) break;
    if (!ready.load(std::memory_order_acquire)) continue;
    const auto now = Clock::now();
    const engine::EngineStats s = engine->stats();
    const bool busy = engine->has_work();
    if (s.steps != last_steps || !busy) last_progress = now;
    last_steps = s.steps;
    stalled = busy && seconds(now - last_progress) > opts.watchdog_s;
    m.healthy->Set(!stalled && !draining.load() ? 1 : 0);
  }
}

void Server::Impl::cancel_all_jobs() {
  for (auto& [id, job] : jobs) {
    job->cancelled_by_server = true;
    for (size_t i = 0; i < job->engine_ids.size(); ++i) {
      if (job->finished[i]) continue;
      job->cancels[i]->store(true);
      if (engine) engine->abort(job->engine_ids[i]);
    }
  }
}

void Server::Impl::begin_shutdown() {
  if (stopped.load()) return;
  if (draining.exchange(true)) {  // a second signal: stop waiting
    if (!forced) {
      forced = true;
      std::fprintf(stderr, "selfserve: cancelling %zu in-flight request(s)\n", jobs.size());
      cancel_all_jobs();
    }
    return;
  }
  std::fprintf(stderr, "selfserve: shutting down: draining %zu in-flight request(s) (up to %.0f s)\n", jobs.size(),
               opts.shutdown_timeout_s);
  net::co_spawn(*io, drain(), net::detached);
}

awaitable<void> Server::Impl::drain() {
  net::steady_timer t(*io);
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(opts.shutdown_timeout_s));
  while (!jobs.empty() && Clock::now() < deadline && !forced) {
    t.expires_after(std::chrono::milliseconds(20));
    co_await t.async_wait(nothrow);
  }
  if (!jobs.empty()) {
    if (!forced) std::fprintf(stderr, "selfserve: shutdown timeout: cancelling %zu request(s)\n", jobs.size());
    forced = true;
    cancel_all_jobs();
    const auto hard = Clock::now() + std::chrono::seconds(5);  // cancelled requests end within a step
    while (!jobs.empty() && Clock::now() < hard) {
      t.expires_after(std::chrono::milliseconds(20));
      co_await t.async_wait(nothrow);
    }
  }
  stopped = true;
  beast::error_code ec;
  if (acceptor) acceptor->close(ec);
  if (signals) signals->cancel(ec);
  if (tick) tick->cancel();
  io->stop();
}

awaitable<void> Server::Impl::accept_loop() {
  while (!stopped.load()) {
    auto [ec, sock] = co_await acceptor->async_accept(nothrow);
    if (ec) {
      if (ec == net::error::operation_aborted || stopped.load()) break;
      // EMFILE and friends: back off instead of spinning.
      net::steady_timer t(*io, std::chrono::milliseconds(50));
      co_await t.async_wait(nothrow);
      continue;
    }
    sock.set_option(tcp::no_delay(true), ec);
    net::co_spawn(*io, session(std::move(sock)), [](std::exception_ptr e) {
      if (!e) return;
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& ex) {
        std::fprintf(stderr, "selfserve: connection error: %s\n", ex.what());
      } catch (...) {
      }
    });
  }
}

awaitable<void> Server::Impl::session(tcp::socket sock) {
  beast::tcp_stream stream(std::move(sock));
  beast::flat_buffer buf;
  m.connections->Increment();
  struct Dec {
    prometheus::Gauge* g;
    ~Dec() { g->Decrement(); }
  } dec{m.connections};
  while (!stopped.load()) {
    http::request_parser<http::string_body> parser;
    parser.body_limit(opts.max_body_bytes);
    parser.header_limit(64 * 1024);
    stream.expires_after(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(opts.idle_timeout_s)));
    beast::error_code ec;
    std::tie(ec, std::ignore) = co_await http::async_read_header(stream, buf, parser, nothrow);
    if (!ec && !parser.is_done()) {
      // curl and others wait for this before sending a larger body.
      const auto expect = parser.get()[http::field::expect];
      if (beast::iequals(expect, "100-continue")) {
        http::response<http::empty_body> cont{http::status::continue_, parser.get().version()};
        std::tie(ec, std::ignore) = co_await http::async_write(stream, cont, nothrow);
      }
      if (!ec) std::tie(ec, std::ignore) = co_await http::async_read(stream, buf, parser, nothrow);
    }
    stream.expires_never();
    if (ec) {
      HttpRequest dummy;
      dummy.version(11);
      dummy.keep_alive(false);
      ApiError e;
      if (ec == http::error::body_limit) {
        reject("too_large");
        e.status = 413;
        e.message = "the request body exceeds " + std::to_string(opts.max_body_bytes) + " bytes";
        e.code = "request_too_large";
      } else if (ec == http::error::header_limit) {
        reject("too_large");
        e.status = 431;
        e.message = "the request headers are too large";
      } else if (parser.got_some() && ec != http::error::end_of_stream && ec != net::error::eof &&
                 ec != beast::error::timeout && ec != net::error::connection_reset &&
                 ec != net::error::operation_aborted && ec != http::error::partial_message) {
        reject("malformed_http");
        e.message = "malformed HTTP request: " + ec.message();
      } else {
        break;  // closed, reset or idle
      }
      co_await write(stream, make_error(dummy, e));
      // Read and drop what the client is still sending so it sees our answer, not a reset.
      beast::error_code ig;
      stream.socket().shutdown(tcp::socket::shutdown_send, ig);
      stream.expires_after(std::chrono::seconds(2));
      size_t total = 0;
      for (;;) {
        auto [rec, got] = co_await stream.async_read_some(buf.prepare(64 * 1024), nothrow);
        buf.consume(buf.size());
        total += got;
        if (rec || total > (256u << 20)) break;
      }
      break;
    }
    HttpRequest req = parser.release();
    const bool keep = co_await dispatch(stream, req);
    if (!keep) break;
  }
  beast::error_code ec;
  stream.socket().shutdown(tcp::socket::shutdown_send, ec);
}

awaitable<bool> Server::Impl::dispatch(beast::tcp_stream& stream, HttpRequest& req) {
  std::string_view target(req.target().data(), req.target().size());
  target = target.substr(0, target.find('?'));
  enum class R { Health, Metrics, Models, Completions, Chat, Tokenize, Detokenize, None };
  struct Route {
    std::string_view path;
    http::verb method;
    R r;
    bool auth;
  };
  static constexpr Route routes[] = {
      {"/health", http::verb::get, R::Health, false},
      {"/metrics", http::verb::get, R::Metrics, false},
      {"/v1/models", http::verb::get, R::Models, true},
      {"/v1/completions", http::verb::post, R::Completions, true},
      {"/v1/chat/completions", http::verb::post, R::Chat, true},
      {"/tokenize", http::verb::post, R::Tokenize, true},
      {"/detokenize", http::verb::post, R::Detokenize, true},
  };
  const Route* route = nullptr;
  for (const Route& r : routes)
    if (r.path == target) route = &r;
  if (opts.log_requests)
    std::fprintf(stderr, "selfserve: %.*s %.*s\n", static_cast<int>(req.method_string().size()),
                 req.method_string().data(), static_cast<int>(target.size()), target.data());
  ApiError e;
  if (!route) {
    reject("not_found");
    e.status = 404;
    e.message = "no route for " + std::string(target);
    e.code = "not_found";
    co_return co_await write(stream, make_error(req, e));
  }
  if (req.method() != route->method) {
    reject("method_not_allowed");
    e.status = 405;
    const auto verb = http::to_string(route->method);
    e.message = std::string(target) + " accepts " + std::string(verb.data(), verb.size()) + " only";
    e.code = "method_not_allowed";
    HttpResponse res = make_error(req, e);
    res.set(http::field::allow, http::to_string(route->method));
    co_return co_await write(stream, std::move(res));
  }
  if (route->auth && !opts.api_key.empty()) {
    std::string_view h(req[http::field::authorization].data(), req[http::field::authorization].size());
    const std::string_view prefix = "Bearer ";
    const bool okay = h.size() > prefix.size() && h.substr(0, prefix.size()) == prefix &&
                      same_secret(std::string(h.substr(prefix.size())), opts.api_key);
    if (!okay) {
      reject("unauthorized");
      e.status = 401;
      e.message = h.empty() ? "missing API key: send 'Authorization: Bearer <key>'" : "invalid API key";
      e.code = "invalid_api_key";
      HttpResponse res = make_error(req, e);
      res.set(http::field::www_authenticate, "Bearer");
      co_return co_await write(stream, std::move(res));
    }
  }
  const bool is_ready = ready.load(std::memory_order_acquire);
  switch (route->r) {
    case R::Health: {
      const char* status = !is_ready ? "loading" : draining.load() ? "draining" : stalled ? "stalled" : "ok";
      const bool ok = std::string_view(status) == "ok";
      std::string body = std::string("{\"status\":\"") + status + "\"}";
      co_return co_await write(stream, make(req, ok ? http::status::ok : http::status::service_unavailable, body));
    }
    case R::Metrics:
      co_return co_await write(stream, make(req, http::status::ok, reg.render(), "text/plain; version=0.0.4; charset=utf-8"));
    default: break;
  }
  if (!is_ready || draining.load()) {
    reject(is_ready ? "draining" : "loading");
    e.status = 503;
    e.type = "service_unavailable";
    e.message = is_ready ? "the server is shutting down" : "the model is still loading";
    e.code = is_ready ? "shutting_down" : "loading";
    HttpResponse res = make_error(req, e);
    res.set(http::field::retry_after, "1");
    if (is_ready) res.keep_alive(false);
    co_return co_await write(stream, std::move(res));
  }
  switch (route->r) {
    case R::Models: co_return co_await write(stream, make(req, http::status::ok, dump_json(models_response(model))));
    case R::Completions: co_return co_await handle_generate(stream, req, Endpoint::Completions);
    case R::Chat: co_return co_await handle_generate(stream, req, Endpoint::ChatCompletions);
    case R::Tokenize: co_return co_await handle_simple(stream, req, true);
    case R::Detokenize: co_return co_await handle_simple(stream, req, false);
    default: break;
  }
  co_return false;
}

awaitable<bool> Server::Impl::handle_simple(beast::tcp_stream& stream, HttpRequest& req, bool tokenize) {
  const ModelInfo& mi = model;
  auto r = co_await on_pool([&] { return tokenize ? tokenize_request(req.body(), mi) : detokenize_request(req.body(), mi); });
  if (!r.ok()) {
    reject("invalid_request");
    co_return co_await write(stream, make_error(req, r.error()));
  }
  co_return co_await write(stream, make(req, http::status::ok, dump_json(r.value())));
}

// A generation request, in order: parse (on the pool) → refuse past the waiting bound → one engine
// request per choice (submit) → stream headers and each choice's head → pump Deltas from the mailbox
// into the choices' streams until every choice finished (or the client left) → the closing chunks,
// or the whole response.
awaitable<bool> Server::Impl::handle_generate(beast::tcp_stream& stream, HttpRequest& req, Endpoint ep) {
  const ModelInfo& mi = model;
  auto parsed = co_await on_pool([&] { return parse_generation_request(ep, req.body(), mi); });
  if (!parsed.ok()) {
    const ApiError& err = parsed.error();
    reject(err.status == 404 ? "model_not_found" : err.code == "context_length_exceeded" ? "context_length" : "invalid_request");
    co_return co_await write(stream, make_error(req, err));
  }
  const GenerationRequest& g = parsed.value();
  const int nc = g.num_choices();
  if (auto busy = overload(nc)) {
    reject("overload");
    HttpResponse res = make_error(req, *busy);
    res.set(http::field::retry_after, "1");
    co_return co_await write(stream, std::move(res));
  }

  auto job = std::make_shared<Job>();
  job->id = next_job++;
  job->waiter = std::make_shared<Waiter>(io->get_executor());
  auto mb = std::make_shared<Mailbox>();
  mb->ex = io->get_executor();
  mb->waiter = job->waiter;
  jobs[job->id] = job;
  struct Unregister {
    Impl* self;
    uint64_t id;
    ~Unregister() { self->jobs.erase(id); }
  } unregister{this, job->id};
  if (auto err = submit(g, *job, mb)) {
    reject("invalid_request");
    co_return co_await write(stream, make_error(req, *err));
  }

  // Watch for the client going away (EOF or reset) while we generate; pipelined data is left alone.
  {
    const int fd = stream.socket().native_handle();
    stream.socket().async_wait(tcp::socket::wait_read, [w = job->waiter, fd](const boost::system::error_code& ec) {
      if (ec == net::error::operation_aborted) return;
      if (!ec) {
        char c;
        const ssize_t r = ::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
        if (r > 0 || (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))) return;
      }
      w->client_gone = true;
      w->timer.cancel();
    });
  }
  struct StopWatch {
    beast::tcp_stream& s;
    ~StopWatch() {
      beast::error_code ec;
      s.socket().cancel(ec);
    }
  } stop_watch{stream};

  const bool chat = ep == Endpoint::ChatCompletions;
  const std::string id = std::string(chat ? "chatcmpl-" : "cmpl-") + [&] {
    char b[32];
    std::snprintf(b, sizeof b, "%016llx%04llx", static_cast<unsigned long long>(seed_rng()),
                  static_cast<unsigned long long>(job->id & 0xffff));
    return std::string(b);
  }();
  const int64_t created = unix_now();
  std::vector<ChoiceStream> choices;
  choices.reserve(static_cast<size_t>(nc));
  for (int c = 0; c < nc; ++c) choices.emplace_back(g, mi, id, created, c);
  bool keep = req.keep_alive();

  // Streaming: headers now, then chunks as tokens come.
  const bool chunked = req.version() >= 11;
  if (!chunked) keep = false;
  bool write_failed = false;
  auto send = [&](const std::string& payload) -> awaitable<void> {
    if (write_failed || payload.empty()) co_return;
    stream.expires_after(std::chrono::seconds(60));
    beast::error_code ec;
    if (chunked) std::tie(ec, std::ignore) = co_await net::async_write(stream, http::make_chunk(net::buffer(payload)), nothrow);
    else std::tie(ec, std::ignore) = co_await net::async_write(stream, net::buffer(payload), nothrow);
    stream.expires_never();
    if (ec) write_failed = true;
  };
  if (g.stream) {
    http::response<http::empty_body> res{http::status::ok, req.version()};
    res.set(http::field::server, "selfserve");
    res.set(http::field::content_type, "text/event-stream");
    res.set(http::field::cache_control, "no-cache");
    res.keep_alive(keep);
    if (chunked) res.chunked(true);
    http::response_serializer<http::empty_body> sr{res};
    stream.expires_after(std::chrono::seconds(60));
    auto [ec, n] = co_await http::async_write_header(stream, sr, nothrow);
    stream.expires_never();
    if (ec) write_failed = true;
    std::string first;
    for (ChoiceStream& cs : choices) first += cs.head();
    co_await send(first);
  }

  std::vector<Delta> batch;
  std::optional<std::string> engine_error;
  int remaining = nc;
  while (remaining > 0) {
    mb->take(batch);
    std::string payload;
    for (Delta& d : batch) {
      ChoiceStream& cs = choices[static_cast<size_t>(d.choice)];
      payload += cs.apply(std::move(d));
      if (cs.done() && !job->finished[cs.output().index]) {
        job->finished[cs.output().index] = true;
        --remaining;
        if (cs.error()) engine_error = cs.error();
      }
    }
    batch.clear();
    if (g.stream) co_await send(payload);
    if (remaining == 0) break;
    if (job->waiter->client_gone || write_failed) {
      // Stop every unfinished choice now: the engine frees their blocks at the start of its next step.
      for (int c = 0; c < nc; ++c) {
        if (job->finished[c]) continue;
        job->cancels[c]->store(true);
        engine->abort(job->engine_ids[c]);
      }
      co_return false;
    }
    if (mb->has_pending()) continue;
    job->waiter->timer.expires_at(Clock::time_point::max());
    co_await job->waiter->timer.async_wait(nothrow);
  }

  std::vector<ChoiceOutput> outs;
  outs.reserve(choices.size());
  for (const ChoiceStream& cs : choices) outs.push_back(cs.output());
  if (g.stream) {
    std::string tail;
    if (g.include_usage) tail += sse_event(dump_json(usage_chunk(g, mi, id, created, usage_of(g, outs))));
    tail += "data: [DONE]\n\n";
    co_await send(tail);
    if (chunked && !write_failed) {
      stream.expires_after(std::chrono::seconds(60));
      auto [ec, n] = co_await net::async_write(stream, http::make_chunk_last(), nothrow);
      stream.expires_never();
      if (ec) write_failed = true;
    }
    co_return keep && !write_failed && !stopped.load();
  }
  if (engine_error) co_return co_await write(stream, make_error(req, generation_error(*engine_error)));
  const nlohmann::ordered_json body = chat ? chat_response(g, mi, id, created, outs) : completion_response(g, mi, id, created, outs);
  co_return co_await write(stream, make(req, http::status::ok, dump_json(body)));
}

// Choices beyond the running seats queue, and the queue is bounded: past it, a 429.
std::optional<ApiError> Server::Impl::overload(int nc) {
  const int inflight = inflight_choices.load();
  const int waiting_now = std::max(engine->stats().num_waiting, inflight - opts.max_num_seqs);
  const int queued_new = std::max(0, nc - std::max(0, opts.max_num_seqs - inflight));
  if (queued_new <= 0 || waiting_now + queued_new <= opts.max_waiting) return std::nullopt;
  ApiError e;
  e.status = 429;
  e.type = "rate_limit_error";
  e.message = "the server is overloaded (" + std::to_string(waiting_now) + " requests waiting); retry shortly";
  e.code = "overloaded";
  return e;
}

// One engine request per choice, each with its ChoiceFeed on the engine thread pushing Deltas into
// `mb`. On a refusal, the choices already queued are cancelled and the error returned.
std::optional<ApiError> Server::Impl::submit(const GenerationRequest& g, Job& job, const std::shared_ptr<Mailbox>& mb) {
  const ModelInfo& mi = model;
  const auto arrival = Clock::now();
  std::optional<Clock::time_point> deadline;
  const double timeout = g.timeout_s ? *g.timeout_s : opts.request_timeout_s;
  if (timeout > 0)
    deadline = arrival + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(std::min(timeout, 1e9)));
  const uint64_t base_seed = seed_rng();
  for (int c = 0; c < g.num_choices(); ++c) {
    engine::Request r = to_engine_request(g, c, mi, base_seed);
    r.arrival = arrival;
    r.deadline = deadline;
    r.cancel = engine::make_cancel_token();
    const engine::CancelToken cancel = r.cancel;
    auto feed = std::make_shared<ChoiceFeed>(*mi.tokenizer, g, r.stop_ids, arrival, *request_metrics);
    Impl* self = this;
    r.on_event = [feed, mb, c, self](const engine::TokenEvent& e) {
      bool stop = false;
      std::optional<Delta> d = feed->on_event(e, &stop);
      if (stop) self->engine->stop_request(e.id, engine::FinishReason::Stop);
      if (!d) return;
      d->choice = c;
      if (d->finish != engine::FinishReason::None) self->inflight_choices.fetch_sub(1);
      mb->push(std::move(*d));
    };
    inflight_choices.fetch_add(1);
    auto id = engine->add_request(std::move(r));
    if (!id.ok()) {
      inflight_choices.fetch_sub(1);
      for (size_t k = 0; k < job.engine_ids.size(); ++k) {
        job.cancels[k]->store(true);
        engine->abort(job.engine_ids[k]);
      }
      ApiError e;
      e.message = id.message();
      return e;
    }
    job.engine_ids.push_back(*id);
    job.cancels.push_back(cancel);
    job.finished.push_back(false);
  }
  return std::nullopt;
}

// --- Server ------------------------------------------------------------------------------------

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Server::~Server() = default;

Expected<std::unique_ptr<Server>> Server::create(const ServerOptions& opts) {
  if (opts.port < 0 || opts.port > 65535) return ss::make_error("port must be in [0, 65535], got " + std::to_string(opts.port));
  if (opts.max_waiting < 0) return ss::make_error("max_waiting must be >= 0");
  auto impl = std::make_unique<Impl>(opts);
  impl->io = std::make_unique<net::io_context>(1);
  impl->pool = std::make_unique<net::thread_pool>(1);
  boost::system::error_code ec;
  const auto addr = net::ip::make_address(opts.host, ec);
  tcp::endpoint ep;
  if (!ec) {
    ep = tcp::endpoint(addr, static_cast<unsigned short>(opts.port));
  } else {  // a host name: resolve it
    tcp::resolver res(*impl->io);
    auto r = res.resolve(opts.host, std::to_string(opts.port), ec);
    if (ec || r.empty()) return ss::make_error("cannot resolve host '" + opts.host + "': " + ec.message());
    ep = *r.begin();
  }
  impl->acceptor = std::make_unique<tcp::acceptor>(*impl->io);
  impl->acceptor->open(ep.protocol(), ec);
  if (!ec) impl->acceptor->set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) impl->acceptor->bind(ep, ec);
  if (!ec) impl->acceptor->listen(net::socket_base::max_listen_connections, ec);
  if (ec)
    return ss::make_error("cannot listen on " + opts.host + ":" + std::to_string(opts.port) + ": " + ec.message());
  impl->bound_port = impl->acceptor->local_endpoint().port();
  impl->tick = std::make_unique<net::steady_timer>(*impl->io);
  if (opts.handle_signals) {
    impl->signals = std::make_unique<net::signal_set>(*impl->io, SIGINT, SIGTERM);
  }
  impl->init_metrics();
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

int Server::port() const { return impl_->bound_port; }

MetricsRegistry& Server::metrics() { return impl_->reg; }

void Server::set_ready(engine::Engine& engine, const ModelInfo& model) {
  Impl& s = *impl_;
  if (s.ready.load()) return;
  s.engine = &engine;
  s.model = model;
  s.request_metrics->set_model(model.id);
  s.ready.store(true, std::memory_order_release);
}

Status Server::run() {
  Impl& s = *impl_;
  if (s.signals)
    s.signals->async_wait([&s](const boost::system::error_code& ec, int) {
      if (ec) return;
      s.begin_shutdown();
      // Keep listening: a second signal cancels in-flight requests.
      s.signals->async_wait([&s](const boost::system::error_code& ec2, int) {
        if (!ec2) s.begin_shutdown();
      });
    });
  net::co_spawn(*s.io, s.accept_loop(), net::detached);
  net::co_spawn(*s.io, s.tick_loop(), net::detached);
  for (;;) {
    try {
      s.io->run();
      break;
    } catch (const std::exception& e) {  // a handler threw: log it and keep serving
      std::fprintf(stderr, "selfserve: event loop: %s\n", e.what());
    }
  }
  s.stopped = true;
  return {};
}

void Server::shutdown() {
  Impl* s = impl_.get();
  net::post(*s->io, [s] { s->begin_shutdown(); });
}

bool Server::shutting_down() const { return impl_->draining.load() || impl_->stopped.load(); }

}  // namespace ss::server
