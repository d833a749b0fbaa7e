// Whole-model loading: the GGUF written by the reference gguf package, the real default model, and
// inspect_report.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "model/gguf.h"
#include "model_test_util.h"

namespace ss::model {
namespace {

using namespace test;

// tests/data/tiny-llama.gguf comes from tools/make_tiny_gguf.py (the gguf package's GGUFWriter);
// it stores each tensor's dequantized first row as metadata test.row0.<name>.
TEST(ReferenceGguf, TinyLlamaFromGgufWriter) {
  const std::string path = data_dir() + "/tiny-llama.gguf";
  LoadOptions o = no_tokenizer();
  o.check_values = true;
  auto m = load_model(path, o);
  ASSERT_TRUE(m) << m.message();
  const ModelConfig& c = m.value()->config;
  EXPECT_EQ(c.arch, Arch::Llama);
  EXPECT_EQ(c.name, "tiny-llama");
  EXPECT_EQ(c.n_layers, 2);
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.intermediate_size, 256);
  EXPECT_EQ(c.vocab_size, 272);
  EXPECT_FALSE(c.tie_embeddings);
  EXPECT_FALSE(m.value()->chat_template.empty());
  const Weights& w = m.value()->weights;
  EXPECT_EQ(w.output.type, DType::F16);
  EXPECT_EQ(w.layers[0].w_down.type, DType::Q4_K);
  EXPECT_EQ(w.layers[1].w_down.type, DType::Q6_K);
  EXPECT_EQ(w.layers[0].w_up.type, DType::BF16);
  for (int i = 0; i < 64; ++i) {
    float v;
    std::memcpy(&v, static_cast<const uint8_t*>(w.output_norm.data) + 4 * i, 4);
    ASSERT_EQ(v, 1 + i / 64.0f);
  }

  // Every tensor's first row, dequantized by us, equals what the gguf package computed.
  const auto bytes = read_file(path);
  auto g = gguf::parse(bytes.data(), bytes.size(), path);
  ASSERT_TRUE(g);
  std::map<std::string, const Tensor*> by_name = {{"token_embd.weight", &w.token_embd},
                                                  {"output_norm.weight", &w.output_norm},
                                                  {"output.weight", &w.output}};
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const auto& l = w.layers[i];
    const std::string p = "blk." + std::to_string(i) + ".";
    using Named = std::pair<const char*, const Tensor*>;
    for (auto [n, t] : std::initializer_list<Named>{
             {"attn_norm.weight", &l.attn_norm}, {"attn_q.weight", &l.wq}, {"attn_k.weight", &l.wk},
                        {"attn_v.weight", &l.wv}, {"attn_output.weight", &l.wo}, {"ffn_norm.weight", &l.ffn_norm},
                        {"ffn_gate.weight", &l.w_gate}, {"ffn_up.weight", &l.w_up}, {"ffn_down.weight", &l.w_down}})
      by_name[p + n] = t;
  }
  ASSERT_EQ(by_name.size(), m.value()->tensor_table.size());
  for (const auto& [name, t] : by_name) {
    SCOPED_TRACE(name);
    auto want = g->get_floats("test.row0." + name);
    ASSERT_TRUE(want);
    ASSERT_EQ(static_cast<int64_t>(want->size()), t->cols());
    std::vector<float> got(want->size());
    dequantize_row(t->type, t->row(0), got.data(), t->cols());
    for (size_t k = 0; k < got.size(); ++k) ASSERT_EQ(got[k], (*want)[k]) << "column " << k;
  }
}

// The default model, when present in $SELFSERVE_HOME/models (default ~/.cache/selfserve/models).
class RealModel : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = models_dir() + "/SmolLM2-135M-Instruct.Q4_1.gguf";
    if (!fs::exists(path_)) GTEST_SKIP() << "real model not found at " << path_ << " (set SELFSERVE_HOME)";
  }
  std::string path_;
};

TEST_F(RealModel, SmolLM2Config) {
  LoadOptions o = no_tokenizer();
  o.check_values = true;
  auto m = load_model(path_, o);
  ASSERT_TRUE(m) << m.message();
  const ModelConfig& c = m.value()->config;
  EXPECT_EQ(c.arch, Arch::Llama);
  EXPECT_EQ(c.rope_style, RopeStyle::Interleaved);
  EXPECT_EQ(c.n_layers, 30);
  EXPECT_EQ(c.hidden_size, 576);
  EXPECT_EQ(c.n_heads, 9);
  EXPECT_EQ(c.n_kv_heads, 3);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.rope_dim, 64);
  EXPECT_EQ(c.intermediate_size, 1536);
  EXPECT_EQ(c.vocab_size, 49152);
  EXPECT_EQ(c.max_context, 8192);
  EXPECT_TRUE(c.tie_embeddings);
  EXPECT_EQ(c.rope_theta, 100000.0f);
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-5f);
  EXPECT_EQ(c.rope_scaling.kind, RopeScaling::Kind::None);
  const Weights& w = m.value()->weights;
  EXPECT_EQ(w.output.data, w.token_embd.data);
  EXPECT_EQ(w.token_embd.type, DType::Q8_0);
  EXPECT_EQ(w.layers[0].wq.type, DType::Q4_1);
  EXPECT_EQ(m.value()->tensor_table.size(), 272u);
  EXPECT_EQ(m.value()->file_bytes, fs::file_size(path_));
  EXPECT_NE(m.value()->chat_template.find("<|im_start|>"), std::string::npos);
}

TEST_F(RealModel, TokenizerLoadsOrReportsItsError) {
  auto m = load_model(path_);
  if (!m) {
    EXPECT_HAS(m.message(), path_ + ": ");
    return;
  }
  ASSERT_NE(m.value()->tokenizer, nullptr);
  EXPECT_EQ(m.value()->tokenizer->vocab_size(), 49152);
}

TEST_F(RealModel, Inspect) {
  const std::string r = inspect_report(path_, no_tokenizer());
  EXPECT_HAS(r, "architecture: llama");
  EXPECT_HAS(r, "layers 30, hidden 576, heads 9 (kv 3), head_dim 64, ffn 1536, vocab 49152");
  EXPECT_HAS(r, "tensors: 272");
  EXPECT_HAS(r, "token_embd.weight");
  EXPECT_HAS(r, "Q4_1 x210");
  EXPECT_HAS(r, "verdict: OK");
}

TEST(Inspect, ReportsWhatItReadAndTheError) {
  TempDir dir;
  GgufBuilder g = tiny_gguf({});
  g.drop("blk.1.ffn_up.weight");
  write_file(dir.file("m.gguf"), g.build());
  const std::string r = inspect_report(dir.file("m.gguf"), no_tokenizer());
  EXPECT_HAS(r, "architecture: llama (tiny-llama)");
  EXPECT_HAS(r, "blk.0.ffn_up.weight");
  EXPECT_HAS(r, "verdict: " + dir.file("m.gguf") + ": missing tensor blk.1.ffn_up.weight");
  const std::string absent = inspect_report(dir.file("none.gguf"));
  EXPECT_HAS(absent, "verdict: " + dir.file("none.gguf") + ": no such file or directory");
}

// The mix line: llama.cpp's name for general.file_type, then each type's share of the 2-D tensor bytes,
// largest first, recomputed here from the tensors written.
TEST(Inspect, NamesTheQuantMix) {
  TempDir dir;
  TinySpec s;
  s.hidden = 256;
  s.ffn = 256;
  s.heads = 4;
  s.kv_heads = 4;
  s.wtype = DType::Q4_K;
  GgufBuilder g = tiny_gguf(s);
  std::mt19937 rng(3);
  for (const char* name : {"blk.0.ffn_down.weight", "blk.1.ffn_down.weight", "blk.0.attn_v.weight"}) {
    GgufBuilder::T* t = g.find(name);
    ASSERT_NE(t, nullptr) << name;
    t->type = static_cast<uint32_t>(DType::Q6_K);
    t->data = random_tensor_bytes(DType::Q6_K, t->ne[0] * t->ne[1], rng);
  }
  // llama.cpp's llama_ftype numbering (llama.h): the names inspect gives them.
  for (const auto& [id, name] : std::vector<std::pair<uint32_t, std::string>>{
           {0, "F32"}, {2, "Q4_0"}, {3, "Q4_1"}, {7, "Q8_0"}, {9, "Q5_1"}, {12, "Q3_K_M"}, {18, "Q6_K"},
           {25, "IQ4_NL"}, {30, "IQ4_XS"}, {32, "BF16"}, {1024 + 17, "Q5_K_M"}}) {
    GgufBuilder h = g;
    h.u32("general.file_type", id);
    write_file(dir.file("h.gguf"), h.build());
    EXPECT_HAS(inspect_report(dir.file("h.gguf"), no_tokenizer()), "quant mix: " + name + ": ");
  }
  g.u32("general.file_type", 15);
  write_file(dir.file("m.gguf"), g.build());
  std::map<uint32_t, double> bytes;
  double total = 0;
  for (const auto& t : g.tensors)
    if (t.ne.size() >= 2) bytes[t.type] += static_cast<double>(t.data.size()), total += static_cast<double>(t.data.size());
  std::vector<std::pair<double, uint32_t>> order;
  for (const auto& [type, b] : bytes) order.push_back({b, type});
  std::sort(order.rbegin(), order.rend());
  std::string want = "quant mix: Q4_K_M: ";
  for (size_t i = 0; i < order.size(); ++i) {
    char pct[16];
    std::snprintf(pct, sizeof pct, "%.0f%%", 100.0 * order[i].first / total);
    want += (i ? ", " : "") + std::string(dtype_name(static_cast<DType>(order[i].second))) + " " + pct;
  }
  ASSERT_GE(order.size(), 2u);
  const std::string r = inspect_report(dir.file("m.gguf"), no_tokenizer());
  EXPECT_HAS(r, want + " (of matrix bytes)");
  EXPECT_HAS(r, "verdict: OK");
}

TEST(Inspect, TinyReferenceGgufIsOk) {
  const std::string r = inspect_report(data_dir() + "/tiny-llama.gguf", no_tokenizer());
  EXPECT_HAS(r, "Q4_K");
  EXPECT_HAS(r, "[256, 64]");
  EXPECT_HAS(r, "verdict: OK");
}

}  // namespace
}  // namespace ss::model

namespace ss::model {
namespace {

using namespace test;

// The fuzz seeds (tools/make_fuzz_seeds.py) must be valid models, or the fuzzers never get past
// the first checks.
TEST(FuzzSeeds, AreValidModels) {
  const std::string root = source_dir() + "/fuzz/corpus";
  int n = 0;
  for (const auto& e : fs::directory_iterator(root + "/gguf")) {
    EXPECT_EQ("", load_error(e.path().string())) << e.path();
    ++n;
  }
  EXPECT_GE(n, 3);
  // safetensors_fuzz.cpp binds against this tiny config.
  TempDir dir;
  for (const char* arch : {"llama", "qwen2", "qwen3"}) {
    std::string cfg = R"({"model_type":"ARCH","hidden_size":8,"num_hidden_layers":1,"num_attention_heads":2,
                          "num_key_value_heads":1,"head_dim":4,"intermediate_size":16,"vocab_size":16})";
    cfg.replace(cfg.find("ARCH"), 4, arch);
    write_text(dir.file("config.json"), cfg);
    for (const auto& e : fs::directory_iterator(root + "/safetensors")) {
      const std::string name = e.path().filename().string();
      if (!name.starts_with(arch)) continue;
      fs::copy_file(e.path(), dir.file("model.safetensors"), fs::copy_options::overwrite_existing);
      EXPECT_EQ("", load_error(dir.path())) << name;
    }
  }
}

}  // namespace
}  // namespace ss::model
