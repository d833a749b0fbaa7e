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
#include <unordered_map>
#include <vector>

#include "engine/block_pool.h"
#include "engine/kv_tiers.h"

namespace ss::engine {

class KvTiers;

// Hash of a full block given its parent's hash (kRootBlockHash for the first block).
inline constexpr BlockHash kRootBlockHash = 0x73656c6673657276ULL;  // "selfserv"
BlockHash hash_block(BlockHash parent, std::span<const int32_t> tokens);
// The chain's root for a request's cache salt (vLLM's cache_salt): requests with different salts
// never share cached blocks; an empty salt gives kRootBlockHash.
BlockHash salted_root(std::string_view salt);

// A restore from the lower tiers (KvCacheManager::start_restore), while it runs and after.
struct RestoreState {
  uint64_t ticket = 0;  // != 0: blocks are still being loaded
  int pending = 0;      // of them
  int failed_at = -1;   // >= 0: the first block (table index) that could not be restored
  int first_block = 0, blocks = 0, from_disk = 0;  // restored: table index, count, from disk
  std::chrono::steady_clock::time_point begin{}, end{};
};

// One sequence's KV state, owned by the sequence and edited only through KvCacheManager.
struct SeqBlocks {
  std::vector<BlockId> table;      // block i holds positions [i*block_size, (i+1)*block_size)
  std::vector<BlockHash> hashes;   // chain hashes of the token sequence's full blocks; they depend
                                   // on content only, so they survive preemption
  int num_published = 0;           // leading table blocks already in (or taken from) the cache
  BlockHash root = kRootBlockHash; // parent hash of the first block (salted_root of the request)
  RestoreState restore;            // the last restore from the tiers
  bool restoring() const { return restore.ticket != 0; }
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

  // Lower tiers (null: none): blocks leaving the pool are demoted there, and start_restore brings
  // back from there what the pool misses. Needs prefix caching; `tiers` outlives the manager.
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
  // blocks; its hashes are extended as needed.
  int match_prefix(std::span<const int32_t> tokens, SeqBlocks& seq, std::vector<BlockId>& hits);
  // After match_prefix: if a lower tier holds the blocks after `hits`, seq takes references on the
  // hits and on free pool blocks for those (as far as there are free blocks; blocks the pool holds
  // again further on are taken as hits), and a load of them starts on the tiers' loader thread.
  // Returns the number of blocks being restored (0: nothing started, seq unchanged). While
  // seq.restoring(), seq holds its blocks; apply_restores completes it.
  int start_restore(std::span<const int32_t> tokens, SeqBlocks& seq, std::span<const BlockId> hits);
  // Copies up to max_blocks loaded blocks into the pool, all in one batched copy
  // (KvTiers::apply_loads, Backend::write_kv_blocks), and publishes them. A restore whose last block is done ends: seq.restore.ticket is 0 and seq.table holds the
  // prefix up to the first block that failed (the rest is recomputed). Returns blocks copied.
  int apply_restores(int max_blocks);
  int num_restoring() const { return static_cast<int>(restores_.size()); }
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
  // Drops seq's references (last block first, so a prefix's tail is evicted before its head); a
  // restore in flight is cancelled (blocks not yet copied go blank).
  void free(SeqBlocks& seq);
  // A sequence holding restored blocks that is not admitted now: the blocks stay cached, unheld.
  void release(SeqBlocks& seq) { free(seq); }

 private:
  void extend_hashes(SeqBlocks& seq, std::span<const int32_t> tokens, int num_full) const;

  BlockPool pool_;
  bool caching_;
  KvTiers* tiers_ = nullptr;
  struct Restore {
    SeqBlocks* seq;
    std::vector<KvTiers::LoadItem> items;
    std::vector<int> table_index;  // of each item's block in seq->table
  };
  void end_restore(SeqBlocks& seq);

  std::vector<BlockId> pinned_;
  std::unordered_map<uint64_t, Restore> restores_;  // by ticket
  std::vector<KvTiers::Loaded> loaded_;
  std::vector<KvTiers::Apply> applies_;                // apply_restores' batch, and whose each is
  std::vector<std::pair<Restore*, int>> apply_owner_;  // (its restore, its table index)
  std::vector<char> applied_;
  PrefixCacheStats stats_;
};

}  // namespace ss::engine
