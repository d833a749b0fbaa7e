// First versions of the forward pass's kernels: a CTA per token (or per token and head group), fp32
// arithmetic, bf16 storage. Correct and simple; tuned kernels replace them one by one, each held to
// the same host references (tests/gpu).
#include "backend/cuda/basic_ops.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <cfloat>

namespace ss::cuda {

namespace {

__device__ __forceinline__ float bf2f(bf16_bits b) { return __uint_as_float(static_cast<uint32_t>(b) << 16); }
__device__ __forceinline__ bf16_bits f2bf(float f) {
  const __nv_bfloat16 h = __float2bfloat16_rn(f);
  return *reinterpret_cast<const bf16_bits*>(&h);
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the total.
__device__ float block_sum(float v) {
  __shared__ float part[32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  __syncthreads();
  if (lane == 0) part[warp] = v;
  __syncthreads();
  float t = lane < nw ? part[lane] : 0.0f;
  for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
  return t;
}

__global__ void embed_k(const bf16_bits* table, const int32_t* tokens, int h, float* x) {
  const int t = blockIdx.x;
  const bf16_bits* row = table + static_cast<int64_t>(tokens[t]) * h;
  for (int i = threadIdx.x; i < h; i += blockDim.x) x[static_cast<int64_t>(t) * h + i] = bf2f(row[i]);
}

__global__ void add_rmsnorm_k(float* x, const float* d, const float* w, int h, float eps, bf16_bits* out) {
  const int64_t base = static_cast<int64_t>(blockIdx.x) * h;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < h; i += blockDim.x) {
    float v = x[base + i];
    if (d) {
      v += d[base + i];
      x[base + i] = v;
    }
    ss += v * v;
  }
  const float inv = rsqrtf(block_sum(ss) / static_cast<float>(h) + eps);
  for (int i = threadIdx.x; i < h; i += blockDim.x) out[base + i] = f2bf(x[base + i] * inv * w[i]);
}

__device__ void rope_head(float* v, int rope_dim, const float* cs, bool interleaved, int lane, int nl) {
  const int half = rope_dim / 2;
  for (int i = lane; i < half; i += nl) {
    const int a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + half;
    const float x0 = v[a], x1 = v[b], c = cs[i], s = cs[half + i];
    v[a] = x0 * c - x1 * s;
    v[b] = x1 * c + x0 * s;
  }
}

// One warp per head of one token's [q | k | v] row, kEpiHeads heads a CTA (grid: tokens x head
// groups, so a step of a few tokens still spreads over the SMs): bias, the per-head norm (q and k,
// Qwen3), RoPE (q and k), then q pre-scaled to q_out and k / v into the token's cache slot.
constexpr int kEpiHeads = 4;
__global__ void qkv_epilogue_k(QkvEpilogue a) {
  extern __shared__ float sm[];  // [kEpiHeads][hd]
  const int t = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int hh = blockIdx.y * kEpiHeads + warp;
  if (hh >= a.n_heads + 2 * a.n_kv) return;  // no block-wide barrier below
  const int qd = a.n_heads * a.hd, kvd = a.n_kv * a.hd, w = qd + 2 * kvd, off = hh * a.hd;
  const bool is_q = hh < a.n_heads, is_k = !is_q && hh < a.n_heads + a.n_kv;
  const float* src = a.qkv + static_cast<int64_t>(t) * w + off;
  const float* bias = !a.bq ? nullptr : is_q ? a.bq + off : is_k ? a.bk + (off - qd) : a.bv + (off - qd - kvd);
  float* v = sm + warp * a.hd;
  for (int i = lane; i < a.hd; i += 32) v[i] = bias ? src[i] + bias[i] : src[i];
  __syncwarp();
  const int pos = a.positions[t];
  if (is_q || is_k) {
    const float* norm_w = is_q ? a.q_norm : a.k_norm;
    if (norm_w) {
      float ss = 0.0f;
      for (int i = lane; i < a.hd; i += 32) ss += v[i] * v[i];
      for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
      const float inv = rsqrtf(ss / static_cast<float>(a.hd) + a.norm_eps);
      for (int i = lane; i < a.hd; i += 32) v[i] = v[i] * inv * norm_w[i];
      __syncwarp();
    }
    rope_head(v, a.rope_dim, a.rope_cs + static_cast<int64_t>(pos) * a.rope_dim, a.interleaved, lane, 32);
    __syncwarp();
  }
  if (is_q) {
    for (int i = lane; i < a.hd; i += 32) a.q_out[static_cast<int64_t>(t) * qd + off + i] = v[i] * a.q_scale;
    return;
  }
  const int kv = is_k ? 0 : 1, head = hh - a.n_heads - kv * a.n_kv;
  const int block = a.tables[static_cast<int64_t>(a.token_table[t]) * a.max_blocks + pos / a.block_size];
  bf16_bits* dst = a.layer_cache + ((static_cast<int64_t>(block) * 2 + kv) * a.n_kv + head) * a.block_size * a.hd +
                   static_cast<int64_t>(pos % a.block_size) * a.hd;
  for (int i = lane; i < a.hd; i += 32) dst[i] = f2bf(v[i]);
}

// One CTA of 128 threads per (token, head): keys in tiles of 128 (one per thread), online softmax;
// each thread then owns head dims tid, tid + 128, ... of the output.
constexpr int kAttnThreads = 128;
__global__ void attention_k(Attention a) {
  extern __shared__ float sm[];  // q[hd], p[kAttnThreads]
  float* q = sm;
  float* p = sm + a.hd;
  const int t = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
  const int kvh = h / (a.n_heads / a.n_kv);
  const int qd = a.n_heads * a.hd;
  for (int i = tid; i < a.hd; i += kAttnThreads) q[i] = a.q[static_cast<int64_t>(t) * qd + h * a.hd + i];
  __syncthreads();
  const int n_keys = a.positions[t] + 1;
  const int32_t* table = a.tables + static_cast<int64_t>(a.token_table[t]) * a.max_blocks;
  const int64_t head_stride = static_cast<int64_t>(a.block_size) * a.hd;
  float m = -FLT_MAX, l = 0.0f;
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // dims tid + 128 j (hd <= 512)
  for (int k0 = 0; k0 < n_keys; k0 += kAttnThreads) {
    const int j = k0 + tid;
    float s = -FLT_MAX;
    if (j < n_keys) {
      const int64_t blk = table[j / a.block_size];
      const bf16_bits* key = a.layer_cache + (blk * 2 * a.n_kv + kvh) * head_stride + static_cast<int64_t>(j % a.block_size) * a.hd;
      float dot = 0.0f;
      for (int d = 0; d < a.hd; ++d) dot += q[d] * bf2f(key[d]);
      s = dot;
    }
    // Tile max, then the running rescale.
    float tm = s;
    for (int o = 16; o > 0; o >>= 1) tm = fmaxf(tm, __shfl_xor_sync(0xffffffffu, tm, o));
    __shared__ float wmax[kAttnThreads / 32];
    if ((tid & 31) == 0) wmax[tid >> 5] = tm;
    __syncthreads();
    tm = wmax[0];
    for (int w = 1; w < kAttnThreads / 32; ++w) tm = fmaxf(tm, wmax[w]);
    const float m_new = fmaxf(m, tm);
    const float e = j < n_keys ? __expf(s - m_new) : 0.0f;
    p[tid] = e;
    const float scale = __expf(m - m_new);
    l = l * scale + block_sum(e);
    for (int c = 0; c < 4; ++c) acc[c] *= scale;
    __syncthreads();
    const int kn = min(kAttnThreads, n_keys - k0);
    for (int jj = 0; jj < kn; ++jj) {
      const int key_pos = k0 + jj;
      const int64_t blk = table[key_pos / a.block_size];
      const bf16_bits* val = a.layer_cache + ((blk * 2 + 1) * a.n_kv + kvh) * head_stride +
                             static_cast<int64_t>(key_pos % a.block_size) * a.hd;
      const float pj = p[jj];
      for (int c = 0; c < 4; ++c) {
        const int d = tid + c * kAttnThreads;
        if (d < a.hd) acc[c] += pj * bf2f(val[d]);
      }
    }
    m = m_new;
    __syncthreads();
  }
  const float inv = 1.0f / l;
  for (int c = 0; c < 4; ++c) {
    const int d = tid + c * kAttnThreads;
    if (d < a.hd) a.out[static_cast<int64_t>(t) * qd + h * a.hd + d] = f2bf(acc[c] * inv);
  }
}

// grid: tokens x chunks of the row (a few tokens still spread over the SMs).
__global__ void silu_mul_k(const float* gu, int inter, bf16_bits* act) {
  const int64_t t = blockIdx.x;
  const float* g = gu + t * 2 * inter;
  for (int i = blockIdx.y * blockDim.x + threadIdx.x; i < inter; i += gridDim.y * blockDim.x) {
    const float x = g[i];
    act[t * inter + i] = f2bf(x / (1.0f + expf(-x)) * g[inter + i]);
  }
}

__global__ void gather_rows_k(const bf16_bits* src, const int32_t* rows, int h, bf16_bits* dst) {
  const int r = blockIdx.x;
  const bf16_bits* s = src + static_cast<int64_t>(rows[r]) * h;
  for (int i = threadIdx.x; i < h; i += blockDim.x) dst[static_cast<int64_t>(r) * h + i] = s[i];
}

__global__ void argmax_rows_k(const float* logits, int v, int32_t* ids) {
  const float* row = logits + static_cast<int64_t>(blockIdx.x) * v;
  float best = -FLT_MAX;
  int bi = 0x7fffffff;
  for (int i = threadIdx.x; i < v; i += blockDim.x) {
    const float x = row[i];
    if (x > best || (x == best && i < bi)) best = x, bi = i;
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float ob = __shfl_xor_sync(0xffffffffu, best, o);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (ob > best || (ob == best && oi < bi)) best = ob, bi = oi;
  }
  __shared__ float wb[32];
  __shared__ int wi[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  if (lane == 0) wb[warp] = best, wi[warp] = bi;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < nw; ++w)
      if (wb[w] > best || (wb[w] == best && wi[w] < bi)) best = wb[w], bi = wi[w];
    // Only NaN rows reach here without a pick: the lowest id, as the host's argmax.
    ids[blockIdx.x] = bi == 0x7fffffff ? 0 : bi;
  }
}

__global__ void f32_to_bf16_k(const float* src, int64_t n, bf16_bits* dst) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[i] = f2bf(src[i]);
}

int grid_for(int64_t n, int threads) {
  const int64_t g = (n + threads - 1) / threads;
  return static_cast<int>(g < 65535 ? (g > 0 ? g : 1) : 65535);
}

}  // namespace

void embed(const bf16_bits* table, const int32_t* tokens, int n_tok, int h, float* x, cudaStream_t s) {
  if (n_tok > 0) embed_k<<<n_tok, 256, 0, s>>>(table, tokens, h, x);
}
void add_rmsnorm(float* x, const float* d, const float* w, int n_tok, int h, float eps, bf16_bits* out,
                 cudaStream_t s) {
  // A CTA per row: up to 1024 threads, ~4 elements each (a step of a few rows is all latency).
  const int threads = std::min(1024, std::max(128, (h / 4 + 31) / 32 * 32));
  if (n_tok > 0) add_rmsnorm_k<<<n_tok, threads, 0, s>>>(x, d, w, h, eps, out);
}
void qkv_epilogue(const QkvEpilogue& a, int n_tok, cudaStream_t s) {
  const size_t smem = sizeof(float) * static_cast<size_t>(kEpiHeads * a.hd);
  const int groups = (a.n_heads + 2 * a.n_kv + kEpiHeads - 1) / kEpiHeads;
  if (n_tok > 0) qkv_epilogue_k<<<dim3(n_tok, groups), kEpiHeads * 32, smem, s>>>(a);
}
void attention(const Attention& a, int n_tok, cudaStream_t s) {
  const size_t smem = sizeof(float) * static_cast<size_t>(a.hd + kAttnThreads);
  if (n_tok > 0) attention_k<<<dim3(n_tok, a.n_heads), kAttnThreads, smem, s>>>(a);
}
void silu_mul(const float* gu, int n_tok, int inter, bf16_bits* act, cudaStream_t s) {
  const int chunks = std::min(64, (inter + 1023) / 1024);  // >= 4 elements a thread
  if (n_tok > 0) silu_mul_k<<<dim3(n_tok, chunks), 256, 0, s>>>(gu, inter, act);
}
void gather_rows(const bf16_bits* src, const int32_t* rows, int n_rows, int h, bf16_bits* dst, cudaStream_t s) {
  if (n_rows > 0) gather_rows_k<<<n_rows, 256, 0, s>>>(src, rows, h, dst);
}
void argmax_rows(const float* logits, int n_rows, int v, int32_t* ids, cudaStream_t s) {
  if (n_rows > 0) argmax_rows_k<<<n_rows, 256, 0, s>>>(logits, v, ids);
}
void f32_to_bf16(const float* src, int64_t n, bf16_bits* dst, cudaStream_t s) {
  if (n > 0) f32_to_bf16_k<<<grid_for(n, 256), 256, 0, s>>>(src, n, dst);
}

}  // namespace ss::cuda
