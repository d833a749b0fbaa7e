// What a client hands the engine (Request) and what comes back (TokenEvent, one per sampled token
// plus one for a finish without a token). Plain data; the server layer fills it from OpenAI JSON.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "engine/sampler.h"
#include "engine/token_constraint.h"

namespace ss::engine {

using RequestId = uint64_t;
using Clock = std::chrono::steady_clock;

enum class FinishReason : uint8_t {
  None,     // still running
  Length,   // max_tokens (or the context) reached
  Stop,     // a stop token id, or the stop hook said so
  Abort,    // abort(id) or the cancel token
  Timeout,  // the deadline passed
  Error,    // the backend failed; TokenEvent::error says why
};
const char* to_string(FinishReason r);

// One prompt token's log-probability (the log-softmax of the raw logits at the position before it)
// and the k most likely tokens there (id, logprob), most likely first, ties by id.
struct PromptLogprob {
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top{};
};

// One event per sampled token (token >= 0). The last event of a request has finish != None; it
// carries the final token for Length/Stop and token = -1 for Abort/Timeout/Error.
struct TokenEvent {
  RequestId id = 0;
  int32_t token = -1;
  FinishReason finish = FinishReason::None;
  std::string error;  // set for FinishReason::Error
  // With Request::logprobs >= 0 (token events only): the token's log-probability and the most likely
  // tokens', from the log-softmax of the logits after logit bias and penalties and before
  // temperature / truncation.
  bool has_logprob = false;
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top_logprobs{};  // (id, logprob), most likely first, ties by id
  // With Request::prompt_logprobs >= 0, on the first token event only: prompt tokens 1 .. n-1 (the
  // first prompt token has no context to be scored in).
  std::vector<PromptLogprob> prompt_logprobs{};
};

// Called on the engine thread, without engine locks held: keep it short and non-blocking. It may
// call Engine::abort / add_request.
using EventCallback = std::function<void(const TokenEvent&)>;

// Shared with the client; setting it to true stops the request within one engine step.
using CancelToken = std::shared_ptr<std::atomic<bool>>;
inline CancelToken make_cancel_token() { return std::make_shared<std::atomic<bool>>(false); }

// Hook for stop conditions the engine cannot see (stop strings need the detokenizer): called on the
// engine thread after every sampled token with all output ids so far (the new one last); returning
// true finishes the request with FinishReason::Stop.
using StopHook = std::function<bool(std::span<const int32_t> output)>;

struct Request {
  RequestId id = 0;  // 0: the engine assigns one; otherwise unique among live requests
  std::vector<int32_t> prompt;
  SamplingParams sampling;  // sampling.seed seeds this request's own sampler (batch-independent)
  int max_tokens = 256;
  std::vector<int32_t> stop_ids;  // end-of-generation ids; the stop token is emitted, then Stop
  // vLLM's min_tokens: before this many output tokens the stop ids cannot be sampled (their logits
  // are -inf); the stop hook's owner applies the same rule to stop strings. 0 <= min_tokens <= max_tokens.
  int min_tokens = 0;
  int logprobs = -1;              // < 0: none; k >= 0: each token's logprob plus the top k (k <= 64)
  // < 0: none; k >= 0 (k <= 64): every prompt token's logprob plus the top k, delivered with the
  // first sampled token (OpenAI's echo + logprobs, what lm-eval-harness scores prompts with). Such a
  // request computes its whole prompt: it does not reuse cached prefix blocks (it still publishes).
  int prompt_logprobs = -1;
  StopHook stop_hook;             // optional
  std::shared_ptr<TokenConstraint> constraint;  // optional; applied before min_tokens' stop-id mask
  std::optional<Clock::time_point> deadline;
  CancelToken cancel;             // optional
  // Prefix-cache isolation (vLLM's cache_salt): only requests with the same salt share cached
  // blocks; empty is the shared default.
  std::string cache_salt;
  Clock::time_point arrival = Clock::now();
  EventCallback on_event;         // optional (a request nobody listens to still runs)
};

// A thread-safe queue of one request's events, for callers that pull instead of being called.
class EventQueue {
 public:
  void push(TokenEvent e);
  bool try_pop(TokenEvent& e);
  // Waits up to `timeout`; false if nothing arrived.
  bool pop(TokenEvent& e, std::chrono::milliseconds timeout);
  // A callback for Request::on_event that pushes into q.
  static EventCallback sink(std::shared_ptr<EventQueue> q);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<TokenEvent> q_;
};

}  // namespace ss::engine
