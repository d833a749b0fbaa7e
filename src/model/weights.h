// Binding file tensors to Weights: name mapping (Hugging Face -> GGUF names), presence, type and
// shape checks against the config. Both formats go through the same binder under GGUF names.
#pragma once
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "model/model.h"

namespace ss::model {

struct SourceTensor {
  Tensor tensor;             // tensor.name is the name in the file
  const std::string* file;   // the file it lives in, for messages
};
using TensorMap = std::map<std::string, SourceTensor, std::less<>>;  // keyed by GGUF name

// "model.layers.3.mlp.up_proj.weight" -> "blk.3.ffn_up.weight"; nullopt for names we do not know.
std::optional<std::string> gguf_name_from_hf(std::string_view hf);
// The inverse: "blk.3.ffn_up.weight" -> "model.layers.3.mlp.up_proj.weight"; unknown names unchanged.
std::string hf_name_from_gguf(std::string_view gguf);
// Tensors that may appear in a checkpoint but carry nothing we use (e.g. rotary inv_freq buffers).
bool ignorable_tensor(std::string_view name);

// Shape as the format writes it: GGUF lists ne[0] first, Hugging Face lists ne[0] last.
std::string shape_string(int n_dims, const int64_t* ne, FileFormat fmt);

// Fills `w` from `tensors` for config `c` (tie_embeddings already decided). Every weight must be
// present with the expected shape; vectors must be F32/F16/BF16; leftover tensors are an error
// (they mean the file is not the model the config describes). `where` names the model in messages.
Status bind_weights(const ModelConfig& c, const TensorMap& tensors, FileFormat fmt, const std::string& where,
                    Weights* w);

}  // namespace ss::model
