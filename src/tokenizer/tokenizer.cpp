// Placeholder so the tree links while the tokenizer is being written; replaced by the real one.
#include "tokenizer/tokenizer.h"

#include <algorithm>

namespace ss::tok {

Expected<std::unique_ptr<Tokenizer>> Tokenizer::from_spec(const TokenizerSpec&) {
  return make_error("tokenizer: not implemented yet");
}
Expected<std::unique_ptr<Tokenizer>> Tokenizer::from_json_file(const std::string& path) {
  return make_error(path + ": tokenizer.json loading not implemented yet");
}
bool Tokenizer::is_eog(int32_t id) const {
  const auto& e = eog_ids();
  return std::find(e.begin(), e.end(), id) != e.end();
}

}  // namespace ss::tok
