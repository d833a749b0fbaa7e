// Private to cuda/: the forward pass's kernels as host-callable launches on a stream (device
// pointers in, nothing synchronised). Straightforward first versions, each checked against a host
// reference in tests/gpu; the matmuls are cuBLAS (cuda_backend.cpp).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace ss::cuda {

using bf16_bits = uint16_t;  // __nv_bfloat16 as stored

// x[t] = table[tokens[t]] (bf16 rows of h) as fp32.
void embed(const bf16_bits* table, const int32_t* tokens, int n_tok, int h, float* x, cudaStream_t s);
// out[t] = bf16(x[t] / rms(x[t]) * w); with d: x[t] += d[t] first (the residual add, in place).
void add_rmsnorm(float* x, const float* d, const float* w, int n_tok, int h, float eps, bf16_bits* out,
                 cudaStream_t s);

// The Q/K/V projection's epilogue, per token: optional bias (Qwen2), optional per-head RMSNorm of q and
// k (Qwen3), RoPE on the first rope_dim dims of each head (cs: [pos][rope_dim/2 cos | rope_dim/2
// sin]; interleaved pairs (2i, 2i+1) or halves (i, i + rope_dim/2)), q scaled by q_scale into q_out,
// k and v stored (bf16) in the paged cache at their position's slot.
// qkv: [n_tok][n_heads*hd + 2*n_kv*hd] fp32. Cache layout per layer: [block][2][n_kv][block_size][hd]
// (K then V of a block adjacent), layer_cache points at this layer's block 0.
struct QkvEpilogue {
  const float* qkv;
  const float *bq, *bk, *bv;           // null: no bias
  const float *q_norm, *k_norm;        // null: no per-head norm
  float norm_eps;
  const float* rope_cs;
  int rope_dim;
  bool interleaved;
  float q_scale;
  int n_heads, n_kv, hd, block_size, max_blocks;
  const int32_t* positions;            // [n_tok]
  const int32_t* token_table;          // [n_tok]: row of `tables` (the token's slot)
  const int32_t* tables;               // [slots][max_blocks]
  float* q_out;                        // [n_tok][n_heads*hd]
  bf16_bits* layer_cache;
};
void qkv_epilogue(const QkvEpilogue& a, int n_tok, cudaStream_t s);

// Causal attention of each token over positions 0..positions[t] of its sequence through the paged
// cache (GQA: head h reads KV head h / (n_heads / n_kv)); q pre-scaled; out bf16 [n_tok][n_heads*hd].
struct Attention {
  const float* q;
  const bf16_bits* layer_cache;
  int n_heads, n_kv, hd, block_size, max_blocks;
  const int32_t* positions;
  const int32_t* token_table;
  const int32_t* tables;
  bf16_bits* out;
};
void attention(const Attention& a, int n_tok, cudaStream_t s);

// act[t][i] = bf16(silu(gu[t][i]) * gu[t][inter + i]): the fused gate/up projection's output.
void silu_mul(const float* gu, int n_tok, int inter, bf16_bits* act, cudaStream_t s);
// dst[i] = src[rows[i]] for rows of h bf16 values.
void gather_rows(const bf16_bits* src, const int32_t* rows, int n_rows, int h, bf16_bits* dst, cudaStream_t s);
// ids[r] = argmax of logits row r (ties: the lowest id), rows of v floats.
void argmax_rows(const float* logits, int n_rows, int v, int32_t* ids, cudaStream_t s);
// dst = bf16(src), n elements (uploads of float weights).
void f32_to_bf16(const float* src, int64_t n, bf16_bits* dst, cudaStream_t s);

}  // namespace ss::cuda
