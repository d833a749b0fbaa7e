// Random-weights models of real shapes (selfserve synth), written deterministically from a seed:
// the same (shape, seed, options) gives the same bytes on any machine, so the GPU machine generates
// the very files the development machines test with instead of receiving them.
//
// Every weight element is a pure function of (seed, GGUF tensor name, index in the Hugging Face
// [out, in] layout): a GGUF and a safetensors folder of one seed hold the same model. Llama GGUFs get
// their Q/K rows permuted as llama.cpp's converter permutes them, so both formats compute the same
// logits. Norm weights are 1; everything else is approximately N(0, 0.02).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "model/model.h"

namespace ss::model {

// "smollm2-135m", "llama32-1b", "llama3-8b", "qwen25-05b", "qwen3-06b".
std::vector<std::string> synth_shape_names();

enum class SynthFormat { Gguf, Safetensors };

struct SynthOptions {
  std::string shape;       // one of synth_shape_names()
  int layers = 0;          // 0: the shape's own
  int vocab = 0;           // 0: the shape's own (a smaller vocabulary makes small test models)
  SynthFormat format = SynthFormat::Gguf;
  DType dtype = DType::F16;
  uint64_t seed = 0;
  std::string out;         // GGUF: the file; safetensors: the folder (created)
  int threads = 0;         // 0: hardware concurrency
  std::function<void(uint64_t done, uint64_t total)> progress;  // tensor bytes, from one thread
};

struct SynthResult {
  std::vector<std::string> files;  // written, in order
  uint64_t bytes = 0;              // total size of the weight file
  std::vector<std::string> notes;  // e.g. tensors whose row length forced a fallback block type
};

// Writes the model. Bad options (unknown shape, a block type safetensors cannot hold, ...) are errors
// before anything is written.
Expected<SynthResult> write_synth_model(const SynthOptions& opts);

// "f16" / "q4_k" / ... -> DType (case-insensitive), for the command line.
Expected<DType> synth_dtype(std::string_view name);

// --- insides, for tests that recompute elements independently of the files ---------------------

struct SynthShape {
  std::string name;        // "llama3-8b", ...
  Arch arch;
  int hidden, layers, heads, kv_heads, head_dim, ffn, vocab, context;
  bool tied;
  float rope_theta, rms_eps;
  float llama3_rope_factor = 0;  // > 0: Llama 3.1+ rope scaling (low 1, high 4, original context 8192)
};
// The named shapes, and the one called `name` (an error lists the names).
const std::vector<SynthShape>& synth_shapes();
Expected<SynthShape> synth_shape(std::string_view name);

// The generator, public so tests can recompute any element independently of the files.
uint64_t synth_tensor_key(uint64_t seed, std::string_view gguf_name);
float synth_value(uint64_t tensor_key, uint64_t index);
// The Hugging Face row that GGUF row `r` of a permuted llama Q/K weight holds (n_head: heads of
// that projection).
int64_t synth_hf_row(int64_t r, int64_t rows, int n_head);

}  // namespace ss::model
