// A Model from a parsed GGUF: config, tensor views, tokenizer spec, chat template.
#include <limits>

#include "model/loader.h"
#include "model/model_config.h"
#include "model/validate.h"
#include "model/weights.h"

namespace ss::model {

Expected<tok::TokenizerSpec> tokenizer_spec_from_gguf(const gguf::File& g) {
  tok::TokenizerSpec s;
  SS_ASSIGN(s.model, g.get_string("tokenizer.ggml.model", ""));
  SS_ASSIGN(s.pre, g.get_string("tokenizer.ggml.pre", "default"));
  SS_ASSIGN(s.tokens, g.get_strings("tokenizer.ggml.tokens"));
  SS_ASSIGN(s.scores, g.get_floats("tokenizer.ggml.scores"));
  SS_ASSIGN(s.token_types, g.get_ints("tokenizer.ggml.token_type"));
  SS_ASSIGN(s.merges, g.get_strings("tokenizer.ggml.merges"));
  const size_t n = s.tokens.size();
  if (n == 0) return make_error(g.name + ": no tokenizer in the file (tokenizer.ggml.tokens is missing or empty)");
  if (n > static_cast<size_t>(std::numeric_limits<int32_t>::max()))
    return make_error(g.name + ": tokenizer.ggml.tokens is too long");
  if (!s.scores.empty() && s.scores.size() != n)
    return make_error(g.name + ": tokenizer.ggml.scores has " + std::to_string(s.scores.size()) + " entries for " +
                      std::to_string(n) + " tokens");
  if (!s.token_types.empty() && s.token_types.size() != n)
    return make_error(g.name + ": tokenizer.ggml.token_type has " + std::to_string(s.token_types.size()) +
                      " entries for " + std::to_string(n) + " tokens");
  // Like llama.cpp, an id outside the vocabulary is ignored rather than fatal.
  auto id = [&](const char* key, int32_t* out) -> Status {
    SS_ASSIGN(int64_t v, g.get_int(key, -1));
    *out = v >= 0 && v < static_cast<int64_t>(n) ? static_cast<int32_t>(v) : -1;
    return {};
  };
  SS_TRY(id("tokenizer.ggml.bos_token_id", &s.bos_id));
  SS_TRY(id("tokenizer.ggml.eos_token_id", &s.eos_id));
  SS_TRY(id("tokenizer.ggml.unknown_token_id", &s.unk_id));
  SS_TRY(id("tokenizer.ggml.padding_token_id", &s.pad_id));
  SS_TRY(id("tokenizer.ggml.eot_token_id", &s.eot_id));
  SS_ASSIGN(s.add_bos, g.get_bool("tokenizer.ggml.add_bos_token", s.model == "llama"));  // SentencePiece adds BOS
  SS_ASSIGN(s.add_eos, g.get_bool("tokenizer.ggml.add_eos_token", false));
  SS_ASSIGN(s.add_space_prefix, g.get_bool("tokenizer.ggml.add_space_prefix", s.add_space_prefix));
  return s;
}

Status build_from_gguf(Model& m, const gguf::File& g, const uint8_t* base, const LoadOptions& opts) {
  m.format = FileFormat::Gguf;
  TensorMap tensors;
  for (const auto& ti : g.tensors) {
    Tensor t;
    t.name = ti.name;
    t.type = static_cast<DType>(ti.type_id);
    t.n_dims = ti.n_dims;
    for (int d = 0; d < 4; ++d) t.ne[d] = ti.ne[d];
    t.data = base + ti.offset;
    t.nbytes = static_cast<size_t>(ti.nbytes);
    m.tensor_table.push_back({t.name, t.type, t.n_dims, {t.ne[0], t.ne[1], t.ne[2], t.ne[3]}, t.nbytes});
    tensors.emplace(ti.name, SourceTensor{std::move(t), &g.name});
  }

  SS_ASSIGN(m.file_type, g.get_int("general.file_type", -1));
  SS_ASSIGN(ModelConfig c, config_from_gguf(g));
  c.tie_embeddings = tensors.count("output.weight") == 0;
  m.config = c;  // visible to inspect even if a check below fails
  SS_TRY(check_config(c, g.name));
  if (auto it = tensors.find("rope_freqs.weight"); it != tensors.end())
    SS_TRY(rope_scaling_from_freqs(c, it->second.tensor, g.name));
  m.config = c;
  SS_TRY(bind_weights(c, tensors, FileFormat::Gguf, g.name, &m.weights));
  SS_ASSIGN(m.chat_template, g.get_string("tokenizer.chat_template", ""));

  if (opts.load_tokenizer) {
    if (opts.progress) opts.progress("tokenizer", 0, 1);
    SS_ASSIGN(tok::TokenizerSpec spec, tokenizer_spec_from_gguf(g));
    auto tk = tok::Tokenizer::from_spec(spec);
    if (!tk) return make_error(g.name + ": " + tk.message());
    m.tokenizer = std::move(tk.value());
    if (opts.progress) opts.progress("tokenizer", 1, 1);
  }

  if (opts.check_values) {
    std::function<void(uint64_t, uint64_t)> progress;
    if (opts.progress) progress = [&](uint64_t d, uint64_t t) { opts.progress("check_values", d, t); };
    SS_TRY(check_values(check_items(m.weights, tensors), progress));
  }
  return {};
}

}  // namespace ss::model
