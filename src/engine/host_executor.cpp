#include "engine/host_executor.h"

#include <chrono>

namespace ss::engine {

namespace {
constexpr int kMaxLogprobs = 64;
}

Expected<std::unique_ptr<HostExecutor>> HostExecutor::create(backend::Backend& be, const SchedulerConfig& cfg,
                                                             std::function<Clock::time_point()> clock,
                                                             const KvTierConfig& tiers) {
  SS_TRY(cfg.validate());
  const auto& kv = be.kv_config();
  if (kv.num_blocks < 1 || kv.block_size < 1)
    return make_error("backend " + be.name() + " has an empty KV cache (" + std::to_string(kv.num_blocks) +
                      " blocks of " + std::to_string(kv.block_size) + " tokens)");
  if (cfg.max_num_seqs > be.max_slots())
    return make_error("max_num_seqs (" + std::to_string(cfg.max_num_seqs) + ") is more than backend " + be.name() +
                      " keeps block tables for (" + std::to_string(be.max_slots()) + ")");
  if (!clock) clock = [] { return Clock::now(); };
  std::unique_ptr<KvTiers> t;
  if (tiers.enabled()) {
    if (!cfg.enable_prefix_caching)
      return make_error("KV tiers (--kv-host-bytes, --kv-disk-dir) keep prefix-cache blocks: they need prefix caching on");
    SS_ASSIGN(t, KvTiers::create(tiers, be));
  } else {
    SS_TRY(tiers.validate());
  }
  return std::unique_ptr<HostExecutor>(
      new HostExecutor(be, cfg, kv.num_blocks, kv.block_size, std::move(clock), std::move(t)));
}

HostExecutor::HostExecutor(backend::Backend& be, const SchedulerConfig& cfg, int num_blocks, int block_size,
                           std::function<Clock::time_point()> clock, std::unique_ptr<KvTiers> tiers)
    : be_(be), tiers_(std::move(tiers)), sched_(cfg, num_blocks, block_size, be.vocab_size()), clock_(std::move(clock)) {
  sched_.set_tiers(tiers_.get());
  refresh_stats();
}

HostExecutor::~HostExecutor() {
  if (tiers_ && !tiers_->config().disk_dir.empty()) sched_.demote_all_cached();
  sched_.set_tiers(nullptr);
}

Status HostExecutor::check(const SeqStart& s) const {
  SS_TRY(sched_.check(s));  // reads only immutable config
  if (s.logprobs > kMaxLogprobs)
    return make_error("logprobs must be <= " + std::to_string(kMaxLogprobs) + ", got " + std::to_string(s.logprobs));
  if (s.prompt_logprobs > kMaxLogprobs)
    return make_error("prompt_logprobs must be <= " + std::to_string(kMaxLogprobs) + ", got " +
                      std::to_string(s.prompt_logprobs));
  return {};
}

void HostExecutor::start(SeqStart s) { sched_.add(std::move(s)); }

void HostExecutor::stop(SeqId id, FinishReason why) { sched_.abort(id, why, emissions_); }

Status HostExecutor::poll(std::vector<SeqEvent>& out) {
  if (tiers_ && !sched_.has_work() && emissions_.empty()) {  // an idle tick: only the TTL's housekeeping
    sched_.expire_idle(clock_());
    refresh_stats();
    return {};
  }
  const auto t_begin = std::chrono::steady_clock::now();
  double forward_s = 0;
  sched_.schedule(clock_(), plan_, emissions_);
  Status result;
  if (!plan_.seqs.empty()) {
    const auto t_fwd = std::chrono::steady_clock::now();
    Status st = be_.step(plan_.batch, result_);
    forward_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_fwd).count();
    if (!st.ok()) {
      result = make_error("backend " + be_.name() + ": " + st.message());
      sched_.fail(plan_, result.message(), emissions_);
    } else {
      // Prompt logprobs: score row r of a chunk is the position num_computed + r (before update).
      for (const ScheduledSeq& d : plan_.seqs)
        for (int r = 0; r < d.num_prompt_rows; ++r) {
          backend::RowLogprobs& sc = result_.scores[static_cast<size_t>(d.prompt_row0 + r)];
          PromptLogprob& lp = d.seq->prompt_lp[static_cast<size_t>(d.seq->num_computed + r)];
          lp.logprob = sc.chosen;
          lp.top = std::move(sc.top);
        }
      sched_.update(plan_, result_, emissions_);
    }
  }
  // Nothing ran and a prefix is on its way up from a tier: wait for it here, not in a busy loop (the
  // engine polls again at once while requests are live).
  if (plan_.seqs.empty() && emissions_.empty() && sched_.num_restoring() > 0 && tiers_)
    tiers_->wait_loaded(std::chrono::milliseconds(20));
  for (Emission& e : emissions_) out.push_back(std::move(e.event));
  emissions_.clear();
  released_.clear();
  sched_.release_finished(released_);
  if (!result.ok()) stats_.last_error = result.message();
  if (!plan_.seqs.empty()) {
    const double step_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_begin).count();
    stats_.step_seconds += step_s;
    stats_.forward_seconds += forward_s;
    if (result.ok() && plan_.num_prefill_tokens == 0 && plan_.num_decode_tokens > 0) {
      ++stats_.decode_steps;
      stats_.decode_step_seconds += step_s;
      stats_.decode_step_tokens += plan_.num_decode_tokens;
      const auto lvl = static_cast<size_t>(sched_.pressure_level());
      stats_.pressure_decode_tokens[lvl] += plan_.num_decode_tokens;
      stats_.pressure_decode_seconds[lvl] += step_s;
    }
  }
  refresh_stats();
  return result;
}

void HostExecutor::refresh_stats() {
  const auto& kv = sched_.kv();
  const auto& c = sched_.counters();
  backend::ExecutorStats& s = stats_;
  s.num_running = sched_.num_running();
  s.num_waiting = sched_.num_waiting() + sched_.num_restoring();
  s.kv_blocks_total = kv.num_blocks();
  s.kv_blocks_used = kv.pool().num_used();
  s.kv_blocks_cached = kv.pool().num_cached();
  s.kv_usage = kv.usage();
  s.prefix_queried_tokens = kv.prefix_stats().queried_tokens;
  s.prefix_hit_tokens = kv.prefix_stats().hit_tokens;
  s.prefix_hit_rate = kv.prefix_stats().hit_rate();
  s.preemptions = c.preemptions;
  s.prompt_tokens = c.prompt_tokens;
  s.generation_tokens = c.generation_tokens;
  s.computed_tokens = c.computed_tokens;
  s.finished_requests = c.finished;
  s.steps = c.steps;
  const auto slots = sched_.kv_slots();
  s.kv_slots_held = slots.first;
  s.kv_slots_filled = slots.second;
  s.kv_paging_waste = slots.first > 0 ? 1.0 - double(slots.second) / double(slots.first) : 0.0;
  s.kv_slots_held_sum += slots.first;
  s.kv_slots_filled_sum += slots.second;
  const backend::BackendMemory mem = be_.memory();
  s.mem_weights_bytes = mem.weights_bytes;
  s.mem_kv_pool_bytes = mem.kv_pool_bytes;
  s.mem_scratch_bytes = mem.scratch_bytes;
  s.mem_where = mem.where;
  s.kv_block_bytes = be_.kv_block_bytes() > 0 ? be_.kv_block_bytes()
                                              : (kv.num_blocks() > 0 ? mem.kv_pool_bytes / kv.num_blocks() : 0);
  s.kv_block_tokens = kv.block_size();
  s.pressure_level = sched_.pressure_level();
  s.host_available_ratio = sched_.host_available();
  const PressureCounters& pc = sched_.pressure_counters();
  for (size_t i = 0; i < 4; ++i) s.pressure_steps[i] = pc.steps_at_level[i];
  s.pressure_demoted_early = pc.demoted_early;
  s.pressure_prefill_shrunk = pc.prefill_shrunk;
  s.pressure_admissions_capped = pc.admissions_capped;
  s.pressure_no_lower_tier = pc.no_lower_tier;
  if (tiers_) {
    const KvTierStats t = tiers_->stats();
    s.kv_host_capacity_bytes = t.host_capacity_bytes;
    s.kv_host_used_bytes = t.host_used_bytes;
    s.kv_host_blocks = t.host_blocks;
    s.kv_disk_capacity_bytes = t.disk_capacity_bytes;
    s.kv_disk_used_bytes = t.disk_used_bytes;
    s.kv_disk_blocks = t.disk_blocks;
    s.kv_demoted_evicted = t.demoted_evicted;
    s.kv_demoted_idle = t.demoted_idle;
    s.kv_restored_host = t.restored_host;
    s.kv_restored_disk = t.restored_disk;
    s.kv_restore_copy_bytes_per_s = t.restore_copy_bytes_per_s;
    s.kv_host_dropped = t.host_dropped;
    s.kv_disk_dropped = t.disk_dropped;
    s.kv_disk_writes = t.disk_writes;
    s.kv_disk_write_errors = t.disk_write_errors;
    s.kv_disk_rejected = t.disk_rejected;
    s.kv_disk_writes_stopped = t.disk_writes_stopped;
    s.kv_disk_queue_bytes = t.write_queue_bytes;
    s.kv_restored_queued = t.restored_queued;
    s.kv_demote_deferred = t.demote_deferred;
    s.kv_disk_behind_dropped = t.disk_behind_dropped;
  }
}

}  // namespace ss::engine
