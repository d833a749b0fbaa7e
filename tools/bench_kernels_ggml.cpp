// Baseline for bench_kernels: llama.cpp's CPU matmul (ggml-cpu ggml_mul_mat) on the same SmolLM2 shapes
// and the same kind of random weights. Not built by CMake (it needs a llama.cpp build); by hand:
//
//   L=/path/to/llama.cpp   # built with cmake -DGGML_NATIVE=OFF -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON ...
//   g++ -O2 -std=c++17 tools/bench_kernels_ggml.cpp -I$L/ggml/include -L$L/build/bin \
//       -lggml -lggml-base -lggml-cpu -Wl,-rpath,$L/build/bin -o /tmp/bench_kernels_ggml
//   /tmp/bench_kernels_ggml [min_time_s] [threads]
//
// Time per call includes ggml's own activation quantization (to Q8_1 / Q8_0), like ours does.
// cpu_us = process CPU time / threads (the shared machine preempts us; see bench_kernels.cpp); with
// more than one thread OpenMP's spin-waiting makes cpu_us an overestimate, so compare 1 thread.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <vector>

#include "ggml-cpu.h"
#include "ggml.h"

namespace {
double cpu_now() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}
}  // namespace

int main(int argc, char** argv) {
  const double min_time = argc > 1 ? std::atof(argv[1]) : 0.3;
  const int nthr = argc > 2 ? std::atoi(argv[2]) : 1;
  struct Shape {
    const char* name;
    int in, out;
    ggml_type t;
  } shapes[] = {{"attn_q/o 576->576", 576, 576, GGML_TYPE_Q4_1},     {"attn_k/v 576->192", 576, 192, GGML_TYPE_Q4_1},
                {"ffn_up/gate 576->1536", 576, 1536, GGML_TYPE_Q4_1}, {"ffn_down 1536->576", 1536, 576, GGML_TYPE_Q4_1},
                {"lm_head 576->49152", 576, 49152, GGML_TYPE_Q8_0},   {"ffn_down 1536->576", 1536, 576, GGML_TYPE_Q8_0},
                {"ffn_down 1536->576", 1536, 576, GGML_TYPE_Q4_0},    {"ffn_down 1536->576", 1536, 576, GGML_TYPE_F16}};
  std::printf("%-4s %-22s %-5s %5s %10s %10s %10s %9s\n", "thr", "shape", "type", "n_tok", "median_us", "best_us",
              "cpu_us", "GFLOP/s");
  for (const Shape& s : shapes)
    for (int n_tok : {1, 512}) {
      const size_t wbytes = ggml_row_size(s.t, s.in) * s.out;
      ggml_init_params p{wbytes + static_cast<size_t>(n_tok) * (s.in + s.out) * 4 + (256u << 20), nullptr, false};
      ggml_context* ctx = ggml_init(p);
      ggml_tensor* W = ggml_new_tensor_2d(ctx, s.t, s.in, s.out);
      ggml_tensor* X = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, s.in, n_tok);
      std::mt19937 g(1234);
      auto* w = static_cast<uint8_t*>(W->data);
      for (size_t i = 0; i < wbytes; ++i) w[i] = static_cast<uint8_t>(g());
      const size_t bb = ggml_type_size(s.t);
      const uint16_t d = ggml_fp32_to_fp16(0.01f), m = ggml_fp32_to_fp16(-0.05f);
      for (size_t b = 0; b < wbytes / bb; ++b) {  // sane scales (random bits would be NaN/Inf)
        std::memcpy(w + b * bb, &d, 2);
        if (s.t == GGML_TYPE_Q4_1) std::memcpy(w + b * bb + 2, &m, 2);
      }
      std::normal_distribution<float> nd;
      for (int i = 0; i < s.in * n_tok; ++i) static_cast<float*>(X->data)[i] = nd(g);
      ggml_cgraph* gf = ggml_new_graph(ctx);
      ggml_build_forward_expand(gf, ggml_mul_mat(ctx, W, X));
      auto run = [&] { ggml_graph_compute_with_ctx(ctx, gf, nthr); };
      run();
      run();
      std::vector<double> ts, cs;
      const auto st = std::chrono::steady_clock::now();
      while (ts.size() < 5 || std::chrono::duration<double>(std::chrono::steady_clock::now() - st).count() < min_time) {
        const auto t0 = std::chrono::steady_clock::now();
        const double c0 = cpu_now();
        run();
        cs.push_back((cpu_now() - c0) / nthr);
        ts.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      std::sort(ts.begin(), ts.end());
      std::sort(cs.begin(), cs.end());
      const double flops = 2.0 * s.in * s.out * n_tok, cpu = cs[cs.size() / 2];
      std::printf("%-4d %-22s %-5s %5d %10.1f %10.1f %10.1f %9.1f\n", nthr, s.name, ggml_type_name(s.t), n_tok,
                  ts[ts.size() / 2] * 1e6, ts[0] * 1e6, cpu * 1e6, flops / cpu / 1e9);
      std::fflush(stdout);
      ggml_free(ctx);
    }
}
