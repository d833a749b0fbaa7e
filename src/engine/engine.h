// The serving engine: continuous batching over a paged KV cache with prefix reuse.
// step() = plan (Scheduler) -> backend.forward(StepBatch) -> sample rows that want it (each
// request's own Sampler) -> update state -> deliver events. Either call step() yourself or let
// start() run it on the engine's own thread; add_request / abort / stats are thread-safe.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "backend/backend.h"
#include "engine/request.h"
#include "engine/scheduler.h"

namespace ss::engine {

struct EngineConfig {
  SchedulerConfig scheduler;
  int vocab_size = 0;                       // logits per row the backend writes
  std::function<Clock::time_point()> clock;  // empty: steady_clock::now (tests inject one)
};

struct EngineStats {
  int num_running = 0;
  int num_waiting = 0;             // queued in the scheduler or not yet picked up
  double kv_usage = 0;             // referenced blocks / all blocks
  int kv_blocks_total = 0;
  int kv_blocks_used = 0;
  int kv_blocks_cached = 0;        // in the prefix index (referenced or not)
  int64_t prefix_queried_tokens = 0;
  int64_t prefix_hit_tokens = 0;
  double prefix_hit_rate = 0;      // hit / queried tokens
  int64_t preemptions = 0;
  int64_t prompt_tokens = 0;       // prompt tokens of admitted requests
  int64_t generation_tokens = 0;   // sampled tokens
  int64_t computed_tokens = 0;     // tokens through the backend (recomputation included)
  int64_t finished_requests = 0;
  int64_t steps = 0;
  // Where a step's time goes (seconds, cumulative over steps that ran a batch): the backend's
  // forward, and everything else the engine does (planning, sampling, emitting events).
  double step_seconds = 0;
  double forward_seconds = 0;
  // Steps that only decoded (no prompt tokens in the batch): how many, their wall time and the
  // tokens they sampled. tokens / seconds is the aggregate decode throughput under the load that
  // ran, without prompt processing mixed in (that shows in step_seconds and TTFT).
  int64_t decode_steps = 0;
  double decode_step_seconds = 0;
  int64_t decode_step_tokens = 0;
  // Paging waste: slots of the blocks held by running sequences that hold no token (the tails of
  // their last blocks), over all slots they hold. Sampled after each step.
  int64_t kv_slots_held = 0;
  int64_t kv_slots_filled = 0;
  double kv_paging_waste = 0;        // 1 - filled / held (0 when nothing is held)
  int64_t kv_slots_held_sum = 0;     // held and filled summed over steps: their ratio is the
  int64_t kv_slots_filled_sum = 0;   // step-averaged waste under whatever load ran
  std::string last_error;          // the last backend failure, if any
};

class Engine {
 public:
  // Block count and size come from be.kv_config(); be must outlive the engine.
  static Expected<std::unique_ptr<Engine>> create(backend::Backend& be, const EngineConfig& cfg);
  ~Engine();  // stops the run loop; live requests are dropped without events
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Validates and queues; picked up at the start of the next step. Returns the request's id.
  Expected<RequestId> add_request(Request req);
  // Finishes the request with FinishReason::Abort at the start of the next step (no-op if unknown).
  void abort(RequestId id);

  // One iteration. Not while the run loop is on. An error means the backend failed; the requests in
  // that step have then finished with FinishReason::Error.
  Status step();
  bool has_work() const;  // something queued or live

  Status start();  // runs step() on a thread of its own until stop()
  void stop();     // waits for the current step; requests stay queued

  EngineStats stats() const;  // a snapshot taken after the last step
  Status check_invariants();  // tests: only while the run loop is off

 private:
  Engine(backend::Backend& be, const EngineConfig& cfg, int num_blocks, int block_size);
  void loop();
  void refresh_stats();

  backend::Backend& be_;
  EngineConfig cfg_;
  Scheduler sched_;  // engine thread only
  StepPlan plan_;
  std::vector<Emission> emissions_;
  std::vector<float> logits_;
  std::vector<int32_t> sampled_;
  struct RowLogprobs {
    float chosen = 0.0f;
    std::vector<std::pair<int32_t, float>> top;
  };
  std::vector<RowLogprobs> logprobs_;  // per plan row, for requests that asked
  struct PromptRow {
    Sequence* seq;
    int row;  // logits row
    int pos;  // position whose logits score the prompt token at pos + 1
  };
  std::vector<PromptRow> prompt_rows_;  // this step's, for Request::prompt_logprobs
  std::vector<RequestId> released_;
  std::vector<Request> taken_;
  std::vector<RequestId> taken_aborts_;

  mutable std::mutex mu_;  // guards everything below
  std::condition_variable cv_;
  std::vector<Request> inbox_;
  std::vector<RequestId> aborts_;
  std::unordered_set<RequestId> live_;
  RequestId next_id_ = 1;
  EngineStats stats_;
  bool stop_requested_ = false;

  std::atomic<bool> looping_{false};
  std::atomic<bool> in_step_{false};
  std::thread thread_;
};

}  // namespace ss::engine
