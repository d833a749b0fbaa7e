#include "structured/gbnf.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <string>
#include <vector>

#include "structured/regex.h"

namespace ss::structured {

namespace {

using Seq = Grammar::Seq;

constexpr int64_t kMaxCount = 10000;  // m and n of {m,n}
constexpr int kMaxDepth = 256;        // nested groups
constexpr int kMaxRules = 200000;

bool word_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

class Parser {
 public:
  Parser(std::string_view t, Grammar& g) : t_(t), g_(g), enc_(g, false) {}

  Status run(std::string_view root) {
    skip_space();
    while (i_ < t_.size()) {
      const size_t at = i_;
      const std::string name = word();
      if (name.empty()) return fail("expected a rule name");
      skip_space();
      if (!t_.substr(i_).starts_with("::=")) return fail("expected '::=' after '" + name + "'");
      i_ += 3;
      const int r = rule_id(name);
      if (defined_.count(name)) {
        i_ = at;
        return fail("rule '" + name + "' is defined twice");
      }
      defined_[name] = at;
      if (!alternatives(r, 0)) return make_error(err_);
      if (i_ < t_.size() && t_[i_] == ')') return fail("unmatched ')'");
      if (g_.num_rules() > kMaxRules) return fail("the grammar is too large to follow");
    }
    for (const auto& [name, at] : used_)
      if (!defined_.count(name)) {
        i_ = at;
        return fail("rule '" + name + "' is used but not defined");
      }
    auto it = ids_.find(std::string(root));
    if (it == ids_.end() || !defined_.count(std::string(root)))
      return make_error("grammar: no '" + std::string(root) + "' rule (the rule generation starts from)");
    g_.set_root(it->second);
    if (Status s = g_.validate(); !s.ok()) return make_error("grammar: " + s.message());
    return {};
  }

 private:
  Status fail(const std::string& what) {
    size_t line = 1, col = 1;
    for (size_t k = 0; k < i_ && k < t_.size(); ++k) {
      if (t_[k] == '\n') ++line, col = 1;
      else ++col;
    }
    err_ = "grammar: " + what + " (line " + std::to_string(line) + ", column " + std::to_string(col) + ")";
    return make_error(err_);
  }
  bool failed(const std::string& what) {
    if (err_.empty()) (void)fail(what);
    return false;
  }

  // Blanks, newlines and comments.
  void skip_space() {
    while (i_ < t_.size()) {
      const char c = t_[i_];
      if (c == ' ' || c == '\t' || c == '\r' || c == '\n') ++i_;
      else if (c == '#')
        while (i_ < t_.size() && t_[i_] != '\n') ++i_;
      else break;
    }
  }
  std::string word() {
    const size_t s = i_;
    while (i_ < t_.size() && word_char(t_[i_])) ++i_;
    return std::string(t_.substr(s, i_ - s));
  }
  // Does a new rule (`name ::=`) start at i_?
  bool at_rule_start() const {
    size_t k = i_;
    while (k < t_.size() && word_char(t_[k])) ++k;
    if (k == i_) return false;
    while (k < t_.size() && (t_[k] == ' ' || t_[k] == '\t')) ++k;
    return t_.substr(k).starts_with("::=");
  }
  int rule_id(const std::string& name) {
    auto [it, fresh] = ids_.try_emplace(name, -1);
    if (fresh) {
      it->second = g_.new_rule();
      g_.set_name(it->second, name);
    }
    return it->second;
  }

  // alternatives into rule r, up to ')' (depth > 0), the next rule or the end.
  bool alternatives(int r, int depth) {
    for (;;) {
      Seq seq;
      if (!sequence(seq, depth)) return false;
      g_.add_alt(r, seq);
      if (i_ < t_.size() && t_[i_] == '|') {
        ++i_;
        continue;
      }
      return true;
    }
  }

  bool sequence(Seq& seq, int depth) {
    for (;;) {
      skip_space();
      if (i_ >= t_.size() || t_[i_] == '|' || t_[i_] == ')' || (depth == 0 && at_rule_start())) return true;
      Seq item;
      if (!primary(item, depth)) return false;
      if (!postfix(item)) return false;
      seq.insert(seq.end(), item.begin(), item.end());
    }
  }

  bool primary(Seq& out, int depth) {
    const char c = t_[i_];
    if (c == '"') {
      ++i_;
      while (i_ < t_.size() && t_[i_] != '"') {
        uint32_t cp;
        if (!character(cp)) return false;
        append_utf8(out, cp);
      }
      if (i_ >= t_.size()) return failed("unterminated string literal");
      ++i_;
      return true;
    }
    if (c == '[') return char_class(out);
    if (c == '.') {
      ++i_;
      out = *enc_.encode(complement_code_points({}));
      return true;
    }
    if (c == '(') {
      ++i_;
      if (depth + 1 > kMaxDepth) return failed("groups nested too deeply");
      const int r = g_.new_rule();
      if (!alternatives(r, depth + 1)) return false;
      skip_space();
      if (i_ >= t_.size() || t_[i_] != ')') return failed("missing ')'");
      ++i_;
      out = Seq{Grammar::ref(r)};
      return true;
    }
    if (word_char(c)) {
      const size_t at = i_;
      const std::string name = word();
      used_.try_emplace(name, at);
      out = Seq{Grammar::ref(rule_id(name))};
      return true;
    }
    return failed(std::string("unexpected '") + c + "'");
  }

  bool postfix(Seq& item) {
    for (;;) {
      if (i_ >= t_.size()) return true;
      int64_t lo, hi;
      const char c = t_[i_];
      if (c == '*') lo = 0, hi = -1, ++i_;
      else if (c == '+') lo = 1, hi = -1, ++i_;
      else if (c == '?') lo = 0, hi = 1, ++i_;
      else if (c == '{') {
        if (!braces(lo, hi)) return false;
      } else {
        return true;
      }
      if (g_.num_rules() + std::max(lo, hi) > kMaxRules) return failed("the grammar is too large to follow");
      Seq one = item;
      if (one.size() != 1) {
        const int r = g_.new_rule();
        g_.add_alt(r, one);
        one = Seq{Grammar::ref(r)};
      }
      item = Seq{Grammar::ref(g_.repeat(one, lo, hi))};
    }
  }

  bool braces(int64_t& lo, int64_t& hi) {
    ++i_;  // '{'
    auto number = [&](int64_t& v) {
      skip_space();
      const size_t s = i_;
      v = 0;
      while (i_ < t_.size() && t_[i_] >= '0' && t_[i_] <= '9') v = std::min<int64_t>(v * 10 + (t_[i_++] - '0'), kMaxCount + 1);
      skip_space();
      return i_ > s;
    };
    const bool has_lo = number(lo);
    if (!has_lo) lo = 0;
    hi = lo;
    if (i_ < t_.size() && t_[i_] == ',') {
      ++i_;
      if (!number(hi)) hi = -1;
    } else if (!has_lo) {
      return failed("expected a count in '{...}'");
    }
    if (i_ >= t_.size() || t_[i_] != '}') return failed("expected '}'");
    ++i_;
    if (lo > kMaxCount || hi > kMaxCount) return failed("a repetition count above " + std::to_string(kMaxCount));
    if (hi >= 0 && hi < lo) return failed("a repetition {m,n} with n < m");
    return true;
  }

  bool char_class(Seq& out) {
    ++i_;  // '['
    const bool negate = i_ < t_.size() && t_[i_] == '^';
    if (negate) ++i_;
    CodePointRanges set;
    while (i_ < t_.size() && t_[i_] != ']') {
      uint32_t lo, hi;
      if (!character(lo)) return false;
      hi = lo;
      if (i_ + 1 < t_.size() && t_[i_] == '-' && t_[i_ + 1] != ']') {
        ++i_;
        if (!character(hi)) return false;
        if (hi < lo) return failed("a character range out of order");
      }
      set.emplace_back(lo, hi);
    }
    if (i_ >= t_.size()) return failed("missing ']'");
    ++i_;
    if (negate) set = complement_code_points(std::move(set));
    auto s = enc_.encode(std::move(set));
    if (!s) return failed("the character class matches nothing");
    out = *s;
    return true;
  }

  // One character of a literal or class: UTF-8 or an escape.
  bool character(uint32_t& cp) {
    if (t_[i_] == '\\') {
      if (++i_ >= t_.size()) return failed("a '\\' at the end");
      const char e = t_[i_++];
      auto hex = [&](int n) {
        if (!parse_hex(t_, i_, n, cp)) return failed("a malformed \\x, \\u or \\U escape");
        if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return failed("an escape that is not a Unicode scalar value");
        return true;
      };
      switch (e) {
        case 'n': cp = '\n'; return true;
        case 'r': cp = '\r'; return true;
        case 't': cp = '\t'; return true;
        case 'x': return hex(2);
        case 'u': return hex(4);
        case 'U': return hex(8);
        case '\\': case '"': case '[': case ']': case '-': case '^': case '/': cp = static_cast<uint8_t>(e); return true;
        default: --i_; return failed(std::string("unknown escape '\\") + e + "'");
      }
    }
    if (!decode_utf8(t_, i_, cp)) return failed("the grammar is not valid UTF-8");
    return true;
  }

  void append_utf8(Seq& out, uint32_t cp) {
    for (char c : encode_utf8(cp)) out.push_back(g_.byte(static_cast<uint8_t>(c)));
  }

  std::string_view t_;
  Grammar& g_;
  CodePointEncoder enc_;
  size_t i_ = 0;
  std::string err_;
  std::map<std::string, int> ids_;
  std::map<std::string, size_t> defined_, used_;  // name -> where (for messages)
};

}  // namespace

Expected<Grammar> gbnf_grammar(std::string_view text, std::string_view root) {
  Grammar g;
  Parser p(text, g);
  if (Status s = p.run(root); !s.ok()) return make_error(s.message());
  return g;
}

}  // namespace ss::structured
