#include "model/weights.h"

#include <set>

namespace ss::model {

namespace {

struct LayerName {
  std::string_view hf;    // after "model.layers.N."
  std::string_view gguf;  // after "blk.N."
};
constexpr LayerName kLayerNames[] = {
    {"input_layernorm.weight", "attn_norm.weight"},
    {"self_attn.q_proj.weight", "attn_q.weight"},
    {"self_attn.k_proj.weight", "attn_k.weight"},
    {"self_attn.v_proj.weight", "attn_v.weight"},
    {"self_attn.o_proj.weight", "attn_output.weight"},
    {"self_attn.q_proj.bias", "attn_q.bias"},
    {"self_attn.k_proj.bias", "attn_k.bias"},
    {"self_attn.v_proj.bias", "attn_v.bias"},
    {"self_attn.q_norm.weight", "attn_q_norm.weight"},
    {"self_attn.k_norm.weight", "attn_k_norm.weight"},
    {"post_attention_layernorm.weight", "ffn_norm.weight"},
    {"mlp.gate_proj.weight", "ffn_gate.weight"},
    {"mlp.up_proj.weight", "ffn_up.weight"},
    {"mlp.down_proj.weight", "ffn_down.weight"},
};

bool is_float_type(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }

class Binder {
 public:
  Binder(const TensorMap& m, FileFormat fmt, const std::string& where) : m_(m), fmt_(fmt), where_(where) {}

  // Looks up `name` and checks it has exactly the shape `want` (ne order; 1 or 2 dims).
  Status bind(const std::string& name, std::initializer_list<int64_t> want, Tensor* out) {
    auto it = m_.find(name);
    if (it == m_.end())
      return make_error(where_ + ": missing tensor " +
                        (fmt_ == FileFormat::Gguf ? name : hf_name_from_gguf(name)));
    const Tensor& t = it->second.tensor;
    const std::string& file = *it->second.file;
    int64_t ne[4] = {1, 1, 1, 1};
    int k = 0;
    for (int64_t v : want) ne[k++] = v;
    bool same = true;
    for (int d = 0; d < 4; ++d) same = same && t.ne[d] == ne[d];
    if (!same)
      return make_error(file + ": tensor " + t.name + ": shape " + shape_string(t.n_dims, t.ne, fmt_) +
                        " does not match the config, which needs " + shape_string(k, ne, fmt_));
    if (k == 1 && !is_float_type(t.type))
      return make_error(file + ": tensor " + t.name + ": type " + std::string(dtype_name(t.type)) +
                        " is not supported for a vector (need F32, F16 or BF16)");
    *out = t;
    used_.insert(name);
    return {};
  }
  void mark_used(const std::string& name) { used_.insert(name); }
  bool has(const std::string& name) const { return m_.count(name) != 0; }

  Status check_leftovers(const ModelConfig& c) const {
    for (const auto& [name, st] : m_)
      if (!used_.count(name) && !ignorable_tensor(name))
        return make_error(*st.file + ": unexpected tensor " + st.tensor.name + " (not part of a " +
                          arch_name(c.arch) + " model with " + std::to_string(c.n_layers) + " layers)");
    return {};
  }

 private:
  const TensorMap& m_;
  FileFormat fmt_;
  const std::string& where_;
  std::set<std::string> used_;
};

}  // namespace

std::string hf_name_from_gguf(std::string_view g) {
  if (g == "token_embd.weight") return "model.embed_tokens.weight";
  if (g == "output_norm.weight") return "model.norm.weight";
  if (g == "output.weight") return "lm_head.weight";
  if (g.starts_with("blk.")) {
    const size_t dot = g.find('.', 4);
    if (dot != std::string_view::npos)
      for (const auto& n : kLayerNames)
        if (g.substr(dot + 1) == n.gguf)
          return "model.layers." + std::string(g.substr(4, dot - 4)) + "." + std::string(n.hf);
  }
  return std::string(g);
}

std::optional<std::string> gguf_name_from_hf(std::string_view hf) {
  if (hf == "model.embed_tokens.weight") return "token_embd.weight";
  if (hf == "model.norm.weight") return "output_norm.weight";
  if (hf == "lm_head.weight") return "output.weight";
  constexpr std::string_view prefix = "model.layers.";
  if (!hf.starts_with(prefix)) return std::nullopt;
  const size_t dot = hf.find('.', prefix.size());
  if (dot == std::string_view::npos || dot == prefix.size() || dot - prefix.size() > 6) return std::nullopt;
  const std::string_view num = hf.substr(prefix.size(), dot - prefix.size());
  for (char ch : num)
    if (ch < '0' || ch > '9') return std::nullopt;
  if (num.size() > 1 && num[0] == '0') return std::nullopt;  // one spelling per layer
  for (const auto& n : kLayerNames)
    if (hf.substr(dot + 1) == n.hf) return "blk." + std::string(num) + "." + std::string(n.gguf);
  return std::nullopt;
}

bool ignorable_tensor(std::string_view name) {
  return name == "rope_freqs.weight" || name.ends_with(".rotary_emb.inv_freq");
}

std::string shape_string(int n_dims, const int64_t* ne, FileFormat fmt) {
  std::string s = "[";
  for (int i = 0; i < n_dims; ++i) {
    const int d = fmt == FileFormat::Gguf ? i : n_dims - 1 - i;
    if (i) s += ", ";
    s += std::to_string(ne[d]);
  }
  return s + "]";
}

Status bind_weights(const ModelConfig& c, const TensorMap& tensors, FileFormat fmt, const std::string& where,
                    Weights* w) {
  Binder b(tensors, fmt, where);
  const int64_t hidden = c.hidden_size, vocab = c.vocab_size, ffn = c.intermediate_size;
  const int64_t q_dim = int64_t{c.n_heads} * c.head_dim, kv_dim = int64_t{c.n_kv_heads} * c.head_dim;

  SS_TRY(b.bind("token_embd.weight", {hidden, vocab}, &w->token_embd));
  SS_TRY(b.bind("output_norm.weight", {hidden}, &w->output_norm));
  if (c.tie_embeddings) {
    w->output = w->token_embd;
    b.mark_used("output.weight");  // a tied checkpoint may still store a copy; we use token_embd
  } else {
    SS_TRY(b.bind("output.weight", {hidden, vocab}, &w->output));
  }
  w->layers.assign(static_cast<size_t>(c.n_layers), {});
  for (int i = 0; i < c.n_layers; ++i) {
    LayerWeights& l = w->layers[static_cast<size_t>(i)];
    const std::string p = "blk." + std::to_string(i) + ".";
    SS_TRY(b.bind(p + "attn_norm.weight", {hidden}, &l.attn_norm));
    SS_TRY(b.bind(p + "attn_q.weight", {hidden, q_dim}, &l.wq));
    SS_TRY(b.bind(p + "attn_k.weight", {hidden, kv_dim}, &l.wk));
    SS_TRY(b.bind(p + "attn_v.weight", {hidden, kv_dim}, &l.wv));
    SS_TRY(b.bind(p + "attn_output.weight", {q_dim, hidden}, &l.wo));
    if (c.qkv_bias) {
      SS_TRY(b.bind(p + "attn_q.bias", {q_dim}, &l.bq));
      SS_TRY(b.bind(p + "attn_k.bias", {kv_dim}, &l.bk));
      SS_TRY(b.bind(p + "attn_v.bias", {kv_dim}, &l.bv));
    }
    if (c.qk_norm) {
      SS_TRY(b.bind(p + "attn_q_norm.weight", {c.head_dim}, &l.q_norm));
      SS_TRY(b.bind(p + "attn_k_norm.weight", {c.head_dim}, &l.k_norm));
    }
    SS_TRY(b.bind(p + "ffn_norm.weight", {hidden}, &l.ffn_norm));
    SS_TRY(b.bind(p + "ffn_gate.weight", {hidden, ffn}, &l.w_gate));
    SS_TRY(b.bind(p + "ffn_up.weight", {hidden, ffn}, &l.w_up));
    SS_TRY(b.bind(p + "ffn_down.weight", {ffn, hidden}, &l.w_down));
  }
  return b.check_leftovers(c);
}

}  // namespace ss::model
