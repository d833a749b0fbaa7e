// Micro-benchmark of the CPU matmul kernels on the SmolLM2-135M shapes, plus the machine's floors.
//
//   bench_kernels [--isa all|scalar|avx2|avx512] [--threads 1,2] [--ntok 1,512] [--min-time 0.3]
//                 [--floors] [--cold] [--type Q8_0] [--shape lm_head] [--attention [--context 130]]
//   bench_kernels --step-floor MODEL.gguf [--batch 16] [--context 160] [--threads 2]
//
// Per case: median wall time of repeated calls (after warm-up), GFLOP/s = 2 rows cols n_tok / t and
// GB/s = weight bytes / t. "matmul" is the public entry point (it picks the kernel); "per-token*"
// forces the per-token (per-row dot) kernel at n_tok > 1, the shape of llama.cpp's vec_dot path;
// "packed" runs matmul through the PackedMatrix form where the ISA has a packed kernel for the type.
// --cold cycles through copies of the weights totalling >= 1 GiB so they come from DRAM, not cache.
// --floors measures read bandwidth (L2-sized, 64 MiB, 1 GiB) and the vpdpbusd / FMA peak per core.
// --attention times the decode attention kernel alone (ops attention_token: one token row, every
// head, SmolLM2's 3 KV heads x 3 query heads x 64) per KV element type: "hot" cycles the 30 layers of
// one sequence (~3 MB, from cache), "cold" cycles sequences totalling >= 512 MiB (from DRAM), each
// thread its own items; us per item (one sequence, one layer) and the cache bytes it reads per second.
// --step-floor: the floor of one decode step of MODEL for --batch sequences at --context tokens each
// (AVX-512 VNNI, --threads cores), from this machine's measured rates (the --floors numbers): the
// products' vector ops at the vpdpbusd rate, the weights at the 1 GiB read bandwidth, attention's
// fp32 FMAs at the FMA rate and its f16 K/V at the read bandwidth. See step_floor below for the
// ops a product cannot avoid under the batch-invariance contract (kernels_internal.h).
// "cold+mm" runs the cold items on one thread while the other runs a 16-token packed matmul (ffn_up,
// Q4_1, cold weights): can a step overlap DRAM-bound attention with compute-bound products?
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <ctime>
#include <string>
#include <thread>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/kernels_internal.h"
#include "common/huge_buffer.h"
#include "model/model.h"

namespace {

using Clock = std::chrono::steady_clock;
using ss::ThreadPool;
using ss::cpu::Isa;
using ss::model::DType;

struct Shape {
  const char* name;
  int64_t in, out;
  DType type;
};

const Shape kShapes[] = {
    {"attn_q/o 576->576", 576, 576, DType::Q4_1},   {"attn_k/v 576->192", 576, 192, DType::Q4_1},
    {"ffn_up/gate 576->1536", 576, 1536, DType::Q4_1}, {"ffn_down 1536->576", 1536, 576, DType::Q4_1},
    {"lm_head 576->49152", 576, 49152, DType::Q8_0},
};

std::vector<int> parse_list(const char* s) {
  std::vector<int> v;
  for (const char* p = s; *p;) {
    v.push_back(std::atoi(p));
    while (*p && *p != ',') ++p;
    if (*p == ',') ++p;
  }
  return v;
}

// Random blocks with sane fp16 scales (random bits would be NaN/Inf).
std::vector<uint8_t> random_weights(DType t, int64_t rows, int64_t cols, uint32_t seed) {
  const auto& ti = ss::model::info(t);
  const int64_t nblk = rows * cols / ti.block_size;
  std::vector<uint8_t> w(static_cast<size_t>(nblk * ti.block_bytes));
  std::mt19937 g(seed);
  for (auto& b : w) b = static_cast<uint8_t>(g());
  std::normal_distribution<float> nd(0.0f, 0.05f);
  for (int64_t b = 0; b < nblk; ++b) {  // float types: values (random bits would be NaN/Inf/denormal)
    uint8_t* q = w.data() + b * ti.block_bytes;
    if (t == DType::F32) {
      const float f = nd(g);
      std::memcpy(q, &f, 4);
    } else if (t == DType::F16 || t == DType::BF16) {
      const float f = nd(g);
      const uint16_t h = t == DType::F16 ? ss::model::fp32_to_fp16(f) : ss::model::fp32_to_bf16(f);
      std::memcpy(q, &h, 2);
    }
    const uint16_t d = ss::model::fp32_to_fp16(0.01f), m = ss::model::fp32_to_fp16(-0.05f);
    if (t == DType::Q6_K) std::memcpy(q + 208, &d, 2);
    else if (t == DType::Q3_K) std::memcpy(q + 108, &d, 2);
    else if (t == DType::Q2_K) std::memcpy(q + 80, &d, 2), std::memcpy(q + 82, &m, 2);
    else if (ti.block_size > 1) std::memcpy(q, &d, 2);
    if (t == DType::Q4_1 || t == DType::Q5_1 || t == DType::Q4_K || t == DType::Q5_K) std::memcpy(q + 2, &m, 2);
  }
  return w;
}

struct Result {
  double median_s, best_s;  // wall time per call
  double cpu_s;             // median process CPU time per call / threads: wall time minus preemption
};

double cpu_now() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// The machine is shared (2 cores, other builds running): wall time includes time preempted, so the
// CPU time of the process divided by the threads is reported too; it is what an idle machine shows.
template <class F>
Result time_it(F&& f, double min_time, int threads) {
  f();
  f();
  std::vector<double> ts, cs;
  const auto start = Clock::now();
  while (ts.size() < 5 || std::chrono::duration<double>(Clock::now() - start).count() < min_time) {
    const double c0 = cpu_now();
    const auto t0 = Clock::now();
    f();
    ts.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    cs.push_back((cpu_now() - c0) / threads);
  }
  std::sort(ts.begin(), ts.end());
  std::sort(cs.begin(), cs.end());
  return {ts[ts.size() / 2], ts[0], cs[cs.size() / 2]};
}

// Forces the per-token kernel at any n_tok (benchmark-only use of the private kernel set).
void matmul_per_token(Isa isa, const ss::model::Tensor& W, const float* x, int n_tok, float* y,
                      void* scratch, ThreadPool& pool) {
  namespace d = ss::cpu::detail;
  const auto quantize = isa == Isa::Avx512 ? d::avx512::quantize : d::avx2::quantize;
  const auto rows = isa == Isa::Avx512 ? d::avx512::rows_q32 : d::avx2::rows_q32;
  const d::QActs a = d::carve_qacts(scratch, W.cols(), n_tok, 1, 32);
  pool.parallel_for(n_tok, 1, [&](int64_t t0, int64_t t1, int) {
    quantize(W.type, x, W.cols(), static_cast<int>(t0), static_cast<int>(t1), a);
  });
  pool.parallel_for(W.rows(), 16, [&](int64_t r0, int64_t r1, int) { rows(W, a, y, W.rows(), r0, r1); });
}

// ---- floors ----
__attribute__((target("avx512f"))) double sum_lines(const uint8_t* p, int64_t b, int64_t e) {
  __m512i acc = _mm512_setzero_si512();
  for (int64_t i = b; i < e; ++i) acc = _mm512_add_epi64(acc, _mm512_load_si512(p + i * 64));
  alignas(64) int64_t v[8];
  _mm512_store_si512(v, acc);
  return static_cast<double>(v[0] + v[7]);
}

double read_bandwidth(size_t bytes, int threads, double min_time) {
  std::vector<uint8_t> buf(bytes + 64, 1);  // vector<uint8_t> is 16-aligned: realign
  uint8_t* base = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(buf.data()) + 63) & ~uintptr_t{63});
  ThreadPool pool(threads);
  std::vector<double> sink(threads);
  const Result r = time_it(
      [&] {
        pool.parallel_for(static_cast<int64_t>(bytes / 64), 1024,
                          [&](int64_t b, int64_t e, int t) { sink[t] += sum_lines(base, b, e); });
      },
      min_time, threads);
  return static_cast<double>(bytes) / r.cpu_s / 1e9;
}

// vpdpbusd zmm throughput on one core, 12 independent chains: int8 multiply-adds per second.
// CPU time, not wall time: the machine is shared.
__attribute__((target("avx512f,avx512vnni"))) double vnni_peak() {
  __m512i acc[12];  // distinct and all consumed, or the compiler merges or drops chains
  for (int j = 0; j < 12; ++j) acc[j] = _mm512_set1_epi32(j);
  const __m512i u = _mm512_set1_epi8(3), s = _mm512_set1_epi8(-2);
  const int64_t iters = 20'000'000;
  const double t0 = cpu_now();
  for (int64_t i = 0; i < iters; ++i)
    for (auto& a : acc) a = _mm512_dpbusd_epi32(a, u, s);
  const double t = cpu_now() - t0;
  __m512i sum = acc[0];
  for (int j = 1; j < 12; ++j) sum = _mm512_add_epi32(sum, acc[j]);
  alignas(64) int32_t v[16];
  _mm512_store_si512(v, sum);
  if (v[0] == 42) std::puts("");
  return iters * 12.0 * 64 / t;
}

__attribute__((target("avx512f,fma"))) double fma_peak() {
  __m512 acc[12];  // distinct and all consumed, or the compiler merges or drops chains
  for (int j = 0; j < 12; ++j) acc[j] = _mm512_set1_ps(static_cast<float>(j));
  const __m512 x = _mm512_set1_ps(1.0000001f), y = _mm512_set1_ps(1e-7f);
  const int64_t iters = 20'000'000;
  const double t0 = cpu_now();
  for (int64_t i = 0; i < iters; ++i)
    for (auto& a : acc) a = _mm512_fmadd_ps(a, x, y);
  const double t = cpu_now() - t0;
  __m512 sum = acc[0];
  for (int j = 1; j < 12; ++j) sum = _mm512_add_ps(sum, acc[j]);
  alignas(64) float v[16];
  _mm512_store_ps(v, sum);
  if (v[0] == 42) std::puts("");
  return iters * 12.0 * 16 / t;
}

// ---- the floor of a decode step (--step-floor) ----
// Vector ops a packed AVX-512 VNNI product needs per 64 int8 multiply-adds (one token, 16 rows), on
// the pipes vpdpbusd uses (one zmm vpdpbusd per cycle and core, as vnni_peak measures; the float ops
// and vpmulld counted on the same pipes). Only what the contract requires: the vpdpbusd, the integer
// scaling of each sub-block (vpmulld + vpaddd), the min/offset term (vpdpwssd per 2 sub-blocks of 16
// values) and the float step per block (cvt, the scale product, fma; Q4_1/Q5_1 one fma more for m).
// Unpacking the weights, the broadcasts and the loads are left out: other ports may absorb them.
double slots_per_64(DType t) {
  switch (t) {
    case DType::Q4_0: case DType::Q5_0: case DType::Q8_0: case DType::IQ4_NL: return (8 + 3) / 8.0;
    case DType::Q4_1: case DType::Q5_1: return (8 + 4) / 8.0;
    case DType::Q4_K: case DType::Q5_K: return (64 + 8 + 8 + 4 + 6) / 64.0;  // 8 sub-blocks, d and dmin steps
    case DType::IQ4_XS: return (64 + 8 + 8 + 4 + 4) / 64.0;                 // 8 sub-blocks, offset term
    case DType::Q6_K: case DType::Q3_K: return (64 + 16 + 16 + 8 + 4) / 64.0;  // 16 sub-blocks of 16
    case DType::Q2_K: return (64 + 16 + 16 + 8 + 6) / 64.0;
    default: return 0;  // not a packed type: no floor here
  }
}

int step_floor(const std::string& path, int batch, int context, int threads, double min_time) {
  ss::model::LoadOptions lo;
  lo.load_tokenizer = false;
  auto m = ss::model::load_model(path, lo);
  if (!m) {
    std::fprintf(stderr, "%s\n", m.error().message.c_str());
    return 1;
  }
  const ss::model::ModelConfig& c = (*m)->config;
  const ss::model::Weights& w = (*m)->weights;
  std::vector<const ss::model::Tensor*> mats;
  for (const auto& L : w.layers)
    for (const ss::model::Tensor* t : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down}) mats.push_back(t);
  mats.push_back(&w.output);
  double macs = 0, slots = 0, wbytes = 0;
  for (const ss::model::Tensor* t : mats) {
    const double tm = static_cast<double>(t->rows()) * static_cast<double>(t->cols());
    const double sp = slots_per_64(t->type);
    if (sp == 0) {
      std::fprintf(stderr, "%s: %s has no packed kernel type; no floor computed\n", path.c_str(), t->name.c_str());
      return 1;
    }
    macs += tm;
    slots += tm / 64 * sp;
    wbytes += static_cast<double>(t->nbytes);
  }
  const double vnni = vnni_peak(), fma = fma_peak();  // per core: int8 MAC/s, fp32 FMA lanes/s
  const double bw = read_bandwidth(size_t{1} << 30, threads, min_time) * 1e9;
  const double kv_bytes = 2.0 * 2 * c.n_kv_heads * c.head_dim * c.n_layers * static_cast<double>(context) * batch;
  const double attn_fma = 2.0 * c.n_heads * c.head_dim * c.n_layers * static_cast<double>(context) * batch;
  const double t_mm = batch * slots * 64 / (vnni * threads), t_w = wbytes / bw;
  const double t_af = attn_fma / (fma * threads), t_kv = kv_bytes / bw;
  const double serial = std::max(t_mm, t_w) + std::max(t_af, t_kv), strict = std::max(t_mm + t_af, t_w + t_kv);
  std::printf("model %s: %d layers, %.1f M int8 MACs a token in the products (%.2f vector ops per 64), %.1f MB of weights\n",
              path.c_str(), c.n_layers, macs / 1e6, slots * 64 / macs, wbytes / 1e6);
  std::printf("machine: %d threads, vpdpbusd %.1f G MAC/s and fp32 FMA %.1f G lanes/s a core, read %.1f GB/s (1 GiB)\n",
              threads, vnni / 1e9, fma / 1e9, bw / 1e9);
  std::printf("step of %d sequences at %d tokens: products %.3f ms of vector ops, %.3f ms of weight reads; "
              "attention %.3f ms of FMAs, %.3f ms of f16 K/V reads (%.1f MB)\n",
              batch, context, t_mm * 1e3, t_w * 1e3, t_af * 1e3, t_kv * 1e3, kv_bytes / 1e6);
  std::printf("floor: %.3f ms (products, then attention, each at its own bound: %.0f tok/s); "
              "with everything overlapped %.3f ms (%.0f tok/s)\n",
              serial * 1e3, batch / serial, strict * 1e3, batch / strict);
  return 0;
}

// ---- attention ----
// A 16-token packed matmul over >= 512 MiB of weight copies (from DRAM), one call per run().
struct ColdMatmul {
  static constexpr int64_t kIn = 576, kOut = 1536, kTok = 16;
  ss::model::Tensor W;
  std::vector<std::vector<uint8_t>> ws;
  std::vector<ss::cpu::PackedMatrix> packed;
  ss::HugeBuffer buf;
  std::vector<float> x = std::vector<float>(kTok * kIn, 0.5f), y = std::vector<float>(kTok * kOut);
  std::vector<uint8_t> scratch;
  ThreadPool pool{1};
  size_t next = 0;
  bool init() {
    W.name = "ffn_up";
    W.type = DType::Q4_1;
    W.n_dims = 2;
    W.ne[0] = kIn;
    W.ne[1] = kOut;
    W.nbytes = ss::model::row_bytes(W.type, kIn) * kOut;
    const size_t pb = ss::cpu::packed_bytes(W), copies = (size_t{512} << 20) / W.nbytes + 1;
    if (pb == 0 || !buf.allocate(pb * copies)) return false;
    for (size_t c = 0; c < copies; ++c) {
      ws.push_back(random_weights(W.type, kOut, kIn, 99 + static_cast<uint32_t>(c)));
      W.data = ws.back().data();
      packed.push_back(ss::cpu::pack_weights(W, buf.data() + c * pb, pool));
    }
    scratch.resize(ss::cpu::matmul_scratch_bytes(W.type, kIn, kTok));
    return true;
  }
  void run() {
    const size_t c = next++ % ws.size();
    W.data = ws[c].data();
    ss::cpu::matmul(W, packed[c], x.data(), kTok, kIn, y.data(), kOut, {scratch.data(), scratch.size()}, pool);
  }
};

void bench_attention(int context, const std::vector<int>& threads, double min_time) {
  namespace o = ss::cpu::ops;
  ColdMatmul mm;
  const bool overlap = std::find(threads.begin(), threads.end(), 2) != threads.end() && mm.init();
  const int n_kv = 3, n_rep = 3, hd = 64, bs = 16, n_layers = 30, pos = context - 1;
  const int nb = pos / bs + 1;
  const auto& ops = o::ops_for(Isa::Avx512 <= ss::cpu::detected_isa() ? Isa::Avx512 : ss::cpu::detected_isa());
  std::printf("decode attention (%s), context %d, %d KV x %d query heads x %d, %d layers:\n", ops.name, context, n_kv,
              n_rep, hd, n_layers);
  std::printf("%-5s %-5s %3s %10s %10s %10s %8s\n", "kv", "cache", "thr", "us/item", "best_us", "cpu_us", "GB/s");
  for (o::KvElem e : {o::KvElem::F16, o::KvElem::Q8, o::KvElem::F32}) {
    const int64_t el = e == o::KvElem::F32 ? 4 : e == o::KvElem::F16 ? 2 : 1;
    const int64_t per = static_cast<int64_t>(n_kv) * hd * bs;  // K (or V) elements of a block
    const int64_t region = per * el + (e == o::KvElem::Q8 ? 4 * n_kv * bs : 0);
    const int64_t block_bytes = 2 * region * n_layers, seq_bytes = block_bytes * nb;
    const double item_bytes = 2.0 * (pos + 1) * n_kv * hd * el;  // K and V of the visible keys
    for (const bool cold : {false, true}) {
      const int n_seq = cold ? static_cast<int>((512LL << 20) / seq_bytes + 1) : 1;
      ss::HugeBuffer buf;
      if (!buf.allocate(static_cast<size_t>(seq_bytes) * n_seq)) {
        std::fprintf(stderr, "cannot allocate %lld bytes of KV cache\n", static_cast<long long>(seq_bytes) * n_seq);
        return;
      }
      std::mt19937 g(5);
      for (size_t i = 0; i < buf.size(); i += 2) buf.data()[i] = static_cast<uint8_t>(g() & 0x3f);  // finite f16
      if (e == o::KvElem::Q8)  // sane scales
        for (int64_t b = 0; b < static_cast<int64_t>(nb) * n_seq; ++b)
          for (int k = 0; k < 2 * n_layers; ++k) {
            float* sc = reinterpret_cast<float*>(buf.data() + b * block_bytes + k * region + per);
            for (int i = 0; i < n_kv * bs; ++i) sc[i] = 0.01f;
          }
      // Sequence s holds blocks s, s + n_seq, ...: scattered, as a serving cache's are.
      std::vector<std::vector<int32_t>> tables(n_seq);
      for (int s = 0; s < n_seq; ++s)
        for (int j = 0; j < nb; ++j) tables[s].push_back(j * n_seq + s);
      for (int nthr : threads) {
        ThreadPool pool(nthr);
        struct PerThread {
          std::vector<float> q, out, scratch;
          int next = 0;
        };
        std::vector<PerThread> pt(nthr);
        for (auto& t : pt) {
          t.q.assign(static_cast<size_t>(n_kv) * n_rep * hd, 0.1f);
          t.out.resize(t.q.size());
          t.scratch.resize(o::attn_scratch_floats(hd));
        }
        const int32_t positions[1] = {pos};
        constexpr int kItems = 240;  // per thread per call: a 16-sequence decode step's share on 2 threads
        const Result r = time_it(
            [&] {
              pool.run([&](int t) {
                PerThread& p = pt[t];
                for (int i = 0; i < kItems; ++i, ++p.next) {
                  const int s = (p.next / n_layers * nthr + t) % n_seq, l = p.next % n_layers;
                  const uint8_t* base = buf.data() + 2 * l * region;
                  const o::AttnLayer L{p.q.data(), n_kv * n_rep * hd, p.out.data(), n_kv * n_rep * hd, base,
                                       base + region, block_bytes / el, hd, bs, bs, n_rep, positions, e, n_kv,
                                       per};
                  ops.attention_token(L, 0, tables[s].data(), p.scratch.data());
                }
              });
            },
            min_time, nthr);
        const double us = r.median_s * 1e6 / kItems;
        std::printf("%-5s %-5s %3d %10.2f %10.2f %10.2f %8.1f\n",
                    e == o::KvElem::F16 ? "f16" : e == o::KvElem::Q8 ? "q8_0" : "f32", cold ? "cold" : "hot", nthr, us,
                    r.best_s * 1e6 / kItems, r.cpu_s * 1e6 / kItems, item_bytes * nthr / us / 1e3);
      }
      if (cold && overlap) {  // attention on this thread, the matmul on another, then the matmul alone
        std::atomic<bool> stop{false};
        long calls = 0, items = 0;
        std::thread other([&] {
          for (; !stop.load(std::memory_order_relaxed); ++calls) mm.run();
        });
        std::vector<float> q(static_cast<size_t>(n_kv) * n_rep * hd, 0.1f), out(q.size()),
            scratch(o::attn_scratch_floats(hd));
        const int32_t positions[1] = {pos};
        const auto t0 = Clock::now();
        double secs = 0;
        for (; secs < 3 * min_time; ++items, secs = std::chrono::duration<double>(Clock::now() - t0).count()) {
          const int s = static_cast<int>(items / n_layers % n_seq), l = static_cast<int>(items % n_layers);
          const uint8_t* base = buf.data() + 2 * l * region;
          const o::AttnLayer L{q.data(), n_kv * n_rep * hd, out.data(), n_kv * n_rep * hd, base, base + region,
                               block_bytes / el, hd, bs, bs, n_rep, positions, e, n_kv, per};
          ops.attention_token(L, 0, tables[s].data(), scratch.data());
        }
        stop = true;
        other.join();
        const Result alone = time_it([&] { mm.run(); }, min_time, 1);
        std::printf("%-5s %-5s %3d %10.2f   (matmul 16x%lldx%lld on the other thread: %.1f us/call; alone %.1f)\n",
                    e == o::KvElem::F16 ? "f16" : e == o::KvElem::Q8 ? "q8_0" : "f32", "+mm", 2, secs * 1e6 / items,
                    static_cast<long long>(ColdMatmul::kIn), static_cast<long long>(ColdMatmul::kOut),
                    secs * 1e6 / calls, alone.median_s * 1e6);
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<Isa> isas;
  std::vector<int> threads{1, 2}, ntoks{1, 512};
  double min_time = 0.3;
  bool floors = false, cold = false, attention = false;
  int context = 130, batch = 16;
  std::string type_override, shape_filter, floor_model;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--isa") {
      const std::string v = next();
      for (Isa x : {Isa::Scalar, Isa::Avx2, Isa::Avx512})
        if (v == "all" || v == ss::cpu::isa_name(x)) isas.push_back(x);
    } else if (a == "--threads") {
      threads = parse_list(next());
    } else if (a == "--ntok") {
      ntoks = parse_list(next());
    } else if (a == "--min-time") {
      min_time = std::atof(next());
    } else if (a == "--floors") {
      floors = true;
    } else if (a == "--type") {
      type_override = next();
    } else if (a == "--shape") {
      shape_filter = next();
    } else if (a == "--cold") {
      cold = true;
    } else if (a == "--attention") {
      attention = true;
    } else if (a == "--context") {
      context = std::max(1, std::atoi(next()));
    } else if (a == "--step-floor") {
      floor_model = next();
    } else if (a == "--batch") {
      batch = std::max(1, std::atoi(next()));
    } else {
      std::fprintf(stderr, "unknown argument %s (see the comment at the top of tools/bench_kernels.cpp)\n", argv[i]);
      return 2;
    }
  }
  if (isas.empty()) isas = {Isa::Avx2, Isa::Avx512};
  if (!floor_model.empty()) {
    if (ss::cpu::detected_isa() < Isa::Avx512) {
      std::fprintf(stderr, "--step-floor models the AVX-512 VNNI kernels; this CPU has none\n");
      return 1;
    }
    return step_floor(floor_model, batch, context, threads.size() == 1 ? threads[0] : 2, min_time);
  }
  if (attention) {
    bench_attention(context, threads, min_time);
    return 0;
  }

  if (floors) {
    std::printf("read bandwidth GB/s (threads 1 / 2):\n");
    for (size_t mb : {1, 64, 1024}) {
      std::printf("  %5zu MiB: %7.1f / %7.1f\n", mb, read_bandwidth(mb << 20, 1, min_time),
                  read_bandwidth(mb << 20, 2, min_time));
    }
    std::printf("per core: vpdpbusd zmm %.1f G int8-MAC/s, fp32 FMA zmm %.1f GFLOP/s\n", vnni_peak() / 1e9,
                2 * fma_peak() / 1e9);
    namespace d = ss::cpu::detail;
    // Activation quantization alone (part of every quantized matmul): a prefill's 512 tokens in the
    // tiled kernel's 16-token groups, and a decode step's 16 tokens row-major (the packed kernel's).
    for (const int group : {16, 1})
      for (int64_t cols : {576, 1536}) {
        const int n_tok = group == 16 ? 512 : 16;
        std::vector<float> x(static_cast<size_t>(cols * n_tok));
        std::mt19937 g(7);
        std::normal_distribution<float> nd(0.0f, 1.0f);
        for (float& v : x) v = nd(g);
        std::vector<uint8_t> scratch(d::qacts_bytes(cols, n_tok));
        const d::QActs a = d::carve_qacts(scratch.data(), cols, n_tok, group, 32);
        const Result r =
            time_it([&] { d::avx512::quantize(DType::Q4_1, x.data(), cols, 0, n_tok, a); }, min_time, 1);
        std::printf("quantize %d x %lld activations (avx512, 1 thread, %d-token groups): %.2f us\n", n_tok,
                    static_cast<long long>(cols), group, r.cpu_s * 1e6);
      }
  }

  std::printf("%-7s %3s %-22s %-5s %5s %-10s %10s %10s %10s %9s %8s\n", "isa", "thr", "shape", "type", "n_tok",
              "path", "median_us", "best_us", "cpu_us", "GFLOP/s", "GB/s");
  for (Isa isa : isas) {
    if (isa > ss::cpu::detected_isa()) continue;
    ss::cpu::force_isa(isa);
    for (int nthr : threads) {
      ThreadPool pool(nthr);
      for (Shape s : kShapes) {
        if (!shape_filter.empty() && std::string(s.name).find(shape_filter) == std::string::npos) continue;
        for (uint32_t id = 0; id < 64 && !type_override.empty(); ++id)
          if (const auto* ti = ss::model::dtype_info(id); ti && ti->name == type_override) s.type = DType(id);
        if (s.in % ss::model::info(s.type).block_size != 0) continue;  // e.g. K types need 256 | in
        const size_t wbytes = ss::model::row_bytes(s.type, s.in) * static_cast<size_t>(s.out);
        const size_t copies = cold ? std::max<size_t>(1, (size_t{1} << 30) / wbytes) : 1;
        std::vector<std::vector<uint8_t>> ws;
        for (size_t c = 0; c < copies; ++c) ws.push_back(random_weights(s.type, s.out, s.in, 1234 + c));
        ss::model::Tensor W;
        W.name = s.name;
        W.type = s.type;
        W.n_dims = 2;
        W.ne[0] = s.in;
        W.ne[1] = s.out;
        W.nbytes = wbytes;
        std::vector<ss::cpu::PackedMatrix> packed;  // the packed form of each copy (empty when none)
        ss::HugeBuffer packed_buf;
        if (const size_t pb = ss::cpu::packed_bytes(W); pb && packed_buf.allocate(pb * copies))  // 0: none on this ISA
          for (size_t c = 0; c < copies; ++c) {
            W.data = ws[c].data();
            packed.push_back(ss::cpu::pack_weights(W, packed_buf.data() + c * pb, pool));
          }
        const bool has_packed = !packed.empty() && !packed[0].empty();
        for (int n_tok : ntoks) {
          std::vector<float> x(static_cast<size_t>(n_tok * s.in)), y(static_cast<size_t>(n_tok * s.out));
          std::mt19937 g(7);
          std::normal_distribution<float> nd;
          for (auto& v : x) v = nd(g);
          const size_t sb = ss::cpu::matmul_scratch_bytes(s.type, s.in, n_tok);
          std::vector<uint8_t> scratch(sb);
          const double flops = 2.0 * static_cast<double>(s.in) * static_cast<double>(s.out) * n_tok;
          // 0: matmul on the tensor, 1: per-token kernel forced, 2: matmul through the packed form.
          std::vector<std::pair<const char*, int>> paths{{"matmul", 0}};
          const bool q32 = ss::model::info(s.type).block_size == 32;
          if (n_tok > 1 && isa != Isa::Scalar && q32) paths.push_back({"per-token*", 1});
          if (has_packed) paths.push_back({"packed", 2});
          for (auto [path, forced] : paths) {
            size_t c = 0;
            const Result r = time_it(
                [&] {
                  W.data = ws[c].data();
                  const size_t pc = c;
                  c = (c + 1) % copies;
                  if (forced == 1) matmul_per_token(isa, W, x.data(), n_tok, y.data(), scratch.data(), pool);
                  else if (forced == 2)
                    ss::cpu::matmul(W, packed[pc], x.data(), n_tok, s.in, y.data(), s.out, {scratch.data(), sb}, pool);
                  else ss::cpu::matmul(W, x.data(), n_tok, s.in, y.data(), s.out, {scratch.data(), sb}, pool);
                },
                isa == Isa::Scalar && n_tok > 1 ? 0.0 : min_time, nthr);
            // Rates from the CPU-time column (see time_it).
            std::printf("%-7s %3d %-22s %-5s %5d %-10s %10.1f %10.1f %10.1f %9.1f %8.1f\n", ss::cpu::isa_name(isa),
                        nthr, s.name, std::string(ss::model::dtype_name(s.type)).c_str(), n_tok, path,
                        r.median_s * 1e6, r.best_s * 1e6, r.cpu_s * 1e6, flops / r.cpu_s / 1e9,
                        static_cast<double>(wbytes) / r.cpu_s / 1e9);
            std::fflush(stdout);
          }
        }
      }
    }
  }
  return 0;
}
