// The host executor: a Scheduler and its KV cache manager plan each step on the CPU, a Backend runs
// it (forward pass and sampling) and returns token ids; this class turns those into events. One
// poll() is one step. Executor-thread only (the engine's thread), except check().
#pragma once
#include <functional>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "engine/kv_tiers.h"
#include "engine/scheduler.h"

namespace ss::engine {

class HostExecutor final : public backend::Executor {
 public:
  // be must outlive the executor; block count and size come from be.kv_config(). clock: the time
  // deadlines are checked against (empty: steady_clock::now).
  // tiers: the KV tiers below the backend's pool (off unless tiers.enabled(); need prefix caching).
  static Expected<std::unique_ptr<HostExecutor>> create(backend::Backend& be, const SchedulerConfig& cfg,
                                                        std::function<Clock::time_point()> clock = {},
                                                        const KvTierConfig& tiers = {});
  ~HostExecutor() override;  // a disk tier gets the pool's cached blocks, then its writes finish

  std::string name() const override { return "host (" + be_.name() + ")"; }
  Status check(const SeqStart& s) const override;
  void start(SeqStart s) override;
  void stop(SeqId id, FinishReason why) override;
  Status poll(std::vector<SeqEvent>& out) override;
  bool has_work() const override { return sched_.has_work(); }
  backend::ExecutorStats stats() const override { return stats_; }
  Status check_invariants() const override { return sched_.check_invariants(); }
  // With tiers and a TTL: idle blocks leave the pool within a second of their TTL, work or none.
  KvTiers* tiers() { return tiers_.get(); }  // null without tiers (tests: a slow loader)
  std::chrono::milliseconds idle_tick() const override {
    return tiers_ && tiers_->config().ttl_ms > 0 ? std::chrono::milliseconds(1000) : std::chrono::milliseconds(0);
  }

 private:
  HostExecutor(backend::Backend& be, const SchedulerConfig& cfg, int num_blocks, int block_size,
               std::function<Clock::time_point()> clock, std::unique_ptr<KvTiers> tiers);
  void refresh_stats();

  backend::Backend& be_;
  std::unique_ptr<KvTiers> tiers_;  // before sched_: the pool's hook points here until the end
  Scheduler sched_;
  std::function<Clock::time_point()> clock_;
  StepPlan plan_;
  backend::StepOutput result_;
  std::vector<Emission> emissions_;  // stop() adds here too; handed out at the next poll
  std::vector<SeqId> released_;
  backend::ExecutorStats stats_;
};

}  // namespace ss::engine
