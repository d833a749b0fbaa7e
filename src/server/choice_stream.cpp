#include "server/choice_stream.h"

#include <algorithm>
#include <utility>

namespace ss::server {

namespace {
double seconds(std::chrono::steady_clock::duration d) { return std::chrono::duration<double>(d).count(); }
}  // namespace

ChoiceFeed::ChoiceFeed(const tok::Tokenizer& tk, const GenerationRequest& g, std::vector<int32_t> stop_ids,
                       Clock::time_point arrival, RequestMetrics& metrics)
    : text_(tk, g.stop, g.skip_special_tokens, g.min_tokens, g.include_stop_str_in_output),
      stop_ids_(std::move(stop_ids)),
      metrics_(metrics),
      arrival_(arrival) {
  timeline_.arrival = arrival;
}

std::optional<Delta> ChoiceFeed::on_event(const engine::TokenEvent& e, bool* stop) {
  *stop = false;
  // After a stop string the choice is over: tokens an executor that ran ahead produced are surplus,
  // dropped (as vLLM does); only the finish event still counts.
  const bool surplus = e.token >= 0 && text_.stopped();
  if (surplus && e.finish == engine::FinishReason::None) return std::nullopt;
  Delta d;
  const auto now = Clock::now();
  for (const backend::SeqMark& m : e.marks) {
    using K = backend::SeqMark::Kind;
    telemetry::ChoiceTimeline& t = timeline_;
    switch (m.kind) {
      case K::Queued:
        if (t.queued == Clock::time_point{}) t.queued = m.at;
        break;
      case K::Scheduled:
        if (t.scheduled == Clock::time_point{}) {
          t.scheduled = m.at;
          t.cached_tokens = m.tokens;
        } else {
          t.resumptions.push_back(m.at);
        }
        break;
      case K::PrefillChunk: t.prefill_chunks.push_back({m.at, m.end, m.position, m.tokens}); break;
      case K::Preempted: t.preemptions.push_back(m.at); break;
      case K::KvRestore: t.kv_restores.push_back({m.at, m.end, m.position, m.tokens, m.from_disk}); break;
    }
  }
  if (e.token >= 0 && !surplus) {
    d.has_token = true;
    if (++tokens_ == 1) {
      first_token_ = now;
      metrics_.first_token(seconds(now - arrival_));
    } else {
      metrics_.token_gap(seconds(now - last_token_));
    }
    last_token_ = now;
    if (e.has_logprob) {
      d.has_logprob = true;
      d.lp = TokenLogprob{e.token, e.logprob, e.top_logprobs};
    }
    d.prompt_lps = e.prompt_logprobs;
    // A stop id ends the text without being part of it.
    const bool stop_id = e.finish == engine::FinishReason::Stop &&
                         std::find(stop_ids_.begin(), stop_ids_.end(), e.token) != stop_ids_.end();
    if (!stop_id && text_.push(e.token) && e.finish == engine::FinishReason::None) *stop = true;
  }
  d.text = text_.take();
  if (e.finish != engine::FinishReason::None) {
    // A matched stop string is the reason, whatever else ended the sequence at that token.
    engine::FinishReason fin = e.finish;
    if (text_.stopped() && fin != engine::FinishReason::Error && fin != engine::FinishReason::Abort)
      fin = engine::FinishReason::Stop;
    d.text += text_.finish();
    d.finish = fin;
    d.error = e.error;
    if (text_.stopped()) d.stop_reason = text_.matched_stop();
    metrics_.finished(fin, seconds(now - arrival_), tokens_, seconds(last_token_ - first_token_));
    telemetry::ChoiceTimeline& t = timeline_;
    if (tokens_ > 0) {
      t.first_token = first_token_;
      t.last_token = last_token_;
    }
    t.finished = now;
    t.completion_tokens = tokens_;
    t.finish_reason = finish_name(fin);
    // vLLM's stage histograms, over the stages this request went through.
    const Clock::time_point zero{};
    metrics_.stages(t.queued != zero && t.scheduled != zero ? seconds(t.scheduled - t.queued) : -1,
                    t.scheduled != zero && tokens_ > 0 ? seconds(first_token_ - t.scheduled) : -1,
                    tokens_ > 0 ? seconds(last_token_ - first_token_) : -1,
                    t.scheduled != zero && tokens_ > 0 ? seconds(last_token_ - t.scheduled) : -1);
    d.timeline = std::make_shared<telemetry::ChoiceTimeline>(std::move(timeline_));
  }
  return d;
}

const char* finish_name(engine::FinishReason r) {
  switch (r) {
    case engine::FinishReason::Stop: return "stop";
    case engine::FinishReason::Length: return "length";
    case engine::FinishReason::Timeout: return "length";  // a time budget, reported like max_tokens
    case engine::FinishReason::Abort: return "abort";
    case engine::FinishReason::Error: return "error";
    case engine::FinishReason::None: break;
  }
  return "none";
}

ApiError generation_error(const std::string& why) {
  ApiError e;
  if (why.rfind(backend::kConstraintErrorPrefix, 0) == 0) {
    e.status = 400;
    e.type = "invalid_request_error";
    e.param = "response_format";
    e.message = why;
  } else {
    e.status = 500;
    e.type = "server_error";
    e.message = "generation failed: " + why;
  }
  return e;
}

ChoiceStream::ChoiceStream(const GenerationRequest& g, const ModelInfo& m, const std::string& id, int64_t created,
                           int index)
    : g_(g), m_(m), id_(id), created_(created), chat_(g.endpoint == Endpoint::ChatCompletions) {
  out_.index = index;
}

// vLLM's continuous_usage_stats: every chunk carries its choice's usage so far.
std::string ChoiceStream::chunk(nlohmann::ordered_json j) const {
  if (g_.include_usage && g_.continuous_usage_stats)
    j["usage"] = usage_json(Usage{static_cast<int>(g_.prompts[g_.prompt_index(out_.index)].ids.size()),
                                  out_.completion_tokens});
  return sse_event(dump_json(j));
}

std::string ChoiceStream::head() {
  const int c = out_.index;
  if (chat_) {
    const std::string empty;
    return chunk(chat_chunk(g_, m_, id_, created_, c, "assistant", &empty, nullptr, nullptr));
  }
  if (g_.echo && g_.logprobs < 0) {  // with logprobs the echo waits for the prompt's (apply)
    streamed_ = g_.prompts[g_.prompt_index(c)].text.size();
    return chunk(completion_echo_chunk(g_, m_, id_, created_, c, nullptr));
  }
  return {};
}

std::string ChoiceStream::apply(Delta&& d) {
  const int c = out_.index;
  ChoiceOutput& o = out_;
  std::string payload;
  if (d.has_token) ++o.completion_tokens;
  if (!d.prompt_lps.empty()) o.prompt_logprobs = prompt_token_logprobs(g_.prompts[g_.prompt_index(c)].ids, d.prompt_lps);
  if (g_.stream && !chat_ && g_.echo && g_.logprobs >= 0 && !echo_sent_) {
    // The echoed prompt with its logprobs, which came with the choice's first event.
    echo_sent_ = true;
    payload += chunk(completion_echo_chunk(g_, m_, id_, created_, c, &o.prompt_logprobs));
    streamed_ = g_.prompts[g_.prompt_index(c)].text.size();
  }
  std::vector<TokenLogprob> lps;
  if (d.has_logprob) lps.push_back(d.lp);
  const bool done = d.finish != engine::FinishReason::None;
  if (done) {
    done_ = true;
    o.finish_reason = finish_name(d.finish);
    o.stop_reason = d.stop_reason;
    if (d.finish == engine::FinishReason::Error) error_ = d.error;
  }
  if (!g_.stream) {
    o.text += d.text;
    if (d.has_logprob) o.logprobs.push_back(std::move(d.lp));
    return payload;
  }
  if (done && d.finish == engine::FinishReason::Error) {
    payload += sse_event(error_body(generation_error(d.error)));
  } else if (chat_ && g_.tool_choice == GenerationRequest::ToolChoice::Auto) {
    // "auto": text streams as it comes until a call may begin; from there on it is held, and the
    // calls (or, when they are not whole, the held text) go out in the choice's last chunk.
    o.text += d.text;
    if (d.has_logprob) o.logprobs.push_back(std::move(d.lp));  // not yet sent
    const std::vector<TokenLogprob>* pending = g_.logprobs >= 0 ? &o.logprobs : nullptr;
    if (done) {
      payload += chunk(chat_tool_chunk(g_, m_, id_, created_, c, o.text, pending, finish_name(d.finish), streamed_));
    } else if (const size_t safe = chat::tool_content_prefix(g_.tool_format, o.text, streamed_); safe > streamed_) {
      const std::string piece = o.text.substr(streamed_, safe - streamed_);
      payload += chunk(chat_chunk(g_, m_, id_, created_, c, nullptr, &piece, pending, nullptr));
      o.logprobs.clear();
      streamed_ = safe;
    }
  } else if (chat_ && g_.tool_choice != GenerationRequest::ToolChoice::None) {
    // Tool calls go out whole, in the choice's last chunk (arguments may come in any pieces).
    o.text += d.text;
    if (d.has_logprob) o.logprobs.push_back(std::move(d.lp));
    if (done)
      payload += chunk(chat_tool_chunk(g_, m_, id_, created_, c, o.text, g_.logprobs >= 0 ? &o.logprobs : nullptr,
                                       finish_name(d.finish)));
  } else if (!d.text.empty() || d.has_logprob || done) {
    const char* fin = done ? finish_name(d.finish) : nullptr;
    if (chat_)
      payload += chunk(chat_chunk(g_, m_, id_, created_, c, nullptr, d.text.empty() && done ? nullptr : &d.text,
                                  g_.logprobs >= 0 ? &lps : nullptr, fin));
    else
      payload += chunk(completion_chunk(g_, m_, id_, created_, c, d.text, g_.logprobs >= 0 ? &lps : nullptr, streamed_,
                                        fin));
    streamed_ += d.text.size();
  }
  return payload;
}

}  // namespace ss::server
