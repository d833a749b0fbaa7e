// The one bound on how deeply JSON may nest wherever it is serialized, compiled or printed: those
// steps recurse once per level, and a 200,000-deep array inside a schema or a tool overflowed the
// stack and killed the server. The server's schema and tools readers, the JSON Schema compiler, the
// chat templates and the tool-call parsers all refuse JSON nested deeper than kMaxJsonDepth.
#pragma once
#include <cstddef>
#include <string_view>

namespace ss {

inline constexpr size_t kMaxJsonDepth = 128;

// Brackets outside JSON strings from s[i] on: the deepest nesting, and where the value that opens
// at s[i] closes (npos if it does not; only with stop_at_close, which ends the walk there). The text
// need not be valid JSON: this never recurses, so it is the check that runs before anything that does.
struct JsonBrackets {
  size_t most = 0, end = std::string_view::npos;
};
JsonBrackets scan_json_brackets(std::string_view s, size_t i, bool stop_at_close);

// How deeply arrays and objects nest in a JSON text (brackets outside strings).
inline size_t json_max_depth(std::string_view text) { return scan_json_brackets(text, 0, false).most; }

}  // namespace ss
