// The CUDA backend against independent references, on the GPU (CTest label `gpu`; without a usable
// GPU every test reports itself skipped): the tiny models' logits at every position against Hugging
// Face transformers' float32 forward (tests/data/reference, tools/reference/make_synth_model.py),
// through a one-step prefill, token-by-token decode through the paged cache, and two sequences in one
// batch; the device's greedy pick against the argmax of the logits it returned; a host-sampled row
// against the reference sampler.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "engine/engine.h"
#include "model/model.h"
#include "model/quant.h"
#include "model/synth.h"

namespace {

using ss::backend::Backend;
using ss::backend::BackendOptions;
using ss::backend::StepBatch;
using ss::backend::StepOutput;
using json = nlohmann::json;

const std::string kData = std::string(SS_SOURCE_DIR) + "/tests/data";

// bf16 keeps 8 significant bits: weights and every matmul input are rounded (relative 2^-9 each),
// about ten roundings stand between the embedding and a logit of these 2-layer models, and they add
// up like a random walk (~1.3%). Allowed: 4% of the row's largest |logit|; top-1 must agree wherever
// the reference's top-2 margin is more than twice that.
constexpr double kBf16RelTol = 0.04;

#define SKIP_WITHOUT_GPU()                                  \
  do {                                                      \
    if (ss::backend::cuda_device_summary().empty()) {       \
      GTEST_SKIP() << "no CUDA device";                     \
    }                                                       \
  } while (0)

struct Ref {
  std::vector<std::vector<int32_t>> ids;
  std::vector<std::vector<float>> logits;  // per sequence [n][V]
  int V = 0;
};

Ref load_ref(const std::string& name) {
  Ref r;
  std::ifstream jf(kData + "/reference/" + name + ".json");
  const json j = json::parse(jf);
  std::ifstream bf(kData + "/reference/" + j["logits_file"].get<std::string>(), std::ios::binary);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(bf)), {});
  r.V = j["vocab_size"];
  size_t off = 0;
  for (const auto& s : j["sequences"]) {
    r.ids.push_back(s["ids"].get<std::vector<int32_t>>());
    std::vector<float> l(r.ids.back().size() * static_cast<size_t>(r.V));
    if (off + l.size() * 4 <= bytes.size()) std::memcpy(l.data(), bytes.data() + off, l.size() * 4);
    off += l.size() * 4;
    r.logits.push_back(std::move(l));
  }
  return r;
}

std::unique_ptr<ss::model::Model> load(const std::string& path) {
  ss::model::LoadOptions lo;
  lo.load_tokenizer = false;
  auto m = ss::model::load_model(path, lo);
  EXPECT_TRUE(m.ok()) << (m.ok() ? "" : m.message());
  return m.ok() ? std::move(m).value() : nullptr;
}

std::unique_ptr<Backend> cuda_backend(const ss::model::Model& m, bool native_quant = false) {
  BackendOptions o;
  o.gpu_native_quant = native_quant;
  o.gpu_device_sampling = false;  // the host sampler (DeviceSamplingEqualsTheHostSampler turns it on)
  o.kv.num_blocks = 128;
  o.kv.block_size = 16;
  o.max_batch_tokens = 1024;  // two of the longest reference sequences (300 tokens) in one step
  o.max_slots = 512;          // logits rows for every token of such a step
  auto be = ss::backend::make_cuda_backend(m, o);
  EXPECT_TRUE(be.ok()) << (be.ok() ? "" : be.message());
  return be.ok() ? std::move(be).value() : nullptr;
}

// Blocks first, first + 1, ... enough for n tokens (16 per block; at most 32 blocks per table here).
std::vector<int32_t> blocks(int first, int n) {
  std::vector<int32_t> t;
  for (int i = 0; i < (n + 15) / 16; ++i) t.push_back(first + i);
  EXPECT_LE(t.size(), 32u);
  return t;
}

// Compares one position's logits with the reference row.
void expect_close(const float* got, const float* ref, int V, const std::string& what) {
  float mx = 0;
  for (int v = 0; v < V; ++v) mx = std::max(mx, std::fabs(ref[v]));
  const double tol = kBf16RelTol * std::max(1.0f, mx);
  double worst = 0;
  for (int v = 0; v < V; ++v) worst = std::max(worst, static_cast<double>(std::fabs(got[v] - ref[v])));
  EXPECT_LE(worst, tol) << what;
  const int rg = static_cast<int>(std::max_element(ref, ref + V) - ref);
  const int gg = static_cast<int>(std::max_element(got, got + V) - got);
  std::vector<float> s(ref, ref + V);
  std::nth_element(s.begin(), s.begin() + 1, s.end(), std::greater<float>());
  if (s[0] - s[1] > 2 * tol) {
    EXPECT_EQ(gg, rg) << what << ": top-1 differs where the reference margin is " << s[0] - s[1];
  }
}

class CudaForward : public ::testing::TestWithParam<const char*> {};

TEST_P(CudaForward, PrefillDecodeAndBatchedMatchTransformers) {
  SKIP_WITHOUT_GPU();
  const Ref ref = load_ref(GetParam());
  auto model = load(kData + "/models/" + GetParam());
  ASSERT_NE(model, nullptr);
  auto be = cuda_backend(*model);
  ASSERT_NE(be, nullptr);
  ASSERT_EQ(be->vocab_size(), ref.V);
  const int V = ref.V;
  StepOutput out;
  for (size_t s = 0; s < ref.ids.size(); ++s) {
    const auto& ids = ref.ids[s];
    const int n = static_cast<int>(ids.size());
    const auto table = blocks(0, n), decode_table = blocks(32, n);
    // Prefill: every position in one step.
    StepBatch b;
    b.seq_slot = {0};
    b.edit_table(0, 0, table);
    for (int i = 0; i < n; ++i) {
      b.tokens.push_back(ids[static_cast<size_t>(i)]);
      b.positions.push_back(i);
      b.seq_index.push_back(0);
      b.logits_rows.push_back(i);
    }
    ASSERT_TRUE(be->step(b, out).ok());
    ASSERT_EQ(out.logits.size(), static_cast<size_t>(n) * V);
    for (int i = 0; i < n; ++i)
      expect_close(out.logits.data() + static_cast<size_t>(i) * V, ref.logits[s].data() + static_cast<size_t>(i) * V,
                   V, std::string(GetParam()) + " prefill seq " + std::to_string(s) + " pos " + std::to_string(i));
    // Decode: the first token again, then one token per step through the cache (slot 1).
    for (int i = 0; i < n; ++i) {
      StepBatch d;
      d.seq_slot = {1};
      if (i == 0) d.edit_table(1, 0, decode_table);
      d.tokens = {ids[static_cast<size_t>(i)]};
      d.positions = {i};
      d.seq_index = {0};
      d.logits_rows = {0};
      ASSERT_TRUE(be->step(d, out).ok());
      expect_close(out.logits.data(), ref.logits[s].data() + static_cast<size_t>(i) * V, V,
                   std::string(GetParam()) + " decode seq " + std::to_string(s) + " pos " + std::to_string(i));
    }
  }
  // Two sequences interleaved in one batch (slots 2 and 3).
  if (ref.ids.size() >= 2) {
    StepBatch b;
    b.seq_slot = {2, 3};
    b.edit_table(2, 0, blocks(64, static_cast<int>(ref.ids[0].size())));
    b.edit_table(3, 0, blocks(96, static_cast<int>(ref.ids[1].size())));
    std::vector<std::pair<int, int>> where;
    const size_t longest = std::max(ref.ids[0].size(), ref.ids[1].size());
    for (size_t p = 0; p < longest; ++p)
      for (int s = 0; s < 2; ++s)
        if (p < ref.ids[static_cast<size_t>(s)].size()) {
          b.tokens.push_back(ref.ids[static_cast<size_t>(s)][p]);
          b.positions.push_back(static_cast<int32_t>(p));
          b.seq_index.push_back(s);
          b.logits_rows.push_back(static_cast<int32_t>(where.size()));
          where.emplace_back(s, static_cast<int>(p));
        }
    ASSERT_TRUE(be->step(b, out).ok());
    for (size_t r = 0; r < where.size(); ++r)
      expect_close(out.logits.data() + r * V,
                   ref.logits[static_cast<size_t>(where[r].first)].data() + static_cast<size_t>(where[r].second) * V, V,
                   std::string(GetParam()) + " batched row " + std::to_string(r));
  }
}

INSTANTIATE_TEST_SUITE_P(TinyModels, CudaForward, ::testing::Values("qwen2-tiny", "qwen3-tiny", "llama3-tiny"));

// The device's greedy pick is the argmax of the very logits it computed (ties: the lowest id); a row
// that needs the full sampler gets the reference sampler's draw on those logits.
TEST(CudaSampling, DeviceGreedyAndHostSampledRows) {
  SKIP_WITHOUT_GPU();
  auto model = load(kData + "/models/qwen2-tiny");
  ASSERT_NE(model, nullptr);
  auto be = cuda_backend(*model);
  ASSERT_NE(be, nullptr);
  const int V = be->vocab_size();
  const Ref ref = load_ref("qwen2-tiny");
  const auto& ids = ref.ids[0];
  ss::backend::SamplingParams greedy, warm;
  greedy.temperature = 0.0f;
  warm.temperature = 0.8f;
  warm.seed = 1234;
  for (const auto* params : {&greedy, &warm}) {
    StepBatch b;
    b.seq_slot = {0};
    b.edit_table(0, 0, std::vector<int32_t>{0, 1, 2, 3});
    for (size_t i = 0; i < ids.size(); ++i) {
      b.tokens.push_back(ids[i]);
      b.positions.push_back(static_cast<int32_t>(i));
      b.seq_index.push_back(0);
    }
    const int last = static_cast<int>(ids.size()) - 1;
    ss::backend::SampleRow row;
    row.token = last;
    row.params = params;
    row.n = 5;
    b.sample_rows = {row};
    b.logits_rows = {last};  // the same row's raw logits, to check the pick against
    StepOutput out;
    ASSERT_TRUE(be->step(b, out).ok());
    ASSERT_EQ(out.tokens.size(), 1u);
    ASSERT_EQ(out.logits.size(), static_cast<size_t>(V));
    std::vector<float> l = out.logits;
    ss::backend::RowSampler rs(V);
    const int32_t want = rs.sample(l.data(), *params, 5, {}, {});
    EXPECT_EQ(out.tokens[0], want) << "temperature " << params->temperature;
  }
}

// A grammar stand-in: ids that are multiples of `mod` may come next.
class EveryNth final : public ss::backend::TokenMask {
 public:
  explicit EveryNth(int mod) : mod_(mod) {}
  bool allows(int32_t t) override { return t % mod_ == 0; }
  void mask(float* logits, int n) override {
    for (int t = 0; t < n; ++t)
      if (t % mod_ != 0) logits[t] = -INFINITY;
  }
  void accept(int32_t) override {}
  bool must_end() const override { return false; }

 private:
  int mod_;
};

// BackendOptions::gpu_device_sampling: every kind of row drawn on the device equals the host
// reference sampler's draw on the very logits the device computed (the same row's raw logits come
// back beside it): temperature with and without top-k / top-p / min-p, greedy and sampled rows with
// repetition / presence / frequency penalties, logit bias, banned ids, logprobs, and a grammar mask
// both consulted after the draw (a refused draw redrawn at counter 2n + 1) and applied first.
TEST(CudaSampling, DeviceSamplingEqualsTheHostSampler) {
  SKIP_WITHOUT_GPU();
  auto model = load(kData + "/models/qwen2-tiny");
  ASSERT_NE(model, nullptr);
  BackendOptions o;
  o.kv.num_blocks = 64;
  o.kv.block_size = 16;
  o.max_batch_tokens = 512;
  o.max_slots = 64;
  o.gpu_device_sampling = true;
  auto made = ss::backend::make_cuda_backend(*model, o);
  ASSERT_TRUE(made.ok()) << made.message();
  Backend& be = **made;
  const int V = be.vocab_size();
  const Ref ref = load_ref("qwen2-tiny");
  const auto& ids = ref.ids[0];
  const int last = static_cast<int>(ids.size()) - 1;
  const std::vector<int32_t> prompt(ids.begin(), ids.end());
  std::vector<int32_t> output;
  for (int i = 0; i < 40; ++i) output.push_back(static_cast<int32_t>((i * 7919) % V));
  using ss::backend::SamplingParams;
  struct Case {
    SamplingParams p;
    std::vector<int32_t> banned;
    int logprobs = -1;
    int mask_mod = 0;  // 0: no mask
  };
  auto params = [](float t, uint64_t seed) {
    SamplingParams p;
    p.temperature = t;
    p.seed = seed;
    return p;
  };
  std::vector<Case> cases;
  cases.push_back({params(0.8f, 1), {}, -1, 0});
  cases.push_back({params(1.3f, 2), {}, -1, 0});
  { Case c{params(0.9f, 3), {}, -1, 0}; c.p.top_k = 5; cases.push_back(c); }
  { Case c{params(1.0f, 4), {}, -1, 0}; c.p.top_p = 0.9f; cases.push_back(c); }
  { Case c{params(1.0f, 5), {}, -1, 0}; c.p.min_p = 0.05f; cases.push_back(c); }
  { Case c{params(0.0f, 0), {}, -1, 0}; c.p.repetition_penalty = 1.3f; cases.push_back(c); }
  { Case c{params(0.7f, 6), {}, -1, 0}; c.p.presence_penalty = 0.5f; c.p.frequency_penalty = 0.3f; cases.push_back(c); }
  { Case c{params(0.0f, 0), {}, -1, 0}; c.p.logit_bias = {{5, 100.0f}, {7, -3.5f}}; cases.push_back(c); }
  { Case c{params(0.6f, 7), {}, -1, 0}; c.p.logit_bias = {{11, 4.0f}}; c.p.repetition_penalty = 1.1f; cases.push_back(c); }
  cases.push_back({params(0.0f, 0), {0, 1, 2, 3}, -1, 0});
  cases.push_back({params(0.9f, 8), {}, 5, 0});
  cases.push_back({params(0.0f, 0), {}, 3, 0});
  cases.push_back({params(1.0f, 9), {}, -1, 3});   // consulted after the draw
  cases.push_back({params(0.0f, 0), {}, -1, 5});   // greedy, consulted after the draw
  { Case c{params(1.0f, 10), {}, -1, 4}; c.p.top_k = 8; cases.push_back(c); }  // applied first
  cases.push_back({params(0.8f, 11), {}, 4, 3});   // logprobs: applied first
  for (uint64_t n : {0ull, 3ull, 17ull}) {
    StepBatch b;
    b.seq_slot = {0};
    b.edit_table(0, 0, blocks(0, static_cast<int>(ids.size())));
    for (size_t i = 0; i < ids.size(); ++i) {
      b.tokens.push_back(ids[i]);
      b.positions.push_back(static_cast<int32_t>(i));
      b.seq_index.push_back(0);
    }
    std::vector<std::unique_ptr<EveryNth>> masks;
    for (const Case& c : cases) {
      ss::backend::SampleRow row;
      row.token = last;
      row.params = &c.p;
      row.n = n;
      row.prompt = prompt;
      row.output = std::span<const int32_t>(output.data(), static_cast<size_t>(n) + 5);
      row.banned = c.banned;
      row.logprobs = c.logprobs;
      if (c.mask_mod) {
        masks.push_back(std::make_unique<EveryNth>(c.mask_mod));
        row.mask = masks.back().get();
      }
      b.sample_rows.push_back(row);
    }
    b.logits_rows = {last};
    StepOutput out;
    const auto st = be.step(b, out);
    ASSERT_TRUE(st.ok()) << st.message();
    ASSERT_EQ(out.tokens.size(), cases.size());
    ASSERT_EQ(out.logits.size(), static_cast<size_t>(V));
    for (size_t i = 0; i < cases.size(); ++i) {
      const Case& c = cases[i];
      const ss::backend::SampleRow& row = b.sample_rows[i];
      std::vector<float> l = out.logits;
      for (int32_t id : c.banned) l[static_cast<size_t>(id)] = -INFINITY;
      EveryNth m(std::max(1, c.mask_mod));
      ss::backend::RowSampler rs(V);
      const bool lp = c.logprobs >= 0;
      const int32_t want = rs.sample(l.data(), c.p, n, row.prompt, row.output, c.mask_mod ? &m : nullptr, lp);
      EXPECT_EQ(out.tokens[i], want) << "case " << i << " n " << n << " T " << c.p.temperature;
      if (!lp) continue;
      ss::backend::RowLogprobs h;
      ss::backend::row_logprobs(l.data(), V, want, c.logprobs, h);
      const auto& d = out.logprobs[i];
      EXPECT_NEAR(d.chosen, h.chosen, 1e-4) << "case " << i;
      ASSERT_EQ(d.top.size(), h.top.size()) << "case " << i;
      for (size_t j = 0; j < h.top.size(); ++j) {
        EXPECT_EQ(d.top[j].first, h.top[j].first) << "case " << i << " rank " << j;
        EXPECT_NEAR(d.top[j].second, h.top[j].second, 1e-4) << "case " << i << " rank " << j;
      }
    }
  }
}

}  // namespace

// Greedy text through the engine on the GPU is the same with CUDA graphs (decode steps replayed
// per batch-size bucket, padded) and without; and a request's tokens do not change when three
// others share its decode steps (their rows pad a bucket of 4 instead of 1) — checked against the
// request alone, eager.
namespace {
std::vector<std::vector<int32_t>> run_engine(const ss::model::Model& m, bool eager,
                                             const std::vector<std::vector<int32_t>>& prompts,
                                             bool batch_invariant = false) {
  BackendOptions o;
  o.kv.num_blocks = 128;
  o.kv.block_size = 16;
  o.max_batch_tokens = 512;
  o.max_slots = batch_invariant ? 16 : 8;
  o.enforce_eager = eager;
  o.batch_invariant = batch_invariant;
  auto be = ss::backend::make_cuda_backend(m, o);
  EXPECT_TRUE(be.ok()) << (be.ok() ? "" : be.message());
  if (!be.ok()) return {};
  ss::engine::EngineConfig ec;
  ec.scheduler.max_num_seqs = batch_invariant ? 16 : 8;
  ec.scheduler.max_num_batched_tokens = 512;
  auto e = ss::engine::Engine::create(**be, ec);
  EXPECT_TRUE(e.ok());
  std::vector<std::vector<int32_t>> out(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    ss::engine::Request r;
    r.prompt = prompts[i];
    r.max_tokens = 24;
    r.sampling.temperature = 0.0f;
    r.on_event = [&out, i](const ss::engine::TokenEvent& ev) {
      if (ev.token >= 0) out[i].push_back(ev.token);
    };
    EXPECT_TRUE((*e)->add_request(std::move(r)).ok());
  }
  while ((*e)->has_work()) EXPECT_TRUE((*e)->step().ok());
  return out;
}
}  // namespace

TEST(CudaGraphs, GreedyTextSameWithAndWithoutGraphs) {
  SKIP_WITHOUT_GPU();
  auto model = load(kData + "/models/qwen2-tiny");
  ASSERT_NE(model, nullptr);
  const Ref ref = load_ref("qwen2-tiny");
  const std::vector<std::vector<int32_t>> one = {ref.ids[0]};
  const auto eager = run_engine(*model, true, one);
  const auto graphs = run_engine(*model, false, one);
  ASSERT_EQ(eager.size(), 1u);
  EXPECT_EQ(eager[0].size(), 24u);
  EXPECT_EQ(graphs, eager);
  std::vector<std::vector<int32_t>> four = {ref.ids[0], ref.ids[1], ref.ids[2], ref.ids[0]};
  const auto shared = run_engine(*model, false, four);
  ASSERT_EQ(shared.size(), 4u);
  EXPECT_EQ(shared[0], eager[0]) << "batch-invariance of the graph path (cuBLAS at n=1 vs n=4)";
  EXPECT_EQ(shared[3], eager[0]);
}

namespace {
// A real head shape cut to two layers and a 512-token vocabulary, bf16 safetensors in dir; with the
// CPU backend's options for comparing against it (f32 KV cache).
std::unique_ptr<ss::model::Model> two_layer_synth(const char* shape, uint64_t seed, const std::string& dir) {
  ss::model::SynthOptions so;
  so.shape = shape;
  so.layers = 2;
  so.vocab = 512;
  so.format = ss::model::SynthFormat::Safetensors;
  so.dtype = ss::model::DType::BF16;
  so.seed = seed;
  so.out = dir;
  auto w = ss::model::write_synth_model(so);
  EXPECT_TRUE(w.ok()) << (w.ok() ? "" : w.message());
  return w.ok() ? load(dir) : nullptr;
}
BackendOptions cpu_reference_options(int max_slots, int threads) {
  BackendOptions o;
  o.kv.num_blocks = 64;
  o.kv.block_size = 16;
  o.kv.dtype = ss::backend::KvCacheConfig::DType::F32;
  o.max_batch_tokens = 512;
  o.max_slots = max_slots;
  o.threads = threads;
  return o;
}
}  // namespace

// Real head shapes (SmolLM2's: head_dim 64, GQA 3, Llama 3.2-1B's: head_dim 64, GQA 4), cut to two
// layers and a small vocabulary: the split attention kernel's path through the backend, against the
// CPU backend (f32 KV cache) on the same file, at every position of a 300-token sequence.
TEST(CudaForwardRealHeads, MatchesTheCpuBackend) {
  SKIP_WITHOUT_GPU();
  for (const char* shape : {"smollm2-135m", "llama32-1b"}) {
    auto model = two_layer_synth(shape, 7, std::string(::testing::TempDir()) + "/synth-" + shape);
    ASSERT_NE(model, nullptr);
    auto cpu = ss::backend::make_cpu_backend(*model, cpu_reference_options(512, 4));
    ASSERT_TRUE(cpu.ok()) << (cpu.ok() ? "" : cpu.message());
    auto gpu = cuda_backend(*model);
    ASSERT_NE(gpu, nullptr);
    const int V = gpu->vocab_size(), n = 300;
    StepBatch b;
    b.seq_slot = {0};
    b.edit_table(0, 0, blocks(0, n));
    for (int i = 0; i < n; ++i) {
      b.tokens.push_back(static_cast<int32_t>((i * 7919) % V));
      b.positions.push_back(i);
      b.seq_index.push_back(0);
      b.logits_rows.push_back(i);
    }
    StepOutput co, go;
    ASSERT_TRUE((*cpu)->step(b, co).ok());
    ASSERT_TRUE(gpu->step(b, go).ok());
    for (int i = 0; i < n; ++i)
      expect_close(go.logits.data() + static_cast<size_t>(i) * V, co.logits.data() + static_cast<size_t>(i) * V, V,
                   std::string(shape) + " position " + std::to_string(i));
  }
}

// SS_CUDA_MEGA for the backends made while one lives (the persistent decode kernel is opt-in).
class MegaEnv {
 public:
  explicit MegaEnv(bool on) { on ? setenv("SS_CUDA_MEGA", "1", 1) : unsetenv("SS_CUDA_MEGA"); }
  ~MegaEnv() { unsetenv("SS_CUDA_MEGA"); }
};

// The persistent decode kernel (SS_CUDA_MEGA=1, kernels/mega.cu) on real head shapes: SmolLM2-135M's
// (head_dim 64, GQA 3), Llama-3.2-1B's (64, GQA 4) and Llama-3-8B's (128, GQA 4, hidden 4096, FFN
// 14336), cut to two layers and a 512-token vocabulary. After a prefill of eight prompts of 31-52
// tokens: decode steps of one, three and eight rows and a five-token prompt chunk, each against the
// CPU backend (f32 KV cache) on the same file. Then batch invariance: one sequence's logits, bit for
// bit, alone and beside seven others; and greedy text through the engine the same with and without
// graphs (the kernel's cooperative launch captured and replayed).
TEST(CudaMegakernel, DecodeStepsMatchTheCpuBackend) {
  SKIP_WITHOUT_GPU();
  for (const char* shape : {"smollm2-135m", "llama32-1b", "llama3-8b"}) {
    auto model = two_layer_synth(shape, 11, std::string(::testing::TempDir()) + "/synth-mega-" + shape);
    ASSERT_NE(model, nullptr);
    auto cpu = ss::backend::make_cpu_backend(*model, cpu_reference_options(16, 8));
    ASSERT_TRUE(cpu.ok()) << (cpu.ok() ? "" : cpu.message());
    std::unique_ptr<Backend> gpu;
    {
      MegaEnv on(true);
      gpu = cuda_backend(*model);
    }
    ASSERT_NE(gpu, nullptr);
    const int V = gpu->vocab_size();
    auto tok = [&](int seq, int pos) { return static_cast<int32_t>((seq * 131 + pos * 7919 + 17) % V); };
    std::vector<int> len(10);
    auto table = [&](StepBatch& b, int slot) { b.edit_table(slot, 0, blocks(4 * slot, 64)); };
    // Slots 0-7: prompts of 31 + 3i tokens; slots 8 and 9: slot 0's prompt again (invariance below).
    StepBatch pre;
    for (int s = 0; s < 10; ++s) {
      pre.seq_slot.push_back(s);
      table(pre, s);
      const int src = s >= 8 ? 0 : s;
      len[static_cast<size_t>(s)] = 31 + 3 * src;
      for (int i = 0; i < len[static_cast<size_t>(s)]; ++i) {
        pre.tokens.push_back(tok(src, i));
        pre.positions.push_back(i);
        pre.seq_index.push_back(s);
      }
    }
    StepOutput co, go;
    ASSERT_TRUE((*cpu)->step(pre, co).ok());
    ASSERT_TRUE(gpu->step(pre, go).ok());
    // steps: {slot, tokens it adds}
    const std::vector<std::vector<std::pair<int, int>>> steps = {
        {{0, 1}}, {{1, 1}, {2, 1}, {3, 1}}, {{0, 1}, {1, 1}, {2, 1}, {3, 1}, {4, 1}, {5, 1}, {6, 1}, {7, 1}}, {{4, 5}}};
    for (size_t k = 0; k < steps.size(); ++k) {
      StepBatch b;
      for (const auto& [slot, n] : steps[k]) {
        const int si = static_cast<int>(b.seq_slot.size());
        b.seq_slot.push_back(slot);
        for (int i = 0; i < n; ++i) {
          int& p = len[static_cast<size_t>(slot)];
          b.logits_rows.push_back(static_cast<int32_t>(b.tokens.size()));
          b.tokens.push_back(tok(slot, p));
          b.positions.push_back(p++);
          b.seq_index.push_back(si);
        }
      }
      ASSERT_TRUE((*cpu)->step(b, co).ok());
      ASSERT_TRUE(gpu->step(b, go).ok()) << shape << " step " << k;
      ASSERT_EQ(go.logits.size(), b.logits_rows.size() * static_cast<size_t>(V));
      for (size_t r = 0; r < b.logits_rows.size(); ++r)
        expect_close(go.logits.data() + r * V, co.logits.data() + r * V, V,
                     std::string(shape) + " step " + std::to_string(k) + " row " + std::to_string(r));
    }
    // Slot 8 alone, then slot 9 (the same prompt, token and position) beside seven others.
    StepBatch one;
    one.seq_slot = {8};
    one.tokens = {tok(0, 31)};
    one.positions = {31};
    one.seq_index = {0};
    one.logits_rows = {0};
    ASSERT_TRUE(gpu->step(one, go).ok());
    const std::vector<float> alone = go.logits;
    StepBatch eight;
    for (int s = 1; s <= 7; ++s) {
      eight.seq_slot.push_back(s);
      eight.tokens.push_back(tok(s, len[static_cast<size_t>(s)]));
      eight.positions.push_back(len[static_cast<size_t>(s)]);
      eight.seq_index.push_back(s - 1);
      if (s == 4) {  // slot 9 in the middle of the batch
        eight.seq_slot.push_back(9);
        eight.tokens.push_back(tok(0, 31));
        eight.positions.push_back(31);
        eight.seq_index.push_back(static_cast<int32_t>(eight.seq_slot.size()) - 1);
        eight.logits_rows = {static_cast<int32_t>(eight.tokens.size()) - 1};
      }
    }
    ASSERT_EQ(eight.tokens.size(), 8u);
    ASSERT_TRUE(gpu->step(eight, go).ok());
    ASSERT_EQ(go.logits.size(), alone.size());
    EXPECT_EQ(0, std::memcmp(go.logits.data(), alone.data(), sizeof(float) * alone.size()))
        << shape << ": a row's logits depend on what shares its step";
  }
  // Greedy text through the engine, eager and graph-replayed: the same tokens, and a prompt's text
  // the same alone and beside three others.
  const std::string dir = std::string(::testing::TempDir()) + "/synth-mega-smollm2-135m";
  auto model = load(dir);
  ASSERT_NE(model, nullptr);
  const std::vector<int32_t> p0 = {5, 77, 300, 12, 9, 401}, p1 = {1, 2, 3}, p2 = {450, 451, 19, 88, 2, 3, 4, 5, 6};
  MegaEnv on(true);
  const auto eager = run_engine(*model, true, {p0});
  const auto graphs = run_engine(*model, false, {p0});
  ASSERT_EQ(eager.size(), 1u);
  EXPECT_EQ(eager[0].size(), 24u);
  EXPECT_EQ(graphs, eager);
  const auto shared = run_engine(*model, false, {p1, p0, p2, p0});
  ASSERT_EQ(shared.size(), 4u);
  EXPECT_EQ(shared[1], eager[0]);
  EXPECT_EQ(shared[3], eager[0]);
}

// The model with every quantized weight dequantized to F32 beforehand (model::dequantize_row, held to
// the gguf package's dequantization in quant_test), built in memory: the exact math of the file's
// weights. The CPU backend multiplies F32 rows in fp32 without rounding the activations, so its logits
// on the twin carry only fp32 summation error; on the quantized file itself its SIMD kernels round
// every matmul input to 8-bit blocks (~1% of the logit scale on random models, kquant_model_test),
// which would stack on the GPU's own bf16 rounding.
struct FloatTwin {
  std::unique_ptr<ss::model::Model> model;
  std::vector<std::vector<float>> store;
};

FloatTwin float_twin(const ss::model::Model& m) {
  FloatTwin t;
  t.model = std::make_unique<ss::model::Model>();
  ss::model::Model& f = *t.model;
  f.config = m.config;
  f.format = m.format;
  f.path = m.path + " (dequantized to F32)";
  f.weights = m.weights;
  std::vector<std::pair<const void*, const float*>> done;  // a tied output shares the embedding's copy
  auto conv = [&](ss::model::Tensor& x) {
    if (!x.valid() || ss::model::info(x.type).block_size == 1) return;  // F32 / F16 / BF16 stay as they are
    const float* data = nullptr;
    for (const auto& [from, to] : done)
      if (from == x.data) data = to;
    if (!data) {
      std::vector<float> v(static_cast<size_t>(x.numel()));
      for (int64_t r = 0; r < x.rows(); ++r)
        ss::model::dequantize_row(x.type, x.row(r), v.data() + r * x.cols(), x.cols());
      t.store.push_back(std::move(v));
      data = t.store.back().data();
      done.emplace_back(x.data, data);
    }
    x.type = ss::model::DType::F32;
    x.data = data;
    x.nbytes = static_cast<size_t>(x.numel()) * sizeof(float);
  };
  conv(f.weights.token_embd);
  conv(f.weights.output);
  for (auto& l : f.weights.layers)
    for (ss::model::Tensor* x : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) conv(*x);
  return t;
}

// GGUF weights kept quantized on the GPU (--gpu-native-quant; Q4_0, Q4_1, Q8_0, Q4_K, Q6_K, Q5_0,
// Q5_1): a 40-token prompt (the cuBLAS path over weights dequantized a matrix at a time) and 12 decode
// steps (the fused kernels reading the packed blocks) against the CPU backend's fp32 forward of the
// float twin above, held to the same bf16 tolerance as the bf16 models.
TEST(CudaNativeQuant, PrefillAndDecodeMatchTheDequantizedWeights) {
  SKIP_WITHOUT_GPU();
  for (auto dt : {ss::model::DType::Q4_0, ss::model::DType::Q4_1, ss::model::DType::Q8_0, ss::model::DType::Q4_K,
                  ss::model::DType::Q6_K, ss::model::DType::Q5_0, ss::model::DType::Q5_1}) {
    const std::string name(ss::model::dtype_name(dt));
    const std::string file = std::string(::testing::TempDir()) + "/synth-q-" + name + ".gguf";
    ss::model::SynthOptions so;
    so.shape = "llama32-1b";
    so.layers = 2;
    so.vocab = 512;
    so.format = ss::model::SynthFormat::Gguf;
    so.dtype = dt;
    so.seed = 11;
    so.out = file;
    auto w = ss::model::write_synth_model(so);
    ASSERT_TRUE(w.ok()) << (w.ok() ? "" : w.message());
    auto model = load(file);
    ASSERT_NE(model, nullptr);
    BackendOptions o;
    o.kv.num_blocks = 64;
    o.kv.block_size = 16;
    o.kv.dtype = ss::backend::KvCacheConfig::DType::F32;
    o.max_batch_tokens = 512;
    o.max_slots = 64;
    o.threads = 4;
    const FloatTwin twin = float_twin(*model);
    ASSERT_EQ(twin.model->weights.layers[0].w_down.type, ss::model::DType::F32) << name;
    auto cpu = ss::backend::make_cpu_backend(*twin.model, o);
    ASSERT_TRUE(cpu.ok()) << (cpu.ok() ? "" : cpu.message());
    auto gpu = cuda_backend(*model, /*native_quant=*/true);
    ASSERT_NE(gpu, nullptr);
    const int V = gpu->vocab_size(), prompt = 40, steps = 12;
    StepBatch b;
    b.seq_slot = {0};
    b.edit_table(0, 0, blocks(0, prompt + steps));
    for (int i = 0; i < prompt; ++i) {
      b.tokens.push_back(static_cast<int32_t>((i * 7919) % V));
      b.positions.push_back(i);
      b.seq_index.push_back(0);
    }
    b.logits_rows = {prompt - 1};
    StepOutput co, go;
    ASSERT_TRUE((*cpu)->step(b, co).ok());
    auto st = gpu->step(b, go);
    ASSERT_TRUE(st.ok()) << st.message();
    expect_close(go.logits.data(), co.logits.data(), V, name + " prefill");
    for (int k = 0; k < steps; ++k) {
      StepBatch d;
      d.seq_slot = {0};
      d.tokens = {static_cast<int32_t>((k * 104729 + 3) % V)};
      d.positions = {prompt + k};
      d.seq_index = {0};
      d.logits_rows = {0};
      ASSERT_TRUE((*cpu)->step(d, co).ok());
      st = gpu->step(d, go);
      ASSERT_TRUE(st.ok()) << st.message();
      expect_close(go.logits.data(), co.logits.data(), V, name + " decode step " + std::to_string(k));
    }
  }
}

// KV tier copies (read_kv_block / write_kv_block, what the host and disk tiers use): a prompt's
// blocks copied into other blocks through the host give the same next-token logits, bit for bit, as
// the originals (the restored cache computes exactly what the demoted one did); more writes than the
// backend's staging slots, each read back exact, leave every other block as it was; a bad block id or
// size is refused without a copy.
TEST(CudaKvBlocks, CopiesThroughTheHostAreExact) {
  SKIP_WITHOUT_GPU();
  auto model = load(kData + "/models/llama3-tiny");
  ASSERT_NE(model, nullptr);
  auto be = cuda_backend(*model);
  ASSERT_NE(be, nullptr);
  const Ref ref = load_ref("llama3-tiny");
  // The longest reference sequence (the first is 7 tokens: the H200 run of 2026-12-05 stopped here).
  size_t seq = 0;
  for (size_t i = 1; i < ref.ids.size(); ++i)
    if (ref.ids[i].size() > ref.ids[seq].size()) seq = i;
  const auto& ids = ref.ids[seq];
  ASSERT_GE(ids.size(), 33u);
  const int n = 40 <= static_cast<int>(ids.size()) ? 40 : static_cast<int>(ids.size()) - 1;  // 3 blocks
  const size_t bytes = static_cast<size_t>(be->kv_block_bytes());
  {  // prefill n tokens into slot 0, blocks 0..2
    StepBatch b;
    b.seq_slot = {0};
    b.edit_table(0, 0, blocks(0, n));
    for (int i = 0; i < n; ++i) {
      b.tokens.push_back(ids[static_cast<size_t>(i)]);
      b.positions.push_back(i);
      b.seq_index.push_back(0);
    }
    StepOutput out;
    ASSERT_TRUE(be->step(b, out).ok());
  }
  const int nb = (n + 15) / 16;
  std::vector<std::vector<uint8_t>> orig(static_cast<size_t>(nb), std::vector<uint8_t>(bytes));
  for (int i = 0; i < nb; ++i) ASSERT_TRUE(be->read_kv_block(i, orig[static_cast<size_t>(i)]).ok());
  ASSERT_TRUE(std::any_of(orig[0].begin(), orig[0].end(), [](uint8_t v) { return v != 0; }));
  // Blocks 40.. get 20 random blocks (more than the staging ring), then the prompt's copies go to 10..
  std::mt19937 rng(5);
  std::vector<std::vector<uint8_t>> rnd(20, std::vector<uint8_t>(bytes));
  for (auto& r : rnd)
    for (auto& v : r) v = static_cast<uint8_t>(rng() & 0x3f);  // finite bf16 patterns
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(be->write_kv_block(40 + i, rnd[static_cast<size_t>(i)]).ok());
  for (int i = 0; i < nb; ++i) ASSERT_TRUE(be->write_kv_block(10 + i, orig[static_cast<size_t>(i)]).ok());
  std::vector<uint8_t> got(bytes);
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(be->read_kv_block(40 + i, got).ok());
    EXPECT_TRUE(got == rnd[static_cast<size_t>(i)]) << "block " << 40 + i;
  }
  for (int i = 0; i < nb; ++i) {
    ASSERT_TRUE(be->read_kv_block(i, got).ok());
    EXPECT_TRUE(got == orig[static_cast<size_t>(i)]) << "the source block " << i << " changed";
    ASSERT_TRUE(be->read_kv_block(10 + i, got).ok());
    EXPECT_TRUE(got == orig[static_cast<size_t>(i)]) << "copy of block " << i;
  }
  // The next token at position n over the original blocks (slot 0) and over the copies (slot 1).
  StepBatch b;
  b.seq_slot = {0, 1};
  b.edit_table(1, 0, blocks(10, n + 1));
  for (int s = 0; s < 2; ++s) {
    b.tokens.push_back(ids[static_cast<size_t>(n)]);
    b.positions.push_back(n);
    b.seq_index.push_back(s);
  }
  b.logits_rows = {0, 1};
  StepOutput out;
  ASSERT_TRUE(be->step(b, out).ok());
  const size_t V = static_cast<size_t>(be->vocab_size());
  ASSERT_EQ(out.logits.size(), 2 * V);
  EXPECT_TRUE(std::equal(out.logits.begin(), out.logits.begin() + static_cast<std::ptrdiff_t>(V),
                         out.logits.begin() + static_cast<std::ptrdiff_t>(V)))
      << "logits over the copied blocks differ from the originals'";
  expect_close(out.logits.data(), ref.logits[seq].data() + static_cast<size_t>(n) * V, static_cast<int>(V),
               "position " + std::to_string(n));
  // Refused: a block out of range, a short buffer.
  EXPECT_FALSE(be->write_kv_block(be->kv_config().num_blocks, orig[0]).ok());
  EXPECT_FALSE(be->read_kv_block(-1, got).ok());
  std::vector<uint8_t> short_buf(bytes - 1);
  EXPECT_FALSE(be->write_kv_block(0, short_buf).ok());
}

// The tiers' arena registered with the backend (register_host_memory): blocks copied in and out of
// it move by DMA in place. Random blocks written from registered memory read back exact through
// both paths (registered and staged), interleaved with staged writes, and the memory can be
// unregistered and registered again; a copy that only starts inside it takes the staged path.
TEST(CudaKvBlocks, RegisteredHostMemoryCopiesInPlaceExactly) {
  SKIP_WITHOUT_GPU();
  auto model = load(kData + "/models/llama3-tiny");
  ASSERT_NE(model, nullptr);
  auto be = cuda_backend(*model);
  ASSERT_NE(be, nullptr);
  const size_t bytes = static_cast<size_t>(be->kv_block_bytes());
  constexpr int kBlocks = 12;
  std::vector<uint8_t> arena(bytes * (kBlocks + 1)), staged(bytes), got(bytes);
  std::mt19937 rng(9);
  for (auto& v : arena) v = static_cast<uint8_t>(rng() & 0x3f);  // finite bf16 patterns
  const std::vector<uint8_t> want(arena.begin(), arena.begin() + static_cast<std::ptrdiff_t>(bytes * kBlocks));
  for (int round = 0; round < 2; ++round) {
    be->register_host_memory(arena.data(), bytes * kBlocks);
    ASSERT_EQ(be->memory().host_registered_bytes, static_cast<int64_t>(bytes * kBlocks))
        << "not page-locked: the in-place path would not run";
    for (int i = 0; i < kBlocks; ++i) {  // even blocks from the arena, odd ones staged from a copy
      const uint8_t* src = arena.data() + bytes * static_cast<size_t>(i);
      if (i % 2) {
        std::copy(src, src + bytes, staged.begin());
        ASSERT_TRUE(be->write_kv_block(20 + i, staged).ok());
      } else {
        ASSERT_TRUE(be->write_kv_block(20 + i, std::span<const uint8_t>(src, bytes)).ok());
      }
    }
    // A span from the last registered block past its end: not all registered, so staged.
    ASSERT_TRUE(be->write_kv_block(19, std::span<const uint8_t>(arena.data() + bytes * (kBlocks - 1) + 1, bytes)).ok());
    std::fill(arena.begin(), arena.end(), 0xff);  // the arena is reused: the copies must not depend on it
    for (int i = 0; i < kBlocks; ++i) {
      uint8_t* dst = arena.data() + bytes * static_cast<size_t>((i + 5) % kBlocks);  // back into the arena
      ASSERT_TRUE(be->read_kv_block(20 + i, std::span<uint8_t>(dst, bytes)).ok());
      EXPECT_TRUE(std::equal(dst, dst + bytes, want.begin() + static_cast<std::ptrdiff_t>(bytes * i))) << "block " << i;
      ASSERT_TRUE(be->read_kv_block(20 + i, got).ok());  // and staged
      EXPECT_TRUE(std::equal(got.begin(), got.end(), want.begin() + static_cast<std::ptrdiff_t>(bytes * i))) << "block " << i;
    }
    be->unregister_host_memory(arena.data());
    EXPECT_EQ(be->memory().host_registered_bytes, 0);
    std::copy(want.begin(), want.end(), arena.begin());
  }
}

// Batched copies (write_kv_blocks / read_kv_blocks, what a restore step uses): one batch mixing
// blocks in registered memory (DMA in place, one wait for all) and staged ones (more than the
// staging ring), written to scattered blocks, reads back exact both batched and one at a time, and
// the registered bytes may be overwritten as soon as the call returns. A batch with one bad entry
// (out of range, a wrong size) is refused and copies nothing, not even the good entries before it.
TEST(CudaKvBlocks, BatchedCopiesAreExactAndBadBatchesCopyNothing) {
  SKIP_WITHOUT_GPU();
  auto model = load(kData + "/models/llama3-tiny");
  ASSERT_NE(model, nullptr);
  auto be = cuda_backend(*model);
  ASSERT_NE(be, nullptr);
  const size_t bytes = static_cast<size_t>(be->kv_block_bytes());
  constexpr int kBlocks = 24;  // half registered, half staged (12 > the 8 staging slots)
  std::vector<uint8_t> arena(bytes * kBlocks);
  std::vector<std::vector<uint8_t>> loose(kBlocks, std::vector<uint8_t>(bytes));
  std::mt19937 rng(13);
  for (auto& v : arena) v = static_cast<uint8_t>(rng() & 0x3f);  // finite bf16 patterns
  const std::vector<uint8_t> want(arena);
  be->register_host_memory(arena.data(), arena.size());
  ASSERT_EQ(be->memory().host_registered_bytes, static_cast<int64_t>(arena.size())) << "not page-locked";
  auto dst_block = [](int i) { return 3 + 5 * i % 47; };  // scattered, distinct for i < 24
  std::vector<ss::backend::KvBlockIn> in;
  for (int i = 0; i < kBlocks; ++i) {
    const uint8_t* src = arena.data() + bytes * static_cast<size_t>(i);
    if (i % 2) {
      std::copy(src, src + bytes, loose[static_cast<size_t>(i)].begin());
      in.push_back({dst_block(i), loose[static_cast<size_t>(i)]});
    } else {
      in.push_back({dst_block(i), std::span<const uint8_t>(src, bytes)});
    }
  }
  ASSERT_TRUE(be->write_kv_blocks(in).ok());
  std::fill(arena.begin(), arena.end(), 0xff);  // reused at once: the batch has waited for its DMAs
  for (auto& l : loose) std::fill(l.begin(), l.end(), 0xff);
  std::vector<ss::backend::KvBlockOut> out;
  for (int i = 0; i < kBlocks; ++i)  // back into the arena (even: in place) and into loose buffers (odd: staged)
    out.push_back({dst_block(i), i % 2 ? std::span<uint8_t>(loose[static_cast<size_t>(i)])
                                       : std::span<uint8_t>(arena.data() + bytes * static_cast<size_t>(i), bytes)});
  ASSERT_TRUE(be->read_kv_blocks(out).ok());
  std::vector<uint8_t> got(bytes);
  for (int i = 0; i < kBlocks; ++i) {
    const auto w = want.begin() + static_cast<std::ptrdiff_t>(bytes * static_cast<size_t>(i));
    EXPECT_TRUE(std::equal(out[static_cast<size_t>(i)].bytes.begin(), out[static_cast<size_t>(i)].bytes.end(), w))
        << "block " << i << " read batched";
    ASSERT_TRUE(be->read_kv_block(dst_block(i), got).ok());
    EXPECT_TRUE(std::equal(got.begin(), got.end(), w)) << "block " << i << " read alone";
  }
  // Refused whole: a good entry, then a block out of range; a good entry, then a short one.
  const std::vector<uint8_t> noise(bytes, 0x11), short_buf(bytes - 1, 0x11);
  auto st = be->write_kv_blocks(std::vector<ss::backend::KvBlockIn>{{dst_block(0), noise}, {be->kv_config().num_blocks, noise}});
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("nothing copied"), std::string::npos) << st.message();
  st = be->write_kv_blocks(std::vector<ss::backend::KvBlockIn>{{dst_block(1), noise}, {dst_block(2), short_buf}});
  ASSERT_FALSE(st.ok());
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(be->read_kv_block(dst_block(i), got).ok());
    EXPECT_TRUE(std::equal(got.begin(), got.end(), want.begin() + static_cast<std::ptrdiff_t>(bytes * static_cast<size_t>(i))))
        << "block " << i << " was written by a refused batch";
  }
  be->unregister_host_memory(arena.data());
  EXPECT_EQ(be->memory().host_registered_bytes, 0);
}

namespace {
// Two conversations on an engine over the CUDA backend with a host tier: each sends a 300-token
// history, then returns with it, its answer and 20 new tokens; the second returns while a stream
// decodes. `idle`: the engine's clock jumps past the TTL between the turns, so the histories leave
// the pool for the host tier and come back by batched copies (write_kv_blocks; with the stream
// running, bounded per step); without it they stay in the pool (prefix hits). Returns the returning
// turns' and the stream's greedy tokens, and the engine's stats at the end.
struct TierRun {
  std::vector<std::vector<int32_t>> tokens;  // A2, B2, stream
  ss::engine::EngineStats stats;
  int64_t registered_bytes = 0;  // the backend's page-locked bytes while the engine ran
};
TierRun run_tier_turns(const ss::model::Model& m, bool idle) {
  TierRun out;
  auto be = cuda_backend(m);
  if (!be) return out;
  auto now = ss::engine::Clock::now();
  ss::engine::EngineConfig ec;
  ec.scheduler.max_num_seqs = 8;
  ec.scheduler.max_num_batched_tokens = 512;
  ec.tiers.host_bytes = int64_t(64) << 20;
  ec.tiers.ttl_ms = 1000;
  ec.clock = [&now] { return now; };
  auto e = ss::engine::Engine::create(*be, ec);
  EXPECT_TRUE(e.ok()) << (e.ok() ? "" : e.message());
  if (!e.ok()) return out;
  ss::engine::Engine& en = **e;
  auto run = [&](std::vector<int32_t> prompt, int max_tokens, std::vector<int32_t>* got) {
    ss::engine::Request r;
    r.prompt = std::move(prompt);
    r.max_tokens = max_tokens;
    r.sampling.temperature = 0.0f;
    r.on_event = [got](const ss::engine::TokenEvent& ev) {
      if (ev.token >= 0) got->push_back(ev.token);
    };
    EXPECT_TRUE(en.add_request(std::move(r)).ok());
  };
  auto drain = [&] {
    for (int i = 0; i < 5000 && en.has_work(); ++i) EXPECT_TRUE(en.step().ok());
  };
  std::mt19937 g(17);
  auto random_ids = [&](int n) {
    std::vector<int32_t> v(static_cast<size_t>(n));
    for (auto& t : v) t = static_cast<int32_t>(g() % 300);
    return v;
  };
  const std::vector<int32_t> ha = random_ids(300), hb = random_ids(300), news = random_ids(20), sp = random_ids(24);
  std::vector<int32_t> aa, ab;
  run(ha, 8, &aa);
  run(hb, 8, &ab);
  drain();
  if (idle) {
    now += std::chrono::seconds(2);
    EXPECT_TRUE(en.step().ok());  // an idle step: every cached block leaves for the host tier
    EXPECT_EQ(en.stats().kv_blocks_cached, 0);
  }
  out.registered_bytes = be->memory().host_registered_bytes;
  auto returning = [&](const std::vector<int32_t>& h, const std::vector<int32_t>& a) {
    std::vector<int32_t> p = h;
    p.insert(p.end(), a.begin(), a.end());
    p.insert(p.end(), news.begin(), news.end());
    return p;
  };
  out.tokens.resize(3);
  run(returning(ha, aa), 16, &out.tokens[0]);  // alone
  drain();
  run(sp, 40, &out.tokens[2]);  // the stream, then B returns while it decodes
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(en.step().ok());
  run(returning(hb, ab), 16, &out.tokens[1]);
  drain();
  out.stats = en.stats();
  return out;
}
}  // namespace

// The KV tiers on the GPU through the engine: histories demoted to the host tier (its arena
// page-locked: DMA in place both ways) and restored in batched copies give the same greedy tokens
// as the same turns served from the pool, where the K/V never left the device: the restored bytes
// are the demoted ones. The second turn is restored while a stream decodes (bounded per step).
TEST(CudaKvTiers, HistoriesRestoredInBatchesGiveTheSameTokensAsPoolHits) {
  SKIP_WITHOUT_GPU();
  auto model = load(kData + "/models/llama3-tiny");
  ASSERT_NE(model, nullptr);
  const TierRun pool = run_tier_turns(*model, false);
  const TierRun tier = run_tier_turns(*model, true);
  ASSERT_EQ(pool.tokens.size(), 3u);
  ASSERT_EQ(tier.tokens.size(), 3u);
  EXPECT_EQ(pool.stats.kv_restored_host, 0);
  EXPECT_GE(tier.stats.kv_demoted_idle, 2 * 18);          // both histories' full blocks (300 + 8 tokens: 19)
  EXPECT_GE(tier.stats.kv_restored_host, 2 * 18);
  EXPECT_GT(tier.registered_bytes, 0) << "the tiers' arena was not page-locked: copies were staged";
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(tier.tokens[i].size(), i < 2 ? 16u : 40u) << i;
    EXPECT_EQ(tier.tokens[i], pool.tokens[i])
        << (i == 0   ? "A2 (restored alone)"
            : i == 1 ? "B2 (restored beside a stream)"
                     : "the stream (its steps meet B2's prefill at another position in the two runs: a difference "
                       "here alone is batch variance, not the tiers)");
  }
}

// --batch-invariant (BackendOptions::batch_invariant): steps past 8 rows run the fused path 8 rows at
// a time, so a row's logits are the same bits whatever shares its step and however its prompt was
// chunked. On real head shapes (SmolLM2's; Qwen2.5-0.5B's, with QKV bias and GQA 7; Qwen3-0.6B's,
// with per-head q/k norms and head_dim 128) cut to two layers:
// - twelve prompts in one 515-token step, against the CPU backend, and slot 0's prompt again at the
//   step's end (other slices of 8), again in chunks of 7 and again a token at a time: the same bits;
// - a 14-row decode step, the four copies' rows the same bits and close to the CPU backend;
// - one copy alone, then another among 15 others at the same position: the same bits.
// Then through the engine: greedy text of a prompt alone (eager and graphs) and beside 11 others (a
// prefill step of 12 prompts, decode graphs of bucket 16) the same.
TEST(CudaBatchInvariant, ARowIsTheSameAtAnyLoadAndChunking) {
  SKIP_WITHOUT_GPU();
  for (const char* shape : {"smollm2-135m", "qwen25-05b", "qwen3-06b"}) {
    SCOPED_TRACE(shape);
    auto model = two_layer_synth(shape, 21, std::string(::testing::TempDir()) + "/synth-inv-" + shape);
    ASSERT_NE(model, nullptr);
    BackendOptions co = cpu_reference_options(32, 8);
    co.kv.num_blocks = 256;
    co.max_batch_tokens = 1024;
    auto cpu = ss::backend::make_cpu_backend(*model, co);
    ASSERT_TRUE(cpu.ok()) << (cpu.ok() ? "" : cpu.message());
    BackendOptions o;
    o.gpu_device_sampling = false;
    o.kv.num_blocks = 256;
    o.kv.block_size = 16;
    o.max_batch_tokens = 1024;
    o.max_slots = 32;
    o.batch_invariant = true;
    auto made = ss::backend::make_cuda_backend(*model, o);
    ASSERT_TRUE(made.ok()) << (made.ok() ? "" : made.message());
    Backend& gpu = **made;
    const int V = gpu.vocab_size();
    auto tok = [&](int seq, int pos) { return static_cast<int32_t>((seq * 131 + pos * 7919 + 17) % V); };
    std::vector<int> len(32, 0);
    std::vector<int> src(32);
    for (int s = 0; s < 32; ++s) src[static_cast<size_t>(s)] = s;
    for (int s : {11, 12, 13, 14}) src[static_cast<size_t>(s)] = 0;  // copies of slot 0
    // Runs `adds` ({slot, tokens}) as one step on both backends; the logits of each slot's last token.
    auto run = [&](const std::vector<std::pair<int, int>>& adds, StepOutput& g, StepOutput& c) {
      StepBatch b;
      for (const auto& [slot, n] : adds) {
        const int si = static_cast<int>(b.seq_slot.size());
        b.seq_slot.push_back(slot);
        if (len[static_cast<size_t>(slot)] == 0) b.edit_table(slot, 0, blocks(8 * slot, 128));
        for (int i = 0; i < n; ++i) {
          int& p = len[static_cast<size_t>(slot)];
          if (i == n - 1) b.logits_rows.push_back(static_cast<int32_t>(b.tokens.size()));
          b.tokens.push_back(tok(src[static_cast<size_t>(slot)], p));
          b.positions.push_back(p++);
          b.seq_index.push_back(si);
        }
      }
      ASSERT_TRUE(gpu.step(b, g).ok());
      ASSERT_TRUE((*cpu)->step(b, c).ok());
      ASSERT_EQ(g.logits.size(), adds.size() * static_cast<size_t>(V));
    };
    auto row = [&](const StepOutput& o2, size_t r) {
      return std::vector<float>(o2.logits.begin() + static_cast<std::ptrdiff_t>(r * V),
                                o2.logits.begin() + static_cast<std::ptrdiff_t>((r + 1) * V));
    };
    StepOutput g, c;
    std::vector<std::pair<int, int>> pre;
    for (int s = 0; s < 11; ++s) pre.push_back({s, 20 + 5 * s});
    pre.push_back({11, 20});
    run(pre, g, c);
    if (HasFatalFailure()) return;
    for (size_t r = 0; r < pre.size(); ++r)
      expect_close(g.logits.data() + r * V, c.logits.data() + r * V, V, "prefill row " + std::to_string(r));
    const std::vector<float> first = row(g, 0);
    EXPECT_EQ(row(g, 11), first) << "slot 0's prompt again at the end of the same step";
    for (int i = 0; i < 3; ++i) run({{12, i < 2 ? 7 : 6}}, g, c);
    EXPECT_EQ(row(g, 0), first) << "slot 0's prompt in chunks of 7";
    for (int i = 0; i < 20; ++i) run({{13, 1}}, g, c);
    EXPECT_EQ(row(g, 0), first) << "slot 0's prompt a token at a time";
    // Decode: slots 0-13 one token each; 0, 11, 12 and 13 the same token at the same position.
    std::vector<std::pair<int, int>> dec;
    for (int s = 0; s < 14; ++s) dec.push_back({s, 1});
    run(dec, g, c);
    for (size_t r = 0; r < dec.size(); ++r)
      expect_close(g.logits.data() + r * V, c.logits.data() + r * V, V, "decode row " + std::to_string(r));
    const std::vector<float> d0 = row(g, 0);
    EXPECT_EQ(row(g, 11), d0);
    EXPECT_EQ(row(g, 12), d0);
    EXPECT_EQ(row(g, 13), d0);
    // Slot 12 alone, then slot 13 among 15 others (slots 0-11 and 14-16 fresh two-token prompts).
    run({{12, 1}}, g, c);
    const std::vector<float> alone = row(g, 0);
    std::vector<std::pair<int, int>> crowd;
    for (int s = 14; s <= 16; ++s) crowd.push_back({s, 2});
    for (int s = 0; s <= 11; ++s) crowd.push_back({s, 1});
    crowd.insert(crowd.begin() + 5, {13, 1});
    run(crowd, g, c);
    EXPECT_EQ(row(g, 5), alone) << "a decode row beside 15 others";
  }
  const std::string dir = std::string(::testing::TempDir()) + "/synth-inv-smollm2-135m";
  auto model = load(dir);
  ASSERT_NE(model, nullptr);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 12; ++i) {
    std::vector<int32_t> p;
    for (int j = 0; j < 9 + 4 * i; ++j) p.push_back((i * 37 + j * 101 + 5) % 512);
    prompts.push_back(p);
  }
  const auto eager = run_engine(*model, true, {prompts[3]}, true);
  const auto graphs = run_engine(*model, false, {prompts[3]}, true);
  ASSERT_EQ(eager.size(), 1u);
  EXPECT_EQ(eager[0].size(), 24u);
  EXPECT_EQ(graphs, eager);
  const auto crowd = run_engine(*model, false, prompts, true);
  ASSERT_EQ(crowd.size(), 12u);
  EXPECT_EQ(crowd[3], eager[0]) << "a request's greedy text beside 11 others";
}

// A model without the fused path refuses --batch-invariant at start-up, with the reason.
TEST(CudaBatchInvariant, RefusedWhereTheFusedPathCannotRun) {
  SKIP_WITHOUT_GPU();
  auto model = two_layer_synth("smollm2-135m", 21, std::string(::testing::TempDir()) + "/synth-inv-refuse");
  ASSERT_NE(model, nullptr);
  BackendOptions o;
  o.kv.num_blocks = 64;
  o.kv.block_size = 32;  // the fused attention reads 16-token blocks
  o.batch_invariant = true;
  auto made = ss::backend::make_cuda_backend(*model, o);
  ASSERT_FALSE(made.ok());
  EXPECT_NE(made.message().find("--batch-invariant"), std::string::npos) << made.message();
  o.batch_invariant = false;
  EXPECT_TRUE(ss::backend::make_cuda_backend(*model, o).ok());
}
