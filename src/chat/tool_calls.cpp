// Tool-call formats: Python's json.dumps for templates, and parsers of generated calls.
#include "chat/chat.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstdlib>

namespace ss::chat {
namespace {

using ojson = nlohmann::ordered_json;

// Python's repr(float): the shortest digits that round-trip, fixed notation for decimal exponents
// -4 .. 15 (with ".0" when integral), else d.ddde±XX.
void py_float(std::string& out, double v) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  std::string_view s(buf, static_cast<size_t>(r.ptr - buf));
  bool neg = false;
  if (!s.empty() && s[0] == '-') {
    neg = true;
    s.remove_prefix(1);
  }
  const size_t e_pos = s.find('e');
  std::string digits;
  for (char c : s.substr(0, e_pos)) {
    if (c != '.') digits.push_back(c);
  }
  int exp = std::atoi(std::string(s.substr(e_pos + 1)).c_str());
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  if (neg) out.push_back('-');
  const int n = static_cast<int>(digits.size());
  if (exp >= -4 && exp < 16) {
    if (exp >= 0) {
      for (int i = 0; i <= exp; ++i) out.push_back(i < n ? digits[static_cast<size_t>(i)] : '0');
      out.push_back('.');
      if (n > exp + 1) out.append(digits, static_cast<size_t>(exp + 1));
      else out.push_back('0');
    } else {
      out.append("0.");
      out.append(static_cast<size_t>(-exp - 1), '0');
      out.append(digits);
    }
    return;
  }
  out.push_back(digits[0]);
  if (n > 1) {
    out.push_back('.');
    out.append(digits, 1);
  }
  char eb[16];
  std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
  out.append(eb);
}

void py_string(std::string& out, const std::string& s) {
  out.push_back('"');
  for (unsigned char c : s) {
    switch (c) {
      case '"': out.append("\\\""); break;
      case '\\': out.append("\\\\"); break;
      case '\n': out.append("\\n"); break;
      case '\r': out.append("\\r"); break;
      case '\t': out.append("\\t"); break;
      case '\b': out.append("\\b"); break;
      case '\f': out.append("\\f"); break;
      default:
        if (c < 0x20) {
          char b[8];
          std::snprintf(b, sizeof b, "\\u%04x", c);
          out.append(b);
        } else {
          out.push_back(static_cast<char>(c));
        }
    }
  }
  out.push_back('"');
}

void newline(std::string& out, int indent, int level) {
  out.push_back('\n');
  out.append(static_cast<size_t>(indent) * static_cast<size_t>(level), ' ');
}

void dumps(std::string& out, const ojson& v, int indent, int level) {
  switch (v.type()) {
    case ojson::value_t::null: out.append("null"); return;
    case ojson::value_t::boolean: out.append(v.get<bool>() ? "true" : "false"); return;
    case ojson::value_t::number_integer: out.append(std::to_string(v.get<int64_t>())); return;
    case ojson::value_t::number_unsigned: out.append(std::to_string(v.get<uint64_t>())); return;
    case ojson::value_t::number_float: py_float(out, v.get<double>()); return;
    case ojson::value_t::string: py_string(out, v.get_ref<const std::string&>()); return;
    case ojson::value_t::array:
    case ojson::value_t::object: {
      const bool obj = v.is_object();
      if (v.empty()) {
        out.append(obj ? "{}" : "[]");
        return;
      }
      out.push_back(obj ? '{' : '[');
      bool first = true;
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (!first) out.push_back(',');
        if (indent >= 0) newline(out, indent, level + 1);
        else if (!first) out.push_back(' ');
        first = false;
        if (obj) {
          py_string(out, it.key());
          out.append(": ");
        }
        dumps(out, it.value(), indent, level + 1);
      }
      if (indent >= 0) newline(out, indent, level);
      out.push_back(obj ? '}' : ']');
      return;
    }
    default: out.append("null"); return;  // binary / discarded: never in parsed request JSON
  }
}

bool contains(std::string_view s, std::string_view what) { return s.find(what) != std::string_view::npos; }

bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }
size_t skip_ws(std::string_view s, size_t i) {
  while (i < s.size() && is_ws(s[i])) ++i;
  return i;
}

// One call object at s[i]: {"name": "...", <args_key>: {...}} (either key name for the arguments).
// On success i moves past it.
bool read_call(std::string_view s, size_t& i, ParsedToolCall& call) {
  if (i >= s.size() || s[i] != '{') return false;
  const JsonBrackets b = scan_json_brackets(s, i, /*stop_at_close=*/true);
  if (b.end == std::string_view::npos || b.most > kMaxJsonDepth) return false;
  const size_t end = b.end;
  const ojson v = ojson::parse(s.substr(i, end - i), nullptr, /*allow_exceptions=*/false);
  if (v.is_discarded() || !v.is_object()) return false;
  auto name = v.find("name");
  if (name == v.end() || !name->is_string() || name->get_ref<const std::string&>().empty()) return false;
  auto args = v.find("arguments");
  if (args == v.end()) args = v.find("parameters");
  if (args == v.end() || !args->is_object()) return false;
  call.name = name->get<std::string>();
  call.arguments = py_json_dumps(*args);
  i = end;
  return true;
}

constexpr std::string_view kCallOpen = "<tool_call>", kCallClose = "</tool_call>", kPythonTag = "<|python_tag|>";

ParsedToolOutput parse_hermes(std::string_view text) {
  ParsedToolOutput out;
  const size_t first = text.find(kCallOpen);
  if (first == std::string_view::npos) {
    out.content = std::string(text);
    return out;
  }
  size_t i = first;
  while (i < text.size()) {
    i = skip_ws(text, i);
    if (i == text.size()) break;
    if (text.substr(i, kCallOpen.size()) != kCallOpen) break;  // text after the calls: dropped, as vLLM does
    i = skip_ws(text, i + kCallOpen.size());
    ParsedToolCall call;
    if (!read_call(text, i, call)) return {std::string(text), {}};
    out.calls.push_back(std::move(call));
    i = skip_ws(text, i);
    if (i == text.size()) break;  // the last call may be unclosed (generation stopped at </tool_call>)
    if (text.substr(i, kCallClose.size()) != kCallClose) return {std::string(text), {}};
    i += kCallClose.size();
  }
  out.content = std::string(text.substr(0, first));
  return out;
}

ParsedToolOutput parse_llama3_json(std::string_view text) {
  size_t i = skip_ws(text, 0);
  if (text.substr(i, kPythonTag.size()) == kPythonTag) i = skip_ws(text, i + kPythonTag.size());
  if (i >= text.size() || text[i] != '{') return {std::string(text), {}};
  ParsedToolOutput out;
  while (true) {
    ParsedToolCall call;
    if (!read_call(text, i, call)) return {std::string(text), {}};
    out.calls.push_back(std::move(call));
    i = skip_ws(text, i);
    if (i == text.size()) break;
    if (text[i] != ';') return {std::string(text), {}};
    i = skip_ws(text, i + 1);
  }
  return out;
}

}  // namespace

std::string py_json_dumps(const nlohmann::ordered_json& v, int indent) {
  std::string out;
  dumps(out, v, indent, 0);
  return out;
}

ToolFormat tool_format(std::string_view t) {
  // Qwen2.5's tool section (its instruction and <tools> list), which the ChatML renderer writes.
  if (contains(t, "<|im_start|>") && contains(t, "<tool_call>") &&
      contains(t, "You may call one or more functions to assist with the user query.") && contains(t, "<tools>"))
    return ToolFormat::Hermes;
  // Llama 3.1+: tools as JSON in the first user turn, calls as {"name", "parameters"}, results as ipython.
  if (contains(t, "<|start_header_id|>") && contains(t, "Environment: ipython") &&
      contains(t, "Given the following functions, please respond with a JSON for a function call"))
    return ToolFormat::Llama3Json;
  return ToolFormat::None;
}

const char* tool_format_name(ToolFormat f) {
  switch (f) {
    case ToolFormat::Hermes: return "hermes";
    case ToolFormat::Llama3Json: return "llama3_json";
    case ToolFormat::None: break;
  }
  return "none";
}

ParsedToolOutput parse_tool_calls(ToolFormat f, std::string_view text) {
  switch (f) {
    case ToolFormat::Hermes: return parse_hermes(text);
    case ToolFormat::Llama3Json: return parse_llama3_json(text);
    case ToolFormat::None: break;
  }
  return {std::string(text), {}};
}

size_t tool_content_prefix(ToolFormat f, std::string_view text, size_t known) {
  if (known > text.size()) known = text.size();
  if (f == ToolFormat::Hermes) {
    const size_t p = text.find(kCallOpen, known);  // none starts before `known`
    if (p != std::string_view::npos) return p;
    for (size_t k = std::min(text.size() - known, kCallOpen.size() - 1); k > 0; --k)
      if (text.substr(text.size() - k) == kCallOpen.substr(0, k)) return text.size() - k;
    return text.size();
  }
  if (f == ToolFormat::Llama3Json) {
    if (known > 0) return text.size();  // decided: it began as text
    const size_t i = skip_ws(text, 0);
    if (i == text.size() || text[i] == '{') return 0;  // undecided, or a call: held to the end
    const std::string_view rest = text.substr(i, kPythonTag.size());
    if (kPythonTag.substr(0, rest.size()) == rest) return 0;  // <|python_tag|>, or the start of it
    return text.size();
  }
  return text.size();
}

}  // namespace ss::chat
