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
