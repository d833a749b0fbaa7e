// The KV budget rule (backend/cuda/memory_budget.h), host arithmetic only: runs without a GPU.
#include "backend/cuda/memory_budget.h"

#include <gtest/gtest.h>

namespace {
constexpr int64_t MiB = 1 << 20, GiB = 1LL << 30;
}

// One server on an empty 80 GiB card at 0.9: the share less its weights and scratch, in blocks.
TEST(KvBudget, OneServerTakesItsShareLessWeightsAndScratch) {
  const int64_t total = 80 * GiB, start = 79 * GiB, now = start - 16 * GiB;  // 16 GiB of weights
  auto b = ss::cuda::kv_blocks_for_budget(total, start, now, 0.9, 512 * MiB, 2 * MiB, 1 << 22);
  ASSERT_TRUE(b.ok()) << b.message();
  EXPECT_EQ(*b, static_cast<int64_t>((0.9 * 80 * GiB - 16 * GiB - 512 * MiB) / (2 * MiB)));
}

// vLLM's meaning: a second server at 0.45 starts beside a first one holding 0.45 of the card (the
// old rule, a cap on the whole card's use, left it nothing), and gets the same blocks as the first.
TEST(KvBudget, TwoServersShareOneCard) {
  const int64_t total = 80 * GiB, weights = 2 * GiB, scratch = 256 * MiB;
  auto first = ss::cuda::kv_blocks_for_budget(total, 79 * GiB, 77 * GiB, 0.45, scratch, 2 * MiB, 1 << 22);
  ASSERT_TRUE(first.ok()) << first.message();
  const int64_t held = weights + scratch + *first * 2 * MiB;  // what the first server holds now
  const int64_t start2 = 79 * GiB - held;
  auto second = ss::cuda::kv_blocks_for_budget(total, start2, start2 - weights, 0.45, scratch, 2 * MiB, 1 << 22);
  ASSERT_TRUE(second.ok()) << second.message();
  EXPECT_EQ(*second, *first);
}

// A share bigger than what is free fails and says how much was taken before; a share that the
// weights alone fill fails too; the block cap holds.
TEST(KvBudget, TooLittleFreeOrNoRoomAreClearErrors) {
  const int64_t total = 80 * GiB;
  auto crowded = ss::cuda::kv_blocks_for_budget(total, 20 * GiB, 18 * GiB, 0.9, 256 * MiB, 2 * MiB, 1 << 22);
  ASSERT_FALSE(crowded.ok());
  EXPECT_NE(crowded.message().find("lower it, or free the card"), std::string::npos) << crowded.message();
  EXPECT_NE(crowded.message().find("61440 MiB were taken before"), std::string::npos) << crowded.message();
  auto full = ss::cuda::kv_blocks_for_budget(total, 79 * GiB, 63 * GiB, 0.2, 256 * MiB, 2 * MiB, 1 << 22);
  ASSERT_FALSE(full.ok());
  EXPECT_NE(full.message().find("no room for the KV cache"), std::string::npos) << full.message();
  auto capped = ss::cuda::kv_blocks_for_budget(total, 79 * GiB, 78 * GiB, 0.9, 0, 16 * 1024, 1000);
  ASSERT_TRUE(capped.ok());
  EXPECT_EQ(*capped, 1000);
}
