// Regular expressions → Grammar, for structured outputs: vLLM's `regex` (the whole output matches)
// and JSON Schema's `pattern` (a string value, JSON-escaped, that the pattern matches somewhere).
//
// The dialect is ECMAScript's (what JSON Schema specifies), over Unicode code points: literals and
// escapes (\t \n \r \v \f \0 \cX \xHH \uHHHH \u{H...}, identity escapes of punctuation), `.`, classes
// ([...], [^...], ranges, \d \D \w \W \s \S), groups ((...), (?:...), (?<name>...), and Python's
// (?P<name>...), which vLLM users write), alternation,
// quantifiers (* + ? {n} {n,} {n,m}, lazy forms alike: they match the same strings), and ^ / $ at
// the start / end of a top-level alternative. What a grammar cannot follow is an error naming it:
// lookaround, backreferences, word boundaries, \p{...} and anchors anywhere else.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"
#include "common/utf8.h"  // decode_utf8 / encode_utf8, for the regex and GBNF parsers
#include "structured/grammar.h"

namespace ss::structured {

struct RegexOptions {
  // How the matched text is written: as is (UTF-8), or as the inside of a JSON string (`"` and `\`
  // and control characters escaped, the rest as UTF-8; one spelling per character).
  bool json_string = false;
  // JSON Schema's semantics: the pattern may match anywhere in the string, so an alternative not
  // anchored with ^ (or $) lets any text come before (after) it. Otherwise the whole text matches
  // and ^ / $ change nothing.
  bool search = false;
};

// Exactly `digits` hex digits of s at i into v (i advances past them); false if fewer are there.
bool parse_hex(std::string_view s, size_t& i, int digits, uint32_t& v);

// Sets of code points as inclusive ranges (any order; surrogates are dropped: they have no UTF-8).
using CodePointRanges = std::vector<std::pair<uint32_t, uint32_t>>;
CodePointRanges complement_code_points(CodePointRanges set);  // within U+0000..U+10FFFF

// Writes code point sets as grammar elements matching exactly their spellings: UTF-8, or the
// inside of a JSON string. Equal sets share their rules. (Used by the regex and GBNF compilers.)
class CodePointEncoder {
 public:
  CodePointEncoder(Grammar& g, bool json_string) : g_(g), json_(json_string) {}
  std::optional<Grammar::Seq> encode(CodePointRanges set);  // nullopt for an empty set

 private:
  void utf8(uint32_t lo, uint32_t hi, std::vector<Grammar::Seq>& out);
  Grammar& g_;
  bool json_;
  std::map<CodePointRanges, std::optional<Grammar::Seq>> memo_;
};

// Adds the rules for `pattern` to g and returns the top rule (g's root is left alone).
Expected<int> regex_rule(Grammar& g, std::string_view pattern, const RegexOptions& opt);
// A grammar whose whole text matches `pattern` (vLLM's structured_outputs.regex / guided_regex).
Expected<Grammar> regex_grammar(std::string_view pattern);

}  // namespace ss::structured
