// The KV tiers' host memory (private to engine/, used by kv_tiers.cpp): one mapping of fixed-size
// chunks, allocated and faulted in once at start-up, so a demotion is a copy into memory that is
// already there. Fresh memory costs ~0.25 ms a block to fault in on the development VM, which was
// most of a demotion's CPU cost when each demoted block got its own heap buffer.
//
// A block's bytes take one chunk when the tier keeps blocks plain (the chunk is a block: restores
// read it in place), or several when it keeps them zstd-compressed (the chunk is a 32nd of a block,
// so a compressed block wastes under a chunk, ~1.5% on average, and the tier holds as many blocks as
// their compressed sizes allow). The chunks of one block need not be adjacent: zstd reads and
// writes them piece by piece, and the disk writer writes them in order.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "common/huge_buffer.h"
#include "common/status.h"

namespace ss::engine {

class HostArena {
 public:
  // floor(bytes / chunk_bytes) chunks, faulted in now; an error if that memory is not there.
  static Expected<std::shared_ptr<HostArena>> create(int64_t bytes, int64_t chunk_bytes);
  HostArena(const HostArena&) = delete;
  HostArena& operator=(const HostArena&) = delete;

  int64_t chunk_bytes() const { return chunk_bytes_; }
  int64_t num_chunks() const { return num_chunks_; }
  int64_t bytes() const { return num_chunks_ * chunk_bytes_; }
  int64_t free_chunks() const;
  // Appends n free chunks to out; false, taking none, if fewer are free. Any thread.
  bool take(int n, std::vector<uint32_t>& out);
  void give(std::span<const uint32_t> chunks);  // any thread; never allocates
  uint8_t* chunk(uint32_t i) const { return mem_.data() + static_cast<size_t>(i) * static_cast<size_t>(chunk_bytes_); }
  // The address range every chunk lies in (tests: a demotion's bytes are the arena's, not new memory).
  const uint8_t* begin() const { return mem_.data(); }
  const uint8_t* end() const { return mem_.data() + bytes(); }

 private:
  HostArena() = default;
  HugeBuffer mem_;
  int64_t chunk_bytes_ = 0, num_chunks_ = 0;
  mutable std::mutex mu_;
  std::vector<uint32_t> free_;  // capacity num_chunks_ from the start
};

// One block's bytes in the arena, plain or zstd-compressed. Shared (immutable once filled) by the
// host index, a queued disk write and a load in flight; the chunks go back to the arena when the
// last holder lets go, on whichever thread that is.
class ArenaBytes {
 public:
  ArenaBytes(std::shared_ptr<HostArena> arena, std::vector<uint32_t> chunks, int64_t size, bool compressed)
      : arena_(std::move(arena)), chunks_(std::move(chunks)), size_(size), compressed_(compressed) {}
  ~ArenaBytes() { arena_->give(chunks_); }
  ArenaBytes(const ArenaBytes&) = delete;
  ArenaBytes& operator=(const ArenaBytes&) = delete;

  int64_t size() const { return size_; }  // the payload (compressed size when compressed)
  bool compressed() const { return compressed_; }
  int64_t held_bytes() const { return static_cast<int64_t>(chunks_.size()) * arena_->chunk_bytes(); }
  int num_pieces() const { return static_cast<int>(chunks_.size()); }
  // Piece i of the payload, in order; the last one may be short.
  std::span<uint8_t> piece(int i) const;
  // The payload as one span when it lies in one chunk, else empty.
  std::span<const uint8_t> contiguous() const { return chunks_.size() == 1 ? piece(0) : std::span<const uint8_t>{}; }
  void copy_in(std::span<const uint8_t> src) const;  // src.size() == size(); while no one else holds it
  void copy_out(std::span<uint8_t> dst) const;       // dst.size() == size()

 private:
  std::shared_ptr<HostArena> arena_;
  std::vector<uint32_t> chunks_;
  int64_t size_;
  bool compressed_;
};
using ArenaBytesRef = std::shared_ptr<const ArenaBytes>;

}  // namespace ss::engine
