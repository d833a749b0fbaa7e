// GGUF v3 layout builder: metadata and the tensor table as bytes, plus where each tensor's data goes.
// The caller writes the data itself (in parallel, streaming), so nothing here holds tensor bytes.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/gguf.h"
#include "model/quant.h"

namespace ss::model::gguf {

class Writer {
 public:
  explicit Writer(uint64_t alignment = 32) : alignment_(alignment) {}

  void add_string(const std::string& key, const std::string& v);
  void add_u32(const std::string& key, uint32_t v);
  void add_i32(const std::string& key, int32_t v);
  void add_f32(const std::string& key, float v);
  void add_bool(const std::string& key, bool v);
  void add_strings(const std::string& key, const std::vector<std::string>& v);
  void add_f32s(const std::string& key, const std::vector<float>& v);
  void add_i32s(const std::string& key, const std::vector<int32_t>& v);

  // ne[0] is the contiguous dimension. Returns the tensor's index; its data offset (from the start
  // of the file) is known once every tensor is added: data_offset() + tensor_offset(i).
  size_t add_tensor(const std::string& name, DType type, int n_dims, const int64_t* ne);

  // Header + metadata + tensor table, padded to the alignment: the file's first data_offset() bytes.
  std::vector<uint8_t> header() const;
  uint64_t data_offset() const;
  uint64_t tensor_offset(size_t i) const { return tensors_[i].offset; }
  uint64_t tensor_bytes(size_t i) const { return tensors_[i].nbytes; }
  // The whole file's size: data offset + every tensor, each padded to the alignment.
  uint64_t file_size() const { return data_offset() + data_bytes_; }

 private:
  struct T {
    std::string name;
    DType type;
    int n_dims;
    int64_t ne[4];
    uint64_t offset, nbytes;
  };
  void key(const std::string& k, ValueType t);
  void put_str(const std::string& s);
  template <class V>
  void put(V v);

  uint64_t alignment_;
  uint64_t n_kv_ = 0;
  std::vector<uint8_t> kv_;  // serialized key/value pairs
  std::vector<T> tensors_;
  uint64_t data_bytes_ = 0;
};

}  // namespace ss::model::gguf
