// Telemetry: W3C trace context, the sampler, the OTLP protobuf bytes (read back by a wire-format
// reader written here from the protobuf encoding spec, independent of the writer), the exporter
// against collectors that answer, refuse or hang, the GenAI spans of a timeline, and log lines.
#include "telemetry/telemetry.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <random>
#include <regex>
#include <thread>

using namespace ss::telemetry;
using namespace std::chrono_literals;

namespace {

// --- a protobuf wire reader: field number -> every value (varint, fixed, or length-delimited bytes).
struct Field {
  uint32_t wire = 0;
  uint64_t num = 0;   // varint, fixed32, fixed64
  std::string bytes;  // length-delimited
};
using Message = std::multimap<uint32_t, Field>;

bool read_varint(std::string_view& s, uint64_t& v) {
  v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (s.empty()) return false;
    const auto b = static_cast<uint8_t>(s.front());
    s.remove_prefix(1);
    v |= static_cast<uint64_t>(b & 0x7f) << shift;
    if (!(b & 0x80)) return true;
  }
  return false;
}

Message parse(std::string_view s) {
  Message m;
  while (!s.empty()) {
    uint64_t key = 0;
    EXPECT_TRUE(read_varint(s, key));
    Field f;
    f.wire = static_cast<uint32_t>(key & 7);
    const auto field = static_cast<uint32_t>(key >> 3);
    if (f.wire == 0) {
      EXPECT_TRUE(read_varint(s, f.num));
    } else if (f.wire == 1 || f.wire == 5) {
      const size_t n = f.wire == 1 ? 8 : 4;
      EXPECT_GE(s.size(), n);
      for (size_t i = 0; i < n; ++i) f.num |= static_cast<uint64_t>(static_cast<uint8_t>(s[i])) << (8 * i);
      s.remove_prefix(n);
    } else if (f.wire == 2) {
      uint64_t len = 0;
      EXPECT_TRUE(read_varint(s, len));
      EXPECT_LE(len, s.size());
      f.bytes = std::string(s.substr(0, len));
      s.remove_prefix(len);
    } else {
      ADD_FAILURE() << "wire type " << f.wire;
      return m;
    }
    m.emplace(field, std::move(f));
  }
  return m;
}

const Field& one(const Message& m, uint32_t field) {
  EXPECT_EQ(m.count(field), 1u) << "field " << field;
  static const Field none;
  auto it = m.find(field);
  return it == m.end() ? none : it->second;
}

std::vector<Message> all(const Message& m, uint32_t field) {
  std::vector<Message> out;
  auto [a, b] = m.equal_range(field);
  for (auto it = a; it != b; ++it) out.push_back(parse(it->second.bytes));
  return out;
}

// KeyValue list -> key -> AnyValue message.
std::map<std::string, Message> attrs(const Message& m, uint32_t field) {
  std::map<std::string, Message> out;
  for (const Message& kv : all(m, field)) out[one(kv, 1).bytes] = parse(one(kv, 2).bytes);
  return out;
}

std::string bytes_of(std::span<const uint8_t> id) { return std::string(reinterpret_cast<const char*>(id.data()), id.size()); }

// A collector on 127.0.0.1: answers each POST with `status`, counting the spans it decodes.
class Collector {
 public:
  enum class Mode { Answer, Hang };
  explicit Collector(Mode mode, int status = 200) : mode_(mode), status_(status) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    EXPECT_EQ(::listen(fd_, 16), 0);
    socklen_t len = sizeof a;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    if (mode_ == Mode::Answer) thread_ = std::thread([this] { serve(); });
  }
  ~Collector() {
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    if (thread_.joinable()) thread_.join();
  }
  int port() const { return port_; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_) + "/v1/traces"; }
  int spans() const { return spans_.load(); }
  std::string last_target() {
    std::lock_guard<std::mutex> lk(mu_);
    return target_;
  }

 private:
  void serve() {
    for (;;) {
      const int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      std::string req;
      char buf[65536];
      size_t need = std::string::npos;
      while (need == std::string::npos || req.size() < need) {
        const ssize_t n = ::read(c, buf, sizeof buf);
        if (n <= 0) break;
        req.append(buf, static_cast<size_t>(n));
        const size_t end = req.find("\r\n\r\n");
        if (end != std::string::npos && need == std::string::npos) {
          std::smatch mm;
          const std::string head = req.substr(0, end);
          std::regex re("Content-Length: *([0-9]+)", std::regex::icase);
          if (std::regex_search(head, mm, re)) need = end + 4 + std::stoul(mm[1]);
          std::lock_guard<std::mutex> lk(mu_);
          target_ = head.substr(head.find(' ') + 1, head.find(' ', head.find(' ') + 1) - head.find(' ') - 1);
        }
      }
      if (need != std::string::npos && req.size() >= need) {
        const Message export_req = parse(std::string_view(req).substr(req.find("\r\n\r\n") + 4));
        int n = 0;
        for (const Message& rs : all(export_req, 1))
          for (const Message& ss : all(rs, 2)) n += static_cast<int>(all(ss, 2).size());
        spans_ += n;
      }
      const std::string res = "HTTP/1.1 " + std::to_string(status_) + " X\r\nContent-Length: 0\r\n\r\n";
      (void)!::write(c, res.data(), res.size());
      ::close(c);
    }
  }
  Mode mode_;
  int status_;
  int fd_ = -1, port_ = 0;
  std::atomic<int> spans_{0};
  std::mutex mu_;
  std::string target_;
  std::thread thread_;
};

Span test_span(int i) {
  Span s;
  s.trace_id = new_trace_id();
  s.span_id = new_span_id();
  s.name = "s" + std::to_string(i);
  s.start_unix_ns = 1;
  s.end_unix_ns = 2;
  return s;
}

std::vector<Span> spans(int n) {
  std::vector<Span> v;
  for (int i = 0; i < n; ++i) v.push_back(test_span(i));
  return v;
}

}  // namespace

// --- trace context ---------------------------------------------------------------------------------

TEST(TraceContext, ParsesTheSpecExampleAndFormatsItBack) {
  // W3C Trace Context §3.2's example.
  auto c = parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "congo=t61rcWkgMzE");
  ASSERT_TRUE(c);
  EXPECT_EQ(to_hex(c->trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
  EXPECT_EQ(to_hex(c->span_id), "00f067aa0ba902b7");
  EXPECT_TRUE(c->sampled());
  EXPECT_EQ(c->tracestate, "congo=t61rcWkgMzE");
  EXPECT_EQ(format_traceparent(c->trace_id, c->span_id, c->flags), "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
  EXPECT_FALSE(parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00")->sampled());
}

TEST(TraceContext, RejectsWhatTheSpecRejects) {
  for (const char* bad : {
           "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",  // upper case
           "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  // zero trace id
           "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  // zero parent id
           "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  // version ff
           "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",  // version 00 with more
           "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",     // short
           "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  // separator
           "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",  // not hex
           ""})
    EXPECT_FALSE(parse_traceparent(bad)) << bad;
  // A later version is read by its first fields.
  auto c = parse_traceparent("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-comes-next");
  ASSERT_TRUE(c);
  EXPECT_EQ(to_hex(c->span_id), "00f067aa0ba902b7");
  // tracestate past 512 bytes is dropped (the context itself is kept).
  auto d = parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", std::string(600, 'a'));
  ASSERT_TRUE(d);
  EXPECT_TRUE(d->tracestate.empty());
}

TEST(TraceContext, NewIdsAreNonZeroAndDistinct) {
  std::set<std::string> seen;
  for (int i = 0; i < 2000; ++i) {
    const TraceId t = new_trace_id();
    EXPECT_FALSE(is_zero(t));
    seen.insert(to_hex(t));
    EXPECT_FALSE(is_zero(new_span_id()));
  }
  EXPECT_EQ(seen.size(), 2000u);
}

TEST(Sampler, RatioOfNewTracesAndTheParentsDecision) {
  int hits = 0;
  const int n = 40000;
  for (int i = 0; i < n; ++i) hits += sample(new_trace_id(), 0.25, std::nullopt) ? 1 : 0;
  // Binomial(40000, 0.25): sd 0.0022; the bound is ~7 sd.
  EXPECT_NEAR(static_cast<double>(hits) / n, 0.25, 0.015);
  const TraceId t = new_trace_id();
  EXPECT_TRUE(sample(t, 1.0, std::nullopt));
  EXPECT_FALSE(sample(t, 0.0, std::nullopt));
  TraceContext parent;
  parent.flags = 1;
  EXPECT_TRUE(sample(t, 0.0, parent));  // the caller sampled it: recorded whatever our ratio
  parent.flags = 0;
  EXPECT_FALSE(sample(t, 1.0, parent));
  // Deterministic in the trace id: every service with the same ratio decides alike.
  for (int i = 0; i < 100; ++i) {
    const TraceId u = new_trace_id();
    EXPECT_EQ(sample(u, 0.5, std::nullopt), sample(u, 0.5, std::nullopt));
  }
}

// --- the protobuf bytes --------------------------------------------------------------------------

TEST(OtlpEncoding, ReadsBackAsExportTraceServiceRequest) {
  Span s;
  s.trace_id = new_trace_id();
  s.span_id = new_span_id();
  s.parent_span_id = new_span_id();
  s.trace_state = "a=b";
  s.flags = 0x301;
  s.name = "llm_request";
  s.kind = SpanKind::Server;
  s.start_unix_ns = 1796399667129058151ull;
  s.end_unix_ns = 1796399667149985056ull;
  s.attributes = {{"str", std::string("v")},
                  {"empty", std::string()},
                  {"int", int64_t{-3}},
                  {"dbl", 0.25},
                  {"yes", true},
                  {"arr", std::vector<std::string>{"stop", "length"}}};
  s.events = {{"first_token", 1796399667134311879ull, {{"tokens", int64_t{3}}}}};
  s.status = SpanStatus::Error;
  s.status_message = "boom";
  Span root_only = test_span(1);
  const std::vector<Span> v = {s, root_only};
  const std::string bytes = encode_export_request({{"service.name", std::string("selfserve")}}, "scope", "1.2", v);

  const Message req = parse(bytes);
  const auto rs = all(req, 1);
  ASSERT_EQ(rs.size(), 1u);
  const Message resource = parse(one(rs[0], 1).bytes);
  EXPECT_EQ(one(attrs(resource, 1)["service.name"], 1).bytes, "selfserve");
  const auto scopes = all(rs[0], 2);
  ASSERT_EQ(scopes.size(), 1u);
  const Message scope = parse(one(scopes[0], 1).bytes);
  EXPECT_EQ(one(scope, 1).bytes, "scope");
  EXPECT_EQ(one(scope, 2).bytes, "1.2");
  const auto sp = all(scopes[0], 2);
  ASSERT_EQ(sp.size(), 2u);
  const Message& m = sp[0];
  EXPECT_EQ(one(m, 1).bytes, bytes_of(s.trace_id));
  EXPECT_EQ(one(m, 2).bytes, bytes_of(s.span_id));
  EXPECT_EQ(one(m, 3).bytes, "a=b");
  EXPECT_EQ(one(m, 4).bytes, bytes_of(s.parent_span_id));
  EXPECT_EQ(one(m, 5).bytes, "llm_request");
  EXPECT_EQ(one(m, 6).wire, 0u);
  EXPECT_EQ(one(m, 6).num, 2u);  // SPAN_KIND_SERVER
  EXPECT_EQ(one(m, 7).wire, 1u);  // fixed64
  EXPECT_EQ(one(m, 7).num, s.start_unix_ns);
  EXPECT_EQ(one(m, 8).num, s.end_unix_ns);
  EXPECT_EQ(one(m, 16).wire, 5u);  // fixed32
  EXPECT_EQ(one(m, 16).num, 0x301u);
  auto a = attrs(m, 9);
  EXPECT_EQ(one(a["str"], 1).bytes, "v");
  EXPECT_EQ(one(a["empty"], 1).bytes, "");  // an empty string is still a string value
  EXPECT_EQ(static_cast<int64_t>(one(a["int"], 3).num), -3);  // int64: two's complement varint
  double d = 0;
  const uint64_t bits = one(a["dbl"], 4).num;
  std::memcpy(&d, &bits, sizeof d);
  EXPECT_EQ(d, 0.25);
  EXPECT_EQ(one(a["yes"], 2).num, 1u);
  const Message arr = parse(one(a["arr"], 5).bytes);
  const auto vals = all(arr, 1);
  ASSERT_EQ(vals.size(), 2u);
  EXPECT_EQ(one(vals[0], 1).bytes, "stop");
  EXPECT_EQ(one(vals[1], 1).bytes, "length");
  const auto ev = all(m, 11);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(one(ev[0], 1).num, 1796399667134311879ull);
  EXPECT_EQ(one(ev[0], 2).bytes, "first_token");
  EXPECT_EQ(one(attrs(ev[0], 3)["tokens"], 3).num, 3u);
  const Message st = parse(one(m, 15).bytes);
  EXPECT_EQ(one(st, 2).bytes, "boom");
  EXPECT_EQ(one(st, 3).num, 2u);  // STATUS_CODE_ERROR
  // A root span has no parent field; an unset status no status message.
  EXPECT_EQ(sp[1].count(4), 0u);
  EXPECT_EQ(sp[1].count(15), 0u);
}

// --- the exporter ------------------------------------------------------------------------------

TEST(OtlpExporter, RejectsEndpointsItCannotSpeakTo) {
  for (const char* bad : {"https://x:4318", "grpc://x", "http://", "http://x:0", "http://x:99999", "http://x:ab", "localhost:4318"}) {
    ExporterOptions o;
    o.endpoint = bad;
    EXPECT_FALSE(OtlpExporter::create(o).ok()) << bad;
  }
}

TEST(OtlpExporter, ExportsEverySpanInBatchesAndFlushesOnShutdown) {
  Collector c(Collector::Mode::Answer);
  ExporterOptions o;
  o.endpoint = "http://127.0.0.1:" + std::to_string(c.port());  // no path: /v1/traces
  o.max_batch_spans = 7;
  o.batch_delay = 10s;  // only full batches go before the shutdown flush
  auto e = OtlpExporter::create(o);
  ASSERT_TRUE(e.ok()) << e.message();
  for (int i = 0; i < 5; ++i) (*e)->submit(spans(5));
  const auto t0 = SteadyClock::now();
  EXPECT_TRUE((*e)->shutdown(SteadyClock::now() + 5s));
  EXPECT_LT(SteadyClock::now() - t0, 5s);
  const ExporterStats st = (*e)->stats();
  EXPECT_EQ(st.spans_queued, 25u);
  EXPECT_EQ(st.spans_exported, 25u);
  EXPECT_EQ(st.spans_dropped, 0u);
  EXPECT_EQ(st.export_requests, 4u);  // ceil(25 / 7)
  EXPECT_EQ(c.spans(), 25);
  EXPECT_EQ(c.last_target(), "/v1/traces");
}

TEST(OtlpExporter, AnErrorStatusCountsAsAFailure) {
  Collector c(Collector::Mode::Answer, 503);
  ExporterOptions o;
  o.endpoint = c.url();
  auto e = OtlpExporter::create(o);
  ASSERT_TRUE(e.ok());
  (*e)->submit(spans(3));
  EXPECT_FALSE((*e)->shutdown(SteadyClock::now() + 5s));
  EXPECT_EQ((*e)->stats().spans_dropped, 3u);
  EXPECT_EQ((*e)->stats().export_failures, 1u);
}

TEST(OtlpExporter, ADeadCollectorDropsAndCountsWithoutBlockingTheCaller) {
  int port = 0;
  {
    Collector gone(Collector::Mode::Hang);  // a port that was just free, closed again
    port = gone.port();
  }
  ExporterOptions o;
  o.endpoint = "http://127.0.0.1:" + std::to_string(port) + "/v1/traces";
  o.batch_delay = 1ms;
  auto e = OtlpExporter::create(o);
  ASSERT_TRUE(e.ok());
  for (int i = 0; i < 20; ++i) {
    const auto t0 = SteadyClock::now();
    (*e)->submit(spans(2));
    EXPECT_LT(SteadyClock::now() - t0, 50ms);
    std::this_thread::sleep_for(2ms);
  }
  (*e)->shutdown(SteadyClock::now() + 2s);
  const ExporterStats st = (*e)->stats();
  EXPECT_EQ(st.spans_exported, 0u);
  EXPECT_EQ(st.spans_dropped, 40u);
  EXPECT_GE(st.export_failures, 1u);
}

TEST(OtlpExporter, AHangingCollectorFillsTheBoundedQueueAndShutdownKeepsItsDeadline) {
  Collector c(Collector::Mode::Hang);  // listens, never answers
  ExporterOptions o;
  o.endpoint = c.url();
  o.max_queue_spans = 8;
  o.max_batch_spans = 4;
  o.batch_delay = 1ms;
  o.timeout = 30s;  // the POST would wait this long; only the shutdown deadline cuts it
  auto e = OtlpExporter::create(o);
  ASSERT_TRUE(e.ok());
  (*e)->submit(spans(4));
  std::this_thread::sleep_for(100ms);  // the thread takes them and hangs in its POST
  const auto t0 = SteadyClock::now();
  for (int i = 0; i < 10; ++i) (*e)->submit(spans(2));  // 8 fit, 12 do not
  EXPECT_LT(SteadyClock::now() - t0, 20ms);
  EXPECT_EQ((*e)->stats().spans_dropped, 12u);
  const auto t1 = SteadyClock::now();
  EXPECT_FALSE((*e)->shutdown(SteadyClock::now() + 300ms));
  const auto took = SteadyClock::now() - t1;
  EXPECT_GE(took, 250ms);
  EXPECT_LT(took, 2s);
  const ExporterStats st = (*e)->stats();
  EXPECT_EQ(st.spans_exported, 0u);
  EXPECT_EQ(st.spans_dropped, 24u);  // everything: 12 at the door, 4 in the hung POST, 8 queued
}

// --- spans from a timeline -------------------------------------------------------------------------

TEST(RequestSpans, ATreeUnderTheServerSpanWithinItsTime) {
  const ClockAnchor anchor;
  const auto t0 = SteadyClock::now();
  ChoiceTimeline c;
  c.arrival = t0 + 1ms;
  c.queued = t0 + 2ms;
  c.scheduled = t0 + 3ms;
  c.prefill_chunks = {{t0 + 3ms, t0 + 5ms, 0, 32}, {t0 + 5ms, t0 + 7ms, 32, 8}};
  c.first_token = t0 + 7ms;
  c.preemptions = {t0 + 9ms};
  c.resumptions = {t0 + 10ms};
  c.last_token = t0 + 12ms;
  c.finished = t0 + 12ms;
  c.completion_tokens = 4;
  c.finish_reason = "length";
  RequestSpanInfo r;
  r.ctx.trace_id = new_trace_id();
  r.ctx.span_id = new_span_id();
  r.ctx.flags = 1;
  r.parent = new_span_id();
  r.operation = "chat";
  r.model = "m";
  r.request_id = "chatcmpl-1";
  r.prompt_tokens = 40;
  r.max_tokens = 4;
  r.temperature = 0.5;
  r.top_p = 0.9;
  r.start = t0;
  r.end = t0 + 13ms;
  r.choices = {c};
  const std::vector<Span> s = request_spans(r, anchor);
  ASSERT_EQ(s.size(), 4u);
  const Span& root = s[0];
  EXPECT_EQ(root.name, "llm_request");
  EXPECT_EQ(root.kind, SpanKind::Server);
  EXPECT_EQ(root.parent_span_id, *r.parent);
  EXPECT_EQ(root.end_unix_ns - root.start_unix_ns, 13'000'000u);
  std::map<std::string, AttrValue> a;
  for (const Attribute& x : root.attributes) a[x.key] = x.value;
  EXPECT_EQ(std::get<int64_t>(a["gen_ai.usage.completion_tokens"]), 4);
  EXPECT_EQ(std::get<int64_t>(a["gen_ai.usage.prompt_tokens"]), 40);
  EXPECT_EQ(std::get<double>(a["gen_ai.request.top_p"]), 0.9);
  EXPECT_EQ(std::get<std::string>(a["gen_ai.request.id"]), "chatcmpl-1");
  EXPECT_NEAR(std::get<double>(a["gen_ai.latency.time_in_queue"]), 0.002, 1e-9);
  EXPECT_NEAR(std::get<double>(a["gen_ai.latency.time_to_first_token"]), 0.006, 1e-9);
  EXPECT_EQ(std::get<std::vector<std::string>>(a["gen_ai.response.finish_reasons"]), std::vector<std::string>{"length"});
  const char* names[] = {"queue", "prefill", "decode"};
  for (int i = 1; i < 4; ++i) {
    EXPECT_EQ(s[i].name, names[i - 1]);
    EXPECT_EQ(s[i].trace_id, root.trace_id);
    EXPECT_EQ(s[i].parent_span_id, root.span_id);
    EXPECT_NE(s[i].span_id, root.span_id);
    EXPECT_GE(s[i].start_unix_ns, root.start_unix_ns);
    EXPECT_LE(s[i].end_unix_ns, root.end_unix_ns);
    EXPECT_LE(s[i].start_unix_ns, s[i].end_unix_ns);
    for (const SpanEvent& e : s[i].events) {
      EXPECT_GE(e.time_unix_ns, s[i].start_unix_ns) << e.name;
      EXPECT_LE(e.time_unix_ns, s[i].end_unix_ns) << e.name;
    }
  }
  // prefill: two chunks then the first token; decode: the preemption and the resumption.
  std::vector<std::string> pe, de;
  for (const SpanEvent& e : s[2].events) pe.push_back(e.name);
  for (const SpanEvent& e : s[3].events) de.push_back(e.name);
  EXPECT_EQ(pe, (std::vector<std::string>{"prefill_chunk", "prefill_chunk", "first_token"}));
  EXPECT_EQ(de, (std::vector<std::string>{"preempted", "resumed"}));
  EXPECT_EQ(s[1].end_unix_ns, s[2].start_unix_ns);  // queue ends where prefill begins
  EXPECT_EQ(s[2].end_unix_ns, s[3].start_unix_ns);  // prefill ends at the first token
}

// Prompt blocks restored from the KV tiers: an event in the stage the restore fell in (the queue,
// when the scheduler looked the prompt up in a step that could not admit it yet), with its counts.
TEST(RequestSpans, KvRestoresAreEventsOfTheirStage) {
  const ClockAnchor anchor;
  const auto t0 = SteadyClock::now();
  ChoiceTimeline c;
  c.arrival = t0;
  c.queued = t0 + 1ms;
  c.scheduled = t0 + 4ms;
  c.kv_restores = {{t0 + 2ms, t0 + 3ms, 0, 64, 16}, {t0 + 4ms, t0 + 5ms, 64, 32, 0}};
  c.prefill_chunks = {{t0 + 5ms, t0 + 6ms, 96, 10}};
  c.first_token = t0 + 6ms;
  c.last_token = c.finished = t0 + 8ms;
  c.completion_tokens = 2;
  c.finish_reason = "length";
  RequestSpanInfo r;
  r.ctx.trace_id = new_trace_id();
  r.ctx.span_id = new_span_id();
  r.ctx.flags = 1;
  r.operation = "text_completion";
  r.model = "m";
  r.start = t0;
  r.end = t0 + 9ms;
  r.choices = {c};
  const std::vector<Span> s = request_spans(r, anchor);
  ASSERT_EQ(s.size(), 4u);
  const auto find = [](const Span& sp, const char* name) -> const SpanEvent* {
    for (const SpanEvent& e : sp.events)
      if (e.name == name) return &e;
    return nullptr;
  };
  const SpanEvent* q = find(s[1], "kv_restore");
  const SpanEvent* p = find(s[2], "kv_restore");
  ASSERT_NE(q, nullptr);
  ASSERT_NE(p, nullptr);
  std::map<std::string, AttrValue> qa, pa;
  for (const Attribute& x : q->attributes) qa[x.key] = x.value;
  for (const Attribute& x : p->attributes) pa[x.key] = x.value;
  EXPECT_EQ(std::get<int64_t>(qa["tokens"]), 64);
  EXPECT_EQ(std::get<int64_t>(qa["tokens_from_disk"]), 16);
  EXPECT_NEAR(std::get<double>(qa["seconds"]), 0.001, 1e-9);
  EXPECT_EQ(std::get<int64_t>(pa["position"]), 64);
  EXPECT_EQ(std::get<int64_t>(pa["tokens"]), 32);
  std::vector<std::string> pe;
  for (const SpanEvent& e : s[2].events) pe.push_back(e.name);
  EXPECT_EQ(pe, (std::vector<std::string>{"kv_restore", "prefill_chunk", "first_token"}));
}

// --- logs ------------------------------------------------------------------------------------------

TEST(Logger, JsonLinesCarryTheIdsAndFields) {
  Logger l;
  l.set_format(LogFormat::Json);
  nlohmann::ordered_json f;
  f["status"] = 200;
  f["path"] = std::string("/v1/\xff");  // invalid UTF-8 from a client does not break the line
  const std::string line = l.format_line(LogLevel::Info, "access", "POST /v1/completions 200", "cmpl-1",
                                         "4bf92f3577b34da6a3ce929d0e0e4736", f, std::chrono::system_clock::time_point(1764806400123456us));
  ASSERT_EQ(line.back(), '\n');
  EXPECT_EQ(line.find('\n'), line.size() - 1);
  const auto j = nlohmann::json::parse(line);
  EXPECT_EQ(j["timestamp"], "2025-12-04T00:00:00.123456Z");
  EXPECT_EQ(j["level"], "info");
  EXPECT_EQ(j["component"], "access");
  EXPECT_EQ(j["request_id"], "cmpl-1");
  EXPECT_EQ(j["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736");
  EXPECT_EQ(j["status"], 200);
  EXPECT_EQ(j["path"], "/v1/\xef\xbf\xbd");
  l.set_format(LogFormat::Text);
  const std::string text = l.format_line(LogLevel::Warn, "otlp", "slow", "", "", nullptr, std::chrono::system_clock::now());
  EXPECT_EQ(text, "selfserve: warning: slow\n");
  EXPECT_TRUE(parse_log_format("json").ok());
  EXPECT_FALSE(parse_log_format("xml").ok());
}
