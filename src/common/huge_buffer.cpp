#include "common/huge_buffer.h"

#include <sys/mman.h>

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

}  // namespace ss
