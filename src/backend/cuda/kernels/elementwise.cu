// Embedding gather, residual add + RMSNorm, RoPE + paged KV store, SwiGLU: one CTA per token, each
// pass over its row in registers (rows of a few thousand values at most), fp32 arithmetic.
#include <string>

#include "backend/cuda/kernels/common.cuh"

namespace ss::cuda::kern {

Status cuda_status(cudaError_t e, const char* what, const char* file, int line) {
  if (e == cudaSuccess) return {};
  return make_error(std::string(file) + ":" + std::to_string(line) + ": " + what + ": " + cudaGetErrorString(e));
}

namespace {

using namespace dev;

__device__ __forceinline__ float load_table(const void* table, TableType type, int64_t row, int h, int i) {
  switch (type) {
    case TableType::F32: return static_cast<const float*>(table)[row * h + i];
    case TableType::F16: return h2f(static_cast<const uint16_t*>(table)[row * h + i]);
    case TableType::BF16: return bf2f(static_cast<const uint16_t*>(table)[row * h + i]);
    case TableType::Q8_0: {  // 34-byte blocks: f16 d, 32 int8
      const uint8_t* b = static_cast<const uint8_t*>(table) + (row * (h / 32) + i / 32) * 34;
      const float d = h2f(static_cast<uint16_t>(b[0] | (b[1] << 8)));
      return d * static_cast<float>(static_cast<int8_t>(b[2 + i % 32]));
    }
    case TableType::Q4_0: {  // 18-byte blocks: f16 d, 16 bytes of nibbles (low: 0..15, high: 16..31)
      const uint8_t* b = static_cast<const uint8_t*>(table) + (row * (h / 32) + i / 32) * 18;
      const float d = h2f(static_cast<uint16_t>(b[0] | (b[1] << 8)));
      const int j = i % 32;
      const int q = j < 16 ? (b[2 + j] & 0xf) : (b[2 + j - 16] >> 4);
      return d * static_cast<float>(q - 8);
    }
    case TableType::Q4_1: {  // 20-byte blocks: f16 d, f16 m, 16 bytes of nibbles
      const uint8_t* b = static_cast<const uint8_t*>(table) + (row * (h / 32) + i / 32) * 20;
      const float d = h2f(static_cast<uint16_t>(b[0] | (b[1] << 8)));
      const float m = h2f(static_cast<uint16_t>(b[2] | (b[3] << 8)));
      const int j = i % 32;
      const int q = j < 16 ? (b[4 + j] & 0xf) : (b[4 + j - 16] >> 4);
      return __fadd_rn(__fmul_rn(d, static_cast<float>(q)), m);  // no FMA: the host's rounding exactly
    }
  }
  return 0.0f;
}

__global__ void embed_k(const void* table, TableType type, int vocab, int h, const int32_t* tokens, float* x) {
  const int t = blockIdx.x;
  const int tok = tokens[t];
  float* out = x + static_cast<int64_t>(t) * h;
  const bool ok = tok >= 0 && tok < vocab;
  for (int i = threadIdx.x; i < h; i += blockDim.x) out[i] = ok ? load_table(table, type, tok, h, i) : 0.0f;
}

// Up to kMaxPer values per thread stay in registers between the two passes.
constexpr int kNormThreads = 256, kNormMaxPer = 32;  // h <= 8192

__global__ void __launch_bounds__(kNormThreads) add_rmsnorm_k(float* x, const float* d, const float* w, int h,
                                                              float eps, uint16_t* out) {
  __shared__ float part[32];
  const int64_t base = static_cast<int64_t>(blockIdx.x) * h;
  float v[kNormMaxPer];
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < kNormMaxPer; ++j) {
    const int i = threadIdx.x + j * kNormThreads;
    v[j] = 0.0f;
    if (i < h) {
      float a = x[base + i];
      if (d) {
        a += d[base + i];
        x[base + i] = a;
      }
      v[j] = a;
      ss += a * a;
    }
  }
  const float inv = rsqrtf(block_sum(ss, part) / static_cast<float>(h) + eps);
#pragma unroll
  for (int j = 0; j < kNormMaxPer; ++j) {
    const int i = threadIdx.x + j * kNormThreads;
    if (i < h) out[base + i] = f2bf(v[j] * inv * w[i]);
  }
}

// One warp per head (q heads, then k heads, then v heads of the token): RoPE in registers.
__global__ void rope_kv_k(RopeKv a) {
  const int t = blockIdx.x;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
  const int heads = a.n_heads + 2 * a.n_kv;
  const int pos = a.positions[t];
  const float* cs = a.rope_cs + static_cast<int64_t>(pos) * a.rope_dim;
  const int half = a.rope_dim / 2;
  const int64_t row = static_cast<int64_t>(t) * heads * a.hd;
  const int blk = a.tables[static_cast<int64_t>(a.seq_of_token[t]) * a.max_blocks + pos / kBlockTokens];
  const int slot = pos % kBlockTokens;
  for (int hh = warp; hh < heads; hh += nw) {
    const float* src = a.qkv + row + static_cast<int64_t>(hh) * a.hd;
    const float* bias = a.bias ? a.bias + static_cast<int64_t>(hh) * a.hd : nullptr;
    const bool is_v = hh >= a.n_heads + a.n_kv;
    const float* norm_w = is_v ? nullptr : hh < a.n_heads ? a.q_norm : a.k_norm;
    float inv = 1.0f;
    if (norm_w) {  // per-head RMSNorm (warp-uniform branch)
      float ss = 0.0f;
      for (int i = lane; i < a.hd; i += 32) {
        const float v = src[i] + (bias ? bias[i] : 0.0f);
        ss += v * v;
      }
      inv = rsqrtf(warp_sum(ss) / static_cast<float>(a.hd) + a.norm_eps);
    }
    auto val = [&](int i) {
      const float v = src[i] + (bias ? bias[i] : 0.0f);
      return norm_w ? v * inv * norm_w[i] : v;
    };
    float* qdst = hh < a.n_heads ? a.q_out + (static_cast<int64_t>(t) * a.n_heads + hh) * a.hd : nullptr;
    uint16_t* kvdst = nullptr;
    if (!qdst) {
      const int kvh = is_v ? hh - a.n_heads - a.n_kv : hh - a.n_heads;
      kvdst = a.cache + ((static_cast<int64_t>(blk) * 2 + (is_v ? 1 : 0)) * a.n_kv + kvh) * kBlockTokens * a.hd +
              static_cast<int64_t>(slot) * a.hd;
    }
    // Each lane handles dims i (with their pair partner); dims past rope_dim pass through.
    for (int i = lane; i < a.hd; i += 32) {
      float r;
      const float xi = val(i);
      if (is_v || i >= a.rope_dim) {
        r = xi;
      } else {
        int p, other;
        bool first;
        if (a.interleaved) {
          p = i >> 1, first = (i & 1) == 0, other = first ? i + 1 : i - 1;
        } else {
          first = i < half, p = first ? i : i - half, other = first ? i + half : i - half;
        }
        const float xo = val(other), c = cs[p], sn = cs[half + p];
        r = first ? xi * c - xo * sn : xi * c + xo * sn;
      }
      if (qdst) qdst[i] = r;
      else kvdst[i] = f2bf(r);
    }
  }
}

__global__ void swiglu_k(const float* gu, int inter, uint16_t* act) {
  const int64_t t = blockIdx.y;
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= inter) return;
  const float g = gu[t * 2 * inter + i], u = gu[t * 2 * inter + inter + i];
  act[t * inter + i] = f2bf(g / (1.0f + __expf(-g)) * u);
}

}  // namespace

Status embed(const void* table, TableType type, int vocab, int h, const int32_t* tokens, int n_tok, float* x,
             cudaStream_t s) {
  const bool quant = type == TableType::Q8_0 || type == TableType::Q4_0 || type == TableType::Q4_1;
  if (h <= 0 || vocab <= 0 || n_tok < 0 || (quant && h % 32 != 0))
    return make_error("embed: bad shape (h=" + std::to_string(h) + ", vocab=" + std::to_string(vocab) + ")");
  if (n_tok == 0) return {};
  embed_k<<<n_tok, 256, 0, s>>>(table, type, vocab, h, tokens, x);
  SS_CUDA_LAUNCHED();
  return {};
}

Status add_rmsnorm(float* x, const float* d, const float* w, int n_tok, int h, float eps, bf16_bits* out,
                   cudaStream_t s) {
  if (h <= 0 || h > kNormThreads * kNormMaxPer || n_tok < 0)
    return make_error("add_rmsnorm: hidden size " + std::to_string(h) + " outside 1.." +
                      std::to_string(kNormThreads * kNormMaxPer));
  if (n_tok == 0) return {};
  add_rmsnorm_k<<<n_tok, kNormThreads, 0, s>>>(x, d, w, h, eps, out);
  SS_CUDA_LAUNCHED();
  return {};
}

Status rope_kv_store(const RopeKv& a, int n_tok, cudaStream_t s) {
  if (a.hd <= 0 || a.rope_dim <= 0 || a.rope_dim > a.hd || a.rope_dim % 2 != 0 || a.n_heads <= 0 || a.n_kv <= 0)
    return make_error("rope_kv_store: bad head shape (hd=" + std::to_string(a.hd) + ", rope_dim=" +
                      std::to_string(a.rope_dim) + ")");
  if (n_tok <= 0) return {};
  rope_kv_k<<<n_tok, 256, 0, s>>>(a);
  SS_CUDA_LAUNCHED();
  return {};
}

Status swiglu(const float* gu, int n_tok, int inter, bf16_bits* act, cudaStream_t s) {
  if (inter <= 0 || n_tok < 0 || n_tok > 65535) return make_error("swiglu: bad shape");
  if (n_tok == 0) return {};
  swiglu_k<<<dim3((inter + 255) / 256, n_tok), 256, 0, s>>>(gu, inter, act);
  SS_CUDA_LAUNCHED();
  return {};
}

}  // namespace ss::cuda::kern
