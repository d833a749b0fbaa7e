// UTF-8, in one place: lengths, encoding, strict and lenient decoding, repair of ill-formed input.
// The tokenizer (repair, streaming), the regex / GBNF compilers (strict decoding) and the chat
// templates (Python's str.strip) all use these.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ss {

// Length of the UTF-8 sequence a lead byte announces (1 for invalid leads).
inline int utf8_len(unsigned char c) {
  if (c < 0x80) return 1;
  if ((c & 0xE0) == 0xC0) return 2;
  if ((c & 0xF0) == 0xE0) return 3;
  if ((c & 0xF8) == 0xF0) return 4;
  return 1;
}

void append_utf8(std::string& out, uint32_t cp);  // cp: a scalar value
std::string encode_utf8(uint32_t cp);

// One UTF-8 scalar value of s at i (i advances past it); false when ill-formed (truncated,
// overlong, a surrogate, past U+10FFFF, a stray continuation byte), and then i is left alone.
bool decode_utf8(std::string_view s, size_t& i, uint32_t& cp);
// Decodes valid UTF-8 into code points and their byte offsets (offsets has one extra entry: size).
// Input that is not valid UTF-8 must be repaired first (repair_utf8).
void decode_utf8(std::string_view s, std::vector<uint32_t>& cps, std::vector<uint32_t>& offsets);

// Length of the longest prefix of s that is valid UTF-8.
size_t valid_utf8_prefix(std::string_view s);
// s with every ill-formed subsequence replaced by U+FFFD (one per maximal subpart, as Rust's
// String::from_utf8_lossy and Python's errors="replace" do).
std::string repair_utf8(std::string_view s);
// Number of bytes at the end of s that form an incomplete (but so far valid) UTF-8 sequence.
size_t incomplete_utf8_tail(std::string_view s);

}  // namespace ss
