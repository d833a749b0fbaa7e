#include "engine/engine.h"

#include <pthread.h>

#include "engine/host_executor.h"
#include "engine/resident_executor.h"

namespace ss::engine {

Expected<std::unique_ptr<Engine>> Engine::create(backend::Backend& be, const EngineConfig& cfg) {
  if (cfg.scheduling == EngineConfig::Scheduling::Persistent) {
    SS_ASSIGN(auto ex, make_persistent_executor(be, cfg.scheduler, cfg.clock, cfg.tiers));
    return create(std::move(ex));
  }
  SS_ASSIGN(auto ex, HostExecutor::create(be, cfg.scheduler, cfg.clock, cfg.tiers));
  return create(std::move(ex));
}

Expected<std::unique_ptr<Engine>> Engine::create(std::unique_ptr<backend::Executor> ex) {
  if (!ex) return make_error("no executor");
  return std::unique_ptr<Engine>(new Engine(std::move(ex)));
}

Engine::Engine(std::unique_ptr<backend::Executor> ex) : executor_(std::move(ex)) { refresh_stats(); }

Engine::~Engine() { stop(); }

Expected<RequestId> Engine::add_request(Request req) {
  SS_TRY(executor_->check(req));  // reads only immutable config
  std::lock_guard<std::mutex> lk(mu_);
  if (req.id == 0) {
    while (next_id_ == 0 || live_.count(next_id_)) ++next_id_;
    req.id = next_id_++;
  } else if (live_.count(req.id)) {
    return make_error("request id " + std::to_string(req.id) + " is already in use");
  }
  const RequestId id = req.id;
  live_.insert(id);
  inbox_.push_back(std::move(req));
  cv_.notify_one();
  return id;
}

void Engine::stop_request(RequestId id, FinishReason why) {
  std::lock_guard<std::mutex> lk(mu_);
  stops_.emplace_back(id, why);
  cv_.notify_one();
}

bool Engine::has_work() const {
  std::lock_guard<std::mutex> lk(mu_);
  return !live_.empty();
}

Status Engine::step() {
  if (in_step_.exchange(true)) return make_error("step() is already running on another thread");
  struct Clear {
    std::atomic<bool>& f;
    ~Clear() { f = false; }
  } clear{in_step_};

  {
    std::lock_guard<std::mutex> lk(mu_);
    taken_.swap(inbox_);
    taken_stops_.swap(stops_);
  }
  for (Request& r : taken_) {
    handed_[r.id] = Live{std::move(r.on_event), std::move(r.cancel)};
    executor_->start(std::move(static_cast<backend::SeqStart&>(r)));
  }
  taken_.clear();
  // Cancel tokens first, then explicit stops: a cancelled request ends as Abort whatever else asked.
  for (auto& [id, live] : handed_)
    if (!live.stop_sent && live.cancel && live.cancel->load(std::memory_order_relaxed)) {
      live.stop_sent = true;
      executor_->stop(id, FinishReason::Abort);
    }
  for (const auto& [id, why] : taken_stops_) {
    auto it = handed_.find(id);
    if (it == handed_.end() || it->second.stop_sent) continue;
    it->second.stop_sent = true;
    executor_->stop(id, why);
  }
  taken_stops_.clear();

  events_.clear();
  const Status result = executor_->poll(events_);
  finished_.clear();
  for (const backend::SeqEvent& e : events_) {
    auto it = handed_.find(e.id);
    if (it == handed_.end()) continue;
    if (it->second.on_event) it->second.on_event(e);
    if (e.finish != FinishReason::None) {
      finished_.push_back(e.id);
      handed_.erase(it);
    }
  }
  events_.clear();
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (RequestId id : finished_) live_.erase(id);
  }
  refresh_stats();
  return result;
}

void Engine::refresh_stats() {
  EngineStats s = executor_->stats();
  std::lock_guard<std::mutex> lk(mu_);
  s.num_waiting += static_cast<int>(inbox_.size());
  stats_ = std::move(s);
}

EngineStats Engine::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  return stats_;
}

Status Engine::check_invariants() {
  if (looping_) return make_error("check_invariants() needs the run loop stopped");
  return executor_->check_invariants();
}

Status Engine::start() {
  if (looping_.exchange(true)) return make_error("the engine loop is already running");
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_requested_ = false;
  }
  thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "ss-engine");
    loop();
  });
  return {};
}

void Engine::stop() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_requested_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  looping_ = false;
}

void Engine::loop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(mu_);
      // live_ covers queued, running, and stopped-but-not-yet-reaped requests.
      const auto wake = [&] { return stop_requested_ || !live_.empty(); };
      // An executor with timed housekeeping (KV blocks idling past their TTL) steps while idle too.
      if (const auto tick = executor_->idle_tick(); tick.count() > 0) {
        cv_.wait_for(lk, tick, wake);
      } else {
        cv_.wait(lk, wake);
      }
      if (stop_requested_) return;
    }
    // A backend error has already failed that step's requests (and is in stats); keep serving.
    (void)step();
  }
}

}  // namespace ss::engine
