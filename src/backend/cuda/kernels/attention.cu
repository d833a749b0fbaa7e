// Paged attention over the bf16 KV cache, decode and prefill alike: one CTA per (query row, KV head,
// split) serves the group's query heads, so each K/V vector read from memory is used by every head
// of the group (GQA). Inside a CTA each group of hd/8 lanes walks its own keys (a lane holds 8
// consecutive dims of q for each head and of the key), keeps an online softmax per head in
// registers; the walkers of a warp merge by shuffles, the warps through shared memory. Long contexts
// are split across CTAs (flash-decoding): each split writes (max, sum, unnormalised output), and the
// splits are merged by attn_combine_k, or in place by the last split CTA (split_counters, a ticket),
// or, for a row whose live splits fit one thread-block cluster (Attention::cluster; the fused decode
// at batch 1), through the cluster's distributed shared memory. The three merges do the same
// arithmetic in split order.
#include <cooperative_groups.h>
#include <string>

#include "backend/cuda/kernels/common.cuh"

namespace ss::cuda::kern {
namespace {

using namespace dev;

constexpr int kAttnWarps = 4;
constexpr int kMaxGroup = 8;  // query heads a KV head serves, at most
constexpr int kMaxCluster = 16;  // splits merged in a cluster, at most (Attention::cluster)

constexpr float kLog2e = 1.4426950408889634f;

// The split kernel's key walkers (attn_split_k): DL dims a lane, LPK lanes a key, KPR keys (walkers) a
// warp, W walkers a CTA, TBK keys a walker loads at once: W x TBK is split_keys' minimum, one batch
// for every walker.
template <int HD, int MG>
struct Walk {
  static constexpr int DL = 8;
  static constexpr int LPK = HD / DL;
  static constexpr int KPR = 32 / LPK;
  static constexpr int W = kAttnWarps * KPR;
  static constexpr int kMin = kAttnWarps * (32 / (HD / 32)) < kBlockTokens ? kBlockTokens : kAttnWarps * (32 / (HD / 32));
  static constexpr int TBK = kMin / W;
  static_assert(LPK >= 1 && LPK <= 32 && TBK >= 1 && W * TBK == kMin, "walker shape");
};

// Keys per split for a context of ctx over `splits` splits: whole 16-key blocks, at least one batch
// of keys for every warp (kAttnWarps x 32 / (HD / 32): 64 at head dim 64, 32 at 128, 16 at 256; a
// shorter split takes as long and only adds merging), so short contexts leave the later splits
// empty. Depends on ctx, splits and the head dim only.
template <int HD>
__device__ __forceinline__ int split_keys(int ctx, int splits) {
  constexpr int kMinSplitKeys = kAttnWarps * (32 / (HD / 32)) < kBlockTokens ? kBlockTokens : kAttnWarps * (32 / (HD / 32));
  int per = (ctx + splits - 1) / splits;
  per = (per + kBlockTokens - 1) / kBlockTokens * kBlockTokens;
  return max(per, kMinSplitKeys);
}


// Workspace: (max, sum) pairs [n_q][n_heads][max_splits][2], then the unnormalised outputs
// [n_q][n_heads][max_splits][hd] (16-byte aligned rows, so a merge reads them with vector loads).
__device__ __forceinline__ float* ws_ml(const Attention& a, int qi, int h, int split) {
  return a.workspace + ((static_cast<int64_t>(qi) * a.n_heads + h) * a.max_splits + split) * 2;
}
__device__ __forceinline__ float* ws_acc(const Attention& a, int n_q, int qi, int h, int split) {
  return a.workspace + static_cast<int64_t>(n_q) * a.n_heads * a.max_splits * 2 +
         ((static_cast<int64_t>(qi) * a.n_heads + h) * a.max_splits + split) * a.hd;
}

// Merges the ns partial softmaxes of each head of the group: warp w takes heads w, w + 4, ...;
// lane s holds split s's (and s + 32's) weight, each lane its EPL output dims.
template <int HD>
__device__ __forceinline__ void merge_splits(const Attention& a, int n_q, int qi, int kvh, int G, int ns) {
  constexpr int EPL = HD / 32;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int g = warp; g < G; g += kAttnWarps) {
    const int h = kvh * G + g;
    const float* ml0 = ws_ml(a, qi, h, 0);
    const float m0 = lane < ns ? __ldcg(ml0 + 2 * lane) : -INFINITY;
    const float m1 = lane + 32 < ns ? __ldcg(ml0 + 2 * (lane + 32)) : -INFINITY;
    const float l0 = lane < ns ? __ldcg(ml0 + 2 * lane + 1) : 0.0f;
    const float l1 = lane + 32 < ns ? __ldcg(ml0 + 2 * (lane + 32) + 1) : 0.0f;
    const float M = warp_max(fmaxf(m0, m1));
    const float f0 = m0 == -INFINITY ? 0.0f : exp2f(m0 - M), f1 = m1 == -INFINITY ? 0.0f : exp2f(m1 - M);
    // L and A accumulate in split order with fmaf, as the cluster merge does (bit-identical results
    // whichever merge a row takes).
    float L = 0.0f;
    float A[EPL];
#pragma unroll
    for (int e = 0; e < EPL; ++e) A[e] = 0.0f;
    const float* acc0 = ws_acc(a, n_q, qi, h, 0) + lane * EPL;
    // CH splits' partials requested at once, then accumulated in split order (one round trip a
    // chunk, not one every few splits).
    constexpr int CH = HD <= 128 ? 8 : 4;
    for (int s0 = 0; s0 < ns; s0 += CH) {
      float2 v[CH][EPL / 2];
#pragma unroll
      for (int j = 0; j < CH; ++j)
        if (s0 + j < ns)
#pragma unroll
          for (int e = 0; e < EPL; e += 2)
            v[j][e / 2] = __ldcg(reinterpret_cast<const float2*>(acc0 + static_cast<int64_t>(s0 + j) * HD + e));
#pragma unroll
      for (int j = 0; j < CH; ++j) {
        const int sp = s0 + j;
        if (sp >= ns) break;
        const float f = __shfl_sync(0xffffffffu, sp < 32 ? f0 : f1, sp & 31);
        L = fmaf(__shfl_sync(0xffffffffu, sp < 32 ? l0 : l1, sp & 31), f, L);
#pragma unroll
        for (int e = 0; e < EPL; e += 2) {
          A[e] = fmaf(f, v[j][e / 2].x, A[e]);
          A[e + 1] = fmaf(f, v[j][e / 2].y, A[e + 1]);
        }
      }
    }
    const float inv = L > 0.0f ? 1.0f / L : 0.0f;
#pragma unroll
    for (int e = 0; e < EPL; ++e) a.out[(static_cast<int64_t>(qi) * a.n_heads + h) * HD + lane * EPL + e] = f2bf(A[e] * inv);
  }
}

// MG: the group size rounded up to 2, 4 or 8 (the register arrays' size; G <= MG heads are live).
template <int HD, int MG>
__global__ void __launch_bounds__(kAttnWarps * 32, MG <= 4 ? 3 : 2) attn_split_k(Attention a, int splits) {
  const int qi = blockIdx.x, kvh = blockIdx.y, split = blockIdx.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int G = a.n_heads / a.n_kv;
  if (a.empty) {  // benchmarking only: the kernel boundary alone
    pdl_wait();
    pdl_trigger();
    return;
  }
  // The phase trace: CTA (0, 0, 0) stamps its phases, every CTA its exit, the merger of (0, 0) slot 6.
  unsigned long long* const st = blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 ? a.stamps : nullptr;
  phase(st, 0);
  // Before the wait, what the previous kernel (the QKV projection) does not write: the context
  // length and block table (host inputs of the step) and the keys and values of this split, which
  // go to L2 (prefetch, no registers). L2 is where writes land, so a line the QKV kernel is still
  // writing (this step's own key) is read fresh after the wait; the rest are L2 hits instead of
  // DRAM round trips on the step's critical path.
  const int ctx = a.ctx_len[qi];
  const int per = split_keys<HD>(ctx, splits);
  const int ns = (ctx + per - 1) / per;  // splits holding keys: the others have nothing to do
  // Merged in the cluster (a.cluster): the empty splits of the first cluster stay for its barriers.
  const bool clustered = a.cluster > 1 && ns > 1 && ns <= a.cluster;
  if (split >= ns && !(clustered && split < a.cluster)) {
    phase_leave(a.stamps);
    return;
  }
  const bool live = split < ns;
  const int begin = live ? split * per : 0, end = live ? min(ctx, begin + per) : 0;
  const int32_t* table = a.tables + static_cast<int64_t>(a.seq_of_query[qi]) * a.max_blocks;
  const int64_t kv_stride = static_cast<int64_t>(a.n_kv) * kBlockTokens * HD;  // K -> V of a block
  const int64_t step_bytes = static_cast<int64_t>(gridDim.x) * gridDim.y * gridDim.z * (end - begin) * HD * 2 * 2;
  if (live && step_bytes <= a.l2_prefetch_bytes) {
    constexpr int kLines = kBlockTokens * HD * 2 / 128;  // 128-byte lines of one head's K (or V) in a block
    const int b0 = begin / kBlockTokens, nb = (end - 1) / kBlockTokens - b0 + 1;
    for (int i = threadIdx.x; i < nb * 2 * kLines; i += blockDim.x) {
      const int blk_i = i / (2 * kLines), kv = (i / kLines) & 1, line = i % kLines;
      const uint16_t* p = a.cache + static_cast<int64_t>(table[b0 + blk_i]) * 2 * kv_stride + kv * kv_stride +
                          static_cast<int64_t>(kvh) * kBlockTokens * HD + line * 64;
      asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
    }
  }
  pdl_wait();
  pdl_trigger();
  phase(st, 1);

  // Walkers: a key is read by LPK lanes of DL = 8 consecutive dims each (q and the accumulators of
  // every head stay in registers: 16 dims a lane took 239 registers, 2 CTAs an SM), so a warp steps
  // over KPR keys at once, each group of LPK lanes (a walker) with its own online softmax per head.
  // A key's score then costs DL fmas and log2(LPK) shuffles, not a warp-wide sum: the earlier layout
  // (a lane per HD/32 dims, one key a warp step) spent ~250 cycles a (key, head) in dependent
  // shuffles, 6.5 us of the 10 us a layer at 135M (chain trace, 2026-12-06).
  using S = Walk<HD, MG>;
  constexpr int DL = S::DL, LPK = S::LPK, KPR = S::KPR, W = S::W, TBK = S::TBK;
  const int grp = lane / LPK, sub = lane % LPK;
  // q in registers (this lane's DL dims of each head), pre-scaled by scale * log2(e) so the softmax
  // runs on exp2.
  float q[MG][DL];
  const float qs = a.scale * kLog2e;
#pragma unroll
  for (int g = 0; g < MG; ++g) {
    const float4* qp = reinterpret_cast<const float4*>(a.q + (static_cast<int64_t>(qi) * a.n_heads + kvh * G + g) * HD + sub * DL);
#pragma unroll
    for (int c = 0; c < DL / 4; ++c) {
      const float4 v = g < G ? qp[c] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      q[g][4 * c] = v.x * qs, q[g][4 * c + 1] = v.y * qs, q[g][4 * c + 2] = v.z * qs, q[g][4 * c + 3] = v.w * qs;
    }
  }

  phase(st, 2);  // q loaded (the loads are used below: this is their issue, not their arrival)
  float m[MG], l[MG], acc[MG][DL];
#pragma unroll
  for (int g = 0; g < MG; ++g) {
    m[g] = -INFINITY, l[g] = 0.0f;
#pragma unroll
    for (int e = 0; e < DL; ++e) acc[g][e] = 0.0f;
  }
  const int64_t head_off = static_cast<int64_t>(kvh) * kBlockTokens * HD + sub * DL;
  // Keys in batches of TBK a walker (the warp's KPR consecutive keys, then W further): all K and V
  // loads issued before any arithmetic, then one running-max update per batch. The loop is uniform
  // over the warp (its first key), so the shuffles see every lane; a walker's keys past the end are
  // read in bounds and weighted 0.
  for (int tw = begin + warp * KPR; tw < end; tw += W * TBK) {
    uint4 kr[TBK][DL / 8], vr[TBK][DL / 8];
#pragma unroll
    for (int u = 0; u < TBK; ++u) {
      const int t = min(tw + grp + u * W, end - 1);
      const int64_t blk = table[t / kBlockTokens];
      const uint16_t* kp = a.cache + blk * 2 * kv_stride + head_off + (t % kBlockTokens) * HD;
#pragma unroll
      for (int c = 0; c < DL / 8; ++c) {
        kr[u][c] = *reinterpret_cast<const uint4*>(kp + 8 * c);
        vr[u][c] = *reinterpret_cast<const uint4*>(kp + kv_stride + 8 * c);
      }
    }
#pragma unroll
    for (int g = 0; g < MG; ++g) {
      if (g >= G) break;
      float sc[TBK];
      float bm = m[g];
#pragma unroll
      for (int u = 0; u < TBK; ++u) {
        float d0 = 0.0f, d1 = 0.0f;  // two chains: half the dependent fma latency
#pragma unroll
        for (int c = 0; c < DL / 8; ++c) {
          const uint4 w = kr[u][c];
          d0 = fmaf(q[g][8 * c + 0], lo_bf(w.x), d0), d1 = fmaf(q[g][8 * c + 1], hi_bf(w.x), d1);
          d0 = fmaf(q[g][8 * c + 2], lo_bf(w.y), d0), d1 = fmaf(q[g][8 * c + 3], hi_bf(w.y), d1);
          d0 = fmaf(q[g][8 * c + 4], lo_bf(w.z), d0), d1 = fmaf(q[g][8 * c + 5], hi_bf(w.z), d1);
          d0 = fmaf(q[g][8 * c + 6], lo_bf(w.w), d0), d1 = fmaf(q[g][8 * c + 7], hi_bf(w.w), d1);
        }
        float d = d0 + d1;
#pragma unroll
        for (int o = LPK / 2; o >= 1; o /= 2) d += __shfl_xor_sync(0xffffffffu, d, o);
        sc[u] = tw + grp + u * W < end ? d : -INFINITY;
        bm = fmaxf(bm, sc[u]);
      }
      const float bz = bm == -INFINITY ? 0.0f : bm;  // a walker with no key yet: everything stays 0
      const float corr = exp2f(m[g] - bz);
      float lsum = l[g] * corr;
#pragma unroll
      for (int e = 0; e < DL; ++e) acc[g][e] *= corr;
#pragma unroll
      for (int u = 0; u < TBK; ++u) {
        const float p = exp2f(sc[u] - bz);  // 0 for keys past the end
        lsum += p;
#pragma unroll
        for (int c = 0; c < DL / 8; ++c) {
          const uint4 w = vr[u][c];
          acc[g][8 * c + 0] = fmaf(p, lo_bf(w.x), acc[g][8 * c + 0]), acc[g][8 * c + 1] = fmaf(p, hi_bf(w.x), acc[g][8 * c + 1]);
          acc[g][8 * c + 2] = fmaf(p, lo_bf(w.y), acc[g][8 * c + 2]), acc[g][8 * c + 3] = fmaf(p, hi_bf(w.y), acc[g][8 * c + 3]);
          acc[g][8 * c + 4] = fmaf(p, lo_bf(w.z), acc[g][8 * c + 4]), acc[g][8 * c + 5] = fmaf(p, hi_bf(w.z), acc[g][8 * c + 5]);
          acc[g][8 * c + 6] = fmaf(p, lo_bf(w.w), acc[g][8 * c + 6]), acc[g][8 * c + 7] = fmaf(p, hi_bf(w.w), acc[g][8 * c + 7]);
        }
      }
      l[g] = lsum;
      m[g] = bm;
    }
  }
  // The warp's walkers merged by shuffles (halves, then quarters, ...): every group ends holding the
  // warp's result.
#pragma unroll
  for (int o = LPK; o < 32; o *= 2) {
#pragma unroll
    for (int g = 0; g < MG; ++g) {
      if (g >= G) break;
      const float mo = __shfl_xor_sync(0xffffffffu, m[g], o), lo = __shfl_xor_sync(0xffffffffu, l[g], o);
      const float M = fmaxf(m[g], mo);
      const float f = m[g] == -INFINITY ? 0.0f : exp2f(m[g] - M), fo = mo == -INFINITY ? 0.0f : exp2f(mo - M);
      l[g] = l[g] * f + lo * fo;
#pragma unroll
      for (int e = 0; e < DL; ++e) acc[g][e] = acc[g][e] * f + __shfl_xor_sync(0xffffffffu, acc[g][e], o) * fo;
      m[g] = M;
    }
  }

  phase(st, 3);  // warp 0's keys done
  // Merge the warps: per head, the max of the warps' maxima, then their rescaled sums.
  __shared__ float sm_m[kAttnWarps][MG], sm_l[kAttnWarps][MG];
  __shared__ float sm_acc[kAttnWarps][MG][HD];
  __shared__ float cl_m[MG], cl_l[MG], cl_acc[MG][HD];  // this split's result, for the cluster's merge
#pragma unroll
  for (int g = 0; g < MG; ++g) {
    if (g >= G) break;
    if (lane == 0) sm_m[warp][g] = m[g], sm_l[warp][g] = l[g];
    if (grp == 0)
#pragma unroll
      for (int e = 0; e < DL; ++e) sm_acc[warp][g][sub * DL + e] = acc[g][e];
  }
  __syncthreads();
  for (int i = threadIdx.x; i < G * HD; i += blockDim.x) {
    const int g = i / HD, d = i % HD;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < kAttnWarps; ++w) M = fmaxf(M, sm_m[w][g]);
    float L = 0.0f, A = 0.0f;
    if (M != -INFINITY) {
#pragma unroll
      for (int w = 0; w < kAttnWarps; ++w) {
        const float f = sm_m[w][g] == -INFINITY ? 0.0f : exp2f(sm_m[w][g] - M);
        L += sm_l[w][g] * f;
        A += sm_acc[w][g][d] * f;
      }
    }
    const int h = kvh * G + g;
    if (clustered) {
      if (d == 0) cl_m[g] = M, cl_l[g] = L;
      cl_acc[g][d] = A;
    } else if (ns == 1) {
      a.out[(static_cast<int64_t>(qi) * a.n_heads + h) * HD + d] = f2bf(L > 0.0f ? A / L : 0.0f);
    } else {
      if (d == 0) {
        float* ml = ws_ml(a, qi, h, split);
        ml[0] = M, ml[1] = L;
      }
      ws_acc(a, gridDim.x, qi, h, split)[d] = A;
    }
  }
  phase(st, 4);  // the split's result written (out, partials or shared memory)
  if (clustered && a.cluster_push) {
    // Into rank 0's dynamic shared memory ([cluster] maxima, [cluster] sums, [cluster][G][HD] outputs,
    // as launch_attn sizes it), one barrier (arrive.release / wait.acquire: the stores are visible to
    // rank 0 after it), then rank 0 merges in split order as merge_splits does.
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    const int rank = static_cast<int>(cluster.block_rank());
    extern __shared__ __align__(16) float attn_push[];
    float* const pm = cluster.map_shared_rank(attn_push, 0);
    float* const pl = pm + a.cluster * MG;
    float* const pa = pl + a.cluster * MG;
    __syncthreads();  // cl_* complete
    for (int i = threadIdx.x; i < G * HD; i += blockDim.x) {
      const int g = i / HD, d = i % HD;
      pa[(rank * MG + g) * HD + d] = cl_acc[g][d];
      if (d == 0) pm[rank * MG + g] = cl_m[g], pl[rank * MG + g] = cl_l[g];
    }
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
    if (rank == 0) {
      for (int i = threadIdx.x; i < G * HD; i += blockDim.x) {
        const int g = i / HD, d = i % HD;
        float M = -INFINITY;
        for (int sp = 0; sp < ns; ++sp) M = fmaxf(M, attn_push[sp * MG + g]);
        float L = 0.0f, A = 0.0f;  // merge_splits' arithmetic, in its order
        for (int sp = 0; sp < ns; ++sp) {
          const float m = attn_push[sp * MG + g];
          const float f = m == -INFINITY ? 0.0f : exp2f(m - M);
          L = fmaf(attn_push[(a.cluster + sp) * MG + g], f, L);
          A = fmaf(f, attn_push[2 * a.cluster * MG + (sp * MG + g) * HD + d], A);
        }
        const float inv = L > 0.0f ? 1.0f / L : 0.0f;
        a.out[(static_cast<int64_t>(qi) * a.n_heads + kvh * G + g) * HD + d] = f2bf(A * inv);
      }
      if (qi == 0 && kvh == 0 && a.stamps) {
        __syncthreads();
        if (threadIdx.x == 0) a.stamps[6] = gtimer();
      }
    }
    phase(st, 5);
    phase_leave(a.stamps);
    return;
  }
  if (clustered) {
    // Every split's (max, sum, output) is in its CTA's shared memory: after the barrier, the
    // cluster's CTAs merge the group's outputs together (CTA r takes elements r x 128 + thread,
    // strided), reading the live splits' results remotely in split order; the second barrier keeps
    // each CTA's shared memory alive until every remote read of it is done.
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();
    const int rank = static_cast<int>(cluster.block_rank());
    for (int i = rank * blockDim.x + threadIdx.x; i < G * HD; i += a.cluster * blockDim.x) {
      const int g = i / HD, d = i % HD;
      // Every live split's values requested at once (a remote read is a round trip of its own),
      // then merged in split order.
      float mv[kMaxCluster], lv[kMaxCluster], av[kMaxCluster];
#pragma unroll
      for (int sp = 0; sp < kMaxCluster; ++sp) {
        mv[sp] = -INFINITY, lv[sp] = 0.0f, av[sp] = 0.0f;
        if (sp < ns) {
          mv[sp] = *cluster.map_shared_rank(&cl_m[g], sp);
          lv[sp] = *cluster.map_shared_rank(&cl_l[g], sp);
          av[sp] = *cluster.map_shared_rank(&cl_acc[g][d], sp);
        }
      }
      float M = -INFINITY;
#pragma unroll
      for (int sp = 0; sp < kMaxCluster; ++sp) M = fmaxf(M, mv[sp]);
      float L = 0.0f, A = 0.0f;  // merge_splits' arithmetic, in its order
#pragma unroll
      for (int sp = 0; sp < kMaxCluster; ++sp) {
        if (sp >= ns) break;
        const float f = mv[sp] == -INFINITY ? 0.0f : exp2f(mv[sp] - M);
        L = fmaf(lv[sp], f, L);
        A = fmaf(f, av[sp], A);
      }
      const float inv = L > 0.0f ? 1.0f / L : 0.0f;
      a.out[(static_cast<int64_t>(qi) * a.n_heads + kvh * G + g) * HD + d] = f2bf(A * inv);
    }
    cluster.sync();
    if (qi == 0 && kvh == 0 && rank == 0 && a.stamps && threadIdx.x == 0) a.stamps[6] = gtimer();
    phase(st, 5);
    phase_leave(a.stamps);
    return;
  }
  if (ns == 1 || !a.split_counters) {
    phase(st, 5);
    phase_leave(a.stamps);
    return;
  }
  // The last split CTA of this (row, KV head) merges the splits (their partials read from L2).
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  unsigned* counter = a.split_counters + static_cast<int64_t>(qi) * a.n_kv + kvh;
  if (threadIdx.x == 0) last = atomicAdd(counter, 1u) == static_cast<unsigned>(ns - 1);
  __syncthreads();
  if (!last) {
    phase(st, 5);
    phase_leave(a.stamps);
    return;
  }
  __threadfence();
  merge_splits<HD>(a, gridDim.x, qi, kvh, G, ns);
  if (threadIdx.x == 0) *counter = 0;  // ready for the next launch (graph replays)
  if (a.stamps) {  // the phase trace: the merge of (row 0, KV head 0) done
    __syncthreads();
    if (qi == 0 && kvh == 0 && threadIdx.x == 0) a.stamps[6] = gtimer();
  }
  phase(st, 5);
  phase_leave(a.stamps);
}

template <int HD>
auto split_kernel(int G) {
  return G <= 2 ? attn_split_k<HD, 2> : G <= 4 ? attn_split_k<HD, 4> : attn_split_k<HD, 8>;
}

// One CTA (4 warps) per (query row, KV head): merges the splits' partial softmaxes.
template <int HD>
__global__ void __launch_bounds__(kAttnWarps * 32) attn_combine_k(Attention a, int splits) {
  const int qi = blockIdx.x, kvh = blockIdx.y;
  const int ctx = a.ctx_len[qi];
  const int per = split_keys<HD>(ctx, splits);
  const int ns = (ctx + per - 1) / per;
  if (ns > 1) merge_splits<HD>(a, gridDim.x, qi, kvh, a.n_heads / a.n_kv, ns);
}

template <int HD>
cudaError_t launch_attn(const Attention& a, int n_q, int splits, cudaStream_t s) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(n_q, a.n_kv, splits);
  cfg.blockDim = dim3(kAttnWarps * 32);
  cfg.stream = s;
  cudaLaunchAttribute attr[2];
  int n_attr = 0;
  if (a.pdl) {
    attr[n_attr].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n_attr++].val.programmaticStreamSerializationAllowed = 1;
  }
  auto* k = split_kernel<HD>(a.n_heads / a.n_kv);
  if (a.cluster > 1) {
    if (a.cluster > 8) cudaFuncSetAttribute(k, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    if (a.cluster_push) {  // rank 0's landing area: maxima and sums [cluster][MG], outputs [cluster][MG][HD]
      const int G = a.n_heads / a.n_kv, MG = G <= 2 ? 2 : G <= 4 ? 4 : 8;
      cfg.dynamicSmemBytes = sizeof(float) * static_cast<size_t>(a.cluster) * MG * (2 + HD);
      const cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 static_cast<int>(cfg.dynamicSmemBytes));
      if (e != cudaSuccess) return e;
    }
    attr[n_attr].id = cudaLaunchAttributeClusterDimension;
    attr[n_attr].val.clusterDim.x = 1, attr[n_attr].val.clusterDim.y = 1;
    attr[n_attr++].val.clusterDim.z = static_cast<unsigned>(a.cluster);
  }
  cfg.attrs = attr;
  cfg.numAttrs = n_attr;
  const cudaError_t e = cudaLaunchKernelEx(&cfg, k, a, splits);
  if (e != cudaSuccess) return e;
  if (splits > 1 && !a.split_counters) attn_combine_k<HD><<<dim3(n_q, a.n_kv), kAttnWarps * 32, 0, s>>>(a, splits);
  return cudaSuccess;
}

}  // namespace

int64_t attention_workspace_floats(int n_q, int n_heads, int hd, int max_splits) {
  return max_splits <= 1 ? 0 : static_cast<int64_t>(n_q) * n_heads * max_splits * (hd + 2);  // (max, sum) + hd
}

int attention_splits(int n_q, int n_kv, int sm_count, int max_splits) {
  const int64_t ctas = static_cast<int64_t>(n_q) * n_kv;
  int64_t want = (2 * static_cast<int64_t>(sm_count) + ctas - 1) / ctas;
  if (want < 1) want = 1;
  return static_cast<int>(want < max_splits ? want : max_splits);
}

int attention_max_cluster(int want, int hd, int g) {
  if (hd != 64 && hd != 128 && hd != 256) return 0;
  if (g < 1 || g > kMaxGroup) return 0;
  auto* k = hd == 64 ? split_kernel<64>(g) : hd == 128 ? split_kernel<128>(g) : split_kernel<256>(g);
  for (int c = want >= 16 ? 16 : want >= 8 ? 8 : 0; c >= 8; c /= 2) {
    if (c > 8 && cudaFuncSetAttribute(k, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess) {
      cudaGetLastError();
      continue;
    }
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(1, 1, 64);
    cfg.blockDim = dim3(kAttnWarps * 32);
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = 1, attr.val.clusterDim.y = 1, attr.val.clusterDim.z = static_cast<unsigned>(c);
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    int n = 0;
    if (cudaOccupancyMaxActiveClusters(&n, k, &cfg) == cudaSuccess && n >= 1) return c;
    cudaGetLastError();
  }
  return 0;
}

Status attention(const Attention& a, int n_q, int splits, cudaStream_t s) {
  if (a.n_kv <= 0 || a.n_heads % a.n_kv != 0 || a.n_heads / a.n_kv > kMaxGroup)
    return make_error("attention: n_heads (" + std::to_string(a.n_heads) + ") must be a multiple of n_kv (" +
                      std::to_string(a.n_kv) + ") with at most " + std::to_string(kMaxGroup) + " heads a group");
  if (a.hd != 64 && a.hd != 128 && a.hd != 256)
    return make_error("attention: head dim " + std::to_string(a.hd) + " not supported (64, 128, 256)");
  if (splits < 1 || splits > 64 || (splits > 1 && (splits > a.max_splits || !a.workspace)))
    return make_error("attention: splits " + std::to_string(splits) + " outside 1..max_splits (" +
                      std::to_string(a.max_splits) + ") or no workspace");
  if (a.cluster != 0 && (a.cluster < 2 || a.cluster > 16 || splits % a.cluster != 0 || !a.split_counters))
    return make_error("attention: a cluster of " + std::to_string(a.cluster) + " splits needs 2..16 dividing the splits (" +
                      std::to_string(splits) + ") and split counters");
  if (n_q <= 0) return {};
  if (a.n_kv > 65535) return make_error("attention: too many KV heads for the grid");
  const cudaError_t e = a.hd == 64    ? launch_attn<64>(a, n_q, splits, s)
                        : a.hd == 128 ? launch_attn<128>(a, n_q, splits, s)
                                      : launch_attn<256>(a, n_q, splits, s);
  SS_CUDA_TRY(e);
  SS_CUDA_LAUNCHED();
  return {};
}

}  // namespace ss::cuda::kern
