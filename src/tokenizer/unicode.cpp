#include "tokenizer/unicode.h"

#include <unicode/normalizer2.h>
#include <unicode/uniset.h>
#include <unicode/unistr.h>

#include <algorithm>
#include <array>

namespace ss::tok::uni {
namespace {

struct CpRun {
  uint32_t first;
  uint8_t bits;
};
#include "tokenizer/unicode_data.inc"

struct ByteMap {
  std::array<uint32_t, 256> to_cp{};
  std::array<int16_t, 324> from_cp{};
  ByteMap() {
    from_cp.fill(-1);
    uint32_t extra = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      uint32_t cp = printable ? uint32_t(b) : 256 + extra++;
      to_cp[b] = cp;
      from_cp[cp] = int16_t(b);
    }
  }
};
const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

// Length of the valid sequence at s[i], or 0 with *bad set to the length of the maximal subpart
// to replace.
size_t check_seq(std::string_view s, size_t i, size_t* bad) {
  auto c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) return 1;
  int need;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    need = 1;
  } else if (c >= 0xE0 && c <= 0xEF) {
    need = 2;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    need = 3;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    *bad = 1;
    return 0;
  }
  size_t j = i + 1;
  for (int k = 0; k < need; ++k, ++j) {
    if (j >= s.size()) {
      *bad = j - i;
      return 0;
    }
    auto d = static_cast<unsigned char>(s[j]);
    unsigned char l = k == 0 ? lo : 0x80, h = k == 0 ? hi : 0xBF;
    if (d < l || d > h) {
      *bad = j - i;
      return 0;
    }
  }
  return j - i;
}

}  // namespace

uint8_t flags(uint32_t cp) {
  static const auto ascii = [] {
    std::array<uint8_t, 128> t{};
    for (uint32_t c = 0; c < 128; ++c) {
      auto it = std::upper_bound(std::begin(kCpRuns), std::end(kCpRuns), c,
                                 [](uint32_t v, const CpRun& r) { return v < r.first; });
      t[c] = (it - 1)->bits;
    }
    return t;
  }();
  if (cp < 128) return ascii[cp];
  auto it = std::upper_bound(std::begin(kCpRuns), std::end(kCpRuns), cp,
                             [](uint32_t v, const CpRun& r) { return v < r.first; });
  return (it - 1)->bits;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(char(cp));
  } else if (cp < 0x800) {
    out.push_back(char(0xC0 | (cp >> 6)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(char(0xE0 | (cp >> 12)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (cp >> 18)));
    out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  }
}

size_t valid_utf8_prefix(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    // ASCII fast path, 8 bytes at a time.
    while (i + 8 <= s.size()) {
      uint64_t w;
      __builtin_memcpy(&w, s.data() + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= s.size()) break;
    size_t bad = 0;
    size_t n = check_seq(s, i, &bad);
    if (n == 0) return i;
    i += n;
  }
  return s.size();
}

std::string repair_utf8(std::string_view s) {
  size_t i = valid_utf8_prefix(s);
  if (i == s.size()) return std::string(s);
  std::string out(s.substr(0, i));
  while (i < s.size()) {
    size_t bad = 0;
    size_t n = check_seq(s, i, &bad);
    if (n) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      out.append("\xEF\xBF\xBD");
      i += bad;
    }
  }
  return out;
}

size_t incomplete_utf8_tail(std::string_view s) {
  // A valid-so-far prefix of a multi-byte sequence is at most 3 bytes long.
  for (size_t k = 1; k <= 3 && k <= s.size(); ++k) {
    size_t i = s.size() - k;
    auto c = static_cast<unsigned char>(s[i]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: look further back
    if (c < 0xC2 || c > 0xF4) return 0;
    size_t bad = 0;
    if (check_seq(s, i, &bad) == 0 && bad == k && int(k) < utf8_len(c)) return k;
    return 0;
  }
  return 0;
}

void decode_utf8(std::string_view s, std::vector<uint32_t>& cps, std::vector<uint32_t>& offsets) {
  cps.clear();
  offsets.clear();
  cps.reserve(s.size());
  offsets.reserve(s.size() + 1);
  size_t i = 0;
  while (i < s.size()) {
    auto c = static_cast<unsigned char>(s[i]);
    offsets.push_back(uint32_t(i));
    uint32_t cp;
    int n = utf8_len(c);
    if (i + n > s.size()) n = 1;  // cannot happen for repaired input
    switch (n) {
      case 1: cp = c; break;
      case 2: cp = ((c & 0x1F) << 6) | (s[i + 1] & 0x3F); break;
      case 3: cp = ((c & 0x0F) << 12) | ((s[i + 1] & 0x3F) << 6) | (s[i + 2] & 0x3F); break;
      default:
        cp = ((c & 0x07) << 18) | ((s[i + 1] & 0x3F) << 12) | ((s[i + 2] & 0x3F) << 6) | (s[i + 3] & 0x3F);
    }
    cps.push_back(cp);
    i += n;
  }
  offsets.push_back(uint32_t(s.size()));
}

// HF tokenizers normalizes with Unicode 9.0 data (crate unicode-normalization-alignments): code
// points assigned later are left alone and stop reordering/composition. ICU does the same for an
// older version when its NFC is filtered to the characters of that age (as ICU's own IDNA 2003 does).
const icu::Normalizer2* hf_nfc() {
  static const icu::Normalizer2* n = [] {
    UErrorCode err = U_ZERO_ERROR;
    const icu::Normalizer2* base = icu::Normalizer2::getNFCInstance(err);
    if (U_FAILURE(err) || base == nullptr) return static_cast<const icu::Normalizer2*>(nullptr);
    auto* set = new icu::UnicodeSet(icu::UnicodeString("[:age=9.0:]"), err);
    if (U_FAILURE(err)) return static_cast<const icu::Normalizer2*>(nullptr);
    set->freeze();
    return static_cast<const icu::Normalizer2*>(new icu::FilteredNormalizer2(*base, *set));
  }();
  return n;
}

std::string nfc(const std::string& s) {
  bool ascii = true;
  for (char c : s) {
    if (static_cast<unsigned char>(c) >= 0x80) {
      ascii = false;
      break;
    }
  }
  if (ascii) return s;
  const icu::Normalizer2* n = hf_nfc();
  if (n == nullptr) return s;
  UErrorCode err = U_ZERO_ERROR;
  icu::UnicodeString u = icu::UnicodeString::fromUTF8(icu::StringPiece(s.data(), int32_t(s.size())));
  if (n->isNormalized(u, err) && U_SUCCESS(err)) return s;
  err = U_ZERO_ERROR;
  icu::UnicodeString out = n->normalize(u, err);
  if (U_FAILURE(err)) return s;
  std::string r;
  out.toUTF8String(r);
  return r;
}

uint32_t byte_to_cp(uint8_t b) { return byte_map().to_cp[b]; }
int byte_from_cp(uint32_t cp) { return cp < 324 ? byte_map().from_cp[cp] : -1; }

}  // namespace ss::tok::uni
