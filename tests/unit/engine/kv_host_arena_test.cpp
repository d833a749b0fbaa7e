// The host tier's arena: every demotion after start-up copies into chunks allocated then, so it
// allocates no block-sized memory (counted by a replaced operator new), its bytes lie in the arena's
// address range, and recycled chunks give back the bytes last put in them. Compressed blocks span
// several chunks and come back bit-exact.
#include "engine/kv_host_arena.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <new>
#include <random>

#include "engine/kv_cache_manager.h"
#include "engine/kv_tiers.h"
#include "fake_backend.h"

namespace {
// Allocations bigger than a block's token list (1,024 tokens: 4 KiB) while counting is on: a block's
// K/V (8 KiB in the tests below), a compressed copy of it, or zstd's working memory would be counted.
std::atomic<bool> g_counting{false};
std::atomic<int64_t> g_big_allocs{0};
constexpr size_t kBigAlloc = 4096;
}  // namespace

void* operator new(size_t n) {
  if (n > kBigAlloc && g_counting.load(std::memory_order_relaxed)) g_big_allocs.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
// The pair of the operator new above (malloc'd, so free); GCC cannot see that they pair up.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
// The nothrow forms too (std::stable_sort's buffer uses them): left to a sanitizer's own operator
// new, their memory would come back through the free() above, a mismatch AddressSanitizer aborts on.
void* operator new(size_t n, const std::nothrow_t&) noexcept {
  try {
    return ::operator new(n);
  } catch (...) {
    return nullptr;
  }
}
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
#pragma GCC diagnostic pop

using namespace ss;
using namespace ss::engine;
using namespace ss::engine::testing;

namespace {
constexpr int kVocab = 97;
constexpr int kBlockTokens = 1024;  // FakeBackend: 8 bytes a token, so 8 KiB a block

struct Counting {
  Counting() {
    g_big_allocs = 0;
    g_counting = true;
  }
  ~Counting() { g_counting = false; }
};

struct Block {
  std::vector<int32_t> tokens;
  BlockHash hash;
  std::vector<uint8_t> bytes;
};
}  // namespace

TEST(HostArena, TakeAndGiveEveryChunkOnce) {
  auto a = HostArena::create(10 * 256 + 100, 256);
  ASSERT_TRUE(a.ok()) << a.message();
  EXPECT_EQ((*a)->num_chunks(), 10);
  std::vector<uint32_t> got;
  ASSERT_TRUE((*a)->take(7, got));
  EXPECT_FALSE((*a)->take(4, got));  // only 3 left: takes none
  EXPECT_EQ(got.size(), 7u);
  EXPECT_EQ((*a)->free_chunks(), 3);
  ASSERT_TRUE((*a)->take(3, got));
  std::sort(got.begin(), got.end());
  for (uint32_t i = 0; i < 10; ++i) EXPECT_EQ(got[i], i);  // each chunk once
  (*a)->give(got);
  EXPECT_EQ((*a)->free_chunks(), 10);
  EXPECT_FALSE(HostArena::create(100, 256).ok());  // holds no chunk: a clear error
}

TEST(KvTiers, DemotionsAfterStartUpAllocateNoBlockMemory) {
  for (bool compress : {false, true}) {
    SCOPED_TRACE(compress ? "zstd" : "plain");
    std::mt19937 g(compress ? 5 : 3);
    constexpr int kBlocks = 64, kHostBlocks = 16;
    FakeBackend be(kBlocks, kBlockTokens, kVocab);
    const size_t bb = static_cast<size_t>(be.kv_block_bytes());
    std::vector<Block> blocks(kBlocks);
    BlockHash parent = kRootBlockHash;
    for (int b = 0; b < kBlocks; ++b) {
      Block& k = blocks[static_cast<size_t>(b)];
      k.tokens = random_tokens(g, kBlockTokens, kVocab);
      k.hash = hash_block(parent, k.tokens);
      parent = k.hash;
      k.bytes.resize(bb);
      for (size_t i = 0; i < bb; ++i) k.bytes[i] = i % 2 ? 0 : static_cast<uint8_t>(g());  // compresses ~2x
      ASSERT_TRUE(be.write_kv_block(b, k.bytes).ok());
    }
    KvTierConfig tc;
    tc.host_bytes = kHostBlocks * static_cast<int64_t>(bb);
    tc.host_compress = compress;
    auto t = KvTiers::create(tc, be);
    ASSERT_TRUE(t.ok()) << t.message();
    const auto [lo, hi] = (*t)->arena_range();
    ASSERT_NE(lo, nullptr);
    EXPECT_LE(hi - lo, tc.host_bytes);
    {
      Counting c;  // four times the tier's capacity: chunks are recycled through the LRU
      for (int b = 0; b < kBlocks; ++b) {
        const Block& k = blocks[static_cast<size_t>(b)];
        (*t)->demote(b, k.hash, b ? blocks[static_cast<size_t>(b) - 1].hash : kRootBlockHash, k.tokens,
                     KvTiers::Why::Evicted);
      }
    }
    EXPECT_EQ(g_big_allocs.load(), 0);
    const KvTierStats st = (*t)->stats();
    EXPECT_EQ(st.demoted_evicted, kBlocks);
    EXPECT_EQ(st.demote_no_room, 0);
    EXPECT_EQ(st.host_capacity_bytes, hi - lo);
    EXPECT_EQ(st.arena_bytes, hi - lo);
    EXPECT_LE(st.host_used_bytes, st.host_capacity_bytes);
    EXPECT_EQ(st.host_dropped, kBlocks - st.host_blocks);
    if (compress) {
      EXPECT_GT(st.host_blocks, kHostBlocks);  // compressed blocks take fewer chunks
    } else {
      EXPECT_EQ(st.host_blocks, kHostBlocks);
    }
    // The newest blocks are kept, in the arena, and come back bit-exact from recycled chunks.
    std::vector<uint8_t> back(bb);
    for (int b = kBlocks - static_cast<int>(st.host_blocks); b < kBlocks; ++b) {
      const Block& k = blocks[static_cast<size_t>(b)];
      const BlockHash par = b ? blocks[static_cast<size_t>(b) - 1].hash : kRootBlockHash;
      const uint8_t* p = (*t)->host_bytes_of(k.hash);
      ASSERT_NE(p, nullptr) << b;
      EXPECT_TRUE(p >= lo && p < hi) << b;
      ASSERT_EQ((*t)->find(k.hash, par, k.tokens), KvTiers::Where::Host) << b;
      ASSERT_TRUE((*t)->restore(k.hash, par, k.tokens, 0));
      ASSERT_TRUE(be.read_kv_block(0, back).ok());
      EXPECT_EQ(back, k.bytes) << b;
    }
    EXPECT_EQ((*t)->host_bytes_of(blocks[0].hash), nullptr);  // the oldest went first
  }
}

// The asynchronous path reads a compressed entry chunk by chunk too.
TEST(KvTiers, CompressedEntriesSpanChunksAndLoadBitExact) {
  std::mt19937 g(9);
  FakeBackend be(4, kBlockTokens, kVocab);
  const size_t bb = static_cast<size_t>(be.kv_block_bytes());
  std::vector<uint8_t> bytes(bb);
  for (size_t i = 0; i < bb; ++i) bytes[i] = i % 2 ? 0 : static_cast<uint8_t>(g());
  ASSERT_TRUE(be.write_kv_block(1, bytes).ok());
  const auto tokens = random_tokens(g, kBlockTokens, kVocab);
  const BlockHash hash = hash_block(kRootBlockHash, tokens);
  KvTierConfig tc;
  tc.host_bytes = 4 * static_cast<int64_t>(bb);
  tc.host_compress = true;
  auto t = KvTiers::create(tc, be);
  ASSERT_TRUE(t.ok()) << t.message();
  (*t)->demote(1, hash, kRootBlockHash, tokens, KvTiers::Why::Idle);
  const KvTierStats st = (*t)->stats();
  EXPECT_GT(st.host_used_bytes, st.host_capacity_bytes / 32);  // more than one chunk
  EXPECT_LT(st.host_used_bytes, static_cast<int64_t>(bb));      // fewer than a plain block's
  const KvTiers::LoadItem item{hash, kRootBlockHash, tokens};
  (*t)->load_async(std::span<const KvTiers::LoadItem>(&item, 1));
  ASSERT_TRUE((*t)->wait_loaded(std::chrono::seconds(10)));
  std::vector<KvTiers::Loaded> got;
  ASSERT_EQ((*t)->take_loaded(1, got), 1);
  ASSERT_TRUE(got[0].ok);
  ASSERT_TRUE((*t)->apply_load(got[0], item, 3));
  std::vector<uint8_t> back(bb);
  ASSERT_TRUE(be.read_kv_block(3, back).ok());
  EXPECT_EQ(back, bytes);
}
