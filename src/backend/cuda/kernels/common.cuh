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
// compiler may schedule the loads freely (the data is read-only for the kernel's lifetime). No L2
// policy: evict-first measured nothing here (docs/perf/gpu.md, 2026-12-06 05:23 UTC), unlike in
// the persistent kernel's copies.
__device__ __forceinline__ uint4 ld_stream(const void* p) {
  uint4 r;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}


// d += A (16 x 16, bf16, row) * B (16 x 8, bf16, col), fp32 accumulate.
__device__ __forceinline__ void mma_bf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// d += A (16x32 u8, row) x B (32x8 s8, col) in s32: a0/a2 row g (K 4t..4t+3 / 16+4t..), a1/a3 row g + 8,
// b0/b1 column g (K 4t.. / 16+4t..), d as mma_bf16's.
__device__ __forceinline__ void mma_u8s8(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// The same with s8 weights.
__device__ __forceinline__ void mma_s8s8(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// 16-byte asynchronous copy global -> shared (cp.async, L2 only); zero-fills the 16 bytes when !valid
// (src is then not read, but must still be a global address).
__device__ __forceinline__ void cp_async16(void* smem, const void* src, bool valid) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// Four 8x8 b16 matrices from shared memory (lane l gives the address of row l % 8 of matrix l / 8);
// .trans hands each thread a column pair instead of a row pair.
__device__ __forceinline__ void ldsm_x4(const void* p, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(s));
}
__device__ __forceinline__ void ldsm_x4_t(const void* p, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(s));
}

// Two floats as a bf16 pair, the first in the low half (the lower k of an mma operand).
__device__ __forceinline__ uint32_t pack_bf2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// The chain's phase trace (SS_CUDA_CHAIN_TRACE=1, benchmarking only): a kernel given a slot of
// kChainPhases stamps writes %globaltimer at its phases from CTA 0's thread 0 (slot[0..6]), and every
// CTA's thread 0 raises slot[7] to the time it leaves (the kernel's last CTA). Null: nothing.
__device__ __forceinline__ unsigned long long gtimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ void phase(unsigned long long* slot, int i) {  // slot: CTA 0's, else null
  if (slot && threadIdx.x == 0) slot[i] = gtimer();
}
__device__ __forceinline__ void phase_leave(unsigned long long* slot) {  // every CTA's, at its exit
  if (slot && threadIdx.x == 0) atomicMax(slot + kChainPhases - 1, gtimer());
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
// What qkv_pair_out reads besides the products and the bias, none of it written by a kernel of the
// step: the position, the rotation's cos and sin, the KV block (K and V rows). The fused decode reads
// it before its dependency wait (QkvIn::load), off the chain's critical path.
struct QkvIn {
  int pos = 0, blk = 0;
  float c = 1.0f, sn = 0.0f;
  __device__ __forceinline__ static QkvIn load(const RopeKv& a, int b, int hh, int p, bool rotate) {
    QkvIn r;
    r.pos = a.positions[b];
    if (rotate) {
      const float* cs = a.rope_cs + static_cast<int64_t>(r.pos) * a.rope_dim;
      r.c = cs[p], r.sn = cs[a.rope_dim / 2 + p];
    }
    if (hh >= a.n_heads) r.blk = a.tables[static_cast<int64_t>(a.seq_of_token[b]) * a.max_blocks + r.pos / kBlockTokens];
    return r;
  }
};

__device__ __forceinline__ void qkv_pair_out(const RopeKv& a, int b, int hh, int i0, int i1, bool rotate, float v0,
                                             float v1, const QkvIn& in) {
  if (a.bias) {
    const int64_t base = static_cast<int64_t>(hh) * a.hd;
    v0 += a.bias[base + i0], v1 += a.bias[base + i1];
  }
  if (rotate) {
    const float r0 = v0 * in.c - v1 * in.sn, r1 = v1 * in.c + v0 * in.sn;
    v0 = r0, v1 = r1;
  }
  if (hh < a.n_heads) {
    float* q = a.q_out + (static_cast<int64_t>(b) * a.n_heads + hh) * a.hd;
    q[i0] = v0, q[i1] = v1;
  } else {
    const bool is_v = hh >= a.n_heads + a.n_kv;
    const int kvh = is_v ? hh - a.n_heads - a.n_kv : hh - a.n_heads;
    uint16_t* dst = a.cache + ((static_cast<int64_t>(in.blk) * 2 + (is_v ? 1 : 0)) * a.n_kv + kvh) * kBlockTokens * a.hd +
                    static_cast<int64_t>(in.pos % kBlockTokens) * a.hd;
    dst[i0] = f2bf(v0), dst[i1] = f2bf(v1);
  }
}
__device__ __forceinline__ void qkv_pair_out(const RopeKv& a, int b, int hh, int p, int i0, int i1, bool rotate,
                                             float v0, float v1) {
  qkv_pair_out(a, b, hh, i0, i1, rotate, v0, v1, QkvIn::load(a, b, hh, p, rotate));
}

}  // namespace ss::cuda::kern::dev
