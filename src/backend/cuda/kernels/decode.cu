// The decode layer at batch 1..8 as five kernels chained by programmatic dependent launch (PDL):
//   QKV (RMSNorm of the residual in its prologue; RoPE and the KV store in its epilogue) → attention →
//   o_proj (adds into the residual) → gate/up (RMSNorm prologue, SwiGLU epilogue) → down (adds).
// Each kernel is launched with programmaticStreamSerialization, so its CTAs start while the previous
// kernel still runs: before `griddepcontrol.wait` they issue the first loads of their weight rows
// (weights never depend on the previous kernel), then wait, then trigger the next kernel's launch and
// compute. Launch latency and the first DRAM round trip hide behind the previous kernel's tail; a
// small model's step (hundreds of microsecond-sized kernels) is otherwise mostly those two.
//
// The RMSNorm moved from the producer (the old "last CTA normalises" tail) into the consumer: every
// CTA reads the fp32 residual rows (L2-resident, a few KiB), reduces their sums of squares and stages
// bf16(x * rms * w) in shared memory. That is redundant across CTAs but has no serial tail.
//
// The products run on the tensor cores: a warp feeds 16 weight rows straight from global memory
// into mma.m16n8k16 as the A operand and the batch (up to 8 rows) as the 8 columns of B, so the
// arithmetic and the activation traffic no longer grow with the batch (the CUDA-core GEMV spent
// B x 8 FMAs and B activation loads per 16 bytes of weights).
//
// A row's result is the same at every batch size: its dot product runs over the same chunks in
// the same order whatever B is (S, the warps splitting K, depends on the matrix and the GPU only;
// batch columns do not interact in an mma), and the norm's reduction tree is fixed, so a
// sequence's logits do not depend on what shares its step.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/decode_ops.cuh"
#include "backend/cuda/kernels/kquant.h"

namespace ss::cuda::kern {
namespace {

using namespace dev;
using namespace dec;

constexpr int kWarps = 8;       // a CTA
constexpr int kThreads = kWarps * 32;
// Chunks (32 K wide) in flight per warp: kU x 2 x 16-byte loads a lane. kU 4 fits 80 registers a
// thread (three CTAs a SM: two of this kernel, one of the next, under PDL); kU 8 needs 128 (two).
// Default kU 8, two CTAs a SM, pipelined where a warp has more than one round (Tuning below);
// SS_CUDA_DEC=<kU>,<ctas>[,<pipe 0|1>] overrides them for tuning.


__device__ __forceinline__ uint32_t bf2_sub(uint32_t a, uint32_t b) {
  __nv_bfloat162 x = *reinterpret_cast<__nv_bfloat162*>(&a), y = *reinterpret_cast<__nv_bfloat162*>(&b);
  const __nv_bfloat162 r = __hsub2(x, y);
  return *reinterpret_cast<const uint32_t*>(&r);
}
// Nibbles 0 and 4 of w as the bf16 pair (128 + q0, 128 + q4): (w & 0x000F000F) | 0x43004300 in one
// lop3 (the compiler emitted an AND and an OR: 16 logic ops a chunk instead of 8).
__device__ __forceinline__ uint32_t nib_bf(uint32_t w) {
  uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(r) : "r"(w), "r"(0x000F000Fu), "r"(0x43004300u));
  return r;
}
// Two int8 (bytes j, j + 1 of w) as a bf16 pair, exactly.
__device__ __forceinline__ uint32_t i8x2_bf(uint32_t w, int j) {
  const __nv_bfloat162 r = __floats2bfloat162_rn(static_cast<float>(static_cast<int8_t>((w >> (8 * j)) & 0xff)),
                                                 static_cast<float>(static_cast<int8_t>((w >> (8 * j + 8)) & 0xff)));
  return *reinterpret_cast<const uint32_t*>(&r);
}
__device__ __forceinline__ float h_at(const uint4& v, int i) {  // fp16 i (0..7) of 8 packed
  const uint32_t w = i < 2 ? v.x : i < 4 ? v.y : i < 6 ? v.z : v.w;
  return h2f(static_cast<uint16_t>(w >> (16 * (i & 1))));
}
__device__ __forceinline__ uint32_t word_at(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// The weight registers of one round of kU chunks, for rows g and g + 8 (bf16: kU 16-byte vectors
// a row; Q4: two words-of-four-chunks a row; Q8: four 16-byte pair-of-chunks a row; quantized: the
// round's 8 scales (and mins) a row).
// 8-bit quants (Q8_0's layout), and formats with a min term (m * sum(x)).
template <WFormat F>
constexpr bool kBits8 =
    F == WFormat::Q8_0 || F == WFormat::Q6_K || F == WFormat::Q5_0 || F == WFormat::Q5_1 || F == WFormat::Q5_K;
template <WFormat F>
constexpr bool kHasMin = F == WFormat::Q4_1 || F == WFormat::Q4_K || F == WFormat::Q5_1 || F == WFormat::Q5_K;
// Scales from Q4_K-style super-block headers (d, dmin, 6-bit scales and mins).
template <WFormat F>
constexpr bool kKHeader = F == WFormat::Q4_K || F == WFormat::Q5_K;
// fp16 mins a chunk, an array of their own.
template <WFormat F>
constexpr bool kMinArray = F == WFormat::Q4_1 || F == WFormat::Q5_1;

// Byte i (0..15) of a 16-byte vector.
__device__ __forceinline__ int byte_at(const uint4& v, int i) {
  return static_cast<int>((word_at(v, i / 4) >> (8 * (i % 4))) & 0xffu);
}

// Sub-block j's 6-bit scale and min from a Q4_K-style super-block header held in a register vector
// (bytes 4..15: the twelve scale bytes).
__device__ __forceinline__ void header_scale_min(const uint4& h, int j, int* sc, int* mn) {
  uint8_t q[12];
#pragma unroll
  for (int i = 0; i < 12; ++i) q[i] = static_cast<uint8_t>(byte_at(h, 4 + i));
  k4_scale_min(j, q, sc, mn);
}

template <WFormat F, int kU>
struct Round {
  static constexpr int kVecs = F == WFormat::BF16 ? kU : kBits8<F> ? kU / 2 : kU / 4;
  uint4 a[kVecs], b[kVecs];
  uint4 da, db, ma, mb;
};

// Chunk u of a round's scales for rows g and g + 8 (dg, dg8) and, for the formats with mins, the
// min term's factors (mg, mg8; else 0): a weight is dg q + mg. K formats: the super-block header
// (d, dmin, then 12 bytes of 6-bit (scale, min) pairs; the chunk is sub-block u): (d sc) q - dmin m.
template <WFormat F, int kU>
__device__ __forceinline__ void chunk_scales(const Round<F, kU>& r, int u, float& dg, float& dg8, float& mg,
                                             float& mg8) {
  mg = 0.0f, mg8 = 0.0f;
  if constexpr (kKHeader<F>) {
    int sc, mn, sc8, mn8;
    header_scale_min(r.da, u, &sc, &mn);
    header_scale_min(r.db, u, &sc8, &mn8);
    dg = h2f(static_cast<uint16_t>(r.da.x & 0xffffu)) * static_cast<float>(sc);
    dg8 = h2f(static_cast<uint16_t>(r.db.x & 0xffffu)) * static_cast<float>(sc8);
    mg = -(h2f(static_cast<uint16_t>(r.da.x >> 16)) * static_cast<float>(mn));
    mg8 = -(h2f(static_cast<uint16_t>(r.db.x >> 16)) * static_cast<float>(mn8));
  } else {
    dg = h_at(r.da, u), dg8 = h_at(r.db, u);
    if constexpr (kMinArray<F>) mg = h_at(r.ma, u), mg8 = h_at(r.mb, u);
  }
}

// W (16 rows a tile) times x (B <= 8 columns) on the tensor cores: one m16n8k16 per 16 K, the
// A fragment loaded straight from global memory. A lane loads 16 bytes (8 consecutive K) of rows
// g and g + 8 and feeds them to two mmas as K slots (2t, 2t+1, 2t+8, 2t+9); its B fragment is
// the same 8 K of batch row g, so the permutation cancels in the dot product. S warps split a
// tile's K (fixed order reduction through shared memory); CTAs loop over tiles, and the next
// tile's first chunks are in flight while the current one reduces. Quantized formats (F) build
// the same A fragment from the packed quants in registers and scale each chunk's mma partial.
//
// kPipe (bf16): two rounds of registers, the next round's loads issued before the current round's
// mmas, so a warp's loads stay in flight across its whole K range instead of one round trip a round
// (without it, each round's kU loads are issued only once the previous round is consumed). As
// ptxas compiles it, though, every weight load shares one scoreboard and a round's first use waits
// on it, i.e. also for the loads just issued: a round trip a round after all, unless the next
// round's loads depend on the current round (after() below; the packed formats, and bf16 under
// kBfDep).
//
// kI8 (every packed format; the norm ops): the activations as 8-bit blocks instead of bf16,
// and the products on the integer tensor cores (mma.m16n8k32 over the 8-bit quants), as llama.cpp's
// CUDA backend and our CPU backend compute them (act_quant.h's rule: per 32 values d = amax / 127,
// q = round-to-nearest-even(x * (1 / d))). The 4-bit formats' nibbles become the A operand (u8) with
// one AND (and one shift) a register, where the bf16 path spends a LOP3 and a subtraction per weight
// pair; the 8-bit layout's bytes (s8) with one byte permute, where it converted each to float.
// Q4_0's offset 8 and a float conversion ride in the mma's C operand (below); the mins' term takes
// sum(x) as d sum(q). ncu, H100, 8B Q4_0: gate/up issued 59 instructions a 16x32 weight chunk on the
// bf16 path with its ALU pipe the busiest.
// Three CTAs a SM for the packed Q4_0/Q4_K gate/up and lm_head kernels (compiled for 80 registers)
// were measured and dropped (H100, 2026-12-07: 8B Q4_0 step +1% at batch 1, +24% at batch 8, gate/up
// under ncu unchanged at 37.7 us): more warps did not move their DRAM throughput.
//
// A ring of cp.async copies (each warp copying its rounds into shared memory two rounds ahead, across
// tiles) was measured and removed: H200, 2026-12-07, 8B Q4_0 batch 1 -0.5%, batch 8 +2.5%, 1B +1-8%;
// H100 the same evening +6% at 8B (docs/perf/gpu.md).
template <Op OP, int kU, WFormat F, bool kPipe = false, bool kI8 = false, bool kBfDep = false>
__global__ void __launch_bounds__(kThreads, kU == 4 && !kPipe ? 3 : 2) dec_k(DecArgs a) {
  static_assert(!kI8 || (F != WFormat::BF16 && OP != Op::Add), "8-bit activations: the packed formats' norm ops");
  static_assert(!kBfDep || (F == WFormat::BF16 && kPipe), "the dependency of the pipelined loop: bf16's switch");
  static_assert(F == WFormat::BF16 || kU == 8, "packed formats: a round is one 256-weight block");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  if (a.empty) {  // benchmarking only: the kernel boundary alone
    pdl_wait();
    pdl_trigger();
    return;
  }
  unsigned long long* const st = blockIdx.x == 0 ? a.stamps : nullptr;  // the phase trace: CTA 0
  phase(st, 0);
  constexpr bool kNorm = OP != Op::Add;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int S = a.S, TPC = kWarps / S;
  const int sub = warp % S, tw = warp / S;
  const int K = a.K, chunks = K / 32;
  constexpr bool kQuant = F != WFormat::BF16;
  // KS > 1 (adds whose tiles fill under half the warp slots): CTA blockIdx.x takes K split
  // blockIdx.x % KS of tile group blockIdx.x / KS, and the tile's last CTA sums the splits (finish).
  const int KS = OP == Op::Add ? a.KS : 1, ks = static_cast<int>(blockIdx.x) % KS;
  const int cta = static_cast<int>(blockIdx.x) / KS, n_cta = static_cast<int>(gridDim.x) / KS;
  // Quantized rounds start on 8-chunk boundaries (their scale vectors and packed words align there).
  const int cpk = KS == 1 ? chunks : kQuant ? ((chunks + KS - 1) / KS + 7) / 8 * 8 : (chunks + KS - 1) / KS;
  const int k_begin = min(chunks, ks * cpk), k_end = min(chunks, k_begin + cpk), k_range = k_end - k_begin;
  const int cpw = kQuant ? ((k_range + S - 1) / S + 7) / 8 * 8 : (k_range + S - 1) / S;
  const int c_begin = min(k_end, k_begin + sub * cpw), c_end = min(k_end, c_begin + cpw);
  // The staged input: bf16 [B][K], or (kI8) its 8-bit blocks, xq [B][chunks + 1][4 lanes] uint2 (a
  // padded row: the 8 rows a warp reads land in different banks) and xd [chunks][8 columns] uint2.
  const size_t xs_bytes = !kNorm ? 0
                          : kI8  ? static_cast<size_t>(a.B) * (chunks + 1) * 32 + static_cast<size_t>(chunks) * 64
                                 : sizeof(uint16_t) * static_cast<size_t>(a.B) * K;
  const size_t sx_bytes = kHasMin<F> && !kI8 ? sizeof(float) * 8 * static_cast<size_t>(chunks) : 0;
  float* sx = reinterpret_cast<float*>(smem_raw + xs_bytes);                  // mins: [8][chunks] sums of x
  float* red = reinterpret_cast<float*>(smem_raw + xs_bytes + sx_bytes);      // [kWarps][32][4]

  const uint4 *pa = nullptr, *pb = nullptr;
  // Packed formats: rows r0's and r1's round 0 (quants at the lane's 16 bytes, scales, mins) in
  // either layout (a.pk); round R is a.pk.<part>.round bytes further.
  const uint8_t *qa = nullptr, *qb = nullptr, *da = nullptr, *db = nullptr, *ma = nullptr, *mb = nullptr;
  Round<F, kU> w, w2;  // w2: the second round of the pipelined loop (kPipe)
  if constexpr (F != WFormat::BF16 || kBfDep) w2.a[0] = make_uint4(0u, 0u, 0u, 0u);  // (the pipelined loop's dependency may read it first)
  auto set_rows = [&](int tile) {
    int64_t r0 = tile_row<OP>(a, tile, g), r1 = tile_row<OP>(a, tile, g + 8);
    r0 = r0 < 0 ? 0 : r0, r1 = r1 < 0 ? 0 : r1;  // a row past the matrix: loads row 0, result dropped
    if constexpr (F == WFormat::BF16) {
      pa = reinterpret_cast<const uint4*>(a.W + r0 * K) + t;
      pb = reinterpret_cast<const uint4*>(a.W + r1 * K) + t;
    } else {
      qa = part_at(a.pk.q, r0, 0) + 16 * t, qb = part_at(a.pk.q, r1, 0) + 16 * t;
      da = part_at(a.pk.d, r0, 0), db = part_at(a.pk.d, r1, 0);
      if constexpr (kMinArray<F>) ma = part_at(a.pk.m, r0, 0), mb = part_at(a.pk.m, r1, 0);
    }
  };
  // dep (0 at run time): added to the offsets, so the loads wait for whatever register it came from.
  auto load = [&](Round<F, kU>& r, int c0, uint32_t dep = 0) {
    if constexpr (F == WFormat::BF16) {
#pragma unroll
      for (int u = 0; u < kU; ++u)
        if (c0 + u < c_end) r.a[u] = ld_stream(pa + dep + 4 * (c0 + u)), r.b[u] = ld_stream(pb + dep + 4 * (c0 + u));
    } else {
      // c0 % 8 == 0 (a round: 256 weights, one block); a 64-byte group (4 lanes x 16 bytes) holds 4
      // chunks (Q4) or 2 (Q8).
      constexpr int per = kBits8<F> ? 2 : 4;
      const int64_t R = c0 / 8, oq = R * a.pk.q.round + dep, od = R * a.pk.d.round + dep;
#pragma unroll
      for (int v = 0; v < Round<F, kU>::kVecs; ++v)
        if (c0 + v * per < c_end) r.a[v] = ld_stream(qa + oq + 64 * v), r.b[v] = ld_stream(qb + oq + 64 * v);
      if (c0 >= c_end) return;  // an empty K split (a short row over many warps): no scales to read
      if constexpr (F == WFormat::Q6_K) {  // a round is one super-block: its scales, then d
        r.da = ld_stream(da + od), r.ma = ld_stream(da + od + 16);
        r.db = ld_stream(db + od), r.mb = ld_stream(db + od + 16);
      } else {
        r.da = ld_stream(da + od), r.db = ld_stream(db + od);
      }
      if constexpr (kMinArray<F>) {
        const int64_t om = R * a.pk.m.round + dep;
        r.ma = ld_stream(ma + om), r.mb = ld_stream(mb + om);
      }
    }
  };
  // The pipelined packed loop's dependency: ptxas puts every weight load on one scoreboard, and a
  // round's first use waits on it, so loads issued before a round's products would make those
  // products wait for them too. Issued at a dependency on the round's first quants instead, the
  // next round's loads wait for this round to land, then stay in flight during its products.
  // (bf16: kBfDep, SS_CUDA_DEC_BFDEP=1, while it is measured)
  auto after = [&](const Round<F, kU>& r) { return kQuant || kBfDep ? r.a[0].x & a.zero : 0u; };
  (void)after;

  int tb = cta * TPC;
  const int tstride = n_cta * TPC;
  // Before the wait: the first round of weights, the norm's weights, and what the first tile's
  // epilogue reads that the previous two kernels do not write (EpiIn): each a round trip the chain
  // no longer waits on after the wait (the phase trace, 2026-12-06: ~1.3 us of QKV's epilogue at
  // 135M was its position, rotation and block-table reads, one after another).
  EpiIn<OP> epi;
  if (tb + tw < a.tiles) {
    set_rows(tb + tw);
    load(w, c_begin);
    if (S == 1 || sub == 0) epi = EpiIn<OP>::load(a, tb + tw, g, t);
  }
  if constexpr (kNorm) {  // the norm's weights into L1 (prefetch: no registers held across the wait)
    for (int i = threadIdx.x * 4; i < K; i += kThreads * 4) asm volatile("prefetch.global.L1 [%0];" ::"l"(a.norm_w + i));
  }
  pdl_wait();
  pdl_trigger();
  phase(st, 1);

  // The norm ops: every batch row's sum of squares into ssq. A thread sums the squares of its
  // float4s at i = 4 threadIdx.x + 4 kThreads m, m ascending (the same order at every batch size: a
  // row's bits do not depend on its batch), then the warps' sums in warp order; after one barrier
  // each thread takes the 1/rms it needs from ssq.
  // Batch 1 with K <= 4 kHold kThreads (hold): the row stays in the registers it was summed from,
  // one read of the residual instead of two (a round trip a norm op). Otherwise kRS rows' loads in
  // flight together (a row after another left one round trip a row exposed, eight at batch 8).
  // Registers: the first round of weights is live across the prologue (64 of them in the bf16
  // kU = 8 kernels, so those hold one float4: K <= 1024, 135M); with these sizes ptxas reports no
  // spills in any kernel the defaults run (four rows at a time spilled 4-44 bytes).
  __shared__ float ssq[kWarps][8];
  constexpr int kHold = F == WFormat::BF16 && kU == 8 ? 1 : 4;  // float4s a thread holds
  constexpr int kRS = 2;                                         // rows whose loads are in flight together
  const bool hold = kNorm && a.hold && a.B == 1 && K <= kThreads * 4 * kHold;
  float4 hv[kHold];
  auto sumsq = [](float ss, const float4& v) {
    return fmaf(v.w, v.w, fmaf(v.z, v.z, fmaf(v.y, v.y, fmaf(v.x, v.x, ss))));
  };
  auto reduce_invs = [&](const float (&ss)[4], int b0) {
#pragma unroll
    for (int j = 0; j < kRS; ++j) {
      if (b0 + j >= a.B) break;  // uniform
      const float t2 = warp_sum(ss[j]);
      if (lane == 0) ssq[warp][b0 + j] = t2;
    }
  };
  // After row_invs' barrier: row b's 1/rms (each thread its own: no second barrier).
  auto inv_of = [&](int b) {
    float tot = 0.0f;
#pragma unroll
    for (int w2 = 0; w2 < kWarps; ++w2) tot += ssq[w2][b];
    return rsqrtf(tot / static_cast<float>(K) + a.eps);
  };
  (void)inv_of;
  auto row_invs = [&] {
    if (hold) {
      const float* r0 = a.resid + static_cast<int64_t>(a.rows ? a.rows[0] : 0) * K;
#pragma unroll
      for (int m = 0; m < kHold; ++m) {
        const int i = threadIdx.x * 4 + m * kThreads * 4;
        hv[m] = i < K ? *reinterpret_cast<const float4*>(r0 + i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
      float ss[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int m = 0; m < kHold; ++m)
        if (threadIdx.x * 4 + m * kThreads * 4 < K) ss[0] = sumsq(ss[0], hv[m]);
      reduce_invs(ss, 0);
      __syncthreads();
      return;
    }
    for (int b0 = 0; b0 < a.B; b0 += kRS) {
      const float* rp[kRS];
#pragma unroll
      for (int j = 0; j < kRS; ++j) rp[j] = a.resid + static_cast<int64_t>(a.rows ? a.rows[min(b0 + j, a.B - 1)] : min(b0 + j, a.B - 1)) * K;
      float ss[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      for (int i = threadIdx.x * 4; i < K; i += kThreads * 4) {
        float4 v[kRS];
#pragma unroll
        for (int j = 0; j < kRS; ++j)
          v[j] = b0 + j < a.B ? *reinterpret_cast<const float4*>(rp[j] + i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
        for (int j = 0; j < kRS; ++j) ss[j] = sumsq(ss[j], v[j]);
      }
      reduce_invs(ss, b0);
    }
    __syncthreads();
  };
  (void)row_invs;
  // After row_invs: fn(b, i, v, ok, inv) for every float4 v at i of every row b, in the mapping the
  // sums used (i = 4 threadIdx.x + 4 kThreads m), warp-uniformly (ok: i < K; a 32-value chunk is
  // all in or all out, K % 32 == 0): from the held registers, or kRS rows' loads at a time.
  auto for_each_float4 = [&](auto&& fn) {
    if (hold) {
      const float inv0 = inv_of(0);
#pragma unroll
      for (int m = 0; m < kHold; ++m) {
        const int i0 = warp * 128 + m * kThreads * 4;
        if (i0 < K) fn(0, i0 + lane * 4, hv[m], i0 + lane * 4 < K, inv0);
      }
      return;
    }
    for (int b0 = 0; b0 < a.B; b0 += kRS) {
      const float* rp[kRS];
      float inv[kRS];
#pragma unroll
      for (int j = 0; j < kRS; ++j) {
        const int b = min(b0 + j, a.B - 1);
        rp[j] = a.resid + static_cast<int64_t>(a.rows ? a.rows[b] : b) * K, inv[j] = inv_of(b);
      }
      for (int i0 = warp * 128; i0 < K; i0 += kThreads * 4) {
        const int i = i0 + lane * 4;
        const bool ok = i < K;
        float4 v[kRS];
#pragma unroll
        for (int j = 0; j < kRS; ++j)
          v[j] = ok && b0 + j < a.B ? *reinterpret_cast<const float4*>(rp[j] + i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
        for (int j = 0; j < kRS; ++j)
          if (b0 + j < a.B) fn(b0 + j, i, v[j], ok, inv[j]);
      }
    }
  };
  (void)for_each_float4;
  (void)hv;
  const uint16_t* x = nullptr;
  const uint2* xq8 = nullptr;  // kI8: the lane's slot of batch row g's blocks
  const uint4* xd4 = nullptr;  // kI8: chunk c's (d, C) of columns 2t and 2t + 1 at xd4[4 c]
  if constexpr (kI8) {
    // 8-bit blocks of the normalised rows, q = rne(x * (1 / d)), d = amax / 127 over each 32 values
    // (x * inv * w in fp32, as the bf16 path computes them). A thread takes 4 values (the float4 of
    // the sums above), a chunk is 8 adjacent lanes; the lanes holding a slot's values 0-3 and 4-7
    // (a pair) swap their bytes so each writes one word of the slot in the order the weights'
    // nibbles unpack to: word 0 = values (0, 4, 1, 5), word 1 = (2, 6, 3, 7), xq [B][chunks + 1][4
    // slots] uint2 (a padded row). Beside each block (xd [chunks][8 columns]): d, and for Q4_0 the
    // mma's C operand 0x4B400000 - 8 sum(q), so the accumulator comes out as the float bits of
    // 1.5 * 2^23 + sum((w - 8) q) (|sum| < 2^20): one FADD makes it a float, exactly; for the other
    // formats d sum(q), the mins' term's sum(x) (their C is 0x4B400000).
    uint2* xq = reinterpret_cast<uint2*>(smem_raw);
    uint2* xd = reinterpret_cast<uint2*>(smem_raw + static_cast<size_t>(a.B) * (chunks + 1) * 32);
    const int per_b = chunks * 4;
    row_invs();
    // One float4 of row b at i (every lane of the warp calls it: the shuffles).
    auto quantize4 = [&](int b, int i, const float4& x4, bool ok, float inv) {
      float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      if (ok) {
        const float4 wv = *reinterpret_cast<const float4*>(a.norm_w + i);
        v[0] = x4.x * inv * wv.x, v[1] = x4.y * inv * wv.y, v[2] = x4.z * inv * wv.z, v[3] = x4.w * inv * wv.w;
      }
      float am = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
      am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, 1));
      am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, 2));
      am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, 4));
      const float d = __fdiv_rn(am, 127.0f), id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
      int q[4], sum = 0;
#pragma unroll
      for (int k2 = 0; k2 < 4; ++k2) {
        q[k2] = __float_as_int(__fadd_rn(__fmul_rn(v[k2], id), 12582912.0f)) - 0x4B400000;
        sum += q[k2];
      }
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      sum += __shfl_xor_sync(0xffffffffu, sum, 4);
      const uint32_t mine = __byte_perm(__byte_perm(q[0], q[1], 0x0040), __byte_perm(q[2], q[3], 0x0040), 0x5410);
      const uint32_t other = __shfl_xor_sync(0xffffffffu, mine, 1);
      const int half = (i >> 2) & 1;  // 0: the slot's values 0-3 (word 0), 1: values 4-7 (word 1)
      if (ok) {
        const int r = i >> 3;  // the slot: chunk i / 32, slot (i % 32) / 8
        reinterpret_cast<uint32_t*>(xq)[2 * (b * (per_b + 4) + r) + half] =
            half == 0 ? __byte_perm(mine, other, 0x5140) : __byte_perm(other, mine, 0x7362);
        if ((i & 31) == 0)
          xd[(i >> 5) * 8 + b] = make_uint2(__float_as_uint(d), F == WFormat::Q4_0 ? static_cast<uint32_t>(0x4B400000 - 8 * sum)
                                                                                    : __float_as_uint(d * static_cast<float>(sum)));
      }
    };
    for_each_float4(quantize4);
    for (int i = threadIdx.x; i < chunks * (8 - a.B); i += kThreads)  // columns past the batch: 0
      xd[(i / (8 - a.B)) * 8 + a.B + i % (8 - a.B)] = make_uint2(0u, F == WFormat::Q4_0 ? 0x4B400000u : 0u);
    __syncthreads();
    if (g < a.B) xq8 = xq + g * (per_b + 4) + t;
    xd4 = reinterpret_cast<const uint4*>(xd) + t;
  } else if constexpr (kNorm) {
    uint16_t* xs = reinterpret_cast<uint16_t*>(smem_raw);
    row_invs();
    auto put = [&](int b, int i, const float4& v, bool ok, float inv) {
      if (!ok) return;
      const float4 nw = *reinterpret_cast<const float4*>(a.norm_w + i);
      uint2 o;
      o.x = static_cast<uint32_t>(f2bf(v.x * inv * nw.x)) | (static_cast<uint32_t>(f2bf(v.y * inv * nw.y)) << 16);
      o.y = static_cast<uint32_t>(f2bf(v.z * inv * nw.z)) | (static_cast<uint32_t>(f2bf(v.w * inv * nw.w)) << 16);
      *reinterpret_cast<uint2*>(xs + static_cast<int64_t>(b) * K + i) = o;
    };
    for_each_float4(put);
    __syncthreads();
    x = xs;
  } else {
    x = a.x;
  }
  const uint4* xp = !kI8 && g < a.B ? reinterpret_cast<const uint4*>(x + static_cast<int64_t>(g) * K) + t : nullptr;
  if constexpr (kHasMin<F> && !kI8) {  // each chunk's sum of x, for the mins' term m * sum(x)
    for (int i = threadIdx.x; i < 8 * chunks; i += kThreads) {
      const int b = i / chunks, c = i % chunks;
      float sum = 0.0f;
      if (b < a.B) {
        const uint4* p = reinterpret_cast<const uint4*>(x + static_cast<int64_t>(b) * K + 32 * c);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const uint4 v = p[j];
          sum += lo_bf(v.x) + hi_bf(v.x) + lo_bf(v.y) + hi_bf(v.y) + lo_bf(v.z) + hi_bf(v.z) + lo_bf(v.w) + hi_bf(v.w);
        }
      }
      sx[i] = sum;
    }
    __syncthreads();
  }

  // One round: kU chunks of the tile from the round's registers r, starting at chunk c0.
  // The adds read their input from global memory (L2: the previous kernel wrote it): all of a
  // round's input loads are issued before its first mma, one L2 round trip a round instead of one a
  // chunk (ncu, H100, 8B Q4_0 batch 1: down took 3.5x its weight bytes' DRAM time with a load a chunk).
  // The norm ops read theirs from shared memory, a chunk at a time.
  // kFull (a round wholly inside the warp's K range, as every round is where the range is a multiple
  // of kU): no bound check a chunk, so the round is straight-line code the compiler can interleave.
  auto mma_round_t = [&](const Round<F, kU>& r, int c0, float (&c)[4], auto full) {
    constexpr bool kFull = decltype(full)::value;
    uint4 xr[kNorm ? 1 : kU];
    (void)xr;
    if constexpr (!kNorm) {
#pragma unroll
      for (int u = 0; u < kU; ++u) xr[u] = xp && (kFull || c0 + u < c_end) ? xp[4 * (c0 + u)] : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      if (!kFull && c0 + u >= c_end) break;
      if constexpr (kI8) {
        const uint2 xv = xq8 ? xq8[4 * (c0 + u)] : make_uint2(0u, 0u);
        const uint4 sd = xd4[4 * (c0 + u)];  // d and C (Q4_0) or d sum(q) of columns 2t, 2t + 1
        int p[4];
        if constexpr (F == WFormat::Q4_0)
          p[0] = static_cast<int>(sd.y), p[1] = static_cast<int>(sd.w), p[2] = p[0], p[3] = p[1];
        else
          p[0] = p[1] = p[2] = p[3] = 0x4B400000;
        if constexpr (kBits8<F>) {
          // The lane's 8 bytes a row are values 0..3 and 4..7 in order: permuted to the staged order.
          const uint4& va = r.a[u / 2];
          const uint4& vb = r.b[u / 2];
          const uint32_t a0 = (u & 1) ? va.z : va.x, a1 = (u & 1) ? va.w : va.y;
          const uint32_t b0 = (u & 1) ? vb.z : vb.x, b1 = (u & 1) ? vb.w : vb.y;
          const uint32_t lo_a = __byte_perm(a0, a1, 0x5140), lo_b = __byte_perm(b0, b1, 0x5140);
          const uint32_t hi_a = __byte_perm(a0, a1, 0x7362), hi_b = __byte_perm(b0, b1, 0x7362);
          if constexpr (F == WFormat::Q6_K) {
            // Two 16-weight sub-blocks a chunk, each its own scale (lanes 0-1 hold the first, as the
            // bf16 path): one mma each with the other lanes' weights zeroed.
            const bool lo = t < 2;
            int p1[4] = {0x4B400000, 0x4B400000, 0x4B400000, 0x4B400000};
            mma_s8s8(p, lo ? lo_a : 0u, lo ? lo_b : 0u, lo ? hi_a : 0u, lo ? hi_b : 0u, xv.x, xv.y);
            mma_s8s8(p1, lo ? 0u : lo_a, lo ? 0u : lo_b, lo ? 0u : hi_a, lo ? 0u : hi_b, xv.x, xv.y);
            const float d = h2f(static_cast<uint16_t>(r.ma.x & 0xffffu)), d8 = h2f(static_cast<uint16_t>(r.mb.x & 0xffffu));
            const float s0 = d * static_cast<float>(static_cast<int8_t>(byte_at(r.da, 2 * u)));
            const float s1 = d * static_cast<float>(static_cast<int8_t>(byte_at(r.da, 2 * u + 1)));
            const float s08 = d8 * static_cast<float>(static_cast<int8_t>(byte_at(r.db, 2 * u)));
            const float s18 = d8 * static_cast<float>(static_cast<int8_t>(byte_at(r.db, 2 * u + 1)));
            const float x0 = __uint_as_float(sd.x), x1 = __uint_as_float(sd.z);
            c[0] = fmaf(s0 * x0, __int_as_float(p[0]) - 12582912.0f, fmaf(s1 * x0, __int_as_float(p1[0]) - 12582912.0f, c[0]));
            c[1] = fmaf(s0 * x1, __int_as_float(p[1]) - 12582912.0f, fmaf(s1 * x1, __int_as_float(p1[1]) - 12582912.0f, c[1]));
            c[2] = fmaf(s08 * x0, __int_as_float(p[2]) - 12582912.0f, fmaf(s18 * x0, __int_as_float(p1[2]) - 12582912.0f, c[2]));
            c[3] = fmaf(s08 * x1, __int_as_float(p[3]) - 12582912.0f, fmaf(s18 * x1, __int_as_float(p1[3]) - 12582912.0f, c[3]));
            continue;
          }
          mma_s8s8(p, lo_a, lo_b, hi_a, hi_b, xv.x, xv.y);
        } else {
          const uint32_t wa32 = word_at(r.a[u / 4], u % 4), wb32 = word_at(r.b[u / 4], u % 4);
          mma_u8s8(p, wa32 & 0x0F0F0F0Fu, wb32 & 0x0F0F0F0Fu, (wa32 >> 4) & 0x0F0F0F0Fu, (wb32 >> 4) & 0x0F0F0F0Fu,
                   xv.x, xv.y);
        }
        float dg, dg8, mg, mg8;
        chunk_scales(r, u, dg, dg8, mg, mg8);
        const float x0 = __uint_as_float(sd.x), x1 = __uint_as_float(sd.z);
        c[0] = fmaf(dg * x0, __int_as_float(p[0]) - 12582912.0f, c[0]);
        c[1] = fmaf(dg * x1, __int_as_float(p[1]) - 12582912.0f, c[1]);
        c[2] = fmaf(dg8 * x0, __int_as_float(p[2]) - 12582912.0f, c[2]);
        c[3] = fmaf(dg8 * x1, __int_as_float(p[3]) - 12582912.0f, c[3]);
        if constexpr (kHasMin<F>) {  // + m sum(x), sum(x) as d sum(q)
          const float s0 = __uint_as_float(sd.y), s1 = __uint_as_float(sd.w);
          c[0] = fmaf(mg, s0, c[0]), c[1] = fmaf(mg, s1, c[1]);
          c[2] = fmaf(mg8, s0, c[2]), c[3] = fmaf(mg8, s1, c[3]);
        }
        continue;
      }
      uint4 xv;
      if constexpr (kNorm) xv = xp ? xp[4 * (c0 + u)] : make_uint4(0, 0, 0, 0);
      else xv = xr[u];
      if constexpr (F == WFormat::BF16) {
        mma_bf16(c, r.a[u].x, r.b[u].x, r.a[u].y, r.b[u].y, xv.x, xv.y);
        mma_bf16(c, r.a[u].z, r.b[u].z, r.a[u].w, r.b[u].w, xv.z, xv.w);
      } else {
        uint32_t pa4[4], pb4[4];  // the lane's 8 weights of rows g and g + 8 as bf16 pairs
        if constexpr (kBits8<F>) {
          const uint4& va = r.a[u / 2];
          const uint4& vb = r.b[u / 2];
          const uint32_t a0 = (u & 1) ? va.z : va.x, a1 = (u & 1) ? va.w : va.y;
          const uint32_t b0 = (u & 1) ? vb.z : vb.x, b1 = (u & 1) ? vb.w : vb.y;
          pa4[0] = i8x2_bf(a0, 0), pa4[1] = i8x2_bf(a0, 2), pa4[2] = i8x2_bf(a1, 0), pa4[3] = i8x2_bf(a1, 2);
          pb4[0] = i8x2_bf(b0, 0), pb4[1] = i8x2_bf(b0, 2), pb4[2] = i8x2_bf(b1, 0), pb4[3] = i8x2_bf(b1, 2);
        } else {
          // 128 + q as bf16 (0x4300 | q), then minus 136 (Q4_0: q - 8) or 128 (Q4_1: q), exactly.
          const uint32_t off = F == WFormat::Q4_0 ? 0x43084308u : 0x43004300u;
          const uint32_t wa32 = word_at(r.a[u / 4], u % 4), wb32 = word_at(r.b[u / 4], u % 4);
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            pa4[i] = bf2_sub(nib_bf(wa32 >> (4 * i)), off);
            pb4[i] = bf2_sub(nib_bf(wb32 >> (4 * i)), off);
          }
        }
        if constexpr (F == WFormat::Q6_K) {
          // Two 16-weight sub-blocks a chunk, each its own scale: lanes 0-1 hold the first
          // (weights 0..15), lanes 2-3 the second, so each sub-block's products come from the
          // same mmas with the other lanes' weights zeroed; d * sc in fp32, as GGUF's value.
          const bool lo = t < 2;
          uint32_t z0[4], z1[4], y0[4], y1[4];
#pragma unroll
          for (int i = 0; i < 4; ++i) z0[i] = lo ? pa4[i] : 0u, y0[i] = lo ? pb4[i] : 0u, z1[i] = lo ? 0u : pa4[i], y1[i] = lo ? 0u : pb4[i];
          float p0[4] = {0.0f, 0.0f, 0.0f, 0.0f}, p1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
          mma_bf16(p0, z0[0], y0[0], z0[1], y0[1], xv.x, xv.y);
          mma_bf16(p0, z0[2], y0[2], z0[3], y0[3], xv.z, xv.w);
          mma_bf16(p1, z1[0], y1[0], z1[1], y1[1], xv.x, xv.y);
          mma_bf16(p1, z1[2], y1[2], z1[3], y1[3], xv.z, xv.w);
          const float d = h2f(static_cast<uint16_t>(r.ma.x & 0xffffu)), d8 = h2f(static_cast<uint16_t>(r.mb.x & 0xffffu));
          const float s0 = d * static_cast<float>(static_cast<int8_t>(byte_at(r.da, 2 * u)));
          const float s1 = d * static_cast<float>(static_cast<int8_t>(byte_at(r.da, 2 * u + 1)));
          const float s08 = d8 * static_cast<float>(static_cast<int8_t>(byte_at(r.db, 2 * u)));
          const float s18 = d8 * static_cast<float>(static_cast<int8_t>(byte_at(r.db, 2 * u + 1)));
          c[0] = fmaf(s0, p0[0], fmaf(s1, p1[0], c[0])), c[1] = fmaf(s0, p0[1], fmaf(s1, p1[1], c[1]));
          c[2] = fmaf(s08, p0[2], fmaf(s18, p1[2], c[2])), c[3] = fmaf(s08, p0[3], fmaf(s18, p1[3], c[3]));
        } else {
          float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
          mma_bf16(p, pa4[0], pb4[0], pa4[1], pb4[1], xv.x, xv.y);
          mma_bf16(p, pa4[2], pb4[2], pa4[3], pb4[3], xv.z, xv.w);
          float dg, dg8, mg, mg8;
          chunk_scales(r, u, dg, dg8, mg, mg8);
          c[0] = fmaf(dg, p[0], c[0]), c[1] = fmaf(dg, p[1], c[1]);
          c[2] = fmaf(dg8, p[2], c[2]), c[3] = fmaf(dg8, p[3], c[3]);
          if constexpr (kHasMin<F>) {
            const float s0 = sx[(2 * t) * chunks + c0 + u], s1 = sx[(2 * t + 1) * chunks + c0 + u];
            c[0] = fmaf(mg, s0, c[0]), c[1] = fmaf(mg, s1, c[1]);
            c[2] = fmaf(mg8, s0, c[2]), c[3] = fmaf(mg8, s1, c[3]);
          }
        }
      }
    }
  };

  auto mma_round = [&](const Round<F, kU>& r, int c0, float (&c)[4]) {
    if (a.full_rounds && c0 + kU <= c_end) mma_round_t(r, c0, c, std::true_type{});
    else mma_round_t(r, c0, c, std::false_type{});
  };

  // A tile's reduced products (one warp's lanes, v) to its epilogue; with KS > 1 through the
  // tile's partials: each K split's CTA stores its own, and the last to take the tile's ticket sums
  // them in split order (the same order at every batch size) and runs the epilogue.
  auto finish = [&](int tile, const float (&v)[4], bool first) {
    if (OP != Op::Add || KS == 1) {
      if (first) epilogue<OP>(a, tile, g, t, v, &epi);  // (two calls: a pointer known at each keeps epi in registers)
      else epilogue<OP>(a, tile, g, t, v);
      return;
    }
    float* const base = a.part + static_cast<int64_t>(tile) * KS * 128 + lane * 4;
    __stcg(reinterpret_cast<float4*>(base + ks * 128), make_float4(v[0], v[1], v[2], v[3]));
    __threadfence();
    __syncwarp();
    unsigned last = 0;
    if (lane == 0) last = atomicAdd(a.tickets + tile, 1u) == static_cast<unsigned>(KS - 1) ? 1u : 0u;
    if (__shfl_sync(0xffffffffu, last, 0) == 0) return;
    __threadfence();
    float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int k2 = 0; k2 < KS; ++k2) {
      const float4 q = __ldcg(reinterpret_cast<const float4*>(base + k2 * 128));
      sum[0] += q.x, sum[1] += q.y, sum[2] += q.z, sum[3] += q.w;
    }
    if (lane == 0) a.tickets[tile] = 0;  // ready for the next launch (graph replays)
    if (first) epilogue<OP>(a, tile, g, t, sum, &epi);
    else epilogue<OP>(a, tile, g, t, sum);
  };

  phase(st, 2);  // the norm's prologue done (the input staged)
  bool w2_ahead = false;  // kPipe: the tile's second round was loaded during the previous reduction
  (void)w2_ahead;
  for (; tb < a.tiles; tb += tstride) {
    const int tile = tb + tw;
    const bool valid = tile < a.tiles;
    const bool first_tile = tb == cta * TPC;
    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (valid) {
      if constexpr (kPipe) {
        for (int c0 = c_begin; c0 < c_end; c0 += 2 * kU) {
          // (the dependency also enters the branch's condition: taken or not, the round has landed
          // after it, so the products need no second wait)
          const uint32_t d1 = after(w);
          if (c0 + kU + static_cast<int>(d1) < c_end && (c0 != c_begin || !w2_ahead)) load(w2, c0 + kU, d1);
          mma_round(w, c0, c);
          const uint32_t d2 = after(w2);
          if (c0 + 2 * kU + static_cast<int>(d2) < c_end) load(w, c0 + 2 * kU, d2);
          if (c0 + kU < c_end) mma_round(w2, c0 + kU, c);
        }
      } else {
        for (int c0 = c_begin; c0 < c_end; c0 += kU) {
          if (c0 != c_begin) load(w, c0);
          mma_round(w, c0, c);
        }
      }
    }
    if (first_tile) phase(st, 3);  // the first tile's products (warp 0's share)
    if (tile + tstride < a.tiles) {  // the next tile's first chunks, in flight during the reduction
      set_rows(tile + tstride);
      load(w, c_begin);
      if constexpr (kPipe && kQuant) {  // and its second round: both rounds' latencies behind the reduction
        // (the packed formats; bf16's kU = 4 rounds are 32 registers more across the epilogue: the
        // adds' kernel spilled)
        w2_ahead = c_begin + kU < c_end;
        if (w2_ahead) load(w2, c_begin + kU);
      }
    }
    if (S == 1) {
      if (valid) finish(tile, c, first_tile);
    } else {
      // One 16-byte store and load a lane (four scalar ones were 4-way bank conflicts).
      reinterpret_cast<float4*>(red)[warp * 32 + lane] = make_float4(c[0], c[1], c[2], c[3]);
      __syncthreads();
      if (valid && sub == 0) {
        float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int s2 = 0; s2 < S; ++s2) {
          const float4 q = reinterpret_cast<const float4*>(red)[(tw * S + s2) * 32 + lane];
          v[0] += q.x, v[1] += q.y, v[2] += q.z, v[3] += q.w;
        }
        finish(tile, v, first_tile);
      }
      __syncthreads();
    }
    if (first_tile) phase(st, 4);  // its reduction and epilogue
  }
  phase(st, 5);
  phase_leave(a.stamps);
}

// The packed formats' norm ops on 8-bit activations by default (SS_CUDA_DEC_I8 overrides). Off: on an
// H100 (2026-12-06, 8B Q4_0) the step was 0.9% faster at batch 1 and 11% slower at batch 8, the
// redundant per-CTA quantizing prologue costing more than the products gained (docs/perf/gpu.md).
constexpr bool kI8Default = false;

struct Tuning {
  int u = 8, ctas = 2;  // measured best at 8B and within noise of the best at 135M (H200)
  // bf16: the pipelined loop (two rounds of kU = 4 in registers). -1 (the default): wherever a warp's
  // K range holds more than one round of kU = 8 chunks, i.e. where the plain loop would expose a
  // round trip per round (H100, 2026-12-06: 8B 1-2.5% faster; at 135M, one round a warp, 1% slower).
  int pipe = -1;
  // Rounds wholly inside a warp's K range run without a bound check a chunk (SS_CUDA_DEC_FULL=0: every
  // round checked, as before, for the A/B).
  bool full_rounds = true;
  // The packed formats: the pipelined loop with two kU = 8 rounds in registers, where a warp's K
  // range holds more than one round and the kernel fits (packed_pipe_fits). -1 (the default): Q4_0
  // only, where it was measured (H200, 2026-12-07 20:15 UTC: 8B step 2.8% faster at batch 1, 1.8% at
  // 8; 1B 1.5% / 0.7%); SS_CUDA_DEC_QPIPE=1: Q4_K's fitting ops too; 0: nowhere.
  int qpipe = -1;
  // The packed formats' norm ops on 8-bit activations and the integer tensor cores (dec_k's kI8):
  // SS_CUDA_DEC_I8=1 / 0 against kI8Default.
  bool i8 = kI8Default;
  int force_s[4] = {0, 0, 0, 0};  // SS_CUDA_DEC_S (dispatch)
  // The packed formats' choice of S counts a wave's cross-warp reduction (S > 1: partial sums through
  // shared memory and a CTA barrier) as this many rounds (dispatch). SS_CUDA_DEC_SRED=0: the rule
  // before, rounds alone.
  int s_red = 3;
  // bf16's pipelined loop with the dependency that makes it pipeline (dec_k's kBfDep):
  // SS_CUDA_DEC_BFDEP=1 / 0, off until measured.
  bool bfdep = false;
  // The norm ops at batch 1 read the residual once and hold it in registers (DecArgs::hold);
  // SS_CUDA_DEC_HOLD=0: two reads, as at larger batches (the same bits either way).
  bool hold = true;
  // Benchmarking only: SS_CUDA_EMPTY=1 launches every fused decode kernel (and the attention, through
  // the backend) with its grid, to wait and exit, so a step's time is its kernel boundaries alone.
  bool empty = false;
};
const Tuning& tuning() {
  static Tuning t = [] {
    Tuning r;
    if (const char* e = std::getenv("SS_CUDA_EMPTY"); e && std::string(e) == "1") {
      r.empty = true;
      std::fprintf(stderr, "SS_CUDA_EMPTY=1: every fused decode kernel exits at once, outputs are WRONG\n");
    }
    if (const char* e = std::getenv("SS_CUDA_DEC")) {  // <kU>,<ctas>[,<pipe 0|1>]
      int u = 0, c = 0, p = 0;
      const int n = std::sscanf(e, "%d,%d,%d", &u, &c, &p);
      if (n >= 2 && (u == 4 || u == 8) && c >= 1 && c <= 8 && (p == 0 || (p == 1 && u == 4 && c <= 2)))
        r.u = u, r.ctas = c, r.pipe = p;
      else
        std::fprintf(stderr, "selfserve: SS_CUDA_DEC=%s ignored (want kU 4|8, CTAs 1..8, pipe only with kU 4 "
                     "and at most 2 CTAs)\n", e);
    }
    if (const char* e = std::getenv("SS_CUDA_DEC_FULL"); e && std::string(e) == "0") r.full_rounds = false;
    if (const char* e = std::getenv("SS_CUDA_DEC_I8"); e && (std::string(e) == "0" || std::string(e) == "1"))
      r.i8 = std::string(e) == "1";
    if (const char* e = std::getenv("SS_CUDA_DEC_HOLD"); e && std::string(e) == "0") r.hold = false;
    if (const char* e = std::getenv("SS_CUDA_DEC_QPIPE"); e && (std::string(e) == "0" || std::string(e) == "1"))
      r.qpipe = std::string(e) == "1" ? 1 : 0;
    if (const char* e = std::getenv("SS_CUDA_DEC_BFDEP"); e && (std::string(e) == "0" || std::string(e) == "1"))
      r.bfdep = std::string(e) == "1";
    if (const char* e = std::getenv("SS_CUDA_DEC_SRED")) {
      if (int v = -1; std::sscanf(e, "%d", &v) == 1 && v >= 0 && v <= 64)
        r.s_red = v;
      else
        std::fprintf(stderr, "selfserve: SS_CUDA_DEC_SRED=%s ignored (want 0..64)\n", e);
    }
    if (const char* e = std::getenv("SS_CUDA_DEC_S")) {
      int v[4] = {0, 0, 0, 0};
      if (std::sscanf(e, "%d,%d,%d,%d", &v[0], &v[1], &v[2], &v[3]) == 4 &&
          std::all_of(v, v + 4, [](int x) { return x == 0 || x == 1 || x == 2 || x == 4 || x == 8; }))
        std::copy(v, v + 4, r.force_s);
      else
        std::fprintf(stderr, "selfserve: SS_CUDA_DEC_S=%s ignored (want four of 0, 1, 2, 4, 8)\n", e);
    }
    return r;
  }();
  return t;
}


// The phase-trace slot for the next launch (set_chain_slot), taken once.
thread_local unsigned long long* g_chain_slot = nullptr;  // each host thread launches its own steps
unsigned long long* take_chain_slot() {
  unsigned long long* p = g_chain_slot;
  g_chain_slot = nullptr;
  return p;
}

// The instantiation for a launch: a packed format on bf16 or (i8, the norm ops only) 8-bit
// activations, or bf16 weights with kU 4 / 8 and the pipelined loop.
template <Op OP, bool kI8, bool kPipe>
auto pick_packed(WFormat f) {
  constexpr Op O = kI8 && OP == Op::Add ? Op::Qkv : OP;  // (never chosen for the adds: i8 is false there)
  switch (f) {
    case WFormat::Q4_0: return dec_k<O, 8, WFormat::Q4_0, kPipe, kI8>;
    case WFormat::Q4_1: return dec_k<O, 8, WFormat::Q4_1, false, kI8>;
    case WFormat::Q8_0: return dec_k<O, 8, WFormat::Q8_0, false, kI8>;
    case WFormat::Q4_K: return dec_k<O, 8, WFormat::Q4_K, kPipe, kI8>;
    case WFormat::Q5_0: return dec_k<O, 8, WFormat::Q5_0, false, kI8>;
    case WFormat::Q5_1: return dec_k<O, 8, WFormat::Q5_1, false, kI8>;
    case WFormat::Q5_K: return dec_k<O, 8, WFormat::Q5_K, false, kI8>;
    default: return dec_k<O, 8, WFormat::Q6_K, false, kI8>;
  }
}
// The packed formats whose pipelined kernels (two kU = 8 rounds in registers) fit 128 registers a
// thread without spilling (ptxas, sm_90): Q4_0, and Q4_K but for the adds; the others spill 8-580
// bytes (Q4_0's opt-in 8-bit QKV kernel spills 40).
bool packed_pipe_fits(WFormat f, Op op) { return f == WFormat::Q4_0 || (f == WFormat::Q4_K && op != Op::Add); }
bool packed_pipe_wanted(WFormat f) { return tuning().qpipe == -1 ? f == WFormat::Q4_0 : tuning().qpipe == 1; }
template <Op OP>
auto pick_kernel(WFormat f, bool i8, bool pipe, int kU) {
  if (f != WFormat::BF16) {
    if (pipe) return i8 ? pick_packed<OP, true, true>(f) : pick_packed<OP, false, true>(f);
    return i8 ? pick_packed<OP, true, false>(f) : pick_packed<OP, false, false>(f);
  }
  if (pipe) return tuning().bfdep ? dec_k<OP, 4, WFormat::BF16, true, false, true> : dec_k<OP, 4, WFormat::BF16, true>;
  return kU == 4 ? dec_k<OP, 4, WFormat::BF16> : dec_k<OP, 8, WFormat::BF16>;
}

std::atomic<int> g_s_set{0};  // dec_set_s (0: dispatch's choice)

template <Op OP>
Status dispatch(const char* what, const DevWeights& W, DecArgs a, bool pdl, cudaStream_t s, const SplitK* sk = nullptr) {
  a.W = static_cast<const uint16_t*>(W.q), a.Kp = packed_k(a.K);
  const bool quant = W.format != WFormat::BF16;
  int kU = quant ? 8 : tuning().u;
  if (quant && !W.groups &&
      (!W.d || (has_min_array(W.format) && !W.m) || (reinterpret_cast<uintptr_t>(W.d) & 15u) != 0 ||
       (W.m && (reinterpret_cast<uintptr_t>(W.m) & 15u) != 0)))
    return make_error(std::string(what) + ": packed weights need 16-byte aligned scales (and mins for Q4_1, Q5_1)");
  if (quant) a.pk = packed_at(W, a.K);
  if (is_k_format(W.format) && a.K % 256 != 0)
    return make_error(std::string(what) + ": K-quant weights need K a multiple of 256 (K=" + std::to_string(a.K) + ")");
  if (a.K <= 0 || a.K % 32 != 0 || a.B < 1 || a.B > 8 || a.tiles <= 0)
    return make_error(std::string(what) + ": needs K a positive multiple of 32, batch 1..8 and rows (K=" +
                      std::to_string(a.K) + ", batch=" + std::to_string(a.B) + ")");
  if ((reinterpret_cast<uintptr_t>(a.W) & 15u) != 0 || (a.x && (reinterpret_cast<uintptr_t>(a.x) & 15u) != 0) ||
      (a.resid && (reinterpret_cast<uintptr_t>(a.resid) & 15u) != 0) ||
      (a.norm_w && (reinterpret_cast<uintptr_t>(a.norm_w) & 15u) != 0))
    return make_error(std::string(what) + ": W, x, the residual and the norm weights must be 16-byte aligned");
  const bool i8 = OP != Op::Add && dec_int8_acts(W.format);
  const size_t xs = OP == Op::Add ? 0
                    : i8 ? static_cast<size_t>(a.B) * (a.K / 32 + 1) * 32 + static_cast<size_t>(a.K / 32) * 64
                         : sizeof(uint16_t) * static_cast<size_t>(a.B) * a.K;
  if (xs > 160 * 1024) return make_error(std::string(what) + ": batch x K too large for the staged input");
  const bool mins = W.format == WFormat::Q4_1 || W.format == WFormat::Q4_K || W.format == WFormat::Q5_1 ||
                    W.format == WFormat::Q5_K;
  const size_t sx = mins && !i8 ? sizeof(float) * 8 * static_cast<size_t>(a.K / 32) : 0;
  if (xs + sx > 200 * 1024) return make_error(std::string(what) + ": K too large for the staged sums");
  const size_t smem = xs + sx + sizeof(float) * kWarps * 32 * 4;
  const int kCtasPerSm = tuning().ctas;
  // kCtasPerSm CTAs a SM, looping over tiles. S depends on the matrix and the GPU only, never on
  // the batch.
  // Each warp slot of the grid runs ceil(tiles S / slots) tiles, each ceil(chunks / S / kU) rounds
  // of loads: S minimises that (the larger S on a tie, shorter serial chains). The packed formats
  // break a tie on the waves first: a wave is a tile's reduction and epilogue more on the critical
  // path (H100, 2026-12-07, 8B QKV: S = 4, one wave of 4 rounds, against S = 8, two waves of 2:
  // the step 1.3% faster at Q4_0, 0.8% at Q4_K, 2.5% at Q8_0; bf16 the same within noise, so it
  // keeps the old rule). Where the tiles alone fill at least half the warp slots, they also count
  // each wave's cross-warp reduction (S > 1) as s_red rounds. H100, 2026-12-07, Q4_0: S = 1 for
  // 8B's gate/up (one wave of 16 rounds against S = 8's 7 waves of 2) took it from 34.2 to 30.6 us
  // under ncu, its CTA-barrier stall samples 588 -> 12; 1B's gate/up at S = 1 (8 rounds against
  // S = 2's 4, one wave each) lost 3.4%: a reduction costs 2-4 rounds. With this rule (8B: gate/up
  // and lm_head S = 1; 1B: lm_head) the step is 1.5% faster at 8B batch 1 and 2.5% at 8, the same
  // at 1B (23:27 UTC). Counted where tiles are few too, it gave 135M's QKV and o_proj (36-60 tiles)
  // one warp a tile, too few warps to stream: 6-11% slower, hence the condition.
  const int n_sm = device_sm_count(), sms = n_sm > 0 ? n_sm : 132;
  const int64_t slots = static_cast<int64_t>(kWarps) * kCtasPerSm * sms, chunks = a.K / 32;
  const int64_t red = quant && 2 * static_cast<int64_t>(a.tiles) >= slots ? tuning().s_red : 0;
  int S = 1;
  int64_t best = -1, best_waves = 0;
  for (int s2 = 1; s2 <= kWarps; s2 *= 2) {
    const int64_t waves = (a.tiles * static_cast<int64_t>(s2) + slots - 1) / slots;
    const int64_t cost = waves * (((chunks + s2 - 1) / s2 + kU - 1) / kU) + (s2 > 1 ? waves * red : 0);
    if (best < 0 || cost < best || (cost == best && (!quant || waves <= best_waves)))
      best = cost, best_waves = waves, S = s2;
  }
  // Tuning only: SS_CUDA_DEC_S=<qkv>,<add>,<gate/up>,<logits> forces S per op (0: the choice above);
  // tests: dec_set_s for every op.
  if (const int* f = tuning().force_s; f[static_cast<int>(OP)] > 0) S = f[static_cast<int>(OP)];
  if (const int f = g_s_set.load(); f > 0) S = f;
  // An add whose tiles, S = 8 warps each, fill under half the warp slots (Llama-3.2-1B's o_proj and
  // down: 128 tiles, 1024 of 2112 warps on an H100, ~50% of DRAM peak) splits K across KS CTAs,
  // while every warp keeps at least min_chunks_per_warp chunks (the backend takes 8: a round;
  // SS_CUDA_SPLITK_MIN). Shape only: a row's result is the same at every batch size.
  int KS = 1;
  if (OP == Op::Add && sk && sk->max_ks > 1 && sk->part && sk->tickets) {
    const int64_t need = a.tiles * static_cast<int64_t>(kWarps);
    int k2 = static_cast<int>(std::min<int64_t>(sk->max_ks, slots / need));
    while (k2 > 1 && chunks / k2 < static_cast<int64_t>(kWarps) * sk->min_chunks_per_warp) --k2;
    if (k2 > 1 && a.tiles <= sk->n_tickets && static_cast<int64_t>(a.tiles) * k2 * 128 <= sk->part_floats) {
      KS = k2, S = kWarps;
      a.part = sk->part, a.tickets = sk->tickets;
    }
  }
  a.KS = KS;
  a.S = S;
  a.empty = tuning().empty;
  a.full_rounds = tuning().full_rounds;
  a.hold = tuning().hold;
  a.stamps = take_chain_slot();
  // The pipelined loop (bf16) runs kU = 4 twice over in the registers of one kU = 8 round; S was
  // chosen for the rounds of kU above.
  const int64_t split_chunks = (chunks + KS - 1) / KS;
  const bool pipe = quant ? packed_pipe_wanted(W.format) && packed_pipe_fits(W.format, OP) && (split_chunks + S - 1) / S > kU
                          : (tuning().pipe == -1 ? (split_chunks + S - 1) / S > kU : tuning().pipe == 1);
  if (pipe && !quant) kU = 4;
  const int tpc = kWarps / S;
  const int grid =
      KS * static_cast<int>(std::min<int64_t>((a.tiles + tpc - 1) / tpc, static_cast<int64_t>(kCtasPerSm) * sms / KS));
  auto* k = pick_kernel<OP>(W.format, i8, pipe, kU);
  if (smem > 48 * 1024) SS_CUDA_TRY(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  SS_CUDA_TRY(cudaLaunchKernelEx(&cfg, k, a));
  SS_CUDA_LAUNCHED();
  return {};
}

}  // namespace

void set_chain_slot(unsigned long long* slot) { g_chain_slot = slot; }
namespace {
std::atomic<int> g_i8_set{-1};  // dec_set_int8_acts: -1 the default
}  // namespace
void dec_set_int8_acts(int on) { g_i8_set.store(on); }
void dec_set_s(int s) { g_s_set.store(s == 1 || s == 2 || s == 4 || s == 8 ? s : 0); }
bool dec_int8_acts(WFormat f) {
  const int o = g_i8_set.load();
  return f != WFormat::BF16 && (o >= 0 ? o == 1 : tuning().i8);
}
bool empty_kernels() { return tuning().empty; }

int device_sm_count() {
  static const int n = [] {
    int dev = 0, v = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
      v = 0;
    return v;
  }();
  return n;
}

Status dec_qkv(const DevWeights& W_qkv, const float* resid, const float* norm_w, float eps, int K, int batch,
               const RopeKv& rk, bool pdl, cudaStream_t s) {
  if (rk.hd <= 0 || rk.hd % 2 != 0 || rk.rope_dim <= 0 || rk.rope_dim > rk.hd || rk.rope_dim % 2 != 0 ||
      rk.n_heads <= 0 || rk.n_kv <= 0)
    return make_error("dec_qkv: bad head shape (hd=" + std::to_string(rk.hd) + ", rope_dim=" +
                      std::to_string(rk.rope_dim) + ")");
  if (rk.q_norm || rk.k_norm) return make_error("dec_qkv: per-head q/k norms are not fused (use rope_kv_store)");
  if (rk.hd % 16 != 0) return make_error("dec_qkv: head_dim must be a multiple of 16");
  DecArgs a{};
  a.K = K, a.tiles = (rk.n_heads + 2 * rk.n_kv) * rk.hd / 16, a.N = 0, a.B = batch;
  a.resid = resid, a.norm_w = norm_w, a.eps = eps, a.rk = rk;
  return dispatch<Op::Qkv>("dec_qkv", W_qkv, a, pdl, s);
}

Status dec_add(const DevWeights& W, const bf16_bits* x, float* resid, int N, int K, int batch, bool pdl,
               cudaStream_t s, const SplitK* sk) {
  if (N <= 0) return make_error("dec_add: N must be positive");
  DecArgs a{};
  a.K = K, a.N = N, a.tiles = (N + 15) / 16, a.B = batch, a.x = x, a.y = resid;
  return dispatch<Op::Add>("dec_add", W, a, pdl, s, sk);
}

int64_t splitk_part_floats(int N, int max_ks) { return static_cast<int64_t>((N + 15) / 16) * max_ks * 128; }

Status dec_gate_up(const DevWeights& W_gate_up, const float* resid, const float* norm_w, float eps, bf16_bits* act,
                   int F, int K, int batch, bool pdl, cudaStream_t s) {
  if (F <= 0) return make_error("dec_gate_up: F must be positive");
  DecArgs a{};
  a.K = K, a.N = F, a.tiles = (F + 7) / 8, a.B = batch, a.resid = resid, a.norm_w = norm_w;
  a.eps = eps, a.act = act;
  return dispatch<Op::GateUp>("dec_gate_up", W_gate_up, a, pdl, s);
}

Status dec_norm_gemv(const DevWeights& W, const float* resid, const int32_t* rows, const float* norm_w, float eps,
                     float* y, int N, int K, int batch, bool pdl, cudaStream_t s) {
  if (N <= 0) return make_error("dec_norm_gemv: N must be positive");
  DecArgs a{};
  a.K = K, a.N = N, a.tiles = (N + 15) / 16, a.B = batch, a.resid = resid, a.rows = rows;
  a.norm_w = norm_w, a.eps = eps, a.y = y;
  return dispatch<Op::Logits>("dec_norm_gemv", W, a, pdl, s);
}

namespace {
// One thread a (row, chunk, quarter): 8 of the chunk's 32 weights from the packed layout, as bf16,
// stored as one 16-byte vector; consecutive threads write consecutive 16 bytes (coalesced).
__global__ void dequant_k(WFormat f, PackedAt pk, int N, int K, uint16_t* out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int chunks = K / 32;
  if (i >= static_cast<int64_t>(N) * chunks * 4) return;
  const int t = static_cast<int>(i & 3);
  const int64_t rc = i >> 2, row = rc / chunks;
  const int c = static_cast<int>(rc % chunks), R = c / 8, u = c % 8;  // round R's chunk u
  const uint8_t* qr = part_at(pk.q, row, R);  // the row's quants, scales and mins of round R
  const uint8_t* h = part_at(pk.d, row, R);
  const uint8_t* mr = pk.m.base ? part_at(pk.m, row, R) : nullptr;
  auto f16_at = [](const uint8_t* p, int j) { return h2f(static_cast<uint16_t>(p[2 * j] | (p[2 * j + 1] << 8))); };
  const int8_t* p8 = reinterpret_cast<const int8_t*>(qr + (u / 2) * 64 + t * 16 + (u % 2) * 8);
  uint16_t o[8];
  if (f == WFormat::Q4_K || f == WFormat::Q5_K) {  // (d * sc) q - dmin * m, in that order (GGUF's value)
    int sc, mn;
    k4_scale_min(u, h + 4, &sc, &mn);
    const float d1 = __fmul_rn(f16_at(h, 0), static_cast<float>(sc));
    const float m1 = __fmul_rn(f16_at(h, 1), static_cast<float>(mn));
    if (f == WFormat::Q4_K) {
      const uint32_t w = *reinterpret_cast<const uint32_t*>(qr + (u / 4) * 64 + t * 16 + (u % 4) * 4);
      for (int e = 0; e < 8; ++e)
        o[e] = f2bf(__fsub_rn(__fmul_rn(d1, static_cast<float>((w >> ((e % 2) * 16 + 4 * (e / 2))) & 0xF)), m1));
    } else {
      for (int e = 0; e < 8; ++e) o[e] = f2bf(__fsub_rn(__fmul_rn(d1, static_cast<float>(p8[e])), m1));
    }
  } else if (f == WFormat::Q6_K) {  // (d * sc) (q - 32); lane t's 8 weights lie in sub-block 2 u + t / 2
    const float d1 = __fmul_rn(f16_at(h, 8), static_cast<float>(static_cast<int8_t>(h[2 * u + t / 2])));
    for (int e = 0; e < 8; ++e) o[e] = f2bf(__fmul_rn(d1, static_cast<float>(p8[e])));
  } else if (f == WFormat::Q8_0 || f == WFormat::Q5_0 || f == WFormat::Q5_1) {
    const float dc = f16_at(h, u);
    const float mc = f == WFormat::Q5_1 ? f16_at(mr, u) : 0.0f;
    for (int e = 0; e < 8; ++e) {
      const float v = __fmul_rn(dc, static_cast<float>(p8[e]));
      o[e] = f2bf(f == WFormat::Q5_1 ? __fadd_rn(v, mc) : v);
    }
  } else {
    const float dc = f16_at(h, u);
    const float mc = f == WFormat::Q4_1 ? f16_at(mr, u) : 0.0f;
    const uint32_t w = *reinterpret_cast<const uint32_t*>(qr + (u / 4) * 64 + t * 16 + (u % 4) * 4);
    for (int e = 0; e < 8; ++e) {
      const float v = static_cast<float>((w >> ((e % 2) * 16 + 4 * (e / 2))) & 0xF);
      o[e] = f2bf(f == WFormat::Q4_0 ? dc * (v - 8.0f) : fmaf(dc, v, mc));
    }
  }
  uint4 v;
  v.x = o[0] | (static_cast<uint32_t>(o[1]) << 16), v.y = o[2] | (static_cast<uint32_t>(o[3]) << 16);
  v.z = o[4] | (static_cast<uint32_t>(o[5]) << 16), v.w = o[6] | (static_cast<uint32_t>(o[7]) << 16);
  *reinterpret_cast<uint4*>(out + row * K + 32 * c + 8 * t) = v;
}
}  // namespace

Status dequantize_weights(const DevWeights& W, int N, int K, bf16_bits* out, cudaStream_t s) {
  if (W.format == WFormat::BF16) return make_error("dequantize_weights: the weights are bf16 already");
  if (N <= 0 || K <= 0 || K % 32 != 0 || !W.q || (!W.groups && (!W.d || (has_min_array(W.format) && !W.m))) ||
      (is_k_format(W.format) && K % 256 != 0))
    return make_error("dequantize_weights: bad shape or missing arrays");
  if ((reinterpret_cast<uintptr_t>(out) & 15u) != 0) return make_error("dequantize_weights: out must be 16-byte aligned");
  const int64_t n = static_cast<int64_t>(N) * (K / 32) * 4;
  dequant_k<<<static_cast<unsigned>((n + 255) / 256), 256, 0, s>>>(W.format, packed_at(W, K), N, K, out);
  SS_CUDA_LAUNCHED();
  return {};
}

}  // namespace ss::cuda::kern
