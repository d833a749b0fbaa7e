// Shared-memory pipeline primitives (sm_90): mbarriers and bulk asynchronous copies from global to
// shared memory (cp.async.bulk), as the persistent decode kernel's producer (mega.cu) and the
// chained decode kernels' streamed weights (decode.cu, SS_CUDA_DEC_BULK) use them. Private to this
// folder.
#pragma once
#include <cstdint>

namespace ss::cuda::kern::dev {

__device__ __forceinline__ uint32_t sptr(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void mbar_init(uint64_t* b, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(sptr(b)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* b, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(sptr(b)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* b) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(sptr(b)) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* b, unsigned parity) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "LAB_WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra LAB_WAIT;\n"
      "}\n" ::"r"(sptr(b)),
      "r"(parity)
      : "memory");
}
// An L2 policy under which the lines a copy brings in are the first evicted (createpolicy; not
// volatile, so the compiler hoists it out of the producer's loop).
__device__ __forceinline__ uint64_t l2_evict_first() {
  uint64_t pol;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  return pol;
}
// bytes (a multiple of 16) from global to shared, completing on bar's transaction count. The
// weights' copies, so L2 evict-first: the K/V, activations and partials the step reads again stay
// in L2 (1B batch 1 2.44 -> 2.00 ms on an H100, docs/perf/gpu-scheduling.md).
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, unsigned bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::"r"(
          sptr(dst)),
      "l"(src), "r"(bytes), "r"(sptr(bar)), "l"(l2_evict_first())
      : "memory");
}
// A 16-byte read of shared memory at a shared-window address (volatile: kept after the mbarrier
// wait that says the copy has landed).
__device__ __forceinline__ uint4 lds128(uint32_t addr) {
  uint4 r;
  asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "r"(addr));
  return r;
}
// Orders this thread's (and, after a warp or CTA barrier, its group's) generic-proxy accesses to
// shared memory before its later async-proxy ones: a slot that was read is refilled by a copy.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
// After mbar_init: the initialised barriers visible to the async proxy (the copies that complete on them).
__device__ __forceinline__ void fence_mbar_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

}  // namespace ss::cuda::kern::dev
