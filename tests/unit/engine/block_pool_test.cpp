// BlockPool reference counts, free/LRU lists and the prefix index; KvCacheManager's chained
// hashes, prefix matching and slot accounting.
#include "engine/block_pool.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "engine/kv_cache_manager.h"

using namespace ss::engine;

namespace {
std::vector<int32_t> iota_tokens(int n, int start = 0) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}
}  // namespace

TEST(BlockPool, AllocateFreeAndRefCounts) {
  BlockPool p(8, 4);
  EXPECT_EQ(p.num_free(), 8);
  std::vector<BlockId> a;
  ASSERT_TRUE(p.allocate(3, a));
  ASSERT_EQ(a.size(), 3u);
  EXPECT_EQ(p.num_free(), 5);
  EXPECT_EQ(p.num_used(), 3);
  for (BlockId b : a) EXPECT_EQ(p.ref_count(b), 1);
  p.ref(a[0]);
  EXPECT_EQ(p.ref_count(a[0]), 2);
  p.unref(a[0]);
  EXPECT_EQ(p.num_free(), 5);  // still referenced once
  p.unref(a[0]);
  EXPECT_EQ(p.num_free(), 6);
  EXPECT_EQ(p.ref_count(a[0]), 0);
  std::vector<BlockId> b;
  EXPECT_FALSE(p.allocate(7, b));  // all or nothing
  EXPECT_TRUE(b.empty());
  EXPECT_EQ(p.num_free(), 6);
  ASSERT_TRUE(p.allocate(6, b));
  EXPECT_EQ(p.num_free(), 0);
  std::vector<BlockId> c;
  EXPECT_FALSE(p.allocate(1, c));
  for (BlockId x : b) p.unref(x);
  p.unref(a[1]);
  p.unref(a[2]);
  EXPECT_EQ(p.num_free(), 8);
  ASSERT_TRUE(p.check().ok()) << p.check().message();
}

TEST(BlockPool, CachedBlocksStayUntilBlankListIsEmptyThenLeaveLru) {
  BlockPool p(4, 2);
  std::vector<BlockId> a;
  ASSERT_TRUE(p.allocate(2, a));
  const std::vector<int32_t> t0{1, 2}, t1{3, 4};
  ASSERT_TRUE(p.publish(a[0], 100, 0, t0));
  ASSERT_TRUE(p.publish(a[1], 200, 100, t1));
  EXPECT_FALSE(p.publish(a[1], 100, 0, t0)) << "a block can only hold one hash";
  p.unref(a[1]);  // freed first: least recently used
  p.unref(a[0]);
  EXPECT_EQ(p.num_free(), 4);
  EXPECT_EQ(p.num_cached(), 2);
  EXPECT_EQ(p.num_evictable(), 2);
  EXPECT_EQ(p.lookup(100, 0, t0), a[0]);
  EXPECT_EQ(p.lookup(100, 1, t0), -1) << "parent hash must match";
  EXPECT_EQ(p.lookup(100, 0, t1), -1) << "tokens must match";

  std::vector<BlockId> b;
  ASSERT_TRUE(p.allocate(2, b));  // the two blank blocks; nothing evicted
  EXPECT_EQ(p.num_cached(), 2);
  EXPECT_EQ(p.num_evictions(), 0u);
  std::vector<BlockId> c;
  ASSERT_TRUE(p.allocate(1, c));  // evicts the LRU cached block: a[1]
  EXPECT_EQ(c[0], a[1]);
  EXPECT_EQ(p.num_evictions(), 1u);
  EXPECT_EQ(p.lookup(200, 100, t1), -1);
  EXPECT_EQ(p.lookup(100, 0, t0), a[0]);
  // A hit takes the evictable block back off the LRU list.
  p.ref(a[0]);
  EXPECT_EQ(p.num_free(), 0);
  EXPECT_EQ(p.ref_count(a[0]), 1);
  ASSERT_TRUE(p.check().ok()) << p.check().message();
  p.unref(a[0]);
  for (BlockId x : b) p.unref(x);
  p.unref(c[0]);
  EXPECT_EQ(p.num_free(), 4);
  ASSERT_TRUE(p.check().ok()) << p.check().message();
}

TEST(PrefixHash, ChainsOverTheWholePrefix) {
  const auto a = iota_tokens(4), b = iota_tokens(4, 10);
  const BlockHash ha = hash_block(kRootBlockHash, a);
  EXPECT_EQ(ha, hash_block(kRootBlockHash, a)) << "deterministic";
  EXPECT_NE(ha, hash_block(kRootBlockHash, b));
  // The same block after different prefixes hashes differently.
  EXPECT_NE(hash_block(ha, b), hash_block(hash_block(kRootBlockHash, b), b));
  EXPECT_NE(hash_block(ha, b), hash_block(kRootBlockHash, b));
  // Order matters.
  std::vector<int32_t> swapped{1, 0, 2, 3};
  EXPECT_NE(ha, hash_block(kRootBlockHash, swapped));
}

TEST(KvCacheManager, ReusesLongestPrefixAndKeepsLastTokenToCompute) {
  const int bs = 4;
  KvCacheManager kv(16, bs, true);
  auto sys = iota_tokens(10, 100);  // 2 full blocks + 2 tokens
  auto p1 = sys;
  p1.insert(p1.end(), {1, 2, 3});
  SeqBlocks s1;
  std::vector<BlockId> hits;
  EXPECT_EQ(kv.match_prefix(p1, s1, hits), 0);
  ASSERT_TRUE(kv.allocate(s1, hits, static_cast<int>(p1.size())));
  EXPECT_EQ(s1.table.size(), 4u);
  kv.publish(s1, p1, static_cast<int>(p1.size()));  // 13 tokens computed: 3 full blocks
  EXPECT_EQ(s1.num_published, 3);
  EXPECT_EQ(kv.pool().num_cached(), 3);

  // Shares 10 tokens (2 full blocks) with p1, then differs.
  auto p2 = sys;
  p2.insert(p2.end(), {7, 7, 7, 7, 7});
  SeqBlocks s2;
  EXPECT_EQ(kv.match_prefix(p2, s2, hits), 8);
  ASSERT_EQ(hits.size(), 2u);
  EXPECT_EQ(hits[0], s1.table[0]);
  EXPECT_EQ(hits[1], s1.table[1]);
  const int free_before = kv.num_free_blocks();
  EXPECT_EQ(kv.fit_tokens(s2, 8, hits), free_before * bs);
  ASSERT_TRUE(kv.allocate(s2, hits, static_cast<int>(p2.size())));
  EXPECT_EQ(kv.pool().ref_count(s1.table[0]), 2);
  EXPECT_EQ(kv.num_free_blocks(), free_before - 2);  // 15 tokens: 4 blocks, 2 of them shared

  // Exactly p1's first 12 tokens: all 3 blocks are cached, but the last token must be computed,
  // so only 2 blocks (8 tokens) are reused.
  std::vector<int32_t> p3(p1.begin(), p1.begin() + 12);
  SeqBlocks s3;
  EXPECT_EQ(kv.match_prefix(p3, s3, hits), 8);

  kv.free(s1);
  kv.free(s2);
  EXPECT_EQ(kv.pool().num_used(), 0);
  EXPECT_EQ(kv.pool().num_cached(), 3) << "freed blocks stay cached";
  SeqBlocks s4;
  EXPECT_EQ(kv.match_prefix(p1, s4, hits), 12);
  // Adopting evictable hits takes them off the free count.
  EXPECT_EQ(kv.fit_tokens(s4, 12, hits), (16 - 3) * bs - 0);
  ASSERT_TRUE(kv.pool().check().ok());
}

TEST(KvCacheManager, DisabledCachingNeverHits) {
  KvCacheManager kv(8, 4, false);
  auto p = iota_tokens(9);
  SeqBlocks s;
  std::vector<BlockId> hits;
  ASSERT_TRUE(kv.allocate(s, hits, 9));
  kv.publish(s, p, 9);
  EXPECT_EQ(kv.pool().num_cached(), 0);
  SeqBlocks t;
  EXPECT_EQ(kv.match_prefix(p, t, hits), 0);
  kv.free(s);
  EXPECT_EQ(kv.num_free_blocks(), 8);
}

TEST(KvCacheManager, AllocateIsAllOrNothing) {
  KvCacheManager kv(4, 4, true);
  SeqBlocks a, b;
  std::vector<BlockId> none;
  ASSERT_TRUE(kv.allocate(a, none, 10));  // 3 blocks
  EXPECT_EQ(kv.fit_tokens(a, 10, {}), 2 + 4);
  EXPECT_FALSE(kv.allocate(b, none, 5));  // needs 2, 1 free
  EXPECT_TRUE(b.table.empty());
  EXPECT_EQ(kv.num_free_blocks(), 1);
  ASSERT_TRUE(kv.allocate(a, none, 16));
  EXPECT_EQ(kv.num_free_blocks(), 0);
  kv.free(a);
  EXPECT_EQ(kv.num_free_blocks(), 4);
}
