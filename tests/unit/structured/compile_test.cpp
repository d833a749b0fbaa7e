// structured::compile, the one entry the server and the CLI use: each kind's grammar accepts what its
// spec means and refuses the rest (checked with the reference matcher, Grammar::matches), options
// change the language, bad specs are errors that say what is wrong, and the cache shares one compiled
// grammar per (kind, options, spec).
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "common/json_depth.h"
#include "structured/structured.h"
#include "tokenizer/tokenizer.h"

using namespace ss::structured;

namespace {

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

class Compile : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string dir = std::string(SS_SOURCE_DIR) + "/tests/data/tokenizer/";
    auto t = ss::tok::Tokenizer::from_json_text(read_file(dir + "qwen2.tokenizer.json"),
                                                read_file(dir + "qwen2.tokenizer_config.json"), "qwen2.tokenizer.json");
    ASSERT_TRUE(t.ok()) << t.message();
    tok_ = std::move(t).value().release();
  }
  static void TearDownTestSuite() {
    delete tok_;
    tok_ = nullptr;
  }
  // The compiled grammar's language: whole-text matches by the reference matcher.
  static bool accepts(Kind k, const std::string& spec, const Options& o, std::string_view text) {
    auto g = compile(k, spec, o, {.tokenizer = tok_});
    EXPECT_TRUE(g.ok()) << kind_name(k) << " " << spec << ": " << (g.ok() ? "" : g.message());
    return g.ok() && (*g)->grammar().matches(text);
  }
  static std::string error_of(Kind k, const std::string& spec, const Options& o = {}) {
    auto g = compile(k, spec, o, {.tokenizer = tok_});
    EXPECT_FALSE(g.ok()) << kind_name(k) << " " << spec;
    return g.ok() ? std::string() : g.message();
  }
  static ss::tok::Tokenizer* tok_;
};
ss::tok::Tokenizer* Compile::tok_ = nullptr;

TEST_F(Compile, EachKindKeepsItsLanguage) {
  const std::string schema =
      R"({"type":"object","properties":{"b":{"type":"integer"},"a":{"type":"boolean"}},"required":["b","a"]})";
  EXPECT_TRUE(accepts(Kind::JsonSchema, schema, {}, R"({"b":1,"a":true})"));
  EXPECT_TRUE(accepts(Kind::JsonSchema, schema, {}, R"({"b": 1, "a": true})"));
  EXPECT_FALSE(accepts(Kind::JsonSchema, schema, {}, R"({"a":true,"b":1})")) << "the declared order is kept";
  EXPECT_FALSE(accepts(Kind::JsonSchema, schema, {}, R"({"b":1.5,"a":true})"));
  EXPECT_FALSE(accepts(Kind::JsonSchema, schema, {.compact = true}, R"({"b": 1, "a": true})")) << "compact: no blanks";
  EXPECT_TRUE(accepts(Kind::JsonSchema, schema, {.compact = true}, R"({"b":1,"a":true})"));
  EXPECT_TRUE(accepts(Kind::JsonSchema, "true", {}, "[1, {}]")) << "a boolean schema";

  EXPECT_TRUE(accepts(Kind::JsonObject, "", {}, R"({"x": [1, null]})"));
  EXPECT_FALSE(accepts(Kind::JsonObject, "", {}, "[1]"));

  const std::string tools = R"([{"name":"f","parameters":{"type":"object","properties":{"x":{"type":"integer"}},"required":["x"]}}])";
  const std::string one = R"([{"name":"f","parameters":{"x":1}}])", two = R"([{"name":"f","parameters":{"x":1}},{"name":"f","parameters":{"x":2}}])";
  EXPECT_TRUE(accepts(Kind::ToolCalls, tools, {.compact = true}, one));
  EXPECT_TRUE(accepts(Kind::ToolCalls, tools, {.compact = true}, two));
  EXPECT_FALSE(accepts(Kind::ToolCalls, tools, {.compact = true, .parallel_calls = false}, two));
  EXPECT_FALSE(accepts(Kind::ToolCalls, tools, {.compact = true}, R"([{"name":"g","parameters":{"x":1}}])"));

  EXPECT_TRUE(accepts(Kind::Choice, R"(["yes","no"])", {}, "no"));
  EXPECT_FALSE(accepts(Kind::Choice, R"(["yes","no"])", {}, "maybe"));

  EXPECT_TRUE(accepts(Kind::Regex, "(ab)+c?", {}, "ababc"));
  EXPECT_FALSE(accepts(Kind::Regex, "(ab)+c?", {}, "aba"));

  EXPECT_TRUE(accepts(Kind::Gbnf, "root ::= \"x\" [0-9]+", {}, "x42"));
  EXPECT_FALSE(accepts(Kind::Gbnf, "root ::= \"x\" [0-9]+", {}, "x"));
}

TEST_F(Compile, BadSpecsSayWhatIsWrong) {
  EXPECT_NE(error_of(Kind::JsonSchema, "{not json").find("not JSON"), std::string::npos);
  EXPECT_NE(error_of(Kind::JsonSchema, R"j({"type":"string","pattern":"(?=a)"})j").find("lookaround"), std::string::npos);
  EXPECT_NE(error_of(Kind::JsonSchema, R"({"not":{}})").find("'not'"), std::string::npos);
  EXPECT_NE(error_of(Kind::Gbnf, "root ::= item").find("'item' is used but not defined"), std::string::npos);
  EXPECT_NE(error_of(Kind::Choice, R"(["a", 1])").find("array of strings"), std::string::npos);
  EXPECT_NE(error_of(Kind::ToolCalls, R"([{"name":"f"}])").find("parameters"), std::string::npos);
  // JSON past the shared depth bound is refused before anything recurses over it; at the bound it compiles.
  auto nest = [](size_t n) { return std::string(n, '[') + std::string(n, ']'); };
  const std::string deep = R"({"type":"object","x":)" + nest(ss::kMaxJsonDepth) + "}";
  EXPECT_NE(error_of(Kind::JsonSchema, deep).find("deeper than 128"), std::string::npos);
  EXPECT_NE(error_of(Kind::JsonSchema, std::string(200000, '[')).find("deeper"), std::string::npos);
  EXPECT_TRUE(accepts(Kind::JsonSchema, R"({"type":"object","x":)" + nest(ss::kMaxJsonDepth - 1) + "}", {}, "{}"));
  // The compiler recurses per schema, $ref included: a chain of references shallow as JSON stops at
  // the same bound.
  auto chain = [](size_t n) {
    std::string defs;
    for (size_t i = 0; i < n; ++i) defs += "\"d" + std::to_string(i) + "\":{\"$ref\":\"#/$defs/d" + std::to_string(i + 1) + "\"},";
    return R"({"$ref":"#/$defs/d0","$defs":{)" + defs + "\"d" + std::to_string(n) + R"(":{"type":"integer"}}})";
  };
  EXPECT_TRUE(accepts(Kind::JsonSchema, chain(ss::kMaxJsonDepth - 2), {}, "7"));
  EXPECT_NE(error_of(Kind::JsonSchema, chain(ss::kMaxJsonDepth)).find("nested too deeply"), std::string::npos);
  auto none = compile(Kind::Regex, "a", {}, {});
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.message().find("vocabulary"), std::string::npos);
}

TEST_F(Compile, TheCacheSharesOneGrammarPerKindOptionsAndSpec) {
  GrammarCache cache(3);
  const Vocab v{.tokenizer = tok_};
  auto get = [&](Kind k, const std::string& spec, Options o = {}) {
    auto g = compile(k, spec, o, v, &cache);
    EXPECT_TRUE(g.ok());
    return g.ok() ? *g : nullptr;
  };
  const std::string s = R"({"type":"array"})";
  auto a = get(Kind::JsonSchema, s);
  EXPECT_EQ(get(Kind::JsonSchema, s), a);
  EXPECT_NE(get(Kind::JsonSchema, s, {.compact = true}), a) << "options are part of the key";
  EXPECT_NE(get(Kind::Regex, s), a) << "so is the kind";
  EXPECT_EQ(cache.size(), 3u);
  EXPECT_NE(get(Kind::Regex, "b"), nullptr);  // a fourth: the least recently used (a) goes
  EXPECT_EQ(cache.size(), 3u);
  EXPECT_NE(get(Kind::JsonSchema, s), a);
  // A spec over 64 KiB is compiled but not kept.
  const std::string big = R"({"type":"integer","description":")" + std::string(70 * 1024, 'a') + "\"}";
  auto b1 = get(Kind::JsonSchema, big), b2 = get(Kind::JsonSchema, big);
  ASSERT_TRUE(b1 && b2);
  EXPECT_NE(b1, b2);
  // Without a cache every call compiles afresh; a prebuilt trie is used as given.
  auto trie = TokenTrie::build(*tok_);
  auto c = compile(Kind::Regex, "x", {}, {.trie = trie});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(&(*c)->trie(), trie.get());
}

}  // namespace
