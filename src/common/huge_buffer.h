// A zero-filled anonymous memory mapping that asks for transparent huge pages (madvise, best effort).
// For the big, long-lived arrays the CPU backend walks every step (KV cache, packed weights): with
// 4 KiB pages a decode step over ~100 MB takes a TLB miss every few cache lines, which costs about as
// much as the loads themselves. Pages commit on first touch unless populated; move-only.
#pragma once
#include <cstddef>
#include <cstdint>

namespace ss {

class HugeBuffer {
 public:
  HugeBuffer() = default;
  ~HugeBuffer();
  HugeBuffer(HugeBuffer&& o) noexcept : p_(o.p_), bytes_(o.bytes_) { o.p_ = nullptr, o.bytes_ = 0; }
  HugeBuffer& operator=(HugeBuffer&& o) noexcept;
  HugeBuffer(const HugeBuffer&) = delete;
  HugeBuffer& operator=(const HugeBuffer&) = delete;

  // Maps `bytes` (rounded up to 2 MiB) starting on a 2 MiB boundary; false if the mapping fails
  // (the buffer is then empty). Replaces what was there.
  bool allocate(size_t bytes);
  // Commits the pages of [offset, offset + len) now (they stay zero), so first use pays no page
  // faults; false if the memory is not there. Threads may populate disjoint ranges at once.
  bool populate(size_t offset, size_t len);
  uint8_t* data() const { return p_; }
  size_t size() const { return bytes_; }
  bool empty() const { return p_ == nullptr; }

 private:
  void release();
  uint8_t* p_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace ss
