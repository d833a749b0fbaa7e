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
  if (caching_ && !tokens.empty()) {
    const int bs = block_size();
    const int max_blocks = static_cast<int>(tokens.size() - 1) / bs;  // keep the last token to compute
    extend_hashes(seq, tokens, max_blocks);
    for (int b = 0; b < max_blocks; ++b) {
      const BlockHash parent = b == 0 ? seq.root : seq.hashes[b - 1];
      const BlockId id = pool_.lookup(seq.hashes[b], parent, tokens.subspan(static_cast<size_t>(b) * bs, bs));
      if (id < 0) break;
      hits.push_back(id);
    }
  }
  return static_cast<int>(hits.size()) * block_size();
}

int KvCacheManager::start_restore(std::span<const int32_t> tokens, SeqBlocks& seq, std::span<const BlockId> hits) {
  assert(seq.table.empty() && !seq.restoring());
  if (!tiers_ || tokens.empty()) return 0;
  const int bs = block_size();
  const int max_blocks = static_cast<int>(tokens.size() - 1) / bs;
  const int first = static_cast<int>(hits.size());
  if (first >= max_blocks) return 0;
  auto toks_of = [&](int b) { return tokens.subspan(static_cast<size_t>(b) * bs, bs); };
  auto parent_of = [&](int b) { return b == 0 ? seq.root : seq.hashes[b - 1]; };
  if (tiers_->find(seq.hashes[first], parent_of(first), toks_of(first)) == KvTiers::Where::None) return 0;
  // Hold the hits first: the blocks restored into may otherwise evict them.
  for (BlockId h : hits) {
    pool_.ref(h);
    seq.table.push_back(h);
  }
  Restore r{&seq, {}, {}};
  for (int b = first; b < max_blocks; ++b) {
    const BlockHash hash = seq.hashes[b], parent = parent_of(b);
    const auto toks = toks_of(b);
    if (const BlockId id = pool_.lookup(hash, parent, toks); id >= 0) {
      pool_.ref(id);
      seq.table.push_back(id);
      continue;
    }
    if (tiers_->find(hash, parent, toks) == KvTiers::Where::None) break;
    pinned_.clear();
    if (!pool_.allocate(1, pinned_)) break;
    r.table_index.push_back(static_cast<int>(seq.table.size()));
    seq.table.push_back(pinned_[0]);
    r.items.push_back({hash, parent, std::vector<int32_t>(toks.begin(), toks.end())});
  }
  const int n = static_cast<int>(r.items.size());
  if (n == 0) {  // no free block for even one: as if the tiers had nothing
    free(seq);
    return 0;
  }
  // Pool hits after the last restored block are of no use before it is there; they stay held.
  seq.restore = {};
  seq.restore.begin = std::chrono::steady_clock::now();
  seq.restore.first_block = r.table_index[0];
  seq.restore.pending = n;
  seq.restore.ticket = tiers_->load_async(r.items);
  restores_.emplace(seq.restore.ticket, std::move(r));
  return n;
}

int KvCacheManager::apply_restores(int max_blocks) {
  if (!tiers_ || restores_.empty() || max_blocks <= 0) return 0;
  loaded_.clear();
  tiers_->take_loaded(max_blocks, loaded_);
  // Every loaded block of this step goes into the pool in one batched copy. Items of a ticket
  // arrive in order, and after a failure the rest of its chain is of no use: left out.
  applies_.clear();
  apply_owner_.clear();
  for (size_t k = 0; k < loaded_.size(); ++k) {
    const KvTiers::Loaded& l = loaded_[k];
    auto it = restores_.find(l.ticket);
    if (it == restores_.end()) continue;  // cancelled
    Restore& r = it->second;
    RestoreState& st = r.seq->restore;
    const int ti = r.table_index[static_cast<size_t>(l.index)];
    if (st.failed_at >= 0) continue;
    if (!l.ok) {
      st.failed_at = ti;
      continue;
    }
    applies_.push_back({&l, &r.items[static_cast<size_t>(l.index)], r.seq->table[static_cast<size_t>(ti)]});
    apply_owner_.push_back({&r, ti});
  }
  tiers_->apply_loads(applies_, applied_);
  // A block that was not copied fails its chain from there (the earliest such block wins).
  for (size_t i = 0; i < applies_.size(); ++i) {
    if (applied_[i]) continue;
    RestoreState& st = apply_owner_[i].first->seq->restore;
    const int ti = apply_owner_[i].second;
    if (st.failed_at < 0 || ti < st.failed_at) st.failed_at = ti;
  }
  int copied = 0;
  for (size_t i = 0; i < applies_.size(); ++i) {
    SeqBlocks& seq = *apply_owner_[i].first->seq;
    RestoreState& st = seq.restore;
    const int ti = apply_owner_[i].second;
    if (!applied_[i] || (st.failed_at >= 0 && ti > st.failed_at)) continue;  // past a failure: not used
    const KvTiers::LoadItem& item = *applies_[i].item;
    pool_.publish(seq.table[static_cast<size_t>(ti)], item.hash, item.parent, item.tokens);  // false: a twin was published first; ours stays private
    ++st.blocks;
    if (applies_[i].loaded->from_disk) ++st.from_disk;
    ++copied;
  }
  // Restores whose last block came end (this invalidates the Restore pointers above).
  for (const KvTiers::Loaded& l : loaded_) {
    auto it = restores_.find(l.ticket);
    if (it == restores_.end()) continue;
    SeqBlocks& seq = *it->second.seq;
    if (--seq.restore.pending == 0) end_restore(seq);
  }
  return copied;
}

void KvCacheManager::end_restore(SeqBlocks& seq) {
  RestoreState& st = seq.restore;
  restores_.erase(st.ticket);
  st.ticket = 0;
  st.end = std::chrono::steady_clock::now();
  if (st.failed_at >= 0) {  // keep the prefix before the failed block; recompute the rest
    while (static_cast<int>(seq.table.size()) > st.failed_at) {
      pool_.unref(seq.table.back());
      seq.table.pop_back();
    }
  }
  seq.num_published = static_cast<int>(seq.table.size());
}

void KvCacheManager::set_tiers(KvTiers* tiers) {
  tiers_ = caching_ ? tiers : nullptr;
  if (!tiers_) {
    pool_.set_evict_hook({});
    return;
  }
  // One call per allocate() / expire_idle(): the blocks that need reading are read in one batch.
  pool_.set_evict_hook([t = tiers_](std::span<const CachedBlock> blocks, bool idle) {
    t->demote(blocks, idle ? KvTiers::Why::Idle : KvTiers::Why::Evicted);
  });
}

int KvCacheManager::expire_idle(std::chrono::steady_clock::time_point now, int max_blocks, int64_t ttl_ms) {
  pool_.set_now(now);
  if (!tiers_ || tiers_->config().ttl_ms <= 0) return 0;
  const int64_t ttl = ttl_ms > 0 ? ttl_ms : tiers_->config().ttl_ms;
  const auto cutoff = now - std::chrono::milliseconds(ttl);
  // With the disk writer behind, idle blocks wait here, valid and findable, rather than be
  // demoted past the write queue's bound (and lost from the middle of their chains).
  const int room = tiers_->idle_room();
  if (room < max_blocks)
    if (const int held = pool_.count_idle(cutoff, max_blocks) - room; held > 0) tiers_->count_deferred(held);
  return pool_.expire_idle(cutoff, std::min(max_blocks, room));
}

void KvCacheManager::demote_all_cached() {
  if (!tiers_) return;
  // In batches, so the writer gets to work while the rest are read.
  constexpr size_t kBatch = 64;
  std::vector<CachedBlock> batch;
  batch.reserve(kBatch);
  pool_.for_each_cached([&](BlockId b, BlockHash h, BlockHash p, std::span<const int32_t> toks) {
    batch.push_back(CachedBlock{b, h, p, toks});
    if (batch.size() == kBatch) {
      tiers_->demote(batch, KvTiers::Why::Shutdown);
      batch.clear();
    }
  });
  if (!batch.empty()) tiers_->demote(batch, KvTiers::Why::Shutdown);
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
  if (seq.restoring()) {  // its loads are dropped; blocks not yet copied are unpublished, so go blank
    if (tiers_) tiers_->cancel_load(seq.restore.ticket);
    restores_.erase(seq.restore.ticket);
    seq.restore.ticket = 0;
    seq.restore.pending = 0;
  }
  for (auto it = seq.table.rbegin(); it != seq.table.rend(); ++it) pool_.unref(*it);
  seq.table.clear();
  seq.num_published = 0;
}

}  // namespace ss::engine
