// Private to queues/ (include queues.h): a bounded single-producer single-consumer ring.
#pragma once
#include <type_traits>

#include "backend/cuda/queues/platform.h"

namespace ss::queues {

// One producer, one consumer, Capacity slots (a power of two). The producer owns `tail`, the
// consumer owns `head`; each publishes its index with a release store and reads the other's with an
// acquire load. With exactly one writer per slot, the tail IS a safe publish signal: the slot is
// written before the release that makes tail cover it. (With several producers it is not — see
// SeqRing.) Scope names who may be at the two ends: kBlock (shared memory, both in one block),
// kDevice (global memory, one GPU) or kSystem (mapped host memory, one end on the CPU).
//
// Plain storage: place it anywhere both ends can address (shared, global or mapped host memory),
// call init() once before either end starts, and hand out pointers to it.
template <class T, std::uint32_t Capacity, Scope S>
struct SpscRing {
  static_assert(is_pow2(Capacity), "SpscRing capacity must be a power of two");
  static_assert(std::is_trivially_copyable_v<T>, "ring payloads are copied with plain stores");
  static constexpr std::uint64_t kMask = Capacity - 1;

  alignas(kLine) std::uint64_t head;  // next slot to pop; written by the consumer only
  alignas(kLine) std::uint64_t tail;  // next slot to push; written by the producer only
  alignas(kLine) T slots[Capacity];

  SS_QUEUE_HD void init() {
    head = 0;
    tail = 0;
  }

  SS_QUEUE_HD bool try_push(const T& v) {
    AtomicRef<std::uint64_t, S> tail_ref(tail);
    const std::uint64_t t = tail_ref.load(memory_order_relaxed);  // our own index
    // Acquire: the consumer's reads of the slot we are about to overwrite happened before it
    // advanced head past it.
    const std::uint64_t h = AtomicRef<std::uint64_t, S>(head).load(memory_order_acquire);
    if (t - h >= Capacity) return false;
    slots[t & kMask] = v;
    tail_ref.store(t + 1, memory_order_release);  // publishes the slot
    return true;
  }

  SS_QUEUE_HD bool try_pop(T& out) {
    AtomicRef<std::uint64_t, S> head_ref(head);
    const std::uint64_t h = head_ref.load(memory_order_relaxed);
    const std::uint64_t t = AtomicRef<std::uint64_t, S>(tail).load(memory_order_acquire);
    if (h == t) return false;
    out = slots[h & kMask];
    head_ref.store(h + 1, memory_order_release);  // frees the slot for the producer
    return true;
  }

  // Items pushed and not yet popped, as one end sees it (exact only when neither end is moving).
  SS_QUEUE_HD std::uint64_t size() const {
    auto* self = const_cast<SpscRing*>(this);  // atomic_ref needs a mutable object; loads only
    const std::uint64_t t = AtomicRef<std::uint64_t, S>(self->tail).load(memory_order_acquire);
    const std::uint64_t h = AtomicRef<std::uint64_t, S>(self->head).load(memory_order_acquire);
    return t - h;
  }
};

}  // namespace ss::queues
