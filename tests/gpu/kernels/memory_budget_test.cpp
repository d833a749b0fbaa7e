// The KV budget rule (backend/cuda/memory_budget.h), host arithmetic only: runs without a GPU.
#include "backend/cuda/memory_budget.h"

#include <gtest/gtest.h>

namespace {
constexpr int64_t MiB = 1 << 20, GiB = 1LL << 30;
using ss::cuda::kKvBudgetReserve;
using ss::cuda::kv_blocks_for_budget;
}  // namespace

// One server on an empty 80 GiB card at 0.9 (a 0.5 GiB CUDA context, 16 GiB of weights): the share
// less its weights and scratch, in blocks.
TEST(KvBudget, OneServerTakesItsShareLessWeightsAndScratch) {
  const int64_t total = 80 * GiB, own = 16 * GiB, free_now = total - GiB / 2 - own;
  auto b = kv_blocks_for_budget(total, free_now, own, 0.9, 512 * MiB, 2 * MiB, 1 << 22);
  ASSERT_TRUE(b.ok()) << b.message();
  EXPECT_EQ(*b, static_cast<int64_t>((0.9 * 80 * GiB - 16 * GiB - 512 * MiB) / (2 * MiB)));
}

// vLLM's meaning: a second server at 0.45 starts beside a first one holding 0.45 of the card (the
// old rule, a cap on the whole card's use, left it nothing), and gets the same blocks as the first.
TEST(KvBudget, TwoServersShareOneCard) {
  const int64_t total = 80 * GiB, ctx = GiB / 2, weights = 2 * GiB, scratch = 256 * MiB;
  auto first = kv_blocks_for_budget(total, total - ctx - weights, weights, 0.45, scratch, 2 * MiB, 1 << 22);
  ASSERT_TRUE(first.ok()) << first.message();
  const int64_t held = ctx + weights + scratch + (*first + 1) * 2 * MiB;  // the first server, all told
  auto second = kv_blocks_for_budget(total, total - held - ctx - weights, weights, 0.45, scratch, 2 * MiB, 1 << 22);
  ASSERT_TRUE(second.ok()) << second.message();
  EXPECT_EQ(*second, *first);
}

// A share bigger than what is free (less the reserve) fails and says what else holds the card; a
// share that the weights alone fill fails too; the block cap holds.
TEST(KvBudget, TooLittleFreeOrNoRoomAreClearErrors) {
  const int64_t total = 80 * GiB;
  auto crowded = kv_blocks_for_budget(total, 18 * GiB, 2 * GiB, 0.9, 256 * MiB, 2 * MiB, 1 << 22);
  ASSERT_FALSE(crowded.ok());
  EXPECT_NE(crowded.message().find("lower it, or free the card"), std::string::npos) << crowded.message();
  EXPECT_NE(crowded.message().find("61440 MiB in use besides this backend"), std::string::npos) << crowded.message();
  EXPECT_NE(crowded.message().find("--gpu-memory-utilization 0.90 "), std::string::npos) << crowded.message();
  // Exactly what is free, but no reserve left: refused; with the reserve: taken.
  const int64_t own = GiB, scratch = 256 * MiB, block = 2 * MiB;
  const double util = 0.5;
  const int64_t kv = static_cast<int64_t>(util * static_cast<double>(total)) - own - scratch;
  EXPECT_FALSE(kv_blocks_for_budget(total, kv + scratch, own, util, scratch, block, 1 << 22).ok());
  EXPECT_TRUE(kv_blocks_for_budget(total, kv + scratch + block + kKvBudgetReserve, own, util, scratch, block, 1 << 22).ok());
  auto full = kv_blocks_for_budget(total, 63 * GiB, 16 * GiB, 0.2, 256 * MiB, 2 * MiB, 1 << 22);
  ASSERT_FALSE(full.ok());
  EXPECT_NE(full.message().find("no room for the KV cache"), std::string::npos) << full.message();
  auto capped = kv_blocks_for_budget(total, 78 * GiB, GiB, 0.9, 0, 16 * 1024, 1000);
  ASSERT_TRUE(capped.ok());
  EXPECT_EQ(*capped, 1000);
}

// bf16 copies by default; quantized matrices kept packed only where bf16 would take more than 80%
// of the share and the packed copies are smaller. Llama-3-8B at Q4_0 (4.5 GB packed, 16.1 GB as
// bf16) at 0.9: bf16 on a 141 GB card and on a 24 GiB one (16.1 of 18.6 GB allowed), packed on a
// 16 GiB one; Llama-3-70B at Q4_K_M (42 GB packed, 141 GB as bf16) packed even on the 141 GB card;
// a file with nothing packable (bf16 safetensors: the same bytes either way) never switches.
TEST(KvBudget, QuantizedWeightsStayPackedOnlyWhereBf16WouldCrowdTheShare) {
  using ss::cuda::keep_weights_quantized;
  const int64_t MB = 1000LL * 1000, GB = 1000 * MB;
  const int64_t bf16_8b = 16060 * MB, q4_8b = 4520 * MB;
  EXPECT_FALSE(keep_weights_quantized(141 * GB, 0.9, bf16_8b, q4_8b));
  EXPECT_FALSE(keep_weights_quantized(24 * GiB, 0.9, bf16_8b, q4_8b));
  EXPECT_TRUE(keep_weights_quantized(16 * GiB, 0.9, bf16_8b, q4_8b));
  EXPECT_TRUE(keep_weights_quantized(141 * GB, 0.9, 141 * GB, 42 * GB));
  EXPECT_FALSE(keep_weights_quantized(16 * GiB, 0.9, bf16_8b, bf16_8b));
  // The boundary: exactly 80% of the share stays bf16, a byte more does not.
  const int64_t total = 100 * GiB;
  const int64_t at = static_cast<int64_t>(0.8 * 0.5 * static_cast<double>(total));
  EXPECT_FALSE(keep_weights_quantized(total, 0.5, at, at / 4));
  EXPECT_TRUE(keep_weights_quantized(total, 0.5, at + 1, at / 4));
}
