#include "model/safetensors.h"

#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "model/mapped_file.h"

namespace ss::model::st {

namespace {

using nlohmann::json;

bool dtype_from_string(const std::string& s, DType* t) {
  if (s == "F32") *t = DType::F32;
  else if (s == "F16") *t = DType::F16;
  else if (s == "BF16") *t = DType::BF16;
  else return false;
  return true;
}

Status parse_entry(const std::string& file, const std::string& key, const json& v, uint64_t data_offset,
                   uint64_t size, TensorInfo* t) {
  const std::string where = file + ": tensor " + key + ": ";
  if (!v.is_object()) return make_error(where + "header entry is not an object");
  auto dt = v.find("dtype");
  auto sh = v.find("shape");
  auto off = v.find("data_offsets");
  if (dt == v.end() || !dt->is_string()) return make_error(where + "missing dtype");
  if (sh == v.end() || !sh->is_array()) return make_error(where + "missing shape");
  if (off == v.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
      !(*off)[1].is_number_unsigned())
    return make_error(where + "data_offsets must be two unsigned integers");
  t->name = key;
  const std::string dtype = dt->get<std::string>();
  if (!dtype_from_string(dtype, &t->type))
    return make_error(where + "unsupported dtype " + dtype + " (supported: BF16, F16, F32)");
  if (sh->size() > 4) return make_error(where + std::to_string(sh->size()) + " dimensions (at most 4)");
  t->n_dims = static_cast<int>(sh->size());
  uint64_t numel = 1;
  for (int d = 0; d < t->n_dims; ++d) {
    const json& x = (*sh)[static_cast<size_t>(t->n_dims - 1 - d)];
    if (!x.is_number_unsigned()) return make_error(where + "shape entries must be unsigned integers");
    const uint64_t n = x.get<uint64_t>();
    if (n > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) || __builtin_mul_overflow(numel, n, &numel) ||
        numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      return make_error(where + "shape is too large");
    t->ne[d] = static_cast<int64_t>(n);
  }
  const uint64_t es = info(t->type).block_bytes;
  const uint64_t begin = (*off)[0].get<uint64_t>(), end = (*off)[1].get<uint64_t>();
  if (end < begin) return make_error(where + "data_offsets end before they begin");
  uint64_t want;
  if (__builtin_mul_overflow(numel, es, &want) || end - begin != want)
    return make_error(where + "data_offsets span " + std::to_string(end - begin) + " bytes, shape and dtype need " +
                      std::to_string(numel) + " x " + std::to_string(es));
  uint64_t abs_begin, abs_end;
  const bool overflow = __builtin_add_overflow(data_offset, begin, &abs_begin) ||
                        __builtin_add_overflow(data_offset, end, &abs_end);
  if (overflow || abs_end > size)
    return make_error(where + "data ends at " + (overflow ? std::string("beyond 2^64") : std::to_string(abs_end)) +
                      ", file is " + std::to_string(size) + " bytes");
  if (abs_begin % es != 0)
    return make_error(where + "data at file offset " + std::to_string(abs_begin) + " is misaligned for " + dtype);
  t->offset = abs_begin;
  t->nbytes = want;
  return {};
}

Expected<File> parse_impl(const uint8_t* data, size_t size, const std::string& name) {
  if (size < 8) return make_error(name + ": not a safetensors file (only " + std::to_string(size) + " bytes)");
  uint64_t n;
  std::memcpy(&n, data, 8);
  if (n > size - 8)
    return make_error(name + ": file is truncated or corrupt: header of " + std::to_string(n) +
                      " bytes needs bytes up to " + (n > UINT64_MAX - 8 ? "beyond 2^64" : std::to_string(n + 8)) +
                      ", file is " + std::to_string(size) + " bytes");
  const char* h = reinterpret_cast<const char*>(data + 8);
  json header = json::parse(h, h + n, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) return make_error(name + ": header is not a JSON object");
  File f;
  f.name = name;
  f.data_offset = 8 + n;
  f.tensors.reserve(header.size());
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    TensorInfo t;
    SS_TRY(parse_entry(name, it.key(), it.value(), f.data_offset, size, &t));
    f.tensors.push_back(std::move(t));
  }
  return f;  // json objects iterate in key order, so tensors are sorted by name
}

bool plain_file_name(const std::string& s) {
  return !s.empty() && s != "." && s != ".." && s.find('/') == std::string::npos &&
         s.find('\\') == std::string::npos && s.find('\0') == std::string::npos;
}

Expected<Shards> parse_index_impl(std::string_view text, const std::string& name) {
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return make_error(name + ": not a JSON object");
  auto wm = j.find("weight_map");
  if (wm == j.end() || !wm->is_object() || wm->empty()) return make_error(name + ": missing weight_map");
  Shards s;
  std::set<std::string> files;
  for (auto it = wm->begin(); it != wm->end(); ++it) {
    if (!it.value().is_string()) return make_error(name + ": weight_map entry " + it.key() + " is not a string");
    std::string file = it.value().get<std::string>();
    if (!plain_file_name(file))
      return make_error(name + ": weight_map entry " + it.key() + " names \"" + file + "\", not a file in the folder");
    files.insert(file);
    s.weight_map.emplace(it.key(), std::move(file));
  }
  s.files.assign(files.begin(), files.end());
  return s;
}

}  // namespace

// nlohmann::json reports type errors and allocation failures by throwing; keep them inside.
Expected<File> parse(const uint8_t* data, size_t size, const std::string& name) {
  try {
    return parse_impl(data, size, name);
  } catch (const std::exception& e) {
    return make_error(name + ": bad safetensors header: " + e.what());
  }
}

Expected<Shards> parse_index(std::string_view json_text, const std::string& name) {
  try {
    return parse_index_impl(json_text, name);
  } catch (const std::exception& e) {
    return make_error(name + ": bad index: " + e.what());
  }
}

Expected<Shards> find_shards(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const std::string index = dir + "/model.safetensors.index.json";
  if (fs::exists(index, ec)) {
    SS_ASSIGN(std::string text, read_text_file(index));
    return parse_index(text, index);
  }
  if (fs::exists(dir + "/model.safetensors", ec)) return Shards{{"model.safetensors"}, {}};
  return make_error(dir + ": no model.safetensors or model.safetensors.index.json");
}

}  // namespace ss::model::st
