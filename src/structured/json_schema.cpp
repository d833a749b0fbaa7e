#include "structured/json_schema.h"

#include "common/json_depth.h"
#include "structured/regex.h"

#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <set>

namespace ss::structured {

// Schemas keep their key order: declared properties are generated in the order written.
using json = nlohmann::ordered_json;
using Seq = Grammar::Seq;

namespace {

constexpr int kMaxWhitespace = 20;    // blanks between two tokens of the JSON text
constexpr int kMaxIntDigits = 16;     // digits of a number's integer part
constexpr int kMaxFracDigits = 16;
constexpr int kMaxExpDigits = 2;   // |exponent| <= 99: every number fits a double
constexpr int kMaxRepeat = 100000;
constexpr size_t kMaxAlternatives = 128;  // anyOf / oneOf     // minItems / maxLength and friends beyond this are refused

// Keywords that constrain in ways the grammar does not follow: refused, never dropped silently.
const std::set<std::string> kUnsupported = {
    "patternProperties", "propertyNames",    "minProperties",   "maxProperties",
    "dependentRequired", "dependentSchemas", "dependencies",     "if",              "then",
    "else",             "not",               "contains",         "minContains",     "maxContains",
    "multipleOf",       "prefixItems",       "additionalItems",  "unevaluatedProperties",
    "unevaluatedItems", "contentSchema",     "$dynamicRef",      "$recursiveRef",
};
const std::set<std::string> kFormats = {"date", "time", "date-time", "uuid"};  // string_format() follows these
const std::set<std::string> kTypes = {"object", "array", "string", "number", "integer", "boolean", "null"};

// Exactly the given strings, as a trie of rules: one stack however many strings share a prefix
// (an enum of thousands of values stays as cheap to match as one literal).
int literal_trie(Grammar& g, const std::vector<std::string>& words) {
  struct Node {
    std::map<uint8_t, int> kids;
    bool end = false;
  };
  std::vector<Node> t(1);
  for (const std::string& w : words) {
    int cur = 0;
    for (char ch : w) {
      const uint8_t c = static_cast<uint8_t>(ch);
      auto it = t[static_cast<size_t>(cur)].kids.find(c);
      if (it == t[static_cast<size_t>(cur)].kids.end()) {
        t.emplace_back();
        it = t[static_cast<size_t>(cur)].kids.emplace(c, static_cast<int>(t.size() - 1)).first;
      }
      cur = it->second;
    }
    t[static_cast<size_t>(cur)].end = true;
  }
  std::vector<int> rule(t.size(), -1);
  for (size_t i = t.size(); i-- > 0;) {  // children were created after their parents
    rule[i] = g.new_rule();
    if (t[i].end) g.add_alt(rule[i], {});
    for (const auto& [c, k] : t[i].kids) g.add_alt(rule[i], {g.byte(c), Grammar::ref(rule[static_cast<size_t>(k)])});
  }
  return rule[0];
}

class Compiler {
 public:
  Compiler(const json& root, Grammar& g, const JsonOptions& opt = {}) : root_(root), g_(g), compact_(opt.compact) {}

  // The schema's rule, added to the grammar (its root is left alone).
  Expected<int> run() {
    const int r = compile(root_, "#");
    if (!err_.empty()) return make_error(err_);
    return r;
  }
  int any_object_rule() { return object_any(); }
  int ws_rule() { return ws(); }

 private:
  int fail(const std::string& where, const std::string& what) {
    if (err_.empty()) err_ = "schema at " + where + ": " + what;
    return alt_rule({});  // a placeholder so building can go on; run() reports err_
  }

  int alt_rule(const std::vector<Seq>& alts) {
    const int r = g_.new_rule();
    for (const Seq& a : alts) g_.add_alt(r, a);
    return r;
  }
  static Seq cat(std::initializer_list<Seq> parts) {
    Seq s;
    for (const Seq& p : parts) s.insert(s.end(), p.begin(), p.end());
    return s;
  }
  Seq lit(std::string_view s) { return g_.literal(s); }
  static Seq ref(int r) { return Seq{Grammar::ref(r)}; }

  int repeat(const Seq& item, int64_t min, int64_t max) { return g_.repeat(item, min, max); }

  // ---- shared pieces ----
  int ws() {
    if (ws_ >= 0) return ws_;
    int r = alt_rule({Seq{}});
    if (compact_) return ws_ = r;  // no blanks between tokens
    for (int k = 0; k < kMaxWhitespace; ++k) {
      const int next = g_.new_rule();
      g_.add_alt(next, Seq{});
      g_.add_alt(next, Seq{g_.byte(' '), Grammar::ref(r)});
      g_.add_alt(next, Seq{g_.byte('\t'), Grammar::ref(r)});
      g_.add_alt(next, Seq{g_.byte('\n'), Grammar::ref(r)});
      r = next;
    }
    return ws_ = r;
  }
  Seq W() { return ref(ws()); }

  int string_char() {
    if (char_ >= 0) return char_;
    // Unescaped: every scalar value but controls, '"' and '\\', as well-formed UTF-8 (no overlongs,
    // surrogates or values past U+10FFFF); escaped: the short escapes and \uXXXX.
    const Seq raw = *CodePointEncoder(g_, /*json_string=*/false).encode({{0x20, 0x21}, {0x23, 0x5B}, {0x5D, 0x10FFFF}});
    const Grammar::Elem hex = g_.one_of("0123456789abcdefABCDEF");
    char_ = alt_rule({
        raw,
        Seq{g_.byte('\\'), g_.one_of("\"\\/bfnrt")},
        Seq{g_.byte('\\'), g_.byte('u'), hex, hex, hex, hex},
    });
    return char_;
  }

  int string_any() {
    if (string_ >= 0) return string_;
    return string_ = string_len(0, -1);
  }
  int string_len(int64_t min, int64_t max) {
    const int chars = repeat(ref(string_char()), min, max);
    return alt_rule({cat({lit("\""), ref(chars), lit("\"")})});
  }

  // Strings of a known format, quoted (the formats Pydantic emits for date, time, datetime and
  // UUID fields, as RFC 3339 / RFC 4122 spell them); -1 for a format that stays an annotation.
  int string_format(const std::string& fmt) {
    auto R = [&](char lo, char hi) { return g_.range(static_cast<uint8_t>(lo), static_cast<uint8_t>(hi)); };
    const Grammar::Elem d = R('0', '9');
    auto two = [&](std::vector<Seq> alts) { return ref(alt_rule(alts)); };
    const Seq hour = two({Seq{R('0', '1'), d}, Seq{g_.byte('2'), R('0', '3')}});
    const Seq minute = Seq{R('0', '5'), d};
    // Days by month, so every date is a real one (February stops at 28: a 29th needs the year).
    const Seq d31 = two({Seq{g_.byte('0'), R('1', '9')}, Seq{R('1', '2'), d}, Seq{g_.byte('3'), R('0', '1')}});
    const Seq d30 = two({Seq{g_.byte('0'), R('1', '9')}, Seq{R('1', '2'), d}, lit("30")});
    const Seq d28 = two({Seq{g_.byte('0'), R('1', '9')}, Seq{g_.byte('1'), d}, Seq{g_.byte('2'), R('0', '8')}});
    std::vector<Seq> md;
    for (const char* m : {"01", "03", "05", "07", "08", "10", "12"}) md.push_back(cat({lit(m), lit("-"), d31}));
    for (const char* m : {"04", "06", "09", "11"}) md.push_back(cat({lit(m), lit("-"), d30}));
    md.push_back(cat({lit("02-"), d28}));
    const Seq date = cat({Seq{d, d, d, d}, lit("-"), two(md)});
    const Seq frac = ref(alt_rule({Seq{}, cat({lit("."), digits(1, 9)})}));
    const Seq zone = ref(alt_rule({lit("Z"), cat({Seq{g_.one_of("+-")}, hour, lit(":"), minute})}));
    const Seq time = cat({hour, lit(":"), minute, lit(":"), minute, frac, zone});
    Seq body;
    if (fmt == "date") body = date;
    else if (fmt == "time") body = time;
    else if (fmt == "date-time") body = cat({date, lit("T"), time});
    else if (fmt == "uuid") {
      const Grammar::Elem h = g_.one_of("0123456789abcdefABCDEF");
      for (int group : {8, 4, 4, 4, 12}) {
        if (!body.empty()) body.push_back(g_.byte('-'));
        for (int k = 0; k < group; ++k) body.push_back(h);
      }
    } else {
      return -1;
    }
    return alt_rule({cat({lit("\""), body, lit("\"")})});
  }

  Seq digits(int64_t min, int64_t max) { return ref(repeat(Seq{g_.range('0', '9')}, min, max)); }
  int natural() {  // 0 | [1-9][0-9]{0,15}
    if (nat_ >= 0) return nat_;
    return nat_ = alt_rule({lit("0"), cat({Seq{g_.range('1', '9')}, digits(0, kMaxIntDigits - 1)})});
  }
  int number(bool allow_negative) {
    int& cache = allow_negative ? num_ : num_nonneg_;
    if (cache >= 0) return cache;
    const int frac = alt_rule({Seq{}, cat({lit("."), digits(1, kMaxFracDigits)})});
    const int exp =
        alt_rule({Seq{}, cat({Seq{g_.one_of("eE")}, ref(alt_rule({Seq{}, lit("+"), lit("-")})), digits(1, kMaxExpDigits)})});
    const Seq body = cat({ref(natural()), ref(frac), ref(exp)});
    std::vector<Seq> alts = {body};
    if (allow_negative) alts.push_back(cat({lit("-"), body}));
    return cache = alt_rule(alts);
  }
  int integer(bool allow_negative) {
    int& cache = allow_negative ? int_ : int_nonneg_;
    if (cache >= 0) return cache;
    std::vector<Seq> alts = {ref(natural())};
    if (allow_negative) alts.push_back(cat({lit("-"), Seq{g_.range('1', '9')}, digits(0, kMaxIntDigits - 1)}));
    return cache = alt_rule(alts);
  }
  // Exactly the decimal spellings (no leading zeros, "-" for negatives) of the integers in [lo, hi],
  // either end open (nullopt) up to kMaxIntDigits digits. Digit by digit, as regex generators for
  // numeric ranges do: each alternative starts with its own digit, so matching stays one stack.
  int integer_range(std::optional<int64_t> lo, std::optional<int64_t> hi) {
    const int64_t kTop = 9999999999999999;  // kMaxIntDigits nines
    std::vector<Seq> alts;
    // Negative numbers: "-" then the magnitudes in [max(1, -hi), -lo].
    if (!lo || *lo < 0) {
      const int64_t mag_lo = hi && *hi < 0 ? -*hi : 1;
      const int64_t mag_hi = lo ? -*lo : kTop;
      if (mag_lo <= mag_hi) alts.push_back(cat({lit("-"), ref(natural_range(mag_lo, mag_hi))}));
    }
    // Non-negative numbers in [max(0, lo), hi].
    const int64_t nlo = lo ? std::max<int64_t>(*lo, 0) : 0, nhi = hi ? *hi : kTop;
    if (nlo <= nhi) alts.push_back(ref(natural_range(nlo, nhi)));
    return alt_rule(alts);
  }
  // Non-negative [lo, hi]: one alternative per digit count.
  int natural_range(int64_t lo, int64_t hi) {
    std::vector<Seq> alts;
    const std::string L = std::to_string(lo), H = std::to_string(hi);
    for (size_t n = L.size(); n <= H.size(); ++n) {
      std::string a(n, '0');  // the smallest n-digit number (0 for one digit)
      if (n > 1) a[0] = '1';
      if (n == L.size()) a = L;
      const std::string b = n == H.size() ? H : std::string(n, '9');
      if (a.size() == b.size() && a <= b) alts.push_back(ref(same_length_range(a, b)));
    }
    return alt_rule(alts);
  }
  // Strings of digits of one length between a and b (a <= b), as a rule.
  // Memoized, and [0..0, 9..9] is any n digits: without both, the two open ends recurse into
  // [0..0, 9..9] twice per digit (2^16 calls and rules for a plain "minimum": 0).
  int same_length_range(const std::string& a, const std::string& b) {
    const std::string key = a + ":" + b;
    if (auto it = ranges_.find(key); it != ranges_.end()) return it->second;
    const int r = same_length_range_uncached(a, b);
    ranges_.emplace(key, r);
    return r;
  }
  int same_length_range_uncached(const std::string& a, const std::string& b) {
    const auto D = [&](char lo, char hi) { return g_.range(static_cast<uint8_t>(lo), static_cast<uint8_t>(hi)); };
    if (a.find_first_not_of('0') == std::string::npos && b.find_first_not_of('9') == std::string::npos)
      return alt_rule({digits(static_cast<int64_t>(a.size()), static_cast<int64_t>(a.size()))});
    if (a.size() == 1) return alt_rule({Seq{D(a[0], b[0])}});
    const std::string ar = a.substr(1), br = b.substr(1);
    if (a[0] == b[0]) return alt_rule({cat({lit(std::string(1, a[0])), ref(same_length_range(ar, br))})});
    const std::string nines(ar.size(), '9'), zeros(ar.size(), '0');
    std::vector<Seq> alts;
    alts.push_back(cat({lit(std::string(1, a[0])), ref(same_length_range(ar, nines))}));
    if (a[0] + 1 <= b[0] - 1) alts.push_back(cat({Seq{D(static_cast<char>(a[0] + 1), static_cast<char>(b[0] - 1))},
                                                  digits(static_cast<int64_t>(ar.size()), static_cast<int64_t>(ar.size()))}));
    alts.push_back(cat({lit(std::string(1, b[0])), ref(same_length_range(zeros, br))}));
    return alt_rule(alts);
  }

  int value_any() {
    if (any_ >= 0) return any_;
    any_ = g_.new_rule();  // filled below: objects and arrays refer back to it
    const int obj = object_any(), arr = array_of(any_, 0, -1);
    g_.add_alt(any_, ref(obj));
    g_.add_alt(any_, ref(arr));
    g_.add_alt(any_, ref(string_any()));
    g_.add_alt(any_, ref(number(true)));
    g_.add_alt(any_, lit("true"));
    g_.add_alt(any_, lit("false"));
    g_.add_alt(any_, lit("null"));
    return any_;
  }
  int object_any() {
    if (obj_any_ >= 0) return obj_any_;
    obj_any_ = g_.new_rule();
    const int kv = alt_rule({cat({ref(string_any()), W(), lit(":"), W(), ref(value_any()), W()})});
    const int more = repeat(cat({lit(","), W(), ref(kv)}), 0, -1);
    g_.add_alt(obj_any_, cat({lit("{"), W(), lit("}")}));
    g_.add_alt(obj_any_, cat({lit("{"), W(), ref(kv), ref(more), lit("}")}));
    return obj_any_;
  }
  // "[" ws ( item ws ( "," ws item ws ){min-1,max-1} )? "]"
  int array_of(int item, int64_t min, int64_t max) {
    const Seq one = cat({ref(item), W()});
    std::vector<Seq> alts;
    if (min == 0) alts.push_back(cat({lit("["), W(), lit("]")}));
    if (max != 0) {
      const int rest = repeat(cat({lit(","), W(), one}), std::max<int64_t>(min - 1, 0), max < 0 ? -1 : max - 1);
      alts.push_back(cat({lit("["), W(), one, ref(rest), lit("]")}));
    }
    return alt_rule(alts);
  }

  // ---- schemas ----
  static std::string child(const std::string& where, const std::string& key) { return where + "/" + key; }

  bool get_count(const json& s, const char* key, const std::string& where, int64_t& out) {
    auto it = s.find(key);
    if (it == s.end()) return true;
    if (!it->is_number_integer() && !(it->is_number_float() && std::floor(it->get<double>()) == it->get<double>())) {
      fail(child(where, key), "must be a non-negative integer");
      return false;
    }
    const double v = it->get<double>();
    if (v < 0 || v > kMaxRepeat) {
      fail(child(where, key), "must be in [0, " + std::to_string(kMaxRepeat) + "]");
      return false;
    }
    out = static_cast<int64_t>(v);
    return true;
  }

  int compile(const json& s, const std::string& where) {
    if (!err_.empty()) return alt_rule({});
    if (++depth_ > static_cast<int>(kMaxJsonDepth)) return fail(where, "nested too deeply");
    struct Dec {
      int& d;
      ~Dec() { --d; }
    } dec{depth_};
    if (s.is_boolean()) return s.get<bool>() ? value_any() : fail(where, "the schema `false` matches nothing");
    if (!s.is_object()) return fail(where, "a schema must be an object or a boolean");
    for (const auto& [k, v] : s.items())
      if (kUnsupported.count(k)) return fail(child(where, k), "'" + k + "' is not supported by structured outputs");
    if (auto it = s.find("uniqueItems"); it != s.end() && it->is_boolean() && it->get<bool>())
      return fail(child(where, "uniqueItems"), "'uniqueItems' is not supported by structured outputs");

    if (auto it = s.find("$ref"); it != s.end()) {
      for (const char* k : {"type", "properties", "items", "enum", "const", "anyOf", "oneOf", "allOf"})
        if (s.contains(k)) return fail(where, std::string("'$ref' next to '") + k + "' is not supported");
      if (!it->is_string()) return fail(child(where, "$ref"), "must be a string");
      return reference(it->get<std::string>(), child(where, "$ref"));
    }
    int r = compile_body(s, where);
    if (auto it = s.find("nullable"); it != s.end() && it->is_boolean() && it->get<bool>())
      r = alt_rule({ref(r), lit("null")});
    return r;
  }

  int reference(const std::string& target, const std::string& where) {
    if (auto it = refs_.find(target); it != refs_.end()) return it->second;
    if (target.empty() || target[0] != '#') return fail(where, "only references into the same document (#...) are supported");
    const json* node = nullptr;
    try {
      const std::string ptr = target.substr(1);
      json::json_pointer p(ptr);
      if (!root_.contains(p)) return fail(where, "'" + target + "' does not resolve");
      node = &root_.at(p);
    } catch (const std::exception&) {
      return fail(where, "'" + target + "' is not a JSON pointer");
    }
    // Declare first, so recursive schemas refer back to this rule.
    const int r = g_.new_rule();
    refs_[target] = r;
    const int body = compile(*node, target);
    g_.add_alt(r, ref(body));
    return r;
  }

  int compile_body(const json& s, const std::string& where) {
    for (const char* k : {"anyOf", "oneOf"}) {
      auto it = s.find(k);
      if (it == s.end()) continue;
      for (const char* other : {"type", "properties", "items", "enum", "const"})
        if (s.contains(other)) return fail(where, std::string("'") + k + "' next to '" + other + "' is not supported");
      if (!it->is_array() || it->empty()) return fail(child(where, k), "must be a non-empty array of schemas");
      // Each alternative is a live stack until the text tells them apart: keep states small.
      if (it->size() > kMaxAlternatives)
        return fail(child(where, k), "more than " + std::to_string(kMaxAlternatives) + " alternatives");
      std::vector<Seq> alts;
      for (size_t i = 0; i < it->size(); ++i) alts.push_back(ref(compile((*it)[i], child(child(where, k), std::to_string(i)))));
      return alt_rule(alts);
    }
    if (auto it = s.find("allOf"); it != s.end()) {
      if (!it->is_array() || it->size() != 1) return fail(child(where, "allOf"), "only 'allOf' of exactly one schema is supported");
      return compile((*it)[0], child(where, "allOf/0"));
    }
    if (auto it = s.find("const"); it != s.end()) return alt_rule({lit(it->dump())});
    if (auto it = s.find("enum"); it != s.end()) {
      if (!it->is_array() || it->empty()) return fail(child(where, "enum"), "must be a non-empty array");
      std::vector<std::string> words;
      for (const json& v : *it) words.push_back(v.dump());
      return literal_trie(g_, words);
    }
    std::vector<std::string> types;
    if (auto it = s.find("type"); it != s.end()) {
      if (it->is_string()) types.push_back(it->get<std::string>());
      else if (it->is_array() && !it->empty())
        for (const json& t : *it) types.push_back(t.is_string() ? t.get<std::string>() : std::string("?"));
      else return fail(child(where, "type"), "must be a type name or a non-empty array of them");
      for (const std::string& t : types)
        if (!kTypes.count(t)) return fail(child(where, "type"), "unknown type '" + t + "'");
    } else if (s.contains("properties") || s.contains("required") || s.contains("additionalProperties")) {
      types = {"object"};
    } else if (s.contains("items") || s.contains("minItems") || s.contains("maxItems")) {
      types = {"array"};
    } else if (s.contains("minLength") || s.contains("maxLength")) {
      types = {"string"};
    } else {
      return value_any();
    }
    std::vector<Seq> alts;
    for (const std::string& t : types) alts.push_back(ref(typed(s, t, where)));
    return alts.size() == 1 ? alts[0][0].arg : alt_rule(alts);
  }

  int typed(const json& s, const std::string& t, const std::string& where) {
    if (t == "null") return alt_rule({lit("null")});
    if (t == "boolean") return alt_rule({lit("true"), lit("false")});
    if (t == "string") {
      if (auto p = s.find("pattern"); p != s.end()) {
        if (!p->is_string()) return fail(child(where, "pattern"), "must be a string");
        for (const char* k : {"minLength", "maxLength"})
          if (s.contains(k)) return fail(where, std::string("'pattern' together with '") + k + "' is not supported");
        if (auto f = s.find("format"); f != s.end() && f->is_string() && kFormats.count(f->get<std::string>()))
          return fail(where, "'pattern' together with 'format' " + f->dump() + " is not supported");
        auto r = regex_rule(g_, p->get<std::string>(), {.json_string = true, .search = true});
        if (!r.ok()) return fail(child(where, "pattern"), r.message());
        return alt_rule({cat({lit("\""), ref(*r), lit("\"")})});
      }
      if (auto f = s.find("format"); f != s.end() && f->is_string()) {
        const int r = string_format(f->get<std::string>());
        if (r >= 0) {
          if (s.contains("minLength") || s.contains("maxLength"))
            return fail(where, "'format' " + f->dump() + " together with a length bound is not supported");
          return r;
        }
      }
      int64_t min = 0, max = -1;
      if (!get_count(s, "minLength", where, min) || !get_count(s, "maxLength", where, max)) return alt_rule({});
      if (max >= 0 && max < min) return fail(where, "maxLength is below minLength");
      return min == 0 && max < 0 ? string_any() : string_len(min, max);
    }
    if (t == "integer") return integer_schema(s, where);
    if (t == "number") {
      if (s.contains("maximum") || s.contains("exclusiveMaximum") || s.contains("exclusiveMinimum"))
        return fail(where, "bounds on a 'number' other than 'minimum' >= 0 are not supported (use 'integer')");
      if (auto it = s.find("minimum"); it != s.end()) {
        if (!it->is_number()) return fail(child(where, "minimum"), "must be a number");
        if (it->get<double>() != 0.0) return fail(child(where, "minimum"), "a 'number' minimum other than 0 is not supported");
        return number(false);
      }
      return number(true);
    }
    if (t == "array") {
      int64_t min = 0, max = -1;
      if (!get_count(s, "minItems", where, min) || !get_count(s, "maxItems", where, max)) return alt_rule({});
      if (max >= 0 && max < min) return fail(where, "maxItems is below minItems");
      int item;
      if (auto it = s.find("items"); it != s.end()) {
        if (it->is_boolean() && !it->get<bool>()) {
          if (min > 0) return fail(where, "'items': false with minItems > 0 matches nothing");
          return alt_rule({cat({lit("["), W(), lit("]")})});
        }
        item = compile(*it, child(where, "items"));
      } else {
        item = value_any();
      }
      return array_of(item, min, max);
    }
    return object_schema(s, where);
  }

  int integer_schema(const json& s, const std::string& where) {
    std::optional<int64_t> lo, hi;
    auto bound = [&](const char* key, bool exclusive, bool lower) -> bool {
      auto it = s.find(key);
      if (it == s.end()) return true;
      if (!it->is_number()) {
        fail(child(where, key), "must be a number");
        return false;
      }
      const double v = it->get<double>();
      if (!std::isfinite(v) || std::fabs(v) > 1e15) {
        fail(child(where, key), "is out of the supported range (|v| <= 1e15)");
        return false;
      }
      // The integers n with n >= v (n > v when exclusive), or n <= v (n < v).
      int64_t b = static_cast<int64_t>(lower ? std::ceil(v) : std::floor(v));
      if (exclusive && std::floor(v) == v) b += lower ? 1 : -1;
      if (lower) lo = lo ? std::max(*lo, b) : b;
      else hi = hi ? std::min(*hi, b) : b;
      return true;
    };
    if (!bound("minimum", false, true) || !bound("exclusiveMinimum", true, true) || !bound("maximum", false, false) ||
        !bound("exclusiveMaximum", true, false))
      return alt_rule({});
    if (lo && hi && *lo > *hi) return fail(where, "the integer bounds admit no value");
    if (!lo && !hi) return integer(true);
    return integer_range(lo, hi);
  }

  int object_schema(const json& s, const std::string& where) {
    const json* props = nullptr;
    if (auto it = s.find("properties"); it != s.end()) {
      if (!it->is_object()) return fail(child(where, "properties"), "must be an object");
      props = &*it;
    }
    std::set<std::string> required;
    if (auto it = s.find("required"); it != s.end()) {
      if (!it->is_array()) return fail(child(where, "required"), "must be an array of names");
      for (const json& n : *it) {
        if (!n.is_string()) return fail(child(where, "required"), "must be an array of names");
        required.insert(n.get<std::string>());
      }
    }
    // Extra keys: only when asked for (true or a schema); an object without properties takes any.
    int extra = -1;
    if (auto it = s.find("additionalProperties"); it != s.end()) {
      if (it->is_boolean()) {
        if (it->get<bool>()) extra = value_any();
      } else {
        extra = compile(*it, child(where, "additionalProperties"));
      }
    } else if (!props && required.empty()) {
      return object_any();
    }
    // Declared properties in order, then required names that are not declared (any value).
    std::vector<std::pair<std::string, const json*>> order;
    if (props)
      for (const auto& [k, v] : props->items()) order.emplace_back(k, &v);
    for (const std::string& r : required)
      if (!props || !props->contains(r)) order.emplace_back(r, nullptr);
    const size_t n = order.size();
    std::vector<int> kv(n);
    for (size_t i = 0; i < n; ++i) {
      const int value = order[i].second ? compile(*order[i].second, child(child(where, "properties"), order[i].first))
                                        : value_any();
      kv[i] = alt_rule({cat({lit(json(order[i].first).dump()), W(), lit(":"), W(), ref(value), W()})});
    }
    // tail: extra keys (if allowed) after the declared ones, each after a comma.
    int tail_after = alt_rule({Seq{}});  // after at least one member
    int tail_first = alt_rule({Seq{}});  // nothing written yet
    if (extra >= 0) {
      const int xkv = alt_rule({cat({ref(string_any()), W(), lit(":"), W(), ref(extra), W()})});
      const int more = repeat(cat({lit(","), W(), ref(xkv)}), 0, -1);
      tail_after = more;
      tail_first = alt_rule({Seq{}, cat({ref(xkv), ref(more)})});
    }
    // rest_after[i] / rest_first[i]: members i..n-1 (and the tail), with or without a member before.
    int after = tail_after, first = tail_first;
    for (size_t i = n; i-- > 0;) {
      const bool req = required.count(order[i].first) > 0;
      std::vector<Seq> a = {cat({lit(","), W(), ref(kv[i]), ref(after)})};
      std::vector<Seq> f = {cat({ref(kv[i]), ref(after)})};
      if (!req) {
        a.push_back(ref(after));
        f.push_back(ref(first));
      }
      after = alt_rule(a);
      first = alt_rule(f);
    }
    return alt_rule({cat({lit("{"), W(), ref(first), lit("}")})});
  }

  const json& root_;
  Grammar& g_;
  bool compact_ = false;
  std::string err_;
  int depth_ = 0;
  std::map<std::string, int> refs_;
  std::map<std::string, int> ranges_;  // same_length_range
  int ws_ = -1, char_ = -1, string_ = -1, nat_ = -1, num_ = -1, num_nonneg_ = -1, int_ = -1, int_nonneg_ = -1;
  int any_ = -1, obj_any_ = -1;
};

}  // namespace

Expected<int> json_schema_rule(Grammar& g, const nlohmann::ordered_json& schema, const JsonOptions& opt) {
  return Compiler(schema, g, opt).run();
}

Expected<Grammar> json_schema_grammar(const nlohmann::ordered_json& schema, const JsonOptions& opt) {
  Grammar g;
  SS_ASSIGN(const int r, json_schema_rule(g, schema, opt));
  g.set_root(r);
  SS_TRY(g.validate());
  return g;
}

Grammar json_object_grammar(const JsonOptions& opt) {
  static const json empty = json::object();
  Grammar g;
  g.set_root(Compiler(empty, g, opt).any_object_rule());
  return g;
}

Expected<Grammar> tool_calls_grammar(const std::vector<ToolSchema>& tools, bool parallel, const JsonOptions& opt) {
  if (tools.empty()) return make_error("no tools");
  Grammar g;
  static const json empty = json::object();
  const Seq W{Grammar::ref(Compiler(empty, g, opt).ws_rule())};
  auto cat = [](std::initializer_list<Seq> parts) {
    Seq out;
    for (const Seq& p : parts) out.insert(out.end(), p.begin(), p.end());
    return out;
  };
  // {"name": "<tool>", "parameters": <its schema>}, one alternative per tool.
  const int call = g.new_rule();
  for (const ToolSchema& t : tools) {
    auto params = json_schema_rule(g, t.parameters, opt);
    if (!params.ok()) return make_error("tool '" + t.name + "' parameters: " + params.message());
    g.add_alt(call, cat({g.literal("{"), W, g.literal("\"name\""), W, g.literal(":"), W, g.literal(json(t.name).dump()), W,
                         g.literal(","), W, g.literal("\"parameters\""), W, g.literal(":"), W,
                         Seq{Grammar::ref(*params)}, W, g.literal("}")}));
  }
  // [call (, call)*] with parallel calls, else [call].
  const int more = g.repeat(cat({g.literal(","), W, Seq{Grammar::ref(call)}, W}), 0, parallel ? -1 : 0);
  const int root = g.new_rule();
  g.add_alt(root, cat({g.literal("["), W, Seq{Grammar::ref(call)}, W, Seq{Grammar::ref(more)}, g.literal("]")}));
  g.set_root(root);
  SS_TRY(g.validate());
  return g;
}

Expected<Grammar> choice_grammar(const std::vector<std::string>& choices) {
  if (choices.empty()) return make_error("the choices must not be empty");
  for (const std::string& c : choices)
    if (c.empty()) return make_error("a choice must not be empty");
  Grammar g;
  g.set_root(literal_trie(g, choices));
  SS_TRY(g.validate());
  return g;
}

}  // namespace ss::structured
