// A whole Llama-family decode step built from backend/cuda/kernels, on random bf16 weights made on the
// device, for three real shapes (SmolLM2-135M, Llama-3.2-1B, Llama-3-8B) at context 512, batch 1 and
// 64. The step is captured once in a CUDA graph and replayed; the median replay time is set against
// the weight-bytes floor (every weight byte read once at 4.3 TB/s, the H200's measured copy rate).
// A per-kernel breakdown comes from an eager run with events around each launch (launch gaps
// included, so its sum exceeds the graph's time).
// --micro: each projection kernel alone on the 8B shapes instead (achieved GB/s against 4.3 TB/s,
// rotating over copies so no run reads its weights from L2), cuBLASLt at prefill sizes (TFLOP/s).
// usage: bench_decode_step [--shape 135m|1b|8b|all] [--batch N] [--iters N] [--micro] [--unfused]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "backend/cuda/kernels/kernels.h"

using namespace ss::cuda::kern;

#define CU(expr)                                                                                        \
  do {                                                                                                  \
    const cudaError_t e_ = (expr);                                                                      \
    if (e_ != cudaSuccess) {                                                                            \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(e_));      \
      std::exit(1);                                                                                     \
    }                                                                                                   \
  } while (0)
#define CK(expr)                                                                         \
  do {                                                                                   \
    const ss::Status st_ = (expr);                                                       \
    if (!st_.ok()) {                                                                     \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, st_.message().c_str());    \
      std::exit(1);                                                                      \
    }                                                                                    \
  } while (0)

namespace {

constexpr double kCopyBytesPerSec = 4.3e12;
// --unfused: RoPE, SwiGLU, RMSNorm and the attention merge as their own kernels at batch <= 8 too
// (to see what fusing saves).
bool g_fused = true;
bool g_mismatch = false;  // a fused step disagreed with the unfused one: exit status 3
constexpr int kCtx = 512;

struct Shape {
  const char* name;
  int hidden, layers, heads, kv_heads, ffn, vocab;
  bool tied;
};
const Shape kShapes[] = {
    {"SmolLM2-135M", 576, 30, 9, 3, 1536, 49152, true},
    {"Llama-3.2-1B", 2048, 16, 32, 8, 8192, 128256, true},
    {"Llama-3-8B", 4096, 32, 32, 8, 14336, 128256, false},
};

__global__ void fill_bf16_k(uint16_t* p, int64_t n, uint64_t seed, float scale) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint64_t z = seed + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(i + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const float u = static_cast<float>(z >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f;  // [-1, 1)
    const uint32_t bits = __float_as_uint(u * scale);
    p[i] = static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
  }
}
void fill_bf16(uint16_t* p, int64_t n, uint64_t seed, float scale) {
  fill_bf16_k<<<4096, 256>>>(p, n, seed, scale);
  CU(cudaGetLastError());
}

template <class T>
T* dalloc(int64_t n) {
  void* p = nullptr;
  CU(cudaMalloc(&p, static_cast<size_t>(n) * sizeof(T)));
  return static_cast<T*>(p);
}

struct Layer {
  uint16_t *wqkv, *wo, *wgu, *wd;
  float *norm1, *norm2;
};

struct Model {
  Shape sh;
  int hd, qkv_rows;
  uint16_t *embed, *lm_head;
  std::vector<Layer> layers;
  float* final_norm;
  double weight_bytes = 0;  // read per step: every layer, the final norm, lm_head (embedding: one row)
};

Model make_model(const Shape& sh) {
  Model m{sh, sh.hidden / sh.heads, 0, nullptr, nullptr, {}, nullptr, 0};
  m.qkv_rows = (sh.heads + 2 * sh.kv_heads) * m.hd;
  const int64_t H = sh.hidden, F = sh.ffn;
  uint64_t seed = 1;
  auto weights = [&](int64_t n, float scale) {
    uint16_t* p = dalloc<uint16_t>(n);
    fill_bf16(p, n, seed++, scale);
    return p;
  };
  std::vector<float> ones(std::max<int64_t>(H, 1), 1.0f);
  auto norm = [&]() {
    float* p = dalloc<float>(H);
    CU(cudaMemcpy(p, ones.data(), H * sizeof(float), cudaMemcpyHostToDevice));
    return p;
  };
  const float ws = 1.0f / std::sqrt(static_cast<float>(H));
  m.embed = weights(static_cast<int64_t>(sh.vocab) * H, 1.0f);
  m.lm_head = sh.tied ? m.embed : weights(static_cast<int64_t>(sh.vocab) * H, ws);
  for (int l = 0; l < sh.layers; ++l) {
    Layer L{weights(m.qkv_rows * H, ws), weights(H * sh.heads * m.hd, ws), weights(2 * F * H, ws),
            weights(H * F, 1.0f / std::sqrt(static_cast<float>(F))), norm(), norm()};
    m.layers.push_back(L);
    m.weight_bytes += 2.0 * (m.qkv_rows * H + H * sh.heads * m.hd + 2 * F * H + H * F) + 2 * 4.0 * H;
  }
  m.final_norm = norm();
  m.weight_bytes += 4.0 * H + 2.0 * sh.vocab * H + 2.0 * H;
  CU(cudaDeviceSynchronize());
  return m;
}

void free_model(Model& m) {
  for (auto& L : m.layers) {
    cudaFree(L.wqkv), cudaFree(L.wo), cudaFree(L.wgu), cudaFree(L.wd), cudaFree(L.norm1), cudaFree(L.norm2);
  }
  if (m.lm_head != m.embed) cudaFree(m.lm_head);
  cudaFree(m.embed), cudaFree(m.final_norm);
}

// Activations and the KV cache for `batch` sequences at context kCtx.
struct State {
  int batch, max_blocks, max_splits = 32, splits;
  int32_t *tokens, *positions, *seq, *ctx_len, *tables, *ids;
  unsigned *norm_counter, *split_counters;  // zeroed once; the fused kernels leave them zero
  float *x, *qkv, *q, *gu, *logits, *rope_cs, *ws;
  uint16_t *xn, *attn, *act;
  std::vector<uint16_t*> cache;  // per layer
  LtGemm* lt = nullptr;
};

State make_state(const Model& m, int batch) {
  const Shape& sh = m.sh;
  State s{};
  s.batch = batch;
  s.max_blocks = (kCtx + 1 + kBlockTokens - 1) / kBlockTokens;
  int dev = 0, sms = 0;
  CU(cudaGetDevice(&dev));
  CU(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  s.splits = attention_splits(batch, sh.kv_heads, sms, s.max_splits);
  std::vector<int32_t> tok(batch), pos(batch, kCtx), seq(batch), ctx(batch, kCtx + 1), tab(batch * s.max_blocks);
  for (int b = 0; b < batch; ++b) tok[b] = (b * 7919) % sh.vocab, seq[b] = b;
  for (int i = 0; i < batch * s.max_blocks; ++i) tab[i] = i;
  auto up = [](const std::vector<int32_t>& v) {
    int32_t* p = dalloc<int32_t>(static_cast<int64_t>(v.size()));
    CU(cudaMemcpy(p, v.data(), v.size() * 4, cudaMemcpyHostToDevice));
    return p;
  };
  s.tokens = up(tok), s.positions = up(pos), s.seq = up(seq), s.ctx_len = up(ctx), s.tables = up(tab);
  s.ids = dalloc<int32_t>(batch);
  s.norm_counter = dalloc<unsigned>(1);
  s.split_counters = dalloc<unsigned>(static_cast<int64_t>(batch) * sh.kv_heads);
  CU(cudaMemset(s.norm_counter, 0, sizeof(unsigned)));
  CU(cudaMemset(s.split_counters, 0, sizeof(unsigned) * batch * sh.kv_heads));
  const int64_t H = sh.hidden, B = batch;
  s.x = dalloc<float>(B * H), s.qkv = dalloc<float>(B * m.qkv_rows), s.q = dalloc<float>(B * sh.heads * m.hd);
  s.gu = dalloc<float>(B * 2 * sh.ffn), s.logits = dalloc<float>(B * sh.vocab);
  s.xn = dalloc<uint16_t>(B * H), s.attn = dalloc<uint16_t>(B * sh.heads * m.hd), s.act = dalloc<uint16_t>(B * sh.ffn);
  s.ws = dalloc<float>(std::max<int64_t>(1, attention_workspace_floats(batch, sh.heads, m.hd, s.max_splits)));
  std::vector<float> cs(static_cast<size_t>(kCtx + 1) * m.hd);
  for (int p = 0; p <= kCtx; ++p)
    for (int i = 0; i < m.hd / 2; ++i) {
      const double a = p * std::pow(500000.0, -2.0 * i / m.hd);
      cs[p * m.hd + i] = static_cast<float>(std::cos(a)), cs[p * m.hd + m.hd / 2 + i] = static_cast<float>(std::sin(a));
    }
  s.rope_cs = dalloc<float>(static_cast<int64_t>(cs.size()));
  CU(cudaMemcpy(s.rope_cs, cs.data(), cs.size() * 4, cudaMemcpyHostToDevice));
  const int64_t cache_elems = static_cast<int64_t>(batch) * s.max_blocks * 2 * sh.kv_heads * kBlockTokens * m.hd;
  for (int l = 0; l < sh.layers; ++l) {
    uint16_t* c = dalloc<uint16_t>(cache_elems);
    fill_bf16(c, cache_elems, 1000 + l, 1.0f);  // the context's K/V: random, as after a prefill
    s.cache.push_back(c);
  }
  auto lt = lt_create(64u << 20);
  CK(lt.ok() ? ss::Status{} : ss::Status(lt.error()));
  s.lt = *lt;
  CU(cudaDeviceSynchronize());
  return s;
}

void free_state(State& s) {
  for (void* p : {static_cast<void*>(s.norm_counter), static_cast<void*>(s.split_counters), static_cast<void*>(s.tokens), static_cast<void*>(s.positions), static_cast<void*>(s.seq),
                  static_cast<void*>(s.ctx_len), static_cast<void*>(s.tables), static_cast<void*>(s.ids),
                  static_cast<void*>(s.x), static_cast<void*>(s.qkv), static_cast<void*>(s.q), static_cast<void*>(s.gu),
                  static_cast<void*>(s.logits), static_cast<void*>(s.rope_cs), static_cast<void*>(s.ws),
                  static_cast<void*>(s.xn), static_cast<void*>(s.attn), static_cast<void*>(s.act)})
    cudaFree(p);
  for (auto* c : s.cache) cudaFree(c);
  lt_destroy(s.lt);
}

// Records the time of each named part when `timer` is set (eager), else launches only (capture).
struct Timer {
  cudaStream_t st;
  std::vector<std::pair<std::string, cudaEvent_t>> marks;
  size_t next = 0;
  void mark(const std::string& name) {
    if (next == marks.size()) {
      cudaEvent_t e;
      CU(cudaEventCreate(&e));
      marks.emplace_back(name, e);
    }
    CU(cudaEventRecord(marks[next++].second, st));
  }
};

void proj(State& s, const uint16_t* W, const uint16_t* x, float* y, int N, int K, bool acc, cudaStream_t st) {
  if (s.batch <= 8) CK(gemv_bf16(W, x, y, N, K, s.batch, acc, st));
  else CK(lt_gemm_bf16(s.lt, W, x, y, s.batch, N, K, acc, st));
}

void step(const Model& m, State& s, cudaStream_t st, Timer* t) {
  const Shape& sh = m.sh;
  const int B = s.batch, H = sh.hidden;
  auto mark = [&](const char* n) { if (t) t->mark(n); };
  mark("start");
  CK(embed(m.embed, TableType::BF16, sh.vocab, H, s.tokens, B, s.x, st));
  mark("embed");
  const bool fused = B <= 8 && g_fused;
  for (int l = 0; l < sh.layers; ++l) {
    const Layer& L = m.layers[l];
    if (l == 0 || !fused) {  // fused: the previous layer's down projection normalised already
      CK(add_rmsnorm(s.x, nullptr, L.norm1, B, H, 1e-5f, s.xn, st));
      mark("rmsnorm");
    }
    RopeKv r{s.qkv, s.rope_cs, m.hd, false, sh.heads, sh.kv_heads, m.hd, s.positions, s.seq, s.tables, s.max_blocks,
             s.q, s.cache[l], nullptr, nullptr, nullptr, 0.0f};
    if (fused) {  // RoPE and the KV store in the QKV GEMV's epilogue
      CK(gemv_bf16_qkv_rope(L.wqkv, s.xn, H, B, r, st));
      mark("qkv+rope_kv");
    } else {
      proj(s, L.wqkv, s.xn, s.qkv, m.qkv_rows, H, false, st);
      mark("qkv");
      CK(rope_kv_store(r, B, st));
      mark("rope_kv");
    }
    Attention a{s.q, s.cache[l], sh.heads, sh.kv_heads, m.hd, 1.0f / std::sqrt(static_cast<float>(m.hd)), s.ctx_len,
                s.seq, s.tables, s.max_blocks, s.attn, s.ws, s.max_splits, fused ? s.split_counters : nullptr};
    CK(attention(a, B, s.splits, st));
    mark("attention");
    if (fused) {  // residual add and the next RMSNorm in the projection
      CK(gemv_bf16_residual_rmsnorm(L.wo, s.attn, s.x, H, sh.heads * m.hd, B, L.norm2, 1e-5f, s.xn, s.norm_counter, st));
      mark("o_proj+rmsnorm");
      CK(gemv_bf16_swiglu(L.wgu, s.xn, s.act, sh.ffn, H, B, st));
      mark("gate_up+swiglu");
      const float* next = l + 1 < sh.layers ? m.layers[l + 1].norm1 : m.final_norm;
      CK(gemv_bf16_residual_rmsnorm(L.wd, s.act, s.x, H, sh.ffn, B, next, 1e-5f, s.xn, s.norm_counter, st));
      mark("down+rmsnorm");
    } else {
      proj(s, L.wo, s.attn, s.x, H, sh.heads * m.hd, true, st);  // the residual add, in the projection
      mark("o_proj");
      CK(add_rmsnorm(s.x, nullptr, L.norm2, B, H, 1e-5f, s.xn, st));
      mark("rmsnorm");
      proj(s, L.wgu, s.xn, s.gu, 2 * sh.ffn, H, false, st);
      mark("gate_up");
      CK(swiglu(s.gu, B, sh.ffn, s.act, st));
      mark("swiglu");
      proj(s, L.wd, s.act, s.x, H, sh.ffn, true, st);
      mark("down");
    }
  }
  if (!fused) {
    CK(add_rmsnorm(s.x, nullptr, m.final_norm, B, H, 1e-5f, s.xn, st));
    mark("rmsnorm");
  }
  proj(s, m.lm_head, s.xn, s.logits, sh.vocab, H, false, st);
  mark("lm_head");
  CK(argmax(s.logits, B, sh.vocab, s.ids, st));
  mark("argmax");
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// The fused step (epilogues: RoPE, SwiGLU, RMSNorm, split merge) against the same step with each as
// its own kernel, on the same weights and cache: the two differ only in the order of the RMSNorm
// sums, so their logits must agree to bf16 noise. A whole-step check of the fusions.
bool fused_matches_unfused(const Model& m, State& s, cudaStream_t st) {
  const size_t n = static_cast<size_t>(s.batch) * m.sh.vocab;
  std::vector<float> a(n), b(n);
  step(m, s, st, nullptr);
  CU(cudaStreamSynchronize(st));
  CU(cudaMemcpy(a.data(), s.logits, n * 4, cudaMemcpyDeviceToHost));
  g_fused = false;
  step(m, s, st, nullptr);
  g_fused = true;
  CU(cudaStreamSynchronize(st));
  CU(cudaMemcpy(b.data(), s.logits, n * 4, cudaMemcpyDeviceToHost));
  double max_diff = 0, max_abs = 0;
  bool finite = true;
  for (size_t i = 0; i < n; ++i) {
    finite = finite && std::isfinite(a[i]) && std::isfinite(b[i]);
    max_diff = std::max(max_diff, static_cast<double>(std::abs(a[i] - b[i])));
    max_abs = std::max(max_abs, static_cast<double>(std::abs(b[i])));
  }
  const bool ok = finite && max_abs > 0 && max_diff <= 5e-2 * max_abs;
  std::printf("   fused vs unfused logits: max |diff| %.3g of max |logit| %.3g (%.2g)%s %s\n", max_diff, max_abs,
              max_abs > 0 ? max_diff / max_abs : 0.0, finite ? "" : ", NOT FINITE", ok ? "(ok)" : "(MISMATCH)");
  return ok;
}

void bench(const Model& m, int batch, int iters) {
  State s = make_state(m, batch);
  cudaStream_t st;
  CU(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  // Eager once (plans the cuBLASLt algorithms, outside the capture), then the per-kernel breakdown.
  step(m, s, st, nullptr);
  CU(cudaStreamSynchronize(st));
  Timer t{st, {}, 0};
  std::map<std::string, std::vector<double>> parts;
  for (int it = 0; it < 20; ++it) {
    t.next = 0;
    step(m, s, st, &t);
    CU(cudaStreamSynchronize(st));
    std::map<std::string, double> sum;
    for (size_t i = 1; i < t.marks.size(); ++i) {
      float ms = 0;
      CU(cudaEventElapsedTime(&ms, t.marks[i - 1].second, t.marks[i].second));
      sum[t.marks[i].first] += ms;
    }
    for (auto& [k, v] : sum) parts[k].push_back(v);
  }
  // The graph.
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CU(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  step(m, s, st, nullptr);
  CU(cudaStreamEndCapture(st, &g));
  CU(cudaGraphInstantiate(&ge, g, 0));
  cudaEvent_t e0, e1;
  CU(cudaEventCreate(&e0));
  CU(cudaEventCreate(&e1));
  for (int i = 0; i < 10; ++i) CU(cudaGraphLaunch(ge, st));
  std::vector<double> times;
  for (int i = 0; i < iters; ++i) {
    CU(cudaEventRecord(e0, st));
    CU(cudaGraphLaunch(ge, st));
    CU(cudaEventRecord(e1, st));
    CU(cudaEventSynchronize(e1));
    float ms = 0;
    CU(cudaEventElapsedTime(&ms, e0, e1));
    times.push_back(ms);
  }
  std::vector<int32_t> ids(batch);
  CU(cudaMemcpy(ids.data(), s.ids, batch * 4, cudaMemcpyDeviceToHost));
  const double ms = median(times);
  const double floor_ms = m.weight_bytes / kCopyBytesPerSec * 1e3;
  std::printf("\n== %s%s batch %d context %d: graph step %.3f ms (median of %d), weight floor %.3f ms (%.2f GB), "
              "time/floor %.2f, %.0f GB/s; attention splits %d; first id %d\n",
              m.sh.name, g_fused ? "" : " (unfused)", batch, kCtx, ms, iters, floor_ms, m.weight_bytes / 1e9, ms / floor_ms,
              m.weight_bytes / (ms * 1e-3) / 1e9, s.splits, ids[0]);
  double total = 0;
  std::vector<std::pair<double, std::string>> rows;
  for (auto& [k, v] : parts) rows.emplace_back(median(v), k), total += median(v);
  std::sort(rows.rbegin(), rows.rend());
  std::printf("   eager per-kernel (median of 20 steps, summed over layers; with launch gaps): total %.3f ms\n", total);
  for (auto& [v, k] : rows) std::printf("   %-10s %8.3f ms  %5.1f%%\n", k.c_str(), v, 100.0 * v / total);
  CU(cudaGraphExecDestroy(ge));
  CU(cudaGraphDestroy(g));
  for (auto& [n, e] : t.marks) cudaEventDestroy(e);
  cudaEventDestroy(e0), cudaEventDestroy(e1);
  const bool agree = batch > 8 || !g_fused || fused_matches_unfused(m, s, st);  // still on st
  CU(cudaStreamDestroy(st));
  free_state(s);
  if (!agree) g_mismatch = true;
}

// Median time (ms) of fn over iters launches after warm-up, each timed by its own events.
template <class F>
double time_ms(cudaStream_t st, int iters, F fn) {
  for (int i = 0; i < 5; ++i) fn(i);
  cudaEvent_t e0, e1;
  CU(cudaEventCreate(&e0));
  CU(cudaEventCreate(&e1));
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    CU(cudaEventRecord(e0, st));
    fn(i);
    CU(cudaEventRecord(e1, st));
    CU(cudaEventSynchronize(e1));
    float ms = 0;
    CU(cudaEventElapsedTime(&ms, e0, e1));
    t.push_back(ms);
  }
  cudaEventDestroy(e0), cudaEventDestroy(e1);
  return median(t);
}

void micro(int iters) {
  cudaStream_t st;
  CU(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  struct Mat { const char* name; int N, K; };
  const Mat mats[] = {{"8B qkv", 6144, 4096}, {"8B o", 4096, 4096}, {"8B gate_up", 28672, 4096},
                      {"8B down", 4096, 14336}, {"8B lm_head", 128256, 4096}};
  constexpr int kCopies = 4;  // >= 4 x 32 MB per shape: more than the 60 MB L2
  std::printf("\n== projections alone (median of %d; weight bytes over time, %% of 4.3 TB/s; the GGUF rows of the\n"
              "   smaller matrices (< 15 MB a copy) may partly come from L2)\n", iters);
  std::printf("   %-12s %6s %6s %5s %10s %8s %6s\n", "matrix", "N", "K", "batch", "kernel", "us", "%");
  float* y = dalloc<float>(8 * 128256);
  uint16_t* x = dalloc<uint16_t>(8 * 14336);
  uint16_t* act = dalloc<uint16_t>(8 * 14336);
  fill_bf16(x, 8 * 14336, 7, 1.0f);
  for (const Mat& mt : mats) {
    const int64_t n = static_cast<int64_t>(mt.N) * mt.K;
    const int copies = n * 2 >= (256ll << 20) ? 1 : kCopies;
    std::vector<uint16_t*> W;
    for (int c = 0; c < copies; ++c) {
      W.push_back(dalloc<uint16_t>(n));
      fill_bf16(W.back(), n, 100 + c, 0.01f);
    }
    for (int b : {1, 2, 4, 8}) {
      const double ms = time_ms(st, iters, [&](int i) { CK(gemv_bf16(W[i % copies], x, y, mt.N, mt.K, b, false, st)); });
      const double gbs = 2.0 * n / (ms * 1e-3) / 1e9;
      std::printf("   %-12s %6d %6d %5d %10s %8.1f %5.1f%%\n", mt.name, mt.N, mt.K, b, "bf16", ms * 1e3, 100 * gbs / 4300);
    }
    if (!std::strcmp(mt.name, "8B gate_up")) {
      for (int b : {1, 8}) {
        const double ms = time_ms(st, iters, [&](int i) { CK(gemv_bf16_swiglu(W[i % copies], x, act, mt.N / 2, mt.K, b, st)); });
        std::printf("   %-12s %6d %6d %5d %10s %8.1f %5.1f%%\n", mt.name, mt.N, mt.K, b, "+swiglu", ms * 1e3,
                    100 * 2.0 * n / (ms * 1e-3) / 1e9 / 4300);
      }
    }
    // GGUF types on the same shape: bytes per 32 weights 34 / 18 / 20, per 256: 144 / 210.
    const struct { QuantType t; const char* name; double bytes_per_weight; } qs[] = {
        {QuantType::Q8_0, "q8_0", 34.0 / 32}, {QuantType::Q4_0, "q4_0", 18.0 / 32}, {QuantType::Q4_1, "q4_1", 20.0 / 32},
        {QuantType::Q4_K, "q4_K", 144.0 / 256}, {QuantType::Q6_K, "q6_K", 210.0 / 256}};
    for (const auto& q : qs) {
      // Random bytes as blocks would hold NaN scales now and then: fill, then bench (timing only).
      const int64_t bytes = static_cast<int64_t>(n * q.bytes_per_weight);
      const double ms = time_ms(st, iters, [&](int i) {
        CK(gemv_quant(W[i % copies], q.t, x, y, mt.N, mt.K, 1, false, st));
      });
      std::printf("   %-12s %6d %6d %5d %10s %8.1f %5.1f%%\n", mt.name, mt.N, mt.K, 1, q.name, ms * 1e3,
                  100 * bytes / (ms * 1e-3) / 1e9 / 4300);
    }
    for (auto* w : W) cudaFree(w);
  }
  // cuBLASLt at prefill / large-batch sizes.
  auto lt = lt_create(64u << 20);
  CK(lt.ok() ? ss::Status{} : ss::Status(lt.error()));
  std::printf("\n== cuBLASLt bf16 (TFLOP/s; 790 measured peak)\n");
  for (int M : {64, 512, 2048}) {
    for (const Mat& mt : {mats[0], mats[2], mats[3]}) {
      const int64_t n = static_cast<int64_t>(mt.N) * mt.K;
      uint16_t* W = dalloc<uint16_t>(n);
      uint16_t* X = dalloc<uint16_t>(static_cast<int64_t>(M) * mt.K);
      float* Y = dalloc<float>(static_cast<int64_t>(M) * mt.N);
      fill_bf16(W, n, 3, 0.01f);
      fill_bf16(X, static_cast<int64_t>(M) * mt.K, 4, 1.0f);
      const double ms = time_ms(st, iters, [&](int) { CK(lt_gemm_bf16(*lt, W, X, Y, M, mt.N, mt.K, false, st)); });
      std::printf("   M=%-5d %-12s %8.1f us %7.1f TFLOP/s %6.0f GB/s\n", M, mt.name, ms * 1e3,
                  2.0 * M * n / (ms * 1e-3) / 1e12, 2.0 * n / (ms * 1e-3) / 1e9);
      cudaFree(W), cudaFree(X), cudaFree(Y);
    }
  }
  lt_destroy(*lt);
  cudaFree(y), cudaFree(x), cudaFree(act);
  cudaStreamDestroy(st);
}

}  // namespace

int main(int argc, char** argv) {
  std::string shape = "all";
  int only_batch = 0, iters = 200;
  bool micro_only = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--micro")) micro_only = true;
    if (!std::strcmp(argv[i], "--unfused")) g_fused = false;
  }
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--micro") || !std::strcmp(argv[i], "--unfused")) {
      --i;
      continue;
    }
    if (!std::strcmp(argv[i], "--shape")) shape = argv[i + 1];
    else if (!std::strcmp(argv[i], "--batch")) only_batch = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--iters")) iters = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: bench_decode_step [--shape 135m|1b|8b|all] [--batch N] [--iters N] [--micro] [--unfused]\n");
      return 2;
    }
  }
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::fprintf(stderr, "bench_decode_step: no CUDA device\n");
    return 1;
  }
  if (micro_only) {
    micro(iters);
    return 0;
  }
  const char* keys[] = {"135m", "1b", "8b"};
  for (int i = 0; i < 3; ++i) {
    if (shape != "all" && shape != keys[i]) continue;
    Model m = make_model(kShapes[i]);
    if (only_batch > 0) bench(m, only_batch, iters);
    else
      for (int b : {1, 64}) bench(m, b, iters);
    free_model(m);
  }
  if (g_mismatch) {
    std::fprintf(stderr, "bench_decode_step: a fused step's logits disagreed with the unfused step's\n");
    return 3;
  }
  return 0;
}
