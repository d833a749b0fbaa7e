// Single-sequence generation over a Backend: prefill in chunks, then decode until a stop.
// The batching engine (scheduler, paged KV manager) replaces this for serving; the CLI's
// `generate` and `bench offline` use it directly.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "engine/sampler.h"
#include "engine/token_constraint.h"

namespace ss::engine {

struct GenerateOptions {
  int max_tokens = 256;
  int prefill_chunk = 512;           // tokens per forward during prefill
  bool stop_at_eog = true;
  std::vector<int32_t> stop_ids;     // end-of-generation ids (tokenizer eog_ids)
  // Structured output (grammar.h): the text stays inside it and ends when it is complete.
  std::shared_ptr<TokenConstraint> constraint;
};

struct GenerateStats {
  int prompt_tokens = 0;
  int generated_tokens = 0;
  double prefill_seconds = 0;
  double decode_seconds = 0;         // from the first sampled token to the last
  enum class Finish { Length, Stop, Context } finish = Finish::Length;
};

// on_token returns false to stop early. The backend's KV cache must hold prompt + max_tokens.
Expected<GenerateStats> generate(backend::Backend& be, int vocab_size, const std::vector<int32_t>& prompt,
                                 const SamplingParams& sp, const GenerateOptions& opts,
                                 const std::function<bool(int32_t)>& on_token);

}  // namespace ss::engine
