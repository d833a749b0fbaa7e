// Per-sequence paged KV: block tables over a BlockPool, plus prefix caching. A full block is
// content-addressed by a hash chained over its tokens and its parent block's hash, so a hash
// names the whole prefix up to the block's end; a new sequence adopts the longest run of cached
// blocks from its start. The last prompt token is never taken from the cache (its logits are
// needed), so a match stops at the last full block before it.
#pragma once
#include <chrono>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "engine/block_pool.h"

namespace ss::engine {

class KvTiers;

// Hash of a full block given its parent's hash (kRootBlockHash for the first block).
inline constexpr BlockHash kRootBlockHash = 0x73656c6673657276ULL;  // "selfserv"
BlockHash hash_block(BlockHash parent, std::span<const int32_t> tokens);
// The chain's root for a request's cache salt (vLLM's cache_salt): requests with different salts
// never share cached blocks; an empty salt gives kRootBlockHash.
BlockHash salted_root(std::string_view salt);

// One sequence's KV state, owned by the sequence and edited only through KvCacheManager.
struct SeqBlocks {
  std::vector<BlockId> table;      // block i holds positions [i*block_size, (i+1)*block_size)
  std::vector<BlockHash> hashes;   // chain hashes of the token sequence's full blocks; they depend
                                   // on content only, so they survive preemption
  int num_published = 0;           // leading table blocks already in (or taken from) the cache
  BlockHash root = kRootBlockHash; // parent hash of the first block (salted_root of the request)
};

struct PrefixCacheStats {
  int64_t queried_tokens = 0;
  int64_t hit_tokens = 0;
  double hit_rate() const { return queried_tokens ? double(hit_tokens) / double(queried_tokens) : 0.0; }
};

class KvCacheManager {
 public:
  KvCacheManager(int num_blocks, int block_size, bool enable_prefix_caching);

  int block_size() const { return pool_.block_size(); }
  int num_blocks() const { return pool_.num_blocks(); }
  int num_free_blocks() const { return pool_.num_free(); }
  double usage() const { return double(pool_.num_used()) / double(pool_.num_blocks()); }
  bool prefix_caching() const { return caching_; }
  const BlockPool& pool() const { return pool_; }
  const PrefixCacheStats& prefix_stats() const { return stats_; }

  // Lower tiers (null: none): blocks leaving the pool are demoted there, and match_prefix restores
  // from there what the pool misses. Needs prefix caching; `tiers` outlives the manager.
  void set_tiers(KvTiers* tiers);
  KvTiers* tiers() const { return tiers_; }
  // Per step: stamps the time on blocks becoming evictable, and demotes those idle longer than the
  // tiers' TTL, at most max_blocks of them. Returns how many left the pool.
  // ttl_ms > 0 replaces the tiers' TTL for this call (memory pressure shortens it).
  int expire_idle(std::chrono::steady_clock::time_point now, int max_blocks, int64_t ttl_ms = 0);
  // Copies every cached block into the tiers (they stay in the pool): at shutdown, so a disk
  // tier keeps what the pool held.
  void demote_all_cached();

  // Cached blocks covering the longest prefix of tokens[0, size-1) (whole blocks), written to
  // `hits` without taking references. Returns the number of tokens they cover. `seq` must hold no
  // blocks; its hashes are extended as needed. Blocks the pool misses but a lower tier holds are
  // restored into free pool blocks (as far as there are free blocks) and count as hits.
  int match_prefix(std::span<const int32_t> tokens, SeqBlocks& seq, std::vector<BlockId>& hits);
  // What the last match_prefix restored from the tiers (blocks: 0 when nothing).
  struct Restored {
    int first_block = 0, blocks = 0, from_disk = 0;
    std::chrono::steady_clock::time_point begin{}, end{};
  };
  const Restored& last_restored() const { return restored_; }
  // Hit-rate counters: a lookup of `queried` tokens of which `hit` came from the cache.
  void count_query(int queried, int hit) {
    stats_.queried_tokens += queried;
    stats_.hit_tokens += hit;
  }
  // How many more tokens seq could get slots for now, after adopting `hits` (empty for a running
  // sequence); num_computed counts the tokens already in seq's blocks (and in hits).
  int fit_tokens(const SeqBlocks& seq, int num_computed, std::span<const BlockId> hits) const;
  // Adopts hits (which must be seq's first blocks) and allocates blocks so positions
  // [0, num_tokens) have slots. Returns false and changes nothing if memory is short.
  bool allocate(SeqBlocks& seq, std::span<const BlockId> hits, int num_tokens);
  // Publishes the blocks that are now full of computed K/V (positions < num_computed).
  void publish(SeqBlocks& seq, std::span<const int32_t> tokens, int num_computed);
  // Drops seq's references (last block first, so a prefix's tail is evicted before its head).
  void free(SeqBlocks& seq);

 private:
  void extend_hashes(SeqBlocks& seq, std::span<const int32_t> tokens, int num_full) const;

  BlockPool pool_;
  bool caching_;
  KvTiers* tiers_ = nullptr;
  std::vector<BlockId> pinned_;  // match_prefix: hits held while restoring
  Restored restored_;
  PrefixCacheStats stats_;
};

}  // namespace ss::engine
