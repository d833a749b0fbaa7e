// Sampler properties: greedy is argmax, seeds reproduce, truncations never pick excluded tokens,
// the empirical distribution matches softmax, penalties follow their published formulas.
#include "backend/backend.h"
#include "backend/cpu/kernels.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <algorithm>
#include <numeric>
#include <random>
#include <set>
#include <vector>

using ss::backend::Sampler;
using ss::backend::SamplingParams;

namespace {
std::vector<float> random_logits(int n, uint32_t seed, float scale = 3.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}
std::vector<double> softmax(const std::vector<float>& l, double t) {
  double mx = *std::max_element(l.begin(), l.end()), z = 0;
  std::vector<double> p(l.size());
  for (size_t i = 0; i < l.size(); ++i) z += p[i] = std::exp((l[i] - mx) / t);
  for (auto& x : p) x /= z;
  return p;
}
int32_t draw(Sampler& s, std::vector<float> logits) { return s.sample(logits.data(), {}, {}); }
// How often each token is drawn in `draws` samples at temperature t.
std::vector<int> histogram(const std::vector<float>& l, float t, uint64_t seed, int draws) {
  SamplingParams p;
  p.temperature = t;
  p.seed = seed;
  Sampler s(p, static_cast<int>(l.size()));
  std::vector<int> hist(l.size());
  for (int i = 0; i < draws; ++i) hist[draw(s, l)]++;
  return hist;
}
}  // namespace

TEST(Sampler, GreedyIsArgmax) {
  for (uint32_t seed = 0; seed < 20; ++seed) {
    auto l = random_logits(1000, seed);
    SamplingParams p;
    p.temperature = 0.0f;
    Sampler s(p, 1000);
    EXPECT_EQ(draw(s, l), std::max_element(l.begin(), l.end()) - l.begin());
  }
}

TEST(Sampler, TopKOneIsGreedy) {
  auto l = random_logits(5000, 7);
  SamplingParams p;
  p.top_k = 1;
  p.temperature = 1.5f;
  Sampler s(p, 5000);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(draw(s, l), std::max_element(l.begin(), l.end()) - l.begin());
}

TEST(Sampler, SameSeedSameSequenceDifferentSeedDiffers) {
  auto l = random_logits(2000, 3, 1.0f);
  auto run = [&](uint64_t seed) {
    SamplingParams p;
    p.seed = seed;
    p.top_p = 0.9f;
    Sampler s(p, 2000);
    std::vector<int32_t> out;
    for (int i = 0; i < 64; ++i) out.push_back(draw(s, l));
    return out;
  };
  EXPECT_EQ(run(42), run(42));
  EXPECT_NE(run(42), run(43));
}

TEST(Sampler, EmpiricalDistributionMatchesSoftmax) {
  const int n = 8;
  std::vector<float> l = {1.0f, 0.5f, -0.3f, 2.0f, 0.0f, -1.0f, 1.2f, 0.7f};
  for (float temp : {0.7f, 1.0f, 2.0f}) {
    const int draws = 200000;
    const std::vector<int> hist = histogram(l, temp, 99, draws);
    auto q = softmax(l, temp);
    for (int i = 0; i < n; ++i) {
      const double sd = std::sqrt(q[i] * (1 - q[i]) / draws);
      EXPECT_NEAR(hist[i] / double(draws), q[i], 5 * sd) << "token " << i << " temperature " << temp;
    }
  }
}

// A vocabulary of many sampling blocks (the draw walks block sums, then one block): per-token and
// per-block frequencies against softmax, at temperatures that spread or concentrate the mass.
TEST(Sampler, EmpiricalDistributionOverManyBlocks) {
  const int n = 1000;  // 16 blocks of 64, the last one short
  auto l = random_logits(n, 5, 1.0f);
  for (float temp : {0.5f, 1.0f, 3.0f}) {
    const int draws = 200000;
    const std::vector<int> hist = histogram(l, temp, 7, draws);
    auto q = softmax(l, temp);
    for (int i = 0; i < n; ++i) {
      const double sd = std::sqrt(q[i] * (1 - q[i]) / draws) + 1.0 / draws;
      ASSERT_NEAR(hist[i] / double(draws), q[i], 6 * sd) << "token " << i << " temperature " << temp;
    }
    for (int b = 0; b < n; b += 64) {
      double qb = 0, hb = 0;
      for (int i = b; i < std::min(n, b + 64); ++i) qb += q[i], hb += hist[i];
      EXPECT_NEAR(hb / draws, qb, 5 * std::sqrt(qb * (1 - qb) / draws) + 1e-9) << "block " << b / 64;
    }
  }
}

// Whole blocks of -inf (masked tokens), including the short last block, are never drawn and do not
// disturb the draw among the others; a temperature so small that logit / T overflows is greedy.
TEST(Sampler, MaskedBlocksAndTinyTemperature) {
  const int n = 1000;
  auto l = random_logits(n, 9, 1.0f);
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int i = 0; i < 128; ++i) l[i] = ninf;           // blocks 0 and 1
  for (int i = 320; i < 384; ++i) l[i] = ninf;         // block 5
  for (int i = 960; i < n; ++i) l[i] = ninf;           // the short last block
  const int draws = 100000;
  const std::vector<int> hist = histogram(l, 1.0f, 4, draws);
  auto q = softmax(l, 1.0);
  for (int i = 0; i < n; ++i) {
    if (q[i] == 0.0) {
      ASSERT_EQ(hist[i], 0) << "masked token " << i << " drawn";
      continue;
    }
    ASSERT_NEAR(hist[i] / double(draws), q[i], 6 * std::sqrt(q[i] * (1 - q[i]) / draws) + 1.0 / draws) << i;
  }
  for (float t : {1e-30f, 1e-40f}) {  // 1e-40 is a denormal: 1 / T is +inf
    SamplingParams g;
    g.temperature = t;
    g.seed = 1;
    for (float top_p : {1.0f, 0.5f}) {
      g.top_p = top_p;
      Sampler tiny(g, n);
      for (int i = 0; i < 50; ++i) ASSERT_EQ(draw(tiny, l), ss::backend::argmax(l.data(), n)) << "T=" << t;
    }
  }
  std::vector<float> all_masked(n, ninf);  // nothing to prefer: the lowest id, like argmax
  Sampler s2(SamplingParams{}, n);
  EXPECT_EQ(draw(s2, all_masked), 0);
}

// "Every machine": the weights' exp has the same bits on every ISA, so a seed gives the same tokens
// whichever kernels the CPU runs (truncated and plain sampling).
TEST(Sampler, SameTokensOnEveryIsa) {
  auto l = random_logits(5000, 11, 2.0f);
  auto run = [&](const SamplingParams& p) {
    Sampler s(p, 5000);
    std::vector<int32_t> out;
    for (int i = 0; i < 300; ++i) out.push_back(draw(s, l));
    return out;
  };
  for (float top_p : {1.0f, 0.9f}) {
    SamplingParams p;
    p.temperature = 0.8f;
    p.top_p = top_p;
    p.seed = 3;
    std::vector<std::vector<int32_t>> per_isa;
    for (ss::cpu::Isa isa : {ss::cpu::Isa::Scalar, ss::cpu::Isa::Avx2, ss::cpu::Isa::Avx512}) {
      if (isa > ss::cpu::detected_isa()) continue;
      ss::cpu::force_isa(isa);
      per_isa.push_back(run(p));
    }
    ss::cpu::clear_forced_isa();
    for (size_t i = 1; i < per_isa.size(); ++i) EXPECT_EQ(per_isa[i], per_isa[0]) << "top_p " << top_p << " isa #" << i;
  }
}

TEST(Sampler, TopPNeverPicksOutsideNucleus) {
  const int n = 3000;  // wider than the sorted head, so the widening path runs too
  for (float top_p : {0.1f, 0.5f, 0.9f, 0.999f}) {
    auto l = random_logits(n, 11, 1.0f);
    auto q = softmax(l, 1.0);
    std::vector<int> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int a, int b) { return q[a] > q[b]; });
    std::set<int> nucleus;
    double acc = 0;
    for (int id : order) {
      nucleus.insert(id);
      acc += q[id];
      if (acc >= top_p) break;
    }
    SamplingParams p;
    p.top_p = top_p;
    p.seed = 5;
    Sampler s(p, n);
    std::set<int> seen;
    for (int i = 0; i < 300; ++i) {
      const int id = draw(s, l);
      ASSERT_TRUE(nucleus.count(id)) << "top_p " << top_p << " picked " << id;
      seen.insert(id);
    }
    if (nucleus.size() > 1) {
      EXPECT_GT(seen.size(), 1u);
    }
  }
}

TEST(Sampler, MinPAndTopKBounds) {
  const int n = 4000;
  auto l = random_logits(n, 21, 2.0f);
  auto q = softmax(l, 1.0);
  const double pmax = *std::max_element(q.begin(), q.end());
  SamplingParams p;
  p.min_p = 0.2f;
  Sampler s(p, n);
  for (int i = 0; i < 2000; ++i) ASSERT_GE(q[draw(s, l)], 0.2 * pmax * (1 - 1e-9));

  SamplingParams pk;
  pk.top_k = 5;
  Sampler sk(pk, n);
  std::vector<float> sorted(l);
  std::sort(sorted.rbegin(), sorted.rend());
  for (int i = 0; i < 2000; ++i) ASSERT_GE(l[draw(sk, l)], sorted[4]);
}

TEST(Sampler, Penalties) {
  std::vector<float> l = {2.0f, -2.0f, 1.0f, 0.5f};
  SamplingParams p;
  p.temperature = 0.0f;
  p.repetition_penalty = 2.0f;
  Sampler s(p, 4);
  std::vector<float> a = l;
  const std::vector<int32_t> prompt = {0, 1, 1};
  s.sample(a.data(), prompt, {});
  EXPECT_FLOAT_EQ(a[0], 1.0f);   // positive logits are divided
  EXPECT_FLOAT_EQ(a[1], -4.0f);  // negative logits are multiplied, once per distinct token
  EXPECT_FLOAT_EQ(a[2], 1.0f);

  SamplingParams q;
  q.temperature = 0.0f;
  q.presence_penalty = 0.5f;
  q.frequency_penalty = 0.25f;
  Sampler s2(q, 4);
  std::vector<float> b = l;
  const std::vector<int32_t> out = {2, 2, 3};
  s2.sample(b.data(), prompt, out);  // prompt tokens are not penalised by presence/frequency
  EXPECT_FLOAT_EQ(b[0], 2.0f);
  EXPECT_FLOAT_EQ(b[2], 1.0f - 0.5f - 0.5f);
  EXPECT_FLOAT_EQ(b[3], 0.5f - 0.5f - 0.25f);
}

// logit_bias: added to the logit before the penalties (vLLM's and llama.cpp's order); ±100 forces or
// bans a token; with temperature the draws follow softmax(logits + bias).
TEST(Sampler, LogitBias) {
  auto l = random_logits(3000, 11);
  const int32_t top = static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
  const int32_t low = static_cast<int32_t>(std::min_element(l.begin(), l.end()) - l.begin());
  SamplingParams g;
  g.temperature = 0.0f;
  g.logit_bias = {{low, 100.0f}};
  Sampler forced(g, 3000);
  EXPECT_EQ(draw(forced, l), low);
  g.logit_bias = {{top, -100.0f}};
  Sampler banned(g, 3000);
  std::vector<float> rest = l;
  rest[top] = -std::numeric_limits<float>::infinity();
  EXPECT_EQ(draw(banned, l), std::max_element(rest.begin(), rest.end()) - rest.begin());

  // Bias first, then the repetition penalty divides the biased (positive) logit.
  std::vector<float> a = {1.0f, -1.0f, 0.5f};
  SamplingParams r;
  r.temperature = 0.0f;
  r.repetition_penalty = 2.0f;
  r.logit_bias = {{1, 3.0f}, {2, -0.25f}};
  Sampler s(r, 3);
  const std::vector<int32_t> prompt = {1};
  s.sample(a.data(), prompt, {});
  EXPECT_FLOAT_EQ(a[0], 1.0f);
  EXPECT_FLOAT_EQ(a[1], 1.0f);   // (-1 + 3) / 2
  EXPECT_FLOAT_EQ(a[2], 0.25f);  // 0.5 - 0.25, not in the prompt

  // Empirical distribution against softmax of the biased logits (chi-square over 8 tokens).
  const std::vector<float> base = {0.3f, -0.2f, 1.1f, 0.0f, -1.0f, 0.7f, 0.2f, -0.4f};
  const std::vector<std::pair<int32_t, float>> bias = {{0, 1.5f}, {2, -2.0f}, {4, 2.5f}};
  std::vector<float> biased = base;
  for (auto [id, v] : bias) biased[id] += v;
  const auto want = softmax(biased, 0.8);
  SamplingParams t;
  t.temperature = 0.8f;
  t.seed = 5;
  t.logit_bias = bias;
  Sampler st(t, 8);
  const int draws = 40000;
  std::vector<int> hist(8);
  for (int i = 0; i < draws; ++i) hist[draw(st, base)]++;
  double chi2 = 0;
  for (int i = 0; i < 8; ++i) {
    const double e = want[i] * draws;
    chi2 += (hist[i] - e) * (hist[i] - e) / e;
  }
  EXPECT_LT(chi2, 24.3);  // 7 degrees of freedom, p = 0.001
}

TEST(Sampler, ValidateRejectsOutOfRange) {
  SamplingParams p;
  p.top_p = 1.5f;
  EXPECT_FALSE(p.validate().ok());
  p = {};
  p.temperature = -1.0f;
  EXPECT_FALSE(p.validate().ok());
  p = {};
  p.top_k = -3;
  EXPECT_FALSE(p.validate().ok());
  p = {};
  p.min_p = NAN;
  EXPECT_FALSE(p.validate().ok());
  p = {};
  p.logit_bias = {{3, 100.5f}};
  EXPECT_FALSE(p.validate().ok());
  p.logit_bias = {{3, NAN}};
  EXPECT_FALSE(p.validate().ok());
  p.logit_bias = {{-1, 1.0f}};
  EXPECT_FALSE(p.validate().ok());
  p.logit_bias = {{3, -100.0f}, {4, 100.0f}};
  EXPECT_TRUE(p.validate().ok());
  p = {};
  EXPECT_TRUE(p.validate().ok());
}

// Structured outputs' sampling: a constraint that allows a fixed set of tokens.
namespace {
class SetConstraint final : public ss::backend::TokenMask {
 public:
  explicit SetConstraint(std::set<int32_t> ok) : ok_(std::move(ok)) {}
  bool allows(int32_t t) override {
    ++asked;
    return ok_.count(t) > 0;
  }
  void mask(float* logits, int) override {
    ++masks;
    for (int i = 0; i < n; ++i)
      if (!ok_.count(i)) logits[i] = -std::numeric_limits<float>::infinity();
  }
  void accept(int32_t) override {}
  bool must_end() const override { return false; }
  int n = 0, asked = 0, masks = 0;

 private:
  std::set<int32_t> ok_;
};
}  // namespace

TEST(Sampler, ConstrainedTemperatureSamplingIsTheMaskedDistribution) {
  // Drawing from the whole vocabulary and redrawing from the masked one when refused must give
  // exactly softmax restricted to the allowed set: p(t) / p(allowed).
  const std::vector<float> l = random_logits(64, 5, 1.5f);
  const std::set<int32_t> ok = {1, 3, 4, 10, 17, 30, 31, 50, 63};
  for (float temp : {0.8f, 1.0f}) {
    SamplingParams p;
    p.temperature = temp;
    p.seed = 1234;
    Sampler s(p, 64);
    SetConstraint c(ok);
    c.n = 64;
    const int draws = 100000;
    std::vector<int> hist(64);
    for (int i = 0; i < draws; ++i) {
      std::vector<float> row = l;
      hist[s.sample(row.data(), {}, {}, c)]++;
    }
    const auto q = softmax(l, temp);
    double allowed = 0;
    for (int32_t t : ok) allowed += q[t];
    EXPECT_LT(allowed, 0.6) << "most first draws must be refused for the test to mean something";
    EXPECT_GT(c.masks, draws / 3);
    EXPECT_LT(c.masks, draws);
    for (int i = 0; i < 64; ++i) {
      const double want = ok.count(i) ? q[i] / allowed : 0.0;
      const double sd = std::sqrt(std::max(want * (1 - want), 1e-12) / draws);
      EXPECT_NEAR(hist[i] / double(draws), want, 5 * sd + 1e-12) << "token " << i << " temperature " << temp;
    }
  }
}

TEST(Sampler, ConstrainedGreedyAndTruncatedSamplingEqualMaskingFirst) {
  for (uint32_t seed = 0; seed < 200; ++seed) {
    const std::vector<float> l = random_logits(300, seed);
    std::mt19937 g(seed);
    std::set<int32_t> ok;
    for (int k = 0; k < 1 + static_cast<int>(g() % 40); ++k) ok.insert(static_cast<int32_t>(g() % 300));
    for (int mode = 0; mode < 4; ++mode) {
      SamplingParams p;
      p.seed = seed;
      p.temperature = mode == 0 ? 0.0f : 0.9f;
      if (mode == 1) p.top_p = 0.8f;
      if (mode == 2) p.top_k = 5;
      if (mode == 3) p.min_p = 0.1f;
      Sampler a(p, 300), b(p, 300);
      SetConstraint ca(ok), cb(ok);
      ca.n = cb.n = 300;
      for (int step = 0; step < 5; ++step) {
        std::vector<float> ra = l, rb = l;
        const int32_t ta = a.sample(ra.data(), {}, {}, ca);
        cb.mask(rb.data(), 300);
        const int32_t tb = b.sample(rb.data(), {}, {});
        ASSERT_EQ(ta, tb) << "seed " << seed << " mode " << mode << " step " << step;
        ASSERT_TRUE(ok.count(ta));
      }
    }
  }
}
