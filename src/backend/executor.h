// The executor boundary: what runs sequences, step after step, once the engine has handed them
// over. The engine owns requests (ids, the inbox, cancellation, events to clients); an executor
// decides what runs when and reports back by events. Two kinds implement it: the host executor
// (engine/host_executor.h: a scheduler and KV cache manager planning each step on the CPU, a
// Backend running it) and a device executor (a resident GPU loop that admits, plans, samples and
// stops by itself, fed through rings). Plain data only crosses it.
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backend/sampling.h"
#include "common/status.h"

namespace ss::backend {

using SeqId = uint64_t;
using Clock = std::chrono::steady_clock;

enum class FinishReason : uint8_t {
  None,     // still running
  Length,   // max_tokens (or the context) reached
  Stop,     // a stop token id, the grammar completed, or stop(id, Stop) (a stop string)
  Abort,    // stop(id, Abort): the client went away or cancelled
  Timeout,  // the deadline passed
  Error,    // the backend failed, or the grammar could not go on; the event's error says why
};
const char* to_string(FinishReason r);

// One prompt token's log-probability (the log-softmax of the raw logits at the position before it)
// and the k most likely tokens there (id, logprob), most likely first, ties by id.
struct PromptLogprob {
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top{};
};

// A sequence handed to an executor.
struct SeqStart {
  SeqId id = 0;                   // unique among live sequences
  std::vector<int32_t> prompt;
  SamplingParams sampling;        // sampling.seed: the counter-based RNG's seed (batch-independent)
  int max_tokens = 256;
  std::vector<int32_t> stop_ids;  // end-of-generation ids; the stop token is emitted, then Stop
  // vLLM's min_tokens: before this many output tokens the stop ids cannot be sampled (their logits
  // are -inf); whoever stops on stop strings applies the same rule. 0 <= min_tokens <= max_tokens.
  int min_tokens = 0;
  int logprobs = -1;              // < 0: none; k >= 0: each token's logprob plus the top k (k <= 64)
  // < 0: none; k >= 0 (k <= 64): every prompt token's logprob plus the top k, delivered with the
  // first sampled token (OpenAI's echo + logprobs). Such a sequence computes its whole prompt: it
  // does not reuse cached prefix blocks (it still publishes).
  int prompt_logprobs = -1;
  std::shared_ptr<TokenMask> constraint;  // optional structured output; applied before min_tokens' stop-id ban
  std::optional<Clock::time_point> deadline;  // the executor finishes it with Timeout past this
  // Prefix-cache isolation (vLLM's cache_salt): only sequences with the same salt share cached
  // blocks; empty is the shared default.
  std::string cache_salt;
  Clock::time_point arrival = Clock::now();
  // What the caller already holds for it (a memory manager restoring a prefix): the first
  // cached_prefix tokens' K/V sit in reserved_blocks. The host executor looks its prefix cache up
  // itself and needs neither (0 / empty).
  int cached_prefix = 0;
  std::vector<int32_t> reserved_blocks;
};

// What happened to a sequence between its events, for timelines and traces (steady_clock). The
// executor collects them and hands them out with the sequence's next event (the first token's
// carries its admission and prefill chunks; a later one a preemption and the resumption).
struct SeqMark {
  enum class Kind : uint8_t {
    Queued,        // handed to the executor
    Scheduled,     // admitted to run (again, after a preemption); tokens: prompt tokens found cached
    PrefillChunk,  // a step computed tokens [position, position + tokens) of the prompt (or, after a
                   // preemption, of prompt + output); at: the step's start, end: its end
    Preempted,     // its KV blocks were taken back; it waits and is recomputed later
    KvRestore,     // prompt blocks the pool had lost were copied back from a lower KV tier instead of
                   // recomputed: tokens [position, position + tokens), from_disk of them from disk;
                   // at / end: the copies' start and end
  };
  Kind kind = Kind::Queued;
  Clock::time_point at{};
  Clock::time_point end{};
  int32_t position = 0;
  int32_t tokens = 0;
  int32_t from_disk = 0;  // KvRestore
};

// One event per sampled token (token >= 0). The last event of a sequence has finish != None; it
// carries the final token for Length/Stop on a sampled token and token = -1 otherwise.
struct SeqEvent {
  SeqId id = 0;
  int32_t token = -1;
  FinishReason finish = FinishReason::None;
  std::string error;  // set for FinishReason::Error
  // With logprobs >= 0 (token events only): the token's log-probability and the most likely
  // tokens', from the log-softmax of the logits after logit bias, penalties and the mask, before
  // temperature / truncation.
  bool has_logprob = false;
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top_logprobs{};  // (id, logprob), most likely first, ties by id
  // With prompt_logprobs >= 0, on the first token event only: prompt tokens 1 .. n-1.
  std::vector<PromptLogprob> prompt_logprobs{};
  int32_t kv_blocks_filled = 0;  // KV blocks of this sequence full of computed K/V, after this event
  std::vector<SeqMark> marks{};  // since the sequence's previous event, oldest first
};

// What an executor reports of itself (a snapshot after its last step).
struct ExecutorStats {
  int num_running = 0;
  int num_waiting = 0;             // handed over, not running yet (queued or preempted)
  double kv_usage = 0;             // referenced blocks / all blocks
  int kv_blocks_total = 0;
  int kv_blocks_used = 0;
  int kv_blocks_cached = 0;        // in the prefix index (referenced or not)
  int64_t prefix_queried_tokens = 0;
  int64_t prefix_hit_tokens = 0;
  double prefix_hit_rate = 0;      // hit / queried tokens
  int64_t preemptions = 0;
  int64_t prompt_tokens = 0;       // prompt tokens of admitted sequences
  int64_t generation_tokens = 0;   // sampled tokens
  int64_t computed_tokens = 0;     // tokens through the backend (recomputation included)
  int64_t finished_requests = 0;
  int64_t steps = 0;
  // Where a step's time goes (seconds, cumulative over steps that ran a batch): the backend's
  // step, and everything else the executor does (planning, emitting events).
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
  // KV tiers below the pool (engine/kv_tiers.h; all 0 without them): capacity and use in bytes,
  // blocks held, blocks demoted (for room / idle past the TTL), restored (from host / disk), and
  // the disk tier's writes, failed writes, and files rejected (corrupt, truncated, foreign, partial).
  int64_t kv_host_capacity_bytes = 0, kv_host_used_bytes = 0, kv_host_blocks = 0;
  int64_t kv_disk_capacity_bytes = 0, kv_disk_used_bytes = 0, kv_disk_blocks = 0;
  int64_t kv_demoted_evicted = 0, kv_demoted_idle = 0;
  int64_t kv_restored_host = 0, kv_restored_disk = 0;
  int64_t kv_host_dropped = 0, kv_disk_dropped = 0;
  int64_t kv_disk_writes = 0, kv_disk_write_errors = 0, kv_disk_rejected = 0;
  bool kv_disk_writes_stopped = false;
  // The disk writer's queue: its bytes now, restores served from it (of kv_restored_disk), idle
  // demotions put off while it is full, and blocks not written because it was (chains' tails).
  int64_t kv_disk_queue_bytes = 0, kv_restored_queued = 0, kv_demote_deferred = 0, kv_disk_behind_dropped = 0;
  // The rate restores' batched copies into the pool ran at (bytes a second, a moving average; 0
  // until one was timed): what the scheduler sizes a step's restores by.
  double kv_restore_copy_bytes_per_s = 0;
  // Memory classes (Backend::memory(), bytes) and the KV pool's block size in bytes (0: unknown).
  int64_t mem_weights_bytes = 0, mem_kv_pool_bytes = 0, mem_scratch_bytes = 0;
  std::string mem_where = "host";
  int64_t kv_block_bytes = 0;
  int kv_block_tokens = 0;
  // Memory pressure (engine/memory_pressure.h): the level of the last step, the host's available
  // memory fraction it saw, steps run at each level, decode-only steps' tokens and time at each
  // level, and the actions taken.
  int pressure_level = 0;
  double host_available_ratio = 1;
  int64_t pressure_steps[4] = {};
  int64_t pressure_decode_tokens[4] = {};
  double pressure_decode_seconds[4] = {};
  int64_t pressure_demoted_early = 0, pressure_prefill_shrunk = 0, pressure_admissions_capped = 0;
  int64_t pressure_no_lower_tier = 0;
  std::string last_error;          // the last backend failure, if any
};

class Executor {
 public:
  virtual ~Executor() = default;
  virtual std::string name() const = 0;
  // Admission control: a clear error if the sequence is malformed or could never fit.
  virtual Status check(const SeqStart& s) const = 0;
  // Hands a checked sequence over (its id unique among live ones).
  virtual void start(SeqStart s) = 0;
  // Finishes a live sequence with `why` before it produces another token (no-op for unknown or
  // finished ids): its finish event follows, and its KV blocks are freed.
  virtual void stop(SeqId id, FinishReason why) = 0;
  // Moves the sequences forward and appends what happened since the last call. The host executor
  // runs one step here; a device executor drains its completion ring. An error means the step
  // failed: the sequences in it have finished with FinishReason::Error (their events are in out).
  virtual Status poll(std::vector<SeqEvent>& out) = 0;
  virtual bool has_work() const = 0;  // something started and not yet finished
  virtual ExecutorStats stats() const = 0;  // called from the polling thread
  virtual Status check_invariants() const { return {}; }  // tests
  // > 0: poll() also while nothing is live, at least this often (timed housekeeping such as
  // moving idle KV blocks to a lower tier); 0: only when there is work.
  virtual std::chrono::milliseconds idle_tick() const { return std::chrono::milliseconds(0); }
};

}  // namespace ss::backend
