// Helpers for the model tests: a GGUF writer and a safetensors writer that can also write the
// broken files the loader must reject, tiny synthetic models, temp dirs.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "model/model.h"
#include "model/quant.h"
#include "tokenizer/tokenizer.h"

// Substring check that prints the whole message on failure.
#define EXPECT_HAS(str, sub)                                                   \
  do {                                                                         \
    const std::string ss_has_s_ = (str);                                       \
    EXPECT_NE(ss_has_s_.find(sub), std::string::npos)                          \
        << "message: \"" << ss_has_s_ << "\"\nexpected to contain: \"" << (sub) << "\""; \
  } while (0)

namespace ss::model::test {

namespace fs = std::filesystem;

inline std::string source_dir() { return SS_SOURCE_DIR; }
inline std::string data_dir() { return source_dir() + "/tests/data"; }

// $SELFSERVE_HOME/models, default ~/.cache/selfserve/models.
inline std::string models_dir() {
  if (const char* h = std::getenv("SELFSERVE_HOME"); h && *h) return std::string(h) + "/models";
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "") + "/.cache/selfserve/models";
}

inline void write_file(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}
inline void write_text(const std::string& path, const std::string& s) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << s;
}
inline std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// A fresh directory removed at destruction.
class TempDir {
 public:
  TempDir() {
    static int counter = 0;
    path_ = (fs::temp_directory_path() /
             ("ss_model_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++)))
                .string();
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// ---- bytes -----------------------------------------------------------------------------------

struct Bytes {
  std::vector<uint8_t> b;
  template <class T>
  void put(T v) {
    const size_t n = b.size();
    b.resize(n + sizeof(T));
    std::memcpy(b.data() + n, &v, sizeof(T));
  }
  void str(const std::string& s) {
    put<uint64_t>(s.size());
    b.insert(b.end(), s.begin(), s.end());
  }
  void pad_to(uint64_t align) {
    while (b.size() % align) b.push_back(0);
  }
};

// Random, finite tensor data of a type: floats in [-0.1, 0.1]; quantized blocks with random
// quants and a small fp16 scale in every scale field.
inline std::vector<uint8_t> random_tensor_bytes(DType t, int64_t numel, std::mt19937& rng) {
  const DTypeInfo& in = info(t);
  const size_t nbytes = static_cast<size_t>(numel / in.block_size) * static_cast<size_t>(in.block_bytes);
  std::vector<uint8_t> out(nbytes);
  std::uniform_real_distribution<float> u(-0.1f, 0.1f);
  if (t == DType::F32) {
    for (int64_t i = 0; i < numel; ++i) {
      float v = u(rng);
      std::memcpy(out.data() + 4 * i, &v, 4);
    }
    return out;
  }
  if (t == DType::F16 || t == DType::BF16) {
    for (int64_t i = 0; i < numel; ++i) {
      uint16_t h = t == DType::F16 ? fp32_to_fp16(u(rng)) : fp32_to_bf16(u(rng));
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
    return out;
  }
  for (auto& x : out) x = static_cast<uint8_t>(rng());
  const half_bits scale = fp32_to_fp16(0.01f);
  std::vector<size_t> scale_offsets;
  switch (t) {
    case DType::Q4_0: case DType::Q5_0: case DType::Q8_0: scale_offsets = {0}; break;
    case DType::IQ4_NL: case DType::IQ4_XS: scale_offsets = {0}; break;
    case DType::Q4_1: case DType::Q5_1: case DType::Q4_K: case DType::Q5_K: scale_offsets = {0, 2}; break;
    case DType::Q6_K: scale_offsets = {208}; break;
    case DType::Q3_K: scale_offsets = {108}; break;
    case DType::Q2_K: scale_offsets = {80, 82}; break;
    default: break;
  }
  for (size_t blk = 0; blk < nbytes / static_cast<size_t>(in.block_bytes); ++blk)
    for (size_t off : scale_offsets) std::memcpy(out.data() + blk * static_cast<size_t>(in.block_bytes) + off, &scale, 2);
  return out;
}

// ---- GGUF ------------------------------------------------------------------------------------

class GgufBuilder {
 public:
  uint32_t magic = 0x46554747;
  uint32_t version = 3;
  uint64_t alignment = 32;

  struct KV {
    std::string key;
    uint32_t type;
    std::vector<uint8_t> payload;
  };
  struct T {
    std::string name;
    uint32_t type;
    std::vector<int64_t> ne;
    std::vector<uint8_t> data;
    std::optional<uint64_t> offset;  // override the computed (relative) offset
  };
  std::vector<KV> kvs;
  std::vector<T> tensors;

  void raw(const std::string& key, uint32_t type, std::vector<uint8_t> payload) {
    remove(key);
    kvs.push_back({key, type, std::move(payload)});
  }
  void u32(const std::string& key, uint32_t v) { raw(key, 4, pod(v)); }
  void i32(const std::string& key, int32_t v) { raw(key, 5, pod(v)); }
  void u64(const std::string& key, uint64_t v) { raw(key, 10, pod(v)); }
  void f32(const std::string& key, float v) { raw(key, 6, pod(v)); }
  void boolean(const std::string& key, bool v) { raw(key, 7, {static_cast<uint8_t>(v)}); }
  void str(const std::string& key, const std::string& v) {
    Bytes b;
    b.str(v);
    raw(key, 8, b.b);
  }
  void strings(const std::string& key, const std::vector<std::string>& v) {
    Bytes b;
    b.put<uint32_t>(8);
    b.put<uint64_t>(v.size());
    for (const auto& s : v) b.str(s);
    raw(key, 9, b.b);
  }
  void f32s(const std::string& key, const std::vector<float>& v) {
    Bytes b;
    b.put<uint32_t>(6);
    b.put<uint64_t>(v.size());
    for (float x : v) b.put(x);
    raw(key, 9, b.b);
  }
  void i32s(const std::string& key, const std::vector<int32_t>& v) {
    Bytes b;
    b.put<uint32_t>(5);
    b.put<uint64_t>(v.size());
    for (int32_t x : v) b.put(x);
    raw(key, 9, b.b);
  }
  void remove(const std::string& key) {
    std::erase_if(kvs, [&](const KV& kv) { return kv.key == key; });
  }

  void tensor(const std::string& name, DType type, std::vector<int64_t> ne, std::vector<uint8_t> data) {
    tensors.push_back({name, static_cast<uint32_t>(type), std::move(ne), std::move(data), std::nullopt});
  }
  T* find(const std::string& name) {
    for (auto& t : tensors)
      if (t.name == name) return &t;
    return nullptr;
  }
  void drop(const std::string& name) {
    std::erase_if(tensors, [&](const T& t) { return t.name == name; });
  }

  std::vector<uint8_t> build() const {
    Bytes b;
    b.put(magic);
    b.put(version);
    b.put<uint64_t>(tensors.size());
    b.put<uint64_t>(kvs.size());
    for (const auto& kv : kvs) {
      b.str(kv.key);
      b.put(kv.type);
      b.b.insert(b.b.end(), kv.payload.begin(), kv.payload.end());
    }
    uint64_t off = 0;
    std::vector<uint64_t> offsets;
    for (const auto& t : tensors) {
      b.str(t.name);
      b.put<uint32_t>(static_cast<uint32_t>(t.ne.size()));
      for (int64_t n : t.ne) b.put<uint64_t>(static_cast<uint64_t>(n));
      b.put(t.type);
      b.put<uint64_t>(t.offset.value_or(off));
      offsets.push_back(off);
      off += (t.data.size() + alignment - 1) / alignment * alignment;
    }
    b.pad_to(alignment);
    for (const auto& t : tensors) {
      b.b.insert(b.b.end(), t.data.begin(), t.data.end());
      b.pad_to(alignment);
    }
    return b.b;
  }

 private:
  template <class V>
  static std::vector<uint8_t> pod(V v) {
    std::vector<uint8_t> out(sizeof(V));
    std::memcpy(out.data(), &v, sizeof(V));
    return out;
  }
};

struct TinySpec {
  std::string arch = "llama";
  int hidden = 64, layers = 2, heads = 4, kv_heads = 2, ffn = 128, vocab = 64;
  int head_dim = 0;  // 0: hidden / heads
  bool tied = true;
  bool tokenizer = true;
  DType wtype = DType::Q8_0;
  uint32_t seed = 7;
};

// A valid tiny GGUF model of spec.arch ("llama", "qwen2", "qwen3").
inline GgufBuilder tiny_gguf(const TinySpec& s) {
  std::mt19937 rng(s.seed);
  const int hd = s.head_dim ? s.head_dim : s.hidden / s.heads;
  const int64_t q = int64_t{s.heads} * hd, kv = int64_t{s.kv_heads} * hd;
  GgufBuilder g;
  const std::string p = s.arch + ".";
  g.str("general.architecture", s.arch);
  g.str("general.name", "tiny-" + s.arch);
  g.u32(p + "block_count", static_cast<uint32_t>(s.layers));
  g.u32(p + "context_length", 512);
  g.u32(p + "embedding_length", static_cast<uint32_t>(s.hidden));
  g.u32(p + "feed_forward_length", static_cast<uint32_t>(s.ffn));
  g.u32(p + "attention.head_count", static_cast<uint32_t>(s.heads));
  g.u32(p + "attention.head_count_kv", static_cast<uint32_t>(s.kv_heads));
  if (s.head_dim) g.u32(p + "attention.key_length", static_cast<uint32_t>(hd));
  g.f32(p + "rope.freq_base", 10000.0f);
  g.f32(p + "attention.layer_norm_rms_epsilon", 1e-6f);
  if (s.tokenizer) {
    std::vector<std::string> toks;
    for (int i = 0; i < s.vocab; ++i) toks.push_back(std::string("t") + std::to_string(i));
    g.str("tokenizer.ggml.model", "gpt2");
    g.strings("tokenizer.ggml.tokens", toks);
    g.i32s("tokenizer.ggml.token_type", std::vector<int32_t>(static_cast<size_t>(s.vocab), 1));
    g.strings("tokenizer.ggml.merges", {"t 1", "t 2"});
    g.u32("tokenizer.ggml.bos_token_id", 1);
    g.u32("tokenizer.ggml.eos_token_id", 2);
    g.str("tokenizer.chat_template", "{{ messages }}");
  } else {
    g.u32(p + "vocab_size", static_cast<uint32_t>(s.vocab));
  }
  auto mat = [&](const std::string& name, int64_t cols, int64_t rows, DType t) {
    g.tensor(name, t, {cols, rows}, random_tensor_bytes(t, cols * rows, rng));
  };
  auto vec = [&](const std::string& name, int64_t n) {
    g.tensor(name, DType::F32, {n}, random_tensor_bytes(DType::F32, n, rng));
  };
  mat("token_embd.weight", s.hidden, s.vocab, s.wtype);
  vec("output_norm.weight", s.hidden);
  if (!s.tied) mat("output.weight", s.hidden, s.vocab, s.wtype);
  for (int i = 0; i < s.layers; ++i) {
    const std::string b = "blk." + std::to_string(i) + ".";
    vec(b + "attn_norm.weight", s.hidden);
    mat(b + "attn_q.weight", s.hidden, q, s.wtype);
    mat(b + "attn_k.weight", s.hidden, kv, s.wtype);
    mat(b + "attn_v.weight", s.hidden, kv, s.wtype);
    mat(b + "attn_output.weight", q, s.hidden, s.wtype);
    if (s.arch == "qwen2") {
      vec(b + "attn_q.bias", q);
      vec(b + "attn_k.bias", kv);
      vec(b + "attn_v.bias", kv);
    }
    if (s.arch == "qwen3") {
      vec(b + "attn_q_norm.weight", hd);
      vec(b + "attn_k_norm.weight", hd);
    }
    vec(b + "ffn_norm.weight", s.hidden);
    mat(b + "ffn_gate.weight", s.hidden, s.ffn, s.wtype);
    mat(b + "ffn_up.weight", s.hidden, s.ffn, s.wtype);
    mat(b + "ffn_down.weight", s.ffn, s.hidden, s.wtype);
  }
  return g;
}

// ---- safetensors -----------------------------------------------------------------------------

struct StEntry {
  std::string name;
  std::string dtype;            // "BF16", "F32", ...
  std::vector<int64_t> shape;   // Hugging Face order
  std::vector<uint8_t> data;
  std::optional<std::pair<uint64_t, uint64_t>> offsets;  // override data_offsets
};

inline std::vector<uint8_t> make_safetensors(const std::vector<StEntry>& entries) {
  std::string header = "{\"__metadata__\":{\"format\":\"pt\"}";
  std::vector<uint8_t> data;
  for (const auto& e : entries) {
    uint64_t begin = data.size();
    data.insert(data.end(), e.data.begin(), e.data.end());
    uint64_t end = data.size();
    if (e.offsets) std::tie(begin, end) = *e.offsets;
    header += ",\"" + e.name + "\":{\"dtype\":\"" + e.dtype + "\",\"shape\":[";
    for (size_t i = 0; i < e.shape.size(); ++i) {
      if (i) header += ",";
      header += std::to_string(e.shape[i]);
    }
    header += "],\"data_offsets\":[" + std::to_string(begin) + "," + std::to_string(end) + "]}";
  }
  header += "}";
  while (header.size() % 8) header += ' ';
  Bytes b;
  b.put<uint64_t>(header.size());
  b.b.insert(b.b.end(), header.begin(), header.end());
  b.b.insert(b.b.end(), data.begin(), data.end());
  return b.b;
}

struct TinyHf {
  std::string config_json;
  std::vector<StEntry> tensors;

  StEntry* find(const std::string& name) {
    for (auto& t : tensors)
      if (t.name == name) return &t;
    return nullptr;
  }
  void drop(const std::string& name) {
    std::erase_if(tensors, [&](const StEntry& t) { return t.name == name; });
  }
  // Writes config.json and model.safetensors into dir.
  void write(const std::string& dir) const {
    write_text(dir + "/config.json", config_json);
    write_file(dir + "/model.safetensors", make_safetensors(tensors));
  }
};

// A valid tiny Hugging Face model (model_type spec.arch), BF16, with config.json.
inline TinyHf tiny_hf(const TinySpec& s) {
  std::mt19937 rng(s.seed);
  const int hd = s.head_dim ? s.head_dim : s.hidden / s.heads;
  const int64_t q = int64_t{s.heads} * hd, kv = int64_t{s.kv_heads} * hd;
  TinyHf m;
  m.config_json = "{\"model_type\":\"" + s.arch + "\",\"hidden_size\":" + std::to_string(s.hidden) +
                  ",\"num_hidden_layers\":" + std::to_string(s.layers) +
                  ",\"num_attention_heads\":" + std::to_string(s.heads) +
                  ",\"num_key_value_heads\":" + std::to_string(s.kv_heads) +
                  ",\"intermediate_size\":" + std::to_string(s.ffn) + ",\"vocab_size\":" + std::to_string(s.vocab) +
                  ",\"max_position_embeddings\":512,\"rms_norm_eps\":1e-6,\"rope_theta\":1000000.0" +
                  (s.head_dim ? ",\"head_dim\":" + std::to_string(s.head_dim) : std::string()) +
                  ",\"tie_word_embeddings\":" + (s.tied ? "true" : "false") + "}";
  auto add = [&](const std::string& name, std::vector<int64_t> shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    m.tensors.push_back({name, "BF16", std::move(shape), random_tensor_bytes(DType::BF16, n, rng), std::nullopt});
  };
  add("model.embed_tokens.weight", {s.vocab, s.hidden});
  add("model.norm.weight", {s.hidden});
  if (!s.tied) add("lm_head.weight", {s.vocab, s.hidden});
  for (int i = 0; i < s.layers; ++i) {
    const std::string b = "model.layers." + std::to_string(i) + ".";
    add(b + "input_layernorm.weight", {s.hidden});
    add(b + "self_attn.q_proj.weight", {q, s.hidden});
    add(b + "self_attn.k_proj.weight", {kv, s.hidden});
    add(b + "self_attn.v_proj.weight", {kv, s.hidden});
    add(b + "self_attn.o_proj.weight", {s.hidden, q});
    if (s.arch == "qwen2") {
      add(b + "self_attn.q_proj.bias", {q});
      add(b + "self_attn.k_proj.bias", {kv});
      add(b + "self_attn.v_proj.bias", {kv});
    }
    if (s.arch == "qwen3") {
      add(b + "self_attn.q_norm.weight", {hd});
      add(b + "self_attn.k_norm.weight", {hd});
    }
    add(b + "post_attention_layernorm.weight", {s.hidden});
    add(b + "mlp.gate_proj.weight", {s.ffn, s.hidden});
    add(b + "mlp.up_proj.weight", {s.ffn, s.hidden});
    add(b + "mlp.down_proj.weight", {s.hidden, s.ffn});
  }
  return m;
}

inline LoadOptions no_tokenizer() {
  LoadOptions o;
  o.load_tokenizer = false;
  return o;
}

// Loads and returns the error message ("" on success).
inline std::string load_error(const std::string& path, LoadOptions opts = no_tokenizer()) {
  auto r = load_model(path, opts);
  return r ? std::string() : r.message();
}

}  // namespace ss::model::test
