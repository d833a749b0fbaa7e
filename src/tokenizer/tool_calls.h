// Tool calls in a model's own chat format: which format a chat template uses, Python's json.dumps
// (what the templates' `tojson` prints), and the parsers that turn generated text back into calls,
// as vLLM's `--tool-call-parser hermes` and `llama3_json` do.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace ss::tok {

// Python's json.dumps(v, ensure_ascii=False) (indent < 0) or with indent=N: ", " and ": " between
// items, non-ASCII as is, floats as Python's repr (1.0, 1e-05, 1e+16), keys in their given order.
// This is transformers' `tojson` filter, so a template's tools and arguments render byte for byte.
std::string py_json_dumps(const nlohmann::ordered_json& v, int indent = -1);

// How deeply arrays and objects nest in a JSON text (brackets outside strings; the text need not be
// valid). Serializers, schema compilers and json.dumps recurse per level: callers refuse JSON nested
// deeper than kMaxJsonDepth before any of them runs.
inline constexpr size_t kMaxJsonDepth = 128;
size_t json_max_depth(std::string_view text);

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

}  // namespace ss::tok
