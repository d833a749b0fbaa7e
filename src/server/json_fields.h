// Private to server/: what the request parsers share — 400 errors, typed field access, a JSON
// subtree read in its declared key order, token strings.
#pragma once
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/json_depth.h"
#include "server/api_types.h"

namespace ss::server::detail {

using nlohmann::json;
// Responses keep their keys in insertion order, as OpenAI writes them (a completions top_logprobs
// dict most likely first); requests are parsed into json (std::map objects: an object with many
// keys parses in n log n, where ordered_json would compare every key with every other).
using ojson = nlohmann::ordered_json;

inline ApiError bad(std::string message, std::string param = {}, std::string code = {}) {
  ApiError e;
  e.status = 400;
  e.message = std::move(message);
  e.param = std::move(param);
  e.code = std::move(code);
  return e;
}

inline const char* type_name(const json& j) {
  switch (j.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "an integer";
    case json::value_t::number_float: return "a number";
    case json::value_t::string: return "a string";
    case json::value_t::array: return "an array";
    case json::value_t::object: return "an object";
    default: return "an unsupported value";
  }
}

inline std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", v);
  return b;
}

// Field access with type checks; the first failure is kept and later calls do nothing.
class Fields {
 public:
  explicit Fields(const json& obj) : obj_(obj) {}
  bool failed() const { return err_.has_value(); }
  ApiError error() const { return *err_; }
  void fail(ApiError e) {
    if (!err_) err_ = std::move(e);
  }

  // The field, or nullptr when absent or null (null means "default" for every optional field).
  const json* get(const char* name) const {
    auto it = obj_.find(name);
    if (it == obj_.end() || it->is_null()) return nullptr;
    return &*it;
  }
  bool has(const char* name) const { return get(name) != nullptr; }

  void boolean(const char* name, bool& out) {
    const json* j = get(name);
    if (!j || failed()) return;
    if (!j->is_boolean()) return fail(bad(std::string("'") + name + "' must be a boolean, got " + type_name(*j), name));
    out = j->get<bool>();
  }

  // Integers only: 2.0 and 2.5 are rejected alike (a float where an integer belongs is a client bug).
  template <class I>
  void integer(const char* name, I& out, int64_t lo, int64_t hi) {
    const json* j = get(name);
    if (!j || failed()) return;
    int64_t v = 0;
    if (!parse_int(*j, v)) {
      return fail(bad(std::string("'") + name + "' must be an integer, got " + type_name(*j) +
                          (j->is_number_float() ? " (" + num(j->get<double>()) + ")" : ""),
                      name));
    }
    if (v < lo || v > hi)
      return fail(bad(std::string("'") + name + "' must be between " + std::to_string(lo) + " and " +
                          std::to_string(hi) + ", got " + std::to_string(v),
                      name));
    out = static_cast<I>(v);
  }

  void number(const char* name, float& out, double lo, double hi, bool lo_open = false) {
    const json* j = get(name);
    if (!j || failed()) return;
    if (!j->is_number()) return fail(bad(std::string("'") + name + "' must be a number, got " + type_name(*j), name));
    const double v = j->get<double>();
    if (!std::isfinite(v) || v < lo || v > hi || (lo_open && v == lo))
      return fail(bad(std::string("'") + name + "' must be in " + (lo_open ? "(" : "[") + num(lo) + ", " + num(hi) +
                          "], got " + num(v),
                      name));
    out = static_cast<float>(v);
  }

  static bool parse_int(const json& j, int64_t& v) {
    if (j.is_number_unsigned()) {
      const uint64_t u = j.get<uint64_t>();
      v = u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ? std::numeric_limits<int64_t>::max()
                                                                          : static_cast<int64_t>(u);
      return true;
    }
    if (j.is_number_integer()) {
      v = j.get<int64_t>();
      return true;
    }
    return false;
  }

 private:
  const json& obj_;
  std::optional<ApiError> err_;
};

// The value at `path` (object keys from the root) of a JSON text, as ordered_json (key order kept),
// everything else skipped; nullopt when the path is missing, an object there has more than
// kMaxSchemaKeys keys (ordered_json inserts in linear time: a huge object would take quadratic time)
// or it nests deeper than kMaxJsonDepth (serializing, compiling and printing it recurse per
// level: a 200,000-deep array inside a schema or a tool overflowed the stack and killed the server).
inline constexpr size_t kMaxSchemaKeys = 2048;
class OrderedSubtree final : public nlohmann::json_sax<ojson> {
 public:
  explicit OrderedSubtree(std::vector<std::string> path) : path_(std::move(path)) {}
  std::optional<ojson> result;
  bool too_many_keys = false;
  bool too_deep = false;

  bool null() override { return value(ojson(nullptr)); }
  bool boolean(bool v) override { return value(ojson(v)); }
  bool number_integer(number_integer_t v) override { return value(ojson(v)); }
  bool number_unsigned(number_unsigned_t v) override { return value(ojson(v)); }
  bool number_float(number_float_t v, const string_t&) override { return value(ojson(v)); }
  bool string(string_t& v) override { return value(ojson(std::move(v))); }
  bool binary(binary_t&) override { return false; }
  bool start_object(std::size_t) override { return open(ojson::object(), true); }
  bool start_array(std::size_t) override { return open(ojson::array(), false); }
  bool key(string_t& k) override {
    if (!build_.empty()) key_ = k;
    else frames_.back().key = k;
    return true;
  }
  bool end_object() override { return close(); }
  bool end_array() override { return close(); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }

 private:
  struct Frame {
    bool object, on_path;
    std::string key;
  };
  // Does a value starting now sit at the path (or, for containers, on a prefix of it)?
  bool here(size_t depth) const {
    if (frames_.empty()) return depth == 0;
    const Frame& f = frames_.back();
    return f.object && f.on_path && depth >= 1 && depth <= path_.size() && f.key == path_[depth - 1];
  }
  bool at_target() const { return here(path_.size()) && frames_.size() == path_.size(); }
  bool insert(ojson v, ojson** where) {
    ojson& parent = *build_.back();
    if (parent.is_array()) {
      parent.push_back(std::move(v));
      if (where) *where = &parent.back();
      return true;
    }
    if (parent.size() >= kMaxSchemaKeys && !parent.contains(key_)) {
      too_many_keys = true;
      return false;
    }
    ojson& slot = parent[key_];
    slot = std::move(v);
    if (where) *where = &slot;
    return true;
  }
  bool value(ojson v) {
    if (!build_.empty()) return insert(std::move(v), nullptr);
    if (at_target()) result = std::move(v);
    return true;
  }
  bool open(ojson container, bool object) {
    if (build_.size() >= kMaxJsonDepth) {
      too_deep = true;
      return false;
    }
    if (!build_.empty()) {
      ojson* child = nullptr;
      if (!insert(std::move(container), &child)) return false;
      build_.push_back(child);
    } else if (at_target()) {
      result = std::move(container);
      build_.push_back(&*result);
    } else {
      frames_.push_back({object, here(frames_.size()), {}});
    }
    return true;
  }
  bool close() {
    if (!build_.empty()) build_.pop_back();
    else frames_.pop_back();
    return true;
  }

  std::vector<std::string> path_;
  std::vector<Frame> frames_;  // containers around the path, outside the captured value
  std::vector<ojson*> build_;  // containers of the captured value, innermost last
  std::string key_;
};

inline std::string token_str(const ModelInfo& m, int32_t id) { return m.tokenizer->token_to_piece(id); }

inline ojson tokens_json(const std::vector<int32_t>& ids) {
  ojson a = ojson::array();
  for (int32_t id : ids) a.push_back(id);
  return a;
}

// The body as a JSON object, or a 400 that says where and why it fails to parse.
ApiResult<json> parse_object(std::string_view body);

}  // namespace ss::server::detail
