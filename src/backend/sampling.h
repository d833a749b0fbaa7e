// Sampling as every backend does it: the parameters a request carries, the counter-based random
// numbers its draws use, the grammar mask a row may come with, and the host reference sampler (the
// CPU backend samples with it; device backends are tested against it). Included by backend.h.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "backend/sampling_rng.h"
#include "common/status.h"

namespace ss::backend {

struct SamplingParams {
  float temperature = 1.0f;        // 0 → greedy
  int top_k = 0;                   // 0 → off
  float top_p = 1.0f;              // 1 → off
  float min_p = 0.0f;              // 0 → off; keep tokens with p >= min_p * p_max
  float repetition_penalty = 1.0f; // CTRL/HF style, over prompt and output tokens
  float presence_penalty = 0.0f;   // OpenAI style, over output tokens
  float frequency_penalty = 0.0f;  // OpenAI style, over output tokens
  // OpenAI's logit_bias: (token id, value in [-100, 100]) added to that token's logit before the
  // penalties (as vLLM and llama.cpp order them); ±100 bans or forces a token in practice.
  std::vector<std::pair<int32_t, float>> logit_bias;
  uint64_t seed = 0;

  // Clear message when a value is outside its range (e.g. "top_p must be in (0, 1], got 1.5").
  // Token ids of logit_bias are checked against the vocabulary by whoever knows it (the scheduler).
  Status validate() const;
  bool greedy() const { return temperature <= 0.0f; }
};

// Structured outputs: which tokens may come next (structured/ implements it for grammars, regexes
// and JSON Schema). A backend consults it while sampling a row, never concurrently for one
// request: allows() about the token it drew, falling back to the mask (then drawing again) when the
// answer is no, or masking first where a draw from the whole vocabulary would not be exact (top-k /
// top-p / min-p, logprobs). A device backend takes the mask as a bitmask per row. accept() follows
// the chosen token and is the executor's call, after the step. The request finishes with Stop once
// must_end() (the text is complete and nothing may follow).
class TokenMask {
 public:
  virtual ~TokenMask() = default;
  virtual bool allows(int32_t token) = 0;  // may `token` come next?
  // -inf on every token that may not come next; n: the row's length (the model's vocabulary, which
  // may have padding ids beyond the tokenizer's: never allowed).
  virtual void mask(float* logits, int n) = 0;
  // Bit t of words[t / 32] (least significant first) set iff token t may come next, t < n; words
  // holds (n + 31) / 32 entries. The default derives it from mask().
  virtual void fill_bitmask(uint32_t* words, int n);
  virtual void accept(int32_t token) = 0;
  virtual bool must_end() const = 0;
  // Non-empty when the mask cannot go on (e.g. a schema too ambiguous to follow): the request
  // finishes with FinishReason::Error and this message, which starts with kConstraintErrorPrefix
  // (the client's input, not the server, is at fault: the server answers it as a 400).
  virtual std::string error() const { return {}; }
};

inline constexpr std::string_view kConstraintErrorPrefix = "structured output: ";

// A row's log-softmax (after bias, penalties and the mask; before temperature / truncation): the
// chosen (or scored) token's value and the k most likely tokens (id, logprob), most likely first,
// ties by id.
struct RowLogprobs {
  float chosen = 0.0f;
  std::vector<std::pair<int32_t, float>> top;
};

// The host reference sampler for one row at a time; its scratch (vocab-sized, reused) makes it
// cheap to keep one per thread. Same seed, counter and logits give the same token on every run,
// machine and ISA (the weights' exp has the same bits everywhere).
class RowSampler {
 public:
  explicit RowSampler(int vocab_size);
  ~RowSampler();
  RowSampler(RowSampler&&) noexcept;
  RowSampler& operator=(RowSampler&&) noexcept;

  // Picks the token for a request's output position `n` (its draws: counters 2n, 2n + 1). `logits`
  // (vocab floats) is modified in place (bias, penalties, and the mask when one was needed).
  // prompt / output: the ids so far (penalties). With a mask, the draw is from the model's
  // distribution restricted to what the mask allows: greedy and plain temperature sampling draw
  // from the whole vocabulary first and mask only when the draw is refused (a refused draw is
  // redrawn from the masked distribution, so each allowed t comes out with p(t) / p(allowed), as if
  // masked first); with top-k / top-p / min-p the truncation must see the masked distribution, so
  // those mask first. mask_first: mask before anything (logprobs report the masked distribution).
  int32_t sample(float* logits, const SamplingParams& p, uint64_t n, std::span<const int32_t> prompt,
                 std::span<const int32_t> output, TokenMask* mask = nullptr, bool mask_first = false);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A request's own sampler for callers that sample one stream themselves (tests, tools): draws
// follow one another (output position 0, 1, 2, ... per call) whatever the spans hold.
class Sampler {
 public:
  Sampler(const SamplingParams& params, int vocab_size) : params_(params), row_(vocab_size) {}
  int32_t sample(float* logits, std::span<const int32_t> prompt, std::span<const int32_t> output) {
    return row_.sample(logits, params_, n_++, prompt, output);
  }
  int32_t sample(float* logits, std::span<const int32_t> prompt, std::span<const int32_t> output, TokenMask& m) {
    return row_.sample(logits, params_, n_++, prompt, output, &m);
  }
  const SamplingParams& params() const { return params_; }

 private:
  SamplingParams params_;
  RowSampler row_;
  uint64_t n_ = 0;
};

// Greedy pick with a fixed tie-break (lowest id), shared by every path that needs argmax.
int32_t argmax(const float* logits, int n);
// The log-softmax of `logits` (n values): `chosen`'s value and the k most likely tokens.
void row_logprobs(const float* logits, int n, int32_t chosen, int k, RowLogprobs& out);

}  // namespace ss::backend
