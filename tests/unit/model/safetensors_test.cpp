// Hugging Face folders: the transformers-written tiny models, and crafted bad ones.
#include "model/safetensors.h"
#include "model/model_config.h"
#include "model_test_util.h"

namespace ss::model {
namespace {

using namespace test;

float bf16_at(const Tensor& t, int64_t i) {
  uint16_t h;
  std::memcpy(&h, static_cast<const uint8_t*>(t.data) + 2 * i, 2);
  return bf16_to_fp32(h);
}

TEST(HfFolder, TinyQwen2FromTransformers) {
  LoadOptions o = no_tokenizer();
  o.check_values = true;
  auto m = load_model(data_dir() + "/tiny-qwen2", o);
  ASSERT_TRUE(m) << m.message();
  const ModelConfig& c = m.value()->config;
  EXPECT_EQ(m.value()->format, FileFormat::Safetensors);
  EXPECT_EQ(c.arch, Arch::Qwen2);
  EXPECT_EQ(c.rope_style, RopeStyle::HalfSplit);
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_FALSE(c.tie_embeddings);
  EXPECT_EQ(c.hidden_size, 32);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.vocab_size, 304);
  EXPECT_EQ(c.rope_theta, 1000000.0f);
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-6f);
  const Weights& w = m.value()->weights;
  EXPECT_NE(w.output.data, w.token_embd.data);
  EXPECT_EQ(w.output.name, "lm_head.weight");
  EXPECT_EQ(w.token_embd.type, DType::BF16);
  EXPECT_EQ(w.token_embd.cols(), 32);   // ne[0] is the last Hugging Face dimension
  EXPECT_EQ(w.token_embd.rows(), 304);
  EXPECT_EQ(w.layers[0].w_down.cols(), 64);
  EXPECT_EQ(w.layers[0].w_down.rows(), 32);
  for (int i = 0; i < 32; ++i) {
    ASSERT_EQ(bf16_at(w.output_norm, i), 1 + i / 64.0f);
    ASSERT_EQ(bf16_at(w.layers[0].bq, i), i / 8.0f);
  }
  EXPECT_NE(m.value()->chat_template.find("<|im_start|>"), std::string::npos);
  EXPECT_EQ(m.value()->tensor_table.size(), 27u);
}

TEST(HfFolder, TinyQwen3ShardedAndTied) {
  LoadOptions o = no_tokenizer();
  o.check_values = true;
  auto m = load_model(data_dir() + "/tiny-qwen3", o);
  ASSERT_TRUE(m) << m.message();
  const ModelConfig& c = m.value()->config;
  EXPECT_EQ(c.arch, Arch::Qwen3);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_TRUE(c.tie_embeddings);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.rope_theta, 1000000.0f);  // from transformers 5 rope_parameters
  EXPECT_GT(m.value()->files.size(), 1u);
  const Weights& w = m.value()->weights;
  EXPECT_EQ(w.output.data, w.token_embd.data);
  EXPECT_EQ(w.layers[1].wq.rows(), 64);
  EXPECT_EQ(w.layers[1].q_norm.numel(), 16);
  // The sharded model cannot be verified against one digest.
  o.verify_sha256 = std::string(64, '0');
  EXPECT_HAS(load_error(data_dir() + "/tiny-qwen3", o), "verify_sha256 needs a single-file model");
}

class HfBad : public ::testing::Test {
 protected:
  std::string load(const TinyHf& m, LoadOptions o = no_tokenizer()) {
    m.write(dir_.path());
    return load_error(dir_.path(), o);
  }
  std::string st() const { return dir_.file("model.safetensors"); }
  TempDir dir_;
};

TEST_F(HfBad, SyntheticModelsLoad) {
  for (const char* arch : {"llama", "mistral", "qwen2", "qwen3"}) {
    TinySpec s;
    s.arch = arch;
    s.tied = std::string(arch) != "llama";
    EXPECT_EQ("", load(tiny_hf(s))) << arch;
  }
}

TEST_F(HfBad, MissingFiles) {
  TinyHf m = tiny_hf({});
  m.write(dir_.path());
  fs::remove(dir_.file("config.json"));
  EXPECT_HAS(load_error(dir_.path()), dir_.file("config.json") + ": cannot open");
  m.write(dir_.path());
  fs::remove(st());
  EXPECT_HAS(load_error(dir_.path()), dir_.path() + ": no model.safetensors or model.safetensors.index.json");
}

TEST_F(HfBad, Truncated) {
  TinyHf m = tiny_hf({});
  m.write(dir_.path());
  auto bytes = read_file(st());
  for (size_t n : {size_t{0}, size_t{7}, size_t{8}, size_t{100}, bytes.size() - 1}) {
    write_file(st(), std::vector<uint8_t>(bytes.begin(), bytes.begin() + static_cast<ptrdiff_t>(n)));
    EXPECT_NE("", load_error(dir_.path())) << n;
  }
  write_file(st(), std::vector<uint8_t>(bytes.begin(), bytes.begin() + 100));
  EXPECT_HAS(load_error(dir_.path()), st() + ": file is truncated or corrupt: header of");
  write_file(st(), std::vector<uint8_t>(bytes.begin(), bytes.end() - 1));
  EXPECT_HAS(load_error(dir_.path()), "data ends at " + std::to_string(bytes.size()) + ", file is " +
                                          std::to_string(bytes.size() - 1) + " bytes");
}

TEST_F(HfBad, BadHeader) {
  TinyHf m = tiny_hf({});
  m.write(dir_.path());
  auto bytes = read_file(st());
  bytes[8] = '[';
  write_file(st(), bytes);
  EXPECT_HAS(load_error(dir_.path()), st() + ": header is not a JSON object");
  auto set_header = [&](const std::string& h) {
    Bytes b;
    b.put<uint64_t>(h.size());
    b.b.insert(b.b.end(), h.begin(), h.end());
    write_file(st(), b.b);
    return load_error(dir_.path());
  };
  EXPECT_HAS(set_header("{\"a\": 5}"), "tensor a: header entry is not an object");
  EXPECT_HAS(set_header("{\"a\": {\"shape\": [], \"data_offsets\": [0, 0]}}"), "tensor a: missing dtype");
  EXPECT_HAS(set_header("{\"a\": {\"dtype\": \"F32\", \"data_offsets\": [0, 0]}}"), "tensor a: missing shape");
  EXPECT_HAS(set_header("{\"a\": {\"dtype\": \"F32\", \"shape\": [], \"data_offsets\": [0]}}"),
             "data_offsets must be two unsigned integers");
  EXPECT_HAS(set_header("{\"a\": {\"dtype\": \"F32\", \"shape\": [-1], \"data_offsets\": [0, 0]}}"),
             "shape entries must be unsigned integers");
  EXPECT_HAS(set_header("{\"a\": {\"dtype\": \"F32\", \"shape\": [1,1,1,1,1], \"data_offsets\": [0, 4]}}"),
             "5 dimensions (at most 4)");
  EXPECT_HAS(set_header("{\"a\": {\"dtype\": \"F32\", \"shape\": [4294967296, 4294967296], \"data_offsets\": [0, 4]}}"),
             "shape is too large");
  EXPECT_HAS(set_header("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 0]}}"),
             "data_offsets end before they begin");
}

TEST_F(HfBad, OffsetsOutOfBoundsOrWrongSize) {
  TinyHf m = tiny_hf({});
  m.find("model.norm.weight")->offsets = std::pair<uint64_t, uint64_t>{uint64_t{1} << 40, (uint64_t{1} << 40) + 128};
  EXPECT_HAS(load(m), st() + ": tensor model.norm.weight: data ends at ");
  m = tiny_hf({});
  m.find("model.norm.weight")->offsets = std::pair<uint64_t, uint64_t>{~uint64_t{0} - 227, ~uint64_t{0} - 99};
  EXPECT_HAS(load(m), "tensor model.norm.weight: data ends at beyond 2^64");
  m = tiny_hf({});
  m.find("model.norm.weight")->offsets = std::pair<uint64_t, uint64_t>{0, 100};
  EXPECT_HAS(load(m), "tensor model.norm.weight: data_offsets span 100 bytes, shape and dtype need 64 x 2");
}

TEST_F(HfBad, Misaligned) {
  TinyHf m = tiny_hf({});
  m.find("model.norm.weight")->offsets = std::pair<uint64_t, uint64_t>{1, 129};
  EXPECT_HAS(load(m), "tensor model.norm.weight: data at file offset");
  EXPECT_HAS(load(m), "is misaligned for BF16");
}

TEST_F(HfBad, UnsupportedDtype) {
  TinyHf m = tiny_hf({});
  m.find("model.norm.weight")->dtype = "I16";
  EXPECT_HAS(load(m), "tensor model.norm.weight: unsupported dtype I16 (supported: BF16, F16, F32)");
}

TEST_F(HfBad, MissingAndUnexpectedTensors) {
  TinyHf m = tiny_hf({});
  m.drop("model.layers.1.mlp.up_proj.weight");
  EXPECT_EQ(load(m), dir_.path() + ": missing tensor model.layers.1.mlp.up_proj.weight");
  TinySpec s;
  s.arch = "qwen2";
  m = tiny_hf(s);
  m.drop("model.layers.0.self_attn.k_proj.bias");
  EXPECT_EQ(load(m), dir_.path() + ": missing tensor model.layers.0.self_attn.k_proj.bias");
  m = tiny_hf({});
  m.tensors.push_back({"model.vision.proj", "F32", {4}, std::vector<uint8_t>(16), std::nullopt});
  EXPECT_EQ(load(m), st() + ": unexpected tensor model.vision.proj");
  m = tiny_hf({});
  m.tensors.push_back({"model.layers.7.input_layernorm.weight", "F32", {64}, std::vector<uint8_t>(256), std::nullopt});
  EXPECT_HAS(load(m), "unexpected tensor model.layers.7.input_layernorm.weight (not part of a llama model with 2 layers)");
  m = tiny_hf({});
  m.tensors.push_back({"model.layers.0.self_attn.rotary_emb.inv_freq", "F32", {8}, std::vector<uint8_t>(32), std::nullopt});
  EXPECT_EQ(load(m), "");  // old checkpoints carry it; it is ignored
}

TEST_F(HfBad, ShapeDisagreesWithConfig) {
  TinySpec s;
  s.tied = false;
  TinyHf m = tiny_hf(s);
  auto* lm = m.find("lm_head.weight");
  lm->shape = {64, 63};
  lm->data.resize(64 * 63 * 2);
  EXPECT_EQ(load(m), st() + ": tensor lm_head.weight: shape [64, 63] does not match the config, which needs [64, 64]");
  m = tiny_hf(s);
  size_t pos = m.config_json.find("\"hidden_size\":64");
  m.config_json.replace(pos, 16, "\"hidden_size\":48");
  EXPECT_HAS(load(m), "tensor model.embed_tokens.weight: shape [64, 64] does not match the config, which needs [64, 48]");
}

TEST_F(HfBad, NanInWeights) {
  TinyHf m = tiny_hf({});
  const uint16_t nan = 0x7FC0, inf = 0x7F80;
  std::memcpy(m.find("model.layers.0.mlp.gate_proj.weight")->data.data() + 2 * (64 * 5 + 9), &nan, 2);
  EXPECT_EQ(load(m), "");
  LoadOptions o = no_tokenizer();
  o.check_values = true;
  EXPECT_EQ(load(m, o), st() + ": tensor model.layers.0.mlp.gate_proj.weight: NaN at row 5, column 9");
  m = tiny_hf({});
  std::memcpy(m.find("model.norm.weight")->data.data() + 2 * 63, &inf, 2);
  EXPECT_EQ(load(m, o), st() + ": tensor model.norm.weight: Inf at row 0, column 63");
}

TEST_F(HfBad, Sha256) {
  TinyHf m = tiny_hf({});
  m.write(dir_.path());
  LoadOptions o = no_tokenizer();
  o.verify_sha256 = std::string(64, 'a');
  EXPECT_HAS(load_error(dir_.path(), o), st() + ": sha256 mismatch: expected " + std::string(64, 'a') + ", got ");
}

TEST_F(HfBad, ShardIndex) {
  TinyHf m = tiny_hf({});
  write_text(dir_.file("config.json"), m.config_json);
  std::vector<StEntry> a(m.tensors.begin(), m.tensors.begin() + 5), b(m.tensors.begin() + 5, m.tensors.end());
  write_file(dir_.file("a.safetensors"), make_safetensors(a));
  write_file(dir_.file("b.safetensors"), make_safetensors(b));
  auto write_index = [&](const std::vector<StEntry>& in_a, const std::vector<StEntry>& in_b, const std::string& extra) {
    std::string j = "{\"metadata\":{},\"weight_map\":{";
    std::string sep;
    for (const auto& e : in_a) {
      j += sep + "\"" + e.name + "\":\"a.safetensors\"";
      sep = ",";
    }
    for (const auto& e : in_b) j += ",\"" + e.name + "\":\"b.safetensors\"";
    j += extra + "}}";
    write_text(dir_.file("model.safetensors.index.json"), j);
  };
  write_index(a, b, "");
  EXPECT_EQ("", load_error(dir_.path()));
  write_index(a, b, ",\"model.extra\":\"b.safetensors\"");
  EXPECT_EQ(load_error(dir_.path()), dir_.path() + ": tensor model.extra is listed in the index but not in b.safetensors");
  write_index(b, a, "");
  EXPECT_HAS(load_error(dir_.path()), "is listed in the index under b.safetensors");
  write_index(a, b, ",\"x\":\"../../etc/passwd\"");
  EXPECT_HAS(load_error(dir_.path()), "model.safetensors.index.json: weight_map entry x names \"../../etc/passwd\", not a file in the folder");
  write_index(a, b, ",\"y\":\"c.safetensors\"");
  EXPECT_HAS(load_error(dir_.path()), dir_.file("c.safetensors") + ": cannot open");
  write_text(dir_.file("model.safetensors.index.json"), "{\"weight_map\": 3}");
  EXPECT_HAS(load_error(dir_.path()), "model.safetensors.index.json: missing weight_map");
  // The same tensor in two shards.
  write_file(dir_.file("b.safetensors"), make_safetensors(m.tensors));
  write_index(a, std::vector<StEntry>(m.tensors.begin() + 5, m.tensors.end()), "");
  EXPECT_HAS(load_error(dir_.path()), "is also in a.safetensors");
}

TEST_F(HfBad, ChatTemplateSources) {
  TinyHf m = tiny_hf({});
  m.write(dir_.path());
  write_text(dir_.file("chat_template.jinja"), "JINJA");
  auto r = load_model(dir_.path(), no_tokenizer());
  ASSERT_TRUE(r);
  EXPECT_EQ(r.value()->chat_template, "JINJA");
  write_text(dir_.file("tokenizer_config.json"), "{\"chat_template\": [{\"name\": \"tool\", \"template\": \"T\"}, "
                                                  "{\"name\": \"default\", \"template\": \"D\"}]}");
  r = load_model(dir_.path(), no_tokenizer());
  ASSERT_TRUE(r);
  EXPECT_EQ(r.value()->chat_template, "D");
  write_text(dir_.file("tokenizer_config.json"), "{oops");
  EXPECT_HAS(load_error(dir_.path()), "tokenizer_config.json: not a JSON object");
}

// ---- config.json ---------------------------------------------------------------------------------

Expected<ModelConfig> cfg(const std::string& json) { return config_from_hf_json(json, "config.json"); }

TEST(HfConfig, Parses) {
  auto c = cfg(R"({"model_type":"llama","hidden_size":2048,"num_hidden_layers":16,"num_attention_heads":32,
    "num_key_value_heads":8,"intermediate_size":8192,"vocab_size":128256,"max_position_embeddings":131072,
    "rms_norm_eps":1e-05,"rope_theta":500000.0,"tie_word_embeddings":true,
    "rope_scaling":{"factor":32.0,"high_freq_factor":4.0,"low_freq_factor":1.0,
    "original_max_position_embeddings":8192,"rope_type":"llama3"}})");
  ASSERT_TRUE(c) << c.message();
  EXPECT_EQ(c->arch, Arch::Llama);
  EXPECT_EQ(c->rope_style, RopeStyle::HalfSplit);
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_EQ(c->n_kv_heads, 8);
  EXPECT_TRUE(c->tie_embeddings);
  EXPECT_EQ(c->rope_theta, 500000.0f);
  EXPECT_EQ(c->rope_scaling.kind, RopeScaling::Kind::Llama3);
  EXPECT_EQ(c->rope_scaling.factor, 32.0f);
  EXPECT_EQ(c->rope_scaling.original_max_position, 8192);
  EXPECT_TRUE(check_config(*c, "config.json"));

  c = cfg(R"({"model_type":"qwen3","hidden_size":1024,"num_hidden_layers":28,"num_attention_heads":16,
    "num_key_value_heads":8,"head_dim":128,"intermediate_size":3072,"vocab_size":151936,
    "rope_parameters":{"rope_theta":1000000,"rope_type":"default"},"rope_scaling":null})");
  ASSERT_TRUE(c) << c.message();
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->rope_theta, 1000000.0f);
  EXPECT_TRUE(c->qk_norm);
  EXPECT_EQ(c->rope_scaling.kind, RopeScaling::Kind::None);
  EXPECT_EQ(c->max_context, 2048);  // default

  c = cfg(R"({"model_type":"mistral","hidden_size":64,"num_hidden_layers":1,"num_attention_heads":4,
    "head_dim":null,"intermediate_size":64,"vocab_size":10,"rope_scaling":{"type":"linear","factor":2}})");
  ASSERT_TRUE(c) << c.message();
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_EQ(c->n_kv_heads, 4);
  EXPECT_EQ(c->rope_scaling.kind, RopeScaling::Kind::Linear);
}

TEST(HfConfig, Errors) {
  EXPECT_HAS(cfg("nope").message(), "config.json: not a JSON object");
  EXPECT_HAS(cfg("{}").message(), "config.json: missing model_type");
  EXPECT_HAS(cfg(R"({"model_type":"gpt2"})").message(), "unsupported model_type 'gpt2'");
  EXPECT_HAS(cfg(R"({"model_type":"llama"})").message(), "config.json: missing num_hidden_layers");
  const std::string base = R"({"model_type":"llama","hidden_size":64,"num_hidden_layers":1,"num_attention_heads":4,
    "intermediate_size":64,"vocab_size":10)";
  EXPECT_HAS(cfg(base + R"(,"rope_scaling":{"rope_type":"yarn"}})").message(), "rope scaling 'yarn' is not supported");
  EXPECT_HAS(cfg(base + R"(,"attention_bias":true})").message(), "attention_bias / mlp_bias are not supported");
  EXPECT_HAS(cfg(base + R"(,"rms_norm_eps":"x"})").message(), "rms_norm_eps must be a number");
  EXPECT_HAS(cfg(base + R"(,"num_key_value_heads":-2})").message(), "num_key_value_heads = -2 is out of range");
  EXPECT_HAS(cfg(base + R"(,"tie_word_embeddings":1})").message(), "tie_word_embeddings must be true or false");
  EXPECT_HAS(cfg(R"({"model_type":"llama","num_hidden_layers":1,"hidden_size":1e3})").message(),
             "hidden_size must be an integer");
}

TEST(SafetensorsParse, InMemory) {
  const auto bytes = make_safetensors({{"w", "F16", {2, 3}, std::vector<uint8_t>(12), std::nullopt},
                                       {"s", "F32", {}, std::vector<uint8_t>(4), std::nullopt}});
  auto f = st::parse(bytes.data(), bytes.size(), "x.safetensors");
  ASSERT_TRUE(f) << f.message();
  ASSERT_EQ(f->tensors.size(), 2u);
  EXPECT_EQ(f->tensors[0].name, "s");  // sorted by name
  EXPECT_EQ(f->tensors[0].n_dims, 0);
  EXPECT_EQ(f->tensors[1].ne[0], 3);
  EXPECT_EQ(f->tensors[1].ne[1], 2);
  EXPECT_EQ(f->tensors[1].nbytes, 12u);
}

}  // namespace
}  // namespace ss::model

namespace ss::model {
namespace {

TEST(HfFolder, TokenizerLoadsOrReportsItsError) {
  auto m = load_model(test::data_dir() + "/tiny-qwen2");
  if (!m) {
    EXPECT_HAS(m.message(), "tokenizer");
    return;
  }
  ASSERT_NE(m.value()->tokenizer, nullptr);
  EXPECT_EQ(m.value()->tokenizer->vocab_size(), 300);
}

}  // namespace
}  // namespace ss::model
