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

// Memory pressure level 3's action (issue 18): a second engine, on the CPU backend, beside the
// primary takes NEW requests while the primary's KV pool has no room. The choice is made once, when
// a request arrives; the request then stays on the engine that took it until it finishes (nothing
// is dropped, preempted or moved mid-stream). The router reads only the engines' stats(), so Engine
// itself knows nothing of backends or of the router; the server submits through it.
enum class Route : uint8_t { Primary, Fallback };
struct RouteSignals {
  bool has_fallback = false;
  int primary_level = 0;   // the primary's pressure level after its last step
  int fallback_level = 0;  // the fallback's
  int fallback_live = 0;   // requests on the fallback, queued or running, not finished
  int fallback_seats = 0;  // its max_num_seqs (0: no bound)
};
// Fallback while the primary is at level 3 and the fallback can start the request now: a free
// seat and KV room (its level below 3). Else the primary, where the request waits in the queue as
// it would without a fallback: a GPU primary frees seats far sooner than a busy CPU engine does.
Route choose_route(const RouteSignals& s);

class EngineRouter {
 public:
  // `fallback` may be null (no engine below: every request goes to the primary). Both outlive the
  // router. fallback_seats: the fallback's max_num_seqs (the server's waiting estimate counts them).
  explicit EngineRouter(Engine& primary, Engine* fallback = nullptr, int fallback_seats = 0)
      : primary_(primary), fallback_(fallback), fallback_seats_(fallback ? fallback_seats : 0) {}
  struct Placed {
    Engine* engine = nullptr;  // where the request went: stop_request / abort go there
    RequestId id = 0;
    Route route = Route::Primary;
  };
  // Thread-safe. Validates and queues on the engine choose_route picks; a request the fallback
  // refuses (e.g. longer than its max_model_len) goes to the primary. The fallback's live count is
  // the router's own (a seat taken at routing, given back by the request's finishing event), not
  // its stats(), so a burst between two of its steps cannot overfill it. `where`, when given, gets the
  // engine before the request is queued (so its first event can already find it).
  Expected<Placed> add_request(Request req, std::atomic<Engine*>* where = nullptr);
  Route route() const;  // what a request arriving now would get
  int fallback_live() const { return fallback_live_->load(std::memory_order_relaxed); }
  Engine& primary() const { return primary_; }
  Engine* fallback() const { return fallback_; }
  int fallback_seats() const { return fallback_seats_; }
  int64_t fallback_requests() const { return fallback_requests_.load(std::memory_order_relaxed); }

 private:
  Engine& primary_;
  Engine* fallback_;
  int fallback_seats_;
  std::atomic<int64_t> fallback_requests_{0};  // requests the fallback accepted
  // Requests on the fallback, not finished; shared with their event wrappers, which may run after
  // the router is gone.
  std::shared_ptr<std::atomic<int>> fallback_live_ = std::make_shared<std::atomic<int>>(0);
};

}  // namespace ss::engine
