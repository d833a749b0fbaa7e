// The paged KV cache's bookkeeping (the K/V bytes live in the backend): a fixed set of block ids
// with reference counts, a free list of blank blocks, and the prefix-cache index of full blocks.
// An unreferenced block that holds a cached prefix stays cached on an LRU list and is evicted
// only when no blank block is left. Engine-thread only; allocates nothing after construction
// except index nodes when a block is published.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <span>
#include <unordered_map>
#include <vector>

#include "common/status.h"

namespace ss::engine {

using BlockId = int32_t;
using BlockHash = uint64_t;

// A cached block leaving the pool (or copied out at shutdown): its id, while its K/V is intact,
// and the content that names it. tokens point into the pool (valid until the block is reused).
struct CachedBlock {
  BlockId block;
  BlockHash hash, parent;
  std::span<const int32_t> tokens;
};

class BlockPool {
 public:
  BlockPool(int num_blocks, int block_size);
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  int num_blocks() const { return num_blocks_; }
  int block_size() const { return block_size_; }
  int num_free() const { return blank_.size + lru_.size; }  // allocatable now (blank + evictable)
  int num_used() const { return num_blocks_ - num_free(); }  // referenced by some sequence
  int num_cached() const { return static_cast<int>(index_.size()); }
  int num_evictable() const { return lru_.size; }
  uint64_t num_evictions() const { return evictions_; }

  // Appends n fresh blocks (ref 1, no hash) to out: blank ones first, then the least recently
  // used cached ones (evicted from the index). Returns false and takes nothing if fewer are free.
  bool allocate(int n, std::vector<BlockId>& out);
  void ref(BlockId b);    // a cache hit: an evictable block leaves the LRU list
  void unref(BlockId b);  // at 0 the block goes to the LRU tail if cached, else the blank list
  int ref_count(BlockId b) const { return ref_[b]; }

  // Prefix-cache index. `hash` chains over the parent's hash and the block's tokens; the stored
  // parent hash and tokens are compared too, so a 64-bit collision can never return wrong K/V.
  BlockId lookup(BlockHash hash, BlockHash parent, std::span<const int32_t> tokens) const;  // -1: miss
  // Makes a full, referenced block findable. False if another block already holds this content
  // (two requests computed the same block at once); this one then stays private.
  bool publish(BlockId b, BlockHash hash, BlockHash parent, std::span<const int32_t> tokens);
  bool is_cached(BlockId b) const { return cached_[b] != 0; }

  Status check() const;  // lists, counts and index agree (tests, debugging)

  // Lower tiers (kv_tiers.h). The hook sees every cached block leaving the index while its K/V is
  // still intact (before the block is handed out again): `idle` tells a TTL expiry from an
  // eviction for room. The blocks one allocate() or expire_idle() evicts come in one call, in the
  // order they left (the least recently used first), so the tiers can copy them out together.
  using TimePoint = std::chrono::steady_clock::time_point;
  using EvictHook = std::function<void(std::span<const CachedBlock> blocks, bool idle)>;
  void set_evict_hook(EvictHook hook) { on_evict_ = std::move(hook); }
  // The time unref() stamps on a block that becomes evictable (the executor's clock, per step).
  void set_now(TimePoint now) { now_ = now; }
  // Evicts the cached, unreferenced blocks that became evictable before `cutoff` (they go blank),
  // at most max_blocks of them (the oldest first).
  int expire_idle(TimePoint cutoff, int max_blocks);
  // How many blocks expire_idle(cutoff, max_blocks) would evict now (a count; nothing changes).
  int count_idle(TimePoint cutoff, int max_blocks) const;
  // Calls fn(block, hash, parent, tokens) for every cached block, least recently used first among
  // the evictable ones (shutdown: a persistent tier keeps them).
  void for_each_cached(const std::function<void(BlockId, BlockHash, BlockHash, std::span<const int32_t>)>& fn) const;

 private:
  struct List {
    BlockId head = -1, tail = -1;
    int size = 0;
  };
  enum : uint8_t { kInUse = 0, kBlank = 1, kLru = 2 };
  void push_back(List& l, uint8_t tag, BlockId b);
  void remove(List& l, BlockId b);
  BlockId pop_front(List& l);
  void evict(BlockId b);               // out of the index; noted in evicted_ for the hook
  void report_evicted(bool idle);      // the hook, once, with evicted_ (then cleared)

  int num_blocks_, block_size_;
  std::vector<int32_t> ref_;
  std::vector<BlockId> prev_, next_;
  std::vector<uint8_t> where_;   // kInUse / kBlank / kLru
  std::vector<uint8_t> cached_;  // in index_
  std::vector<BlockHash> hash_, parent_;
  std::vector<int32_t> tokens_;  // block_size per block, for collision checks
  List blank_, lru_;
  std::unordered_map<BlockHash, BlockId> index_;
  uint64_t evictions_ = 0;
  std::vector<TimePoint> idle_since_;
  TimePoint now_{};
  EvictHook on_evict_;
  std::vector<CachedBlock> evicted_;  // capacity num_blocks from the start
};

}  // namespace ss::engine
