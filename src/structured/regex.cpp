#include "structured/regex.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ss::structured {

namespace {

using Seq = Grammar::Seq;
using Ranges = CodePointRanges;

constexpr uint32_t kMaxCp = 0x10FFFF;
constexpr int64_t kMaxCount = 10000;  // n and m of {n,m}
constexpr int kMaxDepth = 256;        // nested groups
constexpr int kMaxRules = 200000;     // size of the grammar one pattern may add

// Sorted, merged, without surrogates (they have no UTF-8 spelling).
void normalize(Ranges& r) {
  std::sort(r.begin(), r.end());
  Ranges out;
  for (const auto& [lo, hi] : r) {
    if (!out.empty() && lo <= out.back().second + 1) out.back().second = std::max(out.back().second, hi);
    else out.emplace_back(lo, hi);
  }
  r.clear();
  for (const auto& [lo, hi] : out) {
    if (hi < 0xD800 || lo > 0xDFFF) {
      r.emplace_back(lo, hi);
      continue;
    }
    if (lo < 0xD800) r.emplace_back(lo, 0xD7FF);
    if (hi > 0xDFFF) r.emplace_back(0xE000, hi);
  }
}

}  // namespace

bool parse_hex(std::string_view s, size_t& i, int digits, uint32_t& v) {
  uint32_t out = 0;
  for (int k = 0; k < digits; ++k) {
    if (i + static_cast<size_t>(k) >= s.size() || !std::isxdigit(static_cast<unsigned char>(s[i + static_cast<size_t>(k)])))
      return false;
    const char h = s[i + static_cast<size_t>(k)];
    out = out * 16 + static_cast<uint32_t>(h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
  }
  v = out;
  i += static_cast<size_t>(digits);
  return true;
}

CodePointRanges complement_code_points(CodePointRanges r) {
  normalize(r);
  Ranges out;
  uint32_t next = 0;
  for (const auto& [lo, hi] : r) {
    if (lo > next) out.emplace_back(next, lo - 1);
    next = hi + 1;
  }
  if (next <= kMaxCp) out.emplace_back(next, kMaxCp);
  normalize(out);
  return out;
}

namespace {

Ranges complement(Ranges r) { return complement_code_points(std::move(r)); }

const Ranges& digit_set() {
  static const Ranges r = {{'0', '9'}};
  return r;
}
const Ranges& word_set() {
  static const Ranges r = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
  return r;
}
const Ranges& space_set() {  // ECMAScript's WhiteSpace and LineTerminator
  static const Ranges r = {{0x09, 0x0D}, {0x20, 0x20}, {0xA0, 0xA0}, {0x1680, 0x1680}, {0x2000, 0x200A},
                           {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
  return r;
}
Ranges dot_set() { return complement({{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}}); }

struct Node {
  enum Kind : uint8_t { Set, Cat, Alt, Rep } kind = Cat;
  Ranges set;
  std::vector<int> kids;
  int64_t min = 0, max = 0;  // Rep; max < 0: unbounded
};

class Parser {
 public:
  explicit Parser(std::string_view p) : p_(p) {}

  struct Top {
    int node;
    bool start, end;  // anchored with ^ / $
  };

  bool parse() {
    for (;;) {
      Top t{-1, false, false};
      if (peek('^')) {
        t.start = true;
        ++i_;
      }
      t.node = sequence(true, &t.end);
      if (t.node < 0) return false;
      tops.push_back(t);
      if (i_ == p_.size()) return true;
      if (p_[i_] == ')') return fail("unmatched ')'");
      ++i_;  // '|'
    }
  }

  std::vector<Node> nodes;
  std::vector<Top> tops;
  std::string err;

 private:
  bool peek(char c) const { return i_ < p_.size() && p_[i_] == c; }
  bool fail(const std::string& what) {
    if (err.empty()) err = what + " (at offset " + std::to_string(i_) + ")";
    return false;
  }
  int add(Node n) {
    nodes.push_back(std::move(n));
    return static_cast<int>(nodes.size()) - 1;
  }
  int set_node(Ranges r) {
    normalize(r);
    Node n;
    n.kind = Node::Set;
    n.set = std::move(r);
    return add(std::move(n));
  }

  // Alternatives up to (not past) ')' or the end.
  int alternatives() {
    Node alt;
    alt.kind = Node::Alt;
    for (;;) {
      const int s = sequence(false, nullptr);
      if (s < 0) return -1;
      alt.kids.push_back(s);
      if (!peek('|')) break;
      ++i_;
    }
    return alt.kids.size() == 1 ? alt.kids[0] : add(std::move(alt));
  }

  // Quantified atoms up to '|', ')' or the end. At the top level a '$' just before those ends it.
  int sequence(bool top, bool* end) {
    Node cat;
    cat.kind = Node::Cat;
    while (i_ < p_.size() && p_[i_] != '|' && p_[i_] != ')') {
      const char c = p_[i_];
      if (c == '$' && top && (i_ + 1 == p_.size() || p_[i_ + 1] == '|')) {
        *end = true;
        ++i_;
        break;
      }
      if (c == '^' || c == '$') {
        fail(std::string("'") + c + "' is supported only at the start / end of the pattern or of a top-level alternative");
        return -1;
      }
      int a = atom();
      if (a < 0) return -1;
      a = quantified(a);
      if (a < 0) return -1;
      cat.kids.push_back(a);
    }
    return cat.kids.size() == 1 ? cat.kids[0] : add(std::move(cat));
  }

  // {n}, {n,}, {n,m} at i_: true and the counts if well formed (i_ past it), else false (i_ kept).
  bool braces(int64_t& n, int64_t& m, bool& too_big) {
    size_t j = i_ + 1;
    auto number = [&](int64_t& v) {
      const size_t s = j;
      v = 0;
      while (j < p_.size() && p_[j] >= '0' && p_[j] <= '9') {
        v = std::min<int64_t>(v * 10 + (p_[j] - '0'), kMaxCount + 1);
        ++j;
      }
      return j > s;
    };
    if (!number(n)) {
      if (j < p_.size() && p_[j] == ',' && j + 1 < p_.size() && p_[j + 1] >= '0' && p_[j + 1] <= '9')
        ambiguous_ = true;  // "{,n}": a literal in ECMAScript, {0,n} in Python
      return false;
    }
    m = n;
    if (j < p_.size() && p_[j] == ',') {
      ++j;
      if (!number(m)) m = -1;
    }
    if (j >= p_.size() || p_[j] != '}') return false;
    too_big = n > kMaxCount || m > kMaxCount;
    i_ = j + 1;
    return true;
  }

  int quantified(int a) {
    if (i_ >= p_.size()) return a;
    int64_t n = 0, m = 0;
    bool too_big = false;
    const char c = p_[i_];
    if (c == '*') n = 0, m = -1, ++i_;
    else if (c == '+') n = 1, m = -1, ++i_;
    else if (c == '?') n = 0, m = 1, ++i_;
    else if (c == '{' && braces(n, m, too_big)) {
      if (too_big) return fail("a repetition count above " + std::to_string(kMaxCount)), -1;
      if (m >= 0 && m < n) return fail("a repetition {n,m} with m < n"), -1;
    } else {
      if (ambiguous_) return fail("'{,n}' is ambiguous (a literal in ECMAScript, {0,n} in Python): write {0,n} or \\{"), -1;
      return a;
    }
    if (peek('?')) ++i_;  // lazy: the same strings
    int64_t n2, m2;
    bool tb;
    if (i_ < p_.size() && (p_[i_] == '*' || p_[i_] == '+' || p_[i_] == '?' || (p_[i_] == '{' && braces(n2, m2, tb))))
      return fail("nothing to repeat"), -1;
    Node r;
    r.kind = Node::Rep;
    r.kids = {a};
    r.min = n;
    r.max = m;
    return add(std::move(r));
  }

  // One UTF-8 character of the pattern itself.
  bool literal_cp(uint32_t& cp) { return decode_utf8(p_, i_, cp) || fail("the pattern is not valid UTF-8"); }

  bool hex(int digits, uint32_t& v) { return parse_hex(p_, i_, digits, v) || fail("a malformed \\x or \\u escape"); }

  // An escape after '\' (i_ at the letter). Either one code point (cp) or a class (set, is_set).
  bool escape(bool in_class, uint32_t& cp, Ranges& set, bool& is_set) {
    is_set = false;
    if (i_ >= p_.size()) return fail("the pattern ends with '\\'");
    const char c = p_[i_];
    switch (c) {
      case 'd': case 'D': case 'w': case 'W': case 's': case 'S': {
        ++i_;
        const char l = static_cast<char>(c | 0x20);
        const Ranges& base = l == 'd' ? digit_set() : l == 'w' ? word_set() : space_set();
        set = c == l ? base : complement(base);
        is_set = true;
        return true;
      }
      case 't': cp = '\t'; break;
      case 'n': cp = '\n'; break;
      case 'r': cp = '\r'; break;
      case 'v': cp = '\v'; break;
      case 'f': cp = '\f'; break;
      case '0':
        if (i_ + 1 < p_.size() && p_[i_ + 1] >= '0' && p_[i_ + 1] <= '9') return fail("octal escapes are not supported");
        cp = 0;
        break;
      case 'c':
        if (i_ + 1 < p_.size() && std::isalpha(static_cast<unsigned char>(p_[i_ + 1]))) {
          cp = static_cast<uint32_t>(p_[i_ + 1]) % 32;
          i_ += 2;
          return true;
        }
        return fail("'\\c' must be followed by a letter");
      case 'x':
        ++i_;
        return hex(2, cp);
      case 'u': {
        ++i_;
        if (peek('{')) {
          ++i_;
          cp = 0;
          size_t n = 0;
          while (i_ < p_.size() && std::isxdigit(static_cast<unsigned char>(p_[i_])) && n < 8) {
            uint32_t d;
            if (!hex(1, d)) return false;
            cp = cp * 16 + d;
            ++n;
          }
          if (n == 0 || !peek('}') || cp > kMaxCp) return fail("a malformed \\u{...} escape");
          ++i_;
        } else {
          if (!hex(4, cp)) return false;
          if (cp >= 0xD800 && cp <= 0xDBFF && i_ + 1 < p_.size() && p_[i_] == '\\' && p_[i_ + 1] == 'u') {
            const size_t save = i_;
            i_ += 2;
            uint32_t lo;
            if (hex(4, lo) && lo >= 0xDC00 && lo <= 0xDFFF) {
              cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
              return true;
            }
            err.clear();
            i_ = save;
          }
        }
        if (cp >= 0xD800 && cp <= 0xDFFF) return fail("a lone surrogate escape");
        return true;
      }
      case 'b':
        if (in_class) {
          cp = 0x08;
          break;
        }
        return fail("word boundaries (\\b) are not supported");
      case 'B': return fail("word boundaries (\\B) are not supported");
      case 'p': case 'P': return fail("Unicode property escapes (\\p{...}) are not supported");
      case 'k': return fail("backreferences are not supported");
      default:
        if (c >= '1' && c <= '9') return fail("backreferences are not supported");
        if (std::isalnum(static_cast<unsigned char>(c))) return fail(std::string("unknown escape '\\") + c + "'");
        return literal_cp(cp);  // an identity escape: punctuation (or any non-ASCII character) as itself
    }
    ++i_;
    return true;
  }

  int atom() {
    const char c = p_[i_];
    if (c == '(') {
      ++i_;
      if (peek('?')) {
        const std::string_view rest = p_.substr(i_);
        if (rest.starts_with("?:")) {
          i_ += 2;
        } else if ((rest.starts_with("?<") && !rest.starts_with("?<=") && !rest.starts_with("?<!")) ||
                   rest.starts_with("?P<")) {  // a named group, ECMAScript's or Python's spelling
          const size_t close = p_.find('>', i_);
          if (close == std::string_view::npos) return fail("a group name without '>'"), -1;
          i_ = close + 1;
        } else if (rest.starts_with("?=") || rest.starts_with("?!") || rest.starts_with("?<")) {
          return fail("lookaround assertions are not supported"), -1;
        } else {
          return fail("unknown group '(?'"), -1;
        }
      }
      if (++depth_ > kMaxDepth) return fail("groups nested too deeply"), -1;
      const int inner = alternatives();
      --depth_;
      if (inner < 0) return -1;
      if (!peek(')')) return fail("missing ')'"), -1;
      ++i_;
      return inner;
    }
    if (c == '[') return char_class();
    if (c == '.') {
      ++i_;
      return set_node(dot_set());
    }
    if (c == '*' || c == '+' || c == '?') return fail("nothing to repeat"), -1;
    if (c == '{') {
      int64_t n, m;
      bool tb;
      const size_t save = i_;
      if (braces(n, m, tb)) {
        i_ = save;
        return fail("nothing to repeat"), -1;
      }
    }
    uint32_t cp = 0;
    Ranges set;
    bool is_set = false;
    if (c == '\\') {
      ++i_;
      if (!escape(false, cp, set, is_set)) return -1;
    } else if (!literal_cp(cp)) {
      return -1;
    }
    return set_node(is_set ? std::move(set) : Ranges{{cp, cp}});
  }

  int char_class() {
    ++i_;  // '['
    const bool negate = peek('^');
    if (negate) ++i_;
    Ranges set;
    // One class atom: a code point, or a class escape (\d ...) as a set.
    auto class_atom = [&](uint32_t& cp, Ranges& s, bool& is_set) {
      if (p_[i_] == '\\') {
        ++i_;
        return escape(true, cp, s, is_set);
      }
      is_set = false;
      return literal_cp(cp);
    };
    for (;;) {
      if (i_ >= p_.size()) return fail("missing ']'"), -1;
      if (p_[i_] == ']') break;
      uint32_t lo = 0, hi = 0;
      Ranges s1, s2;
      bool set1 = false, set2 = false;
      if (!class_atom(lo, s1, set1)) return -1;
      if (i_ + 1 < p_.size() && p_[i_] == '-' && p_[i_ + 1] != ']') {
        ++i_;
        if (!class_atom(hi, s2, set2)) return -1;
        if (set1 || set2) return fail("a class escape (\\d, \\w, \\s) cannot bound a range"), -1;
        if (lo > hi) return fail("a character range out of order"), -1;
        set.emplace_back(lo, hi);
      } else if (set1) {
        set.insert(set.end(), s1.begin(), s1.end());
      } else {
        set.emplace_back(lo, lo);
      }
    }
    ++i_;  // ']'
    return set_node(negate ? complement(std::move(set)) : std::move(set));
  }

  std::string_view p_;
  size_t i_ = 0;
  int depth_ = 0;
  bool ambiguous_ = false;
};

// Parsed pattern → grammar rules. Rules are pure, so each node's Seq is built once and shared.
class Emitter {
 public:
  Emitter(Grammar& g, const std::vector<Node>& nodes, bool json)
      : g_(g), n_(nodes), enc_(g, json), budget_(g.num_rules() + kMaxRules), nullable_(nodes.size(), -1) {}
  bool too_large = false;  // the pattern would need more than kMaxRules rules

  bool nullable(int i) {  // memoized: asked again at every repetition and concatenation above
    int8_t& memo = nullable_[static_cast<size_t>(i)];
    if (memo < 0) {
      const Node& n = n_[static_cast<size_t>(i)];
      bool v = false;
      switch (n.kind) {
        case Node::Set: v = false; break;
        case Node::Cat: v = std::all_of(n.kids.begin(), n.kids.end(), [&](int k) { return nullable(k); }); break;
        case Node::Alt: v = std::any_of(n.kids.begin(), n.kids.end(), [&](int k) { return nullable(k); }); break;
        case Node::Rep: v = n.min == 0 || nullable(n.kids[0]); break;
      }
      memo = v;
    }
    return memo == 1;
  }

  // The strings node i matches (nullopt: none), and the same without "" (the item of a repetition
  // must consume something, or the grammar would recurse without end).
  std::optional<Seq> emit(int i) { return memo(i, false); }
  std::optional<Seq> emit_nonempty(int i) { return memo(i, true); }

  std::optional<Seq> encode(const Ranges& set) { return enc_.encode(set); }

 private:
  int rule(const std::vector<Seq>& alts) {
    const int r = g_.new_rule();
    for (const Seq& a : alts) g_.add_alt(r, a);
    return r;
  }
  // A Seq that is one element (copied into each rule of a repetition).
  Seq single(const Seq& s) { return s.size() == 1 ? s : Seq{Grammar::ref(rule({s}))}; }

  std::optional<Seq> memo(int i, bool nonempty) {
    auto& slot = (nonempty ? ne_ : all_)[i];
    if (!slot) slot = build(i, nonempty);
    return *slot;
  }

  // Cat kids[k..] (nonempty: without ""): L(a R) \ {""} = (a \ {""}) R  u  (a nullable ? R \ {""} : none).
  // Loops, not a recursion per element: a pattern with a long run of literals overflowed the stack.
  std::optional<Seq> cat_from(const Node& n, size_t k, bool nonempty) {
    if (!nonempty) {
      Seq out;
      bool ok = true;
      for (size_t j = k; j < n.kids.size(); ++j) {
        auto part = emit(n.kids[j]);
        if (!part) ok = false;
        else if (ok) out.insert(out.end(), part->begin(), part->end());
      }
      return ok ? std::optional<Seq>(std::move(out)) : std::nullopt;
    }
    // The first kid that matches something non-empty is kids[j], after nullable kids k..j-1 matched "".
    std::vector<Seq> alts;
    for (size_t j = k; j < n.kids.size(); ++j) {
      auto head = emit_nonempty(n.kids[j]);
      auto rest = suffix(n, j + 1);
      if (head && rest) {
        head->insert(head->end(), rest->begin(), rest->end());
        alts.push_back(*head);
      }
      if (!nullable(n.kids[j])) break;
    }
    return join(alts);
  }
  // kids[k..] as one rule (memoized), so the "without \"\"" forms of a long concatenation stay linear.
  // The kids are emitted front to back, then the suffix rules built back to front (no recursion).
  std::optional<Seq> suffix(const Node& n, size_t k) {
    std::vector<Seq> heads;  // emit(kids[k + i]) up to a known suffix, a kid that matches nothing, or the end
    std::optional<Seq> tail;
    for (size_t j = k;; ++j) {
      if (auto it = suffix_.find(std::make_pair(&n, j)); it != suffix_.end()) {
        tail = it->second;
        break;
      }
      if (j == n.kids.size()) {
        tail = Seq{};
        suffix_.emplace(std::make_pair(&n, j), tail);
        break;
      }
      auto head = emit(n.kids[j]);
      if (!head) {
        suffix_.emplace(std::make_pair(&n, j), std::nullopt);
        break;
      }
      heads.push_back(std::move(*head));
    }
    for (size_t i = heads.size(); i-- > 0;) {
      std::optional<Seq> out;
      if (tail) {
        Seq s = std::move(heads[i]);
        s.insert(s.end(), tail->begin(), tail->end());
        out = Seq{Grammar::ref(rule({s}))};
      }
      suffix_.emplace(std::make_pair(&n, k + i), out);
      tail = std::move(out);
    }
    return tail;
  }
  std::optional<Seq> join(const std::vector<Seq>& alts) {
    if (alts.empty()) return std::nullopt;
    if (alts.size() == 1) return alts[0];
    return Seq{Grammar::ref(rule(alts))};
  }

  std::optional<Seq> build(int i, bool nonempty) {
    const Node& n = n_[static_cast<size_t>(i)];
    switch (n.kind) {
      case Node::Set: return n.set.empty() ? std::nullopt : encode(n.set);
      case Node::Cat: return cat_from(n, 0, nonempty);
      case Node::Alt: {
        std::vector<Seq> alts;
        for (int k : n.kids)
          if (auto s = memo(k, nonempty)) alts.push_back(*s);
        return join(alts);
      }
      case Node::Rep: {
        const int x = n.kids[0];
        if (n.max == 0) return nonempty ? std::nullopt : std::optional<Seq>(Seq{});
        // x{min,max} for a nullable x is x'{0,max} (the empty copies pad to min); without "": x'{1,max}.
        const bool nx = nullable(x);
        auto item = nx ? emit_nonempty(x) : emit(x);
        int64_t lo = nx ? 0 : n.min;
        if (nonempty) lo = std::max<int64_t>(lo, 1);
        if (!item) return lo == 0 && !nonempty ? std::optional<Seq>(Seq{}) : std::nullopt;
        // A repetition adds max(lo, max) rules: stop before nested counts build millions.
        if (g_.num_rules() + std::max(lo, n.max) > budget_) {
          too_large = true;
          return std::nullopt;
        }
        return Seq{Grammar::ref(g_.repeat(single(*item), lo, n.max))};
      }
    }
    return std::nullopt;
  }

  Grammar& g_;
  const std::vector<Node>& n_;
  CodePointEncoder enc_;
  int64_t budget_;
  std::vector<int8_t> nullable_;  // per node: -1 not known yet
  std::map<int, std::optional<std::optional<Seq>>> all_, ne_;
  std::map<std::pair<const Node*, size_t>, std::optional<Seq>> suffix_;
};

}  // namespace

std::optional<Seq> CodePointEncoder::encode(CodePointRanges set) {
  normalize(set);
  if (auto it = memo_.find(set); it != memo_.end()) return it->second;
  std::vector<Seq> alts;
  Grammar::ByteSet ascii{};
  bool any_ascii = false;
  std::string short_esc;
  for (const auto& [lo, hi] : set) {
    for (uint32_t c = lo; c <= std::min<uint32_t>(hi, 0x7F); ++c) {
      if (json_ && (c < 0x20 || c == '"' || c == '\\')) {
        static constexpr std::pair<uint32_t, char> kShort[] = {{'"', '"'}, {'\\', '\\'}, {'\b', 'b'}, {'\f', 'f'},
                                                               {'\n', 'n'}, {'\r', 'r'},  {'\t', 't'}};
        bool done = false;
        for (const auto& [cc, e] : kShort)
          if (cc == c) short_esc += e, done = true;
        if (!done) {
          static constexpr char kHex[] = "0123456789abcdef";
          alts.push_back(g_.literal(std::string("\\u00") + kHex[c >> 4] + kHex[c & 15]));
        }
        continue;
      }
      ascii[c >> 6] |= uint64_t{1} << (c & 63);
      any_ascii = true;
    }
    if (hi >= 0x80) utf8(std::max<uint32_t>(lo, 0x80), hi, alts);
  }
  if (!short_esc.empty()) alts.push_back(Seq{g_.byte('\\'), g_.one_of(short_esc)});
  if (any_ascii) alts.push_back(Seq{g_.bytes(ascii)});
  std::optional<Seq> out;
  if (alts.size() == 1) out = alts[0];
  else if (!alts.empty()) {
    const int r = g_.new_rule();
    for (const Seq& a : alts) g_.add_alt(r, a);
    out = Seq{Grammar::ref(r)};
  }
  memo_.emplace(std::move(set), out);
  return out;
}

// UTF-8 spellings of [lo, hi] (>= 0x80, no surrogates) as byte-range sequences: split until every
// byte position of the range is itself a range (as RE2 and regex-syntax do).
void CodePointEncoder::utf8(uint32_t lo, uint32_t hi, std::vector<Seq>& out) {
  static constexpr uint32_t kLenMax[] = {0x7F, 0x7FF, 0xFFFF, kMaxCp};
  for (int l = 1; l < 4; ++l)  // one length at a time
    if (lo <= kLenMax[l - 1] && hi > kLenMax[l - 1]) {
      utf8(lo, kLenMax[l - 1], out);
      utf8(kLenMax[l - 1] + 1, hi, out);
      return;
    }
  const int len = hi <= 0x7FF ? 2 : hi <= 0xFFFF ? 3 : 4;
  for (int k = 1; k < len; ++k) {
    const uint32_t m = (1u << (6 * k)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        utf8(lo, lo | m, out);
        utf8((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        utf8(lo, (hi & ~m) - 1, out);
        utf8(hi & ~m, hi, out);
        return;
      }
    }
  }
  uint8_t a[4], b[4];
  auto encode_cp = [](uint32_t c, int len, uint8_t* o) {
    static constexpr uint8_t kLead[] = {0, 0, 0xC0, 0xE0, 0xF0};
    for (int k = len - 1; k > 0; --k, c >>= 6) o[k] = static_cast<uint8_t>(0x80 | (c & 0x3F));
    o[0] = static_cast<uint8_t>(kLead[len] | c);
  };
  encode_cp(lo, len, a);
  encode_cp(hi, len, b);
  Seq s;
  for (int k = 0; k < len; ++k) s.push_back(g_.range(a[k], b[k]));
  out.push_back(std::move(s));
}

Expected<int> regex_rule(Grammar& g, std::string_view pattern, const RegexOptions& opt) {
  Parser p(pattern);
  if (!p.parse()) return make_error("regex: " + p.err);
  const int rules_before = g.num_rules();
  Emitter e(g, p.nodes, opt.json_string);
  std::optional<Seq> any_star;
  if (opt.search) {
    const Ranges all = complement({});
    any_star = Seq{Grammar::ref(g.repeat(*e.encode(all), 0, -1))};
  }
  const int top = g.new_rule();
  bool matches = false;
  for (const Parser::Top& t : p.tops) {
    auto body = e.emit(t.node);
    if (!body) continue;
    Seq s;
    if (opt.search && !t.start) s = *any_star;
    s.insert(s.end(), body->begin(), body->end());
    if (opt.search && !t.end) s.insert(s.end(), any_star->begin(), any_star->end());
    g.add_alt(top, s);
    matches = true;
  }
  if (e.too_large || g.num_rules() - rules_before > kMaxRules) return make_error("regex: the pattern is too large to follow");
  if (!matches) return make_error("regex: the pattern matches no string");
  return top;
}

Expected<Grammar> regex_grammar(std::string_view pattern) {
  Grammar g;
  auto r = regex_rule(g, pattern, {});
  if (!r.ok()) return make_error(r.message());
  g.set_root(*r);
  SS_TRY(g.validate());
  return g;
}

}  // namespace ss::structured
