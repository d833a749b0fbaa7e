// The CPU cost of tracing one request, measured directly (docs/perf/observability.md): what the
// server's io thread does when a sampled request ends (request_spans: the span tree of a timeline
// with one prefill chunk and a decode), what the export thread does per request (its share of
// encoding a 512-span batch), and submit(). An end-to-end A/B on a shared 2-core machine cannot
// resolve 1%; these numbers, over a request's own CPU time, bound the cost from above.
// usage: build/bench_telemetry [iterations]
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "telemetry/telemetry.h"

using namespace ss::telemetry;
using Clock = std::chrono::steady_clock;

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::atoi(argv[1]) : 20000;
  const ClockAnchor anchor;
  const auto t0 = SteadyClock::now();
  using std::chrono::microseconds;
  ChoiceTimeline c;
  c.arrival = t0;
  c.queued = t0 + microseconds(30);
  c.scheduled = t0 + microseconds(40);
  c.prefill_chunks = {{t0 + microseconds(40), t0 + microseconds(5000), 0, 24}};
  c.first_token = t0 + microseconds(5000);
  c.last_token = c.finished = t0 + microseconds(300000);
  c.completion_tokens = 128;
  c.finish_reason = "length";
  RequestSpanInfo r;
  r.ctx.trace_id = new_trace_id();
  r.ctx.span_id = new_span_id();
  r.ctx.flags = 1;
  r.operation = "text_completion";
  r.model = "SmolLM2-135M-Instruct.Q4_1";
  r.request_id = "cmpl-2aae8fa40cab441d0001";
  r.http_route = "/v1/completions";
  r.prompt_tokens = 24;
  r.max_tokens = 128;
  r.start = t0;
  r.end = t0 + microseconds(300100);
  r.choices = {c};

  // 1. io thread: the spans of one request.
  size_t spans_per_request = 0;
  auto a = Clock::now();
  for (int i = 0; i < iters; ++i) spans_per_request += request_spans(r, anchor).size();
  const double build_us = std::chrono::duration<double, std::micro>(Clock::now() - a).count() / iters;
  spans_per_request /= static_cast<size_t>(iters);

  // 2. export thread: encoding, per request (batches of 512 spans).
  std::vector<Span> batch;
  while (batch.size() + spans_per_request <= 512) {
    auto s = request_spans(r, anchor);
    batch.insert(batch.end(), s.begin(), s.end());
  }
  const size_t requests_per_batch = batch.size() / spans_per_request;
  const int enc_iters = std::max(1, iters / 100);
  size_t bytes = 0;
  a = Clock::now();
  for (int i = 0; i < enc_iters; ++i) bytes += encode_export_request({{"service.name", std::string("selfserve")}}, "selfserve", "0.1.0", batch).size();
  const double enc_us = std::chrono::duration<double, std::micro>(Clock::now() - a).count() / enc_iters / requests_per_batch;

  // 3. submit (into an exporter whose collector never answers: nothing leaves, the queue is bounded).
  ExporterOptions o;
  o.endpoint = "http://127.0.0.1:9/v1/traces";
  o.max_queue_spans = static_cast<size_t>(iters) * spans_per_request + 16;
  o.batch_delay = std::chrono::hours(1);
  o.max_batch_spans = o.max_queue_spans;
  auto ex = OtlpExporter::create(o);
  if (!ex.ok()) return std::fprintf(stderr, "%s\n", ex.message().c_str()), 1;
  std::vector<std::vector<Span>> pending;
  for (int i = 0; i < iters; ++i) pending.push_back(request_spans(r, anchor));
  a = Clock::now();
  for (auto& p : pending) (*ex)->submit(std::move(p));
  const double submit_us = std::chrono::duration<double, std::micro>(Clock::now() - a).count() / iters;
  (*ex)->shutdown(SteadyClock::now());

  std::printf("spans per request: %zu; protobuf bytes per request: %.0f\n", spans_per_request,
              static_cast<double>(bytes) / enc_iters / requests_per_batch);
  std::printf("io thread, request_spans: %.2f us/request\n", build_us);
  std::printf("export thread, encode: %.2f us/request (batches of %zu requests)\n", enc_us, requests_per_batch);
  std::printf("submit: %.3f us/request\n", submit_us);
  std::printf("total: %.2f us/request\n", build_us + enc_us + submit_us);
  return 0;
}
