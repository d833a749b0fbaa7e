#include "model/gguf_writer.h"

#include <cstring>

namespace ss::model::gguf {

namespace {

uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

// resize + memcpy rather than insert: GCC 12 warns falsely (-Wstringop-overflow) on small inserts.
void append_bytes(std::vector<uint8_t>& out, const void* p, size_t n) {
  const size_t at = out.size();
  out.resize(at + n);
  if (n) std::memcpy(out.data() + at, p, n);
}

template <class V>
void append(std::vector<uint8_t>& out, V v) {  // little-endian host (x86-64, aarch64)
  append_bytes(out, &v, sizeof(V));
}

void append_str(std::vector<uint8_t>& out, const std::string& s) {
  append<uint64_t>(out, s.size());
  append_bytes(out, s.data(), s.size());
}

}  // namespace

template <class V>
void Writer::put(V v) {
  append(kv_, v);
}
void Writer::put_str(const std::string& s) { append_str(kv_, s); }
void Writer::key(const std::string& k, ValueType t) {
  ++n_kv_;
  put_str(k);
  put(static_cast<uint32_t>(t));
}

void Writer::add_string(const std::string& k, const std::string& v) { key(k, ValueType::String), put_str(v); }
void Writer::add_u32(const std::string& k, uint32_t v) { key(k, ValueType::U32), put(v); }
void Writer::add_i32(const std::string& k, int32_t v) { key(k, ValueType::I32), put(v); }
void Writer::add_f32(const std::string& k, float v) { key(k, ValueType::F32), put(v); }
void Writer::add_bool(const std::string& k, bool v) { key(k, ValueType::Bool), put<uint8_t>(v ? 1 : 0); }
void Writer::add_strings(const std::string& k, const std::vector<std::string>& v) {
  key(k, ValueType::Array);
  put(static_cast<uint32_t>(ValueType::String));
  put<uint64_t>(v.size());
  for (const auto& s : v) put_str(s);
}
void Writer::add_f32s(const std::string& k, const std::vector<float>& v) {
  key(k, ValueType::Array);
  put(static_cast<uint32_t>(ValueType::F32));
  put<uint64_t>(v.size());
  for (float f : v) put(f);
}
void Writer::add_i32s(const std::string& k, const std::vector<int32_t>& v) {
  key(k, ValueType::Array);
  put(static_cast<uint32_t>(ValueType::I32));
  put<uint64_t>(v.size());
  for (int32_t i : v) put(i);
}

size_t Writer::add_tensor(const std::string& name, DType type, int n_dims, const int64_t* ne) {
  T t{name, type, n_dims, {1, 1, 1, 1}, 0, 0};
  int64_t rows = 1;
  for (int d = 0; d < n_dims; ++d) t.ne[d] = ne[d];
  for (int d = 1; d < n_dims; ++d) rows *= ne[d];
  t.nbytes = row_bytes(type, ne[0]) * static_cast<uint64_t>(rows);
  t.offset = data_bytes_;
  data_bytes_ = align_up(data_bytes_ + t.nbytes, alignment_);
  tensors_.push_back(std::move(t));
  return tensors_.size() - 1;
}

std::vector<uint8_t> Writer::header() const {
  std::vector<uint8_t> out;
  append<uint32_t>(out, kMagic);
  append<uint32_t>(out, 3);
  append<uint64_t>(out, tensors_.size());
  append<uint64_t>(out, n_kv_);
  append_bytes(out, kv_.data(), kv_.size());
  for (const T& t : tensors_) {
    append_str(out, t.name);
    append<uint32_t>(out, static_cast<uint32_t>(t.n_dims));
    for (int d = 0; d < t.n_dims; ++d) append<uint64_t>(out, static_cast<uint64_t>(t.ne[d]));
    append<uint32_t>(out, static_cast<uint32_t>(t.type));
    append<uint64_t>(out, t.offset);
  }
  out.resize(align_up(out.size(), alignment_), 0);
  return out;
}

uint64_t Writer::data_offset() const {
  uint64_t n = 4 + 4 + 8 + 8 + kv_.size();
  for (const T& t : tensors_) n += 8 + t.name.size() + 4 + 8 * static_cast<uint64_t>(t.n_dims) + 4 + 8;
  return align_up(n, alignment_);
}

}  // namespace ss::model::gguf
