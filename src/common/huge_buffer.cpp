#include "common/huge_buffer.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>

namespace ss {

namespace {
constexpr size_t kHuge = size_t{2} << 20;
}

HugeBuffer::~HugeBuffer() { release(); }

HugeBuffer& HugeBuffer::operator=(HugeBuffer&& o) noexcept {
  if (this != &o) {
    release();
    p_ = o.p_, bytes_ = o.bytes_;
    o.p_ = nullptr, o.bytes_ = 0;
  }
  return *this;
}

void HugeBuffer::release() {
  if (p_) munmap(p_, bytes_);
  p_ = nullptr;
  bytes_ = 0;
}

bool HugeBuffer::allocate(size_t bytes) {
  release();
  if (bytes == 0 || bytes > (SIZE_MAX >> 2)) return false;
  const size_t n = (bytes + kHuge - 1) / kHuge * kHuge;
  // Over-map by one huge page, then trim, so the kept range starts on a 2 MiB boundary. No
  // MAP_NORESERVE: an impossible size fails here, with a clear error, not later in the OOM killer.
  void* m = mmap(nullptr, n + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return false;
  auto* base = static_cast<uint8_t*>(m);
  const size_t lead = (kHuge - reinterpret_cast<uintptr_t>(base) % kHuge) % kHuge;
  if (lead) munmap(base, lead);
  if (kHuge - lead) munmap(base + lead + n, kHuge - lead);
  p_ = base + lead;
  bytes_ = n;
  (void)madvise(p_, n, MADV_HUGEPAGE);  // a hint: without THP the memory works the same
  return true;
}

bool HugeBuffer::populate(size_t offset, size_t len) {
  if (offset >= bytes_) return len == 0;
  len = std::min(len, bytes_ - offset);
  uint8_t* b = p_ + offset / 4096 * 4096;
  const size_t n = static_cast<size_t>(p_ + offset + len - b);
  // MADV_POPULATE_WRITE (Linux 5.14) faults the range in writable, huge pages kept; on an older
  // kernel, touch one byte per page (writing a zero over a zero page changes no content).
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
  if (madvise(b, n, MADV_POPULATE_WRITE) == 0) return true;
  if (errno != EINVAL) return false;
  for (size_t i = 0; i < n; i += 4096) static_cast<volatile uint8_t*>(b)[i] = 0;
  return true;
}

}  // namespace ss
