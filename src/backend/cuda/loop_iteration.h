// One iteration of the device loop's scheduler kernel (loop_runner.cu), in phases: a CTA runs
// them with a barrier between two (thread 0 alone where a phase says so); a host test runs the same
// phases one after the other on one thread, with a CPU backend's step standing in for the decode
// graph (tests/unit/device_loop_host_test.cpp). Private to backend/cuda.
#pragma once
#include <cstdint>

#include "backend/cuda/queues/queues.h"
#include "backend/resident/loop.h"

#if !defined(__CUDA_ARCH__)
#include <atomic>
#endif

namespace ss::devloop {

// The rings' views as the GPU end sees them (queues::SubmissionRing<T>::Ring and
// queues::CompletionRing<T>::Ring: slot words system-scope, each counter on its own side).
template <class T>
using InRing = queues::SeqRing<T, queues::kSystem, queues::kSystem, queues::kDevice>;
template <class T>
using OutRing = queues::SeqRing<T, queues::kSystem, queues::kDevice, queues::kSystem>;

inline constexpr int kMaxMsgs = 16;    // messages applied per step boundary
inline constexpr int kMaxGraphs = 16;  // buckets of 1, 2, 4, ... 32768 tokens

// A sample row's parameters as the device sampler reads them (kern::RowSampling's layout:
// loop_runner.cu checks it): the slot's sampling and the draw's counter, 2 x its output tokens so
// far (backend/sampling_rng.h), so a draw depends on (seed, counter) alone, as on the host.
struct RowParams {
  float temperature;  // <= 0: greedy
  int32_t top_k;
  float top_p;
  float min_p;
  uint64_t seed;
  uint64_t counter;
};

// Host <-> device words, in mapped memory.
struct Control {
  uint32_t stop;       // host: end the chain at the next step boundary (after the commit)
  uint32_t error;      // device: the cudaError_t of a failed device-side graph launch
  uint64_t heartbeat;  // device: scheduler iterations (the host's watchdog reads it)
  uint64_t steps;      // device: steps run
  uint64_t stalls;     // device: rows that waited for a block
  uint64_t idle;       // device: iterations with nothing to run
};

// The loop's state in device memory: it outlives each scheduler launch.
struct DevState {
  resident::State st;
  int32_t n = 0;  // rows of the step in flight (committed at the next boundary); 0: none
  int32_t n_sample = 0;
  uint64_t iterations = 0, idle = 0;
};

// What one iteration reads and writes. Pointers are the executing side's addresses.
struct Args {
  DevState* ds;
  Control* ctl;
  InRing<resident::Submit> submits;
  InRing<int32_t> blocks;
  OutRing<resident::Completion> done;
  const int32_t* host_prompts;  // mapped, [slot][max_len]
  int32_t* prompts;             // device copy (st.prompts)
  int32_t* host_tables;         // mapped mirror of the loop's tables (the loop's block ids)
  int32_t* synced;              // per slot: table entries copied out so far
  int32_t *row_tokens, *row_pos, *row_slots;
  uint8_t* row_sample;
  // The backend's step buffers (what the captured graphs read and write).
  int32_t *tokens, *positions, *token_slot, *ctx, *rows;
  const int32_t* ids;
  int32_t* be_tables;
  int be_max_blocks, first_slot, first_block, spare_slot;
  int n_graphs, r_cap;
  void* graphs[kMaxGraphs];  // cudaGraphExec_t; graphs[i]: 1 << i tokens, min(1 << i, r_cap) sample rows
  // The same steps drawing each sample row with row_params (the device sampler) instead of the
  // argmax; run for a step with a row whose temperature is > 0. Null: greedy only.
  void* sgraphs[kMaxGraphs];
  RowParams* row_params;     // [r_cap], what sgraphs read; null: greedy only
  int64_t idle_ns;           // the longest sleep of one idle iteration
};

// Shared between the phases (the CTA's shared memory).
struct Shared {
  resident::Submit msgs[kMaxMsgs];
  int n_msgs, go, lg, n;
  int sampled;  // this step has a row drawn with a temperature: its graph is sgraphs[lg]
};

template <class T>
SS_RESIDENT_HD inline void store_mapped(T& word, T v) {
  *reinterpret_cast<volatile T*>(&word) = v;
}

SS_RESIDENT_HD inline bool stop_requested(const Args& a) {
  return queues::AtomicRef<uint32_t, queues::kSystem>(a.ctl->stop).load(queues::memory_order_acquire) != 0;
}

// Publishes a completion; a full ring waits for the host to drain it.
SS_RESIDENT_HD inline void publish(Args& a, const resident::Completion& c) {
  while (!a.done.try_push(c)) {
#if defined(__CUDA_ARCH__)
    __nanosleep(2000);
#endif
  }
}

// Thread 0. Commits the step just run (its ids appended, stops checked, completions published) and
// takes the messages of this boundary (none when the host asked the chain to stop).
SS_RESIDENT_HD inline void phase_take(Args& a, Shared& sh) {
  DevState& ds = *a.ds;
  auto emit = [&](const resident::Completion& c) { publish(a, c); };
  ++ds.iterations;
  if (ds.n > 0) {
    // The step is counted before its tokens are published, as the host executor counts it: whoever
    // has a token also sees the step that made it in the mapped counter (the server's steps metric
    // and watchdog); the completions' release orders this store before them.
    store_mapped(a.ctl->steps, static_cast<uint64_t>(ds.st.steps + 1));
    const resident::StepRows r{a.row_tokens, a.row_pos, a.row_slots, a.row_sample, ds.n, ds.n_sample};
    resident::commit(ds.st, r, a.ids, emit);
    ds.n = 0;
  }
  sh.n_msgs = 0;
  sh.n = 0;
  sh.lg = 0;
  sh.sampled = 0;
  sh.go = stop_requested(a) ? 0 : 1;
  if (sh.go)
    while (sh.n_msgs < kMaxMsgs && a.submits.try_pop_single(sh.msgs[sh.n_msgs])) ++sh.n_msgs;
}

// Every thread. The admitted prompts into device memory, read from the mapped rows in parallel, and
// a cached prefix's blocks from the host's table row into the loop's (a slot still live keeps its
// prompt and table: apply() rejects that Admit).
SS_RESIDENT_HD inline void phase_copy_prompts(const Args& a, const Shared& sh, int tid, int nthreads) {
  if (!sh.go) return;
  const resident::State& st = a.ds->st;
  for (int k = 0; k < sh.n_msgs; ++k) {
    const resident::Submit& m = sh.msgs[k];
    if (m.kind != resident::MsgKind::Admit || m.slot < 0 || m.slot >= st.geo.max_slots || m.prompt_len < 1 ||
        m.prompt_len > st.geo.max_len || st.slots[m.slot].live)
      continue;
    const int64_t off = static_cast<int64_t>(m.slot) * st.geo.max_len;
    for (int i = tid; i < m.prompt_len; i += nthreads) a.prompts[off + i] = a.host_prompts[off + i];
    const int cached_blocks = m.cached_len > 0 ? m.cached_len / st.geo.block_size : 0;
    if (cached_blocks <= st.geo.max_blocks) {
      const int64_t row = static_cast<int64_t>(m.slot) * st.geo.max_blocks;
      for (int k = tid; k < cached_blocks; k += nthreads) st.tables[row + k] = a.host_tables[row + k];
    }
  }
}

// Thread 0. Applies the messages, plans the step, copies new block-table entries out (the backend's
// table with its block ids, the host's mirror with the loop's, before any completion that ends the
// slot is published) and lists the sample rows, padded to the bucket.
SS_RESIDENT_HD inline void phase_plan(Args& a, Shared& sh, int64_t now_ns) {
  if (!sh.go) return;
  DevState& ds = *a.ds;
  resident::State& st = ds.st;
  const resident::Geometry& g = st.geo;
  auto emit = [&](const resident::Completion& c) { publish(a, c); };
  for (int k = 0; k < sh.n_msgs; ++k) {
    const resident::Submit& m = sh.msgs[k];
    if (m.kind == resident::MsgKind::Admit && m.slot >= 0 && m.slot < g.max_slots && !st.slots[m.slot].live)
      a.synced[m.slot] = 0;
    resident::apply(st, m, emit);
  }
  resident::StepRows r{a.row_tokens, a.row_pos, a.row_slots, a.row_sample, 0, 0};
  auto take = [&](int32_t* b) { return a.blocks.try_pop_single(*b); };
  resident::plan(st, r, now_ns, take, emit);
  // Only slots with rows this step can have new entries (plan takes blocks for rows; a shared
  // prefix's are in the host's row already and reach the backend's with the slot's first row).
  // Rows of a slot are contiguous: one pass over the rows, not over every slot.
  for (int k0 = 0; k0 < r.n; ++k0) {
    const int s = r.slots[k0];
    if (k0 > 0 && r.slots[k0 - 1] == s) continue;
    const int32_t nb = st.slots[s].n_blocks;
    for (int k = a.synced[s]; k < nb; ++k) {
      const int32_t b = st.tables[static_cast<int64_t>(s) * g.max_blocks + k];
      a.host_tables[static_cast<int64_t>(s) * g.max_blocks + k] = b;
      a.be_tables[static_cast<int64_t>(a.first_slot + s) * a.be_max_blocks + k] = b + a.first_block;
    }
    if (nb > a.synced[s]) a.synced[s] = nb;
  }
#if defined(__CUDA_ARCH__)
  __threadfence_system();
#else
  std::atomic_thread_fence(std::memory_order_seq_cst);
#endif
  ds.n = r.n;
  ds.n_sample = r.n_sample;
  sh.n = r.n;
  int l = 0;
  while ((1 << l) < r.n) ++l;
  sh.lg = l;
  if (r.n > 0) {
    int j = 0;
    for (int k = 0; k < r.n; ++k) {
      if (!r.sample[k]) continue;
      if (a.row_params) {
        const resident::Slot& s = st.slots[r.slots[k]];
        const resident::Sampling& p = s.sampling;
        a.row_params[j] = RowParams{p.temperature, p.top_k, p.top_p, p.min_p, p.seed, 2 * static_cast<uint64_t>(s.n_output)};
        if (p.temperature > 0.0f) sh.sampled = 1;
      }
      a.rows[j++] = k;
    }
    const int R = (1 << l) < a.r_cap ? (1 << l) : a.r_cap;
    for (; j < R; ++j) {  // padding: row 0 again, greedy
      a.rows[j] = 0;
      if (a.row_params) a.row_params[j] = RowParams{0.0f, 0, 1.0f, 0.0f, 0, 0};
    }
  }
}

// Every thread. The step's inputs where the graph reads them, padded to the bucket (padding rows:
// token 0 at position 0 of the spare slot, whose table points at a spare block).
SS_RESIDENT_HD inline void phase_inputs(const Args& a, const Shared& sh, int tid, int nthreads) {
  if (sh.n <= 0) return;
  const int T = 1 << sh.lg;
  for (int i = tid; i < T; i += nthreads) {
    const bool real = i < sh.n;
    const int32_t p = real ? a.row_pos[i] : 0;
    a.tokens[i] = real ? a.row_tokens[i] : 0;
    a.positions[i] = p;
    a.token_slot[i] = real ? a.first_slot + a.row_slots[i] : a.spare_slot;
    a.ctx[i] = p + 1;
  }
}

// Thread 0, after the inputs: the counters the host reads.
SS_RESIDENT_HD inline void phase_report(const Args& a) {
  const DevState& ds = *a.ds;
  store_mapped(a.ctl->heartbeat, static_cast<uint64_t>(ds.iterations));
  store_mapped(a.ctl->steps, static_cast<uint64_t>(ds.st.steps));
  store_mapped(a.ctl->stalls, static_cast<uint64_t>(ds.st.stalls));
  store_mapped(a.ctl->idle, static_cast<uint64_t>(ds.idle));
}

// Whether an idle loop has something to wake for: a message, a block some stalled sequence waits
// for, or the stop flag.
SS_RESIDENT_HD inline bool idle_wake(const Args& a) {
  if (a.submits.can_pop_single() || stop_requested(a)) return true;
  const resident::State& st = a.ds->st;
  for (int s = 0; s < st.geo.max_slots; ++s)
    if (st.slots[s].live) return a.blocks.can_pop_single();
  return false;
}

}  // namespace ss::devloop
