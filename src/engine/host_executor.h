// The host executor: a Scheduler and its KV cache manager plan each step on the CPU, a Backend runs
// it (forward pass and sampling) and returns token ids; this class turns those into events. One
// poll() is one step. Executor-thread only (the engine's thread), except check().
#pragma once
#include <functional>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "engine/scheduler.h"

namespace ss::engine {

class HostExecutor final : public backend::Executor {
 public:
  // be must outlive the executor; block count and size come from be.kv_config(). clock: the time
  // deadlines are checked against (empty: steady_clock::now).
  static Expected<std::unique_ptr<HostExecutor>> create(backend::Backend& be, const SchedulerConfig& cfg,
                                                        std::function<Clock::time_point()> clock = {});

  std::string name() const override { return "host (" + be_.name() + ")"; }
  Status check(const SeqStart& s) const override;
  void start(SeqStart s) override;
  void stop(SeqId id, FinishReason why) override;
  Status poll(std::vector<SeqEvent>& out) override;
  bool has_work() const override { return sched_.has_work(); }
  backend::ExecutorStats stats() const override { return stats_; }
  Status check_invariants() const override { return sched_.check_invariants(); }

 private:
  HostExecutor(backend::Backend& be, const SchedulerConfig& cfg, int num_blocks, int block_size,
               std::function<Clock::time_point()> clock);
  void refresh_stats();

  backend::Backend& be_;
  Scheduler sched_;
  std::function<Clock::time_point()> clock_;
  StepPlan plan_;
  backend::StepOutput result_;
  std::vector<Emission> emissions_;  // stop() adds here too; handed out at the next poll
  std::vector<SeqId> released_;
  backend::ExecutorStats stats_;
};

}  // namespace ss::engine
