// The K-quant super-block arithmetic the packed layouts (pack.cpp) and the decode kernels (decode.cu)
// share, on the host and the device alike. Private to backend/cuda/kernels.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define SS_KQ_HD __host__ __device__ __forceinline__
#else
#define SS_KQ_HD inline
#endif

namespace ss::cuda::kern {

// Sub-block j's (0..7) 6-bit scale and min from the 12 scale bytes of a Q4_K super-block header
// (ggml's get_scale_min_k4).
SS_KQ_HD void k4_scale_min(int j, const uint8_t* q, int* sc, int* mn) {
  if (j < 4) {
    *sc = q[j] & 63;
    *mn = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

}  // namespace ss::cuda::kern
