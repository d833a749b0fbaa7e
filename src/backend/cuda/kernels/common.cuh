// Device helpers shared by the kernels' .cu files (private to this folder).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cfloat>
#include <cstdint>

#include "backend/cuda/kernels/kernels.h"

namespace ss::cuda::kern::dev {

__device__ __forceinline__ float bf2f(uint16_t b) { return __uint_as_float(static_cast<uint32_t>(b) << 16); }
__device__ __forceinline__ uint16_t f2bf(float f) {
  const __nv_bfloat16 h = __float2bfloat16_rn(f);
  return *reinterpret_cast<const uint16_t*>(&h);
}
__device__ __forceinline__ float h2f(uint16_t b) {
  __half h;
  *reinterpret_cast<uint16_t*>(&h) = b;
  return __half2float(h);
}
// The two bf16 halves of a 32-bit word, low first.
__device__ __forceinline__ float lo_bf(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float hi_bf(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32); every thread gets the total.
__device__ __forceinline__ float block_sum(float v, float* part /* [32] shared */) {
  v = warp_sum(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  __syncthreads();  // part may still be read by a previous call
  if (lane == 0) part[warp] = v;
  __syncthreads();
  float t = lane < nw ? part[lane] : 0.0f;
  return warp_sum(t);
}

// 16 bytes from global memory that is read once (weights): no L1 allocation. Not volatile, so the
// compiler may schedule the loads freely (the data is read-only for the kernel's lifetime).
__device__ __forceinline__ uint4 ld_stream(const void* p) {
  uint4 r;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}


// Programmatic dependent launch: wait for the previous kernel in the stream (its writes visible),
// then let the next one launch. No-ops when the kernel was not launched with the PDL attribute.
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

// Rotation pair `pair` of the fused QKV rows ((n_heads + 2 n_kv) heads of hd/2 pairs): its head hh,
// its index p among the head's pairs, its two dims (p, p + rope_dim/2 NeoX or 2p, 2p + 1
// interleaved; past rope_dim and in V heads: consecutive, unrotated) and whether it rotates.
struct QkvPair {
  int hh, p, i0, i1;
  bool rotate;
};
__device__ __forceinline__ QkvPair qkv_pair(const RopeKv& a, int pair) {
  QkvPair r;
  const int pph = a.hd / 2;
  r.hh = pair / pph, r.p = pair % pph;
  const bool is_v = r.hh >= a.n_heads + a.n_kv;
  const int half = a.rope_dim / 2;
  r.rotate = !is_v && r.p < half;
  if (r.rotate) {
    r.i0 = a.interleaved ? 2 * r.p : r.p;
    r.i1 = a.interleaved ? 2 * r.p + 1 : r.p + half;
  } else if (!is_v) {
    r.i0 = a.rope_dim + 2 * (r.p - half), r.i1 = r.i0 + 1;
  } else {
    r.i0 = 2 * r.p, r.i1 = 2 * r.p + 1;
  }
  return r;
}

// The QKV projection's epilogue for one rotation pair (dims i0, i1 of fused head hh) of token b:
// bias, RoPE (when rotate; p is the pair's index in the rope table), then q (fp32) or K / V (bf16,
// paged). Shared by the CUDA-core and the tensor-core QKV kernels.
__device__ __forceinline__ void qkv_pair_out(const RopeKv& a, int b, int hh, int p, int i0, int i1, bool rotate,
                                             float v0, float v1) {
  const int64_t base = static_cast<int64_t>(hh) * a.hd;
  if (a.bias) v0 += a.bias[base + i0], v1 += a.bias[base + i1];
  const int pos = a.positions[b];
  if (rotate) {
    const float* cs = a.rope_cs + static_cast<int64_t>(pos) * a.rope_dim;
    const float c = cs[p], sn = cs[a.rope_dim / 2 + p];
    const float r0 = v0 * c - v1 * sn, r1 = v1 * c + v0 * sn;
    v0 = r0, v1 = r1;
  }
  if (hh < a.n_heads) {
    float* q = a.q_out + (static_cast<int64_t>(b) * a.n_heads + hh) * a.hd;
    q[i0] = v0, q[i1] = v1;
  } else {
    const bool is_v = hh >= a.n_heads + a.n_kv;
    const int kvh = is_v ? hh - a.n_heads - a.n_kv : hh - a.n_heads;
    const int blk = a.tables[static_cast<int64_t>(a.seq_of_token[b]) * a.max_blocks + pos / kBlockTokens];
    uint16_t* dst = a.cache + ((static_cast<int64_t>(blk) * 2 + (is_v ? 1 : 0)) * a.n_kv + kvh) * kBlockTokens * a.hd +
                    static_cast<int64_t>(pos % kBlockTokens) * a.hd;
    dst[i0] = f2bf(v0), dst[i1] = f2bf(v1);
  }
}

}  // namespace ss::cuda::kern::dev
