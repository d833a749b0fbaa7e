#include "engine/kv_host_arena.h"

#include <algorithm>
#include <cassert>
#include <cstring>
#include <limits>
#include <string>

namespace ss::engine {

Expected<std::shared_ptr<HostArena>> HostArena::create(int64_t bytes, int64_t chunk_bytes) {
  if (chunk_bytes <= 0) return make_error("host KV arena: chunk size must be > 0");
  const int64_t n = bytes / chunk_bytes;
  if (n <= 0) return make_error("host KV arena: " + std::to_string(bytes) + " bytes hold no " +
                                std::to_string(chunk_bytes) + "-byte chunk");
  if (n > std::numeric_limits<uint32_t>::max()) return make_error("host KV arena: too many chunks");
  std::shared_ptr<HostArena> a(new HostArena);
  a->chunk_bytes_ = chunk_bytes;
  a->num_chunks_ = n;
  const size_t total = static_cast<size_t>(n) * static_cast<size_t>(chunk_bytes);
  if (!a->mem_.allocate(total) || !a->mem_.populate(0, total))
    return make_error("host KV arena: cannot allocate " + std::to_string(total) + " bytes of host memory (--kv-host-bytes)");
  a->free_.reserve(static_cast<size_t>(n));
  for (int64_t i = n; i-- > 0;) a->free_.push_back(static_cast<uint32_t>(i));  // chunk 0 first: low addresses first
  return a;
}

int64_t HostArena::free_chunks() const {
  std::lock_guard<std::mutex> lk(mu_);
  return static_cast<int64_t>(free_.size());
}

bool HostArena::take(int n, std::vector<uint32_t>& out) {
  std::lock_guard<std::mutex> lk(mu_);
  if (n < 0 || static_cast<size_t>(n) > free_.size()) return false;
  out.insert(out.end(), free_.end() - n, free_.end());
  free_.resize(free_.size() - static_cast<size_t>(n));
  return true;
}

void HostArena::give(std::span<const uint32_t> chunks) {
  std::lock_guard<std::mutex> lk(mu_);
  assert(free_.size() + chunks.size() <= free_.capacity());
  free_.insert(free_.end(), chunks.begin(), chunks.end());
}

std::span<uint8_t> ArenaBytes::piece(int i) const {
  const int64_t cb = arena_->chunk_bytes();
  const int64_t off = static_cast<int64_t>(i) * cb;
  return {arena_->chunk(chunks_[static_cast<size_t>(i)]), static_cast<size_t>(std::min(cb, size_ - off))};
}

void ArenaBytes::copy_in(std::span<const uint8_t> src) const {
  assert(static_cast<int64_t>(src.size()) == size_);
  size_t off = 0;
  for (int i = 0; i < num_pieces(); ++i) {
    const std::span<uint8_t> p = piece(i);
    std::memcpy(p.data(), src.data() + off, p.size());
    off += p.size();
  }
}

void ArenaBytes::copy_out(std::span<uint8_t> dst) const {
  assert(static_cast<int64_t>(dst.size()) == size_);
  size_t off = 0;
  for (int i = 0; i < num_pieces(); ++i) {
    const std::span<uint8_t> p = piece(i);
    std::memcpy(dst.data() + off, p.data(), p.size());
    off += p.size();
  }
}

}  // namespace ss::engine
