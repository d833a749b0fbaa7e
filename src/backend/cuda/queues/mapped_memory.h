// Private to queues/ (include queues.h): host-side owners of the memory that CPU<->GPU rings live
// in. Host code only (needs the CUDA runtime); the ring views they hand out work on both sides.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <string>
#include <utility>

#include "backend/cuda/queues/seq_ring.h"
#include "common/status.h"

namespace ss::queues {

inline Error cuda_error(const char* what, cudaError_t e) {
  return make_error(std::string(what) + ": " + cudaGetErrorString(e));
}

// Pinned host memory mapped into the device's address space (cudaHostAllocMapped): the CPU writes
// it with ordinary stores, the GPU reads it over the bus with no copy and no launch.
class MappedBuffer {
 public:
  MappedBuffer() = default;
  MappedBuffer(MappedBuffer&& o) noexcept { swap(o); }
  MappedBuffer& operator=(MappedBuffer&& o) noexcept {
    MappedBuffer tmp(std::move(o));
    swap(tmp);
    return *this;
  }
  MappedBuffer(const MappedBuffer&) = delete;
  MappedBuffer& operator=(const MappedBuffer&) = delete;
  ~MappedBuffer() {
    if (host_ != nullptr) cudaFreeHost(host_);
  }

  static Expected<MappedBuffer> allocate(std::size_t bytes) {
    MappedBuffer b;
    if (cudaError_t e = cudaHostAlloc(&b.host_, bytes, cudaHostAllocMapped); e != cudaSuccess)
      return cuda_error("cudaHostAlloc(mapped)", e);
    if (cudaError_t e = cudaHostGetDevicePointer(&b.device_, b.host_, 0); e != cudaSuccess)
      return cuda_error("cudaHostGetDevicePointer", e);
    b.bytes_ = bytes;
    return Expected<MappedBuffer>(std::move(b));
  }
  void* host() const { return host_; }
  void* device() const { return device_; }
  std::size_t bytes() const { return bytes_; }

 private:
  void swap(MappedBuffer& o) noexcept {
    std::swap(host_, o.host_);
    std::swap(device_, o.device_);
    std::swap(bytes_, o.bytes_);
  }
  void* host_ = nullptr;
  void* device_ = nullptr;
  std::size_t bytes_ = 0;
};

// Device memory (cudaMalloc), zeroed.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  static Expected<DeviceBuffer> allocate(std::size_t bytes) {
    DeviceBuffer b;
    if (cudaError_t e = cudaMalloc(&b.ptr_, bytes); e != cudaSuccess) return cuda_error("cudaMalloc", e);
    if (cudaError_t e = cudaMemset(b.ptr_, 0, bytes); e != cudaSuccess) return cuda_error("cudaMemset", e);
    return Expected<DeviceBuffer>(std::move(b));
  }
  void* get() const { return ptr_; }

 private:
  void* ptr_ = nullptr;
};

// A ring between the CPU and the GPU: slots in mapped host memory; the producers' counter in the
// producers' memory and the consumers' counter in the consumers' memory (see SeqRing for why).
// Direction::kHostToDevice: CPU threads push (submission), GPU threads pop.
// Direction::kDeviceToHost: GPU threads push (completion), CPU threads pop.
enum class Direction { kHostToDevice, kDeviceToHost };

template <class T, Direction D>
class CrossRing {
 public:
  static constexpr Scope kEnqScope = D == Direction::kHostToDevice ? kSystem : kDevice;
  static constexpr Scope kDeqScope = D == Direction::kHostToDevice ? kDevice : kSystem;
  using Ring = SeqRing<T, kSystem, kEnqScope, kDeqScope>;

  static Expected<CrossRing> create(std::uint32_t capacity) {
    if (!is_pow2(capacity)) return make_error("ring capacity must be a power of two, got " + std::to_string(capacity));
    CrossRing r;
    r.capacity_ = capacity;
    const std::size_t slot_bytes = (sizeof(typename Ring::Slot) * capacity + kLine - 1) / kLine * kLine;
    SS_ASSIGN(r.mapped_, MappedBuffer::allocate(slot_bytes + kLine));  // slots, then the host counter
    SS_ASSIGN(r.device_counter_, DeviceBuffer::allocate(kLine));
    auto* slots = static_cast<typename Ring::Slot*>(r.mapped_.host());
    Ring::init_slots(slots, capacity);
    r.host_counter_ = reinterpret_cast<std::uint64_t*>(static_cast<char*>(r.mapped_.host()) + slot_bytes);
    *r.host_counter_ = 0;
    return Expected<CrossRing>(std::move(r));
  }

  // The view for the CPU end (producers for kHostToDevice, consumers for kDeviceToHost): host
  // addresses; the GPU end's counter is left null (never to be touched from here).
  Ring host_view() const {
    auto* slots = static_cast<typename Ring::Slot*>(mapped_.host());
    return D == Direction::kHostToDevice ? Ring(slots, capacity_, host_counter_, nullptr)
                                         : Ring(slots, capacity_, nullptr, host_counter_);
  }
  // The view for kernels: device addresses of the slots, the device-side counter.
  Ring device_view() const {
    auto* slots = static_cast<typename Ring::Slot*>(mapped_.device());
    auto* counter = static_cast<std::uint64_t*>(device_counter_.get());
    return D == Direction::kHostToDevice ? Ring(slots, capacity_, nullptr, counter)
                                         : Ring(slots, capacity_, counter, nullptr);
  }

 private:
  CrossRing() = default;
  std::uint32_t capacity_ = 0;
  MappedBuffer mapped_;
  DeviceBuffer device_counter_;
  std::uint64_t* host_counter_ = nullptr;
};

template <class T>
using SubmissionRing = CrossRing<T, Direction::kHostToDevice>;
template <class T>
using CompletionRing = CrossRing<T, Direction::kDeviceToHost>;

}  // namespace ss::queues
