#include "server/server.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <optional>
#include <random>
#include <string_view>
#include <unordered_map>
#include <vector>

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

// RFC 9110 §11.4: `Authorization: <scheme> 1*SP <credentials>`, the scheme case-insensitive.
bool bearer_matches(std::string_view v, const std::string& key) {
  const size_t sp = v.find(' ');
  if (sp == std::string_view::npos || !beast::iequals(v.substr(0, sp), "bearer")) return false;
  v.remove_prefix(sp);
  while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
  while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.remove_suffix(1);
  return !v.empty() && same_secret(std::string(v), key);
}

// uri-host [":" port] (RFC 3986 reg-name, IPv4 or an IP literal in brackets); empty is allowed.
bool valid_host(std::string_view h) {
  constexpr std::string_view kOther = "-._~!$&'()*+,;=:%[]";
  for (const char c : h)
    if (!std::isalnum(static_cast<unsigned char>(c)) && kOther.find(c) == std::string_view::npos) return false;
  return true;
}

// RFC 9112 §6.1/§6.3 and §3.2, checked on the headers before any body byte is read. A request that
// fails them cannot be delimited with confidence (its body could be parsed as the next request: a
// smuggling primitive behind a proxy), so the answer always closes the connection.
std::optional<ApiError> framing_error(const HttpRequest& h) {
  ApiError e;
  e.code = "bad_request";
  const auto fail = [&](int status, std::string msg) {
    e.status = status;
    e.message = std::move(msg);
    return std::optional<ApiError>(e);
  };
  const auto hosts = h.equal_range(http::field::host);
  const auto num_hosts = std::distance(hosts.first, hosts.second);
  if (h.version() >= 11 && num_hosts == 0) return fail(400, "an HTTP/1.1 request needs a Host header");
  if (num_hosts > 1) return fail(400, "more than one Host header");
  if (num_hosts == 1) {
    const auto v = hosts.first->value();
    if (!valid_host(std::string_view(v.data(), v.size()))) return fail(400, "invalid Host header");
  }
  const auto tes = h.equal_range(http::field::transfer_encoding);
  if (tes.first == tes.second) return std::nullopt;
  if (h.version() < 11) return fail(400, "Transfer-Encoding in an HTTP/1.0 request");
  if (h.count(http::field::content_length) != 0) return fail(400, "both Transfer-Encoding and Content-Length");
  std::vector<std::string> codings;  // every field line's list, in order, lower-cased
  for (auto it = tes.first; it != tes.second; ++it) {
    const std::string_view v(it->value().data(), it->value().size());
    size_t p = 0;
    while (p <= v.size()) {
      size_t q = v.find(',', p);
      if (q == std::string_view::npos) q = v.size();
      std::string_view t = v.substr(p, q - p);
      while (!t.empty() && (t.front() == ' ' || t.front() == '\t')) t.remove_prefix(1);
      while (!t.empty() && (t.back() == ' ' || t.back() == '\t')) t.remove_suffix(1);
      if (!t.empty()) {
        std::string c(t);
        for (char& ch : c) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
        codings.push_back(std::move(c));
      }
      p = q + 1;
    }
  }
  if (codings.empty() || codings.back() != "chunked") return fail(400, "Transfer-Encoding must end in chunked");
  if (std::count(codings.begin(), codings.end(), "chunked") != 1) return fail(400, "chunked is applied more than once");
  if (codings.size() > 1) {
    e.code = "not_implemented";
    return fail(501, "transfer coding '" + codings.front() + "' is not supported");
  }
  return std::nullopt;
}

Clock::duration secs(double s) { return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s)); }

}  // namespace

namespace detail {

// Lives on the io thread; the engine side reaches it only through a posted wake-up.
struct Waiter {
  explicit Waiter(net::any_io_executor ex) : timer(ex) {}
  net::steady_timer timer;
  bool client_gone = false;
};

// Watches a connection while its request runs, for the client going away (io thread). A FIN alone
// is not that: HTTP/1.1 lets a client half-close after a complete request and still read the answer.
// A reset is (a failed write is too; the writer sees that). A client that closed completely sent a
// FIN as well; while nothing of the response has been written the watch tells the two apart by
// sending an interim `100 Continue` (every HTTP/1.1 client skips 1xx, RFC 9110 §15.2): a closed
// socket answers it with a reset. Pipelined bytes of a next request end the watch (left unread).
//
// Two stages: before the FIN, a wait for readability; after it, a wait for an error only (the socket
// stays readable at EOF, and a read wait would then complete again on every wake-up of the socket).
// recv() reports 0 at EOF even after a reset, so the reset is read from the TCP state.
class HangupWatch {
 public:
  // may_probe: an HTTP/1.1 request whose response starts only after stop().
  HangupWatch(tcp::socket& sock, std::shared_ptr<Waiter> waiter, bool may_probe)
      : st_(std::make_shared<State>(State{&sock, std::move(waiter), may_probe})) {
    on_readable(st_);  // a FIN may have come before the watch did (no new edge for it)
  }
  ~HangupWatch() { stop(); }
  HangupWatch(const HangupWatch&) = delete;
  HangupWatch& operator=(const HangupWatch&) = delete;
  // Before the response is written; no probe is sent after this.
  void stop() {
    if (st_->stopped) return;
    st_->stopped = true;
    beast::error_code ec;
    st_->sock->cancel(ec);
  }

 private:
  struct State {
    tcp::socket* sock;
    std::shared_ptr<Waiter> waiter;
    bool may_probe;
    bool stopped = false;
  };
  static bool reset(int fd) {
    tcp_info ti{};
    socklen_t len = sizeof ti;
    return ::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0 || ti.tcpi_state == TCP_CLOSE;
  }
  static void gone(const std::shared_ptr<State>& st) {
    st->waiter->client_gone = true;
    st->waiter->timer.cancel();
  }
  static void on_readable(const std::shared_ptr<State>& st) {
    const int fd = st->sock->native_handle();
    char c;
    const ssize_t r = ::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (r > 0) return;  // a pipelined request: its bytes wait for the session
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return wait(st, tcp::socket::wait_read);
    if (r < 0 || reset(fd)) return gone(st);
    // FIN: half-closed, or closed.
    if (st->may_probe) {
      static constexpr char kProbe[] = "HTTP/1.1 100 Continue\r\n\r\n";
      const ssize_t n = ::send(fd, kProbe, sizeof kProbe - 1, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n != static_cast<ssize_t>(sizeof kProbe - 1) && !(n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)))
        return gone(st);
    }
    wait(st, tcp::socket::wait_error);
  }
  // The waits are not speculative: each completes on the socket's next readiness edge.
  static void wait(const std::shared_ptr<State>& st, tcp::socket::wait_type type) {
    st->sock->async_wait(type, [st, type](const boost::system::error_code& ec) {
      if (st->stopped || ec == net::error::operation_aborted) return;
      if (ec) return gone(st);
      if (type == tcp::socket::wait_read) return on_readable(st);
      if (reset(st->sock->native_handle())) return gone(st);
      wait(st, type);
    });
  }
  std::shared_ptr<State> st_;
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
  // What the access line of one request says (io thread); write() fills the status and the
  // traceresponse header from it.
  struct AccessRecord {
    Clock::time_point start = Clock::now();
    std::string method, path, client;
    int status = 0;
    int prompt_tokens = -1, completion_tokens = -1;  // generations only
    std::string request_id, trace_id, traceresponse;
    std::vector<std::string> prompts;  // --log-prompts only
  };
  std::unordered_map<const beast::tcp_stream*, AccessRecord*> records;  // io thread
  // The status logged (and put in the span) for a request whose client left before any answer was
  // written: nginx's 499 "client closed request".
  static constexpr int kClientGone = 499;
  void log_access(const AccessRecord& r) const;

  // One generation request's trace: filled as the request goes, its spans handed to the exporter
  // when it ends (whichever way it ends), if sampled.
  struct RequestTrace {
    Impl& s;
    AccessRecord& rec;
    telemetry::RequestSpanInfo info;
    telemetry::ClockAnchor anchor;
    bool sampled = false;
    std::vector<std::shared_ptr<telemetry::ChoiceTimeline>> choices;  // from each choice's finish
    RequestTrace(Impl& impl, AccessRecord& r) : s(impl), rec(r) {}
    RequestTrace(const RequestTrace&) = delete;
    RequestTrace& operator=(const RequestTrace&) = delete;
    ~RequestTrace() {
      if (!sampled || !s.opts.tracer) return;
      info.end = Clock::now();
      info.http_status = rec.status != 0 ? rec.status : kClientGone;
      if (rec.status == 0 && info.error.empty()) info.error = "the client went away before the answer";
      for (const auto& c : choices) {
        if (c) {
          info.choices.push_back(*c);
        } else {  // the client left before this choice finished
          telemetry::ChoiceTimeline t;
          t.arrival = info.start;
          t.finished = info.end;
          t.finish_reason = "abort";
          info.choices.push_back(std::move(t));
        }
      }
      try {
        s.opts.tracer->submit(telemetry::request_spans(info, anchor));
      } catch (const std::exception&) {  // out of memory: the trace is lost, serving goes on
      }
    }
  };
  Clock::time_point drain_started{};

  // A request in flight: its engine ids and cancel tokens (io thread).
  struct Job {
    uint64_t id = 0;
    std::vector<engine::RequestId> engine_ids;
    std::vector<engine::Engine*> engines;  // where each choice went (the primary or the CPU fallback)
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
  engine::Engine* engine = nullptr;  // the primary
  engine::EngineRouter* router = nullptr;  // new requests go through it (level 3: the CPU fallback)
  std::unique_ptr<engine::EngineRouter> own_router;  // set_ready(Engine&): a router with no fallback
  ModelInfo model;

  std::atomic<bool> draining{false};
  std::atomic<bool> stopped{false};
  bool forced = false;                                     // io thread
  std::unordered_map<uint64_t, std::shared_ptr<Job>> jobs;  // io thread
  uint64_t next_job = 1;
  std::mt19937_64 seed_rng{std::random_device{}()};
  std::atomic<int> inflight_choices{0};

  // The HTTP edge's bounds (io thread).
  static constexpr int kMaxRefusing = 1024;  // refused connections answered at once (each < 1 s)
  static constexpr size_t kHeaderLimit = 64 * 1024;
  int open_connections = 0;
  int refusing = 0;
  size_t buffered_body_bytes = 0;           // request bodies held, over all connections
  std::array<char, 16384> discard{};        // lingering closes read into this and drop it
  // A request's share of buffered_body_bytes, given back when the request is done.
  struct BodyCharge {
    Impl& s;
    size_t bytes = 0;
    bool add(size_t n) {
      if (n > s.opts.max_buffered_body_bytes - std::min(s.opts.max_buffered_body_bytes, s.buffered_body_bytes))
        return false;
      bytes += n;
      s.buffered_body_bytes += n;
      s.m.buffered_body->Set(static_cast<double>(s.buffered_body_bytes));
      return true;
    }
    ~BodyCharge() {
      s.buffered_body_bytes -= bytes;
      s.m.buffered_body->Set(static_cast<double>(s.buffered_body_bytes));
    }
  };

  // Watchdog (io thread).
  // Per engine (the primary, then the CPU fallback): one that has work and no new step for
  // watchdog_s makes /health 503, whatever the other does.
  struct Progress {
    int64_t last_steps = -1;
    Clock::time_point last_progress = Clock::now();
    bool stalled(const engine::Engine& e, Clock::time_point now, double limit_s) {
      const int64_t steps = e.stats().steps;
      const bool busy = e.has_work();
      if (steps != last_steps || !busy) last_progress = now;
      last_steps = steps;
      return busy && seconds(now - last_progress) > limit_s;
    }
  };
  std::array<Progress, 2> progress;
  bool stalled = false;
  bool logged_no_lower_tier = false;
  bool logged_fallback = false;
  std::map<std::string, std::string> memory_mode_info;  // written before `ready`, read after it

  MetricsRegistry reg;
  // Series the server itself updates; the engine's gauges and totals are read from its snapshot
  // at scrape time (engine_metrics).
  struct {
    prometheus::Gauge *degrade, *connections, *healthy, *buffered_body;
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
  awaitable<void> refuse(tcp::socket sock);
  awaitable<void> linger_close(beast::tcp_stream& stream, std::chrono::milliseconds limit = std::chrono::seconds(2));
  bool needs_key(const HttpRequest& h) const;
  bool authorized(const HttpRequest& h) const;
  awaitable<bool> dispatch(beast::tcp_stream& stream, HttpRequest& req);
  awaitable<bool> route(beast::tcp_stream& stream, HttpRequest& req, AccessRecord& rec);
  awaitable<bool> handle_generate(beast::tcp_stream& stream, HttpRequest& req, Endpoint ep, AccessRecord& rec);
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
    if (auto it = records.find(&stream); it != records.end()) {
      it->second->status = static_cast<int>(res.result_int());
      if (!it->second->traceresponse.empty()) res.set("traceresponse", it->second->traceresponse);
    }
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
  m.buffered_body = &reg.gauge("selfserve_http_buffered_body_bytes", "Request body bytes held, over all connections");
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
  {  // KV tiers below the pool (zeros when off)
    const std::pair<const char*, const char*> tier_gauges[] = {
        {"selfserve_kv_host_capacity_bytes", "Host KV tier bound (--kv-host-bytes)"},
        {"selfserve_kv_host_used_bytes", "Bytes held by the host KV tier"},
        {"selfserve_kv_host_blocks", "KV blocks held by the host tier"},
        {"selfserve_kv_disk_capacity_bytes", "Disk KV tier bound (--kv-disk-bytes)"},
        {"selfserve_kv_disk_used_bytes", "Bytes of the disk KV tier's files"},
        {"selfserve_kv_disk_blocks", "KV blocks held by the disk tier"},
        {"selfserve_kv_disk_writes_stopped", "1 after a failed disk-tier write (disk full): no more writes"},
        {"selfserve_kv_disk_queue_bytes", "Bytes of demoted KV blocks queued for the disk writer"}};
    const double tier_gauge_values[] = {n(s.kv_host_capacity_bytes), n(s.kv_host_used_bytes), n(s.kv_host_blocks),
                                        n(s.kv_disk_capacity_bytes), n(s.kv_disk_used_bytes), n(s.kv_disk_blocks),
                                        s.kv_disk_writes_stopped ? 1.0 : 0.0, n(s.kv_disk_queue_bytes)};
    for (size_t i = 0; i < std::size(tier_gauges); ++i)
      f.push_back(gauge_family(tier_gauges[i].first, tier_gauges[i].second, tier_gauge_values[i]));
    const std::pair<const char*, const char*> tier_counters[] = {
        {"selfserve_kv_demoted_evicted_blocks_total", "KV blocks demoted to the tiers when the pool needed room"},
        {"selfserve_kv_demoted_idle_blocks_total", "KV blocks demoted to the tiers after idling past the TTL"},
        {"selfserve_kv_restored_host_blocks_total", "KV blocks restored into the pool from the host tier"},
        {"selfserve_kv_restored_disk_blocks_total", "KV blocks restored into the pool from the disk tier"},
        {"selfserve_kv_host_dropped_blocks_total", "Host-tier blocks pushed out by its byte bound"},
        {"selfserve_kv_disk_dropped_blocks_total", "Disk-tier files removed by its byte bound"},
        {"selfserve_kv_disk_writes_total", "Disk-tier files written"},
        {"selfserve_kv_disk_write_errors_total", "Disk-tier writes that failed with an I/O error (they stop the writes)"},
        {"selfserve_kv_restored_queued_blocks_total",
         "Of the disk tier's restores, blocks served from the write queue (the file not yet in)"},
        {"selfserve_kv_demote_deferred_blocks_total",
         "Idle KV blocks left in the pool because the disk write queue was full (once per step that held them)"},
        {"selfserve_kv_disk_behind_dropped_blocks_total",
         "KV blocks not written to disk, or taken back, because the writer was behind: chains' tails"},
        {"selfserve_kv_disk_rejected_files_total",
         "Disk-tier files deleted unread: corrupt, truncated, partial, or of another model / dtype / block size"}};
    const double tier_counter_values[] = {n(s.kv_demoted_evicted), n(s.kv_demoted_idle), n(s.kv_restored_host),
                                          n(s.kv_restored_disk),   n(s.kv_host_dropped),  n(s.kv_disk_dropped),
                                          n(s.kv_disk_writes),     n(s.kv_disk_write_errors), n(s.kv_restored_queued),
                                          n(s.kv_demote_deferred), n(s.kv_disk_behind_dropped), n(s.kv_disk_rejected)};
    for (size_t i = 0; i < std::size(tier_counters); ++i)
      f.push_back(counter_family(tier_counters[i].first, tier_counters[i].second, tier_counter_values[i]));
  }
  {  // memory classes and pressure (engine/memory_pressure.h)
    auto labelled = [&](const std::string& name, const std::string& help, prometheus::MetricType type,
                        const std::string& key, const std::vector<std::pair<std::string, double>>& samples) {
      prometheus::MetricFamily fam;
      fam.name = name;
      fam.help = help;
      fam.type = type;
      for (const auto& [label, v] : samples) {
        prometheus::ClientMetric cm;
        cm.label.push_back({key, label});
        if (!s.mem_where.empty() && key == "pool") cm.label.push_back({"where", s.mem_where});
        if (type == prometheus::MetricType::Counter) cm.counter.value = v;
        else cm.gauge.value = v;
        fam.metric.push_back(std::move(cm));
      }
      f.push_back(std::move(fam));
    };
    const double kv_used = n(s.kv_blocks_used) * n(s.kv_block_bytes);
    labelled("selfserve_memory_pool_capacity_bytes",
             "Bytes held per memory class: read-only weights, the read-write KV pool, temporary scratch",
             prometheus::MetricType::Gauge, "pool",
             {{"weights", n(s.mem_weights_bytes)}, {"kv", n(s.mem_kv_pool_bytes)}, {"scratch", n(s.mem_scratch_bytes)}});
    labelled("selfserve_memory_pool_used_bytes",
             "Bytes in use per memory class (KV: blocks held by live requests; weights and scratch: all of them)",
             prometheus::MetricType::Gauge, "pool",
             {{"weights", n(s.mem_weights_bytes)}, {"kv", kv_used}, {"scratch", n(s.mem_scratch_bytes)}});
    const int64_t frag_slots = s.kv_slots_held - s.kv_slots_filled;
    f.push_back(gauge_family("selfserve_memory_kv_fragmentation_slots",
                             "KV slots allocated to running requests but holding no token (partly filled blocks)",
                             n(frag_slots)));
    f.push_back(gauge_family("selfserve_memory_kv_fragmentation_bytes", "Those slots in bytes",
                             s.kv_block_tokens > 0 ? n(frag_slots) * n(s.kv_block_bytes) / n(s.kv_block_tokens) : 0.0));
    f.push_back(gauge_family("selfserve_memory_pressure_level",
                             "Memory pressure level of the last engine step (0: none .. 3: no room in the KV pool)",
                             n(s.pressure_level)));
    f.push_back(gauge_family("selfserve_memory_host_available_ratio",
                             "MemAvailable / MemTotal as the last pressure check saw it", s.host_available_ratio));
    std::vector<std::pair<std::string, double>> steps, dtok, dsec;
    for (int l = 0; l < 4; ++l) {
      steps.push_back({std::to_string(l), n(s.pressure_steps[l])});
      dtok.push_back({std::to_string(l), n(s.pressure_decode_tokens[l])});
      dsec.push_back({std::to_string(l), s.pressure_decode_seconds[l]});
    }
    labelled("selfserve_memory_pressure_steps_total", "Engine steps run at each memory pressure level",
             prometheus::MetricType::Counter, "level", steps);
    labelled("selfserve_memory_pressure_decode_tokens_total",
             "Tokens sampled by decode-only steps at each memory pressure level", prometheus::MetricType::Counter,
             "level", dtok);
    labelled("selfserve_memory_pressure_decode_seconds_total",
             "Wall time of decode-only steps at each memory pressure level", prometheus::MetricType::Counter, "level",
             dsec);
    labelled("selfserve_memory_pressure_actions_total",
             "Memory pressure actions: demote_early (blocks that left the pool under the shortened TTL), "
             "shrink_prefill (steps with a cut prefill budget), cap_running (steps where work stayed queued at "
             "the lowered running cap), no_lower_tier (steps at level 3 with no backend below)",
             prometheus::MetricType::Counter, "action",
             {{"demote_early", n(s.pressure_demoted_early)},
              {"shrink_prefill", n(s.pressure_prefill_shrunk)},
              {"cap_running", n(s.pressure_admissions_capped)},
              {"no_lower_tier", n(s.pressure_no_lower_tier)}});
    if (is_ready && !memory_mode_info.empty())
      f.push_back(gauge_family("selfserve_memory_mode_info",
                               "--memory-mode and the settings in effect (watermarks, TTL, tier sizes, CPU "
                               "fallback); always 1",
                               1.0, memory_mode_info));
  }
  {  // level 3's CPU fallback engine (engine.h, EngineRouter); zeros when there is none
    engine::Engine* fb = is_ready ? router->fallback() : nullptr;
    const engine::EngineStats fs = fb ? fb->stats() : engine::EngineStats{};
    f.push_back(counter_family("selfserve_cpu_fallback_requests_total",
                               "Requests the CPU fallback engine took while the primary was at memory pressure level 3",
                               is_ready ? n(router->fallback_requests()) : 0.0));
    f.push_back(gauge_family("selfserve_cpu_fallback_requests_running", "Requests in the CPU fallback engine's running set",
                             n(fs.num_running)));
    f.push_back(gauge_family("selfserve_cpu_fallback_requests_waiting", "Requests waiting in the CPU fallback engine",
                             n(fs.num_waiting)));
    f.push_back(gauge_family("selfserve_cpu_fallback_kv_cache_usage_ratio",
                             "The CPU fallback engine's KV cache usage, 0..1", fs.kv_usage));
    f.push_back(counter_family("selfserve_cpu_fallback_generation_tokens_total",
                               "Tokens the CPU fallback engine generated", n(fs.generation_tokens)));
  }
  if (opts.tracer) {
    const telemetry::ExporterStats t = opts.tracer->stats();
    f.push_back(counter_family("selfserve_otlp_spans_queued_total", "Spans accepted for OTLP export", n(t.spans_queued)));
    f.push_back(counter_family("selfserve_otlp_spans_exported_total", "Spans the OTLP collector accepted",
                               n(t.spans_exported)));
    f.push_back(counter_family("selfserve_otlp_spans_dropped_total",
                               "Spans dropped: the export queue was full, or their export failed", n(t.spans_dropped)));
    f.push_back(counter_family("selfserve_otlp_export_requests_total", "OTLP export POSTs tried", n(t.export_requests)));
    f.push_back(counter_family("selfserve_otlp_export_failures_total",
                               "OTLP export POSTs that failed (refused, timed out, not 2xx)", n(t.export_failures)));
  }
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
    engine::Engine* fb = router->fallback();
    if (router->fallback_requests() > 0 && !logged_fallback) {
      logged_fallback = true;
      telemetry::log_warn("engine", "memory pressure level 3: the KV pool has no room; new requests go to the CPU "
                                    "fallback engine until the level falls (running requests stay where they are)");
    }
    if (s.pressure_no_lower_tier > 0 && !logged_no_lower_tier) {
      logged_no_lower_tier = true;
      telemetry::log_warn("engine", "memory pressure level 3: the KV pool has no room and backend " +
                                        engine->executor_name() +
                                        " has nothing below it to serve new work; new requests wait for running ones");
    }
    const bool primary_stalled = progress[0].stalled(*engine, now, opts.watchdog_s);
    const bool fallback_stalled = fb && progress[1].stalled(*fb, now, opts.watchdog_s);
    stalled = primary_stalled || fallback_stalled;
    m.healthy->Set(!stalled && !draining.load() ? 1 : 0);
  }
}

void Server::Impl::cancel_all_jobs() {
  for (auto& [id, job] : jobs) {
    job->cancelled_by_server = true;
    for (size_t i = 0; i < job->engine_ids.size(); ++i) {
      if (job->finished[i]) continue;
      job->cancels[i]->store(true);
      job->engines[i]->abort(job->engine_ids[i]);
    }
  }
}

void Server::Impl::begin_shutdown() {
  if (stopped.load()) return;
  if (draining.exchange(true)) {  // a second signal: stop waiting
    if (!forced) {
      forced = true;
      telemetry::log_warn("server", "cancelling " + std::to_string(jobs.size()) + " in-flight request(s)");
      cancel_all_jobs();
    }
    return;
  }
  drain_started = Clock::now();
  char msg[128];
  std::snprintf(msg, sizeof msg, "shutting down: draining %zu in-flight request(s) (up to %.0f s)", jobs.size(),
                opts.shutdown_timeout_s);
  telemetry::log_info("server", msg);
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
    if (!forced) telemetry::log_warn("server", "shutdown timeout: cancelling " + std::to_string(jobs.size()) + " request(s)");
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
  const auto log_error = [](std::exception_ptr e) {
    if (!e) return;
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      telemetry::log_warn("http", std::string("connection error: ") + ex.what());
    } catch (...) {
    }
  };
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
    if (open_connections >= opts.max_connections) {
      reject("too_many_connections");
      // Answered (and lingered on) by a few at a time; past those a refused socket is just closed.
      if (refusing < kMaxRefusing) net::co_spawn(*io, refuse(std::move(sock)), log_error);
      continue;
    }
    ++open_connections;
    m.connections->Increment();
    net::co_spawn(*io, session(std::move(sock)), log_error);
  }
}

awaitable<void> Server::Impl::refuse(tcp::socket sock) {
  ++refusing;
  struct Dec {
    int& n;
    ~Dec() { --n; }
  } dec{refusing};
  beast::tcp_stream stream(std::move(sock));
  HttpRequest dummy;
  dummy.version(11);
  ApiError e;
  e.status = 503;
  e.type = "service_unavailable";
  e.code = "too_many_connections";
  e.message = "the server has " + std::to_string(opts.max_connections) + " connections open; retry shortly";
  HttpResponse res = make_error(dummy, e);
  res.keep_alive(false);
  res.set(http::field::retry_after, "1");
  co_await write(stream, std::move(res));
  co_await linger_close(stream, std::chrono::milliseconds(500));  // short: refusals come in bursts
}

awaitable<void> Server::Impl::linger_close(beast::tcp_stream& stream, std::chrono::milliseconds limit) {
  beast::error_code ig;
  stream.socket().shutdown(tcp::socket::shutdown_send, ig);
  stream.expires_after(limit);
  const size_t cap = opts.max_body_bytes + (64u << 20);
  size_t total = 0;
  for (;;) {
    auto [ec, got] = co_await stream.async_read_some(net::buffer(discard), nothrow);
    total += got;
    if (ec || total > cap) break;
  }
  stream.expires_never();
}

awaitable<void> Server::Impl::session(tcp::socket sock) {
  beast::tcp_stream stream(std::move(sock));
  // Bounded: it holds the headers (64 KiB at most, below) and a chunk's size line, whose extensions
  // Beast does not limit; a body passes through it in reads of up to 64 KiB.
  beast::flat_buffer buf(kHeaderLimit + 64 * 1024);
  struct Dec {
    Impl* s;
    ~Dec() {
      --s->open_connections;
      s->m.connections->Decrement();
    }
  } dec{this};
  // One answer on the headers alone, then the connection is closed (after a linger, so that a client
  // still sending its body reads the answer instead of a reset).
  const auto answer_and_close = [&](const HttpRequest& h, const ApiError& e) -> awaitable<void> {
    HttpResponse res = make_error(h, e);
    res.keep_alive(false);
    if (e.status == 401) res.set(http::field::www_authenticate, "Bearer");
    if (e.status == 503) res.set(http::field::retry_after, "1");
    if (opts.access_log) {  // refused on its headers: logged like a routed request
      AccessRecord rec;
      rec.method = h.method_string().empty() ? "-" : std::string(h.method_string());
      const std::string_view target(h.target().data(), h.target().size());
      rec.path = target.empty() ? "-" : std::string(target.substr(0, target.find('?')));
      rec.status = e.status;
      beast::error_code pec;
      const auto peer = stream.socket().remote_endpoint(pec);
      if (!pec) rec.client = peer.address().to_string() + ":" + std::to_string(peer.port());
      log_access(rec);
    }
    co_await write(stream, std::move(res));
    buf.clear();
    co_await linger_close(stream);
  };
  bool first = true;
  while (!stopped.load()) {
    beast::error_code ec;
    if (!first && buf.size() == 0) {
      // Between keep-alive requests: up to idle_timeout for the next request's first bytes.
      stream.expires_after(secs(opts.idle_timeout_s));
      size_t n = 0;
      std::tie(ec, n) = co_await stream.async_read_some(buf.prepare(4096), nothrow);
      if (ec) break;  // idle, closed or reset
      buf.commit(n);
    }
    first = false;
    http::request_parser<http::string_body> parser;
    parser.body_limit(boost::none);  // checked after the key (a 401 comes before a 413)
    parser.header_limit(kHeaderLimit);
    stream.expires_after(secs(opts.header_timeout_s));
    std::tie(ec, std::ignore) = co_await http::async_read_header(stream, buf, parser, nothrow);
    ApiError e;
    if (!ec) {
      const HttpRequest& h = parser.get();
      std::optional<ApiError> early = framing_error(h);
      if (early) reject("malformed_http");
      if (!early && needs_key(h) && !authorized(h)) {
        reject("unauthorized");
        early = ApiError{};
        early->status = 401;
        early->message = h.count(http::field::authorization) == 0 ? "missing API key: send 'Authorization: Bearer <key>'"
                                                                  : "invalid API key";
        early->code = "invalid_api_key";
      }
      const auto length = parser.content_length();
      if (!early && length && *length > opts.max_body_bytes) {
        reject("too_large");
        early = ApiError{};
        early->status = 413;
        early->message = "the request body exceeds " + std::to_string(opts.max_body_bytes) + " bytes";
        early->code = "request_too_large";
      }
      if (early) {
        co_await answer_and_close(h, *early);
        break;
      }
    }
    BodyCharge charge{*this};
    bool over_budget = false;
    if (!ec && !parser.is_done()) {
      // The body is held until the request is answered; the bytes of all of them are capped. A
      // declared length is charged before reading, a chunked body as it arrives.
      const auto length = parser.content_length();
      if (length && !charge.add(*length)) over_budget = true;
      if (!over_budget) {
        parser.body_limit(opts.max_body_bytes);
        // curl and others wait for this before sending a larger body.
        const auto expect = parser.get()[http::field::expect];
        if (beast::iequals(expect, "100-continue")) {
          http::response<http::empty_body> cont{http::status::continue_, parser.get().version()};
          std::tie(ec, std::ignore) = co_await http::async_write(stream, cont, nothrow);
        }
        stream.expires_after(secs(opts.idle_timeout_s));
        while (!ec && !parser.is_done()) {
          std::tie(ec, std::ignore) = co_await http::async_read_some(stream, buf, parser, nothrow);
          const size_t held = parser.get().body().size();
          if (!length && held > charge.bytes && !charge.add(held - charge.bytes)) {
            over_budget = true;
            break;
          }
        }
      }
      if (over_budget) {
        reject("body_buffer_full");
        e.status = 503;
        e.type = "service_unavailable";
        e.code = "body_buffer_full";
        e.message = "the server holds too many request bodies (" + std::to_string(opts.max_buffered_body_bytes) +
                    " bytes); retry shortly";
        co_await answer_and_close(parser.get(), e);
        break;
      }
    }
    stream.expires_never();
    if (ec) {
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
        break;  // closed, reset, idle or too slow
      }
      HttpRequest dummy;
      dummy.version(11);
      co_await answer_and_close(dummy, e);
      break;
    }
    HttpRequest req = parser.release();
    const bool keep = co_await dispatch(stream, req);
    if (!keep) break;
  }
  beast::error_code ec;
  stream.socket().shutdown(tcp::socket::shutdown_send, ec);
}

bool Server::Impl::needs_key(const HttpRequest& h) const {
  if (opts.api_key.empty()) return false;
  std::string_view target(h.target().data(), h.target().size());
  target = target.substr(0, target.find('?'));
  if (target == "/health") return false;  // probes
  if (target == "/metrics") return opts.metrics_require_key;
  return true;  // every other path, known or not: no route is discoverable without the key
}

bool Server::Impl::authorized(const HttpRequest& h) const {
  const auto r = h.equal_range(http::field::authorization);
  if (std::distance(r.first, r.second) != 1) return false;
  const auto v = r.first->value();
  return bearer_matches(std::string_view(v.data(), v.size()), opts.api_key);
}

void Server::Impl::log_access(const AccessRecord& r) const {
  nlohmann::ordered_json f;
  f["method"] = r.method;
  f["path"] = r.path;
  f["status"] = r.status;
  if (r.prompt_tokens >= 0) f["prompt_tokens"] = r.prompt_tokens;
  if (r.completion_tokens >= 0) f["completion_tokens"] = r.completion_tokens;
  f["latency_s"] = std::round(seconds(Clock::now() - r.start) * 1e6) / 1e6;
  f["client"] = r.client;
  if (opts.log_prompts && !r.prompts.empty()) f["prompt"] = r.prompts.size() == 1 ? nlohmann::ordered_json(r.prompts[0]) : nlohmann::ordered_json(r.prompts);
  const std::string msg = r.method + " " + r.path + " " + std::to_string(r.status);
  // A 503 from /health is a probe's answer while loading or draining, not a failure.
  const bool failed = r.status >= 500 && r.path != "/health";
  telemetry::Logger::global().log(failed ? telemetry::LogLevel::Warn : telemetry::LogLevel::Info, "access", msg,
                                  r.request_id, r.trace_id, f);
}

// Every routed request: an access record that write() completes, logged when it is answered.
awaitable<bool> Server::Impl::dispatch(beast::tcp_stream& stream, HttpRequest& req) {
  AccessRecord rec;
  rec.method = std::string(req.method_string());
  std::string_view path(req.target().data(), req.target().size());
  rec.path = std::string(path.substr(0, path.find('?')));
  beast::error_code ec;
  const auto peer = stream.socket().remote_endpoint(ec);
  if (!ec) rec.client = peer.address().to_string() + ":" + std::to_string(peer.port());
  records[&stream] = &rec;
  struct Unrecord {
    Impl* s;
    const beast::tcp_stream* k;
    ~Unrecord() { s->records.erase(k); }
  } unrecord{this, &stream};
  const bool keep = co_await route(stream, req, rec);
  if (rec.status == 0) rec.status = kClientGone;
  if (opts.access_log) log_access(rec);
  co_return keep;
}

awaitable<bool> Server::Impl::route(beast::tcp_stream& stream, HttpRequest& req, AccessRecord& rec) {
  std::string_view target(req.target().data(), req.target().size());
  target = target.substr(0, target.find('?'));
  enum class R { Health, Metrics, Models, Completions, Chat, Tokenize, Detokenize, None };
  struct Route {
    std::string_view path;
    http::verb method;
    R r;
  };
  static constexpr Route routes[] = {
      {"/health", http::verb::get, R::Health},
      {"/metrics", http::verb::get, R::Metrics},
      {"/v1/models", http::verb::get, R::Models},
      {"/v1/completions", http::verb::post, R::Completions},
      {"/v1/chat/completions", http::verb::post, R::Chat},
      {"/tokenize", http::verb::post, R::Tokenize},
      {"/detokenize", http::verb::post, R::Detokenize},
  };
  const Route* route = nullptr;
  for (const Route& r : routes)
    if (r.path == target) route = &r;
  if (opts.log_requests) telemetry::log_info("http", rec.method + " " + rec.path);
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
  // The API key was checked on the headers (session), before the body was read.
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
    case R::Completions: co_return co_await handle_generate(stream, req, Endpoint::Completions, rec);
    case R::Chat: co_return co_await handle_generate(stream, req, Endpoint::ChatCompletions, rec);
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
awaitable<bool> Server::Impl::handle_generate(beast::tcp_stream& stream, HttpRequest& req, Endpoint ep,
                                              AccessRecord& rec) {
  const ModelInfo& mi = model;
  const bool chat = ep == Endpoint::ChatCompletions;
  const std::string id = std::string(chat ? "chatcmpl-" : "cmpl-") + [&] {
    char b[32];
    std::snprintf(b, sizeof b, "%016llx%04llx", static_cast<unsigned long long>(seed_rng()),
                  static_cast<unsigned long long>(next_job & 0xffff));
    return std::string(b);
  }();
  // The trace: the caller's continued (W3C traceparent), or a new one; sampled or not, its id goes
  // back in `traceresponse` and into the logs.
  RequestTrace trace(*this, rec);
  {
    const auto tp = req["traceparent"];
    std::optional<telemetry::TraceContext> parent =
        tp.empty() ? std::nullopt
                   : telemetry::parse_traceparent(std::string_view(tp.data(), tp.size()),
                                                  [&] { const auto ts = req["tracestate"]; return std::string_view(ts.data(), ts.size()); }());
    telemetry::RequestSpanInfo& info = trace.info;
    info.ctx.trace_id = parent ? parent->trace_id : telemetry::new_trace_id();
    info.ctx.span_id = telemetry::new_span_id();
    if (parent) {
      info.parent = parent->span_id;
      info.ctx.tracestate = parent->tracestate;
    }
    trace.sampled = opts.tracer && telemetry::sample(info.ctx.trace_id, opts.otlp_sample_ratio, parent);
    // Flags: ours say whether we record; the caller's other bits are not ours to pass on.
    info.ctx.flags = trace.sampled ? 1 : 0;
    info.operation = chat ? "chat" : "text_completion";
    info.model = mi.id;
    info.request_id = id;
    info.http_route = rec.path;
    info.start = rec.start;
    rec.trace_id = telemetry::to_hex(info.ctx.trace_id);
    rec.traceresponse = telemetry::format_traceparent(info.ctx.trace_id, info.ctx.span_id, info.ctx.flags);
    rec.request_id = id;
  }
  auto parsed = co_await on_pool([&] { return parse_generation_request(ep, req.body(), mi); });
  if (!parsed.ok()) {
    const ApiError& err = parsed.error();
    trace.info.error = err.message;
    reject(err.status == 404 ? "model_not_found" : err.code == "context_length_exceeded" ? "context_length" : "invalid_request");
    co_return co_await write(stream, make_error(req, err));
  }
  const GenerationRequest& g = parsed.value();
  const int nc = g.num_choices();
  {
    telemetry::RequestSpanInfo& info = trace.info;
    info.max_tokens = g.max_tokens;
    info.temperature = g.sampling.temperature;
    info.top_p = g.sampling.top_p;
    info.n = g.n;
    info.seed = g.seed;
    info.stream = g.stream;
    int prompt_tokens = 0;  // as usage counts them: each prompt once, whatever n
    for (const PromptInput& p : g.prompts) prompt_tokens += static_cast<int>(p.ids.size());
    info.prompt_tokens = prompt_tokens;
    rec.prompt_tokens = prompt_tokens;
    if (opts.log_prompts)
      for (const PromptInput& p : g.prompts) rec.prompts.push_back(p.text);
  }
  if (auto busy = overload(nc)) {
    reject("overload");
    trace.info.error = busy->message;
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
    trace.info.error = err->message;
    co_return co_await write(stream, make_error(req, *err));
  }

  // Watch for the client going away (a reset; a FIN only when it closed, not half-closed).
  HangupWatch hangup(stream.socket(), job->waiter, /*may_probe=*/!g.stream && req.version() >= 11);

  const int64_t created = unix_now();
  trace.choices.resize(static_cast<size_t>(nc));
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
    res.set("traceresponse", rec.traceresponse);
    rec.status = 200;
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
      if (d.timeline) trace.choices[static_cast<size_t>(d.choice)] = std::move(d.timeline);
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
        job->engines[static_cast<size_t>(c)]->abort(job->engine_ids[static_cast<size_t>(c)]);
      }
      co_return false;
    }
    if (mb->has_pending()) continue;
    job->waiter->timer.expires_at(Clock::time_point::max());
    co_await job->waiter->timer.async_wait(nothrow);
  }

  hangup.stop();
  if (engine_error) {
    trace.info.error = *engine_error;
    telemetry::Logger::global().log(telemetry::LogLevel::Error, "engine", "generation failed: " + *engine_error,
                                    rec.request_id, rec.trace_id);
  }
  std::vector<ChoiceOutput> outs;
  outs.reserve(choices.size());
  for (const ChoiceStream& cs : choices) outs.push_back(cs.output());
  rec.completion_tokens = usage_of(g, outs).completion_tokens;
  const auto with_timeline = [&](nlohmann::ordered_json j) {
    if (g.include_timeline && j.contains("usage") && j["usage"].is_object()) {
      nlohmann::ordered_json tl = nlohmann::ordered_json::array();
      for (size_t c = 0; c < trace.choices.size(); ++c)
        if (trace.choices[c]) tl.push_back(telemetry::timeline_json(*trace.choices[c], trace.anchor, static_cast<int>(c)));
      j["usage"]["timeline"] = std::move(tl);
    }
    return j;
  };
  if (g.stream) {
    std::string tail;
    if (g.include_usage) tail += sse_event(dump_json(with_timeline(usage_chunk(g, mi, id, created, usage_of(g, outs)))));
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
  const nlohmann::ordered_json body =
      with_timeline(chat ? chat_response(g, mi, id, created, outs) : completion_response(g, mi, id, created, outs));
  co_return co_await write(stream, make(req, http::status::ok, dump_json(body)));
}

// Choices beyond the running seats queue, and the queue is bounded: past it, a 429.
std::optional<ApiError> Server::Impl::overload(int nc) {
  const int inflight = inflight_choices.load();
  // Seats and waiting requests of both engines when a CPU fallback stands below the primary.
  engine::Engine* fb = router->fallback();
  const int seats = opts.max_num_seqs + router->fallback_seats();
  const int waiting_now =
      std::max(engine->stats().num_waiting + (fb ? fb->stats().num_waiting : 0), inflight - seats);
  const int queued_new = std::max(0, nc - std::max(0, seats - inflight));
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
    // The router stores the engine it picks here before queueing, so the first event finds it.
    auto where = std::make_shared<std::atomic<engine::Engine*>>(nullptr);
    r.on_event = [feed, mb, c, self, where](const engine::TokenEvent& e) {
      bool stop = false;
      std::optional<Delta> d = feed->on_event(e, &stop);
      if (stop) where->load()->stop_request(e.id, engine::FinishReason::Stop);
      if (!d) return;
      d->choice = c;
      if (d->finish != engine::FinishReason::None) self->inflight_choices.fetch_sub(1);
      mb->push(std::move(*d));
    };
    inflight_choices.fetch_add(1);
    auto placed = router->add_request(std::move(r), where.get());
    if (!placed.ok()) {
      inflight_choices.fetch_sub(1);
      for (size_t k = 0; k < job.engine_ids.size(); ++k) {
        job.cancels[k]->store(true);
        job.engines[k]->abort(job.engine_ids[k]);
      }
      ApiError e;
      e.message = placed.message();
      return e;
    }
    job.engine_ids.push_back(placed->id);
    job.engines.push_back(placed->engine);
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
  if (opts.max_connections < 1) return ss::make_error("max_connections must be >= 1");
  if (!(opts.header_timeout_s > 0)) return ss::make_error("header_timeout_s must be > 0");
  if (opts.max_buffered_body_bytes < opts.max_body_bytes)
    return ss::make_error("the buffered-body cap must be at least the largest body");
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

void Server::set_memory_mode_info(std::map<std::string, std::string> labels) {
  impl_->memory_mode_info = std::move(labels);
}

void Server::set_ready(engine::Engine& engine, const ModelInfo& model) {
  Impl& s = *impl_;
  if (s.ready.load()) return;
  s.own_router = std::make_unique<engine::EngineRouter>(engine);
  set_ready(*s.own_router, model);
}

void Server::set_ready(engine::EngineRouter& router, const ModelInfo& model) {
  Impl& s = *impl_;
  if (s.ready.load()) return;
  s.router = &router;
  s.engine = &router.primary();
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
      telemetry::log_error("http", std::string("event loop: ") + e.what());
    }
  }
  s.stopped = true;
  if (s.opts.tracer) {
    // The spans of the drained requests go out within what is left of the drain time.
    const auto began = s.drain_started != Clock::time_point{} ? s.drain_started : Clock::now();
    const auto deadline = began + secs(s.opts.shutdown_timeout_s);
    if (!s.opts.tracer->shutdown(deadline))
      telemetry::log_warn("otlp", "some spans were not exported before the shutdown deadline (see "
                                  "selfserve_otlp_spans_dropped_total)");
  }
  return {};
}

void Server::shutdown() {
  Impl* s = impl_.get();
  net::post(*s->io, [s] { s->begin_shutdown(); });
}

bool Server::shutting_down() const { return impl_->draining.load() || impl_->stopped.load(); }

}  // namespace ss::server
