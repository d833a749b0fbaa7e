// One choice of a generation request, on each of its two threads.
//  ChoiceFeed (engine thread): the engine's token events become Deltas — incremental text with stop
//    strings (a completed one asks the engine to stop the request; tokens after it are surplus and
//    dropped), logprobs, the finish reason — and the request's latency metrics are observed.
//  ChoiceStream (io thread): Deltas become what the client gets — SSE chunks as they come (text,
//    logprobs, the echoed prompt, tool calls held back until whole) or, unstreamed, the choice's
//    whole output at the end.
// A Mailbox carries Deltas from the one to the other.
#pragma once
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "server/metrics.h"
#include "server/openai_api.h"
#include "server/text_output.h"
#include "telemetry/telemetry.h"

namespace ss::server {

// What the engine thread hands one request's coroutine about one choice.
struct Delta {
  int choice = 0;
  std::string text;
  bool has_token = false;
  bool has_logprob = false;
  TokenLogprob lp;
  std::vector<engine::PromptLogprob> prompt_lps;  // echo + logprobs: with the first token
  engine::FinishReason finish = engine::FinishReason::None;
  std::optional<std::string> stop_reason;
  std::string error;
  // With the finish: the choice's life in the engine (timeline in usage, trace spans).
  std::shared_ptr<telemetry::ChoiceTimeline> timeline;
};

class ChoiceFeed {
 public:
  using Clock = std::chrono::steady_clock;
  ChoiceFeed(const tok::Tokenizer& tk, const GenerationRequest& g, std::vector<int32_t> stop_ids,
             Clock::time_point arrival, RequestMetrics& metrics);
  // The event as the client's delta (choice 0: the caller sets it); nullopt for a surplus token.
  // *stop: a stop string has just completed, the caller asks the engine to stop the request.
  std::optional<Delta> on_event(const engine::TokenEvent& e, bool* stop);

 private:
  TextOutput text_;
  std::vector<int32_t> stop_ids_;
  RequestMetrics& metrics_;
  int tokens_ = 0;  // token events passed on
  Clock::time_point arrival_, first_token_, last_token_;
  telemetry::ChoiceTimeline timeline_;  // marks as they come; handed out with the finish
};

// OpenAI's finish_reason for the engine's.
const char* finish_name(engine::FinishReason r);
// A request the engine gave up on: the backend failed (500), or the client's structured-output
// schema could not be followed (400, the message says why).
ApiError generation_error(const std::string& why);

class ChoiceStream {
 public:
  ChoiceStream(const GenerationRequest& g, const ModelInfo& m, const std::string& id, int64_t created, int index);
  // Streaming: the choice's first chunk (chat: the role; completions with echo: the prompt, unless it
  // waits for its logprobs, which come with the first event). Empty when there is none.
  std::string head();
  // Takes one delta of this choice: the SSE payload to send now (streaming; may be empty), or
  // nothing while the whole output accumulates (unstreamed).
  std::string apply(Delta&& d);
  bool done() const { return done_; }
  const std::optional<std::string>& error() const { return error_; }  // a finish with Error
  const ChoiceOutput& output() const { return out_; }

 private:
  std::string chunk(nlohmann::ordered_json j) const;  // SSE event, with usage so far if asked

  const GenerationRequest& g_;
  const ModelInfo& m_;
  const std::string& id_;
  int64_t created_;
  bool chat_;
  ChoiceOutput out_;
  size_t streamed_ = 0;   // text bytes already sent (completions' text_offset; "auto" tool hold-back)
  bool echo_sent_ = false;
  bool done_ = false;
  std::optional<std::string> error_;
};

}  // namespace ss::server
