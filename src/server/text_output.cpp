#include "server/text_output.h"

#include <algorithm>

namespace ss::server {

TextOutput::TextOutput(const tok::Tokenizer& tok, std::vector<std::string> stops, bool skip_special, int min_tokens,
                       bool include_stop)
    : dec_(tok, skip_special), min_tokens_(min_tokens), include_stop_(include_stop) {
  for (auto& s : stops)
    if (!s.empty()) stops_.push_back(std::move(s));
}

void TextOutput::scan() {
  // Earliest complete match wins. Every match must start inside held_: text is released only when
  // no stop string can start in it.
  size_t best = std::string::npos;
  const std::string* which = nullptr;
  for (const std::string& s : stops_) {
    const size_t p = held_.find(s);
    if (p != std::string::npos && (best == std::string::npos || p < best)) best = p, which = &s;
  }
  if (which) {
    ready_.append(held_, 0, best);
    if (include_stop_) ready_ += *which;
    held_.clear();
    matched_ = *which;
    stopped_ = true;
    return;
  }
  // Hold back the longest suffix of held_ that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const std::string& s : stops_) {
    const size_t max_k = std::min(s.size() - 1, held_.size());
    for (size_t k = max_k; k > hold; --k)
      if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
        hold = k;
        break;
      }
  }
  ready_.append(held_, 0, held_.size() - hold);
  held_.erase(0, held_.size() - hold);
}

bool TextOutput::push(int32_t id) {
  if (stopped_ || finished_) return false;
  held_ += dec_.push(id);
  if (++pushed_ < min_tokens_) {  // too early to stop: release everything, hold nothing back
    ready_ += held_;
    held_.clear();
    return false;
  }
  scan();
  return stopped_;
}

std::string TextOutput::take() {
  std::string out;
  out.swap(ready_);
  return out;
}

std::string TextOutput::finish() {
  if (!stopped_ && !finished_) {
    held_ += dec_.flush();
    scan();
    ready_ += held_;
    held_.clear();
  }
  finished_ = true;
  return take();
}

}  // namespace ss::server
