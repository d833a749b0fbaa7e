// The tokenizer folder's public header: exact BPE tokenization (byte-level GPT-2 style and
// SentencePiece style) and streaming detokenization. Chat templates are chat/chat.h.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace ss::tok {

enum class TokenType : int32_t {  // GGUF tokenizer.ggml.token_type values
  Undefined = 0, Normal = 1, Unknown = 2, Control = 3, UserDefined = 4, Unused = 5, Byte = 6,
};

// Everything needed to build a tokenizer, as stored in GGUF metadata (tokenizer.ggml.*).
struct TokenizerSpec {
  std::string model;                 // "gpt2" (byte-level BPE) or "llama" (SentencePiece BPE)
  std::string pre;                   // pre-tokenizer: "llama-bpe", "qwen2", "smollm", "default", ...
  std::vector<std::string> tokens;
  std::vector<float> scores;         // SentencePiece merge priorities (may be empty for gpt2)
  std::vector<int32_t> token_types;  // TokenType per token (may be empty)
  std::vector<std::string> merges;   // "a b" per line, byte-level BPE only
  int32_t bos_id = -1, eos_id = -1, unk_id = -1, pad_id = -1, eot_id = -1;
  bool add_bos = false, add_eos = false, add_space_prefix = true;
  std::string chat_template;         // tokenizer.chat_template, may be empty
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  static Expected<std::unique_ptr<Tokenizer>> from_spec(const TokenizerSpec& spec);
  // A Hugging Face tokenizer.json (plus tokenizer_config.json beside it when present, for
  // add_bos and the chat template).
  static Expected<std::unique_ptr<Tokenizer>> from_json_file(const std::string& path);
  // The same from the text of a tokenizer.json (and of tokenizer_config.json, may be empty).
  static Expected<std::unique_ptr<Tokenizer>> from_json_text(std::string_view tokenizer_json,
                                                             std::string_view tokenizer_config_json = {},
                                                             const std::string& origin = "tokenizer.json");

  // add_special: prepend BOS / append EOS as the model wants. parse_special: recognise special and
  // added tokens written in the text (e.g. "<|im_start|>"), as HF does by default.
  // Invalid UTF-8 input is never an error: each ill-formed subsequence is replaced by U+FFFD first
  // (HF tokenizers only accept valid strings; Python's errors="replace" gives the same text).
  virtual std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special) const = 0;
  // Concatenated bytes of the tokens (may end mid-character). skip_special drops control tokens.
  // Like HF decode, a SentencePiece-style tokenizer drops the one space its encoder prepended.
  // Ids out of range are skipped.
  virtual std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const = 0;
  // The raw piece of one token (bytes it decodes to, for the "pieces" view).
  virtual std::string token_to_piece(int32_t id) const = 0;

  virtual int32_t vocab_size() const = 0;
  virtual int32_t bos_id() const = 0;
  virtual int32_t eos_id() const = 0;
  virtual bool add_bos() const = 0;
  virtual std::string_view token_text(int32_t id) const = 0;  // as stored in the vocabulary
  virtual bool is_special(int32_t id) const = 0;              // control / added special token
  // End-of-generation tokens: eos, eot, and the usual end markers found in the vocabulary
  // (<|im_end|>, <|eot_id|>, <|endoftext|>, </s>, <|end|>).
  virtual const std::vector<int32_t>& eog_ids() const = 0;
  bool is_eog(int32_t id) const;
  // Optional chat template found with the tokenizer (tokenizer_config.json), may be empty.
  virtual const std::string& chat_template() const = 0;
  virtual std::string summary() const = 0;  // one line: model, pre-tokenizer, vocab, specials
};

// Emits valid UTF-8 as tokens stream in: bytes of an unfinished character are held back until the
// character completes; invalid sequences become U+FFFD.
class StreamDecoder {
 public:
  // Pieces are emitted as token_to_piece gives them (no leading-space stripping: generated text
  // continues a prompt).
  explicit StreamDecoder(const Tokenizer& tok, bool skip_special = true) : tok_(tok), skip_special_(skip_special) {}
  std::string push(int32_t id);  // text that is now complete (may be empty)
  std::string flush();           // whatever remains, invalid tails replaced by U+FFFD
 private:
  const Tokenizer& tok_;
  bool skip_special_;
  std::string pending_;
};

}  // namespace ss::tok
