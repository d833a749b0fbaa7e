#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/kernels.h"

namespace ss::engine {

namespace {
std::string num(float v) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", static_cast<double>(v));
  return b;
}

uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
}  // namespace

Status SamplingParams::validate() const {
  if (!std::isfinite(temperature) || temperature < 0.0f) return make_error("temperature must be >= 0, got " + num(temperature));
  if (top_k < 0) return make_error("top_k must be >= 0 (0 disables it), got " + std::to_string(top_k));
  if (!(top_p > 0.0f && top_p <= 1.0f)) return make_error("top_p must be in (0, 1], got " + num(top_p));
  if (!(min_p >= 0.0f && min_p <= 1.0f)) return make_error("min_p must be in [0, 1], got " + num(min_p));
  if (!(repetition_penalty > 0.0f) || !std::isfinite(repetition_penalty))
    return make_error("repetition_penalty must be > 0, got " + num(repetition_penalty));
  if (!(presence_penalty >= -2.0f && presence_penalty <= 2.0f))
    return make_error("presence_penalty must be in [-2, 2], got " + num(presence_penalty));
  if (!(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f))
    return make_error("frequency_penalty must be in [-2, 2], got " + num(frequency_penalty));
  for (const auto& [id, v] : logit_bias) {
    if (id < 0) return make_error("logit_bias token id must be >= 0, got " + std::to_string(id));
    if (!(v >= -100.0f && v <= 100.0f))
      return make_error("logit_bias values must be in [-100, 100], got " + num(v) + " for token " + std::to_string(id));
  }
  return {};
}

int32_t argmax(const float* logits, int n) {
  int32_t best = 0;
  float bv = logits[0];
  for (int i = 1; i < n; ++i)
    if (logits[i] > bv) bv = logits[i], best = i;
  return best;
}

Sampler::Sampler(const SamplingParams& params, int vocab_size) : params_(params), vocab_(vocab_size) {
  uint64_t s = params.seed;
  for (auto& r : rng_state_) r = splitmix64(s);
  counts_.assign(vocab_size, 0);
}

// xoshiro256** — fixed algorithm so a seed means the same stream everywhere.
double Sampler::next_uniform() {
  uint64_t* s = rng_state_;
  const uint64_t result = rotl(s[1] * 5, 7) * 9;
  const uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return static_cast<double>(result >> 11) * 0x1.0p-53;
}

void Sampler::apply_penalties(float* logits, std::span<const int32_t> prompt, std::span<const int32_t> output) {
  for (const auto& [id, v] : params_.logit_bias)
    if (id >= 0 && id < vocab_) logits[id] += v;
  const float rep = params_.repetition_penalty;
  if (rep != 1.0f) {
    // Each distinct token once, whether it appears in the prompt or the output (HF semantics).
    touched_.clear();
    auto mark = [&](int32_t id) {
      if (id < 0 || id >= vocab_ || counts_[id] < 0) return;
      counts_[id] = -1;
      touched_.push_back(id);
      float& l = logits[id];
      l = l > 0.0f ? l / rep : l * rep;
    };
    for (int32_t id : prompt) mark(id);
    for (int32_t id : output) mark(id);
    for (int32_t id : touched_) counts_[id] = 0;
  }
  if (params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f) {
    touched_.clear();
    for (int32_t id : output) {
      if (id < 0 || id >= vocab_) continue;
      if (counts_[id]++ == 0) touched_.push_back(id);
    }
    for (int32_t id : touched_) {
      logits[id] -= params_.presence_penalty + params_.frequency_penalty * static_cast<float>(counts_[id]);
      counts_[id] = 0;
    }
  }
}

int32_t Sampler::sample(float* logits, std::span<const int32_t> prompt, std::span<const int32_t> output) {
  apply_penalties(logits, prompt, output);
  return draw(logits);
}

int32_t Sampler::sample(float* logits, std::span<const int32_t> prompt, std::span<const int32_t> output,
                        TokenConstraint& c) {
  apply_penalties(logits, prompt, output);
  const bool truncate = params_.top_k > 0 || params_.top_p < 1.0f || params_.min_p > 0.0f;
  if (params_.greedy() || !truncate) {
    const int32_t t = draw(logits);
    if (c.allows(t)) return t;
  }
  c.mask(logits, vocab_);
  return draw(logits);
}

int32_t Sampler::draw(float* logits) {
  if (params_.greedy()) return argmax(logits, vocab_);

  // Weights w[i] = exp(logit[i] / T - max / T), vectorized and with the same bits on every ISA
  // (backend/cpu/cpu_ops.h), computed once per token; block sums in double for the draw.
  const auto& ops = cpu::ops::ops_for(cpu::active_isa());
  const float inv_t = 1.0f / params_.temperature;
  const float mx = ops.max_value(logits, vocab_) * inv_t;
  // A temperature so small that logit / T overflows (or only -inf logits): the limit is greedy.
  if (!std::isfinite(inv_t) || !std::isfinite(mx)) return argmax(logits, vocab_);
  const int nblk = (vocab_ + cpu::ops::kSampleBlock - 1) / cpu::ops::kSampleBlock;
  w_.resize(vocab_);
  bsum_.resize(nblk);
  ops.exp_weights(logits, vocab_, inv_t, mx, w_.data(), bsum_.data());
  double all = 0;
  for (double b : bsum_) all += b;
  const float* w = w_.data();

  const bool truncate = params_.top_k > 0 || params_.top_p < 1.0f || params_.min_p > 0.0f;
  if (!truncate) {  // plain temperature sampling: inverse CDF in id order, block by block
    double r = next_uniform() * all;
    int j = 0;
    while (j + 1 < nblk && r >= bsum_[j]) r -= bsum_[j++];
    const int b0 = j * cpu::ops::kSampleBlock, b1 = std::min(vocab_, b0 + cpu::ops::kSampleBlock);
    int last = -1;
    for (int i = b0; i < b1; ++i) {
      if (w[i] > 0.0f) last = i;
      r -= static_cast<double>(w[i]);
      if (r < 0) return i;
    }
    // Rounding left r just past this block's sum: its last token with weight.
    return last >= 0 ? last : argmax(logits, vocab_);
  }

  // Candidates by scaled logit, descending; ties by id so the order is total.
  cand_.resize(vocab_);
  for (int i = 0; i < vocab_; ++i) cand_[i] = {logits[i] * inv_t, i};
  auto better = [](const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  const size_t k = params_.top_k > 0 ? std::min<size_t>(params_.top_k, vocab_) : vocab_;
  auto wc = [&](size_t i) { return static_cast<double>(w[cand_[i].second]); };
  double total = 0;  // mass of the top-k set (the whole vocabulary when top-k is off)

  size_t n = k;
  if (k < static_cast<size_t>(vocab_)) {
    std::partial_sort(cand_.begin(), cand_.begin() + k, cand_.end(), better);
    for (size_t i = 0; i < n; ++i) total += wc(i);
  } else {
    // No top-k: sort only a head that holds the top-p mass and every min-p survivor, widening it
    // when it does not (a full sort of the vocabulary per token is the slow part otherwise).
    n = std::min<size_t>(k, 256);
    for (;;) {
      std::partial_sort(cand_.begin(), cand_.begin() + n, cand_.end(), better);
      if (n == k) break;
      double head_mass = 0;
      for (size_t i = 0; i < n; ++i) head_mass += wc(i);
      const bool enough = params_.top_p < 1.0f ? head_mass >= params_.top_p * all : wc(n - 1) < params_.min_p;
      if (enough) break;
      n = std::min(k, n * 8);
    }
    total = all;
  }
  if (params_.top_p < 1.0f) {  // smallest prefix reaching top_p of the (top-k) mass; at least one
    double acc = 0;
    for (size_t i = 0; i < n; ++i) {
      acc += wc(i);
      if (acc >= params_.top_p * total) {
        n = i + 1;
        break;
      }
    }
  }
  if (params_.min_p > 0.0f) {  // drop tokens below min_p times the most likely one (whose weight is 1)
    size_t keep = 1;
    while (keep < n && wc(keep) >= params_.min_p) ++keep;
    n = keep;
  }
  double z = 0;
  for (size_t i = 0; i < n; ++i) z += wc(i);
  double r = next_uniform() * z;
  size_t last = 0;  // the candidate with weight to fall back on when rounding leaves r >= 0
  for (size_t i = 0; i < n; ++i) {
    if (wc(i) > 0) last = i;
    r -= wc(i);
    if (r < 0) return cand_[i].second;
  }
  return cand_[last].second;
}

}  // namespace ss::engine
