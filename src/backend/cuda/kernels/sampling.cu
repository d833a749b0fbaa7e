// Sampling on the device. argmax: one CTA per row, each thread scans a strided slice (coalesced),
// then warp and block reductions keep (value, lowest id).
#include <string>

#include "backend/cuda/kernels/common.cuh"

namespace ss::cuda::kern {
namespace {

constexpr int kArgmaxThreads = 1024;

// a better than b: larger value, or equal and lower id; NaN (never > or ==) never wins.
__device__ __forceinline__ bool better(float av, int ai, float bv, int bi) {
  return av > bv || (av == bv && ai < bi);
}

__global__ void __launch_bounds__(kArgmaxThreads) argmax_k(const float* logits, int V, int32_t* ids) {
  const float* row = logits + static_cast<int64_t>(blockIdx.x) * V;
  float bv = -INFINITY;
  int bi = 0x7fffffff;
  for (int i = threadIdx.x; i < V; i += kArgmaxThreads) {
    const float v = row[i];
    if (better(v, i, bv, bi)) bv = v, bi = i;
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (better(ov, oi, bv, bi)) bv = ov, bi = oi;
  }
  __shared__ float sv[32];
  __shared__ int si[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) sv[warp] = bv, si[warp] = bi;
  __syncthreads();
  if (warp == 0) {
    bv = sv[lane], bi = si[lane];
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (better(ov, oi, bv, bi)) bv = ov, bi = oi;
    }
    // -inf everywhere: the lowest -inf id; all NaN: no pick, id 0 (as the host's argmax).
    if (lane == 0) ids[blockIdx.x] = bi == 0x7fffffff ? 0 : bi;
  }
}

}  // namespace

Status argmax(const float* logits, int n_rows, int V, int32_t* ids, cudaStream_t s) {
  if (V <= 0 || n_rows < 0) return make_error("argmax: bad shape (V=" + std::to_string(V) + ")");
  if (n_rows == 0) return {};
  argmax_k<<<n_rows, kArgmaxThreads, 0, s>>>(logits, V, ids);
  SS_CUDA_LAUNCHED();
  return {};
}

}  // namespace ss::cuda::kern
