// Regex → grammar, checked against std::regex (libstdc++'s ECMAScript engine, an implementation
// nobody here wrote) on every short string over a small alphabet, against nlohmann::json's string
// escaping for JSON Schema's `pattern`, and against a direct UTF-8 encoder for code point classes.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <regex>

#include "all_strings.h"
#include "structured/grammar.h"
#include "structured/json_schema.h"
#include "structured/regex.h"

using namespace ss::structured;
using ss::test::all_strings;

namespace {

bool matches(const Grammar& g, std::string_view text) { return g.matches(text); }

Grammar search_grammar(std::string_view pattern) {
  Grammar g;
  auto r = regex_rule(g, pattern, {.json_string = false, .search = true});
  EXPECT_TRUE(r.ok()) << pattern << ": " << (r.ok() ? "" : r.message());
  if (r.ok()) g.set_root(*r);
  EXPECT_TRUE(g.validate().ok());
  return g;
}

std::string utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) s += static_cast<char>(cp);
  else if (cp < 0x800) s += {static_cast<char>(0xC0 | cp >> 6), static_cast<char>(0x80 | (cp & 0x3F))};
  else if (cp < 0x10000)
    s += {static_cast<char>(0xE0 | cp >> 12), static_cast<char>(0x80 | (cp >> 6 & 0x3F)), static_cast<char>(0x80 | (cp & 0x3F))};
  else
    s += {static_cast<char>(0xF0 | cp >> 18), static_cast<char>(0x80 | (cp >> 12 & 0x3F)),
          static_cast<char>(0x80 | (cp >> 6 & 0x3F)), static_cast<char>(0x80 | (cp & 0x3F))};
  return s;
}

// ASCII patterns whose meaning std::regex (ECMAScript) and ours share.
const std::vector<std::string> kPatterns = {
    "",          "a",          "abc",           "a|b",           "ab|ba|",       "a*",          "a+b*",
    "(ab)+",     "a?b?c?",     "(a|b)*c",       "[abc]{2}",      "[^a]+",        "a{2,}",       "a{1,3}b",
    "(a{0,2}b){2}", "(a*)*",   "(a|)+b",        "(a?b?)*",       "((a|b)c?)+",   "[a-c]-[0-9]", "\\d+(\\.\\d+)?",
    "\\w+",      "\\W",        "\\s",           "[\\d.]+",       ".",            ".*c",         "a.c",
    "(?:ab|a)(?:bc|c)", "(?:a)b", "a{0}b",   "[-a]",          "[a-]",         "\\-\\.",      "a*?b",
    "^a",        "a$",         "^ab$",          "^a|b$",         "^$",           "a\\d{2,3}$",  "[\\s\\d]",
    "[.]",           "\\x61",         "\\u0062",      "[\\x61-\\x63]+",
};
const std::string kAlphabet = "abc1. -\n";

}  // namespace

TEST(Regex, WholeMatchesAgreeWithStdRegexOnEveryShortString) {
  const std::vector<std::string> texts = all_strings(kAlphabet, 4);
  for (const std::string& p : kPatterns) {
    auto g = regex_grammar(p);
    ASSERT_TRUE(g.ok()) << p << ": " << g.message();
    // Whole-output semantics: anchors at the ends change nothing.
    std::string stripped = p;
    if (p.find('|') == std::string::npos) {
      if (!stripped.empty() && stripped[0] == '^') stripped.erase(0, 1);
      if (!stripped.empty() && stripped.back() == '$' && (stripped.size() < 2 || stripped[stripped.size() - 2] != '\\'))
        stripped.pop_back();
    }
    if (stripped != p && p.find('|') != std::string::npos) continue;
    const std::regex re(stripped, std::regex::ECMAScript);
    for (const std::string& t : texts)
      ASSERT_EQ(matches(*g, t), std::regex_match(t, re)) << "pattern " << p << " text '" << t << "'";
  }
}

TEST(Regex, SearchSemanticsAgreeWithStdRegexSearch) {
  const std::vector<std::string> texts = all_strings(kAlphabet, 4);
  for (const std::string& p : kPatterns) {
    const Grammar g = search_grammar(p);
    const std::regex re(p, std::regex::ECMAScript);
    for (const std::string& t : texts)
      ASSERT_EQ(matches(g, t), std::regex_search(t, re)) << "pattern " << p << " text '" << t << "'";
  }
}

TEST(Regex, LongerRandomTextsAgree) {
  std::mt19937 rng(11);
  for (const std::string& p : kPatterns) {
    auto g = regex_grammar(p);
    ASSERT_TRUE(g.ok());
    const Grammar sg = search_grammar(p);
    const std::regex re(p, std::regex::ECMAScript);
    for (int k = 0; k < 300; ++k) {
      std::string t;
      for (int n = std::uniform_int_distribution<int>(5, 12)(rng); n > 0; --n) t += kAlphabet[rng() % kAlphabet.size()];
      ASSERT_EQ(matches(sg, t), std::regex_search(t, re)) << p << " '" << t << "'";
      if (p.find_first_of("^$") == std::string::npos) {
        ASSERT_EQ(matches(*g, t), std::regex_match(t, re)) << p << " '" << t << "'";
      }
    }
  }
}

TEST(Regex, CodePointClassesAreExactUtf8) {
  std::mt19937 rng(5);
  std::vector<std::pair<uint32_t, uint32_t>> ranges = {
      {0x80, 0x7FF}, {0x7FF, 0x800}, {0xD7FF, 0xE000}, {0xFFFF, 0x10000}, {0x10FFFF, 0x10FFFF}, {0x61, 0x10FFFF}};
  for (int k = 0; k < 60; ++k) {
    uint32_t a = rng() % 0x110000, b = rng() % 0x110000;
    if (k % 3 == 0) b = a + rng() % 300;
    if (b > 0x10FFFF) b = 0x10FFFF;
    ranges.emplace_back(std::min(a, b), std::max(a, b));
  }
  auto in_surrogates = [](uint32_t c) { return c >= 0xD800 && c <= 0xDFFF; };
  for (const auto& [lo, hi] : ranges) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "[\\u{%X}-\\u{%X}]", lo, hi);
    for (bool negate : {false, true}) {
      std::string p = buf;
      if (negate) p.insert(p.begin() + 1, '^');
      auto g = regex_grammar(p);
      ASSERT_TRUE(g.ok()) << p << ": " << g.message();
      std::vector<uint32_t> probe = {0, 0x7F, 0x80, 0x7FF, 0x800, 0xFFFF, 0x10000, 0x10FFFF, lo, hi};
      if (lo > 0) probe.push_back(lo - 1);
      if (hi < 0x10FFFF) probe.push_back(hi + 1);
      for (int j = 0; j < 40; ++j) probe.push_back(rng() % 0x110000);
      for (uint32_t c : probe) {
        if (in_surrogates(c)) continue;
        const bool in = c >= lo && c <= hi;
        ASSERT_EQ(matches(*g, utf8(c)), in != negate) << p << " U+" << std::hex << c;
      }
      // Never ill-formed UTF-8: overlongs, encoded surrogates, past U+10FFFF, stray continuations.
      for (const char* bad : {"\xC0\x80", "\xC1\xBF", "\xE0\x80\x80", "\xED\xA0\x80", "\xF4\x90\x80\x80", "\x80", "\xF8"})
        ASSERT_FALSE(matches(*g, bad)) << p;
    }
  }
}

TEST(Regex, UnicodeLiteralsDotAndSurrogatePairs) {
  auto g = regex_grammar("é.\\uD834\\uDD1E[à-ä]+");
  ASSERT_TRUE(g.ok()) << g.message();
  EXPECT_TRUE(matches(*g, "éx𝄞àäâ"));
  EXPECT_TRUE(matches(*g, "é€𝄞ã"));
  EXPECT_FALSE(matches(*g, "é\n𝄞à"));  // '.' is not a line terminator
  EXPECT_FALSE(matches(*g, "e€𝄞à"));
  EXPECT_FALSE(matches(*g, "é€𝄞å"));
  auto dot = regex_grammar(".");
  ASSERT_TRUE(dot.ok());
  for (const char* s : {"\r", "\n", "\u2028", "\u2029"}) EXPECT_FALSE(matches(*dot, s));
  for (const char* s : {"\t", "\u2027", "\U0010FFFF", "\x7F"}) EXPECT_TRUE(matches(*dot, s));
  auto space = regex_grammar("\\s\\S");
  ASSERT_TRUE(space.ok());
  EXPECT_TRUE(matches(*space, "\u3000x"));
  EXPECT_TRUE(matches(*space, "\uFEFF\u00E9"));
  EXPECT_FALSE(matches(*space, "x\u00A0"));
}

TEST(Regex, JsonSchemaPatternIsJsonEscapedAndSearched) {
  // The value's JSON spelling is what the grammar sees; nlohmann::json writes it (one spelling per
  // character, as ours: short escapes, \u00XX for other controls, everything else as UTF-8).
  const std::vector<std::string> patterns = {"^a\"b$", "\\\\", "^[^a]$", "\\n|\\t", "^.{2}$", "c$", "^\\x01", "^\"*$"};
  const std::vector<std::string> texts = all_strings(std::string("a\"\\\n\t\x01") + "c", 3);
  for (const std::string& p : patterns) {
    nlohmann::ordered_json schema = {{"type", "string"}, {"pattern", p}};
    auto g = json_schema_grammar(schema);
    ASSERT_TRUE(g.ok()) << p << ": " << g.message();
    const std::regex re(p, std::regex::ECMAScript);
    for (const std::string& t : texts)
      ASSERT_EQ(matches(*g, nlohmann::json(t).dump()), std::regex_search(t, re)) << p << " " << nlohmann::json(t).dump();
  }
  // Inside an object, next to other properties.
  nlohmann::ordered_json obj = {{"type", "object"},
                                {"properties", {{"zip", {{"type", "string"}, {"pattern", "^[0-9]{5}(-[0-9]{4})?$"}}}}},
                                {"required", {"zip"}}};
  auto g = json_schema_grammar(obj);
  ASSERT_TRUE(g.ok()) << g.message();
  EXPECT_TRUE(matches(*g, R"({"zip": "12345"})"));
  EXPECT_TRUE(matches(*g, R"({"zip": "12345-6789"})"));
  EXPECT_FALSE(matches(*g, R"({"zip": "1234"})"));
  EXPECT_FALSE(matches(*g, R"({"zip": "12345-"})"));
}

TEST(Regex, WhatAGrammarCannotFollowIsAClearError) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"a(?=b)", "lookaround"},   {"(?!a)b", "lookaround"},        {"(?<=a)b", "lookaround"},
      {"(a)\\1", "backreference"}, {"\\bword", "word boundaries"}, {"a^b", "'^'"},
      {"(^a)", "'^'"},            {"a$b", "'$'"},                 {"(a", "missing ')'"},
      {"a)", "unmatched ')'"},    {"*a", "nothing to repeat"},    {"a**", "nothing to repeat"},
      {"a{3,2}", "m < n"},        {"a{10001}", "above 10000"},    {"[z-a]", "out of order"},
      {"[a-\\d]", "cannot bound"}, {"[abc", "missing ']'"},       {"\\p{L}", "property"},
      {"[]", "matches no string"}, {"a\\", "ends with"},          {"\xff", "UTF-8"},
      {"\\q", "unknown escape"},  {"(?i)a", "unknown group"},     {"\\uD800", "surrogate"},
      {"\\012", "octal"},
  };
  for (const auto& [p, what] : bad) {
    auto g = regex_grammar(p);
    ASSERT_FALSE(g.ok()) << p;
    EXPECT_NE(g.message().find(what), std::string::npos) << p << ": " << g.message();
  }
  // And in a schema: the keyword's place is named; a pattern next to a length bound is refused.
  auto s = json_schema_grammar(nlohmann::ordered_json::parse(R"J({"properties": {"x": {"type": "string", "pattern": "(?=a)"}}})J"));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("#/properties/x/pattern"), std::string::npos) << s.message();
  s = json_schema_grammar(nlohmann::ordered_json::parse(R"({"type": "string", "pattern": "a+", "maxLength": 3})"));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("pattern"), std::string::npos) << s.message();
  s = json_schema_grammar(nlohmann::ordered_json::parse(R"({"type": "string", "pattern": 5})"));
  ASSERT_FALSE(s.ok());
}

TEST(Regex, LongConcatenationsDoNotRecursePerElement) {
  // A group of 200,000 literals (a 200 KB guided_regex) overflowed the stack, one call per literal.
  const std::string run(200000, 'a');
  for (const std::string& p : {"(" + run + ")?b", "(" + run + ")+"}) {
    auto g = regex_grammar(p);
    ASSERT_TRUE(g.ok()) << g.message();
    const std::string want = p.back() == 'b' ? run + "b" : run + run;
    EXPECT_TRUE(matches(*g, want));
    EXPECT_FALSE(matches(*g, want.substr(1)));
  }
}

TEST(Regex, LargeCountsStayLinearAndMatchExactly) {
  auto g = regex_grammar("(ab{1,1000}){3}");
  ASSERT_TRUE(g.ok()) << g.message();
  EXPECT_LT(g->num_rules(), 5000);
  std::string ok = "a";
  ok.append(1000, 'b').append("ab").append("a").append(7, 'b');
  EXPECT_TRUE(matches(*g, ok));
  std::string too_long = "a";
  too_long.append(1001, 'b').append("abab");
  EXPECT_FALSE(matches(*g, too_long));
  auto nested = regex_grammar("((a{0,5000}b){0,5000}c){0,5000}");
  ASSERT_TRUE(nested.ok()) << nested.message();
  EXPECT_LT(nested->num_rules(), 40000);
  std::string text;
  for (int k = 0; k < 3; ++k) text.append(4000, 'a').append("b").append("c");
  EXPECT_TRUE(matches(*nested, text));
  text.insert(0, 5001, 'a');
  EXPECT_FALSE(matches(*nested, text));
  // Counts nested past the rule budget stop early with an error instead of building millions of rules.
  std::string nested_counts = "a";
  for (int k = 0; k < 25; ++k) nested_counts = "(" + nested_counts + "){10000}";  // 250,000 rules
  auto huge = regex_grammar(nested_counts);
  ASSERT_FALSE(huge.ok());
  EXPECT_NE(huge.message().find("too large"), std::string::npos) << huge.message();
  // A brace that starts no quantifier is itself (ECMAScript's Annex B, and Python); "{,n}" is refused:
  // a literal to one, {0,n} to the other.
  auto brace = regex_grammar("x{}{1a}");
  ASSERT_TRUE(brace.ok()) << brace.message();
  EXPECT_TRUE(matches(*brace, "x{}{1a}"));
  EXPECT_FALSE(regex_grammar("a{,2}").ok());
  // Named groups are plain groups (libstdc++'s engine has no named groups to compare with).
  auto named = regex_grammar("(?<year>\\d{4})-(?P<m>\\d\\d)");  // ECMAScript's and Python's spelling
  ASSERT_TRUE(named.ok()) << named.message();
  EXPECT_TRUE(matches(*named, "2026-12"));
  EXPECT_FALSE(matches(*named, "226-12"));
}
