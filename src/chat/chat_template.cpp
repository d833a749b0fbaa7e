// Chat templates: the family is recognised from the template text and rendered by hand, byte for
// byte as transformers' apply_chat_template renders the real Jinja templates (trim_blocks and
// lstrip_blocks on, bos_token/eos_token as strings). Tested against jinja2 renders of the real
// templates (tests/data/tokenizer/chat_*.json).
#include <ctime>
#include <string>

#include "chat/chat.h"
#include "common/utf8.h"

namespace ss::chat {
namespace {

using ojson = nlohmann::ordered_json;

bool contains(std::string_view s, std::string_view what) { return s.find(what) != std::string_view::npos; }

// Concatenation by appends (g++ 12 warns falsely on "literal" + std::string chains).
template <class... Parts>
std::string cat(const Parts&... parts) {
  std::string out;
  (out.append(std::string_view(parts)), ...);
  return out;
}

// Python's str.strip() / Jinja's trim: strips characters for which str.isspace() is true.
bool py_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}
// The code point starting at s[i] (valid UTF-8 assumed; a stray byte decodes as itself).
uint32_t cp_at(std::string_view s, size_t i, size_t* n) {
  size_t j = i;
  uint32_t cp = 0;
  if (!decode_utf8(s, j, cp)) {
    *n = 1;
    return static_cast<unsigned char>(s[i]);
  }
  *n = j - i;
  return cp;
}
std::string py_strip(std::string_view s) {
  size_t b = 0, n = 0;
  while (b < s.size() && py_space(cp_at(s, b, &n))) b += n;
  size_t e = s.size();
  while (e > b) {
    size_t k = e - 1;
    while (k > b && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
    if (!py_space(cp_at(s, k, &n))) break;
    e = k;
  }
  return std::string(s.substr(b, e - b));
}

// The default system prompt a ChatML template writes when the conversation has none:
// the literal after '<|im_start|>system\n' (newline written raw or as \n) up to '<|im_end|>'.
std::string chatml_default_system(std::string_view t) {
  for (std::string_view head : {std::string_view("<|im_start|>system\n"), std::string_view("<|im_start|>system\\n")}) {
    size_t p = 0;
    while ((p = t.find(head, p)) != std::string_view::npos) {
      p += head.size();
      size_t e = t.find("<|im_end|>", p);
      if (e == std::string_view::npos) break;
      std::string_view lit = t.substr(p, e - p);
      if (lit.empty() || contains(lit, "'") || contains(lit, "\"") || contains(lit, "{") || contains(lit, "+")) continue;
      std::string out;  // undo Jinja string-literal escapes
      for (size_t i = 0; i < lit.size(); ++i) {
        if (lit[i] == '\\' && i + 1 < lit.size()) {
          char c = lit[++i];
          out.push_back(c == 'n' ? '\n' : c == 't' ? '\t' : c);
        } else {
          out.push_back(lit[i]);
        }
      }
      return out;
    }
  }
  return {};
}

std::string token_or(const tok::Tokenizer* tok, int32_t id, const char* fallback) {
  if (tok && id >= 0) return std::string(tok->token_text(id));
  return tok ? std::string() : std::string(fallback);
}

// Qwen2.5's tool section in the system turn (its template's words, tools as `tojson` prints them).
std::string qwen_tools_system(const std::string& system, const ojson& tools) {
  std::string out = cat("<|im_start|>system\n", system,
                        "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>");
  for (const ojson& t : tools) out += cat("\n", py_json_dumps(t));
  out += "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
         "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
         "<args-json-object>}\n</tool_call><|im_end|>\n";
  return out;
}

// A call's arguments (a JSON text) as the templates' `tojson` prints the parsed object.
Expected<std::string> arguments_json(const ChatToolCall& c) {
  if (json_max_depth(c.arguments) > kMaxJsonDepth)
    return make_error("chat template: the arguments of a call to '" + c.name + "' nest too deeply");
  const ojson v = ojson::parse(c.arguments, nullptr, /*allow_exceptions=*/false);
  if (v.is_discarded()) return make_error("chat template: the arguments of a call to '" + c.name + "' are not JSON");
  return py_json_dumps(v);
}

Expected<std::string> render_chatml(std::string_view t, const std::vector<ChatMessage>& msgs, bool gen,
                                    const ojson& tools) {
  if (contains(t, "<think>") || contains(t, "reasoning_content"))
    return make_error("chat template: ChatML with reasoning blocks (Qwen3-style <think>) is not supported");
  const bool hermes = tool_format(t) == ToolFormat::Hermes;
  std::string def = chatml_default_system(t);
  std::string out;
  size_t first = 0;
  if (hermes && !tools.empty()) {
    const bool sys = !msgs.empty() && msgs[0].role == "system";
    out += qwen_tools_system(sys ? msgs[0].content : def, tools);
    first = sys ? 1 : 0;
  } else if (!def.empty() && !msgs.empty() && msgs[0].role != "system") {
    out += cat("<|im_start|>system\n", def, "<|im_end|>\n");
  }
  for (size_t i = first; i < msgs.size(); ++i) {
    const ChatMessage& m = msgs[i];
    if (m.role == "tool" && contains(t, "<tool_response>")) {  // Qwen2.5: tool results in a user turn
      if (i == 0 || msgs[i - 1].role != "tool") out += "<|im_start|>user";
      out += cat("\n<tool_response>\n", m.content, "\n</tool_response>");
      if (i + 1 == msgs.size() || msgs[i + 1].role != "tool") out += "<|im_end|>\n";
      continue;
    }
    if (!m.tool_calls.empty()) {
      if (!hermes) return make_error("chat template: this ChatML template has no format for an assistant's tool calls");
      out += "<|im_start|>assistant";
      if (!m.content.empty()) out += cat("\n", m.content);
      for (const ChatToolCall& c : m.tool_calls) {
        auto args = arguments_json(c);
        if (!args.ok()) return args.error();
        out += cat("\n<tool_call>\n{\"name\": \"", c.name, "\", \"arguments\": ", *args, "}\n</tool_call>");
      }
      out += "<|im_end|>\n";
      continue;
    }
    out += cat("<|im_start|>", m.role, "\n", m.content, "<|im_end|>\n");
  }
  if (gen) out += "<|im_start|>assistant\n";
  return out;
}

std::string today() {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%d %b %Y", &tm);
  return buf;
}

Expected<std::string> render_llama3(std::string_view t, const std::vector<ChatMessage>& msgs, bool gen,
                                    const std::string& bos, std::string_view date_string, const ojson& tools) {
  std::string out = bos;
  size_t first = 0;
  const bool modern = contains(t, "Cutting Knowledge Date");  // Llama 3.1 / 3.2 / 3.3: a system block always
  const bool json_tools = tool_format(t) == ToolFormat::Llama3Json && !tools.empty();
  if (modern) {
    std::string date(date_string);
    if (date.empty()) {
      const std::string_view key = "set date_string = \"";
      size_t p = t.find(key);
      if (contains(t, "strftime_now") || p == std::string_view::npos) {
        date = today();
      } else {
        p += key.size();
        date = std::string(t.substr(p, t.find('"', p) - p));
      }
    }
    std::string sys;
    if (!msgs.empty() && msgs[0].role == "system") {
      sys = py_strip(msgs[0].content);
      first = 1;
    }
    out += cat("<|start_header_id|>system<|end_header_id|>\n\n", json_tools ? "Environment: ipython\n" : "",
               "Cutting Knowledge Date: December 2023\nToday Date: ", date, "\n\n", sys, "<|eot_id|>");
  }
  if (json_tools) {  // the tools go into the first turn after the system one (tools_in_user_message)
    if (first == msgs.size())
      return make_error("chat template: Cannot put tools in the first user message when there's no first user message!");
    out += "<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, please respond with a JSON "
           "for a function call with its proper arguments that best answers the given prompt.\n\nRespond in the "
           "format {\"name\": function name, \"parameters\": dictionary of argument name and its value}.Do not use "
           "variables.\n\n";
    for (const ojson& tool : tools) out += cat(py_json_dumps(tool, 4), "\n\n");
    out += cat(py_strip(msgs[first].content), "<|eot_id|>");
    ++first;
  }
  for (size_t i = first; i < msgs.size(); ++i) {
    const ChatMessage& m = msgs[i];
    if (modern && !m.tool_calls.empty()) {
      if (m.tool_calls.size() != 1) return make_error("chat template: This model only supports single tool-calls at once!");
      auto args = arguments_json(m.tool_calls[0]);
      if (!args.ok()) return args.error();
      out += cat("<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"", m.tool_calls[0].name,
                 "\", \"parameters\": ", *args, "}<|eot_id|>");
    } else if (!m.tool_calls.empty()) {
      return make_error("chat template: this Llama 3 template has no format for an assistant's tool calls");
    } else if (modern && (m.role == "tool" || m.role == "ipython")) {
      // The template prints a result with `tojson` (a string is iterable): as a JSON string.
      out += cat("<|start_header_id|>ipython<|end_header_id|>\n\n", py_json_dumps(ojson(m.content)), "<|eot_id|>");
    } else {
      out += cat("<|start_header_id|>", m.role, "<|end_header_id|>\n\n", py_strip(m.content), "<|eot_id|>");
    }
  }
  if (gen) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

Expected<std::string> render_llama2(const std::vector<ChatMessage>& msgs, const std::string& bos,
                                    const std::string& eos) {
  size_t first = 0;
  bool has_sys = !msgs.empty() && msgs[0].role == "system";
  if (has_sys) first = 1;
  std::string out;
  for (size_t i = first; i < msgs.size(); ++i) {
    size_t k = i - first;
    const ChatMessage& m = msgs[i];
    if ((m.role == "user") != (k % 2 == 0))
      return make_error("chat template: conversation roles must alternate user/assistant/user/assistant/...");
    std::string content = (k == 0 && has_sys) ? cat("<<SYS>>\n", msgs[0].content, "\n<</SYS>>\n\n", m.content) : m.content;
    if (m.role == "user") {
      out += cat(bos, "[INST] ", py_strip(content), " [/INST]");
    } else if (m.role == "assistant") {
      out += cat(" ", py_strip(content), " ", eos);
    }
  }
  return out;
}

Expected<std::string> render_mistral(std::string_view t, const std::vector<ChatMessage>& msgs, const std::string& bos,
                                     const std::string& eos) {
  if (!contains(t, "' [/INST]'") || contains(t, "system_message"))
    return make_error("chat template: this Mistral [INST] variant is not supported (only the v0.1 / Mixtral one)");
  std::string out = bos;
  for (size_t i = 0; i < msgs.size(); ++i) {
    const ChatMessage& m = msgs[i];
    if ((m.role == "user") != (i % 2 == 0))
      return make_error("chat template: conversation roles must alternate user/assistant/user/assistant/...");
    if (m.role == "user") {
      out += cat("[INST] ", m.content, " [/INST]");
    } else if (m.role == "assistant") {
      out += cat(m.content, eos);
    } else {
      return make_error("chat template: only user and assistant roles are supported by this template");
    }
  }
  return out;
}

}  // namespace

ChatFamily detect_chat_family(std::string_view t) {
  if (contains(t, "<|im_start|>")) return ChatFamily::ChatML;
  if (contains(t, "<|start_header_id|>")) return ChatFamily::Llama3;
  if (contains(t, "[INST]")) return contains(t, "<<SYS>>") ? ChatFamily::Llama2 : ChatFamily::Mistral;
  return ChatFamily::Unknown;
}

const char* chat_family_name(ChatFamily f) {
  switch (f) {
    case ChatFamily::ChatML: return "chatml";
    case ChatFamily::Llama3: return "llama3";
    case ChatFamily::Llama2: return "llama2";
    case ChatFamily::Mistral: return "mistral";
    case ChatFamily::Unknown: break;
  }
  return "unknown";
}

Expected<std::string> render_chat(std::string_view template_text, const std::vector<ChatMessage>& messages,
                                  bool add_generation_prompt, const tok::Tokenizer* tok, std::string_view date_string,
                                  std::string_view tools_json) {
  std::string_view t = template_text;
  ojson tools = ojson::array();
  if (!tools_json.empty()) {
    if (json_max_depth(tools_json) > kMaxJsonDepth)
      return make_error("chat template: tools nest deeper than " + std::to_string(kMaxJsonDepth) + " levels");
    tools = ojson::parse(tools_json, nullptr, /*allow_exceptions=*/false);
    if (tools.is_discarded() || !tools.is_array()) return make_error("chat template: tools must be a JSON array");
  }
  if (t.empty()) {
    bool has_chatml = false;
    if (tok) {
      for (int32_t id = 0; id < tok->vocab_size() && !has_chatml; ++id) has_chatml = tok->token_text(id) == "<|im_start|>";
    }
    if (!has_chatml) return make_error("chat template: the model has none, and its vocabulary has no <|im_start|> for ChatML");
    return render_chatml("", messages, add_generation_prompt, tools);
  }
  ChatFamily f = detect_chat_family(t);
  if (f == ChatFamily::Llama2 || f == ChatFamily::Mistral)
    for (const ChatMessage& m : messages)
      if (!m.tool_calls.empty()) return make_error("chat template: this template has no format for an assistant's tool calls");
  switch (f) {
    case ChatFamily::ChatML: return render_chatml(t, messages, add_generation_prompt, tools);
    case ChatFamily::Llama3:
      return render_llama3(t, messages, add_generation_prompt,
                           token_or(tok, tok ? tok->bos_id() : -1, "<|begin_of_text|>"), date_string, tools);
    case ChatFamily::Llama2:
      return render_llama2(messages, token_or(tok, tok ? tok->bos_id() : -1, "<s>"),
                           token_or(tok, tok ? tok->eos_id() : -1, "</s>"));
    case ChatFamily::Mistral:
      return render_mistral(t, messages, token_or(tok, tok ? tok->bos_id() : -1, "<s>"),
                            token_or(tok, tok ? tok->eos_id() : -1, "</s>"));
    case ChatFamily::Unknown: break;
  }
  std::string head(t.substr(0, 80));
  for (char& c : head) {
    if (c == '\n') c = ' ';
  }
  return make_error("chat template not recognised (none of ChatML, Llama-3, Llama-2, Mistral): \"" + head +
                    (t.size() > 80 ? "...\"" : "\""));
}

}  // namespace ss::chat
