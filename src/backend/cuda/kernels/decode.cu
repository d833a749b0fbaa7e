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
// The arithmetic per output is the same at every batch size: a row's dot product runs over the
// same lanes in the same order whatever B is (S, the warps splitting K, depends on K only), the
// norm's reduction tree is fixed, so a sequence's logits do not depend on what shares its step.
#include <algorithm>
#include <string>

#include "backend/cuda/kernels/common.cuh"

namespace ss::cuda::kern {
namespace {

using namespace dev;

constexpr int kThreads = 128;  // 4 warps a CTA
constexpr int kWarpsPerCta = kThreads / 32;
constexpr int kU = 4;          // 16-byte weight loads in flight per row per lane
constexpr int kR = 2;          // rows per group (a RoPE pair; gate and up row; two plain rows)
constexpr int kCtasPerSm = 4;  // grid cap: CTAs loop over groups beyond it

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

enum class Op { Qkv, Add, GateUp, Logits };

struct DecArgs {
  const uint16_t* W;
  int K;
  int groups;
  int N;                 // Add / Logits: rows of W; GateUp: F (W has 2F rows)
  const uint16_t* x;     // Add: the input [B][K] bf16
  const float* resid;    // the norm ops: the fp32 residual, rows of K
  const int32_t* rows;   // Logits: the residual row of each batch row (null: row b)
  const float* norm_w;
  float eps;
  float* y;              // Add: the residual [B][N] (+=); Logits: [B][N]
  uint16_t* act;         // GateUp: [B][F]
  RopeKv rk;             // Qkv
};

// The two rows of group g (clamped into the matrix; `second` false when the group has one row).
template <Op OP>
__device__ __forceinline__ void group_rows(const DecArgs& a, int g, int64_t (&row)[kR], int& pair_p, bool& rotate) {
  if constexpr (OP == Op::Qkv) {
    const RopeKv& k = a.rk;
    const int pph = k.hd / 2;
    const int hh = g / pph, p = g % pph;
    const bool is_v = hh >= k.n_heads + k.n_kv;
    const int half = k.rope_dim / 2;
    rotate = !is_v && p < half;
    int i0, i1;
    if (rotate) {
      i0 = k.interleaved ? 2 * p : p;
      i1 = k.interleaved ? 2 * p + 1 : p + half;
    } else if (!is_v) {
      i0 = k.rope_dim + 2 * (p - half), i1 = i0 + 1;
    } else {
      i0 = 2 * p, i1 = 2 * p + 1;
    }
    row[0] = static_cast<int64_t>(hh) * k.hd + i0;
    row[1] = static_cast<int64_t>(hh) * k.hd + i1;
    pair_p = p;
  } else if constexpr (OP == Op::GateUp) {
    row[0] = g;
    row[1] = static_cast<int64_t>(a.N) + g;
  } else {
    row[0] = 2 * static_cast<int64_t>(g);
    row[1] = min(2 * static_cast<int64_t>(g) + 1, static_cast<int64_t>(a.N) - 1);
  }
}

template <Op OP, int B>
__device__ __forceinline__ void epilogue(const DecArgs& a, int g, const float (&v)[B][kR]) {
  int64_t row[kR];
  int p = 0;
  bool rotate = false;
  group_rows<OP>(a, g, row, p, rotate);
  if constexpr (OP == Op::Qkv) {
    const RopeKv& k = a.rk;
    const int hh = static_cast<int>(row[0] / k.hd);
    const int i0 = static_cast<int>(row[0] % k.hd), i1 = static_cast<int>(row[1] % k.hd);
    const bool is_v = hh >= k.n_heads + k.n_kv;
    const int half = k.rope_dim / 2;
#pragma unroll
    for (int b = 0; b < B; ++b) {
      float v0 = v[b][0], v1 = v[b][1];
      if (k.bias) v0 += k.bias[row[0]], v1 += k.bias[row[1]];
      const int pos = k.positions[b];
      if (rotate) {
        const float* cs = k.rope_cs + static_cast<int64_t>(pos) * k.rope_dim;
        const float c = cs[p], sn = cs[half + p];
        const float r0 = v0 * c - v1 * sn, r1 = v1 * c + v0 * sn;
        v0 = r0, v1 = r1;
      }
      if (hh < k.n_heads) {
        float* q = k.q_out + (static_cast<int64_t>(b) * k.n_heads + hh) * k.hd;
        q[i0] = v0, q[i1] = v1;
      } else {
        const int kvh = is_v ? hh - k.n_heads - k.n_kv : hh - k.n_heads;
        const int blk = k.tables[static_cast<int64_t>(k.seq_of_token[b]) * k.max_blocks + pos / kBlockTokens];
        uint16_t* dst = k.cache + ((static_cast<int64_t>(blk) * 2 + (is_v ? 1 : 0)) * k.n_kv + kvh) * kBlockTokens * k.hd +
                        static_cast<int64_t>(pos % kBlockTokens) * k.hd;
        dst[i0] = f2bf(v0), dst[i1] = f2bf(v1);
      }
    }
  } else if constexpr (OP == Op::GateUp) {
#pragma unroll
    for (int b = 0; b < B; ++b) {
      const float gt = v[b][0], up = v[b][1];
      a.act[static_cast<int64_t>(b) * a.N + g] = f2bf(gt / (1.0f + __expf(-gt)) * up);
    }
  } else {
    const bool second = 2 * static_cast<int64_t>(g) + 1 < a.N;
#pragma unroll
    for (int b = 0; b < B; ++b)
#pragma unroll
      for (int r = 0; r < kR; ++r) {
        if (r == 1 && !second) continue;
        float* o = a.y + static_cast<int64_t>(b) * a.N + row[r];
        if constexpr (OP == Op::Add) *o += v[b][r];
        else *o = v[b][r];
      }
  }
}

__device__ __forceinline__ void fma8(float& acc, const uint4& w, const uint4& x) {
  acc = fmaf(lo_bf(w.x), lo_bf(x.x), acc);
  acc = fmaf(hi_bf(w.x), hi_bf(x.x), acc);
  acc = fmaf(lo_bf(w.y), lo_bf(x.y), acc);
  acc = fmaf(hi_bf(w.y), hi_bf(x.y), acc);
  acc = fmaf(lo_bf(w.z), lo_bf(x.z), acc);
  acc = fmaf(hi_bf(w.z), hi_bf(x.z), acc);
  acc = fmaf(lo_bf(w.w), lo_bf(x.w), acc);
  acc = fmaf(hi_bf(w.w), hi_bf(x.w), acc);
}

// S warps split K for a group of kR rows; 4 / S groups a CTA per iteration; CTAs loop over groups.
template <Op OP, int B, int S>
__global__ void __launch_bounds__(kThreads) dec_k(DecArgs a) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __shared__ float red[kWarpsPerCta][B][kR];
  __shared__ float part[32];
  constexpr int GPC = kWarpsPerCta / S;
  constexpr int KS = 32 * S;  // stride between a lane's vectors
  constexpr bool kNorm = OP != Op::Add;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int sub = warp % S, gw = warp / S;
  const int K = a.K, K8 = K / 8;
  const int kl = sub * 32 + lane;

  // Before the wait: the first group's first kU vectors per row (weights only).
  int g0 = blockIdx.x * GPC;
  uint4 w[kU][kR];
  const uint4* wr[kR];
  {
    int64_t row[kR];
    int p;
    bool rot;
    group_rows<OP>(a, min(g0 + gw, a.groups - 1), row, p, rot);
#pragma unroll
    for (int r = 0; r < kR; ++r) wr[r] = reinterpret_cast<const uint4*>(a.W + row[r] * K);
#pragma unroll
    for (int u = 0; u < kU; ++u)
#pragma unroll
      for (int r = 0; r < kR; ++r) w[u][r] = kl + u * KS < K8 ? ld_stream(wr[r] + kl + u * KS) : make_uint4(0, 0, 0, 0);
  }
  pdl_wait();
  pdl_trigger();

  // The input: the normalised residual staged in shared memory, or the previous kernel's bf16 output.
  const uint16_t* x;
  if constexpr (kNorm) {
    uint16_t* xs = reinterpret_cast<uint16_t*>(smem_raw);
    for (int b = 0; b < B; ++b) {
      const float* r = a.resid + static_cast<int64_t>(a.rows ? a.rows[b] : b) * K;
      float ss = 0.0f;
      for (int i = threadIdx.x * 4; i < K; i += kThreads * 4) {
        const float4 v = *reinterpret_cast<const float4*>(r + i);
        ss = fmaf(v.x, v.x, ss), ss = fmaf(v.y, v.y, ss), ss = fmaf(v.z, v.z, ss), ss = fmaf(v.w, v.w, ss);
      }
      const float inv = rsqrtf(block_sum(ss, part) / static_cast<float>(K) + a.eps);
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
  const uint4* xv = reinterpret_cast<const uint4*>(x);

  bool first = true;
  for (; g0 < a.groups; g0 += gridDim.x * GPC, first = false) {
    const int g = g0 + gw;
    const bool valid = g < a.groups;
    float acc[B][kR];
#pragma unroll
    for (int b = 0; b < B; ++b)
#pragma unroll
      for (int r = 0; r < kR; ++r) acc[b][r] = 0.0f;
    if (valid) {
      if (!first) {
        int64_t row[kR];
        int p;
        bool rot;
        group_rows<OP>(a, g, row, p, rot);
#pragma unroll
        for (int r = 0; r < kR; ++r) wr[r] = reinterpret_cast<const uint4*>(a.W + row[r] * K);
#pragma unroll
        for (int u = 0; u < kU; ++u)
#pragma unroll
          for (int r = 0; r < kR; ++r)
            w[u][r] = kl + u * KS < K8 ? ld_stream(wr[r] + kl + u * KS) : make_uint4(0, 0, 0, 0);
      }
      for (int v0 = kl;; v0 += kU * KS) {
#pragma unroll
        for (int u = 0; u < kU; ++u) {
          if (v0 + u * KS >= K8) break;
#pragma unroll
          for (int b = 0; b < B; ++b) {
            const uint4 xb = xv[static_cast<int64_t>(b) * K8 + v0 + u * KS];
#pragma unroll
            for (int r = 0; r < kR; ++r) fma8(acc[b][r], w[u][r], xb);
          }
        }
        const int next = v0 + kU * KS;
        if (next >= K8) break;
#pragma unroll
        for (int u = 0; u < kU; ++u)
#pragma unroll
          for (int r = 0; r < kR; ++r)
            w[u][r] = next + u * KS < K8 ? ld_stream(wr[r] + next + u * KS) : make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int b = 0; b < B; ++b)
#pragma unroll
      for (int r = 0; r < kR; ++r) acc[b][r] = warp_sum(acc[b][r]);
    if constexpr (S == 1) {
      if (valid && lane == 0) epilogue<OP, B>(a, g, acc);
    } else {
      if (lane == 0)
#pragma unroll
        for (int b = 0; b < B; ++b)
#pragma unroll
          for (int r = 0; r < kR; ++r) red[warp][b][r] = acc[b][r];
      __syncthreads();
      if (valid && sub == 0 && lane == 0) {
        float v[B][kR];
#pragma unroll
        for (int b = 0; b < B; ++b)
#pragma unroll
          for (int r = 0; r < kR; ++r) {
            float t = 0.0f;
#pragma unroll
            for (int s2 = 0; s2 < S; ++s2) t += red[gw * S + s2][b][r];
            v[b][r] = t;
          }
        epilogue<OP, B>(a, g, v);
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

template <Op OP, int B, int S>
cudaError_t launch(const DecArgs& a, bool pdl, cudaStream_t s) {
  constexpr int GPC = kWarpsPerCta / S;
  const size_t smem = OP == Op::Add ? 0 : sizeof(uint16_t) * static_cast<size_t>(B) * a.K;
  auto* k = dec_k<OP, B, S>;
  if (smem > 48 * 1024) {
    const cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (e != cudaSuccess) return e;
  }
  const int64_t want = (static_cast<int64_t>(a.groups) + GPC - 1) / GPC;
  const int grid = static_cast<int>(std::min<int64_t>(want, static_cast<int64_t>(kCtasPerSm) * sm_count()));
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
  return cudaLaunchKernelEx(&cfg, k, a);
}

// S: 4 warps split K when rows are long enough that one warp's share would leave loads idle.
template <Op OP, int B>
cudaError_t launch_s(const DecArgs& a, bool pdl, cudaStream_t s) {
  return a.K >= 2048 ? launch<OP, B, 4>(a, pdl, s) : launch<OP, B, 1>(a, pdl, s);
}

template <Op OP>
Status dispatch(const char* what, const DecArgs& a, int batch, bool pdl, cudaStream_t s) {
  if (a.K <= 0 || a.K % 8 != 0 || batch < 1 || batch > 8 || a.groups <= 0)
    return make_error(std::string(what) + ": needs K a positive multiple of 8, batch 1..8 and rows (K=" +
                      std::to_string(a.K) + ", batch=" + std::to_string(batch) + ")");
  if ((reinterpret_cast<uintptr_t>(a.W) & 15u) != 0 || (a.x && (reinterpret_cast<uintptr_t>(a.x) & 15u) != 0) ||
      (a.resid && (reinterpret_cast<uintptr_t>(a.resid) & 15u) != 0) ||
      (a.norm_w && (reinterpret_cast<uintptr_t>(a.norm_w) & 15u) != 0))
    return make_error(std::string(what) + ": W, x, the residual and the norm weights must be 16-byte aligned");
  if (OP != Op::Add && static_cast<size_t>(batch) * a.K * 2 > 200 * 1024)
    return make_error(std::string(what) + ": batch x K too large for the staged input");
  cudaError_t e = cudaSuccess;
  switch (batch) {
    case 1: e = launch_s<OP, 1>(a, pdl, s); break;
    case 2: e = launch_s<OP, 2>(a, pdl, s); break;
    case 3: e = launch_s<OP, 3>(a, pdl, s); break;
    case 4: e = launch_s<OP, 4>(a, pdl, s); break;
    case 5: e = launch_s<OP, 5>(a, pdl, s); break;
    case 6: e = launch_s<OP, 6>(a, pdl, s); break;
    case 7: e = launch_s<OP, 7>(a, pdl, s); break;
    default: e = launch_s<OP, 8>(a, pdl, s); break;
  }
  SS_CUDA_TRY(e);
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
  DecArgs a{};
  a.W = W_qkv, a.K = K, a.groups = (rk.n_heads + 2 * rk.n_kv) * rk.hd / 2, a.N = 0;
  a.resid = resid, a.norm_w = norm_w, a.eps = eps, a.rk = rk;
  return dispatch<Op::Qkv>("dec_qkv", a, batch, pdl, s);
}

Status dec_add(const bf16_bits* W, const bf16_bits* x, float* resid, int N, int K, int batch, bool pdl,
               cudaStream_t s) {
  if (N <= 0) return make_error("dec_add: N must be positive");
  DecArgs a{};
  a.W = W, a.K = K, a.N = N, a.groups = (N + 1) / 2, a.x = x, a.y = resid;
  return dispatch<Op::Add>("dec_add", a, batch, pdl, s);
}

Status dec_gate_up(const bf16_bits* W_gate_up, const float* resid, const float* norm_w, float eps, bf16_bits* act,
                   int F, int K, int batch, bool pdl, cudaStream_t s) {
  if (F <= 0) return make_error("dec_gate_up: F must be positive");
  DecArgs a{};
  a.W = W_gate_up, a.K = K, a.N = F, a.groups = F, a.resid = resid, a.norm_w = norm_w, a.eps = eps, a.act = act;
  return dispatch<Op::GateUp>("dec_gate_up", a, batch, pdl, s);
}

Status dec_norm_gemv(const bf16_bits* W, const float* resid, const int32_t* rows, const float* norm_w, float eps,
                     float* y, int N, int K, int batch, bool pdl, cudaStream_t s) {
  if (N <= 0) return make_error("dec_norm_gemv: N must be positive");
  DecArgs a{};
  a.W = W, a.K = K, a.N = N, a.groups = (N + 1) / 2, a.resid = resid, a.rows = rows, a.norm_w = norm_w, a.eps = eps;
  a.y = y;
  return dispatch<Op::Logits>("dec_norm_gemv", a, batch, pdl, s);
}

}  // namespace ss::cuda::kern
