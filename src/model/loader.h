// The steps of load_model, private to the model folder. The build_* functions work on bytes already
// in memory, so the fuzz targets can drive them without files.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/gguf.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "tokenizer/tokenizer.h"

namespace ss::model {

// Fills m (config, weights, tensor table, chat template, tokenizer) from a parsed GGUF whose tensor
// offsets point into `base`. On error m may be partly filled (inspect shows what was read).
Status build_from_gguf(Model& m, const gguf::File& g, const uint8_t* base, const LoadOptions& opts);

// tokenizer.ggml.* as a TokenizerSpec; checks array lengths and special token ids.
Expected<tok::TokenizerSpec> tokenizer_spec_from_gguf(const gguf::File& g);

struct ShardView {
  const st::File* file;
  const uint8_t* base;
};
// Fills m's weights and tensor table from parsed safetensors shards; m.config must be set.
// weight_map (from the index, may be empty) must agree with where each tensor really is.
Status build_from_safetensors(Model& m, const std::vector<ShardView>& shards,
                              const std::map<std::string, std::string>& weight_map, const LoadOptions& opts);

// A Hugging Face folder: config.json, shards, tokenizer.json, chat template.
Status load_hf_folder(Model& m, const std::string& dir, const LoadOptions& opts);

// Hashes `file` and compares with the hex digest `want` (case-insensitive).
Status verify_sha256(const std::string& file, const std::string& want, const LoadOptions& opts);

// Errors quote names from the file; a hostile name must not break the one-line promise.
std::string one_line(std::string message);

// load_model without the final hand-over: m keeps whatever was read when an error stops it.
Status load_into(Model& m, const std::string& path, const LoadOptions& opts);

}  // namespace ss::model
