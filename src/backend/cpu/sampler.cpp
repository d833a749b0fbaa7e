// The host reference sampler (backend/sampling.h): logit bias and penalties, then greedy or
// temperature / top-k / top-p / min-p, drawn with the counter-based RNG; and the log-softmax rows
// behind logprobs. Lives in cpu/ because its exp weights are the CPU ops' (the same bits on every ISA).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <string>

#include "backend/backend.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/kernels.h"

namespace ss::backend {

struct RowSampler::Impl {
  int vocab;
  // Reused every call: no allocation per token after the first.
  std::vector<int32_t> counts;  // zero between calls
  std::vector<int32_t> touched;
  std::vector<std::pair<float, int32_t>> cand;
  std::vector<float> w;      // exp(logit / T - max / T) per token
  std::vector<double> bsum;  // w summed per cpu::ops::kSampleBlock tokens

  void apply_penalties(float* logits, const SamplingParams& p, std::span<const int32_t> prompt,
                       std::span<const int32_t> output);
  int32_t draw(float* logits, const SamplingParams& p, double u);
};

RowSampler::RowSampler(int vocab_size) : impl_(std::make_unique<Impl>()) {
  impl_->vocab = vocab_size;
  impl_->counts.assign(static_cast<size_t>(vocab_size), 0);
}
RowSampler::~RowSampler() = default;
RowSampler::RowSampler(RowSampler&&) noexcept = default;
RowSampler& RowSampler::operator=(RowSampler&&) noexcept = default;

int32_t argmax(const float* logits, int n) {
  int32_t best = 0;
  float bv = logits[0];
  for (int i = 1; i < n; ++i)
    if (logits[i] > bv) bv = logits[i], best = i;
  return best;
}

void RowSampler::Impl::apply_penalties(float* logits, const SamplingParams& p, std::span<const int32_t> prompt,
                                       std::span<const int32_t> output) {
  for (const auto& [id, v] : p.logit_bias)
    if (id >= 0 && id < vocab) logits[id] += v;
  const float rep = p.repetition_penalty;
  if (rep != 1.0f) {
    // Each distinct token once, whether it appears in the prompt or the output (HF semantics).
    touched.clear();
    auto mark = [&](int32_t id) {
      if (id < 0 || id >= vocab || counts[id] < 0) return;
      counts[id] = -1;
      touched.push_back(id);
      float& l = logits[id];
      l = l > 0.0f ? l / rep : l * rep;
    };
    for (int32_t id : prompt) mark(id);
    for (int32_t id : output) mark(id);
    for (int32_t id : touched) counts[id] = 0;
  }
  if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) {
    touched.clear();
    for (int32_t id : output) {
      if (id < 0 || id >= vocab) continue;
      if (counts[id]++ == 0) touched.push_back(id);
    }
    for (int32_t id : touched) {
      logits[id] -= p.presence_penalty + p.frequency_penalty * static_cast<float>(counts[id]);
      counts[id] = 0;
    }
  }
}

int32_t RowSampler::sample(float* logits, const SamplingParams& p, uint64_t n, std::span<const int32_t> prompt,
                           std::span<const int32_t> output, TokenMask* mask, bool mask_first) {
  Impl& s = *impl_;
  if (mask && mask_first) mask->mask(logits, s.vocab);
  s.apply_penalties(logits, p, prompt, output);
  if (!mask || mask_first) return s.draw(logits, p, sampling_uniform(p.seed, 2 * n));
  const bool truncate = p.top_k > 0 || p.top_p < 1.0f || p.min_p > 0.0f;
  if (truncate && !p.greedy()) {  // the truncation must see the masked distribution: one draw
    mask->mask(logits, s.vocab);
    return s.draw(logits, p, sampling_uniform(p.seed, 2 * n));
  }
  const int32_t t = s.draw(logits, p, sampling_uniform(p.seed, 2 * n));
  if (mask->allows(t)) return t;
  mask->mask(logits, s.vocab);  // refused: redrawn from the masked distribution
  return s.draw(logits, p, sampling_uniform(p.seed, 2 * n + 1));
}

int32_t RowSampler::Impl::draw(float* logits, const SamplingParams& p, double u) {
  if (p.greedy()) return argmax(logits, vocab);

  // Weights w[i] = exp(logit[i] / T - max / T), vectorized and with the same bits on every ISA
  // (backend/cpu/cpu_ops.h), computed once per token; block sums in double for the draw.
  const auto& ops = cpu::ops::ops_for(cpu::active_isa());
  const float inv_t = 1.0f / p.temperature;
  const float mx = ops.max_value(logits, vocab) * inv_t;
  // A temperature so small that logit / T overflows (or only -inf logits): the limit is greedy.
  if (!std::isfinite(inv_t) || !std::isfinite(mx)) return argmax(logits, vocab);
  const int nblk = (vocab + cpu::ops::kSampleBlock - 1) / cpu::ops::kSampleBlock;
  w.resize(vocab);
  bsum.resize(nblk);
  ops.exp_weights(logits, vocab, inv_t, mx, w.data(), bsum.data());
  double all = 0;
  for (double b : bsum) all += b;
  const float* wp = w.data();

  const bool truncate = p.top_k > 0 || p.top_p < 1.0f || p.min_p > 0.0f;
  if (!truncate) {  // plain temperature sampling: inverse CDF in id order, block by block
    double r = u * all;
    int j = 0;
    while (j + 1 < nblk && r >= bsum[j]) r -= bsum[j++];
    const int b0 = j * cpu::ops::kSampleBlock, b1 = std::min(vocab, b0 + cpu::ops::kSampleBlock);
    int last = -1;
    for (int i = b0; i < b1; ++i) {
      if (wp[i] > 0.0f) last = i;
      r -= static_cast<double>(wp[i]);
      if (r < 0) return i;
    }
    // Rounding left r just past this block's sum: its last token with weight.
    return last >= 0 ? last : argmax(logits, vocab);
  }

  // Candidates by scaled logit, descending; ties by id so the order is total.
  cand.resize(vocab);
  for (int i = 0; i < vocab; ++i) cand[i] = {logits[i] * inv_t, i};
  auto better = [](const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  const size_t k = p.top_k > 0 ? std::min<size_t>(p.top_k, vocab) : vocab;
  auto wc = [&](size_t i) { return static_cast<double>(wp[cand[i].second]); };
  double total = 0;  // mass of the top-k set (the whole vocabulary when top-k is off)

  size_t n = k;
  if (k < static_cast<size_t>(vocab)) {
    std::partial_sort(cand.begin(), cand.begin() + k, cand.end(), better);
    for (size_t i = 0; i < n; ++i) total += wc(i);
  } else {
    // No top-k: sort only a head that holds the top-p mass and every min-p survivor, widening it
    // when it does not (a full sort of the vocabulary per token is the slow part otherwise).
    n = std::min<size_t>(k, 256);
    for (;;) {
      std::partial_sort(cand.begin(), cand.begin() + n, cand.end(), better);
      if (n == k) break;
      double head_mass = 0;
      for (size_t i = 0; i < n; ++i) head_mass += wc(i);
      const bool enough = p.top_p < 1.0f ? head_mass >= p.top_p * all : wc(n - 1) < p.min_p;
      if (enough) break;
      n = std::min(k, n * 8);
    }
    total = all;
  }
  if (p.top_p < 1.0f) {  // smallest prefix reaching top_p of the (top-k) mass; at least one
    double acc = 0;
    for (size_t i = 0; i < n; ++i) {
      acc += wc(i);
      if (acc >= p.top_p * total) {
        n = i + 1;
        break;
      }
    }
  }
  if (p.min_p > 0.0f) {  // drop tokens below min_p times the most likely one (whose weight is 1)
    size_t keep = 1;
    while (keep < n && wc(keep) >= p.min_p) ++keep;
    n = keep;
  }
  double z = 0;
  for (size_t i = 0; i < n; ++i) z += wc(i);
  double r = u * z;
  size_t last = 0;  // the candidate with weight to fall back on when rounding leaves r >= 0
  for (size_t i = 0; i < n; ++i) {
    if (wc(i) > 0) last = i;
    r -= wc(i);
    if (r < 0) return cand[i].second;
  }
  return cand[last].second;
}

// Log-softmax of one row: the chosen token's value and the k most likely tokens (ties by lower id,
// the same order argmax uses). The exponentials are the sampler's vectorized ones (same bits on
// every ISA), summed per block in double: a scalar double exp per vocabulary entry made scoring a
// prompt (echo + logprobs, one row per position) 1.7x slower than its prefill.
void row_logprobs(const float* logits, int vocab, int32_t chosen, int k, RowLogprobs& out) {
  const auto& ops = cpu::ops::ops_for(cpu::active_isa());
  thread_local std::vector<float> w;
  thread_local std::vector<double> block_sums;
  w.resize(static_cast<size_t>(vocab));
  block_sums.resize(static_cast<size_t>((vocab + cpu::ops::kSampleBlock - 1) / cpu::ops::kSampleBlock));
  const float mx = ops.max_value(logits, vocab);
  ops.exp_weights(logits, vocab, 1.0f, mx, w.data(), block_sums.data());
  double z = 0;
  for (double b : block_sums) z += b;
  const double lse = static_cast<double>(mx) + std::log(z);
  out.chosen = static_cast<float>(logits[chosen] - lse);
  auto& top = out.top;
  top.clear();
  k = std::min(k, vocab);
  if (k <= 0) return;
  // Insertion into a short sorted list: one pass, O(vocab) when k is small.
  auto before = [](float a, int32_t ia, float b, int32_t ib) { return a > b || (a == b && ia < ib); };
  for (int i = 0; i < vocab; ++i) {
    const float v = logits[i];
    if (static_cast<int>(top.size()) == k && !before(v, i, top.back().second, top.back().first)) continue;
    if (static_cast<int>(top.size()) == k) top.pop_back();
    auto it = top.end();
    while (it != top.begin() && before(v, i, (it - 1)->second, (it - 1)->first)) --it;
    top.insert(it, {i, v});
  }
  for (auto& [id, v] : top) v = static_cast<float>(v - lse);
}

void sample_on_host(const StepBatch& b, float* logits, int vocab, std::vector<RowSampler>& samplers, ThreadPool* pool,
                    StepOutput& out) {
  const int ns = static_cast<int>(b.sample_rows.size()), nr = ns + static_cast<int>(b.score_rows.size());
  out.tokens.resize(static_cast<size_t>(ns));
  out.logprobs.resize(static_cast<size_t>(ns));
  out.scores.resize(b.score_rows.size());
  auto one = [&](int i, int thread) {
    float* row = logits + static_cast<size_t>(i) * vocab;
    if (i >= ns) {  // a prompt position: the raw logits, before anything edits them
      const ScoreRow& sr = b.score_rows[static_cast<size_t>(i - ns)];
      row_logprobs(row, vocab, sr.target, sr.top_k, out.scores[static_cast<size_t>(i - ns)]);
      return;
    }
    const SampleRow& r = b.sample_rows[static_cast<size_t>(i)];
    for (int32_t id : r.banned) row[id] = -std::numeric_limits<float>::infinity();
    // With logprobs the row is masked first, so the reported distribution is the one drawn from.
    const bool lp = r.logprobs >= 0;
    const int32_t t = samplers[static_cast<size_t>(thread)].sample(row, *r.params, r.n, r.prompt, r.output, r.mask, lp);
    out.tokens[static_cast<size_t>(i)] = t;
    if (lp) row_logprobs(row, vocab, t, r.logprobs, out.logprobs[static_cast<size_t>(i)]);  // biased, penalized
    else out.logprobs[static_cast<size_t>(i)].top.clear();
  };
  if (!pool || nr <= 1 || pool->size() == 1) {
    for (int i = 0; i < nr; ++i) one(i, 0);
    return;
  }
  // Rows pulled from a shared counter: sampling costs differ per request (top-p sorts, logprobs).
  std::atomic<int> next{0};
  pool->run([&](int t) {
    for (int i; (i = next.fetch_add(1, std::memory_order_relaxed)) < nr;) one(i, t);
  });
}

}  // namespace ss::backend
