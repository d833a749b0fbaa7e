#include "model/gguf.h"

#include <cstring>
#include <limits>

#include "model/quant.h"

namespace ss::model::gguf {

namespace {

constexpr int kMaxArrayDepth = 4;  // nesting we accept; real files use none

// GGML type names we cannot load, so the error says "Q5_K", not "type 13".
const char* ggml_type_name(uint32_t id) {
  static const char* const names[] = {
      "F32",  "F16",   "Q4_0",   "Q4_1",  "Q4_2",    "Q4_3",   "Q5_0",  "Q5_1",   "Q8_0",  "Q8_1",
      "Q2_K", "Q3_K",  "Q4_K",   "Q5_K",  "Q6_K",    "Q8_K",   "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S",
      "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS", "I8",    "I16",    "I32",   "I64",    "F64",   "IQ1_M",
      "BF16", "Q4_0_4_4", "Q4_0_4_8", "Q4_0_8_8", "TQ1_0", "TQ2_0", "IQ4_NL_4_4", "IQ4_NL_4_8",
      "IQ4_NL_8_8", "MXFP4"};
  return id < std::size(names) ? names[id] : nullptr;
}

size_t scalar_size(ValueType t) {
  switch (t) {
    case ValueType::U8: case ValueType::I8: case ValueType::Bool: return 1;
    case ValueType::U16: case ValueType::I16: return 2;
    case ValueType::U32: case ValueType::I32: case ValueType::F32: return 4;
    case ValueType::U64: case ValueType::I64: case ValueType::F64: return 8;
    default: return 0;
  }
}

bool is_int(ValueType t) {
  switch (t) {
    case ValueType::U8: case ValueType::I8: case ValueType::U16: case ValueType::I16:
    case ValueType::U32: case ValueType::I32: case ValueType::U64: case ValueType::I64: return true;
    default: return false;
  }
}
bool is_signed(ValueType t) {
  return t == ValueType::I8 || t == ValueType::I16 || t == ValueType::I32 || t == ValueType::I64;
}

// Reads a little-endian element of type t at p as int64 (unsigned values above INT64_MAX clamp;
// callers range-check anyway) or as double.
int64_t raw_int(ValueType t, const uint8_t* p) {
  switch (t) {
    case ValueType::U8: case ValueType::Bool: return *p;
    case ValueType::I8: return static_cast<int8_t>(*p);
    case ValueType::U16: { uint16_t v; std::memcpy(&v, p, 2); return v; }
    case ValueType::I16: { int16_t v; std::memcpy(&v, p, 2); return v; }
    case ValueType::U32: { uint32_t v; std::memcpy(&v, p, 4); return v; }
    case ValueType::I32: { int32_t v; std::memcpy(&v, p, 4); return v; }
    case ValueType::U64: {
      uint64_t v; std::memcpy(&v, p, 8);
      return v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ? std::numeric_limits<int64_t>::max()
                                                                              : static_cast<int64_t>(v);
    }
    case ValueType::I64: { int64_t v; std::memcpy(&v, p, 8); return v; }
    default: return 0;
  }
}
double raw_float(ValueType t, const uint8_t* p) {
  if (t == ValueType::F32) { float v; std::memcpy(&v, p, 4); return v; }
  if (t == ValueType::F64) { double v; std::memcpy(&v, p, 8); return v; }
  return static_cast<double>(raw_int(t, p));
}

uint64_t sat_mul(uint64_t a, uint64_t b) {
  uint64_t r;
  return __builtin_mul_overflow(a, b, &r) ? std::numeric_limits<uint64_t>::max() : r;
}

class Reader {
 public:
  Reader(const uint8_t* data, size_t size, const std::string& file) : data_(data), size_(size), file_(file) {}

  size_t pos() const { return pos_; }
  size_t remaining() const { return size_ - pos_; }
  void set_context(std::string c) { context_ = std::move(c); }
  const std::string& context() const { return context_; }

  Error truncated(uint64_t need) const {
    // need may be huge (a corrupt length), so compute the end without overflowing.
    uint64_t end = 0;
    const std::string end_s = __builtin_add_overflow(static_cast<uint64_t>(pos_), need, &end)
                                  ? std::string("beyond 2^64")
                                  : std::to_string(end);
    return make_error(file_ + ": file is truncated or corrupt: " + context_ + " needs bytes up to " + end_s +
                      ", file is " + std::to_string(size_) + " bytes");
  }

  template <class T>
  Expected<T> read() {
    if (remaining() < sizeof(T)) return truncated(sizeof(T));
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  Expected<const uint8_t*> take(uint64_t n) {
    if (n > remaining()) return truncated(n);
    const uint8_t* p = data_ + pos_;
    pos_ += static_cast<size_t>(n);
    return p;
  }

  Expected<std::string_view> read_string() {
    SS_ASSIGN(uint64_t len, read<uint64_t>());
    SS_ASSIGN(const uint8_t* p, take(len));
    return std::string_view(reinterpret_cast<const char*>(p), static_cast<size_t>(len));
  }

  const std::string& file() const { return file_; }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
  const std::string& file_;
  std::string context_;
};

Status read_value(Reader& r, ValueType type, Value& v, int depth) {
  v.type = type;
  switch (type) {
    case ValueType::U8: case ValueType::U16: case ValueType::U32: case ValueType::U64: case ValueType::Bool:
    case ValueType::I8: case ValueType::I16: case ValueType::I32: case ValueType::I64:
    case ValueType::F32: case ValueType::F64: {
      SS_ASSIGN(const uint8_t* p, r.take(scalar_size(type)));
      if (type == ValueType::F32 || type == ValueType::F64) v.f = raw_float(type, p);
      else if (is_signed(type)) v.i = raw_int(type, p);
      else if (type == ValueType::U64) std::memcpy(&v.u, p, 8);
      else v.u = static_cast<uint64_t>(raw_int(type, p));
      return {};
    }
    case ValueType::String: {
      SS_ASSIGN(v.str, r.read_string());
      return {};
    }
    case ValueType::Array: {
      SS_ASSIGN(uint32_t et, r.read<uint32_t>());
      if (et > static_cast<uint32_t>(ValueType::F64))
        return make_error(r.file() + ": " + r.context() + ": unknown array element type " + std::to_string(et));
      v.elem = static_cast<ValueType>(et);
      SS_ASSIGN(v.count, r.read<uint64_t>());
      if (v.elem == ValueType::String) {
        if (v.count > r.remaining() / 8) return r.truncated(sat_mul(v.count, 8));
        v.strings.reserve(static_cast<size_t>(v.count));
        for (uint64_t k = 0; k < v.count; ++k) {
          SS_ASSIGN(std::string_view s, r.read_string());
          v.strings.push_back(s);
        }
      } else if (v.elem == ValueType::Array) {
        if (depth >= kMaxArrayDepth)
          return make_error(r.file() + ": " + r.context() + ": arrays nested deeper than " +
                            std::to_string(kMaxArrayDepth));
        if (v.count > r.remaining() / 12) return r.truncated(sat_mul(v.count, 12));  // each >= 12 bytes
        v.items.resize(static_cast<size_t>(v.count));
        for (auto& item : v.items) SS_TRY(read_value(r, ValueType::Array, item, depth + 1));
      } else {
        const size_t es = scalar_size(v.elem);
        if (v.count > r.remaining() / es) return r.truncated(sat_mul(v.count, es));
        SS_ASSIGN(v.raw, r.take(v.count * es));
      }
      return {};
    }
  }
  return make_error(r.file() + ": " + r.context() + ": unknown value type " +
                    std::to_string(static_cast<uint32_t>(type)));
}

bool add_overflows(uint64_t a, uint64_t b, uint64_t* out) { return __builtin_add_overflow(a, b, out); }
bool mul_overflows(uint64_t a, uint64_t b, uint64_t* out) { return __builtin_mul_overflow(a, b, out); }

std::string key_error(const File& f, std::string_view key, const std::string& what) {
  return f.name + ": metadata " + std::string(key) + ": " + what;
}

Status check_tensor(const File& f, TensorInfo& t, uint64_t file_size) {
  const std::string where = f.name + ": tensor " + t.name + ": ";
  const DTypeInfo* info = dtype_info(t.type_id);
  if (!info || !info->weight_type) {
    const char* n = ggml_type_name(t.type_id);
    return make_error(where + (n ? std::string("unsupported tensor type ") + n : std::string("unknown tensor type")) +
                      " (id " + std::to_string(t.type_id) + ")");
  }
  int64_t numel = 1;
  for (int d = 0; d < 4; ++d)
    if (__builtin_mul_overflow(numel, t.ne[d], &numel)) return make_error(where + "element count overflows");
  if (t.ne[0] % info->block_size != 0)
    return make_error(where + "row length " + std::to_string(t.ne[0]) + " is not a multiple of the " +
                      std::string(info->name) + " block size " + std::to_string(info->block_size));
  uint64_t nbytes = static_cast<uint64_t>(t.ne[0] / info->block_size) * static_cast<uint64_t>(info->block_bytes);
  for (int d = 1; d < 4; ++d)
    if (mul_overflows(nbytes, static_cast<uint64_t>(t.ne[d]), &nbytes)) return make_error(where + "size overflows");
  t.nbytes = nbytes;
  if (t.offset % f.alignment != 0)
    return make_error(where + "data offset " + std::to_string(t.offset) + " is not a multiple of the alignment " +
                      std::to_string(f.alignment));
  uint64_t start = 0, end = 0;
  const bool overflow = add_overflows(f.data_offset, t.offset, &start) || add_overflows(start, nbytes, &end);
  if (overflow || end > file_size)
    return make_error(where + "data ends at " + (overflow ? std::string("beyond 2^64") : std::to_string(end)) +
                      ", file is " + std::to_string(file_size) + " bytes");
  // Kernels read elements in place, so the data must be aligned to its element (or fp16 scale) size.
  const uint64_t natural = t.type_id == static_cast<uint32_t>(DType::F32) ? 4 : 2;
  if (start % natural != 0)
    return make_error(where + "data at file offset " + std::to_string(start) + " is misaligned for " +
                      std::string(info->name));
  t.offset = start;
  return {};
}

}  // namespace

const char* value_type_name(ValueType t) {
  static const char* const names[] = {"u8", "i8",  "u16",   "i16",   "u32", "i32", "f32",
                                      "bool", "string", "array", "u64", "i64", "f64"};
  const auto i = static_cast<uint32_t>(t);
  return i < std::size(names) ? names[i] : "unknown";
}

const Value* File::find(std::string_view key) const {
  auto it = index.find(key);
  return it == index.end() ? nullptr : &metadata[it->second].second;
}

Expected<int64_t> File::get_int(std::string_view key, std::optional<int64_t> dflt) const {
  const Value* v = find(key);
  if (!v) {
    if (dflt) return *dflt;
    return make_error(key_error(*this, key, "missing"));
  }
  if (!is_int(v->type))
    return make_error(key_error(*this, key, std::string("expected an integer, found ") + value_type_name(v->type)));
  if (is_signed(v->type)) return v->i;
  if (v->u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    return make_error(key_error(*this, key, "value " + std::to_string(v->u) + " is out of range"));
  return static_cast<int64_t>(v->u);
}

Expected<double> File::get_float(std::string_view key, std::optional<double> dflt) const {
  const Value* v = find(key);
  if (!v) {
    if (dflt) return *dflt;
    return make_error(key_error(*this, key, "missing"));
  }
  if (v->type == ValueType::F32 || v->type == ValueType::F64) return v->f;
  if (is_int(v->type)) return is_signed(v->type) ? static_cast<double>(v->i) : static_cast<double>(v->u);
  return make_error(key_error(*this, key, std::string("expected a number, found ") + value_type_name(v->type)));
}

Expected<bool> File::get_bool(std::string_view key, std::optional<bool> dflt) const {
  const Value* v = find(key);
  if (!v) {
    if (dflt) return *dflt;
    return make_error(key_error(*this, key, "missing"));
  }
  if (v->type != ValueType::Bool)
    return make_error(key_error(*this, key, std::string("expected a bool, found ") + value_type_name(v->type)));
  return v->u != 0;
}

Expected<std::string> File::get_string(std::string_view key, std::optional<std::string> dflt) const {
  const Value* v = find(key);
  if (!v) {
    if (dflt) return *dflt;
    return make_error(key_error(*this, key, "missing"));
  }
  if (v->type != ValueType::String)
    return make_error(key_error(*this, key, std::string("expected a string, found ") + value_type_name(v->type)));
  return std::string(v->str);
}

Expected<std::vector<std::string>> File::get_strings(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return std::vector<std::string>{};
  if (v->type != ValueType::Array || v->elem != ValueType::String)
    return make_error(key_error(*this, key, "expected an array of strings"));
  return std::vector<std::string>(v->strings.begin(), v->strings.end());
}

Expected<std::vector<float>> File::get_floats(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return std::vector<float>{};
  if (v->type != ValueType::Array || !(v->elem == ValueType::F32 || v->elem == ValueType::F64 || is_int(v->elem)))
    return make_error(key_error(*this, key, "expected an array of numbers"));
  std::vector<float> out(static_cast<size_t>(v->count));
  const size_t es = scalar_size(v->elem);
  for (size_t k = 0; k < out.size(); ++k) out[k] = static_cast<float>(raw_float(v->elem, v->raw + k * es));
  return out;
}

Expected<std::vector<int32_t>> File::get_ints(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return std::vector<int32_t>{};
  if (v->type != ValueType::Array || !is_int(v->elem))
    return make_error(key_error(*this, key, "expected an array of integers"));
  std::vector<int32_t> out(static_cast<size_t>(v->count));
  const size_t es = scalar_size(v->elem);
  for (size_t k = 0; k < out.size(); ++k) {
    const int64_t x = raw_int(v->elem, v->raw + k * es);
    if (x < std::numeric_limits<int32_t>::min() || x > std::numeric_limits<int32_t>::max())
      return make_error(key_error(*this, key, "element " + std::to_string(k) + " is out of range"));
    out[k] = static_cast<int32_t>(x);
  }
  return out;
}

Expected<File> parse(const uint8_t* data, size_t size, const std::string& name) {
  File f;
  f.name = name;
  Reader r(data, size, f.name);

  r.set_context("the header");
  if (size < 4) return make_error(name + ": not a GGUF file (only " + std::to_string(size) + " bytes)");
  SS_ASSIGN(uint32_t magic, r.read<uint32_t>());
  if (magic != kMagic) return make_error(name + ": not a GGUF file (bad magic)");
  SS_ASSIGN(f.version, r.read<uint32_t>());
  if (f.version != 2 && f.version != 3)
    return make_error(name + ": unsupported GGUF version " + std::to_string(f.version) + " (supported: 2, 3)");
  SS_ASSIGN(uint64_t n_tensors, r.read<uint64_t>());
  SS_ASSIGN(uint64_t n_kv, r.read<uint64_t>());

  // Bound the counts by the bytes left before reserving: a key/value takes >= 13 bytes, a tensor
  // info >= 24.
  if (n_kv > r.remaining() / 13)
    return make_error(name + ": file is truncated or corrupt: " + std::to_string(n_kv) +
                      " metadata entries cannot fit in the remaining " + std::to_string(r.remaining()) + " bytes");
  f.metadata.reserve(static_cast<size_t>(n_kv));
  for (uint64_t k = 0; k < n_kv; ++k) {
    r.set_context("metadata entry " + std::to_string(k));
    SS_ASSIGN(std::string_view key, r.read_string());
    r.set_context("metadata " + std::string(key));
    SS_ASSIGN(uint32_t type, r.read<uint32_t>());
    if (type > static_cast<uint32_t>(ValueType::F64))
      return make_error(name + ": metadata " + std::string(key) + ": unknown value type " + std::to_string(type));
    Value v;
    SS_TRY(read_value(r, static_cast<ValueType>(type), v, 0));
    if (!f.index.emplace(std::string(key), f.metadata.size()).second)
      return make_error(name + ": duplicate metadata key " + std::string(key));
    f.metadata.emplace_back(std::string(key), std::move(v));
  }

  if (n_tensors > r.remaining() / 24)
    return make_error(name + ": file is truncated or corrupt: " + std::to_string(n_tensors) +
                      " tensor infos cannot fit in the remaining " + std::to_string(r.remaining()) + " bytes");
  f.tensors.resize(static_cast<size_t>(n_tensors));
  std::map<std::string_view, size_t> seen;
  for (uint64_t k = 0; k < n_tensors; ++k) {
    TensorInfo& t = f.tensors[k];
    r.set_context("tensor info " + std::to_string(k));
    SS_ASSIGN(std::string_view tname, r.read_string());
    t.name = std::string(tname);
    r.set_context("tensor info " + t.name);
    SS_ASSIGN(uint32_t n_dims, r.read<uint32_t>());
    if (n_dims > 4)
      return make_error(name + ": tensor " + t.name + ": " + std::to_string(n_dims) + " dimensions (at most 4)");
    t.n_dims = static_cast<int>(n_dims);
    for (uint32_t d = 0; d < n_dims; ++d) {
      SS_ASSIGN(uint64_t ne, r.read<uint64_t>());
      if (ne > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        return make_error(name + ": tensor " + t.name + ": dimension " + std::to_string(d) + " is too large");
      t.ne[d] = static_cast<int64_t>(ne);
    }
    SS_ASSIGN(t.type_id, r.read<uint32_t>());
    SS_ASSIGN(t.offset, r.read<uint64_t>());
  }
  for (const auto& t : f.tensors)
    if (!seen.emplace(t.name, 0).second) return make_error(name + ": duplicate tensor " + t.name);

  SS_ASSIGN(int64_t align, f.get_int("general.alignment", 32));
  if (align <= 0 || (align & (align - 1)) != 0 || align > (int64_t{1} << 30))
    return make_error(name + ": general.alignment " + std::to_string(align) + " is not a power of two");
  f.alignment = static_cast<uint64_t>(align);
  f.data_offset = (r.pos() + f.alignment - 1) / f.alignment * f.alignment;  // pos < 2^63: no overflow

  for (auto& t : f.tensors) SS_TRY(check_tensor(f, t, size));
  return f;
}

}  // namespace ss::model::gguf
