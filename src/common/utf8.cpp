#include "common/utf8.h"

namespace ss {
namespace {

constexpr uint32_t kMaxCp = 0x10FFFF;

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

std::string encode_utf8(uint32_t cp) {
  std::string out;
  append_utf8(out, cp);
  return out;
}

bool decode_utf8(std::string_view s, size_t& i, uint32_t& cp) {
  const auto b = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  if (i >= s.size()) return false;
  const uint8_t c = b(i);
  const int len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
  if (len == 0 || i + static_cast<size_t>(len) > s.size()) return false;
  uint32_t v = len == 1 ? c : len == 2 ? (c & 0x1Fu) : len == 3 ? (c & 0x0Fu) : (c & 0x07u);
  for (int k = 1; k < len; ++k) {
    if ((b(i + k) & 0xC0) != 0x80) return false;
    v = v << 6 | (b(i + k) & 0x3Fu);
  }
  static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
  if (v < kMin[len] || v > kMaxCp || (v >= 0xD800 && v <= 0xDFFF)) return false;
  cp = v;
  i += static_cast<size_t>(len);
  return true;
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

}  // namespace ss
