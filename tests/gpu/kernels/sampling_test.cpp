// Device sampling against a host reference written from the host sampler's rules
// (backend/cpu/sampler.cpp): greedy, plain temperature, top-k / top-p / min-p and their mix, with and
// without a bitmask, draws from SplitMix64. Device and host exponentials differ in the last bits, so
// a row whose draw (or top-p / min-p cut) lies within 1e-5 of a boundary is not compared; at least
// 90% of the rows must be compared. Log-softmax rows: the chosen logprob and the top-k list.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "backend/sampling.h"
#include "gpu_test_util.h"

namespace ss::cuda::test {
namespace {

using namespace ss::cuda::kern;

constexpr double kMargin = 1e-5;

bool bit(const std::vector<uint32_t>& m, int words, int row, int i) {
  return m.empty() || ((m[static_cast<size_t>(row) * words + i / 32] >> (i % 32)) & 1u);
}

// The reference pick; `clear` false when a decision came within kMargin of its boundary.
int32_t host_sample(const float* logits, int V, const RowSampling& p, const std::vector<uint32_t>& mask, int words, int row,
                    bool& clear) {
  clear = true;
  std::vector<float> l(V);
  for (int i = 0; i < V; ++i) l[i] = bit(mask, words, row, i) ? logits[i] : -INFINITY;
  auto arg = [&]() {
    int b = 0;
    for (int i = 1; i < V; ++i)
      if (l[i] > l[b]) b = i;
    return b;
  };
  if (p.temperature <= 0.0f) return arg();
  const float inv_t = 1.0f / p.temperature;
  const float mx = *std::max_element(l.begin(), l.end()) * inv_t;
  if (!std::isfinite(inv_t) || !std::isfinite(mx)) return arg();
  const double u = ss::backend::sampling_uniform(p.seed, p.counter);
  std::vector<std::pair<float, int32_t>> cand(V);
  for (int i = 0; i < V; ++i) cand[i] = {l[i] * inv_t + 0.0f, i};
  auto w = [&](const std::pair<float, int32_t>& c) { return static_cast<double>(std::exp(c.first - mx)); };
  auto draw = [&](size_t n) {  // inverse CDF over cand[0, n)
    double z = 0;
    for (size_t i = 0; i < n; ++i) z += w(cand[i]);
    const double r = u * z;
    double acc = 0;
    for (size_t i = 0; i < n; ++i) {
      const double before = acc;
      acc += w(cand[i]);
      if (acc > r) {
        if (std::min(r - before, acc - r) < kMargin * z) clear = false;
        return cand[i].second;
      }
    }
    clear = false;
    return cand[n - 1].second;
  };
  const bool truncate = p.top_k > 0 || p.top_p < 1.0f || p.min_p > 0.0f;
  if (!truncate) return draw(V);
  std::stable_sort(cand.begin(), cand.end(), [](auto& a, auto& b) { return a.first > b.first; });
  const size_t k = p.top_k > 0 ? std::min(p.top_k, V) : V;
  double total = 0;
  for (size_t i = 0; i < k; ++i) total += w(cand[i]);
  size_t n = k;
  if (p.top_p < 1.0f) {
    const double target = static_cast<double>(p.top_p) * total;
    double acc = 0;
    for (size_t i = 0; i < k; ++i) {
      acc += w(cand[i]);
      if (acc >= target) {
        if (acc - target < kMargin * total || target - (acc - w(cand[i])) < kMargin * total) clear = false;
        n = i + 1;
        break;
      }
    }
  }
  if (p.min_p > 0.0f) {
    size_t keep = 1;
    while (keep < n && w(cand[keep]) >= p.min_p) ++keep;
    for (size_t i = 0; i < n; ++i)
      if (std::abs(w(cand[i]) - p.min_p) < kMargin * p.min_p) clear = false;
    n = keep;
  }
  return draw(n);
}

// (The device and the host share one sampling_uniform, backend/sampling_rng.h, whose values
// tests/unit/backend/step_batch_test.cpp checks against SplitMix64's published outputs.)

// The T = 1e-30 rows once failed here (id 0): the draw kernel's logit/T - max/T was contracted into an
// fma, so the max's own weight was exp(+-1e23) instead of 1 (sampling.cu, w_id).
TEST(GpuSampling, DrawsMatchTheHostReference) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(31);
  const RowSampling presets[] = {
      {0.0f, 0, 1.0f, 0.0f, 0, 0},       {0.8f, 0, 1.0f, 0.0f, 0, 0},     {1.0f, 40, 1.0f, 0.0f, 0, 0},
      {0.7f, 0, 0.9f, 0.0f, 0, 0},       {1.2f, 0, 1.0f, 0.05f, 0, 0},    {0.9f, 100, 0.8f, 0.01f, 0, 0},
      {1.0f, 1, 1.0f, 0.0f, 0, 0},       {1e-30f, 0, 1.0f, 0.0f, 0, 0},   {1.5f, 0, 0.5f, 0.0f, 0, 0},
  };
  int compared = 0, rows_total = 0;
  for (int V : {1000, 32000}) {
    for (int trial = 0; trial < 4; ++trial) {
      const int n = 17, words = (V + 31) / 32;
      std::normal_distribution<float> nd(0.0f, 2.5f);
      std::vector<float> logits(static_cast<size_t>(n) * V);
      for (auto& x : logits) x = nd(rng);
      logits[5] = logits[6];  // a tie
      std::vector<uint32_t> mask(static_cast<size_t>(n) * words);
      std::uniform_int_distribution<uint32_t> bits;
      for (auto& m : mask) m = bits(rng) | bits(rng);  // ~75% allowed
      std::vector<RowSampling> params(n);
      for (int r = 0; r < n; ++r) {
        params[r] = presets[(r + trial) % 9];
        params[r].seed = 1000 + trial;
        params[r].counter = static_cast<uint64_t>(r) * 2 + trial;
      }
      const bool with_mask = trial % 2 == 1;
      DeviceBuf<float> dl(logits);
      DeviceBuf<uint32_t> dm(mask);
      DeviceBuf<int32_t> dids(n);
      DeviceBuf<RowSampling> dp(params);
      const size_t sb = sample_scratch_bytes(n, V);
      DeviceBuf<uint8_t> scratch(sb);
      dids.poison();
      scratch.poison();
      LAUNCH_OK(sample(dl.get(), n, V, dp.get(), with_mask ? dm.get() : nullptr, words, scratch.get(), sb, dids.get(), nullptr));
      const auto ids = dids.download();
      for (int r = 0; r < n; ++r) {
        bool clear = true;
        const int32_t ref = host_sample(logits.data() + static_cast<size_t>(r) * V, V, params[r],
                                        with_mask ? mask : std::vector<uint32_t>{}, words, r, clear);
        ++rows_total;
        ASSERT_GE(ids[r], 0);
        ASSERT_LT(ids[r], V);
        if (with_mask) {
          ASSERT_TRUE(bit(mask, words, r, ids[r])) << "a masked token was drawn, row " << r;
        }
        if (!clear) continue;
        ++compared;
        EXPECT_EQ(ids[r], ref) << "V=" << V << " trial " << trial << " row " << r << " T=" << params[r].temperature
                               << " top_k=" << params[r].top_k << " top_p=" << params[r].top_p << " min_p=" << params[r].min_p;
      }
    }
  }
  EXPECT_GE(compared * 10, rows_total * 9) << compared << " of " << rows_total << " rows away from a boundary";
}

TEST(GpuSampling, LogprobsMatchHostLogSoftmax) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(32);
  for (int V : {7, 1000, 128256}) {
    const int n = 3, words = (V + 31) / 32, k = std::min(V - 1, 20);  // row 1 bans one token: k finite values
    auto logits = random_f32(rng, static_cast<size_t>(n) * V, -8, 8);
    if (V > 10) logits[3] = logits[9] = 9.0f;  // tie at the top of row 0: id 3 first
    std::vector<uint32_t> mask(static_cast<size_t>(n) * words, 0xffffffffu);
    mask[words] &= ~1u;  // row 1: token 0 banned
    std::vector<int32_t> chosen(n);
    for (int r = 0; r < n; ++r) chosen[r] = (r * 5 + 3) % V;  // never row 1's banned token 0
    DeviceBuf<float> dl(logits), dclp(n), dtlp(static_cast<size_t>(n) * k);
    DeviceBuf<uint32_t> dm(mask);
    DeviceBuf<int32_t> dch(chosen), dtid(static_cast<size_t>(n) * k);
    dclp.poison(), dtlp.poison(), dtid.poison();
    LAUNCH_OK(logprobs(dl.get(), n, V, dm.get(), words, dch.get(), k, dclp.get(), dtid.get(), dtlp.get(), nullptr));
    const auto clp = dclp.download();
    const auto tid = dtid.download();
    const auto tlp = dtlp.download();
    for (int r = 0; r < n; ++r) {
      std::vector<std::pair<float, int>> v(V);
      double mx = -INFINITY;
      for (int i = 0; i < V; ++i) {
        v[i] = {bit(mask, words, r, i) ? logits[static_cast<size_t>(r) * V + i] : -INFINITY, i};
        mx = std::max(mx, static_cast<double>(v[i].first));
      }
      double z = 0;
      for (auto& [x, i] : v) z += std::exp(x - mx);
      const double lse = mx + std::log(z);
      EXPECT_NEAR(clp[r], v[chosen[r]].first - lse, 1e-4) << "row " << r;
      std::stable_sort(v.begin(), v.end(), [](auto& a, auto& b) { return a.first > b.first; });
      for (int j = 0; j < k; ++j) {
        EXPECT_EQ(tid[static_cast<size_t>(r) * k + j], v[j].second) << "V=" << V << " row " << r << " rank " << j;
        EXPECT_NEAR(tlp[static_cast<size_t>(r) * k + j], v[j].first - lse, 1e-4) << "row " << r << " rank " << j;
      }
    }
  }
}

TEST(GpuSampling, RejectsShortScratchAndMasks) {
  EXPECT_FALSE(sample(nullptr, 1, 100, nullptr, nullptr, 0, nullptr, 0, nullptr, nullptr).ok());
  EXPECT_FALSE(sample(nullptr, 1, 100, nullptr, reinterpret_cast<const uint32_t*>(16), 3, nullptr, 1 << 20, nullptr, nullptr).ok());
  EXPECT_FALSE(logprobs(nullptr, 1, 100, nullptr, 0, nullptr, 65, nullptr, nullptr, nullptr, nullptr).ok());
}

}  // namespace
}  // namespace ss::cuda::test
