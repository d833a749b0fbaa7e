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
#include <cstdio>
#include <cstdlib>
#include <string>

#include "backend/cuda/kernels/common.cuh"

namespace ss::cuda::kern {
namespace {

using namespace dev;

constexpr int kWarps = 8;       // a CTA
constexpr int kThreads = kWarps * 32;
// Chunks (32 K wide) in flight per warp: kU x 2 x 16-byte loads a lane. kU 4 fits 80 registers a
// thread (three CTAs a SM: two of this kernel, one of the next, under PDL); kU 8 needs 128 (two).
// Default kU 8, two CTAs a SM; SS_CUDA_DEC=<kU>,<ctas> overrides both for tuning.


// d += A (16 x 16, bf16, row) * B (16 x 8, bf16, col), fp32 accumulate.
__device__ __forceinline__ void mma_bf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

enum class Op { Qkv, Add, GateUp, Logits };

struct DecArgs {
  const uint16_t* W;
  int K;
  int tiles;             // 16-row tiles
  int N;                 // Add / Logits: rows of W; GateUp: F (W has 2F rows)
  int B;                 // batch rows (<= 8: the mma's N dimension)
  int S;                 // warps splitting K for one tile (1, 2, 4, 8)
  const uint16_t* x;     // Add: the input [B][K] bf16
  const float* resid;    // the norm ops: the fp32 residual, rows of K
  const int32_t* rows;   // Logits: the residual row of each batch row (null: row b)
  const float* norm_w;
  float eps;
  float* y;              // Add: the residual [B][N] (+=); Logits: [B][N]
  uint16_t* act;         // GateUp: [B][F]
  RopeKv rk;             // Qkv
};

// Row `lr` (0..15) of tile `tile`, or -1. Rows lr and lr + 8 land in the same thread's accumulators,
// so the tiles pair what an epilogue needs together: a RoPE pair (i0, i1) of one head, gate row i
// and up row i; plain rows otherwise.
template <Op OP>
__device__ __forceinline__ int64_t tile_row(const DecArgs& a, int tile, int lr) {
  if constexpr (OP == Op::Qkv) {
    const QkvPair pp = qkv_pair(a.rk, tile * 8 + (lr & 7));
    return static_cast<int64_t>(pp.hh) * a.rk.hd + (lr < 8 ? pp.i0 : pp.i1);
  } else if constexpr (OP == Op::GateUp) {
    const int i = tile * 8 + (lr & 7);
    if (i >= a.N) return -1;
    return lr < 8 ? i : static_cast<int64_t>(a.N) + i;
  } else {
    const int64_t r = static_cast<int64_t>(tile) * 16 + lr;
    return r < a.N ? r : -1;
  }
}

// Thread (g = lane / 4, t = lane % 4) holds rows g and g + 8 of the tile for batch rows 2t, 2t + 1:
// c[0] (g, 2t), c[1] (g, 2t+1), c[2] (g+8, 2t), c[3] (g+8, 2t+1).
template <Op OP>
__device__ __forceinline__ void epilogue(const DecArgs& a, int tile, int g, int t, const float (&c)[4]) {
  if constexpr (OP == Op::Qkv) {
    const QkvPair pp = qkv_pair(a.rk, tile * 8 + g);
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int b = 2 * t + j;
      if (b >= a.B) break;
      qkv_pair_out(a.rk, b, pp.hh, pp.p, pp.i0, pp.i1, pp.rotate, c[j], c[2 + j]);
    }
  } else if constexpr (OP == Op::GateUp) {
    const int i = tile * 8 + g;
    if (i >= a.N) return;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int b = 2 * t + j;
      if (b >= a.B) break;
      const float gt = c[j], up = c[2 + j];
      a.act[static_cast<int64_t>(b) * a.N + i] = f2bf(gt / (1.0f + __expf(-gt)) * up);
    }
  } else {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row = static_cast<int64_t>(tile) * 16 + g + 8 * h;
      if (row >= a.N) continue;
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int b = 2 * t + j;
        if (b >= a.B) break;
        float* o = a.y + static_cast<int64_t>(b) * a.N + row;
        if constexpr (OP == Op::Add) *o += c[2 * h + j];
        else *o = c[2 * h + j];
      }
    }
  }
}

// W (16 rows a tile) times x (B <= 8 columns) on the tensor cores: one m16n8k16 per 16 K, the
// A fragment loaded straight from global memory. A lane loads 16 bytes (8 consecutive K) of rows
// g and g + 8 and feeds them to two mmas as K slots (2t, 2t+1, 2t+8, 2t+9); its B fragment is
// the same 8 K of batch row g, so the permutation cancels in the dot product. S warps split a
// tile's K (fixed order reduction through shared memory); CTAs loop over tiles, and the next
// tile's first chunks are in flight while the current one reduces.
template <Op OP, int kU>
__global__ void __launch_bounds__(kThreads, kU == 4 ? 3 : 2) dec_k(DecArgs a) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  constexpr bool kNorm = OP != Op::Add;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int S = a.S, TPC = kWarps / S;
  const int sub = warp % S, tw = warp / S;
  const int K = a.K, chunks = K / 32;
  const int cpw = (chunks + S - 1) / S;
  const int c_begin = min(chunks, sub * cpw), c_end = min(chunks, c_begin + cpw);
  const size_t xs_bytes = kNorm ? sizeof(uint16_t) * static_cast<size_t>(a.B) * K : 0;
  float* red = reinterpret_cast<float*>(smem_raw + xs_bytes);  // [kWarps][32][4]

  const uint4 *pa = nullptr, *pb = nullptr;
  uint4 wa[kU], wb[kU];
  auto set_rows = [&](int tile) {
    int64_t r0 = tile_row<OP>(a, tile, g), r1 = tile_row<OP>(a, tile, g + 8);
    r0 = r0 < 0 ? 0 : r0, r1 = r1 < 0 ? 0 : r1;  // a row past the matrix: loads row 0, result dropped
    pa = reinterpret_cast<const uint4*>(a.W + r0 * K) + t;
    pb = reinterpret_cast<const uint4*>(a.W + r1 * K) + t;
  };
  auto load = [&](int c0) {
#pragma unroll
    for (int u = 0; u < kU; ++u)
      if (c0 + u < c_end) wa[u] = ld_stream(pa + 4 * (c0 + u)), wb[u] = ld_stream(pb + 4 * (c0 + u));
  };

  int tb = blockIdx.x * TPC;
  const int tstride = gridDim.x * TPC;
  if (tb + tw < a.tiles) {  // before the wait: weights only
    set_rows(tb + tw);
    load(c_begin);
  }
  pdl_wait();
  pdl_trigger();

  const uint16_t* x;
  if constexpr (kNorm) {
    uint16_t* xs = reinterpret_cast<uint16_t*>(smem_raw);
    __shared__ float ssq[kWarps][8];
    // The sums of squares of every batch row, then one barrier for all of them.
    for (int b = 0; b < a.B; ++b) {
      const float* r = a.resid + static_cast<int64_t>(a.rows ? a.rows[b] : b) * K;
      float ss = 0.0f;
      for (int i = threadIdx.x * 4; i < K; i += kThreads * 4) {
        const float4 v = *reinterpret_cast<const float4*>(r + i);
        ss = fmaf(v.x, v.x, ss), ss = fmaf(v.y, v.y, ss), ss = fmaf(v.z, v.z, ss), ss = fmaf(v.w, v.w, ss);
      }
      ss = warp_sum(ss);
      if (lane == 0) ssq[warp][b] = ss;
    }
    __syncthreads();
    for (int b = 0; b < a.B; ++b) {
      float tot = 0.0f;
#pragma unroll
      for (int w2 = 0; w2 < kWarps; ++w2) tot += ssq[w2][b];
      const float inv = rsqrtf(tot / static_cast<float>(K) + a.eps);
      const float* r = a.resid + static_cast<int64_t>(a.rows ? a.rows[b] : b) * K;
      for (int i = threadIdx.x * 4; i < K; i += kThreads * 4) {
        const float4 v = *reinterpret_cast<const float4*>(r + i);
        const float4 nw = *reinterpret_cast<const float4*>(a.norm_w + i);
        uint2 o;
        o.x = static_cast<uint32_t>(f2bf(v.x * inv * nw.x)) | (static_cast<uint32_t>(f2bf(v.y * inv * nw.y)) << 16);
        o.y = static_cast<uint32_t>(f2bf(v.z * inv * nw.z)) | (static_cast<uint32_t>(f2bf(v.w * inv * nw.w)) << 16);
        *reinterpret_cast<uint2*>(xs + static_cast<int64_t>(b) * K + i) = o;
      }
    }
    __syncthreads();
    x = xs;
  } else {
    x = a.x;
  }
  const uint4* xp = g < a.B ? reinterpret_cast<const uint4*>(x + static_cast<int64_t>(g) * K) + t : nullptr;

  for (; tb < a.tiles; tb += tstride) {
    const int tile = tb + tw;
    const bool valid = tile < a.tiles;
    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (valid) {
      for (int c0 = c_begin; c0 < c_end; c0 += kU) {
        if (c0 != c_begin) load(c0);
#pragma unroll
        for (int u = 0; u < kU; ++u) {
          if (c0 + u >= c_end) break;
          const uint4 xv = xp ? xp[4 * (c0 + u)] : make_uint4(0, 0, 0, 0);
          mma_bf16(c, wa[u].x, wb[u].x, wa[u].y, wb[u].y, xv.x, xv.y);
          mma_bf16(c, wa[u].z, wb[u].z, wa[u].w, wb[u].w, xv.z, xv.w);
        }
      }
    }
    if (tile + tstride < a.tiles) {  // the next tile's first chunks, in flight during the reduction
      set_rows(tile + tstride);
      load(c_begin);
    }
    if (S == 1) {
      if (valid) epilogue<OP>(a, tile, g, t, c);
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) red[(warp * 32 + lane) * 4 + i] = c[i];
      __syncthreads();
      if (valid && sub == 0) {
        float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int s2 = 0; s2 < S; ++s2)
#pragma unroll
          for (int i = 0; i < 4; ++i) v[i] += red[((tw * S + s2) * 32 + lane) * 4 + i];
        epilogue<OP>(a, tile, g, t, v);
      }
      __syncthreads();
    }
  }
}

int sm_count() {
  static int n = [] {
    int dev = 0, v = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
      v = 132;
    return v > 0 ? v : 132;
  }();
  return n;
}

struct Tuning {
  int u = 8, ctas = 2;  // measured best at 8B and within noise of the best at 135M (H200)
};
const Tuning& tuning() {
  static Tuning t = [] {
    Tuning r;
    if (const char* e = std::getenv("SS_CUDA_DEC")) {
      int u = 0, c = 0;
      if (std::sscanf(e, "%d,%d", &u, &c) == 2 && (u == 4 || u == 8) && c >= 1 && c <= 8) r.u = u, r.ctas = c;
    }
    return r;
  }();
  return t;
}

template <Op OP>
Status dispatch(const char* what, DecArgs a, bool pdl, cudaStream_t s) {
  const int kU = tuning().u, kCtasPerSm = tuning().ctas;
  if (a.K <= 0 || a.K % 32 != 0 || a.B < 1 || a.B > 8 || a.tiles <= 0)
    return make_error(std::string(what) + ": needs K a positive multiple of 32, batch 1..8 and rows (K=" +
                      std::to_string(a.K) + ", batch=" + std::to_string(a.B) + ")");
  if ((reinterpret_cast<uintptr_t>(a.W) & 15u) != 0 || (a.x && (reinterpret_cast<uintptr_t>(a.x) & 15u) != 0) ||
      (a.resid && (reinterpret_cast<uintptr_t>(a.resid) & 15u) != 0) ||
      (a.norm_w && (reinterpret_cast<uintptr_t>(a.norm_w) & 15u) != 0))
    return make_error(std::string(what) + ": W, x, the residual and the norm weights must be 16-byte aligned");
  const size_t xs = OP == Op::Add ? 0 : sizeof(uint16_t) * static_cast<size_t>(a.B) * a.K;
  if (xs > 160 * 1024) return make_error(std::string(what) + ": batch x K too large for the staged input");
  const size_t smem = xs + sizeof(float) * kWarps * 32 * 4;
  // kCtasPerSm CTAs a SM, looping over tiles. S depends on the matrix and the GPU only, never on
  // the batch.
  // Each warp slot of the grid runs ceil(tiles S / slots) tiles, each ceil(chunks / S / kU) rounds
  // of loads: S minimises that (the larger S on a tie, shorter serial chains).
  const int sms = sm_count();
  const int64_t slots = static_cast<int64_t>(kWarps) * kCtasPerSm * sms, chunks = a.K / 32;
  int S = 1;
  int64_t best = -1;
  for (int s2 = 1; s2 <= kWarps; s2 *= 2) {
    const int64_t waves = (a.tiles * static_cast<int64_t>(s2) + slots - 1) / slots;
    const int64_t rounds = waves * (((chunks + s2 - 1) / s2 + kU - 1) / kU);
    if (best < 0 || rounds <= best) best = rounds, S = s2;
  }
  a.S = S;
  const int tpc = kWarps / S;
  const int grid = static_cast<int>(std::min<int64_t>((a.tiles + tpc - 1) / tpc, static_cast<int64_t>(kCtasPerSm) * sms));
  auto* k = kU == 4 ? dec_k<OP, 4> : dec_k<OP, 8>;
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

Status dec_qkv(const bf16_bits* W_qkv, const float* resid, const float* norm_w, float eps, int K, int batch,
               const RopeKv& rk, bool pdl, cudaStream_t s) {
  if (rk.hd <= 0 || rk.hd % 2 != 0 || rk.rope_dim <= 0 || rk.rope_dim > rk.hd || rk.rope_dim % 2 != 0 ||
      rk.n_heads <= 0 || rk.n_kv <= 0)
    return make_error("dec_qkv: bad head shape (hd=" + std::to_string(rk.hd) + ", rope_dim=" +
                      std::to_string(rk.rope_dim) + ")");
  if (rk.q_norm || rk.k_norm) return make_error("dec_qkv: per-head q/k norms are not fused (use rope_kv_store)");
  if (rk.hd % 16 != 0) return make_error("dec_qkv: head_dim must be a multiple of 16");
  DecArgs a{};
  a.W = W_qkv, a.K = K, a.tiles = (rk.n_heads + 2 * rk.n_kv) * rk.hd / 16, a.N = 0, a.B = batch;
  a.resid = resid, a.norm_w = norm_w, a.eps = eps, a.rk = rk;
  return dispatch<Op::Qkv>("dec_qkv", a, pdl, s);
}

Status dec_add(const bf16_bits* W, const bf16_bits* x, float* resid, int N, int K, int batch, bool pdl,
               cudaStream_t s) {
  if (N <= 0) return make_error("dec_add: N must be positive");
  DecArgs a{};
  a.W = W, a.K = K, a.N = N, a.tiles = (N + 15) / 16, a.B = batch, a.x = x, a.y = resid;
  return dispatch<Op::Add>("dec_add", a, pdl, s);
}

Status dec_gate_up(const bf16_bits* W_gate_up, const float* resid, const float* norm_w, float eps, bf16_bits* act,
                   int F, int K, int batch, bool pdl, cudaStream_t s) {
  if (F <= 0) return make_error("dec_gate_up: F must be positive");
  DecArgs a{};
  a.W = W_gate_up, a.K = K, a.N = F, a.tiles = (F + 7) / 8, a.B = batch, a.resid = resid, a.norm_w = norm_w;
  a.eps = eps, a.act = act;
  return dispatch<Op::GateUp>("dec_gate_up", a, pdl, s);
}

Status dec_norm_gemv(const bf16_bits* W, const float* resid, const int32_t* rows, const float* norm_w, float eps,
                     float* y, int N, int K, int batch, bool pdl, cudaStream_t s) {
  if (N <= 0) return make_error("dec_norm_gemv: N must be positive");
  DecArgs a{};
  a.W = W, a.K = K, a.N = N, a.tiles = (N + 15) / 16, a.B = batch, a.resid = resid, a.rows = rows;
  a.norm_w = norm_w, a.eps = eps, a.y = y;
  return dispatch<Op::Logits>("dec_norm_gemv", a, pdl, s);
}

}  // namespace ss::cuda::kern
