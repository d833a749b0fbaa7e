// libFuzzer target: generated text -> the tool-call parsers and the streaming hold-back, and any
// JSON -> Python's json.dumps and the templates that print tools. Properties checked (a violation
// traps, so libFuzzer records it): a parsed call's arguments are a JSON object; text without whole
// calls comes back whole as content; the streamed prefix never shrinks, never passes the text, and
// never lets out a byte of a call; json.dumps output parses back to the same value.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.h"
#include "chat/chat.h"

namespace {

using ojson = nlohmann::ordered_json;
using ss::chat::ToolFormat;

void check(bool ok) {
  if (!ok) __builtin_trap();
}

void parsers(std::string_view text) {
  for (ToolFormat f : {ToolFormat::Hermes, ToolFormat::Llama3Json}) {
    const ss::chat::ParsedToolOutput out = ss::chat::parse_tool_calls(f, text);
    if (out.calls.empty()) {
      check(out.content == text);
    } else {
      check(text.substr(0, out.content.size()) == out.content);
      for (const auto& c : out.calls) {
        check(!c.name.empty());
        const ojson a = ojson::parse(c.arguments, nullptr, false);
        check(!a.is_discarded() && a.is_object());
      }
    }
    // Every prefix up to 512 bytes, then a few more: the streamed part only grows and holds no call.
    size_t last = 0;
    for (size_t len = 0; len <= text.size(); len = len < 512 ? len + 1 : len + 1 + len / 8) {
      const size_t k = ss::chat::tool_content_prefix(f, text.substr(0, len));
      check(k <= len && k >= last);
      check(ss::chat::tool_content_prefix(f, text.substr(0, len), last) == k);  // resuming gives the same
      if (!out.calls.empty()) check(k <= out.content.size());
      last = k;
    }
  }
}

void dumps_and_templates(std::string_view text) {
  const ojson v = ojson::parse(text, nullptr, false);
  if (v.is_discarded()) return;
  for (int indent : {-1, 4}) {
    const ojson back = ojson::parse(ss::chat::py_json_dumps(v, indent), nullptr, false);
    check(!back.is_discarded() && back == v);
  }
  if (!v.is_array()) return;
  // The two templates with tool sections (recognised by their markers), with the value as tools and
  // a call whose arguments are the value's first element.
  static const std::string qwen =
      "<|im_start|> <tool_call> You may call one or more functions to assist with the user query. <tools>";
  static const std::string llama =
      "<|start_header_id|> Cutting Knowledge Date Environment: ipython Given the following functions, please respond "
      "with a JSON for a function call";
  std::vector<ss::chat::ChatMessage> msgs{{"system", "s", {}}, {"user", "u", {}}, {"tool", "r", {}}};
  if (!v.empty()) msgs.push_back({"assistant", "", {{"f", v[0].dump()}}});
  for (const std::string* t : {&qwen, &llama}) (void)ss::chat::render_chat(*t, msgs, true, nullptr, "1 Jan 2025", text);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 8192) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  parsers(text);
  dumps_and_templates(text);
  return 0;
}
