// GBNF → grammar: a JSON grammar written in GBNF checked against nlohmann::json's parser (accepts
// exactly what it accepts, on serialized values and on mutations of them), regular GBNF grammars
// against std::regex on every short string, and the errors a grammar author needs.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <regex>

#include "all_strings.h"
#include "structured/gbnf.h"
#include "structured/grammar.h"

using namespace ss::structured;
using ss::test::all_strings;
using nlohmann::json;

namespace {

bool matches(const Grammar& g, std::string_view text) { return g.matches(text); }

Grammar compile(std::string_view text) {
  auto g = gbnf_grammar(text);
  EXPECT_TRUE(g.ok()) << text << "\n-> " << (g.ok() ? "" : g.message());
  return g.ok() ? std::move(g).value() : Grammar{};
}

// JSON (RFC 8259) in GBNF, in the shape of llama.cpp's grammars/json.gbnf.
constexpr const char* kJsonGbnf = R"GBNF(
# A JSON text: any value, blanks around it.
root   ::= ws value ws
value  ::= object | array | string | number | "true" | "false" | "null"
object ::= "{" ws ( member ( ws "," ws member )* ws )? "}"
member ::= string ws ":" ws value
array  ::=
  "[" ws ( value ( ws "," ws value )* ws )? "]"
string ::= "\"" char* "\""
char   ::= [^"\\\x00-\x1F]
         | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} )   # escapes
number ::= "-"? ( "0" | [1-9] [0-9]* ) ( "." [0-9]+ )? ( [eE] [-+]? [0-9]+ )?
ws     ::= [ \t\n\r]*
)GBNF";

json random_value(std::mt19937& rng, int depth) {
  static const std::vector<std::string> pieces = {"a", "Z", " ", "\"", "\\", "/", "\n", "\x01", "é", "𝄞", "0"};
  switch (std::uniform_int_distribution<int>(0, depth > 2 ? 4 : 6)(rng)) {
    case 0: return nullptr;
    case 1: return rng() % 2 == 0;
    case 2: return static_cast<int64_t>(rng()) - (1ll << 31);
    case 3: return std::uniform_real_distribution<double>(-1e6, 1e6)(rng);
    case 4: {
      std::string s;
      for (int n = static_cast<int>(rng() % 6); n > 0; --n) s += pieces[rng() % pieces.size()];
      return s;
    }
    case 5: {
      json a = json::array();
      for (int n = static_cast<int>(rng() % 4); n > 0; --n) a.push_back(random_value(rng, depth + 1));
      return a;
    }
    default: {
      json o = json::object();
      for (int n = static_cast<int>(rng() % 4); n > 0; --n) {
        std::string key = "k";
        key.push_back(static_cast<char>('0' + rng() % 9));
        o[key] = random_value(rng, depth + 1);
      }
      return o;
    }
  }
}

}  // namespace

TEST(Gbnf, AJsonGrammarAcceptsExactlyWhatAJsonParserAccepts) {
  const Grammar g = compile(kJsonGbnf);
  std::mt19937 rng(3);
  const std::string edits = "{}[]\",:0-e.\\ a1E+u\t";
  int accepted_mutants = 0, rejected_mutants = 0;
  for (int k = 0; k < 400; ++k) {
    const json v = random_value(rng, 0);
    std::string padded = " ";
    padded.append(v.dump(1, '\t')).append("\n");
    for (const std::string& text : {v.dump(), v.dump(2), padded}) {
      ASSERT_TRUE(matches(g, text)) << text;
      for (int m = 0; m < 6; ++m) {  // one random edit: the grammar and the parser must still agree
        std::string t = text;
        const size_t at = t.empty() ? 0 : rng() % t.size();
        switch (rng() % 3) {
          case 0: t.insert(t.begin() + static_cast<long>(at), edits[rng() % edits.size()]); break;
          case 1: if (!t.empty()) t.erase(at, 1); break;
          default: if (!t.empty()) t[at] = edits[rng() % edits.size()]; break;
        }
        bool ok = json::accept(t);
        if (!ok && matches(g, t)) {  // the syntax is JSON's; nlohmann also refuses numbers past a double
          try {
            const json parsed = json::parse(t);
            ADD_FAILURE() << "parse() took what accept() refused: " << parsed.dump();
          } catch (const json::exception& e) {
            ASSERT_NE(std::string(e.what()).find("number overflow"), std::string::npos) << t << ": " << e.what();
            continue;
          }
        }
        ASSERT_EQ(matches(g, t), ok) << t;
        (ok ? accepted_mutants : rejected_mutants)++;
      }
    }
  }
  EXPECT_GT(accepted_mutants, 100);
  EXPECT_GT(rejected_mutants, 1000);
}

TEST(Gbnf, RegularGrammarsAgreeWithStdRegexOnEveryShortString) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"(root ::= "a"+ "b"?)", "a+b?"},
      {"root ::= x{2,3} | [^a-b]\nx ::= \"ab\" | \"c\"", "(ab|c){2,3}|[^ab]"},
      {R"(root ::= ( "a" | "b" )* "c")", "(a|b)*c"},
      {R"(root ::= "a" . "c")", "a[\\s\\S]c"},
      {R"(root ::= "a"{,2} "b"{1,})", "a{0,2}b+"},
      {"root ::= item\n  | item \",\" root   # an alternative on the next line\nitem ::= [0-9.]", "[0-9.](,[0-9.])*"},
      {R"(root ::= "\x61\u0062" [\n\t -] "\"" )", "ab[\\n\\t -]\""},
      {"root::=[a-c]{0}\"1\"|rest\nrest ::= ( \"-\" | \" \" )? ( \"a\" [b-c] )*", "1|[- ]?(a[bc])*"},
      {R"(root ::= "" | "a" root "b")", ""},  // not regular: checked by counting below
  };
  const std::vector<std::string> texts = all_strings("abc1. -\n", 4);
  for (const auto& [gbnf, re_text] : cases) {
    const Grammar g = compile(gbnf);
    if (re_text.empty()) {  // a^n b^n
      for (const std::string& t : texts) {
        const size_t n = t.size() / 2;
        std::string anbn(n, 'a');
        anbn.append(n, 'b');
        const bool want = t.size() % 2 == 0 && t == anbn;
        ASSERT_EQ(matches(g, t), want) << gbnf << " '" << t << "'";
      }
      continue;
    }
    const std::regex re(re_text, std::regex::ECMAScript);
    for (const std::string& t : texts) ASSERT_EQ(matches(g, t), std::regex_match(t, re)) << gbnf << " '" << t << "'";
  }
}

TEST(Gbnf, VllmsDocumentationExampleGrammar) {
  // The SQL grammar from vLLM's structured-outputs documentation.
  const Grammar g = compile(R"(
    root ::= select_statement
    select_statement ::= "SELECT " column " from " table " where " condition
    column ::= "col_1 " | "col_2 "
    table ::= "table_1 " | "table_2 "
    condition ::= column "= " number
    number ::= "1 " | "2 "
  )");
  EXPECT_TRUE(matches(g, "SELECT col_1  from table_2  where col_2 = 1 "));
  EXPECT_FALSE(matches(g, "SELECT col_3  from table_2  where col_2 = 1 "));
}

TEST(Gbnf, UnicodeClassesAndLiterals) {
  const Grammar g = compile(R"(root ::= "é" [α-ω]+ [^a-z\u00FF] "\U0001D11E")");
  EXPECT_TRUE(matches(g, "éαβ𝄞𝄞"));
  EXPECT_TRUE(matches(g, "éω€𝄞"));
  EXPECT_FALSE(matches(g, "éαb𝄞"));
  EXPECT_FALSE(matches(g, "éαÿ𝄞"));
  EXPECT_FALSE(matches(g, "eα€𝄞"));
}

TEST(Gbnf, ErrorsNameTheRuleAndThePlace) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"root ::= item", "'item' is used but not defined (line 1, column 10)"},
      {"root ::= root \"a\" | \"b\"", "left-recursive (rule 'root')"},
      {"root ::= x\nx ::= x? \"a\" x", "left-recursive"},
      {"start ::= \"a\"", "no 'root' rule"},
      {"root ::= \"a\"\nroot ::= \"b\"", "defined twice (line 2, column 1)"},
      {"root ::= \"abc", "unterminated string"},
      {"root ::= ( \"a\" ", "missing ')'"},
      {"root ::= \"a\" )", "unmatched ')'"},
      {"root ::= \"\\q\"", "unknown escape"},
      {"root ::= \"a\"{3,2}", "n < m"},
      {"root ::= \"a\"{20000}", "above 10000"},
      {"root ::= [z-a]", "out of order"},
      {"root ::= [abc", "missing ']'"},
      {"root ::= \"\xff\"", "UTF-8"},
      {"root ::= @", "unexpected '@'"},
      {"root = \"a\"", "expected '::='"},
      {"", "no 'root' rule"},
      {"root ::= \"\\uD800\"", "Unicode scalar"},
      {"root ::= \"a\"{}", "expected a count"},
      {"root ::= \"a\"{10000} \"b\"{10000} \"c\"{10000} \"d\"{10000} \"e\"{10000} \"f\"{10000} \"g\"{10000} "
       "\"h\"{10000} \"i\"{10000} \"j\"{10000} \"k\"{10000} \"l\"{10000} \"m\"{10000} \"n\"{10000} \"o\"{10000} "
       "\"p\"{10000} \"q\"{10000} \"r\"{10000} \"s\"{10000} \"t\"{10000} \"u\"{10000}",
       "too large"},
  };
  for (const auto& [text, what] : bad) {
    auto g = gbnf_grammar(text);
    ASSERT_FALSE(g.ok()) << text;
    EXPECT_NE(g.message().find(what), std::string::npos) << text << " -> " << g.message();
  }
}
