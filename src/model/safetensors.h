// safetensors reader over bytes in memory (normally a MappedFile), and the shard list of a Hugging
// Face folder. Every offset is checked against the buffer; tensors keep their Hugging Face names.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "model/quant.h"

namespace ss::model::st {

struct TensorInfo {
  std::string name;
  DType type = DType::F32;
  int n_dims = 0;
  int64_t ne[4] = {1, 1, 1, 1};  // ne[0] is the last (contiguous) Hugging Face dimension
  uint64_t offset = 0;           // absolute offset of the data in the buffer
  uint64_t nbytes = 0;
};

struct File {
  std::string name;  // the path, for messages
  uint64_t data_offset = 0;
  std::vector<TensorInfo> tensors;  // sorted by name
};

// Parses the 8-byte header length, the JSON header and checks every tensor's dtype, shape and extent.
Expected<File> parse(const uint8_t* data, size_t size, const std::string& name);

// The weight files of a folder: model.safetensors.index.json's weight_map (tensor -> shard file), or
// model.safetensors alone (empty weight_map).
struct Shards {
  std::vector<std::string> files;                  // file names relative to the folder, sorted
  std::map<std::string, std::string> weight_map;   // tensor name -> file name
};
Expected<Shards> parse_index(std::string_view json_text, const std::string& name);
Expected<Shards> find_shards(const std::string& dir);

}  // namespace ss::model::st
