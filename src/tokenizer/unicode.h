// Code points for the tokenizer: UTF-8 decoding and repair, the classes the pre-tokenizer regexes
// use (probed from Hugging Face tokenizers, see tools/gen_tokenizer_unicode.py), NFC, and the
// GPT-2 byte <-> printable-code-point mapping. Private to src/tokenizer/.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ss::tok::uni {

enum : uint8_t {
  kLetter = 1,       // \p{L} (HF regex engine)
  kNumber = 2,       // \p{N}
  kSpace = 4,        // \s
  kNumeric = 8,      // Rust char::is_numeric (Digits pre-tokenizer)
  kWhitespace = 16,  // Rust char::is_whitespace (added tokens' lstrip/rstrip)
};
uint8_t flags(uint32_t cp);

// Length of the UTF-8 sequence a lead byte announces (1 for invalid leads).
inline int utf8_len(unsigned char c) {
  if (c < 0x80) return 1;
  if ((c & 0xE0) == 0xC0) return 2;
  if ((c & 0xF0) == 0xE0) return 3;
  if ((c & 0xF8) == 0xF0) return 4;
  return 1;
}
void append_utf8(std::string& out, uint32_t cp);

// Length of the longest prefix of s that is valid UTF-8.
size_t valid_utf8_prefix(std::string_view s);
// s with every ill-formed subsequence replaced by U+FFFD (one per maximal subpart, as Rust's
// String::from_utf8_lossy and Python's errors="replace" do).
std::string repair_utf8(std::string_view s);
// Number of bytes at the end of s that form an incomplete (but so far valid) UTF-8 sequence.
size_t incomplete_utf8_tail(std::string_view s);

// Decodes valid UTF-8 into code points and their byte offsets (offsets has one extra entry: size).
void decode_utf8(std::string_view s, std::vector<uint32_t>& cps, std::vector<uint32_t>& offsets);

// Unicode NFC (ICU). Returns s unchanged when it is already NFC.
std::string nfc(const std::string& s);

// GPT-2 byte-level alphabet: each byte maps to one printable code point.
uint32_t byte_to_cp(uint8_t b);
int byte_from_cp(uint32_t cp);  // -1 when cp is not in the alphabet

}  // namespace ss::tok::uni
