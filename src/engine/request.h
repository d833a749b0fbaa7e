// What a client hands the engine (Request: the sequence the executor runs, plus how to reach the
// client) and what comes back (TokenEvent, one per sampled token plus one for a finish without a
// token). Plain data; the server layer fills it from OpenAI JSON.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>

#include "backend/backend.h"

namespace ss::engine {

using RequestId = backend::SeqId;
using Clock = backend::Clock;
using backend::FinishReason;
using backend::PromptLogprob;
using backend::SamplingParams;
using backend::to_string;
using TokenEvent = backend::SeqEvent;
using TokenConstraint = backend::TokenMask;  // structured outputs (structured/ implements it)
using backend::kConstraintErrorPrefix;

// Called on the engine thread, without engine locks held: keep it short and non-blocking. It may
// call Engine::abort / stop_request / add_request.
using EventCallback = std::function<void(const TokenEvent&)>;

// Shared with the client; setting it to true stops the request within one engine step.
using CancelToken = std::shared_ptr<std::atomic<bool>>;
inline CancelToken make_cancel_token() { return std::make_shared<std::atomic<bool>>(false); }

// The sequence itself (backend::SeqStart: prompt, sampling, stops, limits, logprobs, constraint,
// deadline, cache salt; id 0: the engine assigns one, otherwise unique among live requests), and
// the engine's side of it. Stop strings are the caller's: it reads the text and calls
// Engine::stop_request(id, FinishReason::Stop) (trimming any surplus tokens it sees after).
struct Request : backend::SeqStart {
  CancelToken cancel;      // optional
  EventCallback on_event;  // optional (a request nobody listens to still runs)
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
