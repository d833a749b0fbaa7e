// Private to queues/: the few portability pieces the rings need so that one source compiles for the
// host (g++ or nvcc's host pass) and the device. Include queues.h instead.
#pragma once
#include <cuda/atomic>

#include <cstdint>
#if !defined(__CUDA_ARCH__)
#include <thread>
#endif

#if defined(__CUDACC__)
#define SS_QUEUE_HD __host__ __device__
#else
#define SS_QUEUE_HD
#endif

namespace ss::queues {

using Scope = ::cuda::thread_scope;
inline constexpr Scope kBlock = ::cuda::thread_scope_block;    // both ends in one thread block
inline constexpr Scope kDevice = ::cuda::thread_scope_device;  // both ends on one GPU
inline constexpr Scope kSystem = ::cuda::thread_scope_system;  // one end on the CPU (mapped memory)

template <class T, Scope S>
using AtomicRef = ::cuda::atomic_ref<T, S>;

using ::cuda::std::memory_order_acquire;
using ::cuda::std::memory_order_relaxed;
using ::cuda::std::memory_order_release;

// GPU L2 lines are 128 bytes (host lines 64): counters written by different ends sit on their own
// line so that one end's stores do not invalidate the line the other end polls.
inline constexpr std::size_t kLine = 128;

// Exponential back-off for a caller that found its ring full or empty: the GPU sleeps the warp
// (__nanosleep frees issue slots for the warps doing work), the CPU yields its core.
class Backoff {
 public:
  SS_QUEUE_HD void pause() {
#if defined(__CUDA_ARCH__)
    __nanosleep(ns_);
#else
    if (ns_ >= 256) std::this_thread::yield();
#endif
    ns_ = ns_ < kMaxNs ? ns_ * 2 : kMaxNs;
  }
  SS_QUEUE_HD void reset() { ns_ = kMinNs; }

 private:
  static constexpr unsigned kMinNs = 32, kMaxNs = 2048;
  unsigned ns_ = kMinNs;
};

SS_QUEUE_HD constexpr bool is_pow2(std::uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

}  // namespace ss::queues
