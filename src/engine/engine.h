// The engine folder's public header. The serving engine owns requests: it gives them ids, queues
// them from any thread, turns cancel tokens and stop requests into the executor's stop(), and
// delivers the executor's events to each request's callback. What runs when is the executor's
// (backend/executor.h): the host executor (host_executor.h: continuous batching over a paged KV
// cache with prefix reuse, a Backend doing the steps) or a device executor. Either call step()
// yourself or let start() run it on the engine's own thread; add_request / abort / stop_request /
// stats are thread-safe.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "engine/kv_tiers.h"
#include "engine/request.h"
#include "engine/scheduler.h"

namespace ss::engine {

struct EngineConfig {
  SchedulerConfig scheduler;
  KvTierConfig tiers;  // host / disk tiers below the KV pool (off by default)
  std::function<Clock::time_point()> clock;  // empty: steady_clock::now (tests inject one)
  // host: the host executor plans every step. persistent: a resident loop (resident_executor.h)
  // admits, plans, stops and streams by itself, and the host executor takes what it cannot run.
  enum class Scheduling { Host, Persistent } scheduling = Scheduling::Host;
};

using EngineStats = backend::ExecutorStats;  // num_waiting includes requests not yet handed over

class Engine {
 public:
  // Over the host executor on `be` (block count and size from be.kv_config()); be must outlive the engine.
  static Expected<std::unique_ptr<Engine>> create(backend::Backend& be, const EngineConfig& cfg);
  // Over any executor.
  static Expected<std::unique_ptr<Engine>> create(std::unique_ptr<backend::Executor> ex);
  ~Engine();  // stops the run loop; live requests are dropped without events
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Validates and queues; handed to the executor at the start of the next step. Returns the id.
  Expected<RequestId> add_request(Request req);
  // Finishes the request with FinishReason::Abort at the start of the next step (no-op if unknown).
  void abort(RequestId id) { stop_request(id, FinishReason::Abort); }
  // Finishes the request with `why` at the start of the next step, before it samples again (no-op
  // if unknown or finished): how a stop string found by the caller ends it (FinishReason::Stop).
  void stop_request(RequestId id, FinishReason why);

  // One iteration. Not while the run loop is on. An error means the backend failed; the requests in
  // that step have then finished with FinishReason::Error.
  Status step();
  bool has_work() const;  // something queued or live

  Status start();  // runs step() on a thread of its own until stop()
  void stop();     // waits for the current step; requests stay queued

  EngineStats stats() const;  // a snapshot taken after the last step
  Status check_invariants();  // tests: only while the run loop is off
  std::string executor_name() const { return executor_->name(); }

 private:
  explicit Engine(std::unique_ptr<backend::Executor> ex);
  void loop();
  void refresh_stats();

  std::unique_ptr<backend::Executor> executor_;
  struct Live {  // engine thread only
    EventCallback on_event;
    CancelToken cancel;
    bool stop_sent = false;
  };
  std::unordered_map<RequestId, Live> handed_;  // given to the executor, not finished
  std::vector<backend::SeqEvent> events_;
  std::vector<RequestId> finished_;
  std::vector<Request> taken_;
  std::vector<std::pair<RequestId, FinishReason>> taken_stops_;

  mutable std::mutex mu_;  // guards everything below
  std::condition_variable cv_;
  std::vector<Request> inbox_;
  std::vector<std::pair<RequestId, FinishReason>> stops_;
  std::unordered_set<RequestId> live_;  // queued or handed over, not yet finished
  RequestId next_id_ = 1;
  EngineStats stats_;
  bool stop_requested_ = false;

  std::atomic<bool> looping_{false};
  std::atomic<bool> in_step_{false};
  std::thread thread_;
};

}  // namespace ss::engine
