// Structured outputs: the byte grammar, the JSON Schema compiler and the token masks, checked
// against nlohmann::json's own parser (an independent JSON implementation), against arithmetic
// for integer ranges and string lengths, and against a brute-force walk of every token for masks.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>

#include "structured/grammar.h"
#include "structured/json_schema.h"
#include "tokenizer/tokenizer.h"

using namespace ss::structured;
using nlohmann::json;
using ojson = nlohmann::ordered_json;  // schemas: key order is the generation order

namespace {

bool matches(const Grammar& g, std::string_view text) { return g.matches(text); }

Grammar compile(const ojson& schema) {
  auto g = json_schema_grammar(schema);
  EXPECT_TRUE(g.ok()) << schema.dump() << ": " << (g.ok() ? "" : g.message());
  return g.ok() ? std::move(g).value() : json_object_grammar();
}

std::string random_string(std::mt19937& rng) {
  static const std::vector<std::string> pieces = {"a", "Z", " ", "\"", "\\", "/", "\n", "\t", "\x01", "é", "€", "𝄞",
                                                  "ÿ", "{", "}", "[", "]", ":", ",", "0", "-", "e"};
  std::string s;
  for (int n = std::uniform_int_distribution<int>(0, 8)(rng); n > 0; --n) s += pieces[rng() % pieces.size()];
  return s;
}

json random_value(std::mt19937& rng, int depth) {
  switch (std::uniform_int_distribution<int>(0, depth > 3 ? 4 : 6)(rng)) {
    case 0: return nullptr;
    case 1: return rng() % 2 == 0;
    case 2: return std::uniform_int_distribution<int64_t>(-999999999999999, 999999999999999)(rng) >> (rng() % 50);
    case 3: {
      const double mant = std::uniform_real_distribution<double>(-1, 1)(rng);
      return mant * std::pow(10.0, std::uniform_int_distribution<int>(-90, 90)(rng));
    }
    case 4: return random_string(rng);
    case 5: {
      json a = json::array();
      for (int n = rng() % 4; n > 0; --n) a.push_back(random_value(rng, depth + 1));
      return a;
    }
    default: {
      json o = json::object();
      for (int n = rng() % 4; n > 0; --n) o[random_string(rng)] = random_value(rng, depth + 1);
      return o;
    }
  }
}

// A random byte walk through the grammar: printable ASCII most of the time, ending when it must or,
// once it may, with probability 1/4. Empty optional when it runs past max_len.
std::optional<std::string> walk(const Grammar& g, std::mt19937& rng, size_t max_len = 3000) {
  Grammar::State s = g.initial(), n;
  std::string out;
  std::vector<uint8_t> ascii, other;
  while (out.size() < max_len) {
    if (Grammar::must_end(s) || (Grammar::can_end(s) && rng() % 4 == 0)) return out;
    ascii.clear();
    other.clear();
    for (int c = 0; c < 256; ++c)
      if (g.advance(s, static_cast<uint8_t>(c), n)) (c >= 0x20 && c < 0x7f ? ascii : other).push_back(static_cast<uint8_t>(c));
    EXPECT_FALSE(ascii.empty() && other.empty()) << "dead end after: " << out;
    if (ascii.empty() && other.empty()) return std::nullopt;
    const auto& from = !ascii.empty() && (other.empty() || rng() % 10 != 0) ? ascii : other;
    const uint8_t c = from[rng() % from.size()];
    g.advance(s, c, n);
    std::swap(s, n);
    out += static_cast<char>(c);
  }
  return std::nullopt;
}

size_t code_points(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xc0) != 0x80;
  return n;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}
std::unique_ptr<ss::tok::Tokenizer> qwen2_tokenizer() {
  const std::string dir = std::string(SS_SOURCE_DIR) + "/tests/data/tokenizer/";
  auto t = ss::tok::Tokenizer::from_json_text(read_file(dir + "qwen2.tokenizer.json"),
                                              read_file(dir + "qwen2.tokenizer_config.json"), "qwen2.tokenizer.json");
  return t.ok() ? std::move(t).value() : nullptr;
}
}  // namespace

TEST(Grammar, JsonObjectGrammarAcceptsWhatASerializerWrites) {
  const Grammar g = json_object_grammar();
  std::mt19937 rng(7);
  for (int i = 0; i < 400; ++i) {
    json o = json::object();
    for (int n = rng() % 5; n > 0; --n) o[random_string(rng)] = random_value(rng, 1);
    const std::string compact = o.dump(), pretty = o.dump(2);
    EXPECT_TRUE(matches(g, compact)) << compact;
    EXPECT_TRUE(matches(g, pretty)) << pretty;
  }
  EXPECT_FALSE(matches(g, "[1, 2]")) << "json_object wants an object at the top";
  EXPECT_FALSE(matches(g, "\"x\""));
  EXPECT_FALSE(matches(g, "{} "));  // nothing after the value
}

TEST(Grammar, EverythingTheJsonGrammarAcceptsIsJson) {
  // Soundness against an independent parser: mutate valid documents byte by byte; whatever the
  // grammar still accepts, nlohmann::json must parse as an object.
  const Grammar g = json_object_grammar();
  std::mt19937 rng(11);
  int accepted_mutants = 0;
  for (int i = 0; i < 3000; ++i) {
    json o = json::object();
    for (int n = 1 + rng() % 3; n > 0; --n) o[random_string(rng)] = random_value(rng, 2);
    std::string t = o.dump(rng() % 2 ? -1 : 1);
    static const std::string alphabet = "{}[]\":,.-+eE0123456789 \n\\/tfnrula\x01\x7f\xc3\xa9\xed\xa0\x80";
    for (int m = 1 + rng() % 2; m > 0 && !t.empty(); --m) {
      const size_t at = rng() % t.size();
      switch (rng() % 3) {
        case 0: t.erase(at, 1); break;
        case 1: t.insert(t.begin() + static_cast<long>(at), alphabet[rng() % alphabet.size()]); break;
        default: t[at] = alphabet[rng() % alphabet.size()];
      }
    }
    if (matches(g, t)) {
      ++accepted_mutants;
      EXPECT_TRUE(json::accept(t)) << "grammar accepted non-JSON: " << t;
      if (json::accept(t)) {
        EXPECT_TRUE(json::parse(t).is_object()) << t;
      }
    }
  }
  EXPECT_GT(accepted_mutants, 100) << "the mutations should often keep the text valid";
}

TEST(Grammar, RandomWalksOfTheAnyValueGrammarAreJson) {
  const Grammar g = compile(ojson::object());  // {}: any JSON value
  std::mt19937 rng(3);
  int done = 0;
  for (int i = 0; i < 300; ++i) {
    auto t = walk(g, rng);
    if (!t) continue;
    ++done;
    EXPECT_TRUE(json::accept(*t)) << *t;
  }
  EXPECT_GT(done, 150);
}

TEST(Grammar, UnicodeInStringsIsWellFormedUtf8Only) {
  const Grammar g = compile({{"type", "string"}});
  EXPECT_TRUE(matches(g, "\"é€𝄞\""));
  EXPECT_TRUE(matches(g, "\"\\u00e9\\n\\\"\""));
  EXPECT_FALSE(matches(g, "\"\xc0\xaf\""));          // overlong
  EXPECT_FALSE(matches(g, "\"\xed\xa0\x80\""));      // a UTF-16 surrogate
  EXPECT_FALSE(matches(g, "\"\xf4\x90\x80\x80\""));  // past U+10FFFF
  EXPECT_FALSE(matches(g, "\"\x80\""));              // a lone continuation byte
  EXPECT_FALSE(matches(g, "\"a\nb\""));              // raw control character
  EXPECT_FALSE(matches(g, "\"\\x\""));               // unknown escape
}

TEST(Grammar, ObjectsFollowPropertiesRequiredAndAdditionalProperties) {
  const ojson schema = {{"type", "object"},
                       {"properties",
                        {{"name", {{"type", "string"}}},
                         {"age", {{"type", "integer"}, {"minimum", 0}, {"maximum", 150}}},
                         {"tags", {{"type", "array"}, {"items", {{"type", "string"}}}, {"maxItems", 3}}},
                         {"kind", {{"enum", {"cat", "dog", 3, nullptr}}}}}},
                       {"required", {"name", "age"}},
                       {"additionalProperties", false}};
  const Grammar g = compile(schema);
  // Properties come in the declared order (name, age, tags, kind); optional ones may be left out.
  EXPECT_TRUE(matches(g, R"({"name":"Rex","age":3})"));
  EXPECT_TRUE(matches(g, R"({"name": "Rex", "age": 3, "tags": ["a", "b"], "kind": null})"));
  EXPECT_TRUE(matches(g, R"({"name":"Rex","age":3,"kind":"dog"})"));
  EXPECT_FALSE(matches(g, R"({"age":3,"name":"Rex"})")) << "declared order";
  EXPECT_FALSE(matches(g, R"({"age":3})")) << "name is required";
  EXPECT_FALSE(matches(g, R"({"name":"Rex","age":3,"x":1})")) << "no other keys";
  EXPECT_FALSE(matches(g, R"({"name":"Rex","age":151})"));
  EXPECT_FALSE(matches(g, R"({"name":"Rex","age":-1})"));
  EXPECT_FALSE(matches(g, R"({"name":"Rex","age":3,"kind":"cow"})"));
  EXPECT_FALSE(matches(g, R"({"name":"Rex","age":3,"tags":["a","b","c","d"]})"));
  EXPECT_FALSE(matches(g, R"({"name":"Rex","age":3,"tags":[1]})"));
  EXPECT_FALSE(matches(g, R"({"name":"Rex","age":3,"tags":[],"tags":[]})")) << "no key twice";

  // Random walks always give documents that parse and keep to the schema.
  std::mt19937 rng(5);
  int done = 0;
  for (int i = 0; i < 200; ++i) {
    auto t = walk(g, rng);
    if (!t) continue;
    ++done;
    ASSERT_TRUE(json::accept(*t)) << *t;
    const json v = json::parse(*t);
    ASSERT_TRUE(v.is_object()) << *t;
    EXPECT_TRUE(v.contains("name") && v["name"].is_string()) << *t;
    EXPECT_TRUE(v.contains("age") && v["age"].is_number_integer() && v["age"] >= 0 && v["age"] <= 150) << *t;
    for (const auto& [k, x] : v.items()) {
      EXPECT_TRUE(k == "name" || k == "age" || k == "tags" || k == "kind") << *t;
      if (k == "tags") {
        EXPECT_TRUE(x.is_array() && x.size() <= 3) << *t;
      }
      if (k == "kind") {
        EXPECT_TRUE(x == "cat" || x == "dog" || x == 3 || x.is_null()) << *t;
      }
    }
  }
  EXPECT_GT(done, 150);
}

TEST(Grammar, AdditionalPropertiesSchemaAndUndeclaredRequiredKeys) {
  const Grammar g = compile({{"type", "object"},
                             {"properties", {{"id", {{"type", "integer"}}}}},
                             {"required", {"id", "note"}},
                             {"additionalProperties", {{"type", "boolean"}}}});
  EXPECT_TRUE(matches(g, R"({"id":1,"note":[1,{"a":null}]})"));
  EXPECT_TRUE(matches(g, R"({"id":1,"note":"x","extra":true,"more":false})"));
  EXPECT_FALSE(matches(g, R"({"id":1,"note":"x","extra":1})"));
  EXPECT_FALSE(matches(g, R"({"note":"x"})"));
}

TEST(Grammar, IntegerBoundsAreExact) {
  struct Case {
    ojson schema;
    std::function<bool(int64_t)> in;
  };
  const std::vector<Case> cases = {
      {{{"type", "integer"}, {"minimum", -5}, {"maximum", 120}}, [](int64_t v) { return v >= -5 && v <= 120; }},
      {{{"type", "integer"}, {"exclusiveMinimum", 2.5}, {"exclusiveMaximum", 10}}, [](int64_t v) { return v > 2 && v < 10; }},
      {{{"type", "integer"}, {"minimum", 0}}, [](int64_t v) { return v >= 0; }},
      {{{"type", "integer"}, {"minimum", 1}}, [](int64_t v) { return v >= 1; }},
      {{{"type", "integer"}}, [](int64_t) { return true; }},
  };
  for (const Case& c : cases) {
    const Grammar g = compile(c.schema);
    for (int64_t v = -300; v <= 300; ++v) EXPECT_EQ(matches(g, std::to_string(v)), c.in(v)) << c.schema.dump() << " " << v;
    EXPECT_FALSE(matches(g, "01")) << "no leading zeros";
    EXPECT_FALSE(matches(g, "1.0"));
  }
}

TEST(Grammar, CompactJsonHasNoBlanks) {
  const ojson schema = ojson::parse(R"({"type": "object", "properties": {"a": {"type": "array", "items": {"type": "integer"}}}})");
  auto g = json_schema_grammar(schema, {.compact = true});
  ASSERT_TRUE(g.ok()) << g.message();
  EXPECT_TRUE(matches(*g, R"({"a":[1,2]})"));
  EXPECT_TRUE(matches(*g, R"({})"));
  for (const char* spaced : {R"({"a": [1,2]})", R"({ "a":[1,2]})", R"({"a":[1, 2]})", "{\n}"}) EXPECT_FALSE(matches(*g, spaced)) << spaced;
  const Grammar any = json_object_grammar({.compact = true});
  EXPECT_TRUE(matches(any, json::parse(R"({"x": [1, {"y": "a b"}]})").dump()));  // dump() is compact
  EXPECT_FALSE(matches(any, json::parse(R"({"x": [1, {"y": "a b"}]})").dump(1)));
}

TEST(Grammar, OpenIntegerBoundsStaySmall) {
  // "minimum": 0 (Pydantic's ge=0) once built 2^16 rules per digit count: the open end recursed
  // into "any n digits" twice per digit. Every bound now stays a few hundred rules.
  for (const char* schema : {R"({"type": "integer", "minimum": 0})", R"({"type": "integer", "maximum": -1})",
                             R"({"type": "integer", "minimum": 1234, "maximum": 98765432109876})"}) {
    auto g = json_schema_grammar(ojson::parse(schema));
    ASSERT_TRUE(g.ok()) << g.message();
    EXPECT_LT(g->num_rules(), 1000) << schema;
  }
}

TEST(Grammar, AnyIntegerRangeIsExact) {
  // Random bounds of every size (either end may be open): every integer near the bounds, near the
  // digit-count boundaries and at random is accepted exactly when it lies in the range.
  std::mt19937_64 rng(21);
  auto pick = [&]() -> int64_t {
    const int digits = 1 + static_cast<int>(rng() % 12);
    int64_t v = static_cast<int64_t>(rng() % 1000000000000ULL);
    for (int d = 12; d > digits; --d) v /= 10;
    return rng() % 3 == 0 ? -v : v;
  };
  for (int i = 0; i < 150; ++i) {
    int64_t lo = pick(), hi = pick();
    if (lo > hi) std::swap(lo, hi);
    const bool has_lo = i % 5 != 1, has_hi = i % 5 != 2;
    ojson schema = {{"type", "integer"}};
    if (has_lo) schema["minimum"] = lo;
    if (has_hi) schema["maximum"] = hi;
    const Grammar g = compile(schema);
    std::vector<int64_t> probe;
    for (int64_t base : {lo, hi, int64_t{0}, int64_t{9}, int64_t{10}, int64_t{99}, int64_t{100}, int64_t{999999},
                         int64_t{1000000}, int64_t{-10}, int64_t{-1000}})
      for (int64_t d = -3; d <= 3; ++d) probe.push_back(base + d);
    for (int k = 0; k < 40; ++k) probe.push_back(pick());
    probe.push_back(9999999999999999);
    probe.push_back(-9999999999999999);
    for (int64_t v : probe) {
      const bool in = (!has_lo || v >= lo) && (!has_hi || v <= hi);
      ASSERT_EQ(matches(g, std::to_string(v)), in) << schema.dump() << " value " << v;
    }
    EXPECT_FALSE(matches(g, "-0")) << schema.dump();
    EXPECT_FALSE(matches(g, "007")) << schema.dump();
    // A few stacks per digit count (the length is open until the number ends), never one per value.
    GrammarMatcher m(g);
    GrammarMatcher::State st = m.initial();
    EXPECT_LE(st.size(), 64u) << schema.dump();
  }
}

TEST(Grammar, StringLengthsCountCodePoints) {
  const Grammar g = compile({{"type", "string"}, {"minLength", 2}, {"maxLength", 4}});
  std::mt19937 rng(9);
  for (int i = 0; i < 300; ++i) {
    std::string s;
    static const std::vector<std::string> pieces = {"a", "é", "€", "𝄞", "\\n", "\\u0041"};
    std::string raw;
    size_t n = rng() % 7;
    for (size_t k = 0; k < n; ++k) raw += pieces[rng() % pieces.size()];
    const std::string text = "\"" + raw + "\"";
    ASSERT_TRUE(json::accept(text));
    const size_t len = code_points(json::parse(text).get<std::string>());
    EXPECT_EQ(matches(g, text), len >= 2 && len <= 4) << text;
  }
}

TEST(Grammar, DateTimeAndUuidFormatsAreRealValues) {
  using namespace std::chrono;
  const Grammar date = compile({{"type", "string"}, {"format", "date"}});
  char buf[64];
  for (int y : {2023, 2024})
    for (unsigned m = 0; m <= 13; ++m)
      for (unsigned d = 0; d <= 32; ++d) {
        std::snprintf(buf, sizeof buf, "\"%04d-%02u-%02u\"", y, m, d);
        const bool real = year_month_day(year(y), month(m), day(d)).ok();
        // Every accepted date is real; every real one is accepted but February 29 (the grammar does
        // not look at the year).
        EXPECT_EQ(matches(date, buf), real && !(m == 2 && d == 29)) << buf;
      }
  const Grammar time = compile({{"type", "string"}, {"format", "time"}});
  std::mt19937 rng(17);
  for (int i = 0; i < 2000; ++i) {
    const int h = rng() % 26, mi = rng() % 62, se = rng() % 62;
    const char* zones[] = {"Z", "+02:00", "-11:30", "", "+24:00", "z"};
    const int z = rng() % 6;
    const bool frac = rng() % 3 == 0;
    std::snprintf(buf, sizeof buf, "\"%02d:%02d:%02d%s%s\"", h, mi, se, frac ? ".125" : "", zones[z]);
    const bool valid = h < 24 && mi < 60 && se < 60 && z < 3;
    EXPECT_EQ(matches(time, buf), valid) << buf;
  }
  const Grammar dt = compile({{"type", "string"}, {"format", "date-time"}});
  EXPECT_TRUE(matches(dt, "\"2024-06-30T23:59:59.5+05:30\""));
  EXPECT_FALSE(matches(dt, "\"2024-06-31T23:59:59Z\""));
  EXPECT_FALSE(matches(dt, "\"2024-06-30 23:59:59Z\""));
  const Grammar uuid = compile({{"type", "string"}, {"format", "uuid"}});
  EXPECT_TRUE(matches(uuid, "\"123e4567-e89b-12d3-A456-426614174000\""));
  EXPECT_FALSE(matches(uuid, "\"123e4567e89b12d3a456426614174000\""));
  EXPECT_FALSE(matches(uuid, "\"123e4567-e89b-12d3-a456-42661417400g\""));
  // Other formats stay annotations: any string.
  EXPECT_TRUE(matches(compile({{"type", "string"}, {"format", "email"}}), "\"not an email\""));
  EXPECT_FALSE(json_schema_grammar({{"type", "string"}, {"format", "date"}, {"maxLength", 5}}).ok());
}

TEST(Grammar, AnyOfRefsAndRecursion) {
  const ojson schema = {{"$defs",
                        {{"node",
                          {{"type", "object"},
                           {"properties", {{"v", {{"type", "integer"}}}, {"next", {{"anyOf", {{{"$ref", "#/$defs/node"}}, {{"type", "null"}}}}}}}},
                           {"required", {"v", "next"}},
                           {"additionalProperties", false}}}}},
                       {"$ref", "#/$defs/node"}};
  const Grammar g = compile(schema);
  EXPECT_TRUE(matches(g, R"({"v":1,"next":{"v":2,"next":null}})"));
  EXPECT_FALSE(matches(g, R"({"v":1,"next":{"v":2}})"));
  const Grammar t = compile({{"type", {"string", "null"}}});
  EXPECT_TRUE(matches(t, "null"));
  EXPECT_TRUE(matches(t, "\"x\""));
  EXPECT_FALSE(matches(t, "1"));
  const Grammar nullable = compile({{"type", "number"}, {"nullable", true}});
  EXPECT_TRUE(matches(nullable, "null"));
  EXPECT_TRUE(matches(nullable, "-1.5e+10"));
}

TEST(Grammar, LargeEnumsStayOneStack) {
  // 5000 values sharing prefixes: exactly those match, and the matcher holds one stack per byte that
  // may come next (at most 11 here: ten digits and the closing quote), where a flat list of
  // alternatives would hold 5000 at the start.
  ojson values = ojson::array();
  std::set<std::string> words;
  for (int i = 0; i < 5000; ++i) {
    const std::string w = "item-" + std::to_string(i * 7 % 5003);
    values.push_back(w);
    words.insert(ojson(w).dump());
  }
  values.push_back(12);
  words.insert("12");
  const Grammar g = compile({{"enum", values}});
  for (const std::string& w : words) EXPECT_TRUE(matches(g, w)) << w;
  for (const char* w : {"\"item-\"", "\"item-5003\"", "\"item-1\"x", "1", "123"})
    EXPECT_EQ(matches(g, w), words.count(w) > 0) << w;
  GrammarMatcher m(g);
  GrammarMatcher::State s = m.initial(), n;
  EXPECT_LE(s.size(), 2u);
  for (char c : std::string("\"item-12")) {
    ASSERT_TRUE(m.advance(s, static_cast<uint8_t>(c), n));
    std::swap(s, n);
    EXPECT_LE(s.size(), 11u);
  }
  ojson many = ojson::array();
  for (int i = 0; i < 129; ++i) many.push_back({{"const", i}});
  auto e = json_schema_grammar({{"anyOf", many}});
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.message().find("alternatives"), std::string::npos) << e.message();
}

// 100 array alternatives whose items are 100 array alternatives: after one '[' every pair is alive.
ojson ambiguous_schema() {
  ojson inner = ojson::array(), outer = ojson::array();
  for (int i = 0; i < 100; ++i) inner.push_back({{"type", "array"}, {"minItems", 1}, {"items", {{"type", "integer"}}}});
  for (int i = 0; i < 100; ++i) outer.push_back({{"type", "array"}, {"minItems", 1}, {"items", {{"anyOf", inner}}}});
  return {{"anyOf", outer}};
}

TEST(Grammar, ATooAmbiguousSchemaStopsTheMatcherNotTheEngine) {
  const Grammar g = compile(ambiguous_schema());
  GrammarMatcher m(g);
  GrammarMatcher::State s = m.initial(), n;
  EXPECT_EQ(s.size(), 100u);
  EXPECT_FALSE(m.advance(s, '[', n)) << "10,000 alternatives: more than kMaxStacks";
  EXPECT_TRUE(m.overflowed());
  // The constraint turns it into an error the engine finishes the request with, quickly.
  auto tok = qwen2_tokenizer();
  ASSERT_TRUE(tok);
  auto cg = std::make_shared<CompiledGrammar>(compile(ambiguous_schema()), TokenTrie::build(*tok));
  GrammarConstraint c(cg, {tok->eos_id() >= 0 ? tok->eos_id() : tok->eog_ids().at(0)});
  EXPECT_TRUE(c.error().empty());
  std::vector<float> logits(static_cast<size_t>(tok->vocab_size()), 0.0f);
  const auto t0 = std::chrono::steady_clock::now();
  c.mask(logits.data(), tok->vocab_size());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
  EXPECT_EQ(c.error().rfind(std::string(ss::backend::kConstraintErrorPrefix), 0), 0u) << c.error();
  EXPECT_NE(c.error().find("too ambiguous"), std::string::npos) << c.error();
}

TEST(Grammar, UnsupportedSchemasAreClearErrors) {
  struct Case {
    ojson schema;
    std::string needle;
  };
  const std::vector<Case> cases = {
      {{{"type", "object"}, {"patternProperties", {{"^a", {{"type", "string"}}}}}}, "'patternProperties' is not supported"},
      {{{"type", "object"}, {"properties", {{"a", {{"type", "number"}, {"multipleOf", 2}}}}}}, "#/properties/a/multipleOf"},
      {{{"type", "array"}, {"uniqueItems", true}}, "uniqueItems"},
      {{{"$ref", "https://example.com/s.json"}}, "same document"},
      {{{"$ref", "#/$defs/missing"}}, "does not resolve"},
      {false, "matches nothing"},
      {{{"type", "integer"}, {"minimum", 1e16}}, "out of the supported range"},
      {{{"type", "integer"}, {"minimum", 5}, {"maximum", 4}}, "admit no value"},
      {{{"type", "number"}, {"maximum", 4}}, "bounds on a 'number'"},
      {{{"type", "strng"}}, "unknown type 'strng'"},
      {{{"type", "string"}, {"minLength", -1}}, "minLength"},
      {{{"type", "string"}, {"minLength", 4}, {"maxLength", 2}}, "below minLength"},
      {{{"anyOf", json::array()}}, "non-empty array"},
      {{{"allOf", {{{"type", "string"}}, {{"minLength", 2}}}}}, "allOf"},
      {"string", "must be an object or a boolean"},
  };
  for (const Case& c : cases) {
    auto g = json_schema_grammar(c.schema);
    ASSERT_FALSE(g.ok()) << c.schema.dump();
    EXPECT_NE(g.message().find(c.needle), std::string::npos) << c.schema.dump() << " -> " << g.message();
  }
  EXPECT_FALSE(choice_grammar({}).ok());
  EXPECT_FALSE(choice_grammar({"a", ""}).ok());
}

TEST(Grammar, LeftRecursionIsRefused) {
  Grammar g;
  const int a = g.new_rule(), b = g.new_rule();
  g.add_alt(a, {Grammar::ref(b), g.byte('x')});
  g.add_alt(b, {});
  g.add_alt(b, {Grammar::ref(a)});
  g.set_root(a);
  EXPECT_FALSE(g.validate().ok());
}


TEST(Grammar, TokenMasksEqualABruteForceWalkOfEveryToken) {
  auto tok = qwen2_tokenizer();
  ASSERT_TRUE(tok);
  auto trie = TokenTrie::build(*tok);
  const ojson schema = {{"type", "object"},
                       {"properties", {{"name", {{"type", "string"}}}, {"n", {{"type", "integer"}, {"minimum", 0}, {"maximum", 99}}}}},
                       {"required", {"name", "n"}}};
  auto cg = std::make_shared<CompiledGrammar>(compile(schema), trie);
  const Grammar& g = cg->grammar();
  // States along a valid document, each checked against every token's bytes one by one with the
  // reference matcher (Grammar::advance); the masks come from the fast matcher and its trie walk.
  const std::string doc = R"({"name": "Ab c\u00e9", "n": 42})";
  GrammarMatcher fast(g);
  GrammarMatcher::State fs = fast.initial(), fn;
  Grammar::State s = g.initial(), n;
  for (size_t pos = 0; pos <= doc.size(); ++pos) {
    const auto bits = cg->allowed(fast, fs);
    int allowed = 0;
    for (int32_t id = 0; id < tok->vocab_size(); ++id) {
      bool ok = !trie->piece(id).empty();
      Grammar::State t = s, u;
      for (char c : trie->piece(id)) {
        if (!ok) break;
        ok = g.advance(t, static_cast<uint8_t>(c), u);
        std::swap(t, u);
      }
      const bool bit = (*bits)[static_cast<size_t>(id) >> 6] >> (id & 63) & 1;
      ASSERT_EQ(bit, ok) << "token " << id << " '" << trie->piece(id) << "' after '" << doc.substr(0, pos) << "'";
      allowed += ok;
    }
    EXPECT_EQ(GrammarMatcher::can_end(fs), Grammar::can_end(s)) << doc.substr(0, pos);
    if (pos < doc.size()) {
      EXPECT_GT(allowed, 0) << doc.substr(0, pos);
      ASSERT_TRUE(g.advance(s, static_cast<uint8_t>(doc[pos]), n)) << doc.substr(0, pos + 1);
      ASSERT_TRUE(fast.advance(fs, static_cast<uint8_t>(doc[pos]), fn)) << doc.substr(0, pos + 1);
      std::swap(s, n);
      std::swap(fs, fn);
    }
  }
  EXPECT_TRUE(Grammar::must_end(s));
  EXPECT_TRUE(GrammarMatcher::must_end(fs));
  EXPECT_GT(cg->cache_stats().misses, 0u);
  // Another matcher (another request) reaching the same state hits the shared cache.
  GrammarMatcher other(g);
  GrammarMatcher::State os = other.initial(), on;
  for (char c : doc) {
    ASSERT_TRUE(other.advance(os, static_cast<uint8_t>(c), on));
    std::swap(os, on);
  }
  const auto hits = cg->cache_stats().hits;
  cg->allowed(other, os);
  EXPECT_EQ(cg->cache_stats().hits, hits + 1);
}

TEST(Grammar, FastMatcherAgreesWithTheReferenceOnRandomText) {
  // Byte by byte over random mutations of valid documents: both matchers agree on life, death and
  // completeness at every prefix.
  const Grammar g = compile({{"type", "object"},
                             {"properties", {{"a", {{"type", "array"}, {"items", {{"type", "integer"}}}, {"maxItems", 4}}},
                                             {"b", {{"anyOf", {{{"type", "string"}, {"maxLength", 5}}, {{"type", "null"}}}}}},
                                             {"c", ojson::object()}}},
                             {"required", {"a"}}});
  std::mt19937 rng(13);
  static const std::string alphabet = "{}[]\":,.-0123456789 \nabcnul\\";
  for (int i = 0; i < 500; ++i) {
    std::string t = R"({"a": [1, -2, 30], "b": "xy", "c": {"k": [true, null, 1.5e3]}})";
    for (int m = rng() % 4; m > 0; --m) t[rng() % t.size()] = alphabet[rng() % alphabet.size()];
    GrammarMatcher fast(g);
    GrammarMatcher::State fs = fast.initial(), fn;
    Grammar::State s = g.initial(), n;
    for (char c : t) {
      const bool a = g.advance(s, static_cast<uint8_t>(c), n);
      const bool b = fast.advance(fs, static_cast<uint8_t>(c), fn);
      ASSERT_EQ(a, b) << t;
      if (!a) break;
      std::swap(s, n);
      std::swap(fs, fn);
      ASSERT_EQ(Grammar::can_end(s), GrammarMatcher::can_end(fs)) << t;
      ASSERT_EQ(Grammar::must_end(s), GrammarMatcher::must_end(fs)) << t;
    }
  }
}

TEST(Grammar, ConstraintAllowsEndOnlyWhenWholeAndFollowsTokens) {
  auto tok = qwen2_tokenizer();
  ASSERT_TRUE(tok);
  auto trie = TokenTrie::build(*tok);
  auto cg = std::make_shared<CompiledGrammar>(compile({{"type", "integer"}, {"minimum", 0}}), trie);
  const int32_t eos = tok->eos_id() >= 0 ? tok->eos_id() : tok->eog_ids().at(0);
  GrammarConstraint c(cg, {eos});
  // The model's rows may outnumber the tokenizer's tokens (a padded lm_head): those ids have no text.
  const int padded = tok->vocab_size() + 4;
  std::vector<float> logits(static_cast<size_t>(padded), 1.0f);
  c.mask(logits.data(), padded);
  EXPECT_EQ(logits[static_cast<size_t>(eos)], -std::numeric_limits<float>::infinity()) << "nothing written yet";
  for (int id = tok->vocab_size(); id < padded; ++id)
    EXPECT_EQ(logits[static_cast<size_t>(id)], -std::numeric_limits<float>::infinity()) << "padding id " << id;
  const auto one = tok->encode("7", false, false);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(logits[static_cast<size_t>(one[0])], 1.0f);
  const auto minus = tok->encode("-", false, false);
  ASSERT_EQ(minus.size(), 1u);
  EXPECT_EQ(logits[static_cast<size_t>(minus[0])], -std::numeric_limits<float>::infinity()) << "minimum 0";
  c.accept(one[0]);
  EXPECT_FALSE(c.must_end()) << "a number may go on";
  std::fill(logits.begin(), logits.end(), 1.0f);
  c.mask(logits.data(), padded);
  EXPECT_EQ(logits[static_cast<size_t>(eos)], 1.0f) << "7 is a whole integer";
  // A choice is over once written.
  auto ch = std::make_shared<CompiledGrammar>(std::move(choice_grammar({"yes", "no"})).value(), trie);
  GrammarConstraint cc(ch, {eos});
  for (int32_t id : tok->encode("no", false, false)) cc.accept(id);
  EXPECT_TRUE(cc.must_end());
}
