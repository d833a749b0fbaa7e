// The decode step at batch 1..8 as one persistent kernel (issue 17, experiment B): every layer's
// QKV, attention, o_proj, gate/up and down, then the final norm and lm_head, in one cooperative
// launch of one CTA a SM, the operations separated by grid-wide barriers instead of kernel
// boundaries.
//
// What the kernel boundary cost and what replaces it. The PDL-chained kernels of decode.cu start
// each projection's CTAs under the previous kernel's tail and issue one round of weight loads
// before they wait; still, every kernel drains its memory pipeline at its end and refills it at the
// next start (a 5 us kernel at the 135M shape is mostly that). Here each CTA has a producer warp
// that streams the CTA's share of every weight matrix, operation after operation and layer after
// layer, into a ring of shared-memory stages with bulk asynchronous copies (cp.async.bulk, completed
// on mbarriers). Weights depend on nothing the step computes, so the producer runs ahead as far as
// the ring allows (11-12 stages of 16 rows x 512 columns, ~190 KiB a SM): while the four consumer
// warps wait at a barrier or run attention, the next operation's weights are already arriving.
// DRAM sees one continuous stream of the step's weights instead of one burst a kernel.
//
// Work split. An operation's 16-row tiles times its K stages (512 columns each) are dealt to the
// CTAs as equal contiguous ranges, so every SM streams the same bytes whatever the shape (o_proj
// and down have few tiles with long rows: a tile's K is then split over CTAs). A tile split over
// CTAs leaves each CTA's fp32 partial in a workspace; the last to arrive (a ticket) adds them in
// CTA order and runs the epilogue, so the result does not depend on timing. Consumer warps take a
// stage's 32-column chunks in turn and reduce at the end of each tile in warp order.
//
// Arithmetic is the fused path's (decode.cu): the same RMSNorm staging (bf16(x * rms * w), its sum
// of squares over 128 threads instead of 256), the same tensor-core product of 16 weight rows by up to 8 batch
// columns and the same epilogues (decode_ops.cuh); only the order in which a row's fp32 partial
// sums are added differs. That order depends on the shape and the SM count, never on the batch,
// so a sequence's logits do not depend on what shares its step.
//
// Attention: one warp a (row, KV head, split of 32 x ceil(ctx / 512) keys, <= 16 splits); the scores
// of 32 keys on the tensor cores (q rounded to bf16, as the prefill tiles do), P V on the CUDA cores
// with lanes owning (key group, 8 dims). Splits merge through a ticket: the last split of a (row, KV head) merges them
// in split order. Split sizes depend on the row's own context only (batch invariance).
//
// Memory ordering: everything a CTA writes that another CTA reads later in the same launch (the
// residual, q, K/V, the attention output, the SwiGLU output, partials) is read through L2
// (ld.global.cg), never through a possibly stale L1 line; the barrier is release/acquire at GPU
// scope (fence, relaxed arrival count, release of the generation word, acquire spin).
//
// Readiness counters (SS_CUDA_MEGA_SYNC=counters; the default is a barrier after every operation).
// Three of a layer's five grid barriers only make consumers wait for inputs a few producers write,
// and each costs the wait for the slowest CTA of the grid (4.6-8.8 us an H100 trace measured,
// against 0.7 us for the release). Instead, counters that a finished unit of work increments with
// release and a consumer spins on with acquire:
//   QKV -> attention: one a KV group, by each finished QKV tile of the group's G + 2 heads; an
//     attention item (row, KV head, split) waits for its group's (G + 2) hd / 16 tiles;
//   attention -> o_proj: one a KV group, by each (row, KV head) whose merged output is written; a
//     512-column stage of o_proj waits for the groups its columns come from, every row;
//   gate/up -> down: one a 512-column chunk of the SwiGLU output, by each finished gate/up tile
//     (8 columns); a stage of down waits for its chunk.
// The two barriers left (after o_proj and after down) guard the RMSNorms, which read the whole
// residual. What the removed barriers also guarded: (1) the residual a norm reads is rewritten by
// the next Add's epilogue, which now needs every input column, so every QKV (gate/up) tile is done
// and with it every CTA's norm (a CTA without stages of the operation skips its norm); (2) the
// split tiles' partials and tickets, which the operations now take from two sets in turn (QKV and
// gate/up the first, o_proj and down the second), so no two operations between barriers share one.
// The counters are zeroed by CTA 0 after the barrier that follows their last wait (the o_proj
// barrier for the first two, the down barrier for the third), so each launch leaves them zero.
// Measured (H100, 2026-12-07, docs/perf/gpu-scheduling.md): 135M 1.687 -> 1.643 ms, 1B 2.031 ->
// 2.250 ms at batch 1; the waits moved to the two barriers left. Every CTA takes a contiguous range
// of each operation's tiles, so the units a consumer waits for finish near the operation's end
// anyway; hence not the default.
#include <algorithm>
#include <cstdio>
#include <string>

#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/decode_ops.cuh"
#include "backend/cuda/queues/queues.h"

namespace ss::cuda::kern {
namespace {

using namespace dev;
using namespace dec;

// Four consumer warps and a producer: 160 threads, so a thread may hold 255 registers (288 threads
// capped it at 168, and attention spilled into the ~40 KiB of L1 the ring leaves).
constexpr int kCWarps = 4;
constexpr int kCThreads = kCWarps * 32;
constexpr int kThreadsM = kCThreads + 32;
constexpr int kKc = 512;                       // K columns a stage
constexpr int kRowBytes = kKc * 2 + 64;        // a stage's row in shared memory: 64 bytes of pad
constexpr int kSlotBytes = 16 * kRowBytes;     // spread rows g and g + 1 over the two bank halves
constexpr int kMaxSlots = 12;
constexpr int kMinSlots = 4;
constexpr int kMaxG = 4;                       // query heads a KV head
constexpr int kMaxSplits = 16;
constexpr int kHdrBytes = 256;                 // the mbarriers
constexpr int kRedFloats = 2 * kCWarps * 128;  // two buffers of [warp][lane][4]
constexpr int kSsqFloats = kCWarps * 8;

// ---- shared-memory pipeline primitives (sm_90) ----
__device__ __forceinline__ uint32_t sptr(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void mbar_init(uint64_t* b, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(sptr(b)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* b, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(sptr(b)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* b) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(sptr(b)) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* b, unsigned parity) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "LAB_WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra LAB_WAIT;\n"
      "}\n" ::"r"(sptr(b)),
      "r"(parity)
      : "memory");
}
// An L2 policy under which the lines a copy brings in are the first evicted (createpolicy; not
// volatile, so the compiler hoists it out of the producer's loop).
__device__ __forceinline__ uint64_t l2_evict_first() {
  uint64_t pol;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  return pol;
}
// bytes (a multiple of 16) from global to shared, completing on bar's transaction count. The
// weights' copies, so L2 evict-first: the K/V, activations and partials the step reads again stay
// in L2 (1B batch 1 2.44 -> 2.00 ms on an H100, docs/perf/gpu-scheduling.md).
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, unsigned bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::"r"(
          sptr(dst)),
      "l"(src), "r"(bytes), "r"(sptr(bar)), "l"(l2_evict_first())
      : "memory");
}
// The consumer warps only (the producer never joins): named barrier 1.
__device__ __forceinline__ void consumers_sync() { asm volatile("bar.sync 1, %0;" ::"n"(kCThreads) : "memory"); }

// Counters and flags between CTAs: the queues' atomic_ref at GPU scope.
using DevAtomic = queues::AtomicRef<unsigned, queues::kDevice>;
// The old value; release of what this thread (and, through a preceding barrier, its CTA or warp)
// wrote, acquire of what the previous arrivals released. No fence.sc: ~1 us each on the chain.
__device__ __forceinline__ unsigned arrive_acq_rel(unsigned* p) {
  return DevAtomic(*p).fetch_add(1u, ::cuda::std::memory_order_acq_rel);
}

__device__ __forceinline__ unsigned long long globaltimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}

// Everything before it in every CTA happens before everything after it in every CTA. bar[0] counts
// arrivals and is back at zero after each barrier; bar[32] is the generation (another line).
// last_at (tracing only, else null): the last CTA to arrive stamps the time it arrived.
__device__ __forceinline__ void grid_sync(unsigned* bar, unsigned long long* last_at = nullptr) {
  consumers_sync();
  if (threadIdx.x == 0) {
    unsigned* count = bar;
    unsigned* gen = bar + 32;
    const unsigned g = DevAtomic(*gen).load(queues::memory_order_relaxed);  // cannot move before we arrive
    if (arrive_acq_rel(count) == gridDim.x - 1) {
      if (last_at) *last_at = globaltimer();
      DevAtomic(*count).store(0u, queues::memory_order_relaxed);  // ordered before the release below
      DevAtomic(*gen).store(g + 1, queues::memory_order_release);
    } else {
      while (DevAtomic(*gen).load(queues::memory_order_acquire) == g) {
      }
    }
  }
  consumers_sync();
}

// SS_CUDA_MEGA_TRACE: CTA 0 stamps the end of each part of a layer (see MegaDecode::trace).
__device__ __forceinline__ void stamp(const MegaDecode& m, int i) {
  if (m.trace && blockIdx.x == 0 && threadIdx.x == 0) m.trace[i] = globaltimer();
}

// ---- the work of one launch ----
struct Work {
  unsigned* bar;       // [64]
  unsigned* tickets;   // [2][max tiles], zero between operations; set 0 QKV and gate/up, set 1 o_proj and down
  float* parts;        // [2][grid][2][128]: a CTA's partials of its first and last tile, the same two sets
  float* attn_parts;   // [kMegaMaxBatch][n_kv][kMaxSplits][2 kMaxG + kMaxG hd]
  unsigned* attn_cnt;  // [kMegaMaxBatch][n_kv], zero between launches
  unsigned* qkv_ready;  // [n_kv]: QKV tiles finished a KV group (readiness counters, above)
  unsigned* att_ready;  // [n_kv]: (row, KV head) outputs merged
  unsigned* act_ready;  // [ceil(I / kKc)]: gate/up tiles finished a 512-column chunk
  int max_tiles, grid;
};
__host__ __device__ inline int64_t align_up(int64_t v, int64_t a) { return (v + a - 1) / a * a; }
__host__ __device__ inline int imax(int a, int b) { return a > b ? a : b; }
__host__ __device__ inline int max_tiles(const MegaDecode& m) {
  const int qkv = (m.rk.n_heads + 2 * m.rk.n_kv) * m.rk.hd / 16, o = (m.H + 15) / 16, gu = (m.I + 7) / 8;
  return imax(imax(qkv, o), imax(gu, (m.V + 15) / 16));
}
__host__ __device__ inline int attn_part_floats(int hd) { return 2 * kMaxG + kMaxG * hd; }
__host__ __device__ inline int act_chunks(const MegaDecode& m) { return (m.I + kKc - 1) / kKc; }
struct WorkLayout {  // byte offsets into MegaDecode::work
  int64_t tickets, parts, attn_parts, attn_cnt, ready, total;
};
__host__ __device__ inline WorkLayout work_layout(const MegaDecode& m, int grid) {
  WorkLayout o{};
  int64_t p = 256;  // the barrier's two words, a line apart
  o.tickets = p, p += align_up(4LL * 2 * max_tiles(m), 256);
  o.parts = p, p += align_up(4LL * 2 * grid * 2 * 128, 256);
  o.attn_parts = p, p += align_up(4LL * kMegaMaxBatch * m.rk.n_kv * kMaxSplits * attn_part_floats(m.rk.hd), 256);
  o.attn_cnt = p, p += align_up(4LL * kMegaMaxBatch * m.rk.n_kv, 256);
  o.ready = p, p += align_up(4LL * (2 * m.rk.n_kv + act_chunks(m)), 256);
  o.total = p;
  return o;
}
__device__ inline Work carve(const MegaDecode& m) {
  const WorkLayout o = work_layout(m, gridDim.x);
  char* p = static_cast<char*>(m.work);
  unsigned* ready = reinterpret_cast<unsigned*>(p + o.ready);
  return Work{reinterpret_cast<unsigned*>(p), reinterpret_cast<unsigned*>(p + o.tickets),
              reinterpret_cast<float*>(p + o.parts), reinterpret_cast<float*>(p + o.attn_parts),
              reinterpret_cast<unsigned*>(p + o.attn_cnt), ready, ready + m.rk.n_kv, ready + 2 * m.rk.n_kv,
              max_tiles(m), static_cast<int>(gridDim.x)};
}
// The partials and tickets of set `set` (0: QKV, gate/up; 1: o_proj, down).
struct Pieces {
  float* parts;
  unsigned* tickets;
};
__device__ __forceinline__ Pieces pieces_of(const Work& w, int set) {
  return Pieces{w.parts + static_cast<int64_t>(set) * w.grid * 2 * 128, w.tickets + static_cast<int64_t>(set) * w.max_tiles};
}

// Readiness counters (the top of the file). Increments release what the warp wrote before them
// (the lanes' stores, ordered by the __syncwarp before the call); the wait is lane 0's acquire,
// and the __syncwarp after it orders the other lanes' loads behind it.
__device__ __forceinline__ void ready_add(unsigned* c) { DevAtomic(*c).fetch_add(1u, ::cuda::std::memory_order_release); }
__device__ __forceinline__ void ready_wait(const unsigned* c, unsigned target) {
  while (DevAtomic(*const_cast<unsigned*>(c)).load(queues::memory_order_acquire) < target) __nanosleep(32);
}
// The counter a finished tile of OP increments: QKV, its KV group; gate/up, its 512-column chunk.
template <Op OP>
__device__ __forceinline__ int ready_index(const DecArgs& a, int tile) {
  if constexpr (OP == Op::Qkv) {
    const int hh = tile * 16 / a.rk.hd, nh = a.rk.n_heads, nkv = a.rk.n_kv;
    return hh < nh ? hh / (nh / nkv) : hh < nh + nkv ? hh - nh : hh - nh - nkv;
  } else {
    return tile * 8 / kKc;
  }
}
// What an Add stage waits for: the counters of its input columns [k0, k0 + kc), each covering
// `cols` columns and complete at `full` (the last at `last_full`). seen: lane 0's counters known
// complete (the first 64).
struct Gate {
  const unsigned* ready = nullptr;  // null: nothing to wait for (barrier mode)
  int cols = 0, n = 0;
  unsigned full = 0, last_full = 0;
  __device__ __forceinline__ void wait(int k0, int kc, uint64_t& seen) const {
    if (!ready) return;
    if ((threadIdx.x & 31) == 0)
      for (int c = k0 / cols; c <= (k0 + kc - 1) / cols && c < n; ++c) {
        if (c < 64 && ((seen >> c) & 1)) continue;
        ready_wait(ready + c, c == n - 1 ? last_full : full);
        if (c < 64) seen |= 1ull << c;
      }
    __syncwarp();
  }
};

// Operation arguments, as decode.cu's kernels get them.
__device__ __forceinline__ DecArgs args_qkv(const MegaDecode& m, int l, int B) {
  DecArgs a{};
  const MegaLayer& L = m.layers[l];
  a.W = L.wqkv, a.K = m.H, a.B = B, a.tiles = (m.rk.n_heads + 2 * m.rk.n_kv) * m.rk.hd / 16, a.N = 0;
  a.resid = m.resid, a.norm_w = L.attn_norm, a.eps = m.eps;
  a.rk = m.rk, a.rk.cache = L.cache, a.rk.bias = L.bqkv;
  return a;
}
__device__ __forceinline__ DecArgs args_add(const MegaDecode& m, const uint16_t* W, const uint16_t* x, int K, int B) {
  DecArgs a{};
  a.W = W, a.K = K, a.B = B, a.N = m.H, a.tiles = (m.H + 15) / 16, a.x = x, a.y = m.resid;
  return a;
}
__device__ __forceinline__ DecArgs args_gate_up(const MegaDecode& m, int l, int B) {
  DecArgs a{};
  const MegaLayer& L = m.layers[l];
  a.W = L.wgu, a.K = m.H, a.B = B, a.N = m.I, a.tiles = (m.I + 7) / 8, a.resid = m.resid, a.norm_w = L.ffn_norm;
  a.eps = m.eps, a.act = m.act;
  return a;
}
__device__ __forceinline__ DecArgs args_logits(const MegaDecode& m, int R) {
  DecArgs a{};
  a.W = m.out_w, a.K = m.H, a.B = R, a.N = m.V, a.tiles = (m.V + 15) / 16, a.resid = m.resid, a.rows = m.rows;
  a.norm_w = m.out_norm, a.eps = m.eps, a.y = m.logits;
  return a;
}

// An operation's stages (tile-major: tile s / nk, K stage s % nk) dealt to the CTAs in equal
// contiguous ranges. Round-robin (SS_CUDA_MEGA_DEAL=rr): first `full` = tiles / grid whole tiles a
// CTA, tile j grid + c to CTA c, so the tiles finish in order across the grid (what the readiness
// counters' consumers need); then the remaining stages, from r0 on, in equal contiguous ranges.
struct Split {
  bool rr;
  int nk, full;
  int64_t total, r0;
  __device__ Split(const DecArgs& a, bool rr_)
      : rr(rr_), nk((a.K + kKc - 1) / kKc), full(rr_ ? a.tiles / static_cast<int>(gridDim.x) : 0),
        total(static_cast<int64_t>(a.tiles) * nk), r0(static_cast<int64_t>(full) * gridDim.x * nk) {}
  // CTA c's range of the remainder
  __device__ int64_t lo(int c) const { return r0 + (total - r0) * c / gridDim.x; }
  __device__ int cta_of(int64_t s) const {  // the CTA whose range holds stage s (s >= r0)
    const int64_t rem = total - r0;
    return static_cast<int>(((s - r0 + 1) * gridDim.x + rem - 1) / rem) - 1;
  }
  // Stages CTA c runs; its first (a global stage index), and the one after its i-th, s.
  __device__ int64_t count(int c) const { return static_cast<int64_t>(full) * nk + lo(c + 1) - lo(c); }
  __device__ int64_t first(int c) const { return full > 0 ? static_cast<int64_t>(c) * nk : lo(c); }
  __device__ int64_t next(int c, int64_t i, int64_t s) const {
    const int64_t fs = static_cast<int64_t>(full) * nk;
    if (i + 1 == fs) return lo(c);                                    // into the remainder
    if (i + 1 < fs && (i + 1) % nk == 0) return s + static_cast<int64_t>(gridDim.x - 1) * nk + 1;  // the next whole tile
    return s + 1;
  }
  __device__ bool whole(int t) const { return static_cast<int64_t>(t) * nk < r0; }  // a round-robin tile
  // Where CTA c leaves its partial of remainder tile t (t its first tile: 0, else its last: 1).
  __device__ int part_index(int c, int t) const { return 2 * c + (t == static_cast<int>(lo(c) / nk) ? 0 : 1); }
};
// The QKV tile that the Split's tile t stands for: itself, or with round-robin dealing the tiles
// in KV-group order (group 0's G q heads, its k head, its v head; then group 1's ...), so a group's
// tiles finish together and early.
template <Op OP>
__device__ __forceinline__ int real_tile(const DecArgs& a, int t, bool rr) {
  if constexpr (OP == Op::Qkv) {
    if (!rr) return t;
    const int tph = a.rk.hd / 16, nh = a.rk.n_heads, nkv = a.rk.n_kv, G = nh / nkv;
    const int per = (G + 2) * tph, g = t / per, j = t % per, hi = j / tph;
    const int hh = hi < G ? g * G + hi : hi == G ? nh + g : nh + nkv + g;
    return hh * tph + j % tph;
  } else {
    return t;
  }
}

struct Ring {
  unsigned char* slots;
  uint64_t* full;
  uint64_t* empty;
  int n;
  uint32_t ctr = 0;  // stages through the ring so far (producer and consumers count alike)
};

// ---- producer warp ----
template <Op OP>
__device__ __forceinline__ void produce(const DecArgs& a, Ring& r, bool rr) {
  const int lane = threadIdx.x & 31;
  const Split sp(a, rr);
  const int64_t n = sp.count(blockIdx.x);
  int64_t s = sp.first(blockIdx.x);
  for (int64_t i = 0; i < n; s = sp.next(blockIdx.x, i, s), ++i, ++r.ctr) {
    const int tile = real_tile<OP>(a, static_cast<int>(s / sp.nk), rr), k0 = static_cast<int>(s % sp.nk) * kKc;
    const int kc = min(kKc, a.K - k0);
    const int slot = static_cast<int>(r.ctr % r.n);
    if (r.ctr >= static_cast<uint32_t>(r.n)) mbar_wait(&r.empty[slot], ((r.ctr / r.n) - 1) & 1);
    if (lane == 0) mbar_expect_tx(&r.full[slot], 16u * kc * 2);
    __syncwarp();
    if (lane < 16) {
      int64_t row = tile_row<OP>(a, tile, lane);
      if (row < 0) row = 0;  // a row past the matrix: row 0's bytes, its result dropped
      bulk_copy(r.slots + static_cast<size_t>(slot) * kSlotBytes + lane * kRowBytes, a.W + row * a.K + k0,
                static_cast<unsigned>(kc * 2), &r.full[slot]);
    }
  }
}

__device__ __forceinline__ void producer(const MegaDecode& m, int B, int R, Ring& r) {
  const bool rr = m.deal_rr;
  for (int l = 0; l < m.L; ++l) {
    const MegaLayer& L = m.layers[l];
    produce<Op::Qkv>(args_qkv(m, l, B), r, rr);
    produce<Op::Add>(args_add(m, L.wo, m.att, m.rk.n_heads * m.rk.hd, B), r, rr);
    produce<Op::GateUp>(args_gate_up(m, l, B), r, rr);
    produce<Op::Add>(args_add(m, L.wdown, m.act, m.I, B), r, rr);
  }
  if (R > 0) produce<Op::Logits>(args_logits(m, R), r, rr);
}

// ---- consumer warps ----
struct Smem {
  float* red;  // kRedFloats
  float* ssq;  // kSsqFloats
  uint16_t* xs;  // [rows][xstride] bf16 (norm ops); attention's P slices share it
  int xstride;
  int piece = 0;  // pieces finished (selects the reduction buffer)
};

// xs[b] = bf16(resid[rows[b]] * rsqrt(mean square + eps) * w), as decode.cu's prologue computes it.
__device__ __forceinline__ void stage_norm(const float* resid, const int32_t* rows, int nrows, int K, const float* nw, float eps,
                           Smem& sm) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  for (int b = 0; b < nrows; ++b) {
    const float* r = resid + static_cast<int64_t>(rows ? rows[b] : b) * K;
    float ss = 0.0f;
    for (int i = tid * 4; i < K; i += kCThreads * 4) {
      const float4 v = __ldcg(reinterpret_cast<const float4*>(r + i));
      ss = fmaf(v.x, v.x, ss), ss = fmaf(v.y, v.y, ss), ss = fmaf(v.z, v.z, ss), ss = fmaf(v.w, v.w, ss);
    }
    ss = warp_sum(ss);
    if (lane == 0) sm.ssq[warp * 8 + b] = ss;
  }
  consumers_sync();
  for (int b = 0; b < nrows; ++b) {
    float tot = 0.0f;
#pragma unroll
    for (int w2 = 0; w2 < kCWarps; ++w2) tot += sm.ssq[w2 * 8 + b];
    const float inv = rsqrtf(tot / static_cast<float>(K) + eps);
    const float* r = resid + static_cast<int64_t>(rows ? rows[b] : b) * K;
    for (int i = tid * 4; i < K; i += kCThreads * 4) {
      const float4 v = __ldcg(reinterpret_cast<const float4*>(r + i));
      const float4 w = *reinterpret_cast<const float4*>(nw + i);
      uint2 o;
      o.x = static_cast<uint32_t>(f2bf(v.x * inv * w.x)) | (static_cast<uint32_t>(f2bf(v.y * inv * w.y)) << 16);
      o.y = static_cast<uint32_t>(f2bf(v.z * inv * w.z)) | (static_cast<uint32_t>(f2bf(v.w * inv * w.w)) << 16);
      *reinterpret_cast<uint2*>(sm.xs + static_cast<int64_t>(b) * sm.xstride + i) = o;
    }
  }
  consumers_sync();
}

// The end of this CTA's piece of `tile`: the warps' accumulators added in warp order; a whole tile
// goes to the epilogue, a split one through the workspace and a ticket (the last CTA adds the
// pieces in CTA order).
template <Op OP>
__device__ __forceinline__ void finish_piece(const DecArgs& a, const Split& sp, int tile, const float (&c)[4], Smem& sm,
                             const Pieces& w, unsigned* ready) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float* red = sm.red + (sm.piece++ & 1) * kCWarps * 128;
  *reinterpret_cast<float4*>(red + (warp * 32 + lane) * 4) = make_float4(c[0], c[1], c[2], c[3]);
  consumers_sync();
  if (warp != 0) return;
  float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
  for (int w2 = 0; w2 < kCWarps; ++w2) {
    const float4 q = *reinterpret_cast<const float4*>(red + (w2 * 32 + lane) * 4);
    v[0] += q.x, v[1] += q.y, v[2] += q.z, v[3] += q.w;
  }
  const int g = lane >> 2, t = lane & 3;
  const int rt = real_tile<OP>(a, tile, sp.rr);
  const bool whole = sp.whole(tile);
  const int first = whole ? 0 : sp.cta_of(static_cast<int64_t>(tile) * sp.nk);
  const int last = whole ? 0 : sp.cta_of(static_cast<int64_t>(tile + 1) * sp.nk - 1);
  if (first == last) {
    epilogue<OP, true>(a, rt, g, t, v);
    __syncwarp();
    if (ready && lane == 0) ready_add(ready + ready_index<OP>(a, rt));
    return;
  }
  float* mine = w.parts + static_cast<int64_t>(sp.part_index(blockIdx.x, tile)) * 128;
  __stcg(reinterpret_cast<float4*>(mine) + lane, make_float4(v[0], v[1], v[2], v[3]));
  __syncwarp();
  unsigned ticket = 0;
  if (lane == 0) ticket = arrive_acq_rel(&w.tickets[tile]);
  ticket = __shfl_sync(0xffffffffu, ticket, 0);
  __syncwarp();  // orders the lanes' reads below after lane 0's acquire
  int pieces = 0;
  for (int c2 = first; c2 <= last; ++c2) pieces += sp.lo(c2 + 1) > sp.lo(c2);
  if (ticket != static_cast<unsigned>(pieces - 1)) return;
  float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int c2 = first; c2 <= last; ++c2) {
    if (sp.lo(c2 + 1) == sp.lo(c2)) continue;
    const float4 q = __ldcg(reinterpret_cast<const float4*>(w.parts + static_cast<int64_t>(sp.part_index(c2, tile)) * 128) + lane);
    s[0] += q.x, s[1] += q.y, s[2] += q.z, s[3] += q.w;
  }
  epilogue<OP, true>(a, rt, g, t, s);
  if (lane == 0) w.tickets[tile] = 0;
  __syncwarp();
  if (ready && lane == 0) ready_add(ready + ready_index<OP>(a, rt));
}

// ready: the counters this operation's finished tiles increment (null: none); gate: what an Add's
// stage waits for before its input columns are loaded.
template <Op OP>
__device__ __forceinline__ void consume(const DecArgs& a, bool rr, Ring& r, Smem& sm, const Pieces& w,
                                        unsigned* ready = nullptr, const Gate& gate = Gate{}) {
  constexpr int U = kKc / 32 / kCWarps;  // chunks a warp takes of a stage
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const Split sp(a, rr);
  const int64_t n = sp.count(blockIdx.x);
  // The input columns of stage s: from shared memory (the norm ops) or through L2 (o_proj, down:
  // loaded a stage ahead, so the L2 round trip overlaps the wait for the weights).
  uint64_t seen = 0;
  auto load_x = [&](int64_t s, uint4 (&xv)[U]) {
    const int k0 = static_cast<int>(s % sp.nk) * kKc, chunks = min(kKc, a.K - k0) / 32;
    if constexpr (OP == Op::Add) gate.wait(k0, min(kKc, a.K - k0), seen);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int ch = warp + u * kCWarps, k = k0 + ch * 32 + t * 8;
      xv[u] = make_uint4(0, 0, 0, 0);
      if (ch < chunks && g < a.B) {
        if constexpr (OP == Op::Add) xv[u] = __ldcg(reinterpret_cast<const uint4*>(a.x + static_cast<int64_t>(g) * a.K + k));
        else xv[u] = *reinterpret_cast<const uint4*>(sm.xs + static_cast<int64_t>(g) * sm.xstride + k);
      }
    }
  };
  float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  int cur = -1;
  uint4 xv[U], xn[U];
  int64_t s = sp.first(blockIdx.x);
  if (n > 0) load_x(s, xv);
  for (int64_t i = 0; i < n; ++i, ++r.ctr) {
    const int64_t sn = sp.next(blockIdx.x, i, s);
    const int tile = static_cast<int>(s / sp.nk), k0 = static_cast<int>(s % sp.nk) * kKc;
    if (tile != cur) {
      if (cur >= 0) finish_piece<OP>(a, sp, cur, c, sm, w, ready);
      c[0] = c[1] = c[2] = c[3] = 0.0f;
      cur = tile;
    }
    if (i + 1 < n) load_x(sn, xn);
    const int slot = static_cast<int>(r.ctr % r.n);
    const unsigned char* st = r.slots + static_cast<size_t>(slot) * kSlotBytes;
    const int chunks = min(kKc, a.K - k0) / 32;
    mbar_wait(&r.full[slot], (r.ctr / r.n) & 1);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int ch = warp + u * kCWarps;
      if (ch >= chunks) break;
      const int off = (ch * 32 + t * 8) * 2;
      const uint4 wa = *reinterpret_cast<const uint4*>(st + g * kRowBytes + off);
      const uint4 wb = *reinterpret_cast<const uint4*>(st + (g + 8) * kRowBytes + off);
      mma_bf16(c, wa.x, wb.x, wa.y, wb.y, xv[u].x, xv[u].y);
      mma_bf16(c, wa.z, wb.z, wa.w, wb.w, xv[u].z, xv[u].w);
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(&r.empty[slot]);
#pragma unroll
    for (int u = 0; u < U; ++u) xv[u] = xn[u];
    s = sn;
  }
  if (cur >= 0) finish_piece<OP>(a, sp, cur, c, sm, w, ready);
}

__device__ __forceinline__ int keys_per_split(int ctx) { return 32 * ((ctx + 32 * kMaxSplits - 1) / (32 * kMaxSplits)); }

// One (row b, KV head kvh, split s) of attention by one warp: see the top of the file. Scores on
// the tensor cores: 16 keys x the group's heads (columns; bf16 q) an mma, the K fragments loaded
// straight from L2 as decode.cu loads weight rows; P through the warp's shared slice pw [32][kMaxG];
// P V on the CUDA cores, lanes owning (key group, 8 dims).
// done (null in barrier mode): the KV groups' att_ready, incremented once the (b, kvh) output is written.
template <int HD>
__device__ __forceinline__ void attend(const MegaDecode& m, const uint16_t* cache, int b, int kvh, int s, int ks, int ns, int ctx,
                       float* pw, const Work& w, unsigned* done) {
  constexpr int NC = HD / 32;                                  // 32-dim chunks
  constexpr int LPR = HD / 8, NG = 32 / LPR, KPL = 32 / NG;  // lanes a V row, key groups, V keys a lane
  const int lane = threadIdx.x & 31, dl = lane % LPR, kg = lane / LPR, g = lane >> 2, t = lane & 3;
  const int nkv = m.rk.n_kv, G = m.rk.n_heads / nkv;
  const int32_t* table = m.rk.tables + static_cast<int64_t>(m.rk.seq_of_token[b]) * m.rk.max_blocks;
  auto kv_at = [&](int pos, int which) {  // key / value row `pos` of this KV head
    const int blk = table[pos / kBlockTokens];
    return cache + ((static_cast<int64_t>(blk) * 2 + which) * nkv + kvh) * kBlockTokens * HD +
           static_cast<int64_t>(pos % kBlockTokens) * HD;
  };
  // q of head g of the group as the mma's B column g (dims c * 32 + t * 8 .. + 8 of each chunk).
  uint4 qf[NC];
  {
    const float* q = m.rk.q_out + (static_cast<int64_t>(b) * m.rk.n_heads + kvh * G + (g < G ? g : 0)) * HD;
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      qf[c] = make_uint4(0, 0, 0, 0);
      if (g < G) {
        const float4 u = __ldcg(reinterpret_cast<const float4*>(q + c * 32 + t * 8));
        const float4 v = __ldcg(reinterpret_cast<const float4*>(q + c * 32 + t * 8 + 4));
        qf[c] = make_uint4(pack_bf2(u.x, u.y), pack_bf2(u.z, u.w), pack_bf2(v.x, v.y), pack_bf2(v.z, v.w));
      }
    }
  }
  float mrun[kMaxG], lrun[kMaxG], o[kMaxG][8];
#pragma unroll
  for (int h = 0; h < kMaxG; ++h) {
    mrun[h] = -INFINITY, lrun[h] = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; ++e) o[h][e] = 0.0f;
  }
  const int k_begin = s * ks, k_end = min(ctx, k_begin + ks);
  for (int k0 = k_begin; k0 < k_end; k0 += 32) {
    // V's lines head for L2 while the scores are computed.
#pragma unroll
    for (int i = 0; i < KPL; ++i) {
      const int kv = k0 + kg + NG * i;
      if (kv < k_end) asm volatile("prefetch.global.L2 [%0];" ::"l"(kv_at(kv, 1) + dl * 8));
    }
    // sc[kb]: keys k0 + 16 kb + g (elements 0, 1) and + 8 (2, 3), heads 2t (0, 2) and 2t + 1 (1, 3).
    float sc[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
    for (int kb = 0; kb < 2; ++kb) {
      const int r0 = k0 + 16 * kb + g, r1 = r0 + 8;
      uint4 a0[NC], a1[NC];
#pragma unroll
      for (int c = 0; c < NC; ++c) {
        a0[c] = r0 < k_end ? __ldcg(reinterpret_cast<const uint4*>(kv_at(r0, 0) + c * 32 + t * 8)) : make_uint4(0, 0, 0, 0);
        a1[c] = r1 < k_end ? __ldcg(reinterpret_cast<const uint4*>(kv_at(r1, 0) + c * 32 + t * 8)) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int c = 0; c < NC; ++c) {
        mma_bf16(sc[kb], a0[c].x, a1[c].x, a0[c].y, a1[c].y, qf[c].x, qf[c].y);
        mma_bf16(sc[kb], a0[c].z, a1[c].z, a0[c].w, a1[c].w, qf[c].z, qf[c].w);
      }
    }
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int kb = 0; kb < 2; ++kb)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = k0 + 16 * kb + g + (e >= 2 ? 8 : 0);
        sc[kb][e] = key < k_end ? sc[kb][e] * m.scale : -INFINITY;
        mx[e & 1] = fmaxf(mx[e & 1], sc[kb][e]);
      }
#pragma unroll
    for (int off = 4; off < 32; off <<= 1)
      mx[0] = fmaxf(mx[0], __shfl_xor_sync(0xffffffffu, mx[0], off)), mx[1] = fmaxf(mx[1], __shfl_xor_sync(0xffffffffu, mx[1], off));
    float mnew[kMaxG], corr[kMaxG];
#pragma unroll
    for (int h = 0; h < kMaxG; ++h) {  // head h's maximum is on lanes t = h / 2
      mnew[h] = fmaxf(mrun[h], __shfl_sync(0xffffffffu, mx[h & 1], h >> 1));
      corr[h] = mrun[h] == -INFINITY ? 0.0f : __expf(mrun[h] - mnew[h]);
    }
    const float m0 = t == 0 ? mnew[0] : mnew[2 % kMaxG], m1 = t == 0 ? mnew[1] : mnew[3 % kMaxG];
    float sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int kb = 0; kb < 2; ++kb)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = 2 * t + (e & 1);
        const float pe = __expf(sc[kb][e] - ((e & 1) ? m1 : m0));  // masked keys: exp(-inf) = 0
        if (t < 2 && h < G) pw[(16 * kb + g + (e >= 2 ? 8 : 0)) * kMaxG + h] = pe;
        sum[e & 1] += pe;
      }
#pragma unroll
    for (int off = 4; off < 32; off <<= 1)
      sum[0] += __shfl_xor_sync(0xffffffffu, sum[0], off), sum[1] += __shfl_xor_sync(0xffffffffu, sum[1], off);
#pragma unroll
    for (int h = 0; h < kMaxG; ++h) {
      lrun[h] = lrun[h] * corr[h] + __shfl_sync(0xffffffffu, sum[h & 1], h >> 1);
      mrun[h] = mnew[h];
#pragma unroll
      for (int e = 0; e < 8; ++e) o[h][e] *= corr[h];
    }
    __syncwarp();
    // P V in two halves of the lane's values (registers).
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      uint4 vr[KPL / 2];
#pragma unroll
      for (int i = 0; i < KPL / 2; ++i) {
        const int kv = k0 + kg + NG * (half * KPL / 2 + i);
        vr[i] = kv < k_end ? __ldcg(reinterpret_cast<const uint4*>(kv_at(kv, 1) + dl * 8)) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int i = 0; i < KPL / 2; ++i) {
        const int j = kg + NG * (half * KPL / 2 + i);  // the value's key within the round
        if (k0 + j >= k_end) continue;
#pragma unroll
        for (int h = 0; h < kMaxG; ++h) {
          if (h >= G) break;
          const float pj = pw[j * kMaxG + h];
          o[h][0] = fmaf(pj, lo_bf(vr[i].x), o[h][0]), o[h][1] = fmaf(pj, hi_bf(vr[i].x), o[h][1]);
          o[h][2] = fmaf(pj, lo_bf(vr[i].y), o[h][2]), o[h][3] = fmaf(pj, hi_bf(vr[i].y), o[h][3]);
          o[h][4] = fmaf(pj, lo_bf(vr[i].z), o[h][4]), o[h][5] = fmaf(pj, hi_bf(vr[i].z), o[h][5]);
          o[h][6] = fmaf(pj, lo_bf(vr[i].w), o[h][6]), o[h][7] = fmaf(pj, hi_bf(vr[i].w), o[h][7]);
        }
      }
    }
    __syncwarp();  // pw is rewritten by the next round
  }
#pragma unroll
  for (int h = 0; h < kMaxG; ++h) {
#pragma unroll
    for (int off = LPR; off < 32; off <<= 1)
#pragma unroll
      for (int e = 0; e < 8; ++e) o[h][e] += __shfl_xor_sync(0xffffffffu, o[h][e], off);
  }
  uint16_t* out = m.att + (static_cast<int64_t>(b) * m.rk.n_heads + kvh * G) * HD;
  if (ns == 1) {
    if (kg == 0)
#pragma unroll
      for (int h = 0; h < kMaxG; ++h)
        if (h < G)
#pragma unroll
          for (int e = 0; e < 8; ++e) out[h * HD + dl * 8 + e] = f2bf(o[h][e] / lrun[h]);
    __syncwarp();
    if (done && lane == 0) ready_add(done + kvh);
    return;
  }
  const int pf = attn_part_floats(HD);
  float* base = w.attn_parts + (static_cast<int64_t>(b) * nkv + kvh) * kMaxSplits * pf;
  float* part = base + static_cast<int64_t>(s) * pf;
  if (kg == 0)
#pragma unroll
    for (int h = 0; h < kMaxG; ++h)
      if (h < G)
#pragma unroll
        for (int e = 0; e < 8; ++e) __stcg(part + 2 * kMaxG + h * HD + dl * 8 + e, o[h][e]);
  if (lane == 0)
#pragma unroll
    for (int h = 0; h < kMaxG; ++h)
      if (h < G) __stcg(part + h, mrun[h]), __stcg(part + kMaxG + h, lrun[h]);
  __syncwarp();
  unsigned ticket = 0;
  unsigned* cnt = w.attn_cnt + b * nkv + kvh;
  if (lane == 0) ticket = arrive_acq_rel(cnt);
  ticket = __shfl_sync(0xffffffffu, ticket, 0);
  __syncwarp();
  if (ticket != static_cast<unsigned>(ns - 1)) return;
  // The last split merges all of them, in split order. Lane s2 < ns reads split s2's maximum and sum
  // of every head and holds its weight exp(m - M) / L; every lane then adds the splits' outputs for
  // its (head, 8 dims), all loads of a round in flight at once.
  float f[kMaxG];
#pragma unroll
  for (int h = 0; h < kMaxG; ++h) {
    const bool has = lane < ns && h < G;
    const float* ps = base + static_cast<int64_t>(has ? lane : 0) * pf;
    const float mh = has ? __ldcg(ps + h) : -INFINITY;
    const float lh = has ? __ldcg(ps + kMaxG + h) : 0.0f;
    const float M = warp_max(mh);
    const float e = has ? __expf(mh - M) : 0.0f;
    const float L = warp_sum(e * lh);
    f[h] = has ? e / L : 0.0f;
  }
#pragma unroll
  for (int j = 0; j < (kMaxG + NG - 1) / NG; ++j) {
    const int h = kg + NG * j;
    float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 4  // fully unrolled, the loads of 16 splits spill
    for (int s2 = 0; s2 < kMaxSplits; ++s2) {
      float wgt = 0.0f;
#pragma unroll
      for (int hh = 0; hh < kMaxG; ++hh) {
        const float v = __shfl_sync(0xffffffffu, f[hh], s2);
        if (hh == h) wgt = v;
      }
      if (s2 < ns && h < G) {
        const float* po = base + static_cast<int64_t>(s2) * pf + 2 * kMaxG + h * HD + dl * 8;
        const float4 v0 = __ldcg(reinterpret_cast<const float4*>(po));
        const float4 v1 = __ldcg(reinterpret_cast<const float4*>(po + 4));
        acc[0] = fmaf(wgt, v0.x, acc[0]), acc[1] = fmaf(wgt, v0.y, acc[1]);
        acc[2] = fmaf(wgt, v0.z, acc[2]), acc[3] = fmaf(wgt, v0.w, acc[3]);
        acc[4] = fmaf(wgt, v1.x, acc[4]), acc[5] = fmaf(wgt, v1.y, acc[5]);
        acc[6] = fmaf(wgt, v1.z, acc[6]), acc[7] = fmaf(wgt, v1.w, acc[7]);
      }
    }
    if (h < G)
#pragma unroll
      for (int e = 0; e < 8; ++e) out[h * HD + dl * 8 + e] = f2bf(acc[e]);
  }
  if (lane == 0) *cnt = 0;
  __syncwarp();
  if (done && lane == 0) ready_add(done + kvh);
}

// Attention item `it` (over rows, then KV heads, then splits): false past the last.
struct Item {
  int b, kvh, s, ks, ns, ctx;
};
__device__ __forceinline__ bool item_of(const MegaDecode& m, int B, int it, Item& o) {
  for (int b = 0; b < B; ++b) {
    const int ctx = m.ctx_len[b], ks = keys_per_split(ctx), ns = (ctx + ks - 1) / ks;
    if (it < ns * m.rk.n_kv) {
      o = Item{b, it / ns, it % ns, ks, ns, ctx};
      return true;
    }
    it -= ns * m.rk.n_kv;
  }
  return false;
}

// Before the barrier that ends the QKV projection: this warp's attention keys and values to L2
// (the positions before this step's are there already; its own row is written to L2 anyway).
__device__ __forceinline__ void prefetch_attention(const MegaDecode& m, int l, int B) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, hd = m.rk.hd, nkv = m.rk.n_kv;
  const uint16_t* cache = m.layers[l].cache;
  Item t;
  for (int it = blockIdx.x * kCWarps + warp; item_of(m, B, it, t); it += gridDim.x * kCWarps) {
    const int32_t* table = m.rk.tables + static_cast<int64_t>(m.rk.seq_of_token[t.b]) * m.rk.max_blocks;
    const int k_end = min(t.ctx, (t.s + 1) * t.ks);
    for (int k = t.s * t.ks + lane; k < k_end; k += 32) {
      const int blk = table[k / kBlockTokens];
      for (int which = 0; which < 2; ++which) {
        const uint16_t* row = cache + ((static_cast<int64_t>(blk) * 2 + which) * nkv + t.kvh) * kBlockTokens * hd +
                              static_cast<int64_t>(k % kBlockTokens) * hd;
        for (int off = 0; off < hd; off += 64) asm volatile("prefetch.global.L2 [%0];" ::"l"(row + off));
      }
    }
  }
}

// counters: each item first waits for its KV group's QKV tiles, and merged outputs count in att_ready.
__device__ __forceinline__ void attention_op(const MegaDecode& m, int l, int B, Smem& sm, const Work& w, bool counters) {
  const int warp = threadIdx.x >> 5;
  float* pw = reinterpret_cast<float*>(sm.xs) + warp * 32 * kMaxG;
  const uint16_t* cache = m.layers[l].cache;
  const unsigned group_tiles = static_cast<unsigned>((m.rk.n_heads / m.rk.n_kv + 2) * (m.rk.hd / 16));
  uint64_t seen = 0;
  Item t;
  for (int it = blockIdx.x * kCWarps + warp; item_of(m, B, it, t); it += gridDim.x * kCWarps) {
    if (counters) {
      const bool known = t.kvh < 64 && ((seen >> t.kvh) & 1);
      if ((threadIdx.x & 31) == 0 && !known) {
        ready_wait(w.qkv_ready + t.kvh, group_tiles);
        if (t.kvh < 64) seen |= 1ull << t.kvh;
      }
      __syncwarp();
    }
    unsigned* done = counters ? w.att_ready : nullptr;
    if (m.rk.hd == 128) attend<128>(m, cache, t.b, t.kvh, t.s, t.ks, t.ns, t.ctx, pw, w, done);
    else attend<64>(m, cache, t.b, t.kvh, t.s, t.ks, t.ns, t.ctx, pw, w, done);
    __syncwarp();
  }
}

__global__ void __launch_bounds__(kThreadsM, 1) mega_k(const __grid_constant__ MegaDecode m, int B, int R, int n_slots,
                                                       int xstride, int ring_off) {
  extern __shared__ __align__(128) unsigned char smem[];
  Ring r;
  r.full = reinterpret_cast<uint64_t*>(smem);
  r.empty = r.full + kMaxSlots;
  r.slots = smem + ring_off;
  r.n = n_slots;
  if (threadIdx.x == 0) {
    for (int i = 0; i < n_slots; ++i) mbar_init(&r.full[i], 1), mbar_init(&r.empty[i], kCWarps);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  }
  __syncthreads();
  if (threadIdx.x >= kCThreads) {
    producer(m, B, R, r);
    return;
  }
  const Work w = carve(m);
  Smem sm;
  sm.red = reinterpret_cast<float*>(smem + kHdrBytes);
  sm.ssq = sm.red + kRedFloats;
  sm.xs = reinterpret_cast<uint16_t*>(sm.ssq + kSsqFloats);
  sm.xstride = xstride;
  // Tracing: barrier k's last arrival at trace[mega_trace_arrivals(L) + k]; first kMegaTraceProbe barriers with no
  // work between them (the barrier's own cost while the producers stream), stamped 10 L + 2 / + 3.
  // With the readiness counters, a removed barrier's place is stamped by CTA 0 as it passes (no
  // wait, no release).
  int nb = 0;
  auto sync = [&] {
    grid_sync(w.bar, m.trace ? m.trace + mega_trace_arrivals(m.L) + nb : nullptr);
    ++nb;
  };
  const bool counters = !m.barriers;
  auto point = [&] {  // where barrier mode has a barrier the counters replace
    if (!counters) return sync();
    if (m.trace && blockIdx.x == 0 && threadIdx.x == 0) m.trace[mega_trace_arrivals(m.L) + nb] = globaltimer();
    ++nb;
  };
  if (m.trace) {
    stamp(m, m.L * 10 + 2);
    for (int i = 0; i < kMegaTraceProbe; ++i) sync();
    stamp(m, m.L * 10 + 3);
  }
  // A CTA with no stages of a norm operation skips the norm (counters: see the top of the file).
  const bool rr = m.deal_rr;
  auto has_stages = [&](const DecArgs& a) { return !counters || Split(a, rr).count(blockIdx.x) > 0; };
  // The gates of o_proj and down, made where they are used (fewer registers live across the layer).
  auto att_gate = [&] {
    Gate g;
    if (counters) {
      g.ready = w.att_ready, g.cols = m.rk.n_heads / m.rk.n_kv * m.rk.hd, g.n = m.rk.n_kv;
      g.full = g.last_full = static_cast<unsigned>(B);
    }
    return g;
  };
  auto act_gate = [&] {
    Gate g;
    if (counters) {
      const int n = act_chunks(m);
      g.ready = w.act_ready, g.cols = kKc, g.n = n, g.full = kKc / 8;
      g.last_full = static_cast<unsigned>((m.I - (n - 1) * kKc + 7) / 8);
    }
    return g;
  };
  stamp(m, m.L * 10);
  for (int l = 0; l < m.L; ++l) {
    const MegaLayer& L = m.layers[l];
    const DecArgs qkv = args_qkv(m, l, B), gu = args_gate_up(m, l, B);
    if (has_stages(qkv)) stage_norm(m.resid, nullptr, B, m.H, L.attn_norm, m.eps, sm);
    consume<Op::Qkv>(qkv, rr, r, sm, pieces_of(w, 0), counters ? w.qkv_ready : nullptr);
    prefetch_attention(m, l, B);
    stamp(m, l * 10);
    point();
    stamp(m, l * 10 + 1);
    attention_op(m, l, B, sm, w, counters);
    stamp(m, l * 10 + 2);
    point();
    stamp(m, l * 10 + 3);
    consume<Op::Add>(args_add(m, L.wo, m.att, m.rk.n_heads * m.rk.hd, B), rr, r, sm, pieces_of(w, 1), nullptr, att_gate());
    stamp(m, l * 10 + 4);
    sync();
    if (counters && blockIdx.x == 0)  // their last waits were before this barrier; zero for the next layer
      for (int i = threadIdx.x; i < 2 * m.rk.n_kv; i += kCThreads) w.qkv_ready[i] = 0;  // qkv_ready, att_ready
    stamp(m, l * 10 + 5);
    if (has_stages(gu)) stage_norm(m.resid, nullptr, B, m.H, L.ffn_norm, m.eps, sm);
    consume<Op::GateUp>(gu, rr, r, sm, pieces_of(w, 0), counters ? w.act_ready : nullptr);
    stamp(m, l * 10 + 6);
    point();
    stamp(m, l * 10 + 7);
    consume<Op::Add>(args_add(m, L.wdown, m.act, m.I, B), rr, r, sm, pieces_of(w, 1), nullptr, act_gate());
    stamp(m, l * 10 + 8);
    sync();
    if (counters && blockIdx.x == 0)
      for (int i = threadIdx.x; i < act_chunks(m); i += kCThreads) w.act_ready[i] = 0;
    stamp(m, l * 10 + 9);
  }
  if (R > 0) {
    stage_norm(m.resid, m.rows, R, m.H, m.out_norm, m.eps, sm);
    consume<Op::Logits>(args_logits(m, R), rr, r, sm, pieces_of(w, 0));
  }
  stamp(m, m.L * 10 + 1);
}

struct Layout {
  int xstride, ring_off, slots;
  size_t smem;
};
Layout layout(const MegaDecode& m, int B) {
  Layout l{};
  l.xstride = m.H + 32;
  const int64_t xs = std::max<int64_t>(2LL * B * l.xstride, 4LL * kCWarps * 32 * kMaxG);
  l.ring_off = static_cast<int>(align_up(kHdrBytes + 4LL * (kRedFloats + kSsqFloats) + xs, 128));
  static const int max_smem = [] {  // asked once: layout() runs at every launch
    int v = 0, dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess)
      v = 227 * 1024;
    return v;
  }();
  l.slots = static_cast<int>(std::min<int64_t>(kMaxSlots, (max_smem - l.ring_off) / kSlotBytes));
  l.smem = static_cast<size_t>(l.ring_off) + static_cast<size_t>(std::max(l.slots, 0)) * kSlotBytes;
  return l;
}

}  // namespace

std::string mega_unsupported(const MegaDecode& m) {
  const int hd = m.rk.hd;
  if (hd != 64 && hd != 128) return "head dim " + std::to_string(hd) + " (64 or 128)";
  if (m.rk.n_kv <= 0 || m.rk.n_heads % m.rk.n_kv != 0 || m.rk.n_heads / m.rk.n_kv > kMaxG)
    return "a GQA group of more than " + std::to_string(kMaxG) + " heads";
  if (m.rk.q_norm || m.rk.k_norm) return "per-head q/k norms";
  if (m.H % 64 != 0 || m.I % 32 != 0 || (m.rk.n_heads * hd) % 32 != 0) return "hidden sizes not multiples of 64 / 32";
  if (m.L <= 0 || m.V <= 0) return "an empty model";
  MegaDecode z = m;
  if (layout(z, kMegaMaxBatch).slots < kMinSlots) return "too little shared memory for the weight ring";
  return {};
}

size_t mega_work_bytes(const MegaDecode& m) { return static_cast<size_t>(work_layout(m, std::max(1, device_sm_count())).total); }

Status mega_decode(const MegaDecode& m, int n_tok, int n_rows, cudaStream_t s) {
  if (n_tok < 1 || n_tok > kMegaMaxBatch || n_rows < 0 || n_rows > n_tok)
    return make_error("mega_decode: needs 1.." + std::to_string(kMegaMaxBatch) + " tokens and at most as many rows (" +
                      std::to_string(n_tok) + ", " + std::to_string(n_rows) + ")");
  const std::string why = mega_unsupported(m);
  if (!why.empty()) return make_error("mega_decode: not for this model: " + why);
  if (!m.layers || !m.work || !m.resid || !m.att || !m.act || (n_rows > 0 && (!m.logits || !m.out_w)))
    return make_error("mega_decode: missing buffers");
  const Layout l = layout(m, n_tok);
  const int grid = device_sm_count();
  if (grid <= 0) return make_error("mega_decode: no CUDA device");
  SS_CUDA_TRY(cudaFuncSetAttribute(mega_k, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(l.smem)));
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(kThreadsM);
  cfg.dynamicSmemBytes = l.smem;
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeCooperative;  // every CTA resident at once: the barriers need it
  attr[0].val.cooperative = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  SS_CUDA_TRY(cudaLaunchKernelEx(&cfg, mega_k, m, n_tok, n_rows, l.slots, l.xstride, l.ring_off));
  SS_CUDA_LAUNCHED();
  return {};
}

}  // namespace ss::cuda::kern
