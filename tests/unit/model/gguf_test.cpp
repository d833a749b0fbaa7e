// GGUF loading: good synthetic models, and one crafted bad file per validation failure.
#include <cctype>
#include <cmath>
#include <numbers>
#include <set>

#include "common/sha256.h"
#include "model/gguf.h"
#include "model_test_util.h"

namespace ss::model {
namespace {

using namespace test;

class Gguf : public ::testing::Test {
 protected:
  // Writes the builder's file and loads it; returns the error ("" when it loads).
  std::string load(const GgufBuilder& g, LoadOptions opts = no_tokenizer()) {
    path_ = dir_.file("model.gguf");
    write_file(path_, g.build());
    return load_error(path_, opts);
  }
  std::string load_bytes(const std::vector<uint8_t>& bytes, LoadOptions opts = no_tokenizer()) {
    path_ = dir_.file("model.gguf");
    write_file(path_, bytes);
    return load_error(path_, opts);
  }
  // The absolute file offset of a tensor's data in the built file.
  static uint64_t data_offset_of(const GgufBuilder& g, const std::string& name) {
    const auto bytes = g.build();
    auto f = gguf::parse(bytes.data(), bytes.size(), "x");
    for (const auto& t : f->tensors)
      if (t.name == name) return t.offset;
    return 0;
  }
  TempDir dir_;
  std::string path_;
};

TEST_F(Gguf, TinyLlamaLoads) {
  GgufBuilder g = tiny_gguf({});
  ASSERT_EQ("", load(g));
  auto m = load_model(path_, no_tokenizer());
  ASSERT_TRUE(m);
  const ModelConfig& c = m.value()->config;
  EXPECT_EQ(c.arch, Arch::Llama);
  EXPECT_EQ(c.rope_style, RopeStyle::Interleaved);
  EXPECT_EQ(c.n_layers, 2);
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.n_heads, 4);
  EXPECT_EQ(c.n_kv_heads, 2);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.rope_dim, 16);
  EXPECT_EQ(c.intermediate_size, 128);
  EXPECT_EQ(c.vocab_size, 64);
  EXPECT_EQ(c.max_context, 512);
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-6f);
  EXPECT_TRUE(c.tie_embeddings);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_FALSE(c.qk_norm);
  const Weights& w = m.value()->weights;
  EXPECT_EQ(w.output.data, w.token_embd.data);
  ASSERT_EQ(w.layers.size(), 2u);
  EXPECT_EQ(w.layers[1].w_down.cols(), 128);
  EXPECT_EQ(w.layers[1].w_down.rows(), 64);
  EXPECT_EQ(w.layers[0].wk.rows(), 32);
  EXPECT_FALSE(w.layers[0].bq.valid());
  EXPECT_EQ(m.value()->tensor_table.size(), g.tensors.size());
  EXPECT_EQ(m.value()->chat_template, "{{ messages }}");
  EXPECT_EQ(m.value()->tokenizer, nullptr);
  // Views, not copies: the data lies inside the mapping at the expected place.
  const auto bytes = read_file(path_);
  const uint64_t off = data_offset_of(g, "blk.0.ffn_up.weight");
  EXPECT_EQ(0, std::memcmp(w.layers[0].w_up.data, bytes.data() + off, w.layers[0].w_up.nbytes));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(w.layers[0].w_up.data) % 32, 0u);
}

TEST_F(Gguf, Qwen2HasBiasesAndHalfSplit) {
  TinySpec s;
  s.arch = "qwen2";
  s.tied = false;
  ASSERT_EQ("", load(tiny_gguf(s)));
  auto m = load_model(path_, no_tokenizer());
  ASSERT_TRUE(m);
  EXPECT_EQ(m.value()->config.arch, Arch::Qwen2);
  EXPECT_EQ(m.value()->config.rope_style, RopeStyle::HalfSplit);
  EXPECT_TRUE(m.value()->config.qkv_bias);
  EXPECT_FALSE(m.value()->config.tie_embeddings);
  EXPECT_NE(m.value()->weights.output.data, m.value()->weights.token_embd.data);
  EXPECT_EQ(m.value()->weights.layers[1].bk.numel(), 32);
}

TEST_F(Gguf, Qwen3HasQkNormAndExplicitHeadDim) {
  TinySpec s;
  s.arch = "qwen3";
  s.head_dim = 32;  // heads * head_dim (128) != hidden (64), as in real Qwen3
  ASSERT_EQ("", load(tiny_gguf(s)));
  auto m = load_model(path_, no_tokenizer());
  ASSERT_TRUE(m);
  EXPECT_EQ(m.value()->config.head_dim, 32);
  EXPECT_TRUE(m.value()->config.qk_norm);
  EXPECT_EQ(m.value()->weights.layers[0].wq.rows(), 128);
  EXPECT_EQ(m.value()->weights.layers[0].wo.cols(), 128);
  EXPECT_EQ(m.value()->weights.layers[0].k_norm.numel(), 32);
}

TEST_F(Gguf, EveryWeightTypeLoads) {
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1,
                  DType::Q8_0, DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ4_NL,
                  DType::IQ4_XS}) {
    TinySpec s;
    s.wtype = t;
    s.hidden = 256;  // K-quants need 256-element rows
    s.ffn = 256;
    s.heads = 4;
    s.kv_heads = 4;
    LoadOptions o = no_tokenizer();
    o.check_values = true;
    EXPECT_EQ("", load(tiny_gguf(s), o)) << dtype_name(t);
  }
}

// ---- header and structure ----------------------------------------------------------------------

TEST_F(Gguf, BadMagic) {
  auto bytes = tiny_gguf({}).build();
  bytes[0] = 'X';
  EXPECT_HAS(load_bytes(bytes), ("model.gguf: not a GGUF file (bad magic)"));
}

TEST_F(Gguf, BadVersion) {
  GgufBuilder g = tiny_gguf({});
  g.version = 1;
  EXPECT_HAS(load(g), ("unsupported GGUF version 1 (supported: 2, 3)"));
  g.version = 4;
  EXPECT_HAS(load(g), ("unsupported GGUF version 4"));
  g.version = 2;
  EXPECT_EQ("", load(g));
}

TEST_F(Gguf, EmptyAndTinyFiles) {
  EXPECT_HAS(load_bytes({}), ("not a GGUF file"));
  EXPECT_HAS(load_bytes({'G', 'G', 'U', 'F'}), ("truncated"));
}

TEST_F(Gguf, EveryTruncationIsAnErrorNeverACrash) {
  const auto bytes = tiny_gguf({}).build();
  // Every prefix through the header, then a sample through the data.
  for (size_t n = 0; n < bytes.size(); n += (n < 4096 ? 1 : 97)) {
    std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + static_cast<ptrdiff_t>(n));
    auto f = gguf::parse(cut.data(), cut.size(), "cut.gguf");
    ASSERT_FALSE(f.ok()) << "prefix of " << n << " bytes parsed";
  }
}

TEST_F(Gguf, TruncatedMessages) {
  const auto bytes = tiny_gguf({}).build();
  std::vector<uint8_t> header_cut(bytes.begin(), bytes.begin() + 300);
  EXPECT_HAS(load_bytes(header_cut), ("model.gguf: file is truncated or corrupt: metadata"));
  std::vector<uint8_t> data_cut(bytes.begin(), bytes.end() - 1000);
  const std::string e = load_bytes(data_cut);
  EXPECT_HAS(e, ("data ends at"));
  EXPECT_HAS(e, ("file is " + std::to_string(data_cut.size()) + " bytes"));
}

TEST_F(Gguf, TensorOutOfBounds) {
  GgufBuilder g = tiny_gguf({});
  g.find("blk.1.ffn_up.weight")->offset = uint64_t{1} << 40;
  EXPECT_HAS(load(g), ("model.gguf: tensor blk.1.ffn_up.weight: data ends at"));
  g.find("blk.1.ffn_up.weight")->offset = ~uint64_t{0} - 31;  // aligned, and start + size overflows
  EXPECT_HAS(load(g), ("tensor blk.1.ffn_up.weight: data ends at beyond 2^64"));
}

TEST_F(Gguf, TensorMisaligned) {
  GgufBuilder g = tiny_gguf({});
  g.find("blk.0.attn_k.weight")->offset = 16;
  EXPECT_HAS(load(g), ("tensor blk.0.attn_k.weight: data offset 16 is not a multiple of the alignment 32"));
  // With alignment 1 the offsets are legal, but F32 data at an odd address is not.
  GgufBuilder h = tiny_gguf({});
  h.alignment = 1;
  h.u32("general.alignment", 1);
  h.find("output_norm.weight")->offset = 64 * 68 + 1;  // right after token_embd, shifted by one byte
  EXPECT_HAS(load(h), ("is misaligned for"));
}

TEST_F(Gguf, BadAlignmentKey) {
  GgufBuilder g = tiny_gguf({});
  g.u32("general.alignment", 24);
  EXPECT_HAS(load(g), ("general.alignment 24 is not a power of two"));
  g.u32("general.alignment", 0);
  EXPECT_HAS(load(g), ("general.alignment 0"));
  g.str("general.alignment", "32");
  EXPECT_HAS(load(g), ("metadata general.alignment: expected an integer, found string"));
  GgufBuilder h = tiny_gguf({});
  h.alignment = 64;
  h.u32("general.alignment", 64);
  EXPECT_EQ("", load(h));
}

TEST_F(Gguf, UnknownTensorType) {
  GgufBuilder g = tiny_gguf({});
  g.find("blk.0.attn_q.weight")->type = 99;
  EXPECT_HAS(load(g), ("tensor blk.0.attn_q.weight: unknown tensor type (id 99)"));
  g.find("blk.0.attn_q.weight")->type = 16;
  EXPECT_HAS(load(g), ("tensor blk.0.attn_q.weight: unsupported tensor type IQ2_XXS (id 16)"));
  g.find("blk.0.attn_q.weight")->type = 15;
  EXPECT_HAS(load(g), ("unsupported tensor type Q8_K"));
}

TEST_F(Gguf, RowLengthNotMultipleOfBlock) {
  GgufBuilder g = tiny_gguf({});
  g.find("blk.0.attn_q.weight")->ne[0] = 40;
  EXPECT_HAS(load(g), ("tensor blk.0.attn_q.weight: row length 40 is not a multiple of the Q8_0 block size 32"));
}

TEST_F(Gguf, TooManyDimensionsAndHugeShapes) {
  GgufBuilder g = tiny_gguf({});
  g.find("output_norm.weight")->ne = {64, 1, 1, 1, 1};
  EXPECT_HAS(load(g), ("tensor output_norm.weight: 5 dimensions (at most 4)"));
  GgufBuilder h = tiny_gguf({});
  h.find("output_norm.weight")->ne = {64, int64_t{1} << 40, int64_t{1} << 40};
  EXPECT_HAS(load(h), ("tensor output_norm.weight: element count overflows"));
  h.find("output_norm.weight")->ne = {64, -1};
  EXPECT_HAS(load(h), ("tensor output_norm.weight: dimension 1 is too large"));
}

TEST_F(Gguf, ErrorsStayOnOneLine) {
  GgufBuilder g = tiny_gguf({});
  g.tensor("evil\nname", DType::F32, {4}, std::vector<uint8_t>(16));
  const std::string e = load(g);
  EXPECT_HAS(e, "unexpected tensor evil?name");
  EXPECT_EQ(e.find('\n'), std::string::npos);
}

TEST_F(Gguf, DuplicatesAreRejected) {
  GgufBuilder g = tiny_gguf({});
  g.tensors.push_back(*g.find("output_norm.weight"));
  EXPECT_HAS(load(g), ("duplicate tensor output_norm.weight"));
  GgufBuilder h = tiny_gguf({});
  h.kvs.push_back(h.kvs[0]);
  EXPECT_HAS(load(h), ("duplicate metadata key general.architecture"));
}

TEST_F(Gguf, HostileLengths) {
  GgufBuilder g = tiny_gguf({});
  Bytes b;
  b.put<uint64_t>(~uint64_t{0});  // string length 2^64-1
  g.raw("general.name", 8, b.b);
  EXPECT_HAS(load(g), ("metadata general.name needs bytes up to beyond 2^64"));
  Bytes a;
  a.put<uint32_t>(8);
  a.put<uint64_t>(uint64_t{1} << 61);  // array of 2^61 strings
  g = tiny_gguf({});
  g.raw("tokenizer.ggml.tokens", 9, a.b);
  EXPECT_HAS(load(g), ("file is truncated or corrupt: metadata tokenizer.ggml.tokens"));
  Bytes c;
  c.put<uint32_t>(77);  // unknown element type
  c.put<uint64_t>(1);
  g = tiny_gguf({});
  g.raw("x.y", 9, c.b);
  EXPECT_HAS(load(g), ("metadata x.y: unknown array element type 77"));
  g = tiny_gguf({});
  g.raw("x.y", 13, {});
  EXPECT_HAS(load(g), ("metadata x.y: unknown value type 13"));
  // Counts that cannot fit are refused before anything is allocated.
  auto bytes = tiny_gguf({}).build();
  const uint64_t huge = uint64_t{1} << 62;
  std::memcpy(bytes.data() + 8, &huge, 8);
  EXPECT_HAS(load_bytes(bytes), ("file is truncated or corrupt: 4611686018427387904 tensor infos cannot fit"));
  bytes = tiny_gguf({}).build();
  std::memcpy(bytes.data() + 16, &huge, 8);
  EXPECT_HAS(load_bytes(bytes), ("metadata entries cannot fit in the remaining"));
}

TEST_F(Gguf, AllValueTypesParse) {
  GgufBuilder g = tiny_gguf({});
  auto pod = [](auto v) {
    std::vector<uint8_t> o(sizeof(v));
    std::memcpy(o.data(), &v, sizeof(v));
    return o;
  };
  g.raw("t.u8", 0, pod(uint8_t{200}));
  g.raw("t.i8", 1, pod(int8_t{-5}));
  g.raw("t.u16", 2, pod(uint16_t{60000}));
  g.raw("t.i16", 3, pod(int16_t{-30000}));
  g.raw("t.u32", 4, pod(uint32_t{4000000000u}));
  g.raw("t.i32", 5, pod(int32_t{-7}));
  g.raw("t.f32", 6, pod(1.5f));
  g.raw("t.bool", 7, pod(uint8_t{1}));
  g.str("t.str", "hello");
  g.raw("t.u64", 10, pod(uint64_t{1} << 40));
  g.raw("t.i64", 11, pod(int64_t{-(int64_t{1} << 40)}));
  g.raw("t.f64", 12, pod(2.25));
  g.raw("t.big", 10, pod(~uint64_t{0}));
  g.f32s("t.f32s", {1, 2, 3});
  g.i32s("t.i32s", {4, -5});
  g.strings("t.strs", {"a", "", "ccc"});
  Bytes nested;  // [[1, 2], []] as arrays of u16
  nested.put<uint32_t>(9);
  nested.put<uint64_t>(2);
  nested.put<uint32_t>(2);
  nested.put<uint64_t>(2);
  nested.put<uint16_t>(1);
  nested.put<uint16_t>(2);
  nested.put<uint32_t>(2);
  nested.put<uint64_t>(0);
  g.raw("t.nested", 9, nested.b);
  const auto bytes = g.build();
  auto f = gguf::parse(bytes.data(), bytes.size(), "all.gguf");
  ASSERT_TRUE(f) << f.message();
  EXPECT_EQ(*f->get_int("t.u8"), 200);
  EXPECT_EQ(*f->get_int("t.i8"), -5);
  EXPECT_EQ(*f->get_int("t.u16"), 60000);
  EXPECT_EQ(*f->get_int("t.i16"), -30000);
  EXPECT_EQ(*f->get_int("t.u32"), 4000000000LL);
  EXPECT_EQ(*f->get_int("t.i32"), -7);
  EXPECT_EQ(*f->get_float("t.f32"), 1.5);
  EXPECT_EQ(*f->get_bool("t.bool"), true);
  EXPECT_EQ(*f->get_string("t.str"), "hello");
  EXPECT_EQ(*f->get_int("t.u64"), int64_t{1} << 40);
  EXPECT_EQ(*f->get_int("t.i64"), -(int64_t{1} << 40));
  EXPECT_EQ(*f->get_float("t.f64"), 2.25);
  EXPECT_EQ(*f->get_float("t.i32"), -7.0);
  EXPECT_HAS(f->get_int("t.big").message(), ("all.gguf: metadata t.big: value 18446744073709551615 is out of range"));
  EXPECT_EQ(*f->get_floats("t.f32s"), (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(*f->get_ints("t.i32s"), (std::vector<int32_t>{4, -5}));
  EXPECT_EQ(*f->get_strings("t.strs"), (std::vector<std::string>{"a", "", "ccc"}));
  EXPECT_TRUE(f->get_strings("t.absent")->empty());
  EXPECT_HAS(f->get_strings("t.f32s").message(), ("expected an array of strings"));
  EXPECT_HAS(f->get_int("t.missing").message(), ("all.gguf: metadata t.missing: missing"));
  EXPECT_HAS(f->get_string("t.u8").message(), ("expected a string, found u8"));
  EXPECT_HAS(f->get_bool("t.u8").message(), ("expected a bool, found u8"));
  const gguf::Value* n = f->find("t.nested");
  ASSERT_NE(n, nullptr);
  ASSERT_EQ(n->items.size(), 2u);
  EXPECT_EQ(n->items[0].count, 2u);
  EXPECT_EQ(n->items[1].count, 0u);
}

TEST_F(Gguf, DeeplyNestedArraysAreRefused) {
  GgufBuilder g = tiny_gguf({});
  Bytes b;
  for (int i = 0; i < 100; ++i) {
    b.put<uint32_t>(9);
    b.put<uint64_t>(1);
  }
  b.put<uint32_t>(0);
  b.put<uint64_t>(0);
  g.raw("t.deep", 9, b.b);
  EXPECT_HAS(load(g), ("metadata t.deep: arrays nested deeper than"));
}

// ---- config and tensors against the config -------------------------------------------------------

TEST_F(Gguf, MissingTensor) {
  GgufBuilder g = tiny_gguf({});
  g.drop("blk.1.ffn_up.weight");
  EXPECT_HAS(load(g), ("model.gguf: missing tensor blk.1.ffn_up.weight"));
  TinySpec s;
  s.arch = "qwen2";
  g = tiny_gguf(s);
  g.drop("blk.0.attn_v.bias");
  EXPECT_HAS(load(g), ("missing tensor blk.0.attn_v.bias"));
  s.arch = "qwen3";
  g = tiny_gguf(s);
  g.drop("blk.1.attn_k_norm.weight");
  EXPECT_HAS(load(g), ("missing tensor blk.1.attn_k_norm.weight"));
}

TEST_F(Gguf, ShapeDisagreesWithConfig) {
  TinySpec s;
  s.tied = false;
  GgufBuilder g = tiny_gguf(s);
  auto* out = g.find("output.weight");
  out->ne = {64, 63};
  out->data.resize(out->data.size() / 64 * 63);
  EXPECT_HAS(load(g),
              ("model.gguf: tensor output.weight: shape [64, 63] does not match the config, which needs [64, 64]"));
  g = tiny_gguf({});
  g.find("blk.0.attn_k.weight")->ne = {64, 16};  // half the kv rows
  EXPECT_HAS(load(g), ("tensor blk.0.attn_k.weight: shape [64, 16] does not match the config, which needs [64, 32]"));
  g = tiny_gguf({});
  g.u32("llama.feed_forward_length", 96);
  EXPECT_HAS(load(g), ("tensor blk.0.ffn_gate.weight: shape [64, 128] does not match the config, which needs [64, 96]"));
}

TEST_F(Gguf, VectorsMustBeFloat) {
  GgufBuilder g = tiny_gguf({});
  auto* t = g.find("output_norm.weight");
  t->type = static_cast<uint32_t>(DType::Q8_0);
  t->data.resize(68);
  EXPECT_HAS(load(g), ("tensor output_norm.weight: type Q8_0 is not supported for a vector"));
}

TEST_F(Gguf, UnexpectedTensor) {
  GgufBuilder g = tiny_gguf({});
  g.tensor("blk.2.attn_norm.weight", DType::F32, {64}, std::vector<uint8_t>(256));
  EXPECT_HAS(load(g), ("unexpected tensor blk.2.attn_norm.weight (not part of a llama model with 2 layers)"));
}

TEST_F(Gguf, BadConfig) {
  GgufBuilder g = tiny_gguf({});
  g.str("general.architecture", "gemma2");
  EXPECT_HAS(load(g), ("model.gguf: unsupported architecture 'gemma2' (supported: llama, qwen2, qwen3)"));
  g = tiny_gguf({});
  g.remove("llama.block_count");
  EXPECT_HAS(load(g), ("model.gguf: metadata llama.block_count: missing"));
  g = tiny_gguf({});
  g.str("llama.block_count", "two");
  EXPECT_HAS(load(g), ("metadata llama.block_count: expected an integer, found string"));
  g = tiny_gguf({});
  g.u32("llama.attention.head_count_kv", 3);
  EXPECT_HAS(load(g), ("n_heads 4 is not a multiple of n_kv_heads 3"));
  g = tiny_gguf({});
  g.u32("llama.block_count", 0);
  EXPECT_HAS(load(g), ("n_layers = 0 is outside [1, 1024]"));
  g = tiny_gguf({});
  g.u64("llama.embedding_length", uint64_t{1} << 40);
  EXPECT_HAS(load(g), ("llama.embedding_length = 1099511627776 is out of range"));
  g = tiny_gguf({});
  g.f32("llama.rope.freq_base", -1.0f);
  EXPECT_HAS(load(g), ("rope_theta = -1.000000 must be > 0"));
  g = tiny_gguf({});
  g.str("llama.rope.scaling.type", "yarn");
  EXPECT_HAS(load(g), ("rope scaling 'yarn' is not supported"));
  g = tiny_gguf({});
  g.remove("llama.attention.layer_norm_rms_epsilon");
  EXPECT_HAS(load(g), ("metadata llama.attention.layer_norm_rms_epsilon: missing"));
}

TEST_F(Gguf, RopeScalingLinearAndLlama3) {
  GgufBuilder g = tiny_gguf({});
  g.str("llama.rope.scaling.type", "linear");
  g.f32("llama.rope.scaling.factor", 4.0f);
  ASSERT_EQ("", load(g));
  auto m = load_model(path_, no_tokenizer());
  EXPECT_EQ(m.value()->config.rope_scaling.kind, RopeScaling::Kind::Linear);
  EXPECT_EQ(m.value()->config.rope_scaling.factor, 4.0f);

  // Llama 3 factors as convert_hf_to_gguf.py writes them (theta 500000, factor 32, orig 8192).
  g = tiny_gguf({});
  g.f32("llama.rope.freq_base", 500000.0f);
  const int dim = 16;
  std::vector<float> freqs;
  for (int i = 0; i < dim / 2; ++i) {
    const double f = 1.0 / std::pow(500000.0, 2.0 * i / dim), wl = 2 * std::numbers::pi / f;
    const double lo = 8192 / 1.0, hi = 8192 / 4.0;
    double v = wl < hi ? 1 : wl > lo ? 32 : 1 / ((1 - (8192 / wl - 1) / 3) / 32 + (8192 / wl - 1) / 3);
    freqs.push_back(static_cast<float>(v));
  }
  std::vector<uint8_t> data(freqs.size() * 4);
  std::memcpy(data.data(), freqs.data(), data.size());
  g.tensor("rope_freqs.weight", DType::F32, {dim / 2}, data);
  ASSERT_EQ("", load(g));
  m = load_model(path_, no_tokenizer());
  EXPECT_EQ(m.value()->config.rope_scaling.kind, RopeScaling::Kind::Llama3);
  EXPECT_EQ(m.value()->config.rope_scaling.factor, 32.0f);
  EXPECT_EQ(m.value()->config.rope_scaling.original_max_position, 8192);

  freqs[3] *= 1.5f;
  std::memcpy(g.find("rope_freqs.weight")->data.data(), freqs.data(), data.size());
  EXPECT_HAS(load(g), ("tensor rope_freqs.weight: per-frequency rope factors that are not Llama 3"));
}

// ---- values, digest, tokenizer, progress ---------------------------------------------------------

TEST_F(Gguf, NanAndInfInWeights) {
  GgufBuilder g = tiny_gguf({});
  const float nan = std::nanf("");
  std::memcpy(g.find("blk.1.ffn_norm.weight")->data.data() + 4 * 5, &nan, 4);
  EXPECT_EQ("", load(g));  // not checked unless asked
  LoadOptions o = no_tokenizer();
  o.check_values = true;
  EXPECT_HAS(load(g, o), ("model.gguf: tensor blk.1.ffn_norm.weight: NaN at row 0, column 5"));

  g = tiny_gguf({});
  const half_bits inf = 0x7C00;  // Q8_0 scale of block 1 of row 3
  std::memcpy(g.find("blk.0.ffn_down.weight")->data.data() + (3 * 4 + 1) * 34, &inf, 2);
  EXPECT_HAS(load(g, o), ("tensor blk.0.ffn_down.weight: Inf at row 3, column 32"));
}

// The K-quant and i-quant types: a non-finite scale anywhere in a block is found and named (the value
// check dequantizes every row), and rows that are not whole super-blocks are refused at load.
TEST_F(Gguf, NewBlockTypesRejectBadScalesAndSizes) {
  struct Case {
    DType type;
    size_t scale_off;  // a half scale inside the block
  };
  for (const Case c : {Case{DType::Q2_K, 82}, Case{DType::Q3_K, 108}, Case{DType::Q5_K, 0}, Case{DType::Q5_K, 2},
                       Case{DType::IQ4_NL, 0}, Case{DType::IQ4_XS, 0}}) {
    SCOPED_TRACE(testing::Message() << dtype_name(c.type) << " scale at byte " << c.scale_off);
    TinySpec s;
    s.wtype = c.type;
    s.hidden = 256;
    s.ffn = 256;
    s.heads = 4;
    s.kv_heads = 4;
    GgufBuilder g = tiny_gguf(s);
    const int64_t bs = info(c.type).block_size, bb = info(c.type).block_bytes;
    const int64_t nb = 256 / bs;  // blocks per row; the last block of row 2 gets a NaN scale
    const half_bits nan = 0x7E00;
    std::memcpy(g.find("blk.0.ffn_down.weight")->data.data() + (2 * nb + nb - 1) * bb + c.scale_off, &nan, 2);
    LoadOptions o = no_tokenizer();
    o.check_values = true;
    // NaN times anything is NaN: the block's first value is the first bad one.
    EXPECT_HAS(load(g, o), ("tensor blk.0.ffn_down.weight: NaN at row 2, column " + std::to_string((nb - 1) * bs)));
  }
  TinySpec s;
  s.wtype = DType::Q5_K;
  s.hidden = 256;
  s.ffn = 256;
  s.heads = 4;
  s.kv_heads = 4;
  GgufBuilder g = tiny_gguf(s);
  g.find("blk.0.ffn_down.weight")->ne[0] = 128;
  EXPECT_HAS(load(g), ("tensor blk.0.ffn_down.weight: row length 128 is not a multiple of the Q5_K block size 256"));
}

TEST_F(Gguf, Sha256) {
  GgufBuilder g = tiny_gguf({});
  ASSERT_EQ("", load(g));
  auto digest = sha256_file(path_);
  ASSERT_TRUE(digest);
  EXPECT_EQ(digest->size(), 64u);
  LoadOptions o = no_tokenizer();
  o.verify_sha256 = *digest;
  EXPECT_EQ("", load_error(path_, o));
  std::string upper = *digest;
  for (auto& ch : upper) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  o.verify_sha256 = upper;
  EXPECT_EQ("", load_error(path_, o));
  o.verify_sha256 = std::string(64, '0');
  EXPECT_EQ(load_error(path_, o),
            path_ + ": sha256 mismatch: expected " + std::string(64, '0') + ", got " + *digest);
  // A known vector: sha256("abc").
  write_text(dir_.file("abc"), "abc");
  EXPECT_EQ(*sha256_file(dir_.file("abc")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_HAS(sha256_file(dir_.file("nope")).message(), ("nope: cannot open"));
}

TEST_F(Gguf, TokenizerSpecAndErrorsPropagate) {
  GgufBuilder g = tiny_gguf({});
  ASSERT_EQ("", load(g));
  // Whatever the tokenizer says, it surfaces: a loaded tokenizer or its error, never a silent null.
  auto m = load_model(path_);
  if (m) {
    ASSERT_NE(m.value()->tokenizer, nullptr);
    EXPECT_EQ(m.value()->tokenizer->vocab_size(), 64);
  } else {
    EXPECT_HAS(m.message(), (path_ + ": "));
  }
  g.f32s("tokenizer.ggml.scores", {1, 2, 3});
  EXPECT_HAS(load(g, LoadOptions{}), ("tokenizer.ggml.scores has 3 entries for 64 tokens"));
  g = tiny_gguf({});
  g.remove("tokenizer.ggml.tokens");
  EXPECT_HAS(load(g, LoadOptions{}), ("metadata llama.vocab_size: missing"));
  g.u32("llama.vocab_size", 64);
  EXPECT_HAS(load(g, LoadOptions{}), ("no tokenizer in the file"));
  EXPECT_EQ("", load(g));
}

TEST_F(Gguf, ProgressIsReported) {
  GgufBuilder g = tiny_gguf({});
  write_file(dir_.file("p.gguf"), g.build());
  LoadOptions o = no_tokenizer();
  o.check_values = true;
  o.verify_sha256 = *sha256_file(dir_.file("p.gguf"));
  std::set<std::string> stages;
  uint64_t last_done = 0, last_total = 0;
  o.progress = [&](const char* stage, uint64_t done, uint64_t total) {
    stages.insert(stage);
    if (std::string(stage) == "check_values") {
      EXPECT_LE(done, total);
      last_done = done;
      last_total = total;
    }
  };
  ASSERT_EQ("", load_error(dir_.file("p.gguf"), o));
  EXPECT_TRUE(stages.count("sha256"));
  EXPECT_TRUE(stages.count("parse"));
  EXPECT_TRUE(stages.count("check_values"));
  EXPECT_EQ(last_done, last_total);
  EXPECT_GT(last_total, 0u);
}

TEST_F(Gguf, MissingPathAndDirectoryWithoutConfig) {
  EXPECT_EQ(load_error(dir_.file("absent.gguf")), dir_.file("absent.gguf") + ": no such file or directory");
  EXPECT_HAS(load_error(dir_.path()), ("config.json: cannot open"));
}

}  // namespace
}  // namespace ss::model
