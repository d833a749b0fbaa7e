// Structured outputs: which tokens may come next (grammar.h implements it for JSON Schema).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace ss::engine {

// The engine consults a request's constraint on a backend thread, never concurrently for one
// request: the sampler asks allows() about the token it drew and falls back to mask() (then draws
// again) when the answer is no, or masks first where a draw from the whole vocabulary would not be
// exact (top-k / top-p / min-p, logprobs); accept() follows the token that was chosen. The request
// finishes with Stop once must_end() (the text is complete and nothing may follow).
class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  virtual bool allows(int32_t token) = 0;  // may `token` come next?
  // -inf on every token that may not come next; n: the row's length (the model's vocabulary, which
  // may have padding ids beyond the tokenizer's: never allowed).
  virtual void mask(float* logits, int n) = 0;
  virtual void accept(int32_t token) = 0;
  virtual bool must_end() const = 0;
  // Non-empty when the constraint cannot go on (e.g. a schema too ambiguous to follow): the request
  // finishes with FinishReason::Error and this message, which starts with kConstraintErrorPrefix
  // (the client's input, not the server, is at fault: the server answers it as a 400).
  virtual std::string error() const { return {}; }
};

inline constexpr std::string_view kConstraintErrorPrefix = "structured output: ";

}  // namespace ss::engine
