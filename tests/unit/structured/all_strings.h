// Test helper: every string over `alphabet` of length 0..max_len, for exhaustive comparisons of a
// grammar with a reference matcher.
#pragma once
#include <string>
#include <vector>

namespace ss::test {

inline std::vector<std::string> all_strings(const std::string& alphabet, int max_len) {
  std::vector<std::string> out = {""};
  for (size_t begin = 0, len = 0; len < static_cast<size_t>(max_len); ++len) {
    const size_t end = out.size();
    for (size_t i = begin; i < end; ++i)
      for (char c : alphabet) {
        std::string s = out[i];
        s.push_back(c);
        out.push_back(std::move(s));
      }
    begin = end;
  }
  return out;
}

}  // namespace ss::test
