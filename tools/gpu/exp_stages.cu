// Experiment A of issue 17 (docs/perf/gpu-scheduling.md): twenty dependent stages, each a fixed
// amount of work on every SM, run six ways:
//   host-sync   one launch per stage, the host waits for each
//   stream      20 launches queued on one stream
//   graph       one CUDA graph of the 20 launches
//   p-barrier   one persistent kernel, a grid-wide barrier between stages (all-to-all dependency)
//   p-tiles     one persistent kernel, each tile waits only for the tiles it reads
//               (memory-bound stages: and prefetches its next weights while it waits)
//   p-fed       p-tiles, its stage descriptors pushed by the CPU through the submission ring
//               (mapped host memory) after the launch, instead of preloaded in device memory
// plus, for memory-bound stages, p-tiles-noprefetch, to show what the prefetch is worth.
//
// Stages: compute-bound (dependent FMA chains sized to ~1/5/15 µs; tile t of stage s reads tiles
// t-1, t, t+1 of stage s-1) and memory-bound (a bf16 GEMV y = W_s x per stage, each tile its rows,
// every tile reads all of x: the dependency is all-to-all by nature, so "per tile" there means a
// per-stage arrival counter that a tile can wait on after doing other useful work — the prefetch).
//
// Overhead per stage = (T(20) - 20·T1) / 20 for every variant, with one T1 per configuration:
// T1 = [T(one launch doing the 20 stages' work with no dependency between stages) - T(empty
// launch)] / 20, i.e. the stage's work with launch and dependency costs taken out.
// Every time is the median of many event-timed runs after warm-up. Every variant's outputs are
// checked against a CPU reference on a run whose outputs were poisoned (NaN) first.
//
// usage: exp_stages [reps] (default 200)
#include <cuda_pipeline.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backend/cuda/queues/queues.h"
#include "exp_util.cuh"

namespace {

using namespace ss::queues;

constexpr int kStages = 20;
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kUnroll = 8;  // 16-byte weight loads in flight per lane
constexpr float kThird = 1.0f / 3.0f;

enum Mode { kCompute = 0, kMemory = 1 };
enum Dep { kBarrier = 0, kTiles = 1, kTilesPrefetch = 2 };

struct alignas(16) StageDesc {  // what the CPU submits per stage
  unsigned long long weights;   // memory-bound: W_s (bf16, dim x dim)
  unsigned int iters;           // compute-bound: FMA iterations per chain
  unsigned int stage;
  unsigned int epoch;
  unsigned int pad[3];
};
static_assert(sizeof(StageDesc) == 32);

using FeedRing = SubmissionRing<StageDesc>::Ring;

struct Problem {
  int tiles;          // one per SM; every variant uses the same tiles
  float* act;         // compute: [kStages+1][tiles][kThreads]
  float a, b;         // compute: x <- fma(x, a, b)
  int dim;            // memory: W is dim x dim, dim = tiles * rows_per_tile
  int rows_per_tile;  // memory: a multiple of kWarps
  float* vec;         // memory: [kStages+1][dim]; vec[s+1] = W_s vec[s]
};

// Counters the persistent variants synchronise through; zeroed before each series. Monotonic
// across the runs of a series (run e waits for e·tiles arrivals), so nothing is reset in between.
struct Sync {
  alignas(128) unsigned long long barrier;   // grid-barrier arrivals
  alignas(128) unsigned long long avail;     // stage descriptors published by the feeder
  alignas(128) unsigned long long ring_pos;  // the feeder's position in the submission ring
  struct alignas(128) Line {
    unsigned long long v;
  } stage_done[kStages];                     // memory-bound p-tiles: tiles done per stage
};

// ---- device helpers --------------------------------------------------------------------------
__device__ __forceinline__ void wait_geq(unsigned long long* c, unsigned long long target) {
  AtomicRef<unsigned long long, kDevice> r(*c);
  while (r.load(memory_order_acquire) < target) {
  }
}
__device__ __forceinline__ void wait_geq(unsigned int* c, unsigned int target) {
  AtomicRef<unsigned int, kDevice> r(*c);
  while (r.load(memory_order_acquire) < target) {
  }
}

__device__ __forceinline__ StageDesc load_desc(const StageDesc* d) {
  // L2 loads: a fed kernel's descriptors are written during the launch by another SM.
  const uint4* p = reinterpret_cast<const uint4*>(d);
  uint4 w[2] = {__ldcg(p), __ldcg(p + 1)};
  StageDesc out;
  std::memcpy(&out, w, sizeof out);
  return out;
}

// One compute-bound stage for tile t: mix the inputs, then 4 independent FMA chains (enough
// independent work per warp to keep the FMA pipes busy), then combine. __f*_rn: never contracted,
// so the CPU reference gets the same bits.
__device__ void compute_stage(const Problem& P, int s, int t, unsigned iters, bool own_tile_only) {
  const float* in = P.act + static_cast<size_t>(s) * P.tiles * kThreads;
  float* out = P.act + static_cast<size_t>(s + 1) * P.tiles * kThreads;
  const int i = threadIdx.x;
  const int tl = own_tile_only ? t : (t + P.tiles - 1) % P.tiles;
  const int tr = own_tile_only ? t : (t + 1) % P.tiles;
  const float x = __fmul_rn(
      __fadd_rn(__fadd_rn(__ldcg(in + tl * kThreads + i), __ldcg(in + t * kThreads + i)), __ldcg(in + tr * kThreads + i)),
      kThird);
  float x0 = x, x1 = __fadd_rn(x, 0.25f), x2 = __fadd_rn(x, 0.5f), x3 = __fadd_rn(x, 0.75f);
  for (unsigned k = 0; k < iters; ++k) {
    x0 = fmaf(x0, P.a, P.b);
    x1 = fmaf(x1, P.a, P.b);
    x2 = fmaf(x2, P.a, P.b);
    x3 = fmaf(x3, P.a, P.b);
  }
  out[t * kThreads + i] = __fmul_rn(__fadd_rn(__fadd_rn(x0, x1), __fadd_rn(x2, x3)), 0.25f);
}

__device__ __forceinline__ float dot8(uint4 w, const float* x, float acc) {
  const float4 xa = __ldcg(reinterpret_cast<const float4*>(x));
  const float4 xb = __ldcg(reinterpret_cast<const float4*>(x) + 1);
  acc = fmaf(__uint_as_float(w.x << 16), xa.x, acc);
  acc = fmaf(__uint_as_float(w.x & 0xffff0000u), xa.y, acc);
  acc = fmaf(__uint_as_float(w.y << 16), xa.z, acc);
  acc = fmaf(__uint_as_float(w.y & 0xffff0000u), xa.w, acc);
  acc = fmaf(__uint_as_float(w.z << 16), xb.x, acc);
  acc = fmaf(__uint_as_float(w.z & 0xffff0000u), xb.y, acc);
  acc = fmaf(__uint_as_float(w.w << 16), xb.z, acc);
  acc = fmaf(__uint_as_float(w.w & 0xffff0000u), xb.w, acc);
  return acc;
}

// One memory-bound stage for tile t: rows [t·rpt, (t+1)·rpt) of y = W x, a warp per row, 16-byte
// loads, kUnroll of them in flight per lane. The weights come from global memory or, already
// prefetched, from shared memory (same loop, same summation order).
template <bool FromSmem>
__device__ void gemv_stage(const Problem& P, const unsigned short* W, const float* x, float* y, int t,
                           const uint4* smem_w) {
  const int nv = P.dim / 8;
  const int r0 = t * P.rows_per_tile;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int lr = warp; lr < P.rows_per_tile; lr += kWarps) {
    const uint4* row = FromSmem ? smem_w + static_cast<size_t>(lr) * nv
                                : reinterpret_cast<const uint4*>(W + static_cast<size_t>(r0 + lr) * P.dim);
    float acc = 0.f;
    for (int base = lane; base < nv; base += 32 * kUnroll) {
      uint4 w[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int idx = base + 32 * u;
        w[u] = idx < nv ? (FromSmem ? row[idx] : __ldg(row + idx)) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int idx = base + 32 * u;
        if (idx < nv) acc = dot8(w[u], x + static_cast<size_t>(idx) * 8, acc);
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) y[r0 + lr] = acc;
  }
}

// Starts copying this tile's rows of W into shared memory (cp.async, 16 bytes per thread per step);
// the caller waits with __pipeline_wait_prior(0) + __syncthreads() when it needs them.
__device__ void prefetch_rows(const Problem& P, const unsigned short* W, int t, uint4* smem_w) {
  const size_t nv = static_cast<size_t>(P.rows_per_tile) * (P.dim / 8);
  const uint4* src = reinterpret_cast<const uint4*>(W + static_cast<size_t>(t) * P.rows_per_tile * P.dim);
  for (size_t i = threadIdx.x; i < nv; i += kThreads) __pipeline_memcpy_async(smem_w + i, src + i, 16);
  __pipeline_commit();
}

// The feeder: one warp of block 0 pops stage descriptors from the submission ring (slots in mapped
// host memory) until `target` have been published. Each lane tests one position, so one round trip
// over the bus covers up to 32 descriptors. Only this warp touches ring_pos and avail; the ring is
// popped on its RMW-free single-consumer path.
__device__ void feed(FeedRing ring, Sync* sync, StageDesc* desc, unsigned long long target) {
  const unsigned lane = threadIdx.x % 32;
  unsigned long long pos = sync->ring_pos;
  unsigned long long have = AtomicRef<unsigned long long, kDevice>(sync->avail).load(memory_order_relaxed);
  // No sleep between polls: each poll is itself a bus round trip, which paces the loop.
  while (have < target) {
    const unsigned ready = __ballot_sync(0xffffffffu, ring.ready(pos + lane));
    const int n = ready == 0xffffffffu ? 32 : __ffs(~ready) - 1;  // the published prefix
    if (static_cast<int>(lane) < n) {
      const StageDesc d = ring.value(pos + lane);
      if (d.stage < kStages) desc[d.stage] = d;
      ring.retire(pos + lane);
      __threadfence();  // belt and braces: the desc store is device-visible before avail moves
    }
    __syncwarp();  // orders the lanes' desc stores before lane 0's release below
    if (n > 0) {
      pos += static_cast<unsigned long long>(n);
      have += static_cast<unsigned long long>(n);
      if (lane == 0) AtomicRef<unsigned long long, kDevice>(sync->avail).store(have, memory_order_release);
    }
  }
  if (lane == 0) sync->ring_pos = pos;
  __syncwarp();
}

// ---- kernels ---------------------------------------------------------------------------------
template <int M>
__global__ void __launch_bounds__(kThreads) stage_kernel(Problem P, int s, StageDesc d) {
  if constexpr (M == kCompute) {
    compute_stage(P, s, blockIdx.x, d.iters, false);
  } else {
    gemv_stage<false>(P, reinterpret_cast<const unsigned short*>(d.weights), P.vec + static_cast<size_t>(s) * P.dim,
                      P.vec + static_cast<size_t>(s + 1) * P.dim, blockIdx.x, nullptr);
  }
}

// T1's kernel: the same 20 stages' work, no dependency between tiles or stages.
template <int M>
__global__ void __launch_bounds__(kThreads) nodep_kernel(Problem P, const StageDesc* desc) {
  for (int s = 0; s < kStages; ++s) {
    const StageDesc d = load_desc(desc + s);
    if constexpr (M == kCompute) {
      compute_stage(P, s, blockIdx.x, d.iters, true);  // each thread reads only what it wrote
    } else {
      gemv_stage<false>(P, reinterpret_cast<const unsigned short*>(d.weights), P.vec,
                        P.vec + static_cast<size_t>(s + 1) * P.dim, blockIdx.x, nullptr);
    }
  }
}

__global__ void empty_kernel() {}

// Keeps every SM issuing for `ns`: brings the clocks up after the CPU-side work between series.
__global__ void busy_kernel(unsigned long long ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}

template <int M, int D, bool Fed>
__global__ void __launch_bounds__(kThreads, 1)
    persistent_kernel(Problem P, StageDesc* desc, Sync* sync, unsigned int* flags, FeedRing ring, unsigned int epoch) {
  extern __shared__ uint4 smem_w[];
  const int t = blockIdx.x, T = P.tiles;
  const unsigned long long stage_base = static_cast<unsigned long long>(epoch - 1) * kStages;
  for (int s = 0; s < kStages; ++s) {
    if constexpr (Fed) {
      if (t == 0 && threadIdx.x < 32) feed(ring, sync, desc, stage_base + s + 1);
      if (threadIdx.x == 0) wait_geq(&sync->avail, stage_base + s + 1);
      __syncthreads();
    }
    const StageDesc d = load_desc(desc + s);
    const auto* W = reinterpret_cast<const unsigned short*>(d.weights);
    if constexpr (M == kMemory && D == kTilesPrefetch) prefetch_rows(P, W, t, smem_w);  // before the wait
    if constexpr (D != kBarrier) {  // wait for exactly what this tile reads
      if (s > 0) {
        if constexpr (M == kCompute) {
          if (threadIdx.x < 3) {
            const int nb = (t + T - 1 + static_cast<int>(threadIdx.x)) % T;  // t-1, t, t+1
            wait_geq(&flags[(s - 1) * T + nb], epoch);
          }
        } else {
          if (threadIdx.x == 0)
            wait_geq(&sync->stage_done[s - 1].v, static_cast<unsigned long long>(epoch) * static_cast<unsigned>(T));
        }
      }
      if constexpr (M == kMemory && D == kTilesPrefetch) __pipeline_wait_prior(0);
      __syncthreads();
    }
    if constexpr (M == kCompute) {
      compute_stage(P, s, t, d.iters, false);
    } else {
      const float* x = P.vec + static_cast<size_t>(s) * P.dim;
      float* y = P.vec + static_cast<size_t>(s + 1) * P.dim;
      if constexpr (D == kTilesPrefetch) {
        gemv_stage<true>(P, W, x, y, t, smem_w);
      } else {
        gemv_stage<false>(P, W, x, y, t, nullptr);
      }
    }
    if (s == kStages - 1) break;  // nobody waits on the last stage: the kernel's end is its signal
    __syncthreads();               // the whole tile is written (and the smem buffer free)
    if (threadIdx.x == 0) {        // release: cumulative over the block's writes, via the barrier
      if constexpr (D == kBarrier) {
        AtomicRef<unsigned long long, kDevice>(sync->barrier).fetch_add(1, memory_order_release);
        const unsigned long long boundary = static_cast<unsigned long long>(epoch - 1) * (kStages - 1) + s + 1;
        wait_geq(&sync->barrier, boundary * static_cast<unsigned>(T));
      } else if constexpr (M == kCompute) {
        AtomicRef<unsigned int, kDevice>(flags[s * T + t]).store(epoch, memory_order_release);
      } else {
        AtomicRef<unsigned long long, kDevice>(sync->stage_done[s].v).fetch_add(1, memory_order_release);
      }
    }
    if constexpr (D == kBarrier) __syncthreads();
  }
}

// ---- host side ---------------------------------------------------------------------------------
enum Variant { kHostSync, kStream, kGraph, kPBarrier, kPTiles, kPTilesNoPrefetch, kPFed, kVariants };
const char* kVariantNames[kVariants] = {"host launch+sync", "20 stream launches", "one CUDA graph",
                                        "persistent, grid barrier", "persistent, per-tile deps",
                                        "persistent, per-tile, no prefetch", "persistent, per-tile, host-fed"};

struct Stats {
  double median = 0, p10 = 0, p90 = 0;
};
Stats stats_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  auto at = [&](double q) { return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1))]; };
  return {at(0.5), at(0.1), at(0.9)};
}

unsigned short to_bf16(float f) {  // round to nearest even
  unsigned int u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<unsigned short>(u >> 16);
}
float from_bf16(unsigned short h) {
  const unsigned int u = static_cast<unsigned int>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

template <class F>
void parallel_for(int n, F f) {
  const int workers = std::max(1, std::min(n, static_cast<int>(std::thread::hardware_concurrency())));
  std::vector<std::thread> ts;
  for (int w = 0; w < workers; ++w)
    ts.emplace_back([&, w] {
      for (int i = w; i < n; i += workers) f(i);
    });
  for (auto& t : ts) t.join();
}

// CPU references: the same arithmetic as the device for compute stages (bit-identical), double
// accumulation for the GEMV.
std::vector<float> reference_compute(const Problem& P, const std::vector<float>& act0, unsigned iters) {
  const size_t layer = static_cast<size_t>(P.tiles) * kThreads;
  std::vector<float> act(layer * (kStages + 1));
  std::copy(act0.begin(), act0.end(), act.begin());
  for (int s = 0; s < kStages; ++s) {
    const float* in = act.data() + s * layer;
    float* out = act.data() + (s + 1) * layer;
    parallel_for(P.tiles, [&](int t) {
      const int tl = (t + P.tiles - 1) % P.tiles, tr = (t + 1) % P.tiles;
      for (int i = 0; i < kThreads; ++i) {
        const float x = ((in[tl * kThreads + i] + in[t * kThreads + i]) + in[tr * kThreads + i]) * kThird;
        float x0 = x, x1 = x + 0.25f, x2 = x + 0.5f, x3 = x + 0.75f;
        for (unsigned k = 0; k < iters; ++k) {
          x0 = std::fmaf(x0, P.a, P.b);
          x1 = std::fmaf(x1, P.a, P.b);
          x2 = std::fmaf(x2, P.a, P.b);
          x3 = std::fmaf(x3, P.a, P.b);
        }
        out[t * kThreads + i] = ((x0 + x1) + (x2 + x3)) * 0.25f;
      }
    });
  }
  return std::vector<float>(act.begin() + static_cast<long>(layer), act.end());
}

std::vector<float> reference_gemv(const Problem& P, const std::vector<unsigned short>& w_host,
                                  const std::vector<float>& x0) {
  const size_t n = static_cast<size_t>(P.dim);
  std::vector<double> x(x0.begin(), x0.end()), y(n);
  std::vector<float> out;
  for (int s = 0; s < kStages; ++s) {
    const unsigned short* W = w_host.data() + static_cast<size_t>(s) * n * n;
    parallel_for(P.dim, [&](int r) {
      double acc = 0;
      for (size_t k = 0; k < n; ++k) acc += static_cast<double>(from_bf16(W[r * n + k])) * x[k];
      y[static_cast<size_t>(r)] = acc;
    });
    x = y;
    for (double v : y) out.push_back(static_cast<float>(v));
  }
  return out;
}

// ‖got − ref‖ / ‖ref‖ over all stages' outputs; NaN (a poisoned value never overwritten) → inf.
double rel_error(const std::vector<float>& got, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    const double d = static_cast<double>(got[i]) - ref[i];
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return std::sqrt(num / (den > 0 ? den : 1));
}

struct Config {
  const char* name;
  Mode mode;
  double target_us;   // compute: the stage's length to calibrate to
  int rows_per_tile;  // memory: rows of W per tile
};

struct Row {
  std::string config;
  double t1_us;
  Variant v;
  Stats s;
  double err;
};

class Experiment {
 public:
  Experiment(int reps) : reps_(reps) {
    CK(cudaSetDevice(0));
    CK(cudaGetDeviceProperties(&prop_, 0));
    // A blocking stream: ordered after the setup copies and memsets on the legacy default stream
    // (a pageable cudaMemcpy may return before its DMA lands).
    CK(cudaStreamCreate(&st_));
    CK(cudaEventCreate(&ev0_));
    CK(cudaEventCreate(&ev1_));
    tiles_ = prop_.multiProcessorCount;
    CK(cudaMalloc(&sync_, sizeof(Sync)));
    CK(cudaMalloc(&flags_, sizeof(unsigned int) * kStages * static_cast<size_t>(tiles_)));
    CK(cudaMalloc(&fed_desc_, sizeof(StageDesc) * kStages));
  }

  void run(const Config& c, std::vector<Row>& rows) {
    Problem P{};
    P.tiles = tiles_;
    P.a = 0.9999f;  // x <- 0.9999 x + 1e-4: bounded, and still input-dependent after 15 µs of it
    P.b = 1e-4f;
    const unsigned seed = std::random_device{}();  // fresh inputs every run; printed to reproduce
    std::mt19937 rng(seed);
    std::printf("%s: seed %u\n", c.name, seed);
    std::vector<float> ref;
    std::vector<StageDesc> descs(kStages);
    std::vector<std::vector<StageDesc>> desc_sets;
    size_t out_elems = 0, smem = 0;
    float* out_dev = nullptr;
    std::vector<void*> owned;

    if (c.mode == kCompute) {
      const size_t layer = static_cast<size_t>(tiles_) * kThreads;
      CK(cudaMalloc(&P.act, sizeof(float) * layer * (kStages + 1)));
      owned.push_back(P.act);
      std::vector<float> act0(layer);
      std::uniform_real_distribution<float> u(-1.f, 1.f);
      for (auto& v : act0) v = u(rng);
      CK(cudaMemcpy(P.act, act0.data(), sizeof(float) * layer, cudaMemcpyHostToDevice));
      warm_clocks();
      const unsigned iters = calibrate(P, c.target_us);
      for (int s = 0; s < kStages; ++s) descs[s] = StageDesc{0, iters, static_cast<unsigned>(s), 0, {}};
      desc_sets = {descs};
      ref = reference_compute(P, act0, iters);
      out_dev = P.act + layer;
      out_elems = layer * kStages;
    } else {
      P.rows_per_tile = c.rows_per_tile;
      P.dim = tiles_ * c.rows_per_tile;
      const size_t n = static_cast<size_t>(P.dim);
      smem = static_cast<size_t>(c.rows_per_tile) * n * 2;
      if (smem > prop_.sharedMemPerBlockOptin) {
        std::printf("%s: %zu bytes of weights per tile exceed shared memory (%zu): skipped\n", c.name, smem,
                    static_cast<size_t>(prop_.sharedMemPerBlockOptin));
        return;
      }
      CK(cudaMalloc(&P.vec, sizeof(float) * n * (kStages + 1)));
      owned.push_back(P.vec);
      std::vector<float> x0(n);
      std::normal_distribution<float> g(0.f, 1.f);
      for (auto& v : x0) v = g(rng);
      CK(cudaMemcpy(P.vec, x0.data(), sizeof(float) * n, cudaMemcpyHostToDevice));
      // Enough weight sets that one run's bytes never sit in L2 from the run before (3× L2).
      const size_t set_bytes = n * n * 2 * kStages;
      const int sets = static_cast<int>(std::max<size_t>(1, (3 * static_cast<size_t>(prop_.l2CacheSize) + set_bytes - 1) / set_bytes));
      std::vector<unsigned short> w_host(n * n * kStages);
      std::uniform_real_distribution<float> u(-1.f, 1.f);
      const float scale = std::sqrt(3.f / static_cast<float>(n));  // keeps |W x| ≈ |x|
      for (auto& v : w_host) v = to_bf16(u(rng) * scale);
      for (int k = 0; k < sets; ++k) {  // every set holds the same values: any set gives `ref`
        unsigned short* w = nullptr;
        CK(cudaMalloc(&w, w_host.size() * 2));
        owned.push_back(w);
        CK(cudaMemcpy(w, w_host.data(), w_host.size() * 2, cudaMemcpyHostToDevice));
        std::vector<StageDesc> d(kStages);
        for (int s = 0; s < kStages; ++s)
          d[s] = StageDesc{reinterpret_cast<unsigned long long>(w + static_cast<size_t>(s) * n * n), 0,
                           static_cast<unsigned>(s), 0, {}};
        desc_sets.push_back(d);
      }
      ref = reference_gemv(P, w_host, x0);
      out_dev = P.vec + n;
      out_elems = n * kStages;
      std::printf("%s: W %d x %d bf16 = %.2f MB per stage, %d weight set(s) of %.0f MB\n", c.name, P.dim, P.dim,
                  static_cast<double>(n * n * 2) / 1e6, sets, static_cast<double>(set_bytes) / 1e6);
    }
    StageDesc* desc_dev = nullptr;  // all sets, preloaded
    CK(cudaMalloc(&desc_dev, sizeof(StageDesc) * kStages * desc_sets.size()));
    owned.push_back(desc_dev);
    for (size_t k = 0; k < desc_sets.size(); ++k)
      CK(cudaMemcpy(desc_dev + k * kStages, desc_sets[k].data(), sizeof(StageDesc) * kStages, cudaMemcpyHostToDevice));

    warm_clocks();  // the CPU reference above left the GPU idle for seconds
    // T1: the 20 stages' work without dependencies, minus an empty launch, over 20.
    const Stats empty = time_series([&](int) { empty_kernel<<<tiles_, kThreads, 0, st_>>>(); });
    const Stats nodep = time_series([&](int r) {
      const StageDesc* d = desc_dev + static_cast<size_t>(r % desc_sets.size()) * kStages;
      if (c.mode == kCompute) nodep_kernel<kCompute><<<tiles_, kThreads, 0, st_>>>(P, d);
      else nodep_kernel<kMemory><<<tiles_, kThreads, 0, st_>>>(P, d);
    });
    const double t1 = (nodep.median - empty.median) / kStages;
    // For reference only: one stage as one launch, event-timed (launch latency included).
    const Stats single = time_series([&](int r) {
      const StageDesc d = desc_sets[static_cast<size_t>(r) % desc_sets.size()][0];
      if (c.mode == kCompute) stage_kernel<kCompute><<<tiles_, kThreads, 0, st_>>>(P, 0, d);
      else stage_kernel<kMemory><<<tiles_, kThreads, 0, st_>>>(P, 0, d);
    });
    std::printf("%s: T1 = %.3f us (20-stage no-dependency launch %.2f us, empty launch %.2f us; "
                "one stage as one launch %.2f us)\n", c.name, t1, nodep.median, empty.median, single.median);

    // Graphs, one per weight set.
    std::vector<cudaGraphExec_t> graphs;
    for (auto& d : desc_sets) {
      cudaGraph_t g;
      CK(cudaStreamBeginCapture(st_, cudaStreamCaptureModeThreadLocal));
      launch_stages(c.mode, P, d, false);
      CK(cudaStreamEndCapture(st_, &g));
      cudaGraphExec_t e;
      CK(cudaGraphInstantiate(&e, g, 0));
      CK(cudaGraphDestroy(g));
      graphs.push_back(e);
    }

    for (int v = 0; v < kVariants; ++v) {
      if (c.mode == kCompute && v == kPTilesNoPrefetch) continue;  // compute stages load nothing ahead
      CK(cudaMemsetAsync(sync_, 0, sizeof(Sync), st_));
      CK(cudaMemsetAsync(flags_, 0, sizeof(unsigned int) * kStages * static_cast<size_t>(tiles_), st_));
      const bool persistent = v >= kPBarrier;
      const bool fed = v == kPFed;
      const int dep = v == kPBarrier ? kBarrier
                                     : (c.mode == kMemory && v != kPTilesNoPrefetch ? kTilesPrefetch : kTiles);
      const size_t dyn_smem = dep == kTilesPrefetch ? smem : 0;
      const void* kernel = persistent ? prepare_persistent(c.mode, dep, fed, dyn_smem) : nullptr;
      auto ring = SubmissionRing<StageDesc>::create(64);
      if (!ring.ok()) {
        std::fprintf(stderr, "submission ring: %s\n", ring.message().c_str());
        std::exit(1);
      }
      unsigned int epoch = 0;
      auto once = [&](int r) {
        const size_t set = static_cast<size_t>(r) % desc_sets.size();
        const StageDesc* d_dev = desc_dev + set * kStages;
        switch (v) {
          case kHostSync: launch_stages(c.mode, P, desc_sets[set], true); break;
          case kStream: launch_stages(c.mode, P, desc_sets[set], false); break;
          case kGraph: CK(cudaGraphLaunch(graphs[set], st_)); break;
          default: {
            ++epoch;
            launch_persistent(kernel, P, fed ? fed_desc_ : const_cast<StageDesc*>(d_dev), ring->device_view(), epoch,
                              dyn_smem);
            if (fed) {  // the CPU submits the stages while the kernel is already resident
              FeedRing h = ring->host_view();
              for (int s = 0; s < kStages; ++s) {
                StageDesc sd = desc_sets[set][s];
                sd.epoch = epoch;
                Backoff b;
                while (!h.try_push(sd)) b.pause();
              }
            }
          }
        }
      };
      const Stats s = time_series(once);
      // Check: poison every stage output, run once more, compare with the CPU reference.
      CK(cudaMemsetAsync(out_dev, 0xff, sizeof(float) * out_elems, st_));
      CK(cudaEventRecord(ev0_, st_));
      once(0);
      CK(cudaEventRecord(ev1_, st_));
      CK(cudaEventSynchronize(ev1_));
      CK(cudaGetLastError());
      std::vector<float> got(out_elems);
      CK(cudaMemcpy(got.data(), out_dev, sizeof(float) * out_elems, cudaMemcpyDeviceToHost));
      rows.push_back(Row{c.name, t1, static_cast<Variant>(v), s, rel_error(got, ref)});
      std::printf("  %-36s %10.2f us  (rel err %.1e)\n", kVariantNames[v], s.median, rows.back().err);
    }
    for (auto g : graphs) CK(cudaGraphExecDestroy(g));
    for (void* p : owned) CK(cudaFree(p));
  }

 private:
  void warm_clocks() {
    for (int i = 0; i < 100; ++i) busy_kernel<<<tiles_ * 4, kThreads, 0, st_>>>(3'000'000ull);  // 0.3 s
    CK(cudaGetLastError());
    CK(cudaStreamSynchronize(st_));
  }

  template <class F>
  Stats time_series(F&& once) {
    const int warmup = 20;
    std::vector<double> us;
    for (int r = 0; r < warmup + reps_; ++r) {
      CK(cudaEventRecord(ev0_, st_));
      once(r);
      CK(cudaEventRecord(ev1_, st_));
      CK(cudaEventSynchronize(ev1_));
      CK(cudaGetLastError());
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, ev0_, ev1_));
      if (r >= warmup) us.push_back(1000.0 * ms);
    }
    return stats_of(us);
  }

  void launch_stages(Mode m, const Problem& P, const std::vector<StageDesc>& d, bool sync_each) {
    for (int s = 0; s < kStages; ++s) {
      if (m == kCompute) stage_kernel<kCompute><<<tiles_, kThreads, 0, st_>>>(P, s, d[s]);
      else stage_kernel<kMemory><<<tiles_, kThreads, 0, st_>>>(P, s, d[s]);
      if (sync_each) {
        CK(cudaGetLastError());
        CK(cudaStreamSynchronize(st_));
      }
    }
  }

  // Once per series, outside the timed region: the kernel, its shared-memory limit, and a check that
  // one block fits per SM (the cooperative launch needs every tile resident).
  const void* prepare_persistent(Mode m, int dep, bool fed, size_t smem) {
    const void* k = nullptr;
#define SS_PICK(M, D, F) \
  if (m == M && dep == D && fed == F) k = reinterpret_cast<const void*>(&persistent_kernel<M, D, F>);
    SS_PICK(kCompute, kBarrier, false)
    SS_PICK(kCompute, kTiles, false)
    SS_PICK(kCompute, kTiles, true)
    SS_PICK(kMemory, kBarrier, false)
    SS_PICK(kMemory, kTiles, false)
    SS_PICK(kMemory, kTilesPrefetch, false)
    SS_PICK(kMemory, kTilesPrefetch, true)
#undef SS_PICK
    if (k == nullptr) {
      std::fprintf(stderr, "no persistent kernel for mode %d dep %d fed %d\n", m, dep, fed);
      std::exit(1);
    }
    CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    int per_sm = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, kThreads, smem));
    if (per_sm < 1) {
      std::fprintf(stderr, "persistent kernel does not fit on an SM (%zu bytes of shared memory)\n", smem);
      std::exit(1);
    }
    return k;
  }

  void launch_persistent(const void* k, Problem P, StageDesc* desc, FeedRing ring, unsigned int epoch, size_t smem) {
    Sync* sync = sync_;
    unsigned int* flags = flags_;
    void* args[] = {&P, &desc, &sync, &flags, &ring, &epoch};
    CK(cudaLaunchCooperativeKernel(k, dim3(tiles_), dim3(kThreads), args, smem, st_));
  }

  // Compute stages: iterations for `target_us` per stage, from two no-dependency launches
  // (time is linear in iterations).
  unsigned calibrate(Problem P, double target_us) {
    std::vector<StageDesc> d(kStages);
    StageDesc* dd = nullptr;
    CK(cudaMalloc(&dd, sizeof(StageDesc) * kStages));
    auto per_stage = [&](unsigned iters) {
      for (int s = 0; s < kStages; ++s) d[s] = StageDesc{0, iters, static_cast<unsigned>(s), 0, {}};
      CK(cudaMemcpy(dd, d.data(), sizeof(StageDesc) * kStages, cudaMemcpyHostToDevice));
      return time_series([&](int) { nodep_kernel<kCompute><<<tiles_, kThreads, 0, st_>>>(P, dd); }).median / kStages;
    };
    const unsigned lo = 256, hi = 2048;
    const double t_lo = per_stage(lo), t_hi = per_stage(hi);
    CK(cudaFree(dd));
    const double slope = (t_hi - t_lo) / (hi - lo);
    if (!(slope > 0)) {
      std::fprintf(stderr, "calibration failed: %.3f us at %u iterations, %.3f at %u\n", t_lo, lo, t_hi, hi);
      std::exit(1);
    }
    const double iters = lo + (target_us - t_lo) / slope;
    std::printf("calibration: %.3f us/stage at %u iterations, %.3f at %u -> %.0f iterations for %.1f us\n", t_lo, lo,
                t_hi, hi, iters, target_us);
    return static_cast<unsigned>(std::max(1.0, std::round(iters)));
  }

  int reps_;
  cudaDeviceProp prop_{};
  cudaStream_t st_{};
  cudaEvent_t ev0_{}, ev1_{};
  int tiles_ = 0;
  Sync* sync_ = nullptr;
  unsigned int* flags_ = nullptr;
  StageDesc* fed_desc_ = nullptr;
};

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // a run cut short by a time limit still shows its lines
  const int reps = argc > 1 ? std::max(5, std::atoi(argv[1])) : 200;
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("exp_stages: no CUDA device\n");
    return 2;
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  int coop = 0;
  CK(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, 0));
  std::printf("device: %s, %d SMs, L2 %d MB, cooperative launch %s; %d stages, %d threads per tile, %d reps\n",
              prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20, coop ? "yes" : "NO", kStages, kThreads, reps);
  if (!coop) return 1;

  const Config configs[] = {
      {"compute 1us", kCompute, 1.0, 0},   {"compute 5us", kCompute, 5.0, 0},
      {"compute 15us", kCompute, 15.0, 0}, {"memory 8 rows/tile", kMemory, 0, 8},
      {"memory 16 rows/tile", kMemory, 0, 16}, {"memory 24 rows/tile", kMemory, 0, 24},
  };
  Experiment ex(reps);
  std::vector<Row> rows;
  for (const auto& c : configs) ex.run(c, rows);

  // Tolerances: compute stages do the CPU's exact operations (never contracted), so they should match
  // to the bit (1e-6 allows nothing a race could produce: a missed dependency reads NaN poison);
  // the GEMV accumulates bf16·fp32 products in fp32 against a double reference (~1e-6 per stage).
  bool all_ok = true;
  std::printf("\n%-22s %-36s %10s %9s %9s %12s %10s %s\n", "config", "variant", "T(20) us", "p10", "p90",
              "overhead/st", "T1 us", "check");
  for (const Row& r : rows) {
    const bool compute = r.config.rfind("compute", 0) == 0;
    const bool ok = r.err <= (compute ? 1e-6 : 1e-4);
    all_ok = all_ok && ok;
    const double overhead = (r.s.median - kStages * r.t1_us) / kStages;
    std::printf("%-22s %-36s %10.2f %9.2f %9.2f %12.3f %10.3f %s (rel err %.1e)\n", r.config.c_str(),
                kVariantNames[r.v], r.s.median, r.s.p10, r.s.p90, overhead, r.t1_us, ok ? "ok" : "WRONG", r.err);
  }
  std::printf("%s\n", all_ok ? "all variants match the CPU reference" : "SOME VARIANTS ARE WRONG");
  return all_ok ? 0 : 1;
}
