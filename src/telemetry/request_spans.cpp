#include <algorithm>
#include <cmath>

#include "telemetry/telemetry.h"

namespace ss::telemetry {

namespace {

bool happened(SteadyClock::time_point t) { return t != SteadyClock::time_point{}; }
double seconds(SteadyClock::duration d) { return std::chrono::duration<double>(d).count(); }
double micro_round(double s) { return std::round(s * 1e6) / 1e6; }

// OTLP Span.flags bits 8 and 9: the parent's remoteness is known (8) and it is remote (9).
constexpr uint32_t kParentKnown = 0x100, kParentRemote = 0x200;

}  // namespace

nlohmann::ordered_json timeline_json(const ChoiceTimeline& t, const ClockAnchor& anchor, int index) {
  nlohmann::ordered_json j;
  j["index"] = index;
  j["arrival_time"] = static_cast<double>(anchor.unix_ns(t.arrival)) / 1e9;
  const auto rel = [&](SteadyClock::time_point p) -> nlohmann::ordered_json {
    if (!happened(p)) return nullptr;
    return micro_round(seconds(p - t.arrival));
  };
  j["queued"] = rel(t.queued);
  j["scheduled"] = rel(t.scheduled);
  j["first_token"] = rel(t.first_token);
  j["last_token"] = rel(t.last_token);
  j["finished"] = rel(t.finished);
  nlohmann::ordered_json pre = nlohmann::ordered_json::array();
  for (const auto& p : t.preemptions) pre.push_back(rel(p));
  j["preemptions"] = std::move(pre);
  j["prefill_chunks"] = t.prefill_chunks.size();
  j["cached_tokens"] = t.cached_tokens;
  return j;
}

std::vector<Span> request_spans(const RequestSpanInfo& r, const ClockAnchor& anchor) {
  std::vector<Span> out;
  const auto ns = [&](SteadyClock::time_point t) { return anchor.unix_ns(t); };
  Span root;
  root.trace_id = r.ctx.trace_id;
  root.span_id = r.ctx.span_id;
  if (r.parent) root.parent_span_id = *r.parent;
  root.trace_state = r.ctx.tracestate;
  root.flags = r.ctx.flags | kParentKnown | (r.parent ? kParentRemote : 0u);
  root.name = "llm_request";
  root.kind = SpanKind::Server;
  root.start_unix_ns = ns(r.start);
  root.end_unix_ns = ns(r.end);

  int completion = 0;
  std::vector<std::string> reasons;
  std::optional<double> queue_s, ttft_s, prefill_s, decode_s, inference_s;
  const auto keep_min = [](std::optional<double>& v, double x) { v = v ? std::min(*v, x) : x; };
  const auto keep_max = [](std::optional<double>& v, double x) { v = v ? std::max(*v, x) : x; };
  for (const ChoiceTimeline& c : r.choices) {
    completion += c.completion_tokens;
    reasons.push_back(c.finish_reason);
    if (happened(c.scheduled)) keep_min(queue_s, seconds(c.scheduled - c.arrival));
    if (happened(c.first_token)) keep_min(ttft_s, seconds(c.first_token - c.arrival));
    if (happened(c.first_token) && happened(c.scheduled)) keep_max(prefill_s, seconds(c.first_token - c.scheduled));
    if (happened(c.last_token) && happened(c.first_token)) keep_max(decode_s, seconds(c.last_token - c.first_token));
    if (happened(c.last_token) && happened(c.scheduled)) keep_max(inference_s, seconds(c.last_token - c.scheduled));
  }
  auto& a = root.attributes;
  // OpenTelemetry GenAI semantic conventions, and the names vLLM's tracing uses beside them.
  a.push_back({"gen_ai.operation.name", r.operation});
  a.push_back({"gen_ai.system", std::string("selfserve")});
  a.push_back({"gen_ai.request.model", r.model});
  a.push_back({"gen_ai.response.model", r.model});
  a.push_back({"gen_ai.request.id", r.request_id});
  a.push_back({"gen_ai.response.id", r.request_id});
  a.push_back({"gen_ai.request.max_tokens", static_cast<int64_t>(r.max_tokens)});
  a.push_back({"gen_ai.request.temperature", r.temperature});
  a.push_back({"gen_ai.request.top_p", r.top_p});
  a.push_back({"gen_ai.request.n", static_cast<int64_t>(r.n)});
  if (r.seed) a.push_back({"gen_ai.request.seed", static_cast<int64_t>(*r.seed)});
  a.push_back({"gen_ai.usage.prompt_tokens", static_cast<int64_t>(r.prompt_tokens)});
  a.push_back({"gen_ai.usage.completion_tokens", static_cast<int64_t>(completion)});
  a.push_back({"gen_ai.usage.input_tokens", static_cast<int64_t>(r.prompt_tokens)});
  a.push_back({"gen_ai.usage.output_tokens", static_cast<int64_t>(completion)});
  a.push_back({"gen_ai.usage.num_sequences", static_cast<int64_t>(r.choices.size())});
  a.push_back({"gen_ai.response.finish_reasons", reasons});
  if (queue_s) a.push_back({"gen_ai.latency.time_in_queue", *queue_s});
  if (ttft_s) a.push_back({"gen_ai.latency.time_to_first_token", *ttft_s});
  if (prefill_s) a.push_back({"gen_ai.latency.time_in_model_prefill", *prefill_s});
  if (decode_s) a.push_back({"gen_ai.latency.time_in_model_decode", *decode_s});
  if (inference_s) a.push_back({"gen_ai.latency.time_in_model_inference", *inference_s});
  a.push_back({"gen_ai.latency.e2e", seconds(r.end - r.start)});
  a.push_back({"http.request.method", std::string("POST")});
  a.push_back({"http.route", r.http_route});
  a.push_back({"http.response.status_code", static_cast<int64_t>(r.http_status)});
  a.push_back({"selfserve.stream", r.stream});
  if (!r.error.empty()) {
    root.status = SpanStatus::Error;
    root.status_message = r.error;
    a.push_back({"error.type", std::string(r.http_status >= 500 ? "server_error" : "invalid_request")});
  }

  const auto child = [&](const char* name, SteadyClock::time_point b, SteadyClock::time_point e, int index) {
    Span s;
    s.trace_id = root.trace_id;
    s.span_id = new_span_id();
    s.parent_span_id = root.span_id;
    s.trace_state = root.trace_state;
    s.flags = r.ctx.flags | kParentKnown;
    s.name = name;
    s.start_unix_ns = ns(b);
    s.end_unix_ns = ns(std::max(b, e));
    s.attributes.push_back({"gen_ai.choice.index", static_cast<int64_t>(index)});
    return s;
  };
  out.push_back(std::move(root));
  for (size_t i = 0; i < r.choices.size(); ++i) {
    const ChoiceTimeline& c = r.choices[i];
    const int idx = static_cast<int>(i);
    const auto end = happened(c.finished) ? c.finished : r.end;
    // queue: arrival → first admission (or the end, for a choice never scheduled).
    Span q = child("queue", c.arrival, happened(c.scheduled) ? c.scheduled : end, idx);
    if (happened(c.queued))
      q.events.push_back({"engine_queued", ns(c.queued), {}});
    // A restore from the KV tiers happens when the scheduler looks the prompt up, which may be in
    // a step that cannot admit it yet: the event goes to the stage it fell in.
    const auto restore_event = [&](const ChoiceTimeline::Restore& k) {
      return SpanEvent{"kv_restore",
                       ns(k.end),
                       {{"position", static_cast<int64_t>(k.position)},
                        {"tokens", static_cast<int64_t>(k.tokens)},
                        {"tokens_from_disk", static_cast<int64_t>(k.from_disk)},
                        {"seconds", seconds(k.end - k.begin)}}};
    };
    for (const auto& k : c.kv_restores)
      if (!happened(c.scheduled) || k.end < c.scheduled) q.events.push_back(restore_event(k));
    out.push_back(std::move(q));
    if (!happened(c.scheduled)) continue;
    // prefill: admission → first token; one event per chunk the engine ran.
    const auto prefill_end = happened(c.first_token) ? c.first_token : end;
    Span p = child("prefill", c.scheduled, prefill_end, idx);
    p.attributes.push_back({"gen_ai.usage.cached_tokens", static_cast<int64_t>(c.cached_tokens)});
    p.attributes.push_back({"selfserve.prefill_chunks", static_cast<int64_t>(c.prefill_chunks.size())});
    for (const auto& k : c.kv_restores)
      if (k.end >= c.scheduled) p.events.push_back(restore_event(k));
    for (const auto& ch : c.prefill_chunks)
      p.events.push_back({"prefill_chunk",
                          ns(ch.end),
                          {{"position", static_cast<int64_t>(ch.position)},
                           {"tokens", static_cast<int64_t>(ch.tokens)},
                           {"seconds", seconds(ch.end - ch.begin)}}});
    Span d;
    const bool decoded = happened(c.first_token);
    if (decoded) {
      p.events.push_back({"first_token", ns(c.first_token), {}});
      d = child("decode", c.first_token, end, idx);
      d.attributes.push_back({"gen_ai.usage.completion_tokens", static_cast<int64_t>(c.completion_tokens)});
      d.attributes.push_back({"gen_ai.response.finish_reason", c.finish_reason});
    }
    // A preemption (and the resumption after it) belongs to the stage it interrupted.
    const auto place = [&](const char* name, SteadyClock::time_point t) {
      Span& s = decoded && t >= c.first_token ? d : p;
      s.events.push_back({name, ns(t), {}});
    };
    for (const auto& t : c.preemptions) place("preempted", t);
    for (const auto& t : c.resumptions) place("resumed", t);
    const auto by_time = [](const SpanEvent& x, const SpanEvent& y) { return x.time_unix_ns < y.time_unix_ns; };
    std::stable_sort(p.events.begin(), p.events.end(), by_time);
    out.push_back(std::move(p));
    if (decoded) {
      std::stable_sort(d.events.begin(), d.events.end(), by_time);
      d.attributes.push_back({"selfserve.preemptions", static_cast<int64_t>(c.preemptions.size())});
      out.push_back(std::move(d));
    }
  }
  return out;
}

}  // namespace ss::telemetry
