// ModelConfig from GGUF metadata or a Hugging Face config.json, and its sanity check.
#pragma once
#include <string>
#include <string_view>

#include "common/status.h"
#include "model/gguf.h"
#include "model/model.h"

namespace ss::model {

// Hyper-parameters from <arch>.* keys; vocab_size from tokenizer.ggml.tokens (or <arch>.vocab_size).
// tie_embeddings is left false: it depends on which tensors exist.
Expected<ModelConfig> config_from_gguf(const gguf::File& f);

// From config.json text (model_type llama, mistral, qwen2, qwen3). `name` is used in messages.
Expected<ModelConfig> config_from_hf_json(std::string_view json_text, const std::string& name);

// Llama 3 GGUFs carry their rope scaling as per-frequency divisors (rope_freqs.weight, F32) instead
// of metadata; recognise the Llama 3 formula in them, or fail rather than run with wrong positions.
Status rope_scaling_from_freqs(ModelConfig& c, const Tensor& rope_freqs, const std::string& file);

// Ranges that keep every derived size well inside int64 and shapes that make sense.
Status check_config(const ModelConfig& c, const std::string& name);

}  // namespace ss::model
