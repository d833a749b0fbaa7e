#include "server/openai_api.h"

#include "engine/json_schema.h"
#include "engine/gbnf.h"
#include "engine/regex.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <set>

namespace ss::server {

using nlohmann::json;
// Responses keep their keys in insertion order, as OpenAI writes them (a completions top_logprobs
// dict most likely first); requests are parsed into json (std::map objects: an object with many
// keys parses in n log n, where ordered_json would compare every key with every other).
using ojson = nlohmann::ordered_json;

namespace {

ApiError bad(std::string message, std::string param = {}, std::string code = {}) {
  ApiError e;
  e.status = 400;
  e.message = std::move(message);
  e.param = std::move(param);
  e.code = std::move(code);
  return e;
}

const char* type_name(const json& j) {
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

std::string num(double v) {
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

// Only for the message of a body that failed to parse: where and why, without exceptions.
struct ErrorSax : nlohmann::json_sax<json> {
  std::string message;
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return true; }
  bool key(string_t&) override { return true; }
  bool end_object() override { return true; }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& ex) override {
    message = ex.what();
    return false;
  }
};

ApiResult<json> parse_object(std::string_view body) {
  json j = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    ErrorSax sax;
    (void)json::sax_parse(body.begin(), body.end(), &sax);
    return bad(sax.message.empty() ? std::string("invalid JSON") : "invalid JSON: " + sax.message, {}, "invalid_json");
  }
  if (!j.is_object()) return bad(std::string("the request body must be a JSON object, got ") + type_name(j));
  return j;
}

std::optional<ApiError> check_model(const Fields& f, const ModelInfo& m) {
  const json* j = f.get("model");
  if (!j) return std::nullopt;  // optional: one model is served
  if (!j->is_string()) return bad(std::string("'model' must be a string, got ") + type_name(*j), "model");
  const std::string& name = j->get_ref<const std::string&>();
  if (name.empty() || name == m.id) return std::nullopt;
  ApiError e;
  e.status = 404;
  e.message = "The model '" + name + "' does not exist; this server serves '" + m.id + "'.";
  e.param = "model";
  e.code = "model_not_found";
  return e;
}

std::optional<ApiError> check_ids(const std::vector<int32_t>& ids, const ModelInfo& m, const char* param) {
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= m.vocab_size)
      return bad("token id " + std::to_string(ids[i]) + " at position " + std::to_string(i) +
                     " is outside the vocabulary [0, " + std::to_string(m.vocab_size) + ")",
                 param);
  return std::nullopt;
}

// A JSON array of integer token ids (each in int32 range; the vocabulary check comes later).
bool parse_id_array(const json& a, std::vector<int32_t>& out) {
  out.clear();
  out.reserve(a.size());
  for (const json& x : a) {
    int64_t v = 0;
    if (!Fields::parse_int(x, v)) return false;
    out.push_back(v < INT32_MIN || v > INT32_MAX ? -1 : static_cast<int32_t>(v));
  }
  return true;
}

std::vector<int32_t> encode_text(const tok::Tokenizer& tk, const std::string& text, bool add_special) {
  return tk.encode(text, add_special, /*parse_special=*/true);
}

// Messages -> rendered chat text -> ids. prompt_text receives the rendered text.
std::optional<ApiError> render_messages(const json& msgs, bool add_generation_prompt, const ModelInfo& m,
                                         std::vector<int32_t>& ids, std::string& text, std::string_view tools_json = {}) {
  const bool native_calls = tok::tool_format(m.chat_template) != tok::ToolFormat::None;
  if (!msgs.is_array()) return bad(std::string("'messages' must be an array, got ") + type_name(msgs), "messages");
  if (msgs.empty()) return bad("'messages' must contain at least one message", "messages");
  std::vector<tok::ChatMessage> conv;
  conv.reserve(msgs.size());
  for (size_t i = 0; i < msgs.size(); ++i) {
    const json& msg = msgs[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!msg.is_object()) return bad(where + " must be an object, got " + type_name(msg), where);
    auto r = msg.find("role");
    if (r == msg.end() || !r->is_string()) return bad(where + ".role must be a string", where + ".role");
    std::string role = r->get<std::string>();
    if (role == "developer") role = "system";
    if (role != "system" && role != "user" && role != "assistant" && role != "tool")
      return bad(where + ".role must be one of system, developer, user, assistant, tool; got '" + role + "'",
                 where + ".role");
    std::string content;
    std::vector<tok::ChatToolCall> calls;
    auto c = msg.find("content");
    // An assistant turn that called tools: in the template's own format when it has one, else as the
    // text tool_choice "required" generates, so the model sees what it asked for before the answers.
    if (auto tc = msg.find("tool_calls"); role == "assistant" && tc != msg.end() && !tc->is_null()) {
      if (!tc->is_array()) return bad(where + ".tool_calls must be an array", where + ".tool_calls");
      for (const json& call : *tc) {
        const json fn = call.is_object() ? call.value("function", json()) : json();
        if (!fn.is_object() || !fn.value("name", json()).is_string() || !fn.value("arguments", json()).is_string())
          return bad(where + ".tool_calls[]: each needs function.name and function.arguments (strings)", where + ".tool_calls");
        if (!json::accept(fn["arguments"].get_ref<const std::string&>()))
          return bad(where + ".tool_calls[]: function.arguments must be a JSON text", where + ".tool_calls");
        if (tok::json_max_depth(fn["arguments"].get_ref<const std::string&>()) > tok::kMaxJsonDepth)
          return bad(where + ".tool_calls[]: function.arguments nests deeper than " +
                         std::to_string(tok::kMaxJsonDepth) + " levels",
                     where + ".tool_calls");
        calls.push_back({fn["name"].get<std::string>(), fn["arguments"].get<std::string>()});
      }
    }
    if (c == msg.end() || c->is_null()) {
      if (role != "assistant") return bad(where + ".content is required", where + ".content");
    } else if (c->is_string()) {
      content = c->get<std::string>();
    } else if (c->is_array()) {
      for (size_t k = 0; k < c->size(); ++k) {
        const json& part = (*c)[k];
        const std::string pw = where + ".content[" + std::to_string(k) + "]";
        if (!part.is_object()) return bad(pw + " must be an object", pw);
        auto t = part.find("type");
        if (t == part.end() || !t->is_string()) return bad(pw + ".type must be a string", pw + ".type");
        if (*t != "text") return bad(pw + ": only text content is supported, got type '" + t->get<std::string>() + "'", pw);
        auto tx = part.find("text");
        if (tx == part.end() || !tx->is_string()) return bad(pw + ".text must be a string", pw + ".text");
        if (k) content += "\n";
        content += tx->get<std::string>();
      }
    } else {
      return bad(where + ".content must be a string or an array of text parts, got " + type_name(*c),
                 where + ".content");
    }
    if (!calls.empty() && !native_calls) {
      ojson arr = ojson::array();
      for (const tok::ChatToolCall& k : calls)
        arr.push_back(ojson{{"name", k.name}, {"parameters", ojson::parse(k.arguments)}});
      content += content.empty() ? arr.dump() : "\n" + arr.dump();
      calls.clear();
    }
    conv.push_back({std::move(role), std::move(content), std::move(calls)});
  }
  const tok::Tokenizer& tk = *m.tokenizer;
  auto rendered = tok::render_chat(m.chat_template, conv, add_generation_prompt, &tk, {}, tools_json);
  if (!rendered.ok()) return bad("cannot apply the chat template: " + rendered.message(), "messages");
  text = std::move(rendered).value();
  // A template that already begins with the BOS text must not get a second BOS.
  bool add_special = tk.add_bos();
  if (tk.bos_id() >= 0 && text.rfind(std::string(tk.token_text(tk.bos_id())), 0) == 0) add_special = false;
  ids = encode_text(tk, text, add_special);
  return std::nullopt;
}

std::optional<ApiError> parse_prompt(const json& p, const ModelInfo& m, std::vector<PromptInput>& out) {
  const tok::Tokenizer& tk = *m.tokenizer;
  auto from_text = [&](const std::string& s) -> std::optional<ApiError> {
    if (s.empty()) return bad("the prompt is empty", "prompt");
    out.push_back({encode_text(tk, s, tk.add_bos()), s});
    if (out.back().ids.empty()) return bad("the prompt is empty after tokenization", "prompt");
    return std::nullopt;
  };
  auto from_ids = [&](const json& a) -> std::optional<ApiError> {
    PromptInput in;
    if (!parse_id_array(a, in.ids)) return bad("'prompt' token arrays must hold integers only", "prompt");
    if (in.ids.empty()) return bad("the prompt is empty", "prompt");
    if (auto e = check_ids(in.ids, m, "prompt")) return e;
    in.text = tk.decode(in.ids, false);
    out.push_back(std::move(in));
    return std::nullopt;
  };
  if (p.is_string()) return from_text(p.get_ref<const std::string&>());
  if (!p.is_array())
    return bad(std::string("'prompt' must be a string, an array of strings or an array of token ids; got ") +
                   type_name(p),
               "prompt");
  if (p.empty()) return bad("the prompt is empty", "prompt");
  const json& first = p.front();
  if (first.is_number()) return from_ids(p);
  if (p.size() > static_cast<size_t>(m.max_choices))
    return bad("at most " + std::to_string(m.max_choices) + " prompts per request, got " + std::to_string(p.size()),
               "prompt");
  for (const json& x : p) {
    std::optional<ApiError> e;
    if (x.is_string() && first.is_string()) e = from_text(x.get_ref<const std::string&>());
    else if (x.is_array() && first.is_array()) e = from_ids(x);
    else return bad("'prompt' arrays must hold only strings, only token ids, or only arrays of token ids", "prompt");
    if (e) return e;
  }
  return std::nullopt;
}

std::optional<ApiError> parse_stop(const json* j, const ModelInfo& m, std::vector<std::string>& out) {
  if (!j) return std::nullopt;
  auto add = [&](const json& s) -> std::optional<ApiError> {
    if (!s.is_string()) return bad("'stop' must be a string or an array of strings", "stop");
    const std::string& v = s.get_ref<const std::string&>();
    if (v.size() > m.max_stop_bytes)
      return bad("stop strings are limited to " + std::to_string(m.max_stop_bytes) + " bytes", "stop");
    if (!v.empty()) out.push_back(v);
    return std::nullopt;
  };
  if (j->is_string()) return add(*j);
  if (!j->is_array()) return bad(std::string("'stop' must be a string or an array of strings, got ") + type_name(*j), "stop");
  if (j->size() > static_cast<size_t>(m.max_stop))
    return bad("at most " + std::to_string(m.max_stop) + " stop strings, got " + std::to_string(j->size()), "stop");
  for (const json& s : *j)
    if (auto e = add(s)) return e;
  return std::nullopt;
}

// {"<token id>": bias in [-100, 100], ...}: OpenAI's logit_bias. Keys are decimal token ids of the
// vocabulary; one id spelled twice ("7" and "07") is rejected rather than resolved by key order.
std::optional<ApiError> parse_logit_bias(const json& j, const ModelInfo& m, std::vector<std::pair<int32_t, float>>& out) {
  if (!j.is_object()) return bad(std::string("'logit_bias' must be an object, got ") + type_name(j), "logit_bias");
  std::map<int32_t, float> bias;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& key = it.key();
    int64_t id = 0;
    bool digits = !key.empty() && key.size() <= 10;  // 10 digits cannot overflow int64
    for (size_t i = 0; digits && i < key.size(); ++i) {
      if (key[i] < '0' || key[i] > '9') digits = false;
      else id = id * 10 + (key[i] - '0');
    }
    if (!digits) return bad("'logit_bias' keys must be token ids (decimal integers), got '" + key + "'", "logit_bias");
    if (id >= m.vocab_size)
      return bad("logit_bias token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                     std::to_string(m.vocab_size) + ")",
                 "logit_bias");
    const json& v = it.value();
    if (!v.is_number())
      return bad("'logit_bias' values must be numbers, got " + std::string(type_name(v)) + " for token " + key,
                 "logit_bias");
    const double b = v.get<double>();
    if (!std::isfinite(b) || b < -100.0 || b > 100.0)
      return bad("'logit_bias' values must be in [-100, 100], got " + num(b) + " for token " + key, "logit_bias");
    if (!bias.emplace(static_cast<int32_t>(id), static_cast<float>(b)).second)
      return bad("logit_bias names token " + std::to_string(id) + " twice", "logit_bias");
  }
  out.assign(bias.begin(), bias.end());
  return std::nullopt;
}

std::string context_message(const ModelInfo& m, size_t prompt, int64_t max_tokens, bool chat) {
  const char* what = chat ? "messages" : "prompt";
  if (max_tokens <= 0)
    return "This model's maximum context length is " + std::to_string(m.max_model_len) +
           " tokens. However, your " + what + " has " + std::to_string(prompt) +
           " tokens, which leaves no room for a completion. Please reduce the length of the " + what + ".";
  return "This model's maximum context length is " + std::to_string(m.max_model_len) +
         " tokens. However, you requested " + std::to_string(static_cast<int64_t>(prompt) + max_tokens) + " tokens (" +
         std::to_string(prompt) + " in the " + what + ", " + std::to_string(max_tokens) +
         " for the completion). Please reduce the length of the " + what + " or the completion.";
}

// The value at `path` (object keys from the root) of a JSON text, as ordered_json (key order kept),
// everything else skipped; nullopt when the path is missing, an object there has more than
// kMaxSchemaKeys keys (ordered_json inserts in linear time: a huge object would take quadratic time)
// or it nests deeper than tok::kMaxJsonDepth (serializing, compiling and printing it recurse per
// level: a 200,000-deep array inside a schema or a tool overflowed the stack and killed the server).
constexpr size_t kMaxSchemaKeys = 2048;
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
    if (build_.size() >= tok::kMaxJsonDepth) {
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

// Structured outputs: OpenAI's response_format (text, json_object, json_schema), vLLM's
// structured_outputs (json, regex, choice, grammar, json_object) or older guided_json /
// guided_regex / guided_choice / guided_grammar, llama.cpp's grammar / json_schema; at most one. Schemas are read again from the body as
// ordered_json so their properties keep the declared order (the generation order).
std::optional<ApiError> parse_structured(const Fields& f, std::string_view body, const ModelInfo& m,
                                         GenerationRequest& g) {
  // What was asked for: the parameter, a cache key, and how to build the grammar (only on a miss).
  std::string param, key;
  std::function<Expected<engine::Grammar>()> build;
  // The schema again, from the text, with its key order (the request was parsed into std::map objects).
  std::optional<ApiError> order_error;
  auto ordered = [&](std::string_view text, std::vector<std::string> path, const char* name) -> ojson {
    OrderedSubtree sax(std::move(path));
    const bool parsed = ojson::sax_parse(text, &sax);
    if (!parsed || !sax.result || sax.too_many_keys || sax.too_deep) {
      order_error = bad(std::string("'") + name + "': " +
                            (sax.too_deep ? "it nests deeper than " + std::to_string(tok::kMaxJsonDepth) + " levels"
                             : sax.too_many_keys ? "an object in the schema has more than " + std::to_string(kMaxSchemaKeys) + " keys"
                                               : std::string("the schema is not valid JSON")),
                        name);
      return ojson::object();
    }
    return std::move(*sax.result);
  };
  auto take = [&](const char* name, std::string k, std::function<Expected<engine::Grammar>()> b) -> std::optional<ApiError> {
    if (build)
      return bad(std::string("'") + name + "' cannot be combined with '" + param + "': give one structured-output constraint",
                 name);
    param = name;
    key = std::move(k);
    build = std::move(b);
    return std::nullopt;
  };
  auto schema = [](ojson s, bool compact = false) {
    return [s = std::move(s), compact] { return engine::json_schema_grammar(s, {.compact = compact}); };
  };
  // OpenAI tools (chat): tool_choice "required" or a named function is kept inside a grammar, as vLLM
  // does without a tool-call parser; "none" ignores the tools. "auto" (the default with tools) lets the
  // model choose between text and calls in its own format, which needs a parser per model family:
  // not here yet, so it is a 400 (as vLLM's without --enable-auto-tool-choice), never ignored.
  if (g.endpoint == Endpoint::ChatCompletions) {
    const json* tools = f.get("tools");
    bool parallel = true;
    if (const json* p = f.get("parallel_tool_calls")) {
      if (!p->is_boolean()) return bad("'parallel_tool_calls' must be a boolean", "parallel_tool_calls");
      parallel = p->get<bool>();
    }
    g.parallel_tool_calls = parallel;
    std::string mode = tools ? "auto" : "none", named;
    if (const json* tc = f.get("tool_choice")) {
      if (tc->is_string() && (*tc == "none" || *tc == "auto" || *tc == "required")) {
        mode = tc->get<std::string>();
      } else if (tc->is_object() && tc->value("type", json()) == "function" && tc->contains("function") &&
                 (*tc)["function"].is_object() && (*tc)["function"].value("name", json()).is_string()) {
        mode = "named";
        named = (*tc)["function"]["name"].get<std::string>();
      } else {
        return bad("'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": "
                   "{\"name\": ...}}",
                   "tool_choice");
      }
    }
    if (!tools && mode != "none") return bad("'tool_choice' needs 'tools'", "tool_choice");
    if (tools) {
      if (!tools->is_array() || tools->empty()) return bad("'tools' must be a non-empty array of tools", "tools");
      std::set<std::string> names;
      for (size_t i = 0; i < tools->size(); ++i) {
        const json& t = (*tools)[i];
        const std::string where = "tools[" + std::to_string(i) + "]";
        if (!t.is_object() || t.value("type", json()) != "function" || !t.contains("function") || !t["function"].is_object())
          return bad(where + " must be {\"type\": \"function\", \"function\": {...}}", "tools");
        const json& fn = t["function"];
        const json name = fn.value("name", json());
        const bool name_ok = name.is_string() && !name.get_ref<const std::string&>().empty() &&
                             name.get_ref<const std::string&>().size() <= 64 &&
                             std::all_of(name.get_ref<const std::string&>().begin(), name.get_ref<const std::string&>().end(),
                                         [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-'; });
        if (!name_ok) return bad(where + ".function.name must be 1-64 letters, digits, '_' or '-'", "tools");
        if (!names.insert(name.get<std::string>()).second)
          return bad(where + ".function.name '" + name.get<std::string>() + "' is given twice", "tools");
        if (fn.contains("parameters") && !fn["parameters"].is_null() && !fn["parameters"].is_object())
          return bad(where + ".function.parameters must be a JSON Schema object", "tools");
      }
      if (mode == "auto") {
        // The model chooses between text and calls in its own format; the calls are parsed afterwards.
        g.tool_format = tok::tool_format(m.chat_template);
        if (g.tool_format == tok::ToolFormat::None)
          return bad("tool_choice \"auto\" needs a chat template with a tool-call format (Qwen2.5's <tool_call>, "
                     "Llama 3.1+'s JSON calls); this model's has none: use \"required\", a named function, or \"none\"",
                     "tool_choice", "unsupported_parameter");
        g.tool_choice = GenerationRequest::ToolChoice::Auto;
      }
      if (mode != "none") {
        // The tools again with their key order (parameters are generated in the declared order, and
        // the chat template writes them as given).
        const ojson tools_o = ordered(body, {"tools"}, "tools");
        if (order_error) return order_error;
        g.tools_json = tools_o.dump();
        std::vector<engine::ToolSchema> specs;
        for (const ojson& t : tools_o) {  // the same tools as validated above, read a second time
          const ojson fn = t.is_object() ? t.value("function", ojson()) : ojson();
          if (!fn.is_object() || !fn.value("name", ojson()).is_string()) return bad("'tools' changed on a second read", "tools");
          auto p = fn.find("parameters");
          specs.push_back({fn["name"].get<std::string>(),
                           p != fn.end() && !p->is_null() ? *p : ojson{{"type", "object"}, {"properties", ojson::object()},
                                                                       {"additionalProperties", false}}});
        }
        if (mode == "auto") {
          // no grammar: text or calls, as the model likes
        } else if (mode == "named") {
          auto it = std::find_if(specs.begin(), specs.end(), [&](const engine::ToolSchema& t) { return t.name == named; });
          if (it == specs.end()) return bad("tool_choice names '" + named + "', which is not in 'tools'", "tool_choice");
          g.tool_choice = GenerationRequest::ToolChoice::Named;
          g.tool_name = named;
          // Compact: arguments are data, and a small model otherwise pads them with newlines.
          std::string k = "schema-compact " + it->parameters.dump();
          if (auto e = take("tool_choice", std::move(k), schema(it->parameters, true))) return e;
        } else {
          g.tool_choice = GenerationRequest::ToolChoice::Required;
          ojson key = ojson::array();
          for (const auto& t : specs) key.push_back({t.name, t.parameters});
          std::string k = std::string("tools-compact ") + (parallel ? "parallel " : "single ") + key.dump();
          if (auto e = take("tool_choice", std::move(k),
                            [specs, parallel] { return engine::tool_calls_grammar(specs, parallel, {.compact = true}); }))
            return e;
        }
      }
    }
  }
  if (const json* rf = f.get("response_format")) {
    auto t = rf->is_object() ? rf->find("type") : rf->end();
    if (!rf->is_object() || t == rf->end() || !t->is_string())
      return bad("'response_format' must be an object with a 'type'", "response_format");
    const std::string& type = t->get_ref<const std::string&>();
    if (type == "json_object") {
      if (auto e = take("response_format", "object", [] { return Expected<engine::Grammar>(engine::json_object_grammar()); }))
        return e;
    } else if (type == "json_schema") {
      auto js = rf->find("json_schema");
      if (js == rf->end() || !js->is_object())
        return bad("response_format 'json_schema' needs a 'json_schema' object with a 'schema'", "response_format");
      auto sc = js->find("schema");
      if (sc == js->end() || !(sc->is_object() || sc->is_boolean()))
        return bad("'response_format.json_schema.schema' must be a JSON Schema object", "response_format");
      ojson sc_o = ordered(body, {"response_format", "json_schema", "schema"}, "response_format");
      if (order_error) return order_error;
      std::string k = "schema " + sc_o.dump();
      if (auto e = take("response_format", std::move(k), schema(std::move(sc_o)))) return e;
    } else if (type != "text") {
      return bad("response_format '" + type + "' is not supported (text, json_object, json_schema)", "response_format",
                 "unsupported_parameter");
    }
  }
  // A JSON Schema given as an object (read again with its key order from `path` in the body) or as a
  // string (vLLM accepts both).
  auto json_value = [&](const json& v, std::vector<std::string> path, const char* name,
                        bool compact = false) -> std::optional<ApiError> {
    if (!(v.is_string() || v.is_object() || v.is_boolean()))
      return bad(std::string("'") + name + "' must be a JSON Schema (object or string), got " + type_name(v), name);
    ojson sc_o = v.is_string() ? ordered(v.get_ref<const std::string&>(), {}, name) : ordered(body, std::move(path), name);
    if (order_error) return order_error;
    std::string k = (compact ? "schema-compact " : "schema ") + sc_o.dump();
    return take(name, std::move(k), schema(std::move(sc_o), compact));
  };
  auto choice = [&](const json& v, const char* name) -> std::optional<ApiError> {
    std::vector<std::string> choices;
    if (v.is_array())
      for (const json& c : v)
        if (c.is_string()) choices.push_back(c.get<std::string>());
    if (!v.is_array() || choices.size() != v.size() || choices.empty())
      return bad(std::string("'") + name + "' must be a non-empty array of strings", name);
    std::string k = "choice " + json(choices).dump();
    return take(name, std::move(k), [choices] { return engine::choice_grammar(choices); });
  };
  auto regex = [&](const json& v, const char* name) -> std::optional<ApiError> {
    if (!v.is_string()) return bad(std::string("'") + name + "' must be a string (a regular expression)", name);
    std::string p = v.get<std::string>();
    return take(name, "regex " + p, [p] { return engine::regex_grammar(p); });
  };
  auto grammar = [&](const json& v, const char* name) -> std::optional<ApiError> {
    if (!v.is_string()) return bad(std::string("'") + name + "' must be a string (a GBNF grammar)", name);
    std::string t = v.get<std::string>();
    return take(name, "gbnf " + t, [t] { return engine::gbnf_grammar(t); });
  };
  // llama.cpp's server fields: a GBNF grammar, a JSON Schema.
  if (const json* v = f.get("grammar"); v && !(v->is_string() && v->get_ref<const std::string&>().empty()))
    if (auto e = grammar(*v, "grammar")) return e;  // "" is no grammar, as llama.cpp reads it
  if (const json* v = f.get("json_schema"))
    if (auto e = json_value(*v, {"json_schema"}, "json_schema")) return e;
  // vLLM's guided_* fields (before v0.12) and its structured_outputs object (since).
  if (const json* v = f.get("guided_json"))
    if (auto e = json_value(*v, {"guided_json"}, "guided_json")) return e;
  if (const json* v = f.get("guided_choice"))
    if (auto e = choice(*v, "guided_choice")) return e;
  if (const json* v = f.get("guided_regex"))
    if (auto e = regex(*v, "guided_regex")) return e;
  if (const json* v = f.get("guided_grammar"))
    if (auto e = grammar(*v, "guided_grammar")) return e;
  if (const json* so = f.get("structured_outputs")) {
    if (!so->is_object()) return bad("'structured_outputs' must be an object", "structured_outputs");
    // vLLM's disable_any_whitespace: JSON without blanks between tokens.
    bool compact = false;
    if (auto d = so->find("disable_any_whitespace"); d != so->end() && !d->is_null()) {
      if (!d->is_boolean())
        return bad("'structured_outputs.disable_any_whitespace' must be a boolean", "structured_outputs.disable_any_whitespace");
      compact = d->get<bool>();
    }
    for (const auto& [k, v] : so->items()) {
      if (v.is_null()) continue;
      std::optional<ApiError> e;
      if (k == "disable_any_whitespace") continue;  // read above
      if (k == "json") e = json_value(v, {"structured_outputs", "json"}, "structured_outputs.json", compact);
      else if (k == "regex") e = regex(v, "structured_outputs.regex");
      else if (k == "choice") e = choice(v, "structured_outputs.choice");
      else if (k == "grammar") e = grammar(v, "structured_outputs.grammar");
      else if (k == "json_object") {
        if (!v.is_boolean()) e = bad("'structured_outputs.json_object' must be a boolean", "structured_outputs.json_object");
        else if (v.get<bool>())
          e = take("structured_outputs.json_object", compact ? "object-compact" : "object",
                   [compact] { return Expected<engine::Grammar>(engine::json_object_grammar({.compact = compact})); });
      } else if (k == "disable_fallback" || k == "disable_additional_properties") {
        // No fallback backend to disable; undeclared properties are already refused unless the
        // schema's additionalProperties asks for them.
        if (!v.is_boolean()) e = bad("'structured_outputs." + k + "' must be a boolean", "structured_outputs." + k);
      } else {
        e = bad("'structured_outputs." + k + "' is not supported (json, regex, choice, grammar and json_object are)",
                "structured_outputs." + k, "unsupported_parameter");
      }
      if (e) return e;
    }
    if (!build)
      return bad("'structured_outputs' names no constraint (json, regex, choice, grammar or json_object)", "structured_outputs");
  }
  if (!build) return std::nullopt;
  // Requests with the same schema share one compiled grammar and its per-state masks.
  const bool cacheable = m.grammar_cache && key.size() <= 64 * 1024;  // the cache holds its keys
  if (cacheable)
    if (auto hit = m.grammar_cache->find(key)) {
      g.grammar = std::move(hit);
      return std::nullopt;
    }
  Expected<engine::Grammar> gr = build();
  if (!gr.ok()) return bad(param + ": " + gr.message(), param);
  auto trie = m.vocab_trie ? m.vocab_trie : engine::TokenTrie::build(*m.tokenizer);
  g.grammar = std::make_shared<const engine::CompiledGrammar>(std::move(gr).value(), std::move(trie));
  if (cacheable) m.grammar_cache->insert(key, g.grammar);
  return std::nullopt;
}

ApiResult<GenerationRequest> parse_generation_impl(Endpoint ep, std::string_view body, const ModelInfo& m) {
  const bool chat = ep == Endpoint::ChatCompletions;
  auto parsed = parse_object(body);
  if (!parsed.ok()) return parsed.error();
  const json& j = parsed.value();
  Fields f(j);
  if (auto e = check_model(f, m)) return *e;

  GenerationRequest g;
  g.endpoint = ep;
  // Sampling. OpenAI's ranges where the engine has none; top_k -1 means off (vLLM).
  f.number("temperature", g.sampling.temperature, 0.0, 100.0);
  f.number("top_p", g.sampling.top_p, 0.0, 1.0, /*lo_open=*/true);
  int top_k = 0;
  f.integer("top_k", top_k, -1, std::numeric_limits<int32_t>::max());
  g.sampling.top_k = top_k < 0 ? 0 : top_k;
  f.number("min_p", g.sampling.min_p, 0.0, 1.0);
  f.number("presence_penalty", g.sampling.presence_penalty, -2.0, 2.0);
  f.number("frequency_penalty", g.sampling.frequency_penalty, -2.0, 2.0);
  f.number("repetition_penalty", g.sampling.repetition_penalty, 0.0, 100.0, /*lo_open=*/true);
  if (const json* s = f.get("seed"); s && !f.failed()) {
    int64_t v = 0;
    if (s->is_number_unsigned()) g.seed = s->get<uint64_t>();
    else if (Fields::parse_int(*s, v)) g.seed = static_cast<uint64_t>(v);
    else f.fail(bad(std::string("'seed' must be an integer, got ") + type_name(*s), "seed"));
  }
  f.integer("n", g.n, 1, m.max_choices);
  if (const json* b = f.get("best_of"); b && !f.failed()) {
    int64_t v = 0;
    if (!Fields::parse_int(*b, v)) f.fail(bad(std::string("'best_of' must be an integer, got ") + type_name(*b), "best_of"));
    else if (v != g.n && v != 1) f.fail(bad("best_of other than n is not supported", "best_of", "unsupported_parameter"));
  }
  f.boolean("stream", g.stream);
  if (const json* so = f.get("stream_options"); so && !f.failed()) {
    if (!so->is_object()) {
      f.fail(bad(std::string("'stream_options' must be an object, got ") + type_name(*so), "stream_options"));
    } else {
      Fields sf(*so);
      sf.boolean("include_usage", g.include_usage);
      sf.boolean("continuous_usage_stats", g.continuous_usage_stats);
      if (sf.failed()) f.fail(sf.error());
    }
  }
  f.boolean("ignore_eos", g.ignore_eos);
  f.boolean("return_tokens_as_token_ids", g.return_tokens_as_token_ids);
  f.integer("min_tokens", g.min_tokens, 0, std::numeric_limits<int32_t>::max());
  f.boolean("include_stop_str_in_output", g.include_stop_str_in_output);
  f.boolean("skip_special_tokens", g.skip_special_tokens);
  if (const json* sti = f.get("stop_token_ids"); sti && !f.failed()) {
    if (!sti->is_array() || !parse_id_array(*sti, g.stop_token_ids))
      f.fail(bad("'stop_token_ids' must be an array of integers", "stop_token_ids"));
    else if (auto e = check_ids(g.stop_token_ids, m, "stop_token_ids"))
      f.fail(*e);
  }
  if (!f.failed())
    if (auto e = parse_stop(f.get("stop"), m, g.stop)) f.fail(*e);
  if (const json* t = f.get("timeout"); t && !f.failed()) {
    if (!t->is_number() || !(t->get<double>() > 0) || !std::isfinite(t->get<double>()))
      f.fail(bad("'timeout' must be a positive number of seconds", "timeout"));
    else
      g.timeout_s = t->get<double>();
  }
  if (const json* cs = f.get("cache_salt"); cs && !f.failed()) {
    if (!cs->is_string() || cs->get_ref<const std::string&>().empty())
      f.fail(bad(std::string("'cache_salt' must be a non-empty string, got ") +
                     (cs->is_string() ? "an empty string" : type_name(*cs)),
                 "cache_salt"));
    else
      g.cache_salt = cs->get<std::string>();
  }
  if (const json* lb = f.get("logit_bias"); lb && !f.failed())
    if (auto e = parse_logit_bias(*lb, m, g.sampling.logit_bias)) f.fail(*e);
  if (!f.failed())
    if (auto e = parse_structured(f, body, m, g)) f.fail(*e);

  // Lengths and logprobs differ between the two endpoints.
  int64_t max_tokens = -1;
  bool have_max = false;
  const char* max_param = "max_tokens";
  auto read_max = [&](const char* name) {
    if (!f.has(name) || f.failed()) return;
    f.integer(name, max_tokens, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max());
    if (f.failed()) return;
    have_max = true;
    max_param = name;
    if (max_tokens < 1) f.fail(bad(std::string("'") + name + "' must be at least 1, got " + std::to_string(max_tokens), name));
  };
  if (chat) {
    read_max("max_completion_tokens");
    if (!have_max) read_max("max_tokens");
    bool want = false;
    f.boolean("logprobs", want);
    int top = -1;
    f.integer("top_logprobs", top, 0, m.max_logprobs);
    if (!f.failed() && top >= 0 && !want)
      f.fail(bad("'top_logprobs' requires 'logprobs': true", "top_logprobs"));
    if (want) g.logprobs = std::max(top, 0);
  } else {
    read_max("max_tokens");
    if (const json* lp = f.get("logprobs"); lp && !f.failed()) {
      f.integer("logprobs", g.logprobs, 0, m.max_logprobs);
    }
    f.boolean("echo", g.echo);
    if (const json* sx = f.get("suffix"); sx && !f.failed()) {
      if (!sx->is_string()) f.fail(bad("'suffix' must be a string", "suffix"));
      else if (!sx->get_ref<const std::string&>().empty())
        f.fail(bad("suffix is not supported", "suffix", "unsupported_parameter"));
    }
  }
  if (f.failed()) return f.error();

  // The prompt(s).
  if (chat) {
    auto it = j.find("messages");
    if (it == j.end() || it->is_null()) return bad("'messages' is required", "messages");
    bool add_gen = true;
    f.boolean("add_generation_prompt", add_gen);
    if (f.failed()) return f.error();
    PromptInput in;
    if (auto e = render_messages(*it, add_gen, m, in.ids, in.text, g.tools_json)) return *e;
    if (in.ids.empty()) return bad("the prompt is empty", "messages");
    if (auto e = check_ids(in.ids, m, "messages")) return *e;
    g.prompts.push_back(std::move(in));
  } else {
    auto it = j.find("prompt");
    if (it == j.end() || it->is_null()) return bad("'prompt' is required", "prompt");
    if (auto e = parse_prompt(*it, m, g.prompts)) return *e;
  }
  if (g.num_choices() > m.max_choices)
    return bad("prompts x n must be at most " + std::to_string(m.max_choices) + ", got " +
                   std::to_string(g.num_choices()),
               "n");

  // Context: never truncate; say what does not fit.
  size_t longest = 0;
  for (const PromptInput& p : g.prompts) longest = std::max(longest, p.ids.size());
  const char* prompt_param = chat ? "messages" : "prompt";
  if (static_cast<int64_t>(longest) >= m.max_model_len)
    return bad(context_message(m, longest, 0, chat), prompt_param, "context_length_exceeded");
  const int64_t room = m.max_model_len - static_cast<int64_t>(longest);
  if (have_max) {
    if (max_tokens > room) return bad(context_message(m, longest, max_tokens, chat), max_param, "context_length_exceeded");
    g.max_tokens = static_cast<int>(max_tokens);
  } else {
    // OpenAI's defaults: 16 for completions, the rest of the context for chat.
    g.max_tokens = static_cast<int>(chat ? room : std::min<int64_t>(16, room));
  }
  if (g.min_tokens > g.max_tokens)
    return bad("'min_tokens' (" + std::to_string(g.min_tokens) + ") must not exceed max_tokens (" +
                   std::to_string(g.max_tokens) + ")",
               "min_tokens");
  if (auto st = g.sampling.validate(); !st.ok()) return bad(st.message());
  return g;
}

std::string token_str(const ModelInfo& m, int32_t id) { return m.tokenizer->token_to_piece(id); }
// A logprobs entry's token: its piece, or vLLM's "token_id:<id>" with return_tokens_as_token_ids
// (pieces that are not whole characters cannot be told apart as text).
std::string lp_token(const GenerationRequest& g, const ModelInfo& m, int32_t id) {
  return g.return_tokens_as_token_ids ? "token_id:" + std::to_string(id) : token_str(m, id);
}

ojson bytes_of(const std::string& s) {
  ojson a = ojson::array();
  for (unsigned char c : s) a.push_back(static_cast<int>(c));
  return a;
}

// Completions: {"tokens", "token_logprobs", "top_logprobs", "text_offset"}; echoed prompt tokens
// come first: the first with null logprobs (nothing precedes it), the others with prompt_lps (tokens
// 1 .. n-1) when given, else null.
ojson completion_logprobs(const GenerationRequest& g, const ModelInfo& m, const std::vector<TokenLogprob>& lps,
                          size_t text_offset, const std::vector<int32_t>* echo_ids,
                          const std::vector<TokenLogprob>* prompt_lps = nullptr) {
  ojson tokens = ojson::array(), lp = ojson::array(), top = ojson::array(), off = ojson::array();
  size_t pos = 0;
  auto add_offset = [&](int32_t id) {  // offsets count the text's bytes, whatever the token is shown as
    off.push_back(pos);
    pos += token_str(m, id).size();
  };
  auto add = [&](int32_t id, const TokenLogprob& t) {
    const std::string s = lp_token(g, m, id);
    tokens.push_back(s);
    lp.push_back(t.logprob);
    ojson d = ojson::object();
    for (const auto& [tid, v] : t.top) {
      const std::string ts = lp_token(g, m, tid);
      if (!d.contains(ts)) d[ts] = v;
    }
    if (!d.contains(s)) d[s] = t.logprob;  // the token itself is always listed (as vLLM does)
    top.push_back(std::move(d));
    add_offset(id);
  };
  if (echo_ids) {
    const bool scored = prompt_lps && prompt_lps->size() + 1 == echo_ids->size();
    for (size_t i = 0; i < echo_ids->size(); ++i) {
      const int32_t id = (*echo_ids)[i];
      if (scored && i > 0) {
        add(id, (*prompt_lps)[i - 1]);
        continue;
      }
      tokens.push_back(lp_token(g, m, id));
      lp.push_back(nullptr);
      top.push_back(nullptr);
      add_offset(id);
    }
  }
  pos = std::max(pos, text_offset);
  for (const TokenLogprob& t : lps) add(t.token, t);
  return ojson{{"tokens", tokens}, {"token_logprobs", lp}, {"top_logprobs", top}, {"text_offset", off}};
}

ojson chat_logprobs(const GenerationRequest& g, const ModelInfo& m, const std::vector<TokenLogprob>& lps) {
  ojson content = ojson::array();
  for (const TokenLogprob& t : lps) {
    const std::string s = lp_token(g, m, t.token);
    ojson top = ojson::array();
    for (const auto& [id, v] : t.top) {
      const std::string ts = lp_token(g, m, id);
      top.push_back(ojson{{"token", ts}, {"logprob", v}, {"bytes", bytes_of(ts)}});
    }
    content.push_back(ojson{{"token", s}, {"logprob", t.logprob}, {"bytes", bytes_of(s)}, {"top_logprobs", top}});
  }
  return ojson{{"content", content}};
}

ojson tokens_json(const std::vector<int32_t>& ids) {
  ojson a = ojson::array();
  for (int32_t id : ids) a.push_back(id);
  return a;
}

}  // namespace

nlohmann::ordered_json usage_json(const Usage& u) {
  return ojson{{"prompt_tokens", u.prompt_tokens},
               {"completion_tokens", u.completion_tokens},
               {"total_tokens", u.prompt_tokens + u.completion_tokens}};
}

std::string error_body(const ApiError& e) {
  json err = {{"message", e.message},
              {"type", e.type},
              {"param", e.param.empty() ? json(nullptr) : json(e.param)},
              {"code", e.code.empty() ? json(nullptr) : json(e.code)}};
  return dump_json(json{{"error", err}});
}

std::string dump_json(const nlohmann::json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }
std::string dump_json(const nlohmann::ordered_json& j) {
  return j.dump(-1, ' ', false, ojson::error_handler_t::replace);
}

std::string sse_event(const std::string& payload) { return "data: " + payload + "\n\n"; }

std::shared_ptr<const engine::CompiledGrammar> GrammarCache::find(const std::string& key) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = items_.find(key);
  if (it == items_.end()) return nullptr;
  it->second.first = ++clock_;
  return it->second.second;
}

void GrammarCache::insert(const std::string& key, std::shared_ptr<const engine::CompiledGrammar> g) {
  std::lock_guard<std::mutex> lk(mu_);
  items_[key] = {++clock_, std::move(g)};
  while (items_.size() > capacity_) {
    auto oldest = items_.begin();
    for (auto it = items_.begin(); it != items_.end(); ++it)
      if (it->second.first < oldest->second.first) oldest = it;
    items_.erase(oldest);
  }
}

size_t GrammarCache::size() const {
  std::lock_guard<std::mutex> lk(mu_);
  return items_.size();
}

ApiResult<GenerationRequest> parse_generation_request(Endpoint ep, std::string_view body, const ModelInfo& m) {
  // The parser avoids exceptions by construction; this is the last line so that a library surprise
  // becomes a 400, never a crash of the server.
  try {
    return parse_generation_impl(ep, body, m);
  } catch (const std::bad_alloc&) {
    ApiError e;
    e.status = 500;
    e.type = "server_error";
    e.message = "out of memory while parsing the request";
    return e;
  } catch (const std::exception& ex) {
    return bad(std::string("invalid request: ") + ex.what());
  }
}

engine::Request to_engine_request(const GenerationRequest& g, int choice, const ModelInfo& m, uint64_t default_seed) {
  engine::Request r;
  const int p = g.prompt_index(choice);
  const int sample = choice % g.n;
  r.prompt = g.prompts[p].ids;
  r.sampling = g.sampling;
  r.sampling.seed = (g.seed ? *g.seed : default_seed) + static_cast<uint64_t>(sample);
  r.max_tokens = g.max_tokens;
  r.min_tokens = g.min_tokens;
  r.stop_ids = g.stop_token_ids;
  if (!g.ignore_eos)
    for (int32_t id : m.tokenizer->eog_ids())
      if (std::find(r.stop_ids.begin(), r.stop_ids.end(), id) == r.stop_ids.end()) r.stop_ids.push_back(id);
  r.logprobs = g.logprobs;
  // Completions' echo + logprobs scores the prompt too (OpenAI's legacy semantics, vLLM's too).
  if (g.echo && g.logprobs >= 0) r.prompt_logprobs = g.logprobs;
  r.cache_salt = g.cache_salt;
  if (g.grammar) r.constraint = std::make_shared<engine::GrammarConstraint>(g.grammar, r.stop_ids);
  return r;
}

ApiResult<nlohmann::json> tokenize_request(std::string_view body, const ModelInfo& m) {
  try {
    auto parsed = parse_object(body);
    if (!parsed.ok()) return parsed.error();
    const json& j = parsed.value();
    Fields f(j);
    if (auto e = check_model(f, m)) return *e;
    bool add_special = true, add_gen = true, strs = false;
    f.boolean("add_special_tokens", add_special);
    f.boolean("add_generation_prompt", add_gen);
    f.boolean("return_token_strs", strs);
    if (f.failed()) return f.error();
    std::vector<int32_t> ids;
    if (const json* msgs = f.get("messages")) {
      std::string text, tools_json;
      if (const json* t = f.get("tools")) {  // as vLLM's /tokenize: the prompt a chat request with them gets
        if (!t->is_array()) return bad(std::string("'tools' must be an array, got ") + type_name(*t), "tools");
        OrderedSubtree sax({"tools"});
        if (!ojson::sax_parse(body, &sax) || !sax.result || sax.too_many_keys || sax.too_deep)
          return bad(sax.too_deep ? "'tools' nests deeper than " + std::to_string(tok::kMaxJsonDepth) + " levels"
                                  : "'tools': an object has more than " + std::to_string(kMaxSchemaKeys) + " keys",
                     "tools");
        tools_json = sax.result->dump();
      }
      if (auto e = render_messages(*msgs, add_gen, m, ids, text, tools_json)) return *e;
    } else if (const json* p = f.get("prompt")) {
      if (!p->is_string()) return bad(std::string("'prompt' must be a string, got ") + type_name(*p), "prompt");
      ids = m.tokenizer->encode(p->get_ref<const std::string&>(), add_special && m.tokenizer->add_bos(), true);
    } else {
      return bad("'prompt' or 'messages' is required", "prompt");
    }
    json out = {{"count", ids.size()}, {"max_model_len", m.max_model_len}, {"tokens", json(tokens_json(ids))}};
    if (strs) {
      json a = json::array();
      for (int32_t id : ids) a.push_back(token_str(m, id));
      out["token_strs"] = a;
    }
    return out;
  } catch (const std::exception& ex) {
    return bad(std::string("invalid request: ") + ex.what());
  }
}

ApiResult<nlohmann::json> detokenize_request(std::string_view body, const ModelInfo& m) {
  try {
    auto parsed = parse_object(body);
    if (!parsed.ok()) return parsed.error();
    const json& j = parsed.value();
    Fields f(j);
    if (auto e = check_model(f, m)) return *e;
    const json* t = f.get("tokens");
    if (!t) return bad("'tokens' is required", "tokens");
    std::vector<int32_t> ids;
    if (!t->is_array() || !parse_id_array(*t, ids)) return bad("'tokens' must be an array of integers", "tokens");
    if (auto e = check_ids(ids, m, "tokens")) return *e;
    return json{{"prompt", m.tokenizer->decode(ids, false)}};
  } catch (const std::exception& ex) {
    return bad(std::string("invalid request: ") + ex.what());
  }
}

nlohmann::json models_response(const ModelInfo& m) {
  json model = {{"id", m.id},           {"object", "model"},     {"created", m.created},
                {"owned_by", "selfserve"}, {"root", m.id},         {"max_model_len", m.max_model_len}};
  return json{{"object", "list"}, {"data", json::array({model})}};
}

Usage usage_of(const GenerationRequest& g, const std::vector<ChoiceOutput>& choices) {
  Usage u;
  for (const PromptInput& p : g.prompts) u.prompt_tokens += static_cast<int>(p.ids.size());
  for (const ChoiceOutput& c : choices) u.completion_tokens += c.completion_tokens;
  return u;
}

// The fields every response and chunk object shares.
static ojson envelope(const char* object, const std::string& id, int64_t created, const ModelInfo& m, ojson choices) {
  return ojson{{"id", id}, {"object", object}, {"created", created}, {"model", m.id}, {"choices", std::move(choices)}};
}

nlohmann::ordered_json completion_response(const GenerationRequest& g, const ModelInfo& m, const std::string& id,
                                           int64_t created, const std::vector<ChoiceOutput>& choices) {
  ojson arr = ojson::array();
  for (const ChoiceOutput& c : choices) {
    const PromptInput& p = g.prompts[g.prompt_index(c.index)];
    ojson lp = nullptr;
    if (g.logprobs >= 0)
      lp = completion_logprobs(g, m, c.logprobs, g.echo ? p.text.size() : 0, g.echo ? &p.ids : nullptr, &c.prompt_logprobs);
    arr.push_back(ojson{{"index", c.index},
                        {"text", g.echo ? p.text + c.text : c.text},
                        {"logprobs", lp},
                        {"finish_reason", c.finish_reason},
                        {"stop_reason", c.stop_reason ? ojson(*c.stop_reason) : ojson(nullptr)}});
  }
  ojson out = envelope("text_completion", id, created, m, std::move(arr));
  out["usage"] = usage_json(usage_of(g, choices));
  return out;
}

namespace {
std::string tool_call_id() {
  static std::mutex mu;
  static std::mt19937_64 rng{std::random_device{}()};
  std::lock_guard<std::mutex> lock(mu);
  char buf[32];
  std::snprintf(buf, sizeof buf, "call_%016llx%08llx", static_cast<unsigned long long>(rng()),
                static_cast<unsigned long long>(rng() & 0xffffffffu));
  return buf;
}
ojson tool_call(const std::string& name, std::string arguments) {
  return ojson{{"id", tool_call_id()}, {"type", "function"}, {"function", {{"name", name}, {"arguments", std::move(arguments)}}}};
}
}  // namespace

ToolAnswer tool_answer(const GenerationRequest& g, const std::string& text) {
  using TC = GenerationRequest::ToolChoice;
  ToolAnswer a;
  a.content = text;
  if (g.tool_choice == TC::None) return a;
  if (g.tool_choice == TC::Auto) {
    tok::ParsedToolOutput p = tok::parse_tool_calls(g.tool_format, text);
    if (p.calls.empty()) return a;
    if (!g.parallel_tool_calls) p.calls.resize(1);  // as vLLM: the first call only
    for (tok::ParsedToolCall& c : p.calls) a.calls.push_back(tool_call(c.name, std::move(c.arguments)));
    a.called = true;
    a.content = std::move(p.content);
    return a;
  }
  if (tok::json_max_depth(text) > tok::kMaxJsonDepth) return a;  // (re-serialized below: recursion per level)
  const ojson v = ojson::parse(text, nullptr, /*allow_exceptions=*/false);
  if (v.is_discarded()) return a;  // cut by max_tokens: not a whole call
  if (g.tool_choice == TC::Named) {
    a.calls.push_back(tool_call(g.tool_name, text));  // the arguments exactly as generated
  } else {
    if (!v.is_array()) return a;
    ojson calls = ojson::array();
    for (const ojson& c : v) {
      if (!c.is_object() || !c.contains("name") || !c["name"].is_string() || !c.contains("parameters")) return a;
      calls.push_back(tool_call(c["name"].get<std::string>(), c["parameters"].dump()));
    }
    a.calls = std::move(calls);
  }
  a.called = true;
  a.content.clear();
  return a;
}

std::string tool_finish_reason(const GenerationRequest& g, const ToolAnswer& a, const std::string& finish_reason) {
  using TC = GenerationRequest::ToolChoice;
  const bool calls = a.called && (g.tool_choice == TC::Required || g.tool_choice == TC::Auto);
  return calls && finish_reason == "stop" ? "tool_calls" : finish_reason;
}

nlohmann::ordered_json chat_response(const GenerationRequest& g, const ModelInfo& m, const std::string& id,
                                     int64_t created, const std::vector<ChoiceOutput>& choices) {
  ojson arr = ojson::array();
  for (const ChoiceOutput& c : choices) {
    ojson message = {{"role", "assistant"}, {"content", c.text}};
    std::string finish = c.finish_reason;
    if (g.tool_choice != GenerationRequest::ToolChoice::None) {
      ToolAnswer a = tool_answer(g, c.text);
      if (a.called) {
        message["content"] = a.content.empty() ? ojson(nullptr) : ojson(a.content);
        message["tool_calls"] = std::move(a.calls);
        finish = tool_finish_reason(g, a, finish);
      }
    }
    arr.push_back(ojson{{"index", c.index},
                        {"message", std::move(message)},
                        {"logprobs", g.logprobs >= 0 ? chat_logprobs(g, m, c.logprobs) : ojson(nullptr)},
                        {"finish_reason", finish},
                        {"stop_reason", c.stop_reason ? ojson(*c.stop_reason) : ojson(nullptr)}});
  }
  ojson out = envelope("chat.completion", id, created, m, std::move(arr));
  out["usage"] = usage_json(usage_of(g, choices));
  return out;
}

// One completions chunk: the choice's text, its logprobs object (or null) and finish reason.
static ojson text_chunk(const GenerationRequest& g, const ModelInfo& m, const std::string& id, int64_t created,
                        int index, const std::string& text, ojson logprobs, const char* finish_reason) {
  ojson choice = {{"index", index},
                  {"text", text},
                  {"logprobs", std::move(logprobs)},
                  {"finish_reason", finish_reason ? ojson(finish_reason) : ojson(nullptr)}};
  ojson out = envelope("text_completion", id, created, m, ojson::array({choice}));
  if (g.include_usage) out["usage"] = nullptr;
  return out;
}

nlohmann::ordered_json completion_chunk(const GenerationRequest& g, const ModelInfo& m, const std::string& id,
                                        int64_t created, int index, const std::string& text,
                                        const std::vector<TokenLogprob>* logprobs, size_t text_offset,
                                        const char* finish_reason) {
  return text_chunk(g, m, id, created, index, text,
                    logprobs ? completion_logprobs(g, m, *logprobs, text_offset, nullptr) : ojson(nullptr), finish_reason);
}

nlohmann::ordered_json completion_echo_chunk(const GenerationRequest& g, const ModelInfo& m, const std::string& id,
                                             int64_t created, int index, const std::vector<TokenLogprob>* prompt_lps) {
  const PromptInput& p = g.prompts[g.prompt_index(index)];
  return text_chunk(g, m, id, created, index, p.text,
                    g.logprobs >= 0 ? completion_logprobs(g, m, {}, 0, &p.ids, prompt_lps) : ojson(nullptr), nullptr);
}

std::vector<TokenLogprob> prompt_token_logprobs(const std::vector<int32_t>& ids,
                                                const std::vector<engine::PromptLogprob>& lps) {
  std::vector<TokenLogprob> out;
  out.reserve(lps.size());
  for (size_t i = 0; i < lps.size() && i + 1 < ids.size(); ++i) out.push_back({ids[i + 1], lps[i].logprob, lps[i].top});
  return out;
}

// One chat chunk around `delta`.
static ojson delta_chunk(const GenerationRequest& g, const ModelInfo& m, const std::string& id, int64_t created,
                         int index, ojson delta, const std::vector<TokenLogprob>* logprobs, const char* finish_reason) {
  ojson choice = {{"index", index},
                  {"delta", std::move(delta)},
                  {"logprobs", logprobs ? chat_logprobs(g, m, *logprobs) : ojson(nullptr)},
                  {"finish_reason", finish_reason ? ojson(finish_reason) : ojson(nullptr)}};
  ojson out = envelope("chat.completion.chunk", id, created, m, ojson::array({choice}));
  if (g.include_usage) out["usage"] = nullptr;
  return out;
}

nlohmann::ordered_json chat_chunk(const GenerationRequest& g, const ModelInfo& m, const std::string& id,
                                  int64_t created, int index, const char* role, const std::string* content,
                                  const std::vector<TokenLogprob>* logprobs, const char* finish_reason) {
  ojson delta = ojson::object();
  if (role) delta["role"] = role;
  if (content) delta["content"] = *content;
  return delta_chunk(g, m, id, created, index, std::move(delta), logprobs, finish_reason);
}

nlohmann::ordered_json chat_tool_chunk(const GenerationRequest& g, const ModelInfo& m, const std::string& id,
                                       int64_t created, int index, const std::string& text,
                                       const std::vector<TokenLogprob>* logprobs, const char* finish_reason,
                                       size_t streamed) {
  ojson delta = ojson::object();
  std::string finish = finish_reason ? finish_reason : "";
  ToolAnswer a = tool_answer(g, text);
  // What is left of the content (the text before the calls, or all of it) after what was streamed.
  const std::string rest = a.content.size() > streamed ? a.content.substr(streamed) : std::string();
  if (!rest.empty() || (!a.called && streamed == 0)) delta["content"] = rest;
  if (a.called) {
    for (size_t k = 0; k < a.calls.size(); ++k) a.calls[k]["index"] = k;  // a stream's calls carry their index
    delta["tool_calls"] = std::move(a.calls);
    finish = tool_finish_reason(g, a, finish);
  }
  return delta_chunk(g, m, id, created, index, std::move(delta), logprobs, finish_reason ? finish.c_str() : nullptr);
}

nlohmann::ordered_json usage_chunk(const GenerationRequest& g, const ModelInfo& m, const std::string& id,
                                   int64_t created, const Usage& u) {
  ojson out = envelope(g.endpoint == Endpoint::ChatCompletions ? "chat.completion.chunk" : "text_completion", id,
                       created, m, ojson::array());
  out["usage"] = usage_json(u);
  return out;
}

}  // namespace ss::server
