// Code points for the tokenizer: the classes the pre-tokenizer regexes use (probed from Hugging Face
// tokenizers, see tools/gen_tokenizer_unicode.py), NFC, and the GPT-2 byte <-> printable-code-point
// mapping. Private to src/tokenizer/. UTF-8 itself is common/utf8.h.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/utf8.h"  // the UTF-8 helpers the tokenizer uses

namespace ss::tok::uni {

enum : uint8_t {
  kLetter = 1,       // \p{L} (HF regex engine)
  kNumber = 2,       // \p{N}
  kSpace = 4,        // \s
  kNumeric = 8,      // Rust char::is_numeric (Digits pre-tokenizer)
  kWhitespace = 16,  // Rust char::is_whitespace (added tokens' lstrip/rstrip)
};
uint8_t flags(uint32_t cp);

// Unicode NFC (ICU). Returns s unchanged when it is already NFC.
std::string nfc(const std::string& s);

// GPT-2 byte-level alphabet: each byte maps to one printable code point.
uint32_t byte_to_cp(uint8_t b);
int byte_from_cp(uint32_t cp);  // -1 when cp is not in the alphabet

}  // namespace ss::tok::uni
