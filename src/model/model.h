// The model folder's public header: configuration, weights (views into mapped files), the loader.
// Everything here is plain data; the backends read it and never reach into file formats.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/quant.h"

namespace ss::tok {
class Tokenizer;
}

namespace ss::model {

enum class Arch { Llama, Qwen2, Qwen3 };
const char* arch_name(Arch a);

// How rotary pairs are laid out in the Q/K projection rows.
//  Interleaved: pairs are (2i, 2i+1) — GGUF converters permute Llama Q/K rows this way (llama.cpp "normal").
//  HalfSplit:   pairs are (i, i + d/2) — Hugging Face layout, and GGUF Qwen2/Qwen3 (llama.cpp "neox").
enum class RopeStyle { Interleaved, HalfSplit };

struct RopeScaling {
  enum class Kind { None, Llama3, Linear } kind = Kind::None;
  float factor = 1.0f;
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int original_max_position = 8192;
};

struct ModelConfig {
  Arch arch = Arch::Llama;
  std::string name;
  int vocab_size = 0;
  int hidden_size = 0;
  int n_layers = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;            // usually hidden_size / n_heads; Qwen3 sets it explicitly
  int intermediate_size = 0;
  int max_context = 0;
  float rms_norm_eps = 1e-5f;
  float rope_theta = 10000.0f;
  int rope_dim = 0;            // rotary dimensions per head (== head_dim for these archs)
  RopeStyle rope_style = RopeStyle::HalfSplit;
  RopeScaling rope_scaling;
  bool tie_embeddings = false; // lm_head shares token_embd
  bool qkv_bias = false;       // Qwen2
  bool qk_norm = false;        // Qwen3: per-head RMSNorm on q and k before RoPE
};

// A view of one tensor's data inside a mapped file. GGUF order: ne[0] is the contiguous dimension.
// For a 2-D weight of Hugging Face shape [out, in]: ne[0] = in = cols(), ne[1] = out = rows().
struct Tensor {
  std::string name;
  DType type = DType::F32;
  int n_dims = 0;
  int64_t ne[4] = {1, 1, 1, 1};
  const void* data = nullptr;
  size_t nbytes = 0;

  int64_t cols() const { return ne[0]; }
  int64_t rows() const { return ne[1] * ne[2] * ne[3]; }
  int64_t numel() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
  size_t row_stride() const { return row_bytes(type, ne[0]); }
  const uint8_t* row(int64_t r) const { return static_cast<const uint8_t*>(data) + r * row_stride(); }
  bool valid() const { return data != nullptr; }
};

struct LayerWeights {
  Tensor attn_norm;            // [hidden]
  Tensor wq, wk, wv, wo;       // [n_heads*head_dim, hidden], [n_kv*hd, hidden] x2, [hidden, n_heads*hd]
  Tensor bq, bk, bv;           // Qwen2 only
  Tensor q_norm, k_norm;       // Qwen3 only, [head_dim]
  Tensor ffn_norm;             // [hidden]
  Tensor w_gate, w_up;         // [intermediate, hidden]
  Tensor w_down;               // [hidden, intermediate]
};

struct Weights {
  Tensor token_embd;           // [vocab, hidden]
  Tensor output_norm;          // [hidden]
  Tensor output;               // [vocab, hidden]; equals token_embd when tied
  std::vector<LayerWeights> layers;
};

enum class FileFormat { Gguf, Safetensors };

struct LoadOptions {
  bool check_values = false;                  // scan every weight for NaN/Inf
  std::optional<std::string> verify_sha256;   // hex digest the file must have (single-file models)
  bool load_tokenizer = true;
  // Progress: (stage, done, total). Called from the loading thread.
  std::function<void(const char*, uint64_t, uint64_t)> progress;
};

struct TensorSummary {
  std::string name;
  DType type;
  int n_dims;
  int64_t ne[4];
  size_t nbytes;
};

class MappedFile;  // private: an mmap'd file kept alive by the Model

class Model {
 public:
  ~Model();
  Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  ModelConfig config;
  Weights weights;
  FileFormat format = FileFormat::Gguf;
  std::string path;
  std::string chat_template;                  // Jinja text from the file, may be empty
  std::unique_ptr<tok::Tokenizer> tokenizer;  // null when LoadOptions::load_tokenizer is false
  std::vector<TensorSummary> tensor_table;    // every tensor in the file(s), for `inspect`
  uint64_t file_bytes = 0;                    // total size of the weight file(s)
  int64_t file_type = -1;                     // GGUF general.file_type (llama.cpp's ftype), -1 if absent

  std::vector<std::unique_ptr<MappedFile>> files;  // keep the mappings alive

  // Tells the OS this process no longer needs t's pages resident (a backend that copied t into its
  // own layout calls it): t stays valid and readable, its pages fault back in from the file if read
  // again. A no-op for tensors not inside one of `files` (e.g. built in memory by a test).
  void release_pages(const Tensor& t) const;
};

// Loads a GGUF file or a Hugging Face folder (config.json + model.safetensors or a sharded index).
// Validates everything before returning; an error names the file, the tensor and the problem.
Expected<std::unique_ptr<Model>> load_model(const std::string& path, const LoadOptions& opts = {});

// Human-readable report for `selfserve inspect`: architecture, hyper-parameters, tokenizer summary,
// tensor table and validation verdict. Never fails: a failed load is reported as the verdict, and
// *ok (when given) says whether the model is valid.
std::string inspect_report(const std::string& path, const LoadOptions& opts = {}, bool* ok = nullptr);

}  // namespace ss::model
