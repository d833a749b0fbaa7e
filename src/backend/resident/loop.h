// The resident decode loop's control plane (issue 17): what the GPU does between two forward passes
// when it schedules itself. The host hands sequences over through a submission ring and streams
// tokens out of a completion ring; in between, the loop admits and cancels at step boundaries,
// plans each step (one decode row per running sequence, then prefill chunks in the token budget
// left, as vLLM's chunked prefill orders them), takes KV blocks from a free-block ring the host
// keeps topped up, and after the forward pass appends each sampled token, evaluates the stop
// conditions (stop ids, max tokens, the context, the deadline) and publishes a completion.
//
// Plain data and functions, no allocation, no library: the same code runs on the host (the loop
// thread of resident_loop.h, which drives a Backend) and in a GPU scheduler kernel (one thread of
// it, between the decode graphs). Ordering between the two sides is the rings' (release on push,
// acquire on pop): a slot's prompt row and block-table row written before an Admit is pushed are
// visible to the loop once it pops the Admit, and the block-table row of a finished slot is the
// host's once it pops that slot's final completion.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define SS_RESIDENT_HD __host__ __device__
#else
#define SS_RESIDENT_HD
#endif

namespace ss::resident {

inline constexpr int kMaxStopIds = 8;

// backend::FinishReason's values, plus Rejected: an Admit the loop refused (a host bug: the host
// checks every sequence first); the host reports it as an error.
enum class Finish : uint8_t { None = 0, Length = 1, Stop = 2, Abort = 3, Timeout = 4, Rejected = 6 };

struct Sampling {
  float temperature = 0.0f;  // <= 0: greedy
  int32_t top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  uint64_t seed = 0;
};

enum class MsgKind : uint32_t { Admit = 1, Cancel = 2 };

// Host → loop. Admit: the prompt is in prompts[slot][0, prompt_len) (written before the push);
// its first cached_len tokens (whole blocks, fewer than the prompt) are cached already, in the
// blocks the slot's table row starts with (written before the push too: a shared prefix). Cancel: finish the slot's sequence `id` with `reason` before it
// produces another token (a stale cancel, for a sequence already finished, is ignored).
struct Submit {
  MsgKind kind = MsgKind::Admit;
  int32_t slot = -1;
  uint64_t id = 0;
  int32_t prompt_len = 0;
  int32_t cached_len = 0;  // a multiple of the block size, < prompt_len
  int32_t max_tokens = 0;  // output tokens, >= 1
  int32_t min_tokens = 0;  // stop ids are banned before this many output tokens
  int32_t n_stop = 0;
  int32_t stop_ids[kMaxStopIds] = {};
  int64_t deadline_ns = 0;  // the loop's clock; 0: none
  Sampling sampling{};
  Finish reason = Finish::Abort;  // Cancel
};

// Loop → host: one per sampled token (token >= 0), the last of a sequence with finish != None
// (token -1 when it finished without one: cancelled, timed out, rejected). n_blocks: blocks in the
// slot's table row; on the final completion the host takes them back (the row stays as it was).
struct Completion {
  uint64_t id = 0;
  int32_t token = -1;
  int32_t slot = -1;
  int32_t n_blocks = 0;
  int32_t len = 0;  // tokens whose K/V are cached after this step
  Finish finish = Finish::None;
};

struct Geometry {
  int32_t max_slots = 0;
  int32_t block_size = 16;
  int32_t max_blocks = 0;  // table row length: blocks a sequence may hold
  int32_t max_len = 0;     // context limit (prompt + output), <= max_blocks * block_size
  int32_t max_rows = 0;    // tokens a step may compute (decode rows first, then prefill chunks)
  int32_t vocab = 0;
};

struct Slot {
  uint64_t id = 0;
  uint8_t live = 0;
  int32_t prompt_len = 0;
  int32_t len = 0;          // tokens whose K/V are cached
  int32_t last_token = -1;  // the last sampled token (not cached yet); -1 while prefilling
  int32_t n_output = 0;
  int32_t max_tokens = 0;
  int32_t min_tokens = 0;
  int32_t n_stop = 0;
  int32_t stop_ids[kMaxStopIds] = {};
  int64_t deadline_ns = 0;
  Sampling sampling{};
  int32_t n_blocks = 0;
};

// One step's rows (arrays of geo.max_rows, owned by the caller): row i computes token tokens[i]
// at position positions[i] of slot slots[i]; sample[i] != 0 where a token is drawn from its logits.
// Rows of one slot are contiguous and in position order.
struct StepRows {
  int32_t* tokens = nullptr;
  int32_t* positions = nullptr;
  int32_t* slots = nullptr;
  uint8_t* sample = nullptr;
  int32_t n = 0;
  int32_t n_sample = 0;
};

// The loop's state: slots[max_slots], tables[max_slots][max_blocks], prompts[max_slots][max_len].
struct State {
  Geometry geo{};
  Slot* slots = nullptr;
  int32_t* tables = nullptr;
  const int32_t* prompts = nullptr;
  int64_t steps = 0;
  int64_t stalls = 0;  // rows not run because no free block was there yet (they run later)
};

SS_RESIDENT_HD inline bool in_stop_ids(const Slot& s, int32_t tok) {
  for (int i = 0; i < s.n_stop; ++i)
    if (s.stop_ids[i] == tok) return true;
  return false;
}

// An Admit as the loop checks it: nothing it cannot run is taken.
SS_RESIDENT_HD inline bool admit_ok(const Geometry& g, const Slot* slots, const Submit& m) {
  if (m.slot < 0 || m.slot >= g.max_slots || slots[m.slot].live) return false;
  if (m.prompt_len < 1 || m.prompt_len >= g.max_len || m.max_tokens < 1) return false;
  if (m.cached_len < 0 || m.cached_len >= m.prompt_len || m.cached_len % g.block_size != 0) return false;
  if (m.min_tokens < 0 || m.min_tokens > m.max_tokens || m.n_stop < 0 || m.n_stop > kMaxStopIds) return false;
  for (int i = 0; i < m.n_stop; ++i)
    if (m.stop_ids[i] < 0 || m.stop_ids[i] >= g.vocab) return false;
  return true;
}

// Applies one message. emit(const Completion&) publishes (the caller's completion ring).
template <class Emit>
SS_RESIDENT_HD void apply(State& st, const Submit& m, Emit&& emit) {
  if (m.kind == MsgKind::Cancel) {
    if (m.slot < 0 || m.slot >= st.geo.max_slots) return;
    Slot& s = st.slots[m.slot];
    if (!s.live || s.id != m.id) return;  // finished already: the host has (or will get) its final completion
    s.live = 0;
    emit(Completion{s.id, -1, m.slot, s.n_blocks, s.len, m.reason});
    return;
  }
  if (!admit_ok(st.geo, st.slots, m)) {
    const int32_t nb = m.slot >= 0 && m.slot < st.geo.max_slots && !st.slots[m.slot].live ? 0 : -1;
    emit(Completion{m.id, -1, m.slot, nb, 0, Finish::Rejected});
    return;
  }
  Slot& s = st.slots[m.slot];
  s = Slot{};
  s.id = m.id;
  s.prompt_len = m.prompt_len;
  s.max_tokens = m.max_tokens;
  s.min_tokens = m.min_tokens;
  s.n_stop = m.n_stop;
  for (int i = 0; i < m.n_stop; ++i) s.stop_ids[i] = m.stop_ids[i];
  s.deadline_ns = m.deadline_ns;
  s.sampling = m.sampling;
  s.len = m.cached_len;
  s.n_blocks = m.cached_len / st.geo.block_size;
  s.live = 1;
}

// Finishes sequences past their deadline (no token), then lays out the step: one row for every
// running sequence, then prompt chunks in slot order while the row budget lasts. A row whose
// position starts a new block takes one from take_block(int32_t* out) -> bool; with none there
// yet the sequence sits this step out (it is never dropped; the host's admission keeps the
// blocks a live sequence can still need available, so the wait is short).
template <class TakeBlock, class Emit>
SS_RESIDENT_HD void plan(State& st, StepRows& r, int64_t now_ns, TakeBlock&& take_block, Emit&& emit) {
  const Geometry& g = st.geo;
  r.n = 0;
  r.n_sample = 0;
  auto ensure_block = [&](Slot& s, int32_t slot, int32_t pos) -> bool {
    if (pos / g.block_size < s.n_blocks) return true;
    int32_t b = -1;
    if (!take_block(&b)) {
      ++st.stalls;
      return false;
    }
    st.tables[static_cast<int64_t>(slot) * g.max_blocks + s.n_blocks] = b;
    ++s.n_blocks;
    return true;
  };
  for (int32_t i = 0; i < g.max_slots; ++i) {
    Slot& s = st.slots[i];
    if (!s.live) continue;
    if (s.deadline_ns != 0 && now_ns >= s.deadline_ns) {
      s.live = 0;
      emit(Completion{s.id, -1, i, s.n_blocks, s.len, Finish::Timeout});
    }
  }
  for (int32_t i = 0; i < g.max_slots && r.n < g.max_rows; ++i) {  // decode rows
    Slot& s = st.slots[i];
    if (!s.live || s.last_token < 0) continue;
    if (!ensure_block(s, i, s.len)) continue;
    r.tokens[r.n] = s.last_token, r.positions[r.n] = s.len, r.slots[r.n] = i, r.sample[r.n] = 1;
    ++r.n, ++r.n_sample;
  }
  for (int32_t i = 0; i < g.max_slots && r.n < g.max_rows; ++i) {  // prompt chunks
    Slot& s = st.slots[i];
    if (!s.live || s.last_token >= 0) continue;
    const int32_t* prompt = st.prompts + static_cast<int64_t>(i) * g.max_len;
    int32_t pos = s.len;
    while (pos < s.prompt_len && r.n < g.max_rows && ensure_block(s, i, pos)) {
      r.tokens[r.n] = prompt[pos], r.positions[r.n] = pos, r.slots[r.n] = i;
      r.sample[r.n] = pos == s.prompt_len - 1 ? 1 : 0;
      r.n_sample += r.sample[r.n];
      ++r.n, ++pos;
    }
  }
}

// After the forward pass: sampled[j] is the token drawn for the j-th sampling row of r. Each row's
// K/V is now cached; a sampling row appends its token and publishes it, finishing the sequence on
// a stop id (the token is emitted), at max_tokens or at the context limit.
template <class Emit>
SS_RESIDENT_HD void commit(State& st, const StepRows& r, const int32_t* sampled, Emit&& emit) {
  int32_t j = 0;
  for (int32_t k = 0; k < r.n; ++k) {
    Slot& s = st.slots[r.slots[k]];
    if (r.positions[k] == s.len) ++s.len;
    if (!r.sample[k]) continue;
    const int32_t tok = sampled[j++];
    s.last_token = tok;
    ++s.n_output;
    Finish f = Finish::None;
    if (in_stop_ids(s, tok)) f = Finish::Stop;
    else if (s.n_output >= s.max_tokens || s.len + 1 >= st.geo.max_len) f = Finish::Length;
    if (f != Finish::None) s.live = 0;
    emit(Completion{s.id, tok, r.slots[k], s.n_blocks, s.len, f});
  }
  ++st.steps;
}

// Stop ids are banned from the draw before min_tokens output tokens (vLLM's min_tokens).
SS_RESIDENT_HD inline bool stop_ids_banned(const Slot& s) { return s.n_output < s.min_tokens; }

}  // namespace ss::resident
