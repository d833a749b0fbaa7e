#include "tokenizer/pretokenize.h"

#include "tokenizer/unicode.h"

namespace ss::tok {

const char* const kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const char* const kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

void CpText::assign(std::string_view utf8) {
  decode_utf8(utf8, cps, offsets);
  flags.resize(cps.size());
  for (size_t i = 0; i < cps.size(); ++i) flags[i] = uni::flags(cps[i]);
}

namespace {

// Regex alternatives at one position of a span ending at e (the regex sees the span as the whole string).
class Matcher {
 public:
  Matcher(const CpText& t, uint32_t e) : cp_(t.cps.data()), fl_(t.flags.data()), e_(e) {}

  bool L(uint32_t i) const { return i < e_ && (fl_[i] & uni::kLetter); }
  bool N(uint32_t i) const { return i < e_ && (fl_[i] & uni::kNumber); }
  bool S(uint32_t i) const { return i < e_ && (fl_[i] & uni::kSpace); }
  // [^\s\p{L}\p{N}]
  bool Other(uint32_t i) const { return i < e_ && !(fl_[i] & (uni::kLetter | uni::kNumber | uni::kSpace)); }
  bool CrLf(uint32_t i) const { return i < e_ && (cp_[i] == '\r' || cp_[i] == '\n'); }
  uint32_t cp(uint32_t i) const { return i < e_ ? cp_[i] : 0; }

  template <class Pred>
  uint32_t run(uint32_t i, Pred p) const {
    while (p(i)) ++i;
    return i;
  }

  // 's|'t|'re|'ve|'m|'ll|'d, optionally case-insensitive (Oniguruma folds ſ U+017F to s too).
  uint32_t contraction(uint32_t i, bool icase) const {
    if (cp(i) != '\'') return 0;
    auto low = [&](uint32_t c) -> uint32_t {
      if (!icase) return c;
      if (c >= 'A' && c <= 'Z') return c + 32;
      if (c == 0x17F) return 's';
      return c;
    };
    uint32_t c1 = low(cp(i + 1));
    if (i + 1 >= e_) return 0;
    if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return i + 2;
    if (i + 2 >= e_) return 0;
    uint32_t c2 = low(cp(i + 2));
    if (c2 == 0x17F) return 0;  // only 's folds ſ
    if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return i + 3;
    return 0;
  }

  // \s+(?!\S) then \s+, at a whitespace position.
  uint32_t spaces(uint32_t i) const {
    uint32_t k = run(i, [&](uint32_t j) { return S(j); });
    if (k == e_ || k - i < 2) return k;
    return k - 1;
  }

  uint32_t gpt2(uint32_t i) const {
    if (uint32_t m = contraction(i, false)) return m;
    uint32_t j = (cp(i) == ' ') ? i + 1 : i;
    if (L(j)) return run(j, [&](uint32_t x) { return L(x); });
    if (N(j)) return run(j, [&](uint32_t x) { return N(x); });
    if (Other(j)) return run(j, [&](uint32_t x) { return Other(x); });
    // Here cp(i) is whitespace (a lone ' ' before whitespace/end, or another space char).
    return spaces(i);
  }

  uint32_t llama3(uint32_t i, uint32_t max_digits) const {
    if (uint32_t m = contraction(i, true)) return m;
    if (L(i)) return run(i, [&](uint32_t x) { return L(x); });
    if (!CrLf(i) && !N(i) && L(i + 1)) return run(i + 1, [&](uint32_t x) { return L(x); });
    if (N(i)) {
      uint32_t j = i;
      while (j - i < max_digits && N(j)) ++j;
      return j;
    }
    uint32_t j = (cp(i) == ' ' && Other(i + 1)) ? i + 1 : i;
    if (Other(j)) {
      j = run(j, [&](uint32_t x) { return Other(x); });
      return run(j, [&](uint32_t x) { return CrLf(x); });
    }
    // Whitespace: \s*[\r\n]+ ends after the last newline of the run, if any.
    uint32_t k = run(i, [&](uint32_t x) { return S(x); });
    for (uint32_t m = k; m > i; --m) {
      if (CrLf(m - 1)) return m;
    }
    return spaces(i);
  }

 private:
  const uint32_t* cp_;
  const uint8_t* fl_;
  uint32_t e_;
};

}  // namespace

void split_spans(SplitKind kind, const CpText& text, const std::vector<Span>& in, std::vector<Span>& out) {
  for (const Span& s : in) {
    if (s.begin >= s.end) continue;
    switch (kind) {
      case SplitKind::Gpt2:
      case SplitKind::Llama3:
      case SplitKind::Qwen2: {
        Matcher m(text, s.end);
        uint32_t i = s.begin;
        while (i < s.end) {
          uint32_t j = kind == SplitKind::Gpt2 ? m.gpt2(i) : m.llama3(i, kind == SplitKind::Llama3 ? 3 : 1);
          if (j <= i) j = i + 1;  // cannot happen: the alternatives cover every code point
          out.push_back({i, j});
          i = j;
        }
        break;
      }
      case SplitKind::DigitsEach:
      case SplitKind::DigitsRun: {
        uint32_t i = s.begin;
        while (i < s.end) {
          bool num = text.flags[i] & uni::kNumeric;
          uint32_t j = i + 1;
          if (!num || kind == SplitKind::DigitsRun) {
            while (j < s.end && bool(text.flags[j] & uni::kNumeric) == num) ++j;
          }
          out.push_back({i, j});
          i = j;
        }
        break;
      }
      case SplitKind::MetaspaceCut: {
        uint32_t i = s.begin;
        while (i < s.end) {
          uint32_t j = i + 1;
          while (j < s.end && text.cps[j] != 0x2581) ++j;
          out.push_back({i, j});
          i = j;
        }
        break;
      }
    }
  }
}

}  // namespace ss::tok
