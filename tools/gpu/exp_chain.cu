// What a chain of kernels costs over one stream of the same bytes (docs/perf/gpu.md, 2026-12-07).
// A decode step of a quantized 8B model is ~129 weight-streaming kernels (four projections a layer
// and the lm_head; attention reads no weights). Each kernel alone reads its bytes below the copy
// rate (a 66 MB read reaches ~2.4 TB/s on an H100, a 235 MB one ~2.9): it ramps up and drains. This
// experiment reads the step's weight bytes with no arithmetic (every word folded into an XOR) six
// ways and prints the time of each:
//   one       one kernel over all of the step's bytes: the bandwidth floor as a kernel sees it
//   ops       each op's kernel time (its layers' copies back to back), summed over the step
//   chain     the step's kernels in order in a CUDA graph, plain stream order
//   pdl       the same with programmatic dependent launch as dec_k uses it: each kernel issues its
//             first loads, then griddepcontrol.wait, then launch_dependents, then the rest
//   pdl-1cta  pdl with one CTA a SM (so the next kernel's CTA fits beside it and its first loads
//             overlap this kernel's tail), each thread twice the loads in flight
//   pdl-2of3  pdl with dec_k's grid (two CTAs a SM) where three fit a SM, so a third slot is free
//             for the next kernel's first CTAs
// Every kernel: two CTAs of 256 threads a SM (dec_k's grid, and as with dec_k's registers no room
// for a third) unless said, each thread kU 16-byte loads in flight, a warp's loads 512 contiguous
// bytes.
//
// usage: exp_chain [shape] [reps]   shape: 8b-q4_0 (default), 8b-bf16, 1b-q4_0, 1b-bf16
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "exp_util.cuh"

namespace {

// n vectors from p: thread i of the grid reads kU vectors a step, a warp's 32 lanes consecutive
// vectors (512 bytes), the grid's steps one after another.
template <int kU, int kMinCtas>
__global__ void __launch_bounds__(256, kMinCtas) stream_k(const uint4* p, int64_t n, int pdl, uint32_t* sink) {
  const int64_t lane = threadIdx.x & 31, warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * blockDim.x / 32;
  const int64_t step = warps * 32 * kU;  // vectors a grid step
  uint32_t acc = 0;
  int64_t base = warp * 32 * kU + lane;
  uint4 v[kU];
  // The first step's loads before the wait (weights never depend on the previous kernel).
#pragma unroll
  for (int u = 0; u < kU; ++u) {
    const int64_t i = base + 32 * u;
    v[u] = i < n ? ld_stream(p + i) : make_uint4(0, 0, 0, 0);
  }
  if (pdl) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;");
  }
  for (; base < n; base += step) {
    uint4 w[kU];
    const int64_t nb = base + step;
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int64_t i = nb + 32 * u;
      w[u] = i < n ? ld_stream(p + i) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) acc ^= fold(v[u]), v[u] = w[u];
  }
  if (acc == 0x9E3779B9u) sink[0] = acc;  // never (in practice): keeps the loads
}

struct Op {
  const char* name;
  int64_t bytes;
};

std::vector<Op> step_ops(const std::string& shape) {
  // Q4_0: 18 bytes a 32 weights; bf16: 2 bytes a weight.
  auto sz = [&](int64_t rows, int64_t k, bool q4) { return q4 ? rows * (k / 32) * 18 : rows * k * 2; };
  int64_t h, q, kv, f, layers, vocab;
  bool q4;
  if (shape == "8b-q4_0" || shape == "8b-bf16") {
    h = 4096, q = 4096, kv = 1024, f = 14336, layers = 32, vocab = 128256, q4 = shape == "8b-q4_0";
  } else if (shape == "1b-q4_0" || shape == "1b-bf16") {
    h = 2048, q = 2048, kv = 512, f = 8192, layers = 16, vocab = 128256, q4 = shape == "1b-q4_0";
  } else {
    std::fprintf(stderr, "exp_chain: unknown shape %s\n", shape.c_str());
    std::exit(2);
  }
  std::vector<Op> ops;
  for (int64_t l = 0; l < layers; ++l) {
    ops.push_back({"qkv", sz(q + 2 * kv, h, q4)});
    ops.push_back({"o_proj", sz(h, q, q4)});
    ops.push_back({"gate_up", sz(2 * f, h, q4)});
    ops.push_back({"down", sz(h, f, q4)});
  }
  ops.push_back({"lm_head", sz(vocab, h, q4)});
  return ops;
}

enum class Mode { Plain, Pdl, Pdl1, Pdl3 };

void launch(Mode m, const uint4* p, int64_t bytes, int sms, uint32_t* sink, cudaStream_t s) {
  cudaLaunchConfig_t cfg{};
  cfg.blockDim = dim3(256);
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = m == Mode::Plain ? 0 : 1;
  const int64_t n = bytes / 16;
  const int pdl = m == Mode::Plain ? 0 : 1;
  // Occupancy set by shared memory (unused): 100 KiB a CTA lets two fit a SM, as dec_k's 128
  // registers do, so the next kernel's CTAs find no room until this kernel's leave; pdl-2of3's
  // 60 KiB lets a third in.
  cfg.dynamicSmemBytes = m == Mode::Pdl3 ? 60 * 1024 : 100 * 1024;
  if (m == Mode::Pdl1) {
    cfg.gridDim = dim3(sms);
    CK(cudaLaunchKernelEx(&cfg, stream_k<16, 1>, p, n, pdl, sink));
  } else {
    cfg.gridDim = dim3(2 * sms);
    CK(cudaLaunchKernelEx(&cfg, stream_k<8, 2>, p, n, pdl, sink));
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string shape = argc > 1 ? argv[1] : "8b-q4_0";
  const int reps = argc > 2 ? std::max(3, std::atoi(argv[2])) : 20;
  const std::vector<Op> ops = step_ops(shape);
  int64_t total = 0;
  std::vector<int64_t> off;
  for (const Op& o : ops) off.push_back(total), total += (o.bytes + 4095) / 4096 * 4096;
  int dev = 0, sms = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, dev));
  unsigned char* buf = nullptr;
  uint32_t* sink = nullptr;
  CK(cudaMalloc(&buf, total));
  CK(cudaMalloc(&sink, 4));
  CK(cudaMemset(buf, 0x5a, total));
  CK(cudaFuncSetAttribute(stream_k<8, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize, 100 * 1024));
  CK(cudaFuncSetAttribute(stream_k<16, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, 100 * 1024));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  auto at = [&](size_t i) { return reinterpret_cast<const uint4*>(buf + off[i]); };
  // Median of reps of fn (one warm-up first), in microseconds.
  auto time_us = [&](auto&& fn) { return median_us(s, 1, reps, [&](int) { fn(); }); };
  // The launches fn makes on s, captured as one graph.
  auto capture = [&](auto&& fn) {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    fn();
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    CK(cudaGraphDestroy(g));
    return ge;
  };
  std::printf("exp_chain: %s, %zu kernels, %.3f GB of weights; %s, %d SMs\n", shape.c_str(), ops.size(), total / 1e9,
              prop.name, sms);
  const float one = time_us([&] { launch(Mode::Plain, at(0), total, sms, sink, s); });
  std::printf("  %-9s %9.1f us  %7.1f GB/s\n", "one", one, total / (one * 1e3));
  // Each op by itself: its 32 (or 16) layers' copies back to back in a graph (plain stream order; a
  // copy is never in L2 when its turn comes), a kernel's mean time.
  float ops_sum = 0;
  for (size_t i = 0; i < 5; ++i) {
    std::vector<size_t> idx;
    for (size_t j = 0; j < ops.size(); ++j)
      if (std::strcmp(ops[j].name, i < 4 ? ops[i].name : "lm_head") == 0) idx.push_back(j);
    // The lm_head has one copy: its kernel 8 times over the same bytes (295 MB at 8B, over L2's size).
    const int n = idx.size() == 1 ? 8 : static_cast<int>(idx.size());
    cudaGraphExec_t ge = capture([&] {
      for (int r = 0; r < n; ++r) launch(Mode::Plain, at(idx[r % idx.size()]), ops[idx[0]].bytes, sms, sink, s);
    });
    const float t = time_us([&] { CK(cudaGraphLaunch(ge, s)); }) / n;
    CK(cudaGraphExecDestroy(ge));
    ops_sum += t * static_cast<float>(idx.size());
    std::printf("  %-9s %9.2f us a kernel  %7.1f GB/s  (%.1f MB, %zu in the step)\n", ops[idx[0]].name, t,
                ops[idx[0]].bytes / (t * 1e3), ops[idx[0]].bytes / 1e6, idx.size());
  }
  std::printf("  %-9s %9.1f us  %7.1f GB/s  (each op's kernel time, summed over the step)\n", "ops", ops_sum,
              total / (ops_sum * 1e3));
  const char* names[] = {"chain", "pdl", "pdl-1cta", "pdl-2of3"};
  const Mode modes[] = {Mode::Plain, Mode::Pdl, Mode::Pdl1, Mode::Pdl3};
  for (int k = 0; k < 4; ++k) {
    cudaGraphExec_t ge = capture([&] {
      for (size_t i = 0; i < ops.size(); ++i) launch(modes[k], at(i), ops[i].bytes, sms, sink, s);
    });
    const float t = time_us([&] { CK(cudaGraphLaunch(ge, s)); });
    std::printf("  %-9s %9.1f us  %7.1f GB/s  (%.2fx one)\n", names[k], t, total / (t * 1e3), t / one);
    CK(cudaGraphExecDestroy(ge));
  }
  CK(cudaFree(buf));
  return 0;
}
