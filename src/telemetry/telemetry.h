// The telemetry folder's public header: what an operator follows a request by.
//  - Trace context (W3C traceparent / tracestate): parsed from the caller, continued, returned.
//  - Spans and their OTLP/HTTP protobuf encoding (ExportTraceServiceRequest), written by hand: the
//    OpenTelemetry .proto files ship in no Debian package nor in the opentelemetry-proto PyPI
//    wheel or sdist (only generated Python), and the few messages a span needs are a page of wire
//    format; tests/e2e decodes it with the official Python package.
//  - OtlpExporter: a bounded queue and a background thread that batches spans and POSTs them. A
//    slow or dead collector never blocks the caller: past the queue's bound spans are dropped and
//    counted.
//  - A request's timeline (arrival, queued, scheduled, prefill chunks, first token, preemptions,
//    finish) and the GenAI spans built from it (request_spans).
//  - Logger: text or JSON lines (timestamp, level, component, request id, trace id) on stderr.
// Nothing here knows the engine or the server; they hand plain data in.
#pragma once
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

#include "common/status.h"

namespace ss::telemetry {

using SteadyClock = std::chrono::steady_clock;

// --- trace context -------------------------------------------------------------------------------

using TraceId = std::array<uint8_t, 16>;
using SpanId = std::array<uint8_t, 8>;

struct TraceContext {
  TraceId trace_id{};
  SpanId span_id{};        // the caller's span (parent) when parsed; ours when formatted
  uint8_t flags = 0;       // bit 0: sampled
  std::string tracestate;  // passed on unchanged (vendor list, W3C §3.3)
  bool sampled() const { return (flags & 1) != 0; }
};

bool is_zero(std::span<const uint8_t> id);
std::string to_hex(std::span<const uint8_t> bytes);
// Random, non-zero ids (a per-thread generator seeded from the OS).
TraceId new_trace_id();
SpanId new_span_id();
// W3C Trace Context: "00-<32 hex>-<16 hex>-<2 hex>" (lower-case hex, ids not all zero). A higher
// version is read by its first four fields, as the spec asks; version ff and anything malformed
// give nullopt (the caller then starts a new trace). tracestate is kept if it is at most 512 bytes.
std::optional<TraceContext> parse_traceparent(std::string_view traceparent, std::string_view tracestate = {});
std::string format_traceparent(const TraceId& trace, const SpanId& span, uint8_t flags);

// The sampler: ParentBased(TraceIdRatioBased(ratio)), OpenTelemetry's usual one. A caller's
// decision (its sampled flag) is followed; a new trace is sampled when the trace id's last 8 bytes,
// read as a big-endian number and shifted right once, fall below ratio * 2^63.
bool sample(const TraceId& trace, double ratio, const std::optional<TraceContext>& parent);

// --- spans ---------------------------------------------------------------------------------------

using AttrValue = std::variant<std::string, int64_t, double, bool, std::vector<std::string>>;
struct Attribute {
  std::string key;
  AttrValue value;
};

struct SpanEvent {
  std::string name;
  uint64_t time_unix_ns = 0;
  std::vector<Attribute> attributes;
};

enum class SpanKind : uint8_t { Internal = 1, Server = 2, Client = 3 };
enum class SpanStatus : uint8_t { Unset = 0, Ok = 1, Error = 2 };

struct Span {
  TraceId trace_id{};
  SpanId span_id{};
  SpanId parent_span_id{};  // all zero: a root span
  std::string trace_state;
  uint32_t flags = 1;       // W3C trace flags (sampled)
  std::string name;
  SpanKind kind = SpanKind::Internal;
  uint64_t start_unix_ns = 0, end_unix_ns = 0;
  std::vector<Attribute> attributes;
  std::vector<SpanEvent> events;
  SpanStatus status = SpanStatus::Unset;
  std::string status_message;
};

// opentelemetry.proto.collector.trace.v1.ExportTraceServiceRequest: one ResourceSpans (resource
// attributes) holding one ScopeSpans (scope name and version) holding `spans`.
std::string encode_export_request(const std::vector<Attribute>& resource, std::string_view scope_name,
                                  std::string_view scope_version, std::span<const Span> spans);

// steady_clock instants as Unix nanoseconds, through one (system, steady) pair read together.
class ClockAnchor {
 public:
  ClockAnchor();
  uint64_t unix_ns(SteadyClock::time_point t) const;

 private:
  int64_t system_ns_;
  SteadyClock::time_point steady_;
};

// --- the exporter --------------------------------------------------------------------------------

struct ExporterOptions {
  std::string endpoint;                 // http://host[:port][/path]; path default /v1/traces
  size_t max_queue_spans = 4096;        // spans held for export; more are dropped (and counted)
  size_t max_batch_spans = 512;         // spans per POST
  std::chrono::milliseconds batch_delay{500};  // a partial batch waits at most this long
  std::chrono::milliseconds timeout{3000};     // one POST: connect, send, read the answer
  std::vector<Attribute> resource;      // service.name and the like
  std::string scope_version;
};

struct ExporterStats {
  uint64_t spans_queued = 0;     // accepted into the queue
  uint64_t spans_exported = 0;   // in a POST the collector answered 2xx
  uint64_t spans_dropped = 0;    // queue full, or their POST failed
  uint64_t export_requests = 0;  // POSTs tried
  uint64_t export_failures = 0;  // of those, not answered 2xx (refused, timed out, an error status)
};

class OtlpExporter {
 public:
  // Checks the endpoint (only http:// is spoken) and starts the export thread.
  static Expected<std::unique_ptr<OtlpExporter>> create(ExporterOptions opts);
  ~OtlpExporter();  // shutdown(now + timeout) if not done yet
  OtlpExporter(const OtlpExporter&) = delete;
  OtlpExporter& operator=(const OtlpExporter&) = delete;

  // Never blocks on the network: a mutex and a move. Spans past the queue's room are dropped.
  void submit(std::vector<Span> spans);
  // Exports what is queued, then stops the thread; a POST in flight at `deadline` is abandoned and
  // its spans counted as dropped. Returns true if everything queued was exported.
  bool shutdown(SteadyClock::time_point deadline);
  ExporterStats stats() const;
  const std::string& endpoint() const { return opts_.endpoint; }

 private:
  explicit OtlpExporter(ExporterOptions opts);
  void run();
  bool post(const std::string& body, SteadyClock::time_point deadline);

  ExporterOptions opts_;
  std::string host_, port_, target_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Span> queue_;
  bool stopping_ = false;
  SteadyClock::time_point stop_deadline_{};
  static constexpr int64_t kNoStop = INT64_MAX;
  std::atomic<int64_t> stop_deadline_ns_{kNoStop};  // the shutdown deadline, read by a POST in flight
  std::atomic<uint64_t> queued_{0}, exported_{0}, dropped_{0}, requests_{0}, failures_{0};
  std::thread thread_;
};

// --- a request's timeline and its spans --------------------------------------------------------

// One choice's life in the engine (steady_clock; a default time_point: it did not happen).
struct ChoiceTimeline {
  struct Chunk {
    SteadyClock::time_point begin, end;
    int position = 0, tokens = 0;
  };
  SteadyClock::time_point arrival, queued, scheduled, first_token, last_token, finished;
  int cached_tokens = 0;  // prompt tokens found in the prefix cache at the first admission
  std::vector<Chunk> prefill_chunks;
  std::vector<SteadyClock::time_point> preemptions, resumptions;
  struct Restore {
    SteadyClock::time_point begin, end;
    int position = 0, tokens = 0, from_disk = 0;
  };
  std::vector<Restore> kv_restores;  // prompt blocks copied back from the KV tiers
  int completion_tokens = 0;
  std::string finish_reason;  // OpenAI's ("stop", "length", "abort", "error")
};

// {"arrival_time": unix seconds, then seconds since arrival: "queued", "scheduled",
//  "first_token", "last_token", "finished", "preemptions": [...], "prefill_chunks": n,
//  "cached_tokens"} (a stage that did not happen is null).
nlohmann::ordered_json timeline_json(const ChoiceTimeline& t, const ClockAnchor& anchor, int index);

struct RequestSpanInfo {
  TraceContext ctx;                 // trace id, our server span's id, flags, tracestate
  std::optional<SpanId> parent;     // the caller's span, when a traceparent came
  std::string operation;            // GenAI operation: "chat" or "text_completion"
  std::string model, request_id, http_route;
  int prompt_tokens = 0, max_tokens = 0, n = 1;
  double temperature = 1, top_p = 1;
  std::optional<uint64_t> seed;
  bool stream = false;
  SteadyClock::time_point start, end;
  int http_status = 200;
  std::string error;                // empty: none
  std::vector<ChoiceTimeline> choices;
};

// The request's server span "llm_request" (vLLM's name and gen_ai.* attributes: model, request id,
// max tokens, temperature, top_p, n, prompt / completion tokens, finish reasons, queue time, time
// to first token, e2e), and under it, per choice, "queue" (arrival → scheduled), "prefill"
// (scheduled → first token, an event per chunk) and "decode" (first token → finish), with events
// "first_token", "preempted", "resumed".
std::vector<Span> request_spans(const RequestSpanInfo& r, const ClockAnchor& anchor);

// --- logs ----------------------------------------------------------------------------------------

enum class LogFormat : uint8_t { Text, Json };
enum class LogLevel : uint8_t { Debug, Info, Warn, Error };
const char* to_string(LogLevel l);
Expected<LogFormat> parse_log_format(std::string_view s);

// One line per record on stderr, written whole (one write under a lock), so lines from threads never
// interleave. Text: "selfserve: [component] message key=value ...". JSON: {"timestamp" (RFC 3339,
// UTC, microseconds), "level", "component", "message", "request_id", "trace_id", then the fields}.
class Logger {
 public:
  static Logger& global();
  void set_format(LogFormat f) { format_.store(f); }
  LogFormat format() const { return format_.load(); }
  // fields: extra keys (values as JSON); request_id / trace_id empty: left out.
  void log(LogLevel level, std::string_view component, std::string_view message, std::string_view request_id = {},
           std::string_view trace_id = {}, const nlohmann::ordered_json& fields = nullptr);
  // The line as it would be written (tests).
  std::string format_line(LogLevel level, std::string_view component, std::string_view message,
                          std::string_view request_id, std::string_view trace_id, const nlohmann::ordered_json& fields,
                          std::chrono::system_clock::time_point now) const;
  // Where lines go (default stderr); tests capture them.
  void set_sink(std::FILE* f) { sink_.store(f); }

 private:
  std::atomic<LogFormat> format_{LogFormat::Text};
  std::atomic<std::FILE*> sink_{nullptr};
  std::mutex mu_;
};

// Shorthands over Logger::global().
void log_info(std::string_view component, std::string_view message);
void log_warn(std::string_view component, std::string_view message);
void log_error(std::string_view component, std::string_view message);

}  // namespace ss::telemetry
