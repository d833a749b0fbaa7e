// Pre-tokenization: splitting normalized text into pieces before BPE, with hand-written matchers
// equivalent to the Hugging Face regexes (leftmost-first alternation, backtracking included).
// Private to src/tokenizer/.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ss::tok {

enum class SplitKind {
  Gpt2,         // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  Llama3,       // (?i:'s|...)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
  Qwen2,        // as Llama3 with \p{N} (one digit per piece)
  DigitsEach,   // HF Digits(individual_digits=true): every numeric char alone
  DigitsRun,    // HF Digits(individual_digits=false): runs of numeric chars
  MetaspaceCut, // HF Metaspace(split=true): a piece starts at every U+2581
};

// The regex strings Hugging Face tokenizer.json files use for these splitters (Split pre-tokenizer).
extern const char* const kGpt2Pattern;
extern const char* const kLlama3Pattern;
extern const char* const kQwen2Pattern;

// Text decoded once into code points with their classes; pieces are code point ranges.
struct CpText {
  std::vector<uint32_t> cps;
  std::vector<uint32_t> offsets;  // byte offset of each code point, plus one for the end
  std::vector<uint8_t> flags;
  void assign(std::string_view utf8);
};

struct Span {
  uint32_t begin, end;  // code point indices
};

// Splits each span of `in` with `kind`, appending the pieces (in order, covering the input) to out.
void split_spans(SplitKind kind, const CpText& text, const std::vector<Span>& in, std::vector<Span>& out);

}  // namespace ss::tok
