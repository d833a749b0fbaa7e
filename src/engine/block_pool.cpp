#include "engine/block_pool.h"

#include <algorithm>
#include <cassert>
#include <string>

namespace ss::engine {

BlockPool::BlockPool(int num_blocks, int block_size)
    : num_blocks_(num_blocks),
      block_size_(block_size),
      ref_(num_blocks, 0),
      prev_(num_blocks, -1),
      next_(num_blocks, -1),
      where_(num_blocks, kInUse),
      cached_(num_blocks, 0),
      hash_(num_blocks, 0),
      parent_(num_blocks, 0),
      tokens_(static_cast<size_t>(num_blocks) * block_size, -1),
      idle_since_(num_blocks) {
  index_.reserve(num_blocks);
  evicted_.reserve(static_cast<size_t>(num_blocks));
  for (BlockId b = 0; b < num_blocks; ++b) push_back(blank_, kBlank, b);
}

void BlockPool::push_back(List& l, uint8_t tag, BlockId b) {
  where_[b] = tag;
  prev_[b] = l.tail;
  next_[b] = -1;
  if (l.tail >= 0) next_[l.tail] = b; else l.head = b;
  l.tail = b;
  ++l.size;
}

void BlockPool::remove(List& l, BlockId b) {
  if (prev_[b] >= 0) next_[prev_[b]] = next_[b]; else l.head = next_[b];
  if (next_[b] >= 0) prev_[next_[b]] = prev_[b]; else l.tail = prev_[b];
  prev_[b] = next_[b] = -1;
  where_[b] = kInUse;
  --l.size;
}

BlockId BlockPool::pop_front(List& l) {
  const BlockId b = l.head;
  if (b >= 0) remove(l, b);
  return b;
}

void BlockPool::evict(BlockId b) {
  if (!cached_[b]) return;
  if (on_evict_)  // its tokens stay in tokens_ until the block is published again
    evicted_.push_back(CachedBlock{b, hash_[b], parent_[b],
                                   std::span<const int32_t>(tokens_).subspan(static_cast<size_t>(b) * block_size_, block_size_)});
  auto it = index_.find(hash_[b]);
  if (it != index_.end() && it->second == b) index_.erase(it);
  cached_[b] = 0;
  ++evictions_;
}

void BlockPool::report_evicted(bool idle) {
  if (evicted_.empty()) return;
  // Before the blocks are handed out: allocate() returns them, expire_idle() leaves them blank.
  if (on_evict_) on_evict_(std::span<const CachedBlock>(evicted_), idle);
  evicted_.clear();
}

bool BlockPool::allocate(int n, std::vector<BlockId>& out) {
  if (n < 0 || n > num_free()) return false;
  for (int i = 0; i < n; ++i) {
    BlockId b = pop_front(blank_);
    if (b < 0) {
      b = pop_front(lru_);
      evict(b);
    }
    ref_[b] = 1;
    out.push_back(b);
  }
  report_evicted(false);
  return true;
}

void BlockPool::ref(BlockId b) {
  if (ref_[b] == 0) {
    assert(where_[b] == kLru);  // only cached blocks are found unreferenced
    remove(where_[b] == kLru ? lru_ : blank_, b);
  }
  ++ref_[b];
}

void BlockPool::unref(BlockId b) {
  assert(ref_[b] > 0);
  if (--ref_[b] > 0) return;
  idle_since_[b] = now_;
  push_back(cached_[b] ? lru_ : blank_, cached_[b] ? kLru : kBlank, b);
}

int BlockPool::expire_idle(TimePoint cutoff, int max_blocks) {
  int n = 0;
  // The LRU list is in the order blocks became evictable, so the expired ones lead it.
  while (n < max_blocks && lru_.head >= 0 && idle_since_[lru_.head] < cutoff) {
    const BlockId b = pop_front(lru_);
    evict(b);
    push_back(blank_, kBlank, b);
    ++n;
  }
  report_evicted(true);
  return n;
}

int BlockPool::count_idle(TimePoint cutoff, int max_blocks) const {
  int n = 0;
  for (BlockId b = lru_.head; n < max_blocks && b >= 0 && idle_since_[b] < cutoff; b = next_[b]) ++n;
  return n;
}

void BlockPool::for_each_cached(
    const std::function<void(BlockId, BlockHash, BlockHash, std::span<const int32_t>)>& fn) const {
  for (BlockId b = lru_.head; b >= 0; b = next_[b])
    fn(b, hash_[b], parent_[b], std::span<const int32_t>(tokens_).subspan(static_cast<size_t>(b) * block_size_, block_size_));
  for (BlockId b = 0; b < num_blocks_; ++b)
    if (cached_[b] && where_[b] != kLru)
      fn(b, hash_[b], parent_[b], std::span<const int32_t>(tokens_).subspan(static_cast<size_t>(b) * block_size_, block_size_));
}

BlockId BlockPool::lookup(BlockHash hash, BlockHash parent, std::span<const int32_t> tokens) const {
  auto it = index_.find(hash);
  if (it == index_.end()) return -1;
  const BlockId b = it->second;
  if (parent_[b] != parent || static_cast<int>(tokens.size()) != block_size_ ||
      !std::equal(tokens.begin(), tokens.end(), tokens_.begin() + static_cast<size_t>(b) * block_size_))
    return -1;
  return b;
}

bool BlockPool::publish(BlockId b, BlockHash hash, BlockHash parent, std::span<const int32_t> tokens) {
  assert(ref_[b] > 0 && static_cast<int>(tokens.size()) == block_size_);
  if (cached_[b]) return hash_[b] == hash;
  if (!index_.emplace(hash, b).second) return false;
  cached_[b] = 1;
  hash_[b] = hash;
  parent_[b] = parent;
  std::copy(tokens.begin(), tokens.end(), tokens_.begin() + static_cast<size_t>(b) * block_size_);
  return true;
}

Status BlockPool::check() const {
  auto walk = [&](const List& l, uint8_t tag, const char* name) -> Status {
    int n = 0;
    BlockId prev = -1;
    for (BlockId b = l.head; b >= 0; b = next_[b]) {
      if (++n > num_blocks_) return make_error(std::string(name) + " list has a cycle");
      if (where_[b] != tag || ref_[b] != 0 || prev_[b] != prev)
        return make_error(std::string(name) + " list: block " + std::to_string(b) + " is inconsistent");
      if ((tag == kLru) != (cached_[b] != 0))
        return make_error(std::string(name) + " list: block " + std::to_string(b) + " has the wrong cached flag");
      prev = b;
    }
    if (n != l.size || prev != l.tail) return make_error(std::string(name) + " list size/tail mismatch");
    return {};
  };
  SS_TRY(walk(blank_, kBlank, "blank"));
  SS_TRY(walk(lru_, kLru, "lru"));
  int in_use = 0, cached = 0;
  for (BlockId b = 0; b < num_blocks_; ++b) {
    if (ref_[b] < 0) return make_error("block " + std::to_string(b) + " has a negative ref count");
    if (ref_[b] > 0) {
      ++in_use;
      if (where_[b] != kInUse) return make_error("referenced block " + std::to_string(b) + " is on a free list");
    }
    if (cached_[b]) {
      ++cached;
      auto it = index_.find(hash_[b]);
      if (it == index_.end() || it->second != b)
        return make_error("cached block " + std::to_string(b) + " is missing from the index");
    }
  }
  if (in_use != num_used()) return make_error("used count mismatch");
  if (cached != num_cached()) return make_error("index has entries for uncached blocks");
  return {};
}

}  // namespace ss::engine
