// The OTLP/HTTP exporter: a bounded queue filled by any thread, drained by one export thread that
// POSTs batches (Content-Type application/x-protobuf, OTLP/HTTP §"Binary Protobuf Encoding") on a
// private io_context, each POST bounded in time, so the collector's speed never reaches a caller.
#include <pthread.h>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "telemetry/telemetry.h"

namespace ss::telemetry {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

Expected<std::unique_ptr<OtlpExporter>> OtlpExporter::create(ExporterOptions opts) {
  std::string_view u = opts.endpoint;
  constexpr std::string_view kScheme = "http://";
  if (u.substr(0, kScheme.size()) != kScheme)
    return make_error("--otlp-traces-endpoint '" + opts.endpoint +
                      "': only http:// is supported (OTLP/HTTP with protobuf), e.g. http://localhost:4318/v1/traces");
  u.remove_prefix(kScheme.size());
  const size_t slash = u.find('/');
  std::string_view authority = u.substr(0, slash);
  std::string target = slash == std::string_view::npos ? "" : std::string(u.substr(slash));
  // The OTLP/HTTP default path when the URL has none (as OTEL_EXPORTER_OTLP_ENDPOINT does).
  if (target.empty() || target == "/") target = "/v1/traces";
  std::string host, port = "80";
  if (!authority.empty() && authority.front() == '[') {  // an IPv6 literal
    const size_t close = authority.find(']');
    if (close == std::string_view::npos) return make_error("--otlp-traces-endpoint '" + opts.endpoint + "': unclosed '['");
    host = std::string(authority.substr(1, close - 1));
    if (close + 1 < authority.size()) {
      if (authority[close + 1] != ':') return make_error("--otlp-traces-endpoint '" + opts.endpoint + "': bad port");
      port = std::string(authority.substr(close + 2));
    }
  } else {
    const size_t colon = authority.rfind(':');
    host = std::string(authority.substr(0, colon));
    if (colon != std::string_view::npos) port = std::string(authority.substr(colon + 1));
  }
  if (host.empty()) return make_error("--otlp-traces-endpoint '" + opts.endpoint + "': no host");
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos ||
      std::stoi(port) < 1 || std::stoi(port) > 65535)
    return make_error("--otlp-traces-endpoint '" + opts.endpoint + "': bad port '" + port + "'");
  if (opts.max_queue_spans < 1 || opts.max_batch_spans < 1)
    return make_error("the OTLP exporter needs a queue and a batch of at least one span");
  auto e = std::unique_ptr<OtlpExporter>(new OtlpExporter(std::move(opts)));
  e->host_ = std::move(host);
  e->port_ = std::move(port);
  e->target_ = std::move(target);
  e->thread_ = std::thread([p = e.get()] { p->run(); });
  return e;
}

OtlpExporter::OtlpExporter(ExporterOptions opts) : opts_(std::move(opts)) {}

OtlpExporter::~OtlpExporter() {
  if (thread_.joinable()) shutdown(SteadyClock::now() + opts_.timeout);
}

void OtlpExporter::submit(std::vector<Span> spans) {
  bool wake = false;
  uint64_t taken = 0;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stopping_) {
      dropped_ += spans.size();
      return;
    }
    const bool was_empty = queue_.empty();
    for (Span& s : spans) {
      if (queue_.size() >= opts_.max_queue_spans) break;
      queue_.push_back(std::move(s));
      ++taken;
    }
    // Wake the thread only when it has something new to decide: the first span (it starts the
    // batch delay) or a full batch.
    wake = (was_empty && taken > 0) || queue_.size() >= opts_.max_batch_spans;
  }
  queued_ += taken;
  dropped_ += spans.size() - taken;
  if (wake) cv_.notify_one();
}

bool OtlpExporter::shutdown(SteadyClock::time_point deadline) {
  if (!thread_.joinable()) return queue_.empty();
  const uint64_t dropped_before = dropped_.load();
  {
    std::lock_guard<std::mutex> lk(mu_);
    stopping_ = true;
    stop_deadline_ = deadline;
  }
  stop_deadline_ns_.store(deadline.time_since_epoch().count());
  cv_.notify_one();
  thread_.join();
  return dropped_.load() == dropped_before;
}

ExporterStats OtlpExporter::stats() const {
  ExporterStats s;
  s.spans_queued = queued_.load();
  s.spans_exported = exported_.load();
  s.spans_dropped = dropped_.load();
  s.export_requests = requests_.load();
  s.export_failures = failures_.load();
  return s;
}

void OtlpExporter::run() {
  pthread_setname_np(pthread_self(), "ss-otlp");  // its CPU time is told apart in benchmarks
  std::vector<Span> batch;
  for (;;) {
    SteadyClock::time_point deadline;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stopping_ || !queue_.empty(); });
      if (!stopping_)
        cv_.wait_for(lk, opts_.batch_delay, [&] { return stopping_ || queue_.size() >= opts_.max_batch_spans; });
      if (queue_.empty()) {
        if (stopping_) return;
        continue;
      }
      const size_t n = std::min(queue_.size(), opts_.max_batch_spans);
      batch.assign(std::make_move_iterator(queue_.begin()), std::make_move_iterator(queue_.begin() + static_cast<std::ptrdiff_t>(n)));
      queue_.erase(queue_.begin(), queue_.begin() + static_cast<std::ptrdiff_t>(n));
      deadline = SteadyClock::now() + opts_.timeout;
      if (stopping_) deadline = std::min(deadline, stop_deadline_);
    }
    const std::string body = encode_export_request(opts_.resource, "selfserve", opts_.scope_version, batch);
    ++requests_;
    if (post(body, deadline)) {
      exported_ += batch.size();
    } else {
      ++failures_;
      dropped_ += batch.size();
    }
    batch.clear();
  }
}

// One POST, every step bounded by `deadline` (resolve, connect, write, read the answer).
bool OtlpExporter::post(const std::string& body, SteadyClock::time_point deadline) {
  const auto now = SteadyClock::now();
  if (deadline <= now) return false;
  const auto budget = deadline - now;
  net::io_context io;
  tcp::resolver resolver(io);
  beast::tcp_stream stream(io);
  http::request<http::string_body> req{http::verb::post, target_, 11};
  req.set(http::field::host, host_ + ":" + port_);
  req.set(http::field::content_type, "application/x-protobuf");
  req.set(http::field::user_agent, "selfserve-otlp");
  req.body() = body;
  req.prepare_payload();
  beast::flat_buffer buf;
  http::response<http::string_body> res;
  bool ok = false;
  stream.expires_after(budget);
  resolver.async_resolve(host_, port_, [&](const beast::error_code& ec, const tcp::resolver::results_type& eps) {
    if (ec) return;
    stream.async_connect(eps, [&](const beast::error_code& ec2, const tcp::endpoint&) {
      if (ec2) return;
      http::async_write(stream, req, [&](const beast::error_code& ec3, size_t) {
        if (ec3) return;
        http::async_read(stream, buf, res, [&](const beast::error_code& ec4, size_t) {
          ok = !ec4 && res.result_int() / 100 == 2;
          beast::error_code ig;
          stream.socket().shutdown(tcp::socket::shutdown_both, ig);
        });
      });
    });
  });
  // In slices, so that a shutdown's deadline also cuts a POST that started before it.
  for (;;) {
    auto until = deadline;
    const int64_t stop_ns = stop_deadline_ns_.load();
    if (stop_ns != kNoStop) until = std::min(until, SteadyClock::time_point(SteadyClock::duration(stop_ns)));
    const auto left = until - SteadyClock::now();
    if (left <= SteadyClock::duration::zero()) break;
    io.run_for(std::min<SteadyClock::duration>(left, std::chrono::milliseconds(20)));
    if (io.stopped()) break;
  }
  if (!io.stopped()) {  // out of time: cancel what is pending and let the handlers see it
    beast::error_code ig;
    resolver.cancel();
    stream.socket().close(ig);
    io.restart();
    io.run_for(std::chrono::milliseconds(100));
  }
  return ok;
}

}  // namespace ss::telemetry
