#include "model/model_config.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <numbers>
#include <nlohmann/json.hpp>
#include <vector>

namespace ss::model {

namespace {

using nlohmann::json;

// Narrows an int64 read from a file to int, rejecting what cannot be a real hyper-parameter.
Expected<int> narrow(const std::string& name, const std::string& key, int64_t v) {
  if (v < 0 || v > std::numeric_limits<int>::max())
    return make_error(name + ": " + key + " = " + std::to_string(v) + " is out of range");
  return static_cast<int>(v);
}

void set_arch_traits(ModelConfig& c) {
  c.qkv_bias = c.arch == Arch::Qwen2;
  c.qk_norm = c.arch == Arch::Qwen3;
}

// --- GGUF ---------------------------------------------------------------------------------------

Expected<ModelConfig> from_gguf(const gguf::File& f) {
  ModelConfig c;
  SS_ASSIGN(std::string arch, f.get_string("general.architecture"));
  if (arch == "llama") {
    c.arch = Arch::Llama;
    c.rope_style = RopeStyle::Interleaved;  // the converter permuted Q/K rows
  } else if (arch == "qwen2") {
    c.arch = Arch::Qwen2;
    c.rope_style = RopeStyle::HalfSplit;
  } else if (arch == "qwen3") {
    c.arch = Arch::Qwen3;
    c.rope_style = RopeStyle::HalfSplit;
  } else {
    return make_error(f.name + ": unsupported architecture '" + arch + "' (supported: llama, qwen2, qwen3)");
  }
  set_arch_traits(c);
  SS_ASSIGN(c.name, f.get_string("general.name", ""));
  const std::string p = arch + ".";
  auto get = [&](const std::string& key, std::optional<int64_t> dflt, int* out) -> Status {
    SS_ASSIGN(int64_t v, f.get_int(key, dflt));
    SS_ASSIGN(*out, narrow(f.name, key, v));
    return {};
  };
  SS_TRY(get(p + "block_count", {}, &c.n_layers));
  SS_TRY(get(p + "embedding_length", {}, &c.hidden_size));
  SS_TRY(get(p + "feed_forward_length", {}, &c.intermediate_size));
  SS_TRY(get(p + "attention.head_count", {}, &c.n_heads));
  SS_TRY(get(p + "attention.head_count_kv", c.n_heads, &c.n_kv_heads));
  SS_TRY(get(p + "attention.key_length", c.n_heads > 0 ? c.hidden_size / c.n_heads : 0, &c.head_dim));
  int value_length = 0;
  SS_TRY(get(p + "attention.value_length", c.head_dim, &value_length));
  if (value_length != c.head_dim)
    return make_error(f.name + ": " + p + "attention.value_length " + std::to_string(value_length) +
                      " differs from key_length " + std::to_string(c.head_dim) + " (not supported)");
  SS_TRY(get(p + "context_length", {}, &c.max_context));
  SS_TRY(get(p + "rope.dimension_count", c.head_dim, &c.rope_dim));
  SS_ASSIGN(double eps, f.get_float(p + "attention.layer_norm_rms_epsilon"));
  SS_ASSIGN(double theta, f.get_float(p + "rope.freq_base", 10000.0));
  c.rms_norm_eps = static_cast<float>(eps);
  c.rope_theta = static_cast<float>(theta);

  SS_ASSIGN(std::string scaling, f.get_string(p + "rope.scaling.type", "none"));
  SS_ASSIGN(double linear, f.get_float(p + "rope.scale_linear", 1.0));  // older converters
  if (scaling == "linear" || (scaling == "none" && linear != 1.0)) {
    c.rope_scaling.kind = RopeScaling::Kind::Linear;
    SS_ASSIGN(double factor, f.get_float(p + "rope.scaling.factor", linear));
    c.rope_scaling.factor = static_cast<float>(factor);
  } else if (scaling != "none") {
    return make_error(f.name + ": rope scaling '" + scaling + "' is not supported (supported: none, linear, llama3)");
  }
  SS_ASSIGN(int64_t orig, f.get_int(p + "rope.scaling.original_context_length", 8192));
  SS_ASSIGN(c.rope_scaling.original_max_position, narrow(f.name, p + "rope.scaling.original_context_length", orig));

  // The vocabulary is the token list; the embedding must have a row per token.
  const gguf::Value* tokens = f.find("tokenizer.ggml.tokens");
  if (tokens && tokens->type == gguf::ValueType::Array && tokens->elem == gguf::ValueType::String) {
    SS_ASSIGN(c.vocab_size, narrow(f.name, "tokenizer.ggml.tokens length", static_cast<int64_t>(tokens->count)));
  } else if (tokens) {
    return make_error(f.name + ": metadata tokenizer.ggml.tokens: expected an array of strings");
  } else {
    SS_TRY(get(p + "vocab_size", {}, &c.vocab_size));
  }
  return c;
}

// --- config.json --------------------------------------------------------------------------------

struct JsonReader {
  const json& j;
  const std::string& name;

  const json* find(const char* key) const {
    auto it = j.find(key);
    return it == j.end() || it->is_null() ? nullptr : &*it;
  }
  Status get_int(const char* key, std::optional<int> dflt, int* out) const {
    const json* v = find(key);
    if (!v) {
      if (!dflt) return make_error(name + ": missing " + key);
      *out = *dflt;
      return {};
    }
    if (!v->is_number_integer()) return make_error(name + ": " + key + " must be an integer");
    if (v->is_number_unsigned()) {
      const uint64_t u = v->get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<int>::max()))
        return make_error(name + ": " + key + " = " + std::to_string(u) + " is out of range");
      *out = static_cast<int>(u);
      return {};
    }
    SS_ASSIGN(*out, narrow(name, key, v->get<int64_t>()));
    return {};
  }
  Status get_float(const char* key, double dflt, float* out) const {
    const json* v = find(key);
    if (!v) {
      *out = static_cast<float>(dflt);
      return {};
    }
    if (!v->is_number()) return make_error(name + ": " + key + " must be a number");
    *out = v->get<float>();
    return {};
  }
  Status get_bool(const char* key, bool dflt, bool* out) const {
    const json* v = find(key);
    if (!v) {
      *out = dflt;
      return {};
    }
    if (!v->is_boolean()) return make_error(name + ": " + key + " must be true or false");
    *out = v->get<bool>();
    return {};
  }
};

Status rope_scaling_from_json(const json& rs, const std::string& name, ModelConfig& c) {
  if (!rs.is_object()) return make_error(name + ": rope_scaling must be an object");
  std::string type = "default";
  for (const char* k : {"rope_type", "type"}) {
    auto it = rs.find(k);
    if (it != rs.end() && it->is_string()) {
      type = it->get<std::string>();
      break;
    }
  }
  JsonReader r{rs, name};
  if (type == "default") return {};
  if (type == "linear") {
    c.rope_scaling.kind = RopeScaling::Kind::Linear;
    return r.get_float("factor", 1.0, &c.rope_scaling.factor);
  }
  if (type == "llama3") {
    c.rope_scaling.kind = RopeScaling::Kind::Llama3;
    SS_TRY(r.get_float("factor", 8.0, &c.rope_scaling.factor));
    SS_TRY(r.get_float("low_freq_factor", 1.0, &c.rope_scaling.low_freq_factor));
    SS_TRY(r.get_float("high_freq_factor", 4.0, &c.rope_scaling.high_freq_factor));
    return r.get_int("original_max_position_embeddings", 8192, &c.rope_scaling.original_max_position);
  }
  return make_error(name + ": rope scaling '" + type + "' is not supported (supported: default, linear, llama3)");
}

Expected<ModelConfig> from_hf_json(std::string_view text, const std::string& name) {
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return make_error(name + ": not a JSON object");
  JsonReader r{j, name};
  ModelConfig c;
  const json* mt = r.find("model_type");
  if (!mt || !mt->is_string()) return make_error(name + ": missing model_type");
  const std::string type = mt->get<std::string>();
  if (type == "llama" || type == "mistral") c.arch = Arch::Llama;
  else if (type == "qwen2") c.arch = Arch::Qwen2;
  else if (type == "qwen3") c.arch = Arch::Qwen3;
  else return make_error(name + ": unsupported model_type '" + type + "' (supported: llama, mistral, qwen2, qwen3)");
  set_arch_traits(c);
  c.rope_style = RopeStyle::HalfSplit;  // Hugging Face keeps Q/K rows unpermuted
  if (const json* n = r.find("_name_or_path"); n && n->is_string()) c.name = n->get<std::string>();
  if (c.name.empty()) c.name = type;

  SS_TRY(r.get_int("num_hidden_layers", {}, &c.n_layers));
  SS_TRY(r.get_int("hidden_size", {}, &c.hidden_size));
  SS_TRY(r.get_int("intermediate_size", {}, &c.intermediate_size));
  SS_TRY(r.get_int("num_attention_heads", {}, &c.n_heads));
  SS_TRY(r.get_int("num_key_value_heads", c.n_heads, &c.n_kv_heads));
  SS_TRY(r.get_int("head_dim", c.n_heads > 0 ? c.hidden_size / c.n_heads : 0, &c.head_dim));
  SS_TRY(r.get_int("vocab_size", {}, &c.vocab_size));
  SS_TRY(r.get_int("max_position_embeddings", 2048, &c.max_context));
  SS_TRY(r.get_float("rms_norm_eps", 1e-6, &c.rms_norm_eps));
  SS_TRY(r.get_bool("tie_word_embeddings", false, &c.tie_embeddings));
  c.rope_dim = c.head_dim;

  // transformers >= 5 moved rope_theta and the scaling into rope_parameters.
  const json* rp = r.find("rope_parameters");
  if (rp && !rp->is_object()) return make_error(name + ": rope_parameters must be an object");
  const json& theta_src = r.find("rope_theta") || !rp ? j : *rp;
  SS_TRY((JsonReader{theta_src, name}.get_float("rope_theta", 10000.0, &c.rope_theta)));
  if (const json* rs = r.find("rope_scaling")) SS_TRY(rope_scaling_from_json(*rs, name, c));
  else if (rp) SS_TRY(rope_scaling_from_json(*rp, name, c));

  bool attention_bias = false, mlp_bias = false;
  SS_TRY(r.get_bool("attention_bias", false, &attention_bias));
  SS_TRY(r.get_bool("mlp_bias", false, &mlp_bias));
  if (c.arch == Arch::Llama && (attention_bias || mlp_bias))
    return make_error(name + ": attention_bias / mlp_bias are not supported for llama");
  return c;
}

}  // namespace

Expected<ModelConfig> config_from_gguf(const gguf::File& f) { return from_gguf(f); }

Expected<ModelConfig> config_from_hf_json(std::string_view json_text, const std::string& name) {
  try {  // nlohmann::json throws on allocation failure; keep it inside
    return from_hf_json(json_text, name);
  } catch (const std::exception& e) {
    return make_error(name + ": " + e.what());
  }
}

Status rope_scaling_from_freqs(ModelConfig& c, const Tensor& t, const std::string& file) {
  const std::string where = file + ": tensor " + t.name + ": ";
  const int half = c.rope_dim / 2;
  if (t.type != DType::F32 || t.numel() != half || half <= 0)
    return make_error(where + "expected " + std::to_string(half) + " F32 values (rope_dim / 2)");
  std::vector<float> v(static_cast<size_t>(half));
  std::memcpy(v.data(), t.data, v.size() * sizeof(float));
  bool ones = true;
  for (float x : v) ones = ones && x == 1.0f;
  if (ones) return {};

  // Rebuild the converter's factors (convert_hf_to_gguf.py, llama3 branch) and compare.
  RopeScaling s;
  s.kind = RopeScaling::Kind::Llama3;
  s.factor = v.back();
  s.original_max_position = c.rope_scaling.original_max_position;
  const double low_wavelen = s.original_max_position / s.low_freq_factor;
  const double high_wavelen = s.original_max_position / s.high_freq_factor;
  for (int i = 0; i < half; ++i) {
    const double freq = 1.0 / std::pow(static_cast<double>(c.rope_theta), 2.0 * i / c.rope_dim);
    const double wavelen = 2 * std::numbers::pi / freq;
    double want;
    if (wavelen < high_wavelen) {
      want = 1;
    } else if (wavelen > low_wavelen) {
      want = s.factor;
    } else {
      const double smooth = (s.original_max_position / wavelen - s.low_freq_factor) /
                            (s.high_freq_factor - s.low_freq_factor);
      want = 1 / ((1 - smooth) / s.factor + smooth);
    }
    if (!(std::fabs(v[static_cast<size_t>(i)] - want) <= 1e-3 * std::fabs(want)))
      return make_error(where + "per-frequency rope factors that are not Llama 3 scaling are not supported");
  }
  c.rope_scaling = s;
  return {};
}

Status check_config(const ModelConfig& c, const std::string& name) {
  auto range = [&](const char* what, int64_t v, int64_t lo, int64_t hi) -> Status {
    if (v < lo || v > hi)
      return make_error(name + ": " + what + " = " + std::to_string(v) + " is outside [" + std::to_string(lo) +
                        ", " + std::to_string(hi) + "]");
    return {};
  };
  SS_TRY(range("n_layers", c.n_layers, 1, 1024));
  SS_TRY(range("hidden_size", c.hidden_size, 1, 1 << 17));
  SS_TRY(range("n_heads", c.n_heads, 1, 1024));
  SS_TRY(range("n_kv_heads", c.n_kv_heads, 1, c.n_heads));
  SS_TRY(range("head_dim", c.head_dim, 2, 1024));
  SS_TRY(range("rope_dim", c.rope_dim, 2, c.head_dim));
  SS_TRY(range("intermediate_size", c.intermediate_size, 1, 1 << 20));
  SS_TRY(range("vocab_size", c.vocab_size, 1, 1 << 24));
  SS_TRY(range("max_context", c.max_context, 1, 1 << 24));
  if (c.n_heads % c.n_kv_heads != 0)
    return make_error(name + ": n_heads " + std::to_string(c.n_heads) + " is not a multiple of n_kv_heads " +
                      std::to_string(c.n_kv_heads));
  if (c.head_dim % 2 != 0 || c.rope_dim % 2 != 0)
    return make_error(name + ": head_dim and rope_dim must be even");
  auto positive = [&](const char* what, float v) -> Status {
    if (!(std::isfinite(v) && v > 0)) return make_error(name + ": " + what + " = " + std::to_string(v) + " must be > 0");
    return {};
  };
  SS_TRY(positive("rms_norm_eps", c.rms_norm_eps));
  SS_TRY(positive("rope_theta", c.rope_theta));
  if (c.rope_scaling.kind != RopeScaling::Kind::None) {
    SS_TRY(positive("rope scaling factor", c.rope_scaling.factor));
    SS_TRY(range("rope scaling original_max_position", c.rope_scaling.original_max_position, 1, 1 << 24));
  }
  if (c.rope_scaling.kind == RopeScaling::Kind::Llama3) {
    SS_TRY(positive("rope low_freq_factor", c.rope_scaling.low_freq_factor));
    if (!(c.rope_scaling.high_freq_factor > c.rope_scaling.low_freq_factor))
      return make_error(name + ": rope high_freq_factor must exceed low_freq_factor");
  }
  return {};
}

}  // namespace ss::model
