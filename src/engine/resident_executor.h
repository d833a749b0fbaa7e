// The device executor's host side (issue 17): sequences go to a resident loop that admits, plans,
// samples, stops and streams by itself (backend/resident/loop.h); this class only feeds it and
// turns its completions into events. What it does per token: nothing but draining completions.
//
//   start()  → a free slot and the blocks the sequence can ever need reserved (admission control:
//              a running sequence can always get its next block, so the loop never deadlocks and
//              never drops one; without room it waits here, in arrival order), its prompt written
//              to the slot's row, an Admit pushed.
//   stop()   → a Cancel pushed (or, still waiting here, finished at once).
//   poll()   → free blocks granted to the loop, completions drained (waiting up to a millisecond for
//              one), a finished slot's blocks taken back from its table row.
//
// The loop runs behind a LoopRunner: HostLoopRunner runs the control plane on a thread of its own
// with any Backend for the forward pass (CPU, and the reference the GPU runner is tested against);
// a GPU runner runs it in a scheduler kernel between decode graphs, its rings in mapped memory.
// Not yet: penalties, logit bias, grammars, logprobs and prefix reuse (check() says so: those
// sequences belong to the host executor).
#pragma once
#include <chrono>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "backend/resident/loop.h"
#include "backend/resident/runner.h"
#include "engine/kv_tiers.h"
#include "engine/scheduler.h"

namespace ss::engine {

using resident::LoopRunner;
using resident::LoopShare;

// The control plane on a host thread, each step's forward pass and sampling on `be` (which must
// outlive it and is used by this thread only).
std::unique_ptr<LoopRunner> make_host_loop_runner(backend::Backend& be, int max_slots, int max_rows, int max_len,
                                                  LoopShare share = {});

// The backend's own loop runner where it has one (the CUDA backend's device loop), else the host
// loop runner; host_only: always the host one.
Expected<std::unique_ptr<LoopRunner>> make_loop_runner(backend::Backend& be, int max_slots, int max_rows, int max_len,
                                                       LoopShare share = {}, bool host_only = false);

// The host executor's seats beside a loop of max_num_seqs: a quarter of them, at least 1.
int persistent_host_seats(int max_num_seqs);
// The backend slots that give the loop all of max_num_seqs and the host executor its reserve.
int persistent_backend_slots(int max_num_seqs);

// --scheduling persistent: the resident loop runs what it can (resident_blocks of the KV pool and
// max_slots block tables), and a host executor the rest (penalties, grammars, logprobs, ...) over
// the remaining blocks and slots, its steps run on the loop's thread between the loop's own.
// Seats: where the backend has persistent_backend_slots(max_num_seqs) slots, the loop gets all of
// max_num_seqs and the host executor the reserve beyond them; with fewer, each gets about half.

Expected<std::unique_ptr<backend::Executor>> make_persistent_executor(backend::Backend& be, const SchedulerConfig& cfg,
                                                                      std::function<backend::Clock::time_point()> clock,
                                                                      const KvTierConfig& tiers = {},
                                                                      double resident_share = 0.75,
                                                                      bool host_loop = false);

class ResidentExecutor final : public backend::Executor {
 public:
  // clock: what deadlines are measured against (empty: steady_clock::now); it must tick with the
  // runner's now_ns().
  // prefix_caching: full blocks of finished sequences stay cached (content-addressed, as the host
  // executor's prefix cache: engine/kv_cache_manager.h) and a new sequence starts from the longest
  // cached run of its prompt's blocks, shared read-only; evicted least recently used when the
  // blocks are needed.
  explicit ResidentExecutor(std::unique_ptr<LoopRunner> runner, std::function<backend::Clock::time_point()> clock = {},
                            bool prefix_caching = false);
  ~ResidentExecutor() override;

  std::string name() const override { return "resident (" + runner_->name() + ")"; }
  Status check(const backend::SeqStart& s) const override;
  void start(backend::SeqStart s) override;
  void stop(backend::SeqId id, backend::FinishReason why) override;
  Status poll(std::vector<backend::SeqEvent>& out) override;
  bool has_work() const override { return !waiting_.empty() || !live_.empty(); }
  backend::ExecutorStats stats() const override { return stats_; }
  Status check_invariants() const override;
  // How long poll() waits for a completion when sequences are live (default 1 ms; 0: never).
  void set_poll_wait(std::chrono::microseconds w) { poll_wait_ = w; }

 private:
  struct Live {
    int slot = -1;
    int reserved = 0;  // new blocks reserved for it (beyond the shared prefix)
    int32_t filled_blocks = 0;
    int shared = 0;                // leading table blocks taken from the prefix cache
    std::vector<int32_t> shared_blocks;
    uint64_t root = 0;             // the hash chain's root (its cache salt)
    std::vector<int32_t> tokens;   // prompt, then every sampled token (the blocks' contents)
    // stop() was called: tokens the loop made before it saw the Cancel are dropped, and the final
    // completion becomes this reason with no token (the Executor contract: nothing after stop()).
    backend::FinishReason cancel = backend::FinishReason::None;
  };
  int blocks_needed(const backend::SeqStart& s) const;
  // The prefix cache: block -> its entry; unreferenced entries in LRU order (front: oldest).
  struct Cached {
    uint64_t hash = 0;
    int refs = 0;
    std::list<int32_t>::iterator lru;
  };
  void unref_cached(int32_t block);
  bool evict_one();  // the least recently used unreferenced block back to the free list
  void release_blocks(Live& lv, const int32_t* row, int n_blocks, int len);
  void admit_waiting();
  void grant_blocks();
  void finish_waiting(backend::SeqId id, backend::FinishReason why, std::vector<backend::SeqEvent>& out);

  std::unique_ptr<LoopRunner> runner_;
  std::function<backend::Clock::time_point()> clock_;
  std::deque<backend::SeqStart> waiting_;
  std::unordered_map<backend::SeqId, Live> live_;
  std::vector<uint8_t> slot_used_;
  std::vector<int32_t> free_blocks_;  // the host's; granted ones are the loop's until they come back
  int reserved_ = 0;                  // sum of live sequences' reservations
  std::vector<backend::SeqEvent> pending_;  // finished here (waiting sequences stopped) for the next poll
  std::vector<resident::Completion> completions_;
  backend::ExecutorStats stats_;
  std::chrono::microseconds poll_wait_{1000};
  bool prefix_caching_ = false;
  std::unordered_map<uint64_t, int32_t> by_hash_;
  std::unordered_map<int32_t, Cached> cached_;
  std::list<int32_t> lru_;
  int pinned_ = 0;  // cached blocks some live sequence shares
};

}  // namespace ss::engine
