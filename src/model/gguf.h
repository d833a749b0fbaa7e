// GGUF v2/v3 reader over bytes in memory (normally a MappedFile). Parsing checks every length and
// offset against the buffer size, so a hostile file yields an error, never an out-of-bounds read.
// Values that point into the buffer (strings, arrays, tensor data) stay valid as long as it does.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace ss::model::gguf {

enum class ValueType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, Bool = 7,
  String = 8, Array = 9, U64 = 10, I64 = 11, F64 = 12,
};
const char* value_type_name(ValueType t);

struct Value {
  ValueType type = ValueType::U8;
  uint64_t u = 0;         // U8/U16/U32/U64/Bool
  int64_t i = 0;          // I8/I16/I32/I64
  double f = 0;           // F32/F64
  std::string_view str;   // String
  // Array: element type and count; the elements live in exactly one of the members below.
  ValueType elem = ValueType::U8;
  uint64_t count = 0;
  const uint8_t* raw = nullptr;           // numeric and bool elements, packed little-endian
  std::vector<std::string_view> strings;  // string elements
  std::vector<Value> items;               // array elements (arrays of arrays)
};

struct TensorInfo {
  std::string name;
  uint32_t type_id = 0;   // a known weight DType (checked by parse)
  int n_dims = 0;
  int64_t ne[4] = {1, 1, 1, 1};
  uint64_t offset = 0;    // absolute offset of the data in the buffer
  uint64_t nbytes = 0;
};

struct File {
  std::string name;  // the path, for messages
  uint32_t version = 0;
  uint64_t alignment = 32;
  uint64_t data_offset = 0;
  std::vector<std::pair<std::string, Value>> metadata;  // file order
  std::vector<TensorInfo> tensors;                       // file order

  const Value* find(std::string_view key) const;
  // Typed getters: a missing key without a default, or a value of the wrong type, is an error
  // naming the file and the key. Integers of any width are accepted where an integer is wanted.
  Expected<int64_t> get_int(std::string_view key, std::optional<int64_t> dflt = std::nullopt) const;
  Expected<double> get_float(std::string_view key, std::optional<double> dflt = std::nullopt) const;
  Expected<bool> get_bool(std::string_view key, std::optional<bool> dflt = std::nullopt) const;
  Expected<std::string> get_string(std::string_view key, std::optional<std::string> dflt = std::nullopt) const;
  // Arrays: an absent key gives an empty vector.
  Expected<std::vector<std::string>> get_strings(std::string_view key) const;
  Expected<std::vector<float>> get_floats(std::string_view key) const;
  Expected<std::vector<int32_t>> get_ints(std::string_view key) const;

  std::map<std::string, size_t, std::less<>> index;  // key -> position in metadata
};

inline constexpr uint32_t kMagic = 0x46554747;  // "GGUF" little-endian

// Parses the header, metadata and tensor table and checks every tensor's type, row length,
// alignment and extent against `size`.
Expected<File> parse(const uint8_t* data, size_t size, const std::string& name);

}  // namespace ss::model::gguf
