// Token sampling: logit bias and penalties, then greedy or temperature / top-k / top-p / min-p, from a seeded RNG.
// Same seed and same logits give the same token on every run and machine (the weights' exp has the
// same bits on every ISA).
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "engine/token_constraint.h"

namespace ss::engine {

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

class Sampler {
 public:
  Sampler(const SamplingParams& params, int vocab_size);

  // Picks the next token. `logits` (vocab_size floats) is modified in place (bias, penalties).
  // prompt: the prompt's ids; output: ids generated so far.
  int32_t sample(float* logits, std::span<const int32_t> prompt, std::span<const int32_t> output);
  // The same, kept inside `c` and drawn from the model's distribution restricted to the tokens `c`
  // allows. Greedy and plain temperature sampling draw from the whole vocabulary first and mask
  // only when the draw is refused: the first draw is kept with probability p(t), a refused one is
  // redrawn from the masked distribution, so each allowed t comes out with p(t) / p(allowed), as
  // if masked first (greedy: the argmax, if allowed, is the masked argmax). With top-k / top-p /
  // min-p the truncation must see the masked distribution, so those mask first. `logits` ends up
  // masked only when a mask was needed.
  int32_t sample(float* logits, std::span<const int32_t> prompt, std::span<const int32_t> output, TokenConstraint& c);

  const SamplingParams& params() const { return params_; }

 private:
  void apply_penalties(float* logits, std::span<const int32_t> prompt, std::span<const int32_t> output);
  int32_t draw(float* logits);  // after the penalties
  double next_uniform();  // [0, 1)

  SamplingParams params_;
  int vocab_;
  uint64_t rng_state_[4];
  // Reused every call: no allocation per token after the first.
  std::vector<int32_t> counts_;
  std::vector<int32_t> touched_;
  std::vector<std::pair<float, int32_t>> cand_;
  std::vector<float> w_;      // exp(logit / T - max / T) per token
  std::vector<double> bsum_;  // w_ summed per cpu::ops::kSampleBlock tokens
};

// Greedy pick with a fixed tie-break (lowest id), shared by every path that needs argmax.
int32_t argmax(const float* logits, int n);

}  // namespace ss::engine
