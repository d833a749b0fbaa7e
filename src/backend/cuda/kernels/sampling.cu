// Sampling on the device. argmax: one CTA per row, each thread scans a strided slice (coalesced),
// then warp and block reductions keep (value, lowest id). sample / logprobs: the host reference
// sampler's rules, one CTA per row over the row (and its sorted copy when truncating).
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_segmented_radix_sort.cuh>

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

// --- sampling: the host reference sampler's rules (backend/cpu/sampler.cpp) ----------------------
namespace {

constexpr int kSampleThreads = 512;  // 1024 spilled the draw kernel's registers
constexpr int kSampleWarps = kSampleThreads / 32;
using BlockScanD = cub::BlockScan<double, kSampleThreads>;
using BlockReduceD = cub::BlockReduce<double, kSampleThreads>;

__device__ __forceinline__ bool allowed(const uint32_t* mask, int words, int row, int i) {
  return !mask || ((mask[static_cast<int64_t>(row) * words + (i >> 5)] >> (i & 31)) & 1u);
}
__device__ __forceinline__ float masked(const float* logits, const uint32_t* mask, int words, int row, int V, int i) {
  return allowed(mask, words, row, i) ? logits[static_cast<int64_t>(row) * V + i] : -INFINITY;
}

struct Smem {
  union {
    BlockScanD::TempStorage scan;
    BlockReduceD::TempStorage reduce;
  };
  float fv[32];
  int iv[32];
  double d;
  int found;
};

// Block-wide (value, lowest id) argmax of the masked row; NaN never wins; nothing: 0.
__device__ int block_argmax(const float* logits, const uint32_t* mask, int words, int row, int V, Smem& sm) {
  float bv = -INFINITY;
  int bi = 0x7fffffff;
  for (int i = threadIdx.x; i < V; i += kSampleThreads) {
    const float v = masked(logits, mask, words, row, V, i);
    if (better(v, i, bv, bi)) bv = v, bi = i;
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (better(ov, oi, bv, bi)) bv = ov, bi = oi;
  }
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sm.fv[threadIdx.x >> 5] = bv, sm.iv[threadIdx.x >> 5] = bi;
  __syncthreads();
  {
    const int w = threadIdx.x & 31;  // only kSampleWarps partials exist
    bv = w < kSampleWarps ? sm.fv[w] : -INFINITY, bi = w < kSampleWarps ? sm.iv[w] : 0x7fffffff;
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (better(ov, oi, bv, bi)) bv = ov, bi = oi;
  }
  return bi == 0x7fffffff ? 0 : bi;
}

__device__ double block_sum_d(double v, Smem& sm) {
  __syncthreads();
  const double t = BlockReduceD(sm.reduce).Sum(v);
  if (threadIdx.x == 0) sm.d = t;
  __syncthreads();
  return sm.d;
}

// The host sampler's exp (backend/cpu/cpu_ops_impl.h exp_poly: the Cephes polynomial, the same
// clamps, round-to-nearest-even and fused multiply-adds, operation for operation), so a weight
// exp_poly(fma(logit, 1/T, -max/T)) has the host's bits and a draw differs from the host's only by
// the order its double sums are taken in (~1e-16 relative), not by the exponential (~1e-7).
__device__ __forceinline__ float exp_poly(float x) {
  const bool tiny = x < -87.3365478515625f;
  x = x > -87.3365478515625f ? x : -87.3365478515625f;
  x = x < 88.0f ? x : 88.0f;
  const float n = rintf(__fmul_rn(x, 1.44269504088896341f));
  float r = fmaf(-n, 0.693359375f, x);
  r = fmaf(-n, -2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = fmaf(p, r, 1.3981999507e-3f);
  p = fmaf(p, r, 8.3334519073e-3f);
  p = fmaf(p, r, 4.1665795894e-2f);
  p = fmaf(p, r, 1.6666665459e-1f);
  p = fmaf(p, r, 5.0000001201e-1f);
  p = fmaf(p, __fmul_rn(r, r), __fadd_rn(r, 1.0f));
  const float scale = __int_as_float((static_cast<int>(n) + 127) << 23);
  return tiny ? 0.0f : __fmul_rn(p, scale);
}

__device__ float block_max_f(float v, Smem& sm) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sm.fv[threadIdx.x >> 5] = v;
  __syncthreads();
  v = (threadIdx.x & 31) < kSampleWarps ? sm.fv[threadIdx.x & 31] : -INFINITY;
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// The sort's input: key = logit / T (masked: -inf; -0 made +0 so equal keys stay in id order), id.
// Only rows that truncate (top-k / top-p / min-p at a temperature) are sorted: the others get an
// empty segment (begin == end), so a greedy or plain-temperature row costs the sort nothing.
__global__ void sample_prep_k(const float* logits, int V, const RowSampling* params, const uint32_t* mask, int words,
                              float* keys, int32_t* vals, int* begins, int* ends) {
  const int row = blockIdx.x;
  const RowSampling p = params[row];
  const bool sorted = p.temperature > 0.0f && (p.top_k > 0 || p.top_p < 1.0f || p.min_p > 0.0f);
  if (threadIdx.x == 0) {
    begins[row] = row * V;
    ends[row] = sorted ? (row + 1) * V : row * V;
  }
  if (!sorted) return;
  const float inv_t = 1.0f / p.temperature;
  for (int i = threadIdx.x; i < V; i += blockDim.x) {
    keys[static_cast<int64_t>(row) * V + i] = __fmul_rn(masked(logits, mask, words, row, V, i), inv_t) + 0.0f;
    vals[static_cast<int64_t>(row) * V + i] = i;
  }
}

// Smallest j < n with (prefix sum of w over 0..j) >= target (> target when strict), -1 if none:
// chunks of the block's width, each one block scan plus the running carry.
template <class W>
__device__ int first_reaching(int n, double target, bool strict, W w, Smem& sm) {
  double carry = 0.0;
  for (int c = 0; c < n; c += kSampleThreads) {
    const int j = c + threadIdx.x;
    const double wj = j < n ? static_cast<double>(w(j)) : 0.0;
    double incl, total;
    __syncthreads();
    BlockScanD(sm.scan).InclusiveSum(wj, incl, total);
    if (threadIdx.x == 0) sm.found = 0x7fffffff;
    __syncthreads();
    const double v = carry + incl;
    if (j < n && (strict ? v > target : v >= target)) atomicMin(&sm.found, j);
    __syncthreads();
    if (sm.found != 0x7fffffff) return sm.found;
    carry += total;
  }
  return -1;
}

__global__ void __launch_bounds__(kSampleThreads) sample_draw_k(const float* logits, int V, const RowSampling* params,
                                                                const uint32_t* mask, int words, const float* skeys,
                                                                const int32_t* sids, int32_t* ids) {
  __shared__ Smem sm;
  const int row = blockIdx.x;
  const RowSampling p = params[row];
  if (p.temperature <= 0.0f) {
    const int t = block_argmax(logits, mask, words, row, V, sm);
    if (threadIdx.x == 0) ids[row] = t;
    return;
  }
  const float inv_t = 1.0f / p.temperature;
  float mx = -INFINITY;
  for (int i = threadIdx.x; i < V; i += kSampleThreads) mx = fmaxf(mx, masked(logits, mask, words, row, V, i));
  mx = block_max_f(mx, sm) * inv_t;
  if (!isfinite(inv_t) || !isfinite(mx)) {  // the greedy limit, as the host
    const int t = block_argmax(logits, mask, words, row, V, sm);
    if (threadIdx.x == 0) ids[row] = t;
    return;
  }
  const double u = sampling_uniform(p.seed, p.counter);
  const bool truncate = p.top_k > 0 || p.top_p < 1.0f || p.min_p > 0.0f;
  if (!truncate) {
    // Inverse CDF in id order: each thread owns a contiguous run of ids; one scan over the runs'
    // sums finds the run holding u * total, whose thread walks it. Weights as the host computes them
    // (one fma, exp_poly). At a temperature so small that logit / T is ~1e30, that fma leaves the
    // product's rounding error (up to ~1e23) for the best token and clamps it to 0, 1 or e^88; when
    // it is 0 no token has weight and the host falls back to the argmax: so does this.
    auto w_id = [&](int i) { return exp_poly(fmaf(masked(logits, mask, words, row, V, i), inv_t, -mx)); };
    const int per = (V + kSampleThreads - 1) / kSampleThreads;
    const int b0 = min(V, threadIdx.x * per), b1 = min(V, b0 + per);
    double run = 0.0;
    int last_w = -1;
    for (int i = b0; i < b1; ++i) {
      const float w = w_id(i);
      run += w;
      if (w > 0.0f) last_w = i;
    }
    double excl, total;
    __syncthreads();
    BlockScanD(sm.scan).ExclusiveSum(run, excl, total);
    if (threadIdx.x == 0) sm.found = 0x7fffffff;
    __syncthreads();
    double r = u * total;
    if (run > 0.0 && excl <= r && r < excl + run) {
      r -= excl;
      int pick = last_w;
      for (int i = b0; i < b1; ++i) {
        r -= static_cast<double>(w_id(i));
        if (r < 0) {
          pick = i;
          break;
        }
      }
      atomicMin(&sm.found, pick);  // two runs can both claim r only through rounding: the lower wins
    }
    __syncthreads();
    if (sm.found == 0x7fffffff) {  // rounding put r past the total: the last token with weight
      __syncthreads();
      if (threadIdx.x == 0) sm.found = -1;
      __syncthreads();
      atomicMax(&sm.found, last_w);
      __syncthreads();
    }
    if (sm.found < 0) {  // no token with weight: the host's argmax fallback
      const int t = block_argmax(logits, mask, words, row, V, sm);
      if (threadIdx.x == 0) ids[row] = t;
      return;
    }
    if (threadIdx.x == 0) ids[row] = sm.found;
    return;
  }
  // Truncation over the sorted candidates (descending key, ascending id).
  const int32_t* sid = sids + static_cast<int64_t>(row) * V;
  // Candidate j's weight from its logit, as the host's (the sorted key is logit / T rounded; the
  // host's weight is the fma of the logit, not of the key).
  auto w_at = [&](int j) { return exp_poly(fmaf(masked(logits, mask, words, row, V, sid[j]), inv_t, -mx)); };
  const int k = p.top_k > 0 ? min(p.top_k, V) : V;
  double part = 0.0;
  for (int j = threadIdx.x; j < k; j += kSampleThreads) part += w_at(j);
  const double total = block_sum_d(part, sm);
  int n = k;
  if (p.top_p < 1.0f) {
    const int f = first_reaching(k, static_cast<double>(p.top_p) * total, false, w_at, sm);
    if (f >= 0) n = f + 1;
  }
  if (p.min_p > 0.0f) {  // the host's prefix: up to the first candidate after the top one below min_p
    // (not a count of those at or above it: candidates with one sort key but different logits, or
    // exp_poly's last bit, can make the weights rise along the sorted order)
    int first = n;
    for (int j = 1 + threadIdx.x; j < n; j += kSampleThreads)
      if (!(w_at(j) >= p.min_p)) {
        first = j;
        break;
      }
    __syncthreads();
    if (threadIdx.x == 0) sm.found = n;
    __syncthreads();
    atomicMin(&sm.found, first);
    __syncthreads();
    n = sm.found;
  }
  part = 0.0;
  for (int j = threadIdx.x; j < n; j += kSampleThreads) part += w_at(j);
  const double z = block_sum_d(part, sm);
  int f = first_reaching(n, u * z, true, w_at, sm);
  if (f < 0) {  // rounding: the last candidate with weight
    int lj = 0;
    for (int j = threadIdx.x; j < n; j += kSampleThreads)
      if (w_at(j) > 0.0f) lj = max(lj, j);
    __syncthreads();
    if (threadIdx.x == 0) sm.found = 0;
    __syncthreads();
    atomicMax(&sm.found, lj);
    __syncthreads();
    f = sm.found;
  }
  if (threadIdx.x == 0) ids[row] = sid[f];
}

// The j-th most likely token is the best one strictly after the (j-1)-th in (value desc, id asc).
__global__ void __launch_bounds__(kSampleThreads) logprobs_k(const float* logits, int V, const uint32_t* mask, int words,
                                                             const int32_t* chosen, int k, float* chosen_lp,
                                                             int32_t* top_ids, float* top_lp) {
  __shared__ Smem sm;
  const int row = blockIdx.x;
  float mx = -INFINITY;
  for (int i = threadIdx.x; i < V; i += kSampleThreads) mx = fmaxf(mx, masked(logits, mask, words, row, V, i));
  mx = block_max_f(mx, sm);
  double part = 0.0;
  // The host's weights (row_logprobs: exp_poly(fma(x, 1, -max)) summed in double), so the
  // log-probabilities differ from the host's only by the order of the double sum.
  for (int i = threadIdx.x; i < V; i += kSampleThreads)
    part += static_cast<double>(exp_poly(fmaf(masked(logits, mask, words, row, V, i), 1.0f, -mx)));
  const double lse = static_cast<double>(mx) + log(block_sum_d(part, sm));
  if (threadIdx.x == 0 && chosen)
    chosen_lp[row] = static_cast<float>(masked(logits, mask, words, row, V, chosen[row]) - lse);
  float pv = INFINITY;
  int pi = -1;
  for (int j = 0; j < k; ++j) {
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    for (int i = threadIdx.x; i < V; i += kSampleThreads) {
      const float v = masked(logits, mask, words, row, V, i);
      if (better(pv, pi, v, i) && better(v, i, bv, bi)) bv = v, bi = i;
    }
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (better(ov, oi, bv, bi)) bv = ov, bi = oi;
    }
    __syncthreads();
    if ((threadIdx.x & 31) == 0) sm.fv[threadIdx.x >> 5] = bv, sm.iv[threadIdx.x >> 5] = bi;
    __syncthreads();
    {
    const int w = threadIdx.x & 31;  // only kSampleWarps partials exist
    bv = w < kSampleWarps ? sm.fv[w] : -INFINITY, bi = w < kSampleWarps ? sm.iv[w] : 0x7fffffff;
  }
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (better(ov, oi, bv, bi)) bv = ov, bi = oi;
    }
    if (bi == 0x7fffffff) bi = -1;  // fewer than k tokens that are not NaN
    if (threadIdx.x == 0) {
      top_ids[static_cast<int64_t>(row) * k + j] = bi;
      top_lp[static_cast<int64_t>(row) * k + j] = bi < 0 ? -INFINITY : static_cast<float>(bv - lse);
    }
    pv = bv, pi = bi;
    if (bi < 0) pv = -INFINITY, pi = 0x7ffffffe;  // nothing after
  }
}

struct SampleScratch {
  float *keys_in, *keys_out;
  int32_t *vals_in, *vals_out;
  int *begins, *ends;
  void* temp;
  size_t temp_bytes;
};

size_t align256(size_t n) { return (n + 255) / 256 * 256; }

SampleScratch carve(void* base, int n_rows, int V, size_t temp_bytes) {
  const size_t n = static_cast<size_t>(n_rows) * V;
  char* p = static_cast<char*>(base);
  SampleScratch s{};
  s.keys_in = reinterpret_cast<float*>(p), p += align256(n * 4);
  s.keys_out = reinterpret_cast<float*>(p), p += align256(n * 4);
  s.vals_in = reinterpret_cast<int32_t*>(p), p += align256(n * 4);
  s.vals_out = reinterpret_cast<int32_t*>(p), p += align256(n * 4);
  s.begins = reinterpret_cast<int*>(p), p += align256(static_cast<size_t>(n_rows) * 4);
  s.ends = reinterpret_cast<int*>(p), p += align256(static_cast<size_t>(n_rows) * 4);
  s.temp = p;
  s.temp_bytes = temp_bytes;
  return s;
}

size_t sort_temp_bytes(int n_rows, int V) {
  size_t bytes = 0;
  cub::DeviceSegmentedRadixSort::SortPairsDescending(nullptr, bytes, static_cast<const float*>(nullptr),
                                                     static_cast<float*>(nullptr), static_cast<const int32_t*>(nullptr),
                                                     static_cast<int32_t*>(nullptr), static_cast<int64_t>(n_rows) * V,
                                                     n_rows, static_cast<const int*>(nullptr),
                                                     static_cast<const int*>(nullptr));
  return bytes;
}

}  // namespace

size_t sample_scratch_bytes(int n_rows, int V) {
  if (n_rows <= 0 || V <= 0) return 0;
  const size_t n = static_cast<size_t>(n_rows) * V;
  return 4 * align256(n * 4) + 2 * align256(static_cast<size_t>(n_rows) * 4) + sort_temp_bytes(n_rows, V);
}

Status sample(const float* logits, int n_rows, int V, const RowSampling* params, const uint32_t* bitmask,
              int words_per_row, void* scratch, size_t scratch_bytes, int32_t* ids, cudaStream_t s) {
  if (V <= 0 || n_rows < 0 || static_cast<int64_t>(n_rows) * V > 2147483647LL)
    return make_error("sample: bad shape (rows=" + std::to_string(n_rows) + ", V=" + std::to_string(V) + ")");
  if (bitmask && words_per_row < (V + 31) / 32)
    return make_error("sample: bitmask rows need " + std::to_string((V + 31) / 32) + " words");
  if (n_rows == 0) return {};
  const size_t need = sample_scratch_bytes(n_rows, V);
  if (!scratch || scratch_bytes < need)
    return make_error("sample: scratch of " + std::to_string(need) + " bytes needed, got " + std::to_string(scratch_bytes));
  const size_t temp = sort_temp_bytes(n_rows, V);
  SampleScratch sc = carve(scratch, n_rows, V, temp);
  sample_prep_k<<<n_rows, 256, 0, s>>>(logits, V, params, bitmask, words_per_row, sc.keys_in, sc.vals_in, sc.begins,
                                       sc.ends);
  SS_CUDA_LAUNCHED();
  size_t tb = sc.temp_bytes;
  SS_CUDA_TRY(cub::DeviceSegmentedRadixSort::SortPairsDescending(sc.temp, tb, sc.keys_in, sc.keys_out, sc.vals_in,
                                                                 sc.vals_out, static_cast<int64_t>(n_rows) * V, n_rows,
                                                                 sc.begins, sc.ends, 0, 32, s));
  sample_draw_k<<<n_rows, kSampleThreads, 0, s>>>(logits, V, params, bitmask, words_per_row, sc.keys_out, sc.vals_out,
                                                  ids);
  SS_CUDA_LAUNCHED();
  return {};
}

namespace {
__global__ void edit_logits_k(float* logits, int V, const LogitEdit* edits, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const LogitEdit e = edits[i];
  float& slot = logits[static_cast<int64_t>(e.row) * V + e.id];
  float l = slot;
  if (e.flags & kEditBan) l = -INFINITY;
  if (e.flags & kEditAdd) l = __fadd_rn(l, e.add);
  if (e.flags & kEditRep) l = l > 0.0f ? __fdiv_rn(l, e.rep) : __fmul_rn(l, e.rep);
  if (e.flags & kEditSub) l = __fsub_rn(l, e.sub);
  slot = l;
}
}  // namespace

Status edit_logits(float* logits, int V, const LogitEdit* edits, int n, cudaStream_t s) {
  if (V <= 0 || n < 0) return make_error("edit_logits: bad shape");
  if (n == 0) return {};
  edit_logits_k<<<(n + 255) / 256, 256, 0, s>>>(logits, V, edits, n);
  SS_CUDA_LAUNCHED();
  return {};
}

Status logprobs(const float* logits, int n_rows, int V, const uint32_t* bitmask, int words_per_row,
                const int32_t* chosen, int k, float* chosen_lp, int32_t* top_ids, float* top_lp, cudaStream_t s) {
  if (V <= 0 || n_rows < 0 || k < 0 || k > 64) return make_error("logprobs: bad shape or k outside 0..64");
  if (bitmask && words_per_row < (V + 31) / 32)
    return make_error("logprobs: bitmask rows need " + std::to_string((V + 31) / 32) + " words");
  if (n_rows == 0) return {};
  logprobs_k<<<n_rows, kSampleThreads, 0, s>>>(logits, V, bitmask, words_per_row, chosen, k, chosen_lp, top_ids, top_lp);
  SS_CUDA_LAUNCHED();
  return {};
}

}  // namespace ss::cuda::kern
