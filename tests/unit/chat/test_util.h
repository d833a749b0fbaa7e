// Helpers for the chat tests: the tokenizer tests' fixtures (tests/data/tokenizer/) and a
// vocabulary-free tokenizer that only names bos/eos.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "../tokenizer/test_util.h"
#include "chat/chat.h"
#include "tokenizer/tokenizer.h"

namespace ss::chat::test {

using tok::test::data_dir;
using tok::test::read_gguf_spec;
using tok::test::read_json;
using tok::test::read_text;
using tok::test::smollm2_gguf;

// A vocabulary-free Tokenizer that only names bos/eos, for render_chat.
class NamesOnly final : public tok::Tokenizer {
 public:
  NamesOnly(std::string bos, std::string eos) : names_{std::move(bos), std::move(eos)} {}
  std::vector<int32_t> encode(std::string_view, bool, bool) const override { return {}; }
  std::string decode(const std::vector<int32_t>&, bool) const override { return {}; }
  std::string token_to_piece(int32_t) const override { return {}; }
  int32_t vocab_size() const override { return 2; }
  int32_t bos_id() const override { return names_[0].empty() ? -1 : 0; }
  int32_t eos_id() const override { return 1; }
  bool add_bos() const override { return false; }
  std::string_view token_text(int32_t id) const override { return names_[id]; }
  bool is_special(int32_t) const override { return true; }
  const std::vector<int32_t>& eog_ids() const override { return eog_; }
  const std::string& chat_template() const override { return tmpl_; }
  std::string summary() const override { return "names"; }

 private:
  std::string names_[2];
  std::vector<int32_t> eog_{1};
  std::string tmpl_;
};

}  // namespace ss::chat::test
