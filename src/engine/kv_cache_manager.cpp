#include "engine/kv_cache_manager.h"

#include <algorithm>
#include <cassert>

#include "engine/kv_tiers.h"

namespace ss::engine {

namespace {
uint64_t mix64(uint64_t z) {  // splitmix64 finalizer: a bijection with full avalanche
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
}  // namespace

BlockHash hash_block(BlockHash parent, std::span<const int32_t> tokens) {
  uint64_t h = mix64(parent ^ 0x9e3779b97f4a7c15ULL);
  for (int32_t t : tokens) h = mix64(h ^ static_cast<uint32_t>(t)) + 0x9e3779b97f4a7c15ULL;
  return mix64(h ^ tokens.size());
}

BlockHash salted_root(std::string_view salt) {
  if (salt.empty()) return kRootBlockHash;
  uint64_t h = mix64(kRootBlockHash ^ 0x5a17ULL);
  for (unsigned char c : salt) h = mix64(h ^ c) + 0x9e3779b97f4a7c15ULL;
  h = mix64(h ^ salt.size());
  return h == kRootBlockHash ? h + 1 : h;  // never the unsalted root
}

KvCacheManager::KvCacheManager(int num_blocks, int block_size, bool enable_prefix_caching)
    : pool_(num_blocks, block_size), caching_(enable_prefix_caching) {}

void KvCacheManager::extend_hashes(SeqBlocks& seq, std::span<const int32_t> tokens, int num_full) const {
  const int bs = block_size();
  for (int b = static_cast<int>(seq.hashes.size()); b < num_full; ++b) {
    const BlockHash parent = b == 0 ? seq.root : seq.hashes[b - 1];
    seq.hashes.push_back(hash_block(parent, tokens.subspan(static_cast<size_t>(b) * bs, bs)));
  }
}

int KvCacheManager::match_prefix(std::span<const int32_t> tokens, SeqBlocks& seq, std::vector<BlockId>& hits) {
  assert(seq.table.empty());
  hits.clear();
  restored_ = {};
  if (caching_ && !tokens.empty()) {
    const int bs = block_size();
    const int max_blocks = static_cast<int>(tokens.size() - 1) / bs;  // keep the last token to compute
    extend_hashes(seq, tokens, max_blocks);
    bool pinned = false;
    for (int b = 0; b < max_blocks; ++b) {
      const BlockHash parent = b == 0 ? seq.root : seq.hashes[b - 1];
      const auto toks = tokens.subspan(static_cast<size_t>(b) * bs, bs);
      BlockId id = pool_.lookup(seq.hashes[b], parent, toks);
      if (id >= 0 && pinned) pool_.ref(id);  // held like the hits before it
      const KvTiers::Where where =
          id < 0 && tiers_ ? tiers_->find(seq.hashes[b], parent, toks) : KvTiers::Where::None;
      if (where != KvTiers::Where::None) {
        // Restoring takes free blocks, which may be evictable hits of this very lookup: hold them.
        if (!pinned) {
          pinned = true;
          for (BlockId h : hits) pool_.ref(h);
        }
        pinned_.clear();
        if (pool_.allocate(1, pinned_)) {
          id = pinned_[0];
          const auto t0 = std::chrono::steady_clock::now();
          if (tiers_->restore(seq.hashes[b], parent, toks, id)) {
            pool_.publish(id, seq.hashes[b], parent, toks);
            if (restored_.blocks == 0) restored_.first_block = b, restored_.begin = t0;
            ++restored_.blocks;
            if (where == KvTiers::Where::Disk) ++restored_.from_disk;
            restored_.end = std::chrono::steady_clock::now();
          } else {
            pool_.unref(id);  // uncached: blank again
            id = -1;
          }
        }
      }
      if (id < 0) break;
      hits.push_back(id);  // restored blocks hold the reference allocate gave them
    }
    if (pinned)  // last first, as free() does: the prefix's head stays the most recently used
      for (auto it = hits.rbegin(); it != hits.rend(); ++it) pool_.unref(*it);
  }
  return static_cast<int>(hits.size()) * block_size();
}

void KvCacheManager::set_tiers(KvTiers* tiers) {
  tiers_ = caching_ ? tiers : nullptr;
  if (!tiers_) {
    pool_.set_evict_hook({});
    return;
  }
  pool_.set_evict_hook([t = tiers_](BlockId b, BlockHash h, BlockHash p, std::span<const int32_t> toks, bool idle) {
    t->demote(b, h, p, toks, idle ? KvTiers::Why::Idle : KvTiers::Why::Evicted);
  });
}

int KvCacheManager::expire_idle(std::chrono::steady_clock::time_point now, int max_blocks, int64_t ttl_ms) {
  pool_.set_now(now);
  if (!tiers_ || tiers_->config().ttl_ms <= 0) return 0;
  const int64_t ttl = ttl_ms > 0 ? ttl_ms : tiers_->config().ttl_ms;
  return pool_.expire_idle(now - std::chrono::milliseconds(ttl), max_blocks);
}

void KvCacheManager::demote_all_cached() {
  if (!tiers_) return;
  pool_.for_each_cached([&](BlockId b, BlockHash h, BlockHash p, std::span<const int32_t> toks) {
    tiers_->demote(b, h, p, toks, KvTiers::Why::Shutdown);
  });
}

int KvCacheManager::fit_tokens(const SeqBlocks& seq, int num_computed, std::span<const BlockId> hits) const {
  int free = pool_.num_free();
  for (BlockId b : hits)
    if (pool_.ref_count(b) == 0) --free;  // adopting an evictable hit takes it off the free count
  const int64_t slots = int64_t(seq.table.size() + hits.size() + free) * block_size() - num_computed;
  return static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(slots, INT32_MAX)));
}

bool KvCacheManager::allocate(SeqBlocks& seq, std::span<const BlockId> hits, int num_tokens) {
  assert(hits.empty() || seq.table.empty());
  const int bs = block_size();
  const int need_blocks = (num_tokens + bs - 1) / bs;
  const int have = static_cast<int>(seq.table.size() + hits.size());
  const int new_blocks = std::max(0, need_blocks - have);
  int free = pool_.num_free();
  for (BlockId b : hits)
    if (pool_.ref_count(b) == 0) --free;
  if (new_blocks > free) return false;
  for (BlockId b : hits) {
    pool_.ref(b);
    seq.table.push_back(b);
  }
  if (!hits.empty()) seq.num_published = static_cast<int>(hits.size());
  const bool ok = pool_.allocate(new_blocks, seq.table);
  assert(ok);
  (void)ok;
  return true;
}

void KvCacheManager::publish(SeqBlocks& seq, std::span<const int32_t> tokens, int num_computed) {
  if (!caching_) return;
  const int bs = block_size();
  const int full = std::min(num_computed / bs, static_cast<int>(seq.table.size()));
  if (full <= seq.num_published) return;
  extend_hashes(seq, tokens, full);
  for (int b = seq.num_published; b < full; ++b) {
    const BlockHash parent = b == 0 ? seq.root : seq.hashes[b - 1];
    pool_.publish(seq.table[b], seq.hashes[b], parent, tokens.subspan(static_cast<size_t>(b) * bs, bs));
  }
  seq.num_published = full;
}

void KvCacheManager::free(SeqBlocks& seq) {
  for (auto it = seq.table.rbegin(); it != seq.table.rend(); ++it) pool_.unref(*it);
  seq.table.clear();
  seq.num_published = 0;
}

}  // namespace ss::engine
