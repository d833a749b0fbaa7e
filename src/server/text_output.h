// Incremental detokenization with stop strings: text is released as soon as it cannot be the start
// of a stop string; when a stop string completes, the text is cut right before it and generation
// should stop (the caller asks the engine to stop the request).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace ss::server {

class TextOutput {
 public:
  // Empty strings in `stops` are ignored. skip_special: control tokens decode to nothing.
  // min_tokens (vLLM's): stop strings are looked for only in the text of the min_tokens-th token on.
  // include_stop (vLLM's include_stop_str_in_output): the matched stop string ends the text instead
  // of being cut off.
  TextOutput(const tok::Tokenizer& tok, std::vector<std::string> stops, bool skip_special = true, int min_tokens = 0,
             bool include_stop = false);

  // Adds one generated token. Returns true when a stop string has just completed (the text is cut
  // before it; later pushes are ignored).
  bool push(int32_t id);
  // Text released since the last call.
  std::string take();
  // End of generation: releases what was held back (nothing past a matched stop string) and returns
  // everything not yet taken.
  std::string finish();

  bool stopped() const { return stopped_; }
  const std::string& matched_stop() const { return matched_; }

 private:
  void scan();

  tok::StreamDecoder dec_;
  std::vector<std::string> stops_;
  std::string held_;   // decoded but possibly the start of a stop string
  std::string ready_;  // released, not yet taken
  std::string matched_;
  bool stopped_ = false;
  bool finished_ = false;
  int min_tokens_ = 0;
  int pushed_ = 0;
  bool include_stop_ = false;
};

}  // namespace ss::server
