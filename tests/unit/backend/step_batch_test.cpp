// What every backend shares: the counter-based RNG, block tables kept per slot and edited by each
// batch, and the bitmask form of a token mask.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <set>
#include <vector>

#include "backend/backend.h"

namespace {
using namespace ss::backend;

// SplitMix64 seeded with 0 (Vigna's reference implementation, splitmix64.c) outputs these first.
TEST(SamplingRng, IsSplitMix64AtTheCounter) {
  const uint64_t published[3] = {0xe220a8397b1dcdafull, 0x6e789e6aa1b965f4ull, 0x06c45d188009454full};
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(sampling_uniform(0, static_cast<uint64_t>(i)), static_cast<double>(published[i] >> 11) * 0x1.0p-53);
  // A draw depends on (seed, counter) alone, and neighbouring counters and seeds differ.
  EXPECT_EQ(sampling_uniform(42, 7), sampling_uniform(42, 7));
  EXPECT_NE(sampling_uniform(42, 7), sampling_uniform(42, 8));
  EXPECT_NE(sampling_uniform(42, 7), sampling_uniform(43, 7));
  double mean = 0;
  for (uint64_t c = 0; c < 100000; ++c) {
    const double u = sampling_uniform(9, c);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    mean += u / 100000;
  }
  EXPECT_NEAR(mean, 0.5, 0.005);
}

StepBatch edits(std::vector<std::pair<int, std::vector<int32_t>>> e, std::vector<int> first) {
  StepBatch b;
  for (size_t i = 0; i < e.size(); ++i) b.edit_table(e[i].first, first[i], e[i].second);
  return b;
}

TEST(BlockTables, EditsAppendReplaceAndDrop) {
  BlockTables t(3);
  ASSERT_TRUE(t.apply(edits({{0, {5, 6}}, {2, {1}}}, {0, 0}), 8).ok());
  EXPECT_EQ(std::vector<int32_t>(t.of(0).begin(), t.of(0).end()), (std::vector<int32_t>{5, 6}));
  EXPECT_TRUE(t.of(1).empty());
  ASSERT_TRUE(t.apply(edits({{0, {7}}, {2, {3, 4}}}, {2, 0}), 8).ok());  // append; restart
  EXPECT_EQ(std::vector<int32_t>(t.of(0).begin(), t.of(0).end()), (std::vector<int32_t>{5, 6, 7}));
  EXPECT_EQ(std::vector<int32_t>(t.of(2).begin(), t.of(2).end()), (std::vector<int32_t>{3, 4}));
  ASSERT_TRUE(t.apply(edits({{0, {}}}, {1}), 8).ok());  // truncate
  EXPECT_EQ(std::vector<int32_t>(t.of(0).begin(), t.of(0).end()), (std::vector<int32_t>{5}));
}

TEST(BlockTables, ABadEditChangesNothing) {
  BlockTables t(2);
  ASSERT_TRUE(t.apply(edits({{0, {1, 2}}}, {0}), 4).ok());
  auto expect_unchanged = [&](const StepBatch& b, const char* what) {
    const ss::Status st = t.apply(b, 4);
    EXPECT_FALSE(st.ok()) << what;
    EXPECT_EQ(std::vector<int32_t>(t.of(0).begin(), t.of(0).end()), (std::vector<int32_t>{1, 2})) << what;
    EXPECT_TRUE(t.of(1).empty()) << what;
  };
  // Each batch has a good edit first: it must not land either.
  expect_unchanged(edits({{1, {0}}, {0, {4}}}, {0, 2}), "block past the cache");
  expect_unchanged(edits({{1, {0}}, {2, {0}}}, {0, 0}), "slot past the tables");
  expect_unchanged(edits({{1, {0}}, {0, {3}}}, {0, 5}), "edit past the table's end");
  StepBatch b = edits({{1, {0}}}, {0});
  b.table_edits.push_back(TableEdit{0, 0, 4, 0});  // more blocks than edit_blocks holds
  expect_unchanged(b, "edit past edit_blocks");
}

// The default bitmask is what mask() allows, padding ids past the mask's own vocabulary included.
TEST(TokenMaskBits, DefaultBitmaskIsTheMask) {
  struct Odd final : TokenMask {
    bool allows(int32_t t) override { return t % 2 == 1 && t < 60; }
    void mask(float* l, int n) override {
      for (int i = 0; i < n; ++i)
        if (!allows(i)) l[i] = -std::numeric_limits<float>::infinity();
    }
    void accept(int32_t) override {}
    bool must_end() const override { return false; }
  } m;
  for (int n : {1, 31, 32, 33, 70}) {
    std::vector<uint32_t> words(static_cast<size_t>((n + 31) / 32), 0xdeadbeefu);
    m.fill_bitmask(words.data(), n);
    for (int t = 0; t < static_cast<int>(words.size()) * 32; ++t) {
      const bool bit = (words[static_cast<size_t>(t / 32)] >> (t % 32)) & 1u;
      EXPECT_EQ(bit, t < n && m.allows(t)) << "n " << n << " token " << t;
    }
  }
}

}  // namespace
