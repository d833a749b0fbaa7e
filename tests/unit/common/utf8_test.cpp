// UTF-8 helpers (common/utf8.h): repair against the maximal-subpart rule (Python's errors="replace"),
// the strict decoder against the encoder on every scalar value and against the repairing validator on
// random bytes (two separate implementations that must agree).
#include "common/utf8.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ss {
namespace {

TEST(Utf8, RepairReplacesMaximalSubparts) {
  EXPECT_EQ(repair_utf8("abc"), "abc");
  EXPECT_EQ(repair_utf8("a\xFF" "b"), "a\uFFFDb");
  EXPECT_EQ(repair_utf8("\xE2\x82" "A"), "\uFFFDA");
  EXPECT_EQ(repair_utf8("\xF0\x80\x80"), "\uFFFD\uFFFD\uFFFD");
  EXPECT_EQ(repair_utf8("\xED\xA0\x80"), "\uFFFD\uFFFD\uFFFD");  // surrogate
  EXPECT_EQ(repair_utf8("\xF0\x9F\x98"), "\uFFFD");
  EXPECT_EQ(repair_utf8("\xF0\x9F\x98\x80"), "\U0001F600");
  EXPECT_EQ(incomplete_utf8_tail("ab\xF0\x9F"), 2u);
  EXPECT_EQ(incomplete_utf8_tail("ab\xC3"), 1u);
  EXPECT_EQ(incomplete_utf8_tail("ab\xC0"), 0u);
  EXPECT_EQ(incomplete_utf8_tail("\xF0\x9F\x98\x80"), 0u);
}

TEST(Utf8, StrictDecodeRoundTripsEveryScalarValue) {
  for (uint32_t cp = 0; cp <= 0x10FFFF; ++cp) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    const std::string s = encode_utf8(cp);
    ASSERT_EQ(s.size(), static_cast<size_t>(utf8_len(static_cast<unsigned char>(s[0])))) << cp;
    size_t i = 0;
    uint32_t back = 0;
    ASSERT_TRUE(decode_utf8(s, i, back)) << cp;
    ASSERT_EQ(back, cp);
    ASSERT_EQ(i, s.size());
  }
  // Surrogates, overlong forms, past U+10FFFF, truncation, a stray continuation: refused, i unmoved.
  for (std::string bad : {"\xED\xA0\x80", "\xC0\xAF", "\xE0\x80\xAF", "\xF4\x90\x80\x80", "\xE2\x82", "\x80"}) {
    size_t i = 0;
    uint32_t cp = 0;
    EXPECT_FALSE(decode_utf8(bad, i, cp)) << bad.size();
    EXPECT_EQ(i, 0u);
  }
}

TEST(Utf8, StrictDecodeAgreesWithTheValidator) {
  uint64_t state = 0x2545F4914F6CDD1Dull;
  auto next = [&] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  const char* pieces[] = {"a", "\xC3\xA9", "\xE2\x82\xAC", "\xF0\x9F\x98\x80", "\xED\xA0\x80", "\xC0", "\xF5"};
  for (int n = 0; n < 20000; ++n) {
    std::string s;
    const size_t len = next() % 12;
    for (size_t k = 0; k < len; ++k) {
      if (next() % 3 == 0) s += pieces[next() % 7];
      else s.push_back(static_cast<char>(next() & 0xFF));
    }
    size_t i = 0;
    uint32_t cp = 0;
    std::vector<uint32_t> cps;
    while (decode_utf8(s, i, cp)) cps.push_back(cp);
    ASSERT_EQ(i, valid_utf8_prefix(s));
    // The bulk decoder gives the same code points for the valid prefix.
    std::vector<uint32_t> bulk, offsets;
    decode_utf8(std::string_view(s).substr(0, i), bulk, offsets);
    ASSERT_EQ(bulk, cps);
    ASSERT_EQ(offsets.back(), i);
    if (i == s.size()) {
      ASSERT_EQ(repair_utf8(s), s);
    }
  }
}

}  // namespace
}  // namespace ss
