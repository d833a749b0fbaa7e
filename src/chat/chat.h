// The chat folder's public header: chat templates (a conversation rendered as the model's own
// template would render it), and tool calls in a model's own chat format: which format a chat
// template uses, Python's json.dumps (what the templates' `tojson` prints), and the parsers that
// turn generated text back into calls, as vLLM's `--tool-call-parser hermes` and `llama3_json` do.
// The tokenizer knows nothing of chat: render_chat takes it for its bos/eos names.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/json_depth.h"
#include "common/status.h"
#include "tokenizer/tokenizer.h"

namespace ss::chat {

struct ChatToolCall {
  std::string name;
  std::string arguments;  // a JSON text (an object)
};
struct ChatMessage {
  std::string role;     // "system", "user", "assistant", "tool"
  std::string content;
  std::vector<ChatToolCall> tool_calls{};  // an assistant turn's calls (templates with a tool format)
};

enum class ChatFamily { ChatML, Llama3, Llama2, Mistral, Unknown };
ChatFamily detect_chat_family(std::string_view template_text);
const char* chat_family_name(ChatFamily f);

// Renders with the model's own template (recognised from its text), as transformers'
// apply_chat_template would (bos_token/eos_token from tok, or the family's usual ones without it).
// Unknown template → error naming it. An empty template falls back to ChatML only when the
// vocabulary has <|im_start|>. The rendered text contains the BOS text where the template puts it:
// encode it with add_special=false. date_string: for templates that print today's date
// (Llama 3.1+); empty means the template's default, or today when it asks for strftime_now.
// tools_json: OpenAI's `tools` array as a JSON text (empty: none), written where the template writes
// tools (tool_format(template) != None; other templates ignore them, as their Jinja does). Assistant
// turns with tool_calls render in the template's format; they need one (else an error).
Expected<std::string> render_chat(std::string_view template_text, const std::vector<ChatMessage>& messages,
                                  bool add_generation_prompt, const tok::Tokenizer* tok = nullptr,
                                  std::string_view date_string = {}, std::string_view tools_json = {});

// Python's json.dumps(v, ensure_ascii=False) (indent < 0) or with indent=N: ", " and ": " between
// items, non-ASCII as is, floats as Python's repr (1.0, 1e-05, 1e+16), keys in their given order.
// This is transformers' `tojson` filter, so a template's tools and arguments render byte for byte.
std::string py_json_dumps(const nlohmann::ordered_json& v, int indent = -1);

enum class ToolFormat {
  None,        // the template has no tool-call format this server knows
  Hermes,      // Qwen2.5: <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>, tools in the system turn
  Llama3Json,  // Llama 3.1 / 3.2 / 3.3: {"name": ..., "parameters": {...}}, tools in the first user turn
};
ToolFormat tool_format(std::string_view chat_template);
const char* tool_format_name(ToolFormat f);

struct ParsedToolCall {
  std::string name;
  std::string arguments;  // a JSON text (py_json_dumps of the generated object)
};
struct ParsedToolOutput {
  std::string content;  // text outside the calls (before the first one); the whole text when no calls
  std::vector<ParsedToolCall> calls;
};
// The calls in a generated text. Text that is not a whole call in the format (cut by max_tokens,
// broken JSON, a call without a name) stays content: nothing is dropped.
ParsedToolOutput parse_tool_calls(ToolFormat f, std::string_view text);
// Streaming: how many leading bytes of the text so far are content whatever follows (no call can
// start inside them). Non-decreasing as text is appended. known: what this returned for an earlier
// prefix of the same text (the search starts there, so a long answer is not rescanned per token).
size_t tool_content_prefix(ToolFormat f, std::string_view text, size_t known = 0);

}  // namespace ss::chat
