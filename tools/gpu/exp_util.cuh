// What the GPU experiments of tools/gpu (exp_layout, exp_chain, exp_stages) share: a CUDA call that
// must succeed, a 16-byte streaming load folded into a word (the loads-alone experiments), and the
// median of event-timed repetitions.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                                  \
  do {                                                                                         \
    cudaError_t e_ = (x);                                                                      \
    if (e_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)

// 16 bytes read once (no L1 allocation); volatile, so the experiments' loads are all issued.
__device__ __forceinline__ uint4 ld_stream(const void* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}
__device__ __forceinline__ uint32_t fold(uint4 v) { return v.x ^ v.y ^ v.z ^ v.w; }

// The median of reps runs of fn(i) on stream s, in microseconds, after warmups untimed runs
// (fn(0) .. fn(warmups - 1)); run i of the timed ones gets i (e.g. to rotate over copies of the data).
template <class F>
float median_us(cudaStream_t s, int warmups, int reps, F&& fn) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (int i = 0; i < warmups; ++i) fn(i);
  CK(cudaStreamSynchronize(s));
  std::vector<float> ts;
  for (int i = 0; i < reps; ++i) {
    CK(cudaEventRecord(e0, s));
    fn(i);
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    ts.push_back(ms * 1000.0f);
  }
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  std::sort(ts.begin(), ts.end());
  return ts[ts.size() / 2];
}
