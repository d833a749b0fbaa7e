// Decode-shaped projections, y = W x at batch 1..8: memory bound on W, so every byte of W is read
// once, 16 bytes per lane per load, several loads in flight per warp (Little's law: ~32 KiB in flight
// per SM at 4.3 TB/s), and each W vector is used for every batch row before it is dropped. A warp owns
// R rows (the x vectors it loads, through L1, serve R rows); lanes stride along K; one warp reduction
// per output at the end. No shared memory, no block barrier.
#include <string>

#include "backend/cuda/kernels/common.cuh"

namespace ss::cuda::kern {
namespace {

using namespace dev;

constexpr int kWarps = 4;   // per CTA
constexpr int kUnroll = 4;  // 16-byte W loads in flight per row per lane

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

// acc[b][r] += W[row r] . x[b] over this lane's share of K (16-byte vectors lane, lane + 32, ...);
// kUnroll loads per row in flight before any arithmetic. Lanes end with partial sums.
template <int B, int R>
__device__ __forceinline__ void dot_rows(const uint4* const (&wr)[R], const uint16_t* __restrict__ x, int K,
                                         float (&acc)[B][R]) {
  const int lane = threadIdx.x & 31;
  const int K8 = K / 8;
  const uint4* xv = reinterpret_cast<const uint4*>(x);
#pragma unroll
  for (int b = 0; b < B; ++b)
#pragma unroll
    for (int r = 0; r < R; ++r) acc[b][r] = 0.0f;
  int k = lane;
  for (; k + 32 * (kUnroll - 1) < K8; k += 32 * kUnroll) {
    uint4 w[kUnroll][R];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int r = 0; r < R; ++r) w[u][r] = ld_stream(wr[r] + k + 32 * u);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int b = 0; b < B; ++b) {
        const uint4 xb = __ldg(xv + static_cast<int64_t>(b) * K8 + k + 32 * u);
#pragma unroll
        for (int r = 0; r < R; ++r) fma8(acc[b][r], w[u][r], xb);
      }
  }
  for (; k < K8; k += 32) {
    uint4 w[R];
#pragma unroll
    for (int r = 0; r < R; ++r) w[r] = ld_stream(wr[r] + k);
#pragma unroll
    for (int b = 0; b < B; ++b) {
      const uint4 xb = __ldg(xv + static_cast<int64_t>(b) * K8 + k);
#pragma unroll
      for (int r = 0; r < R; ++r) fma8(acc[b][r], w[r], xb);
    }
  }
}

template <int B, int R>
__global__ void __launch_bounds__(kWarps * 32) gemv_bf16_k(const uint16_t* __restrict__ W,
                                                           const uint16_t* __restrict__ x, float* __restrict__ y,
                                                           int N, int K, bool accumulate) {
  const int lane = threadIdx.x & 31;
  const int row0 = (blockIdx.x * kWarps + (threadIdx.x >> 5)) * R;
  if (row0 >= N) return;
  const uint4* wr[R];
#pragma unroll
  for (int r = 0; r < R; ++r) wr[r] = reinterpret_cast<const uint4*>(W + static_cast<int64_t>(min(row0 + r, N - 1)) * K);
  float acc[B][R];
  dot_rows<B, R>(wr, x, K, acc);
#pragma unroll
  for (int b = 0; b < B; ++b)
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float v = warp_sum(acc[b][r]);
      if (lane == 0 && row0 + r < N) {
        float* o = y + static_cast<int64_t>(b) * N + row0 + r;
        *o = accumulate ? *o + v : v;
      }
    }
}

// resid += W x, then the CTA that finishes last (a ticket counter; the kernel leaves it at zero)
// normalises the whole rows: out = bf16(rmsnorm(resid) * w). Saves the RMSNorm launch that would
// follow every residual-adding projection; the rows are read back from L2 (__ldcg), where the
// other CTAs' writes are visible after their fences.
template <int B, int R>
__global__ void __launch_bounds__(kWarps * 32) gemv_resid_norm_k(const uint16_t* __restrict__ W,
                                                                 const uint16_t* __restrict__ x, float* resid, int N,
                                                                 int K, const float* __restrict__ norm_w, float eps,
                                                                 uint16_t* __restrict__ out, unsigned* counter) {
  __shared__ float part[32];
  __shared__ bool last;
  const int lane = threadIdx.x & 31;
  const int row0 = (blockIdx.x * kWarps + (threadIdx.x >> 5)) * R;
  if (row0 < N) {
    const uint4* wr[R];
#pragma unroll
    for (int r = 0; r < R; ++r) wr[r] = reinterpret_cast<const uint4*>(W + static_cast<int64_t>(min(row0 + r, N - 1)) * K);
    float acc[B][R];
    dot_rows<B, R>(wr, x, K, acc);
#pragma unroll
    for (int b = 0; b < B; ++b)
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const float v = warp_sum(acc[b][r]);
        if (lane == 0 && row0 + r < N) resid[static_cast<int64_t>(b) * N + row0 + r] += v;
      }
  }
  __threadfence();  // this thread's writes, visible device-wide before the ticket is taken
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(counter, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int b = 0; b < B; ++b) {
    const float* row = resid + static_cast<int64_t>(b) * N;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < N; i += blockDim.x) {
      const float v = __ldcg(row + i);
      ss += v * v;
    }
    const float inv = rsqrtf(block_sum(ss, part) / static_cast<float>(N) + eps);
    for (int i = threadIdx.x; i < N; i += blockDim.x)
      out[static_cast<int64_t>(b) * N + i] = f2bf(__ldcg(row + i) * inv * norm_w[i]);
  }
  if (threadIdx.x == 0) *counter = 0;  // ready for the next launch (graph replays)
}

// W is the fused [gate; up] projection ([2F][K]): the warp takes gate row i and up row F + i and
// writes act[b][i] = bf16(silu(gate) * up): the activation never goes through memory in fp32 and the
// separate SwiGLU launch disappears.
template <int B>
__global__ void __launch_bounds__(kWarps * 32) gemv_swiglu_k(const uint16_t* __restrict__ W,
                                                             const uint16_t* __restrict__ x, int F, int K,
                                                             uint16_t* __restrict__ act) {
  const int lane = threadIdx.x & 31;
  const int i = blockIdx.x * kWarps + (threadIdx.x >> 5);
  if (i >= F) return;
  const uint4* wr[2] = {reinterpret_cast<const uint4*>(W + static_cast<int64_t>(i) * K),
                        reinterpret_cast<const uint4*>(W + (static_cast<int64_t>(F) + i) * K)};
  float acc[B][2];
  dot_rows<B, 2>(wr, x, K, acc);
#pragma unroll
  for (int b = 0; b < B; ++b) {
    const float g = warp_sum(acc[b][0]), u = warp_sum(acc[b][1]);
    if (lane == 0) act[static_cast<int64_t>(b) * F + i] = f2bf(g / (1.0f + __expf(-g)) * u);
  }
}

// The fused QKV projection with RoPE and the KV store in its epilogue: a warp computes the two rows
// of one rotation pair of one head ((p, p + rope_dim/2) NeoX, (2p, 2p + 1) interleaved; dims past
// rope_dim and V heads: consecutive pairs, unrotated), then writes q (fp32) or K/V (bf16, paged).
template <int B>
__global__ void __launch_bounds__(kWarps * 32) gemv_qkv_rope_k(const uint16_t* __restrict__ W,
                                                               const uint16_t* __restrict__ x, int K, RopeKv a) {
  const int lane = threadIdx.x & 31;
  const int pair = blockIdx.x * kWarps + (threadIdx.x >> 5);
  const int pairs_per_head = a.hd / 2, heads = a.n_heads + 2 * a.n_kv;
  if (pair >= heads * pairs_per_head) return;
  const QkvPair pp = qkv_pair(a, pair);
  const int hh = pp.hh, i0 = pp.i0, i1 = pp.i1;
  const int64_t base = static_cast<int64_t>(hh) * a.hd;
  const uint4* wr[2] = {reinterpret_cast<const uint4*>(W + (base + i0) * K),
                        reinterpret_cast<const uint4*>(W + (base + i1) * K)};
  float acc[B][2];
  dot_rows<B, 2>(wr, x, K, acc);
#pragma unroll
  for (int b = 0; b < B; ++b) {
    float v0 = warp_sum(acc[b][0]), v1 = warp_sum(acc[b][1]);
    if (lane != 0) continue;
    qkv_pair_out(a, b, hh, pp.p, i0, i1, pp.rotate, v0, v1);
  }
}

template <int B, int R>
void launch_bf16(const uint16_t* W, const uint16_t* x, float* y, int N, int K, bool acc, cudaStream_t s) {
  const int rows_per_cta = kWarps * R;
  gemv_bf16_k<B, R><<<(N + rows_per_cta - 1) / rows_per_cta, kWarps * 32, 0, s>>>(W, x, y, N, K, acc);
}
template <int B, int R>
void launch_resid_norm(const uint16_t* W, const uint16_t* x, float* resid, int N, int K, const float* w, float eps,
                       uint16_t* out, unsigned* counter, cudaStream_t s) {
  const int rows_per_cta = kWarps * R;
  gemv_resid_norm_k<B, R><<<(N + rows_per_cta - 1) / rows_per_cta, kWarps * 32, 0, s>>>(W, x, resid, N, K, w, eps, out,
                                                                                        counter);
}
template <int B>
void launch_swiglu(const uint16_t* W, const uint16_t* x, uint16_t* act, int F, int K, cudaStream_t s) {
  gemv_swiglu_k<B><<<(F + kWarps - 1) / kWarps, kWarps * 32, 0, s>>>(W, x, F, K, act);
}
template <int B>
void launch_qkv_rope(const uint16_t* W, const uint16_t* x, int K, const RopeKv& a, cudaStream_t s) {
  const int pairs = (a.n_heads + 2 * a.n_kv) * a.hd / 2;
  gemv_qkv_rope_k<B><<<(pairs + kWarps - 1) / kWarps, kWarps * 32, 0, s>>>(W, x, K, a);
}

// --- GGUF blocks: a lane takes one 32-weight block at a time, a warp 32 consecutive blocks ---------
// x (bf16) for that block: 64 bytes = 4 uint4 per batch row.
__device__ __forceinline__ void load_x32(const uint16_t* x, float (&xf)[32]) {
  const uint4* p = reinterpret_cast<const uint4*>(x);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint4 v = __ldg(p + j);
    xf[8 * j + 0] = lo_bf(v.x), xf[8 * j + 1] = hi_bf(v.x), xf[8 * j + 2] = lo_bf(v.y), xf[8 * j + 3] = hi_bf(v.y);
    xf[8 * j + 4] = lo_bf(v.z), xf[8 * j + 5] = hi_bf(v.z), xf[8 * j + 6] = lo_bf(v.w), xf[8 * j + 7] = hi_bf(v.w);
  }
}

// Dequantizes unit i (32 consecutive weights) of a row into w[32]: for the 32-weight types a whole
// block; for the K-quants one eighth of a 256-weight super-block.
__device__ __forceinline__ uint16_t ld16(const uint8_t* p) { return __ldg(reinterpret_cast<const uint16_t*>(p)); }

template <QuantType T>
__device__ __forceinline__ void dequant_unit(const uint8_t* row, int i, float (&w)[32]) {
  if constexpr (T == QuantType::Q8_0) {
    const uint8_t* blk = row + static_cast<int64_t>(i) * 34;
    const float d = h2f(ld16(blk));
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const uint16_t v = ld16(blk + 2 + 2 * j);
      w[2 * j] = d * static_cast<float>(static_cast<int8_t>(v & 0xff));
      w[2 * j + 1] = d * static_cast<float>(static_cast<int8_t>(v >> 8));
    }
  } else if constexpr (T == QuantType::Q4_0) {
    const uint8_t* blk = row + static_cast<int64_t>(i) * 18;
    const float d = h2f(ld16(blk));
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const uint16_t v = ld16(blk + 2 + 2 * j);
      w[2 * j] = d * static_cast<float>(static_cast<int>(v & 0xf) - 8);
      w[2 * j + 16] = d * static_cast<float>(static_cast<int>((v >> 4) & 0xf) - 8);
      w[2 * j + 1] = d * static_cast<float>(static_cast<int>((v >> 8) & 0xf) - 8);
      w[2 * j + 17] = d * static_cast<float>(static_cast<int>(v >> 12) - 8);
    }
  } else if constexpr (T == QuantType::Q4_1) {
    const uint8_t* blk = row + static_cast<int64_t>(i) * 20;
    const uint32_t dm = __ldg(reinterpret_cast<const uint32_t*>(blk));
    const float d = h2f(static_cast<uint16_t>(dm & 0xffff)), m = h2f(static_cast<uint16_t>(dm >> 16));
    const uint32_t* q = reinterpret_cast<const uint32_t*>(blk + 4);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t v = __ldg(q + j);
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const uint32_t byte = (v >> (8 * c)) & 0xff;
        w[4 * j + c] = d * static_cast<float>(byte & 0xf) + m;
        w[4 * j + c + 16] = d * static_cast<float>(byte >> 4) + m;
      }
    }
  } else if constexpr (T == QuantType::Q4_K) {
    // 144 bytes: f16 d, f16 dmin, 12 bytes of 6-bit (scale, min) pairs, 128 bytes of nibbles; unit j
    // of the block: the low (j even) or high nibbles of bytes 32 (j / 2) .. + 31.
    const uint8_t* blk = row + static_cast<int64_t>(i / 8) * 144;
    const int j = i % 8;
    const float d = h2f(ld16(blk)), dmin = h2f(ld16(blk + 2));
    const uint8_t* sc = blk + 4;
    int s, m;
    if (j < 4) {
      s = __ldg(sc + j) & 63, m = __ldg(sc + j + 4) & 63;
    } else {
      s = (__ldg(sc + j + 4) & 0xF) | ((__ldg(sc + j - 4) >> 6) << 4);
      m = (__ldg(sc + j + 4) >> 4) | ((__ldg(sc + j) >> 6) << 4);
    }
    const float d1 = d * static_cast<float>(s), m1 = dmin * static_cast<float>(m);
    const uint32_t* q = reinterpret_cast<const uint32_t*>(blk + 16 + 32 * (j / 2));
    const int shift = (j & 1) * 4;
#pragma unroll
    for (int t = 0; t < 8; ++t) {
      const uint32_t v = __ldg(q + t) >> shift;
#pragma unroll
      for (int c = 0; c < 4; ++c) w[4 * t + c] = d1 * static_cast<float>((v >> (8 * c)) & 0xF) - m1;
    }
  } else {
    // Q6_K, 210 bytes: ql[128] low nibbles, qh[64] 2-bit highs, int8 scales[16] (one per 16), f16 d.
    // Unit sub = 4 n + q: weights 128 n + 32 q + l, l < 32.
    const uint8_t* blk = row + static_cast<int64_t>(i / 8) * 210;
    const int sub = i % 8, n = sub / 4, q = sub % 4;
    const float d = h2f(ld16(blk + 208));
    const uint16_t sc2 = ld16(blk + 192 + 8 * n + 2 * q);
    const float ds0 = d * static_cast<float>(static_cast<int8_t>(sc2 & 0xff));
    const float ds1 = d * static_cast<float>(static_cast<int8_t>(sc2 >> 8));
    const uint8_t* ql = blk + 64 * n + (q & 1) * 32;
    const uint8_t* qh = blk + 128 + 32 * n;
    const int lshift = q < 2 ? 0 : 4, hshift = 2 * q;
#pragma unroll
    for (int t = 0; t < 16; ++t) {
      const uint16_t l2 = ld16(ql + 2 * t), h2 = ld16(qh + 2 * t);
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int lo = ((l2 >> (8 * c)) >> lshift) & 0xF, hi = ((h2 >> (8 * c)) >> hshift) & 3;
        const int l = 2 * t + c;
        w[l] = (l < 16 ? ds0 : ds1) * static_cast<float>((lo | (hi << 4)) - 32);
      }
    }
  }
}

template <QuantType T>
__host__ __device__ constexpr int64_t row_bytes(int K) {
  return T == QuantType::Q8_0   ? K / 32 * 34
         : T == QuantType::Q4_0 ? K / 32 * 18
         : T == QuantType::Q4_1 ? K / 32 * 20
         : T == QuantType::Q4_K ? K / 256 * 144
                                : K / 256 * 210;
}

template <QuantType T, int B>
__global__ void __launch_bounds__(kWarps * 32) gemv_quant_k(const uint8_t* __restrict__ W, const uint16_t* __restrict__ x,
                                                            float* __restrict__ y, int N, int K, bool accumulate) {
  const int lane = threadIdx.x & 31;
  const int row = blockIdx.x * kWarps + (threadIdx.x >> 5);
  if (row >= N) return;
  const int units = K / 32;
  const uint8_t* wr = W + static_cast<int64_t>(row) * row_bytes<T>(K);
  float acc[B];
#pragma unroll
  for (int b = 0; b < B; ++b) acc[b] = 0.0f;
  for (int i = lane; i < units; i += 32) {
    float w[32];
    dequant_unit<T>(wr, i, w);
#pragma unroll
    for (int b = 0; b < B; ++b) {
      float xf[32];
      load_x32(x + static_cast<int64_t>(b) * K + i * 32, xf);
#pragma unroll
      for (int j = 0; j < 32; ++j) acc[b] = fmaf(w[j], xf[j], acc[b]);
    }
  }
#pragma unroll
  for (int b = 0; b < B; ++b) {
    const float v = warp_sum(acc[b]);
    if (lane == 0) {
      float* o = y + static_cast<int64_t>(b) * N + row;
      *o = accumulate ? *o + v : v;
    }
  }
}

template <QuantType T, int B>
void launch_quant(const void* W, const uint16_t* x, float* y, int N, int K, bool acc, cudaStream_t s) {
  gemv_quant_k<T, B><<<(N + kWarps - 1) / kWarps, kWarps * 32, 0, s>>>(static_cast<const uint8_t*>(W), x, y, N, K, acc);
}

template <QuantType T>
void dispatch_quant(const void* W, const uint16_t* x, float* y, int N, int K, int batch, bool acc, cudaStream_t s) {
  switch (batch) {
    case 1: launch_quant<T, 1>(W, x, y, N, K, acc, s); break;
    case 2: launch_quant<T, 2>(W, x, y, N, K, acc, s); break;
    case 3: launch_quant<T, 3>(W, x, y, N, K, acc, s); break;
    case 4: launch_quant<T, 4>(W, x, y, N, K, acc, s); break;
    case 5: launch_quant<T, 5>(W, x, y, N, K, acc, s); break;
    case 6: launch_quant<T, 6>(W, x, y, N, K, acc, s); break;
    case 7: launch_quant<T, 7>(W, x, y, N, K, acc, s); break;
    default: launch_quant<T, 8>(W, x, y, N, K, acc, s); break;
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace

Status gemv_bf16(const bf16_bits* W, const bf16_bits* x, float* y, int N, int K, int batch, bool accumulate,
                 cudaStream_t s) {
  if (N <= 0 || K <= 0 || K % 8 != 0 || batch < 1 || batch > 8)
    return make_error("gemv_bf16: needs N > 0, K a positive multiple of 8 and batch 1..8 (N=" + std::to_string(N) +
                      ", K=" + std::to_string(K) + ", batch=" + std::to_string(batch) + ")");
  if (!aligned16(W) || !aligned16(x)) return make_error("gemv_bf16: W and x must be 16-byte aligned");
  switch (batch) {
    case 1: launch_bf16<1, 2>(W, x, y, N, K, accumulate, s); break;
    case 2: launch_bf16<2, 2>(W, x, y, N, K, accumulate, s); break;
    case 3: launch_bf16<3, 2>(W, x, y, N, K, accumulate, s); break;
    case 4: launch_bf16<4, 2>(W, x, y, N, K, accumulate, s); break;
    case 5: launch_bf16<5, 4>(W, x, y, N, K, accumulate, s); break;
    case 6: launch_bf16<6, 4>(W, x, y, N, K, accumulate, s); break;
    case 7: launch_bf16<7, 4>(W, x, y, N, K, accumulate, s); break;
    default: launch_bf16<8, 4>(W, x, y, N, K, accumulate, s); break;
  }
  SS_CUDA_LAUNCHED();
  return {};
}

Status gemv_bf16_residual_rmsnorm(const bf16_bits* W, const bf16_bits* x, float* resid, int N, int K, int batch,
                                  const float* norm_w, float eps, bf16_bits* out, unsigned* counter, cudaStream_t s) {
  if (N <= 0 || K <= 0 || K % 8 != 0 || batch < 1 || batch > 8)
    return make_error("gemv_bf16_residual_rmsnorm: needs N > 0, K a positive multiple of 8 and batch 1..8 (N=" +
                      std::to_string(N) + ", K=" + std::to_string(K) + ", batch=" + std::to_string(batch) + ")");
  if (!aligned16(W) || !aligned16(x)) return make_error("gemv_bf16_residual_rmsnorm: W and x must be 16-byte aligned");
  if (!counter) return make_error("gemv_bf16_residual_rmsnorm: needs a zeroed counter");
  switch (batch) {
    case 1: launch_resid_norm<1, 2>(W, x, resid, N, K, norm_w, eps, out, counter, s); break;
    case 2: launch_resid_norm<2, 2>(W, x, resid, N, K, norm_w, eps, out, counter, s); break;
    case 3: launch_resid_norm<3, 2>(W, x, resid, N, K, norm_w, eps, out, counter, s); break;
    case 4: launch_resid_norm<4, 2>(W, x, resid, N, K, norm_w, eps, out, counter, s); break;
    case 5: launch_resid_norm<5, 4>(W, x, resid, N, K, norm_w, eps, out, counter, s); break;
    case 6: launch_resid_norm<6, 4>(W, x, resid, N, K, norm_w, eps, out, counter, s); break;
    case 7: launch_resid_norm<7, 4>(W, x, resid, N, K, norm_w, eps, out, counter, s); break;
    default: launch_resid_norm<8, 4>(W, x, resid, N, K, norm_w, eps, out, counter, s); break;
  }
  SS_CUDA_LAUNCHED();
  return {};
}

Status gemv_bf16_swiglu(const bf16_bits* W_gate_up, const bf16_bits* x, bf16_bits* act, int F, int K, int batch,
                        cudaStream_t s) {
  if (F <= 0 || K <= 0 || K % 8 != 0 || batch < 1 || batch > 8)
    return make_error("gemv_bf16_swiglu: needs F > 0, K a positive multiple of 8 and batch 1..8 (F=" +
                      std::to_string(F) + ", K=" + std::to_string(K) + ", batch=" + std::to_string(batch) + ")");
  if (!aligned16(W_gate_up) || !aligned16(x)) return make_error("gemv_bf16_swiglu: W and x must be 16-byte aligned");
  switch (batch) {
    case 1: launch_swiglu<1>(W_gate_up, x, act, F, K, s); break;
    case 2: launch_swiglu<2>(W_gate_up, x, act, F, K, s); break;
    case 3: launch_swiglu<3>(W_gate_up, x, act, F, K, s); break;
    case 4: launch_swiglu<4>(W_gate_up, x, act, F, K, s); break;
    case 5: launch_swiglu<5>(W_gate_up, x, act, F, K, s); break;
    case 6: launch_swiglu<6>(W_gate_up, x, act, F, K, s); break;
    case 7: launch_swiglu<7>(W_gate_up, x, act, F, K, s); break;
    default: launch_swiglu<8>(W_gate_up, x, act, F, K, s); break;
  }
  SS_CUDA_LAUNCHED();
  return {};
}

Status gemv_bf16_qkv_rope(const bf16_bits* W_qkv, const bf16_bits* x, int K, int batch, const RopeKv& a,
                         cudaStream_t s) {
  if (K <= 0 || K % 8 != 0 || batch < 1 || batch > 8)
    return make_error("gemv_bf16_qkv_rope: needs K a positive multiple of 8 and batch 1..8 (K=" + std::to_string(K) +
                      ", batch=" + std::to_string(batch) + ")");
  if (a.hd <= 0 || a.hd % 2 != 0 || a.rope_dim <= 0 || a.rope_dim > a.hd || a.rope_dim % 2 != 0 || a.n_heads <= 0 ||
      a.n_kv <= 0)
    return make_error("gemv_bf16_qkv_rope: bad head shape (hd=" + std::to_string(a.hd) + ", rope_dim=" +
                      std::to_string(a.rope_dim) + ")");
  if (!aligned16(W_qkv) || !aligned16(x)) return make_error("gemv_bf16_qkv_rope: W and x must be 16-byte aligned");
  if (a.q_norm || a.k_norm)
    return make_error("gemv_bf16_qkv_rope: per-head q/k norms need the whole head: use gemv_bf16 + rope_kv_store");
  switch (batch) {
    case 1: launch_qkv_rope<1>(W_qkv, x, K, a, s); break;
    case 2: launch_qkv_rope<2>(W_qkv, x, K, a, s); break;
    case 3: launch_qkv_rope<3>(W_qkv, x, K, a, s); break;
    case 4: launch_qkv_rope<4>(W_qkv, x, K, a, s); break;
    case 5: launch_qkv_rope<5>(W_qkv, x, K, a, s); break;
    case 6: launch_qkv_rope<6>(W_qkv, x, K, a, s); break;
    case 7: launch_qkv_rope<7>(W_qkv, x, K, a, s); break;
    default: launch_qkv_rope<8>(W_qkv, x, K, a, s); break;
  }
  SS_CUDA_LAUNCHED();
  return {};
}

Status gemv_quant(const void* W, QuantType type, const bf16_bits* x, float* y, int N, int K, int batch,
                  bool accumulate, cudaStream_t s) {
  const int qk = type == QuantType::Q4_K || type == QuantType::Q6_K ? 256 : 32;
  if (N <= 0 || K <= 0 || K % qk != 0 || batch < 1 || batch > 8)
    return make_error("gemv_quant: needs N > 0, K a positive multiple of " + std::to_string(qk) +
                      " and batch 1..8 (N=" + std::to_string(N) + ", K=" + std::to_string(K) +
                      ", batch=" + std::to_string(batch) + ")");
  if (!aligned16(x) || (reinterpret_cast<uintptr_t>(W) & 3u) != 0)
    return make_error("gemv_quant: x must be 16-byte and W 4-byte aligned");
  switch (type) {
    case QuantType::Q8_0: dispatch_quant<QuantType::Q8_0>(W, x, y, N, K, batch, accumulate, s); break;
    case QuantType::Q4_0: dispatch_quant<QuantType::Q4_0>(W, x, y, N, K, batch, accumulate, s); break;
    case QuantType::Q4_1: dispatch_quant<QuantType::Q4_1>(W, x, y, N, K, batch, accumulate, s); break;
    case QuantType::Q4_K: dispatch_quant<QuantType::Q4_K>(W, x, y, N, K, batch, accumulate, s); break;
    case QuantType::Q6_K: dispatch_quant<QuantType::Q6_K>(W, x, y, N, K, batch, accumulate, s); break;
  }
  SS_CUDA_LAUNCHED();
  return {};
}

}  // namespace ss::cuda::kern
