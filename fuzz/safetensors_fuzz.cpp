// libFuzzer target for the Hugging Face side: the same bytes are tried as config.json, as a shard
// index and as a safetensors file; a file that parses is bound against tiny llama/qwen2/qwen3 configs
// (the seeds in fuzz/corpus/safetensors match them) and value-checked.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "model/loader.h"
#include "model/model_config.h"
#include "model/safetensors.h"

namespace {

ss::model::ModelConfig tiny_config(ss::model::Arch arch) {
  ss::model::ModelConfig c;
  c.arch = arch;
  c.vocab_size = 16;
  c.hidden_size = 8;
  c.n_layers = 1;
  c.n_heads = 2;
  c.n_kv_heads = 1;
  c.head_dim = 4;
  c.rope_dim = 4;
  c.intermediate_size = 16;
  c.max_context = 64;
  c.qkv_bias = arch == ss::model::Arch::Qwen2;
  c.qk_norm = arch == ss::model::Arch::Qwen3;
  return c;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ss::model;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  if (auto c = config_from_hf_json(text, "config.json")) (void)check_config(*c, "config.json");
  (void)st::parse_index(text, "model.safetensors.index.json");

  auto f = st::parse(data, size, "model.safetensors");
  if (!f) return 0;
  for (Arch arch : {Arch::Llama, Arch::Qwen2, Arch::Qwen3}) {
    Model m;
    m.path = "fuzz";
    m.config = tiny_config(arch);
    LoadOptions opts;
    opts.load_tokenizer = false;
    opts.check_values = true;
    (void)build_from_safetensors(m, {{&*f, data}}, {}, opts);
  }
  return 0;
}
