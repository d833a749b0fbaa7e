// Private to cpu/: cache lines that the packed products prefetch for the operation after them.
//
// At a batch the packed products are compute bound (16 streams of the Q4_K_M default-model file on a
// Zen 4: 6.7 ms of vector ops against 3.4 ms of weight reads a step, bench_kernels --step-floor), while
// attention, which follows them, waits on its K/V reads from DRAM. So while layer l's output and FFN
// products (and layer l+1's Q/K/V) run, each thread also prefetches its share of layer l+1's K/V
// blocks, a few lines per row group and pass, spread over the pass like the next group's weights; the
// lines go to L2 and, as the weights stream through, on to the L3, where attention finds them.
// Prefetches change no arithmetic: every result keeps its bits.
#pragma once
#include <cstdint>

namespace ss::cpu {

struct SideRange {
  const char* p;  // the first line
  int64_t lines;
};

// One line to L2 (prefetcht1), as an asm statement the compiler keeps, one per line. Written as
// __builtin_prefetch (in a lambda the kernels passed), the instructions were in the objects but
// attention did not gain in two A/B runs at 16 streams; as asm it gains ~1 ms.
[[gnu::always_inline]] inline void side_prefetch_line(const char* q) {
#if defined(__x86_64__)
  __asm__ volatile("prefetcht1 (%0)" : : "r"(q));
#else
  __builtin_prefetch(q, 0, 2);
#endif
}

// Lines [0, n) at p spread over a kernel loop's steps: at(s) prefetches step s's share to L2.
struct SideSpread {
  const char* p = nullptr;
  int64_t n = 0, per_step = 0;
  [[gnu::always_inline]] void at(int64_t s) const {
    for (int64_t l = s * per_step, e = l + per_step < n ? l + per_step : n; l < e; ++l) side_prefetch_line(p + 64 * l);
  }
  // Part k of `parts` of step s's lines (a step's lines spread over its inner loop).
  [[gnu::always_inline]] void at_part(int64_t s, int k, int parts) const {
    const int64_t b = s * per_step, e = b + per_step < n ? b + per_step : n;
    if (e <= b) return;
    for (int64_t l = b + (e - b) * k / parts, le = b + (e - b) * (k + 1) / parts; l < le; ++l)
      side_prefetch_line(p + 64 * l);
  }
};

// One thread's share of the side stream: the ranges [next, end) not yet started and the current one.
struct SideCursor {
  const SideRange* next = nullptr;
  const SideRange* end = nullptr;
  const char* p = nullptr;
  int64_t left = 0;   // lines of the current range still to fetch
  int per_block = 0;  // lines per 16 rows x 32 columns of a pass
  int64_t taken = 0;  // lines handed out so far (the kernels prefetch every one they take)

  // Up to `want` contiguous lines (fewer at a range's end; none once done), spread over `steps`.
  SideSpread take(int64_t want, int64_t steps) {
    if (left == 0) {
      if (next == end) return {};
      p = next->p;
      left = next->lines;
      ++next;
    }
    const int64_t n = want < left ? want : left;
    const SideSpread s{p, n, steps > 0 ? (n + steps - 1) / steps : 0};
    p += 64 * n;
    left -= n;
    taken += n;
    return s;
  }
};

// The spread of a kernel pass: `units` x per_block lines of c's stream over `steps` (none without c).
inline SideSpread side_take(SideCursor* c, int64_t units, int64_t steps) {
  return c ? c->take(units * c->per_block, steps) : SideSpread{};
}

}  // namespace ss::cpu
