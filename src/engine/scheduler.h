// Plans each step of the host executor (which sequences, how many tokens each) over the paged KV
// cache; the plan's StepBatch is all the backend sees. Executor-thread only. See docs/engine.md.
//
// One step: (1) finish timed-out requests; (2) one token for every running decode,
// oldest first; (3) a chunk for every running, unfinished prefill with the token budget left;
// (4) admit waiting requests (preempted first, then any request waiting too long, then the short
// lane, then the long lane) with what is left. When KV blocks run out, the newest running
// sequence is preempted (blocks freed, recomputed later from prompt + output).
// A request whose prefix a lower KV tier holds leaves its queue to restore it: it holds its blocks
// and a seat while the tiers' loader reads them, the others keep stepping, and the loaded blocks
// are copied into the pool in one batched copy a step (at most max_restore_bytes_per_step of them
// while sequences run); then it goes back to
// the front of its queue and is admitted like any other, its restored blocks as cached ones.
#pragma once
#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "engine/kv_cache_manager.h"
#include "engine/memory_pressure.h"

namespace ss::engine {

using backend::Clock;
using backend::FinishReason;
using backend::PromptLogprob;
using backend::SeqEvent;
using backend::SeqId;
using backend::SeqStart;

struct SchedulerConfig {
  int max_num_seqs = 64;              // sequences per step
  int max_num_batched_tokens = 2048;  // tokens per step (decodes + prefill chunks); >= max_num_seqs
  int long_prompt_threshold = 512;    // prompts this long or longer wait in the long lane
  // While short prompts wait or prefill, long-lane prefills take at most this many tokens per
  // step, so a long prompt cannot hold the whole budget. 0: max_num_batched_tokens / 2.
  int max_long_prefill_tokens = 0;
  // In a step that also decodes, prefill chunks (running and newly admitted, both lanes) take at most
  // this many tokens, so one step — and so every running stream's time per output token — stays
  // short while long prompts prefill. 0: no cap beyond max_num_batched_tokens.
  int max_prefill_tokens_with_decodes = 0;
  // A waiting request older than this (steps since it arrived, or wall time if > 0) is admitted
  // before any other lane: neither lane can starve the other.
  int max_wait_steps = 32;
  std::chrono::milliseconds max_wait_time{0};
  bool enable_prefix_caching = true;
  int max_model_len = 0;  // prompt + max_tokens limit; 0: the whole KV cache
  PressureConfig pressure;  // memory pressure levels (memory_pressure.h)
  // Restores while sequences run (everything loaded goes at once when nothing runs; at least one
  // block a step). A step's restores are one batched copy (Backend::write_kv_blocks: every block
  // issued, one wait), so what they cost the running streams is their bytes over the link, not a
  // round trip per block; and the link is ~25-50 GB/s of pinned host-to-GPU DMA on a GPU but a host
  // memcpy on the CPU backend (~7 GB/s timed into the pool on the 2-core development VM by
  // bench_kv_tiers, 2026-12-06), so no one byte count suits both. Hence two bounds:
  //  - restore_ms_per_step: the bytes the tiers' measured copy rate (KvTiers::copy_bytes_per_s, the
  //    batches timed as they go) moves in this long; 8 MiB until a batch has been timed. 0: off. On
  //    the CPU backend a restoring step costs more than its timed copy (the copied bytes evict the
  //    weights from the caches): with 4 ms, restoring steps ran 10-11 ms longer than others on the VM,
  //    and with 64 MiB alone 27-42 ms (docs/perf/memory.md, 2026-12-06). 2 ms is about the old
  //    32-block pace there (~38 blocks a step; restoring steps 5-7 ms longer, the old bound's ~4,
  //    on a 12-25 ms step), and 50-100 MB at a GPU's 25-50 GB/s.
  //  - max_restore_bytes_per_step: a cap in bytes whatever the rate. 64 MiB is ~1.3-2.7 ms at
  //    25-50 GB/s against an 8B decode step of ~5-7 ms, and at 8B the 32 blocks of before (with one
  //    wait instead of 32): on a GPU above ~33 GB/s it is the bound that holds.
  // The streams lose the history's bytes over the link in total whatever the bounds; they set how
  // many steps that is spread over, and so the stall of each and the returning turn's wait.
  int64_t max_restore_bytes_per_step = int64_t(64) << 20;
  double restore_ms_per_step = 2.0;

  Status validate() const;
};

enum class Lane : uint8_t { Short, Long };

// A sequence inside the host executor, owned by the Scheduler.
struct Sequence {
  enum class State : uint8_t { Waiting, Restoring, Running, Finished };
  enum class Queue : uint8_t { None, Resumed, Short, Long };

  explicit Sequence(SeqStart r);
  int num_tokens() const { return static_cast<int>(tokens.size()); }
  int num_output() const { return num_tokens() - num_prompt; }
  std::span<const int32_t> prompt() const { return {tokens.data(), static_cast<size_t>(num_prompt)}; }
  std::span<const int32_t> output() const {
    return {tokens.data() + num_prompt, static_cast<size_t>(num_output())};
  }

  SeqStart req;                 // prompt moved out into tokens
  std::vector<int32_t> tokens;  // prompt, then sampled ids
  int num_prompt = 0;
  int num_computed = 0;         // leading tokens whose K/V is in the cache
  SeqBlocks kv;
  int slot = -1;                // the backend's block table while running (-1: none)
  int blocks_sent = 0;          // entries of kv.table the backend's table for `slot` holds
  Lane lane = Lane::Short;
  State state = State::Waiting;
  Queue queue = Queue::None;
  Queue return_queue = Queue::None;  // Restoring: the queue it goes back to the front of
  uint64_t arrival_order = 0;   // lower: older
  uint64_t admit_order = 0;     // on (re)admission; the highest running one is preempted first
  int64_t arrival_step = 0;
  int num_preemptions = 0;
  bool prefix_counted = false;  // hit-rate counters see each request once
  // SeqStart::prompt_logprobs: filled by the executor as prefill chunks run; moved into the first
  // token's event, after which the sequence is an ordinary one (e.g. when resumed).
  std::vector<PromptLogprob> prompt_lp;
  bool prompt_lp_sent = false;
  bool wants_prompt_lp() const { return req.prompt_logprobs >= 0 && !prompt_lp_sent; }
  // Logits rows a chunk of n tokens from position c needs for prompt logprobs: positions
  // [c, min(c + n, num_prompt - 1)), each scoring the prompt token after it.
  int prompt_rows(int c, int n) const {
    return wants_prompt_lp() ? std::max(0, std::min(c + n, num_prompt - 1) - c) : 0;
  }
  FinishReason finish = FinishReason::None;
  std::vector<backend::SeqMark> marks;  // not yet handed out (SeqEvent::marks)
};

// One sequence's part in a step, in the same order as batch.seq_slot.
struct ScheduledSeq {
  Sequence* seq = nullptr;
  int num_tokens = 0;   // fed this step, from seq->num_computed on
  int sample_row = -1;  // >= 0: this step ends at the last known token, so a token is sampled
  // Prompt logprobs: score rows [prompt_row0, prompt_row0 + num_prompt_rows) are the positions
  // from the chunk's start (seq->num_computed before the step) on.
  int prompt_row0 = -1;
  int num_prompt_rows = 0;
};

struct StepPlan {
  backend::StepBatch batch;
  std::vector<ScheduledSeq> seqs;
  int num_decode_tokens = 0;
  int num_prefill_tokens = 0;
  int num_preempted = 0;
  void clear();
};

// An event for the executor to hand out after the step.
struct Emission {
  Sequence* seq;  // alive until Scheduler::release_finished
  SeqEvent event;
};

struct SchedulerCounters {
  int64_t steps = 0;
  int64_t preemptions = 0;
  int64_t prompt_tokens = 0;      // prompt lengths of admitted requests (first admission)
  int64_t generation_tokens = 0;  // sampled tokens
  int64_t computed_tokens = 0;    // tokens run through the backend, recomputation included
  int64_t finished = 0;
};

class Scheduler {
 public:
  // Score rows per step for prompt logprobs, all sequences together (so the backend's logits
  // rows stay bounded: max_num_seqs + this many); longer prompts take several steps.
  static constexpr int kMaxPromptLogprobRows = 128;

  Scheduler(const SchedulerConfig& cfg, int num_blocks, int block_size, int vocab_size);

  // Admission control: a clear error if the request is malformed or could never fit the cache.
  Status check(const SeqStart& r) const;
  void add(SeqStart r);  // r passed check(); its id is unique among live sequences
  // Finishes a live sequence now (no-op for an unknown id).
  void abort(SeqId id, FinishReason why, std::vector<Emission>& out);
  // Plans the next step into plan (reusing its buffers).
  void schedule(Clock::time_point now, StepPlan& plan, std::vector<Emission>& out);
  // Applies a completed step: the token of plan.seqs[i] is out.tokens[sample_row] if it has one;
  // prompt logprobs were stored by the caller; logprobs come from out.logprobs.
  void update(const StepPlan& plan, const backend::StepOutput& out, std::vector<Emission>& out_events);
  // The step failed: every sequence in the plan finishes with FinishReason::Error.
  void fail(const StepPlan& plan, const std::string& error, std::vector<Emission>& out);
  // Deletes sequences finished since the last call (call after delivering their events).
  void release_finished(std::vector<SeqId>& released);

  bool has_work() const { return !seqs_.empty(); }
  int num_running() const { return static_cast<int>(running_.size()); }
  // {slots in the blocks held by running sequences, slots of those holding a computed token}.
  std::pair<int64_t, int64_t> kv_slots() const;
  int num_waiting() const { return static_cast<int>(resumed_.size() + short_.size() + long_.size()); }
  int num_restoring() const { return static_cast<int>(restoring_.size()); }  // not counted as waiting
  const KvCacheManager& kv() const { return kv_; }
  // Lower KV tiers (kv_tiers.h; null: none). Each schedule() first demotes blocks idle past their TTL.
  void set_tiers(KvTiers* tiers) { kv_.set_tiers(tiers); }
  void demote_all_cached() { kv_.demote_all_cached(); }
  // Demotes every block idle past the TTL (an idle engine's tick; schedule() demotes at most
  // kMaxIdleDemotionsPerStep a step while sequences run).
  void expire_idle(Clock::time_point now) { kv_.expire_idle(now, INT_MAX); }
  // A 4,000-token history is 250 blocks (92 MB on the default model): copied out in one step, it
  // would stall every running stream for that step. 32 blocks is ~12 MB a step there.
  static constexpr int kMaxIdleDemotionsPerStep = 32;
  // Restored blocks copied into the pool per step while sequences run (SchedulerConfig's two
  // bounds in blocks of the tiers' size, at least 1; INT_MAX without tiers).
  int max_restore_blocks_per_step() const;
  const SchedulerCounters& counters() const { return counters_; }
  // The memory-pressure level of the last step (0..3), its actions, and the host's available
  // memory fraction it saw (1 when unknown).
  int pressure_level() const { return level_; }
  const PressureCounters& pressure_counters() const { return pressure_; }
  double host_available() const { return host_available_; }
  const SchedulerConfig& config() const { return cfg_; }
  int max_model_len() const { return max_len_; }
  // Every block's ref count equals the number of tables holding it, tables match computed
  // lengths, queues match states (tests, debugging; O(blocks + tokens)).
  Status check_invariants() const;

 private:
  struct Decision {
    Sequence* seq;
    int num_tokens;
    bool long_charged;  // counted against long_left_
    int prompt_rows = 0;  // counted against plp_left_
  };
  // A prefill chunk's size within the prompt-logprob rows left this step.
  int cap_prompt_rows(const Sequence* s, int c, int want) const;
  void reap(Clock::time_point now, std::vector<Emission>& out);
  void finish(Sequence* s, FinishReason why, int32_t token, std::vector<Emission>& out,
              std::string error = {});
  // Slots for `want` more tokens of running s; preempts newer sequences if needed. Returns the
  // tokens granted: want, fewer for a prefill when memory is short, 0 if s got nothing.
  int reserve(Sequence* s, int want, bool is_decode);
  void preempt(Sequence* victim);
  Sequence* peek_waiting(Clock::time_point now, bool allow_long) const;
  void pop_waiting(Sequence* s);
  void remove_running(Sequence* s);  // also gives its slot back
  bool waited_too_long(const Sequence* s, Clock::time_point now) const;
  int64_t short_demand(int max_seqs) const;
  void build_batch(StepPlan& plan);
  void update_pressure(Clock::time_point now);
  void finish_restores();  // restores that ended go back to the front of their queues

  SchedulerConfig cfg_;
  int vocab_;
  int max_len_;
  int long_cap_;
  KvCacheManager kv_;
  std::unordered_map<SeqId, std::unique_ptr<Sequence>> seqs_;      // every live sequence
  std::vector<Sequence*> running_;                                 // admission order
  std::deque<Sequence*> resumed_, short_, long_;                   // waiting lanes
  std::vector<Sequence*> restoring_;                               // restoring their prefix
  std::vector<Sequence*> restored_;                                // back in a queue this step, holding it
  std::vector<Sequence*> finished_;
  std::vector<Decision> decisions_;
  std::vector<BlockId> hits_;
  std::vector<int> free_slots_;  // block-table slots of the backend not held by a running sequence
  uint64_t next_arrival_ = 0, next_admit_ = 0;
  int budget_ = 0, long_left_ = 0, plp_left_ = 0;
  bool preempted_this_step_ = false;
  Clock::time_point step_began_{};  // steady_clock, for prefill-chunk marks
  SchedulerCounters counters_;
  int level_ = 0;
  PressureCounters pressure_;
  double host_available_ = 1;
  Clock::time_point host_sampled_{};
};

}  // namespace ss::engine
