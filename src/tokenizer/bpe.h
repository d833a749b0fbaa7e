// The BPE model: ranked merges over token ids, applied to one pre-tokenized word the way Hugging
// Face tokenizers' BPE::merge_word does (min-heap on (rank, position), stale entries checked by the
// id they would produce). Private to src/tokenizer/.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/status.h"

namespace ss::tok {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using VocabMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

class BpeModel {
 public:
  // Byte-level: a word's initial symbols are its bytes, each through the GPT-2 alphabet.
  // Otherwise: its UTF-8 characters, with <0xXX> byte fallback when enabled.
  bool byte_level = true;
  bool byte_fallback = false;
  bool fuse_unk = false;
  bool ignore_merges = false;  // a word that is itself in the vocabulary is taken whole
  int32_t unk_id = -1;

  // vocab: token text (as stored) → id. Must be set before add_merge/finish.
  const VocabMap* vocab = nullptr;

  Status add_merge(std::string_view left, std::string_view right, int32_t rank);
  // Merges for SentencePiece-style vocabularies scored by priority (GGUF "llama"): every split of a
  // token into two tokens becomes a merge ranked by the token's score (higher merges first).
  void add_merges_from_scores(const std::vector<std::string>& tokens, const std::vector<float>& scores,
                              const std::vector<bool>& mergeable);
  void finish();  // builds the per-byte tables

  // Appends the ids of one word (raw UTF-8 bytes; byte-level mapping is done here).
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;

 private:
  struct MergeVal {
    int32_t rank;
    int32_t id;
  };
  static uint64_t key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }
  std::unordered_map<uint64_t, MergeVal> merges_;
  int32_t byte_char_id_[256];   // byte-level: id of the alphabet char of each byte, -1 if absent
  int32_t byte_token_id_[256];  // byte fallback: id of <0xXX>, -1 if absent
  std::string byte_char_utf8_[256];
};

}  // namespace ss::tok
