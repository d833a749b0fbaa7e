// selfserve synth's writer: the files load and validate in our own loader with the real models'
// hyper-parameters, the bytes depend only on the arguments, the formats hold the same values, and the
// block quantizers stay within each type's error bound.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "common/sha256.h"
#include "model/quantize.h"
#include "model/synth.h"
#include "model_test_util.h"

namespace ss::model::test {
namespace {

// ---- quantizers: quantize, decode with the reference dequantizer, bound the error per block ----

// Largest error a block type may make on a block whose largest magnitude is amax, derived from its
// step: Q4_0/Q5_0 map the signed extreme to the end of the range, so the opposite end may clamp by a
// whole step; min/max types err by half a step; a scale stored as fp16 is off by up to 2^-11 of
// itself, which a quant level q multiplies (|q| <= 127 for Q8_0, fewer levels elsewhere).
double max_error(DType t, double amax) {
  const double fp16 = 1.0 + 128 * std::ldexp(1.0, -11);
  switch (t) {
    case DType::Q8_0: return amax / 127 * (0.5 + 127 * std::ldexp(1.0, -11));
    case DType::Q4_0: return amax / 8 * fp16;
    case DType::Q5_0: return amax / 16 * fp16;
    case DType::Q4_1: return 2 * amax / 15 * 0.5 * fp16 + amax * std::ldexp(1.0, -11);
    case DType::Q5_1: return 2 * amax / 31 * 0.5 * fp16 + amax * std::ldexp(1.0, -11);
    // 4-bit step of a 32-range (<= 2 amax / 15, scale rounded up by one 6-bit unit) halved, plus half
    // a 6-bit unit of the offset.
    case DType::Q4_K: return (2 * amax / 15 * (1 + 1.0 / 63) * 0.5 + amax / 63 * 0.5) * fp16;
    // 6-bit step (amax / 31, rounded up by one int8 unit), halved.
    case DType::Q6_K: return amax / 31 * (1 + 1.0 / 127) * 0.5 * fp16 + amax * std::ldexp(1.0, -11);
    default: return 0;
  }
}

class QuantizeRow : public ::testing::TestWithParam<DType> {};

TEST_P(QuantizeRow, DecodesWithinTheBlockError) {
  const DType t = GetParam();
  const int bs = info(t).block_size;
  std::mt19937 rng(42);
  std::normal_distribution<float> nd(0.0f, 0.02f);
  const int64_t n = 256 * 64;
  std::vector<float> x(n);
  for (auto& v : x) v = nd(rng);
  for (int64_t i = 0; i < 4 * bs; ++i) x[i] = 0.0f;           // an all-zero block decodes to zeros
  for (int64_t i = 4 * bs; i < 5 * bs; ++i) x[i] = 0.5f;      // a constant block
  for (int64_t i = 5 * bs; i < 6 * bs; ++i) x[i] = -std::fabs(x[i]);  // all negative
  std::vector<uint8_t> q(row_bytes(t, n));
  ASSERT_TRUE(quantize_row(t, x.data(), q.data(), n));
  std::vector<float> y(n);
  dequantize_row(t, q.data(), y.data(), n);
  for (int64_t b = 0; b < n; b += bs) {
    double amax = 0;
    for (int k = 0; k < bs; ++k) amax = std::max(amax, static_cast<double>(std::fabs(x[b + k])));
    const double bound = max_error(t, amax);
    for (int k = 0; k < bs; ++k)
      ASSERT_LE(std::fabs(static_cast<double>(x[b + k]) - y[b + k]), bound)
          << dtype_name(t) << " element " << b + k << " x " << x[b + k] << " y " << y[b + k] << " amax " << amax;
  }
  // Half a step is the best any rounding quantizer can do: a bound this loose would still catch a
  // wrong nibble order, but also check the mean error is well under it.
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += std::fabs(static_cast<double>(x[i]) - y[i]);
  EXPECT_LT(sum / n, max_error(t, 0.06) * 0.5) << dtype_name(t);
}

INSTANTIATE_TEST_SUITE_P(Types, QuantizeRow,
                         ::testing::Values(DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1,
                                           DType::Q4_K, DType::Q6_K),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(QuantizeRow, RejectsWhatIsNotAWeightTypeOrAWholeBlock) {
  std::vector<float> x(64, 1.0f);
  std::vector<uint8_t> q(1024);
  EXPECT_FALSE(quantize_row(DType::Q8_K, x.data(), q.data(), 256));
  EXPECT_FALSE(quantize_row(DType::Q4_0, x.data(), q.data(), 48));
}

// ---- the generator ------------------------------------------------------------------------------

TEST(SynthValue, LooksLikeNormalWithStd002) {
  const uint64_t key = synth_tensor_key(7, "blk.0.attn_q.weight");
  const int n = 1 << 20;
  double s = 0, s2 = 0, s4 = 0;
  for (int i = 0; i < n; ++i) {
    const double v = synth_value(key, static_cast<uint64_t>(i));
    s += v, s2 += v * v, s4 += v * v * v * v;
  }
  const double mean = s / n, var = s2 / n - mean * mean;
  EXPECT_NEAR(mean, 0.0, 1e-4);
  EXPECT_NEAR(std::sqrt(var), 0.02, 2e-4);
  EXPECT_NEAR(s4 / n / (var * var), 2.7, 0.1);  // Irwin-Hall(4) kurtosis 2.7 (a normal's is 3)
  EXPECT_NE(synth_tensor_key(7, "a"), synth_tensor_key(8, "a"));
  EXPECT_NE(synth_tensor_key(7, "a"), synth_tensor_key(7, "b"));
}

// ---- writing and loading ------------------------------------------------------------------------

struct Written {
  std::unique_ptr<Model> model;
  SynthResult result;
};

Written write_and_load(const std::string& shape, SynthFormat fmt, DType dt, const std::string& out,
                       uint64_t seed = 1, int layers = 1, int vocab = 512, int threads = 2) {
  SynthOptions o;
  o.shape = shape;
  o.format = fmt;
  o.dtype = dt;
  o.seed = seed;
  o.out = out;
  o.layers = layers;
  o.vocab = vocab;
  o.threads = threads;
  auto r = write_synth_model(o);
  EXPECT_TRUE(r.ok()) << r.message();
  if (!r.ok()) return {};
  LoadOptions lo;
  lo.check_values = true;
  auto m = load_model(out, lo);
  EXPECT_TRUE(m.ok()) << m.message();
  if (!m.ok()) return {};
  return {std::move(*m), std::move(*r)};
}

// The published configs of the real models (Hugging Face config.json), not our shape table.
struct Real {
  const char* shape;
  Arch arch;
  int hidden, heads, kv_heads, head_dim, ffn, context;
  float theta, eps;
  bool tied;
  float llama3_rope_factor;  // rope_scaling {"rope_type": "llama3", "factor": ...}, 0: none
};
const Real kReal[] = {
    {"smollm2-135m", Arch::Llama, 576, 9, 3, 64, 1536, 8192, 100000.0f, 1e-5f, true, 0},
    {"llama32-1b", Arch::Llama, 2048, 32, 8, 64, 8192, 131072, 500000.0f, 1e-5f, true, 32.0f},
    {"llama3-8b", Arch::Llama, 4096, 32, 8, 128, 14336, 8192, 500000.0f, 1e-5f, false, 0},
    {"qwen25-05b", Arch::Qwen2, 896, 14, 2, 64, 4864, 32768, 1000000.0f, 1e-6f, true, 0},
    {"qwen3-06b", Arch::Qwen3, 1024, 16, 8, 128, 3072, 40960, 1000000.0f, 1e-6f, true, 0},
};

void expect_config(const ModelConfig& c, const Real& r, int layers, int vocab, FileFormat fmt) {
  EXPECT_EQ(c.arch, r.arch) << r.shape;
  EXPECT_EQ(c.hidden_size, r.hidden) << r.shape;
  EXPECT_EQ(c.n_heads, r.heads) << r.shape;
  EXPECT_EQ(c.n_kv_heads, r.kv_heads) << r.shape;
  EXPECT_EQ(c.head_dim, r.head_dim) << r.shape;
  EXPECT_EQ(c.intermediate_size, r.ffn) << r.shape;
  EXPECT_EQ(c.max_context, r.context) << r.shape;
  EXPECT_EQ(c.n_layers, layers) << r.shape;
  EXPECT_EQ(c.vocab_size, vocab) << r.shape;
  EXPECT_FLOAT_EQ(c.rope_theta, r.theta) << r.shape;
  EXPECT_FLOAT_EQ(c.rms_norm_eps, r.eps) << r.shape;
  EXPECT_EQ(c.tie_embeddings, r.tied) << r.shape;
  // GGUF carries Llama 3 scaling as rope_freqs.weight, config.json as rope_scaling: the loader
  // recognises both as the same scaling.
  if (r.llama3_rope_factor > 0) {
    EXPECT_EQ(c.rope_scaling.kind, RopeScaling::Kind::Llama3) << r.shape;
    EXPECT_FLOAT_EQ(c.rope_scaling.factor, r.llama3_rope_factor) << r.shape;
    EXPECT_FLOAT_EQ(c.rope_scaling.low_freq_factor, 1.0f) << r.shape;
    EXPECT_FLOAT_EQ(c.rope_scaling.high_freq_factor, 4.0f) << r.shape;
    EXPECT_EQ(c.rope_scaling.original_max_position, 8192) << r.shape;
  } else {
    EXPECT_EQ(c.rope_scaling.kind, RopeScaling::Kind::None) << r.shape;
  }
  EXPECT_EQ(c.rope_style, fmt == FileFormat::Gguf && r.arch == Arch::Llama ? RopeStyle::Interleaved
                                                                           : RopeStyle::HalfSplit)
      << r.shape;
}

class SynthShapes : public ::testing::TestWithParam<Real> {};

TEST_P(SynthShapes, GgufAndSafetensorsLoadWithTheRealConfig) {
  const Real& r = GetParam();
  TempDir dir;
  // The 8B shape's one layer is 218M weights: Q4_0 keeps the test file small.
  const bool big = std::string(r.shape) == "llama3-8b";
  const DType gt = big ? DType::Q4_0 : DType::Q8_0;
  const int layers = big ? 1 : 2;
  auto g = write_and_load(r.shape, SynthFormat::Gguf, gt, dir.file("m.gguf"), 3, layers, 300);
  ASSERT_TRUE(g.model);
  expect_config(g.model->config, r, layers, 300, FileFormat::Gguf);
  ASSERT_TRUE(g.model->tokenizer);
  EXPECT_EQ(g.model->tokenizer->vocab_size(), 300);
  EXPECT_EQ(g.model->weights.layers[0].wq.type, gt);
  EXPECT_EQ(g.model->weights.layers[0].attn_norm.type, DType::F32);
  // The tokenizer round-trips text through the byte tokens.
  const auto ids = g.model->tokenizer->encode("héllo", true, false);
  EXPECT_EQ(g.model->tokenizer->decode(ids, true), "héllo");
  if (big) return;  // its bf16 layer would be 436 MB
  auto s = write_and_load(r.shape, SynthFormat::Safetensors, DType::BF16, dir.file("hf"), 3, 1, 300);
  ASSERT_TRUE(s.model);
  expect_config(s.model->config, r, 1, 300, FileFormat::Safetensors);
  ASSERT_TRUE(s.model->tokenizer);
  EXPECT_EQ(s.model->tokenizer->vocab_size(), 300);
  EXPECT_EQ(s.model->tokenizer->decode(s.model->tokenizer->encode("héllo", false, false), false), "héllo");
  EXPECT_EQ(s.model->weights.layers[0].wq.type, DType::BF16);
}

INSTANTIATE_TEST_SUITE_P(Real, SynthShapes, ::testing::ValuesIn(kReal),
                         [](const auto& info) {
                           std::string n = info.param.shape;
                           for (char& c : n) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
                           return n;
                         });

std::string sha(const std::string& path) {
  auto h = sha256_file(path);
  EXPECT_TRUE(h.ok()) << h.message();
  return h.ok() ? *h : "";
}

TEST(Synth, SameArgumentsGiveTheSameBytesWhateverTheThreads) {
  TempDir dir;
  for (DType t : {DType::Q4_K, DType::BF16}) {
    write_and_load("qwen25-05b", SynthFormat::Gguf, t, dir.file("a.gguf"), 11, 1, 512, 1);
    write_and_load("qwen25-05b", SynthFormat::Gguf, t, dir.file("b.gguf"), 11, 1, 512, 3);
    write_and_load("qwen25-05b", SynthFormat::Gguf, t, dir.file("c.gguf"), 12, 1, 512, 3);
    EXPECT_EQ(sha(dir.file("a.gguf")), sha(dir.file("b.gguf"))) << dtype_name(t);
    EXPECT_NE(sha(dir.file("a.gguf")), sha(dir.file("c.gguf"))) << dtype_name(t);
  }
  write_and_load("smollm2-135m", SynthFormat::Safetensors, DType::BF16, dir.file("a"), 11, 1, 512, 1);
  write_and_load("smollm2-135m", SynthFormat::Safetensors, DType::BF16, dir.file("b"), 11, 1, 512, 4);
  for (const char* f : {"model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json"})
    EXPECT_EQ(sha(dir.file(std::string("a/") + f)), sha(dir.file(std::string("b/") + f))) << f;
}

// Every element of `t` (GGUF order) decoded, row by row.
std::vector<float> decode(const Tensor& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  for (int64_t r = 0; r < t.rows(); ++r) dequantize_row(t.type, t.row(r), out.data() + r * t.cols(), t.cols());
  return out;
}

// llama.cpp's converter permutation, written as its numpy does it: reshape the [rows, cols] weight
// to (heads, 2, rows/heads/2, cols), swap axes 1 and 2. Returns the source row of each output row.
std::vector<int64_t> llama_permutation(int64_t rows, int heads) {
  const int64_t half = rows / heads / 2;
  std::vector<int64_t> src;
  for (int h = 0; h < heads; ++h)
    for (int64_t i = 0; i < half; ++i)
      for (int j = 0; j < 2; ++j) src.push_back((h * 2 + j) * half + i);
  return src;
}

// The same weight in three files: bf16 safetensors must be the f32 GGUF rounded to bf16 (exactly),
// the q8_0 GGUF within Q8_0's bound of it, and the f32 values the generator's own.
TEST(Synth, FormatsHoldTheSameModel) {
  for (const char* shape : {"smollm2-135m", "qwen3-06b"}) {
    TempDir dir;
    auto f32 = write_and_load(shape, SynthFormat::Gguf, DType::F32, dir.file("f32.gguf"), 5, 1, 400);
    auto q8 = write_and_load(shape, SynthFormat::Gguf, DType::Q8_0, dir.file("q8.gguf"), 5, 1, 400);
    auto bf = write_and_load(shape, SynthFormat::Safetensors, DType::BF16, dir.file("hf"), 5, 1, 400);
    ASSERT_TRUE(f32.model && q8.model && bf.model);
    const bool llama = f32.model->config.arch == Arch::Llama;
    const auto& L32 = f32.model->weights.layers[0];
    const auto& L8 = q8.model->weights.layers[0];
    const auto& Lb = bf.model->weights.layers[0];
    struct Trio { const Tensor *a, *b, *c; int perm_heads; };
    const int nh = f32.model->config.n_heads, nkv = f32.model->config.n_kv_heads;
    const Trio trios[] = {
        {&f32.model->weights.token_embd, &q8.model->weights.token_embd, &bf.model->weights.token_embd, 0},
        {&L32.wq, &L8.wq, &Lb.wq, llama ? nh : 0},
        {&L32.wk, &L8.wk, &Lb.wk, llama ? nkv : 0},
        {&L32.wv, &L8.wv, &Lb.wv, 0},
        {&L32.wo, &L8.wo, &Lb.wo, 0},
        {&L32.w_down, &L8.w_down, &Lb.w_down, 0},
        {&L32.attn_norm, &L8.attn_norm, &Lb.attn_norm, 0},
    };
    for (const Trio& t : trios) {
      SCOPED_TRACE(std::string(shape) + " " + t.a->name);
      ASSERT_EQ(t.a->type, DType::F32);
      ASSERT_EQ(t.c->type, DType::BF16);
      const auto a = decode(*t.a), b = decode(*t.b), c = decode(*t.c);
      ASSERT_EQ(a.size(), c.size());
      const int64_t rows = t.a->rows(), cols = t.a->cols();
      const auto perm = t.perm_heads ? llama_permutation(rows, t.perm_heads) : std::vector<int64_t>{};
      const uint64_t key = synth_tensor_key(5, t.a->name);
      const bool norm = t.a->n_dims == 1;
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t hf_r = t.perm_heads ? perm[r] : r;
        for (int64_t k = 0; k < cols; ++k) {
          const float va = a[r * cols + k];
          const float want = norm ? 1.0f : synth_value(key, static_cast<uint64_t>(hf_r * cols + k));
          ASSERT_EQ(va, want) << "row " << r << " col " << k;
          ASSERT_EQ(c[hf_r * cols + k], bf16_to_fp32(fp32_to_bf16(va))) << "row " << r << " col " << k;
        }
        for (int64_t k = 0; k < cols; k += QK8_0) {
          double amax = 0;
          for (int j = 0; j < QK8_0 && !norm; ++j) amax = std::max(amax, static_cast<double>(std::fabs(a[r * cols + k + j])));
          for (int j = 0; j < (norm ? 1 : QK8_0); ++j) {
            const int64_t e = r * cols + k + j;
            if (norm) ASSERT_EQ(b[e], a[e]);
            else ASSERT_LE(std::fabs(static_cast<double>(b[e]) - a[e]), max_error(DType::Q8_0, amax)) << "element " << e;
          }
        }
      }
    }
  }
}

TEST(Synth, RowsNotWholeSuperBlocksFallBackAsLlamaCpp) {
  TempDir dir;
  // SmolLM2's hidden size 576 is not a multiple of 256: those rows go to Q5_0; ffn_down (1536) stays Q4_K.
  auto w = write_and_load("smollm2-135m", SynthFormat::Gguf, DType::Q4_K, dir.file("m.gguf"), 1, 1, 512);
  ASSERT_TRUE(w.model);
  EXPECT_EQ(w.model->weights.layers[0].wq.type, DType::Q5_0);
  EXPECT_EQ(w.model->weights.layers[0].w_down.type, DType::Q4_K);
  ASSERT_EQ(w.result.notes.size(), 1u);
  EXPECT_HAS(w.result.notes[0], "Q5_0");
}

TEST(Synth, BadArgumentsAreClearErrors) {
  TempDir dir;
  auto err = [&](SynthOptions o) {
    if (o.out.empty()) o.out = dir.file("x.gguf");
    auto r = write_synth_model(o);
    EXPECT_FALSE(r.ok());
    return r.ok() ? std::string() : r.message();
  };
  SynthOptions base;
  base.shape = "smollm2-135m";
  base.layers = 1;
  base.vocab = 512;
  SynthOptions o = base;
  o.shape = "llama-9000";
  EXPECT_HAS(err(o), "unknown shape 'llama-9000' (known: smollm2-135m, llama32-1b");
  o = base;
  o.format = SynthFormat::Safetensors;
  o.dtype = DType::Q4_0;
  EXPECT_HAS(err(o), "safetensors holds f32, f16 or bf16, not Q4_0");
  o = base;
  o.vocab = 100;
  EXPECT_HAS(err(o), "--vocab 100 is out of range [262");
  o = base;
  o.layers = -2;
  EXPECT_HAS(err(o), "--layers -2 is out of range");
  o = base;
  o.out = dir.file("no/such/dir/x.gguf");
  EXPECT_HAS(err(o), "cannot open for writing");
  EXPECT_FALSE(fs::exists(dir.file("x.gguf")));
  o = base;
  o.out = "/dev/null";  // opens fine but is no file to size: an error, and the device stays
  EXPECT_HAS(err(o), "/dev/null: not a regular file");
  EXPECT_TRUE(fs::exists("/dev/null"));
  EXPECT_HAS(synth_dtype("q3_k").message(), "unknown dtype 'q3_k'");
  EXPECT_EQ(*synth_dtype("Q4_K"), DType::Q4_K);
}

}  // namespace
}  // namespace ss::model::test
