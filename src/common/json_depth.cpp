#include "common/json_depth.h"

#include <algorithm>

namespace ss {

JsonBrackets scan_json_brackets(std::string_view s, size_t i, bool stop_at_close) {
  JsonBrackets b;
  size_t depth = 0;
  bool in_str = false;
  for (; i < s.size(); ++i) {
    const char c = s[i];
    if (in_str) {
      if (c == '\\') ++i;
      else if (c == '"') in_str = false;
    } else if (c == '"') {
      in_str = true;
    } else if (c == '{' || c == '[') {
      b.most = std::max(b.most, ++depth);
    } else if ((c == '}' || c == ']') && depth > 0 && --depth == 0 && stop_at_close) {
      b.end = i + 1;
      return b;
    }
  }
  return b;
}

}  // namespace ss
