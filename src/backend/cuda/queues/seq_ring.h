// Private to queues/ (include queues.h): a bounded multi-producer multi-consumer ring whose slots
// carry their own sequence numbers (D. Vyukov's bounded MPMC queue).
#pragma once
#include <type_traits>

#include "backend/cuda/queues/platform.h"

namespace ss::queues {

template <class T>
struct SeqSlot {
  std::uint64_t seq;  // == pos: free for the push at pos; == pos+1: holds the item pushed at pos
  T value;
};

// Why per-slot sequence numbers: with several producers, "tail" only says that a slot was
// *reserved*. A consumer that reads up to tail can read a slot whose producer has claimed it but not
// yet written it (a ghost task). Here a slot is readable only once its own seq says so, and the
// producer sets that seq with a release store after writing the payload.
//
// The ring is a view over three pieces of storage that may live in different memories, because an
// atomic read-modify-write is only atomic among the agents that share the memory it targets (a GPU's
// atomics on mapped host memory are not atomic with respect to the CPU over PCIe):
//   slots    – read and written (loads/stores only, no RMW) by both ends: SlotScope;
//   enq      – the producers' reservation counter, CAS'd by producers only: EnqScope;
//   deq      – the consumers' counter, CAS'd by consumers only: DeqScope.
// So a CPU→GPU ring keeps slots in mapped host memory (kSystem), enq in host memory (CPU producers)
// and deq in device memory (GPU consumers, kDevice); a GPU→CPU ring mirrors that. Only the slot seq
// words carry ordering between the two ends; the counters are relaxed (they only arbitrate among
// one end's agents), as in the original algorithm.
//
// The view is trivially copyable: pass it to kernels by value. Every index is a 64-bit position that
// never wraps in practice; slot = pos & (capacity-1).
template <class T, Scope SlotScope, Scope EnqScope = SlotScope, Scope DeqScope = SlotScope>
class SeqRing {
  static_assert(std::is_trivially_copyable_v<T>, "ring payloads are copied with plain stores");

 public:
  using Slot = SeqSlot<T>;

  SeqRing() = default;
  SS_QUEUE_HD SeqRing(Slot* slots, std::uint32_t capacity, std::uint64_t* enq, std::uint64_t* deq)
      : slots_(slots), mask_(capacity - 1), enq_(enq), deq_(deq) {}

  // Before either end starts: slot i free for the push at position i. `capacity` must be a power of
  // two (checked by the owners that allocate rings: make_* in mapped_memory.h and the tests).
  SS_QUEUE_HD static void init_slots(Slot* slots, std::uint32_t capacity) {
    for (std::uint32_t i = 0; i < capacity; ++i) slots[i].seq = i;
  }

  SS_QUEUE_HD std::uint32_t capacity() const { return static_cast<std::uint32_t>(mask_ + 1); }

  // ---- producers ----------------------------------------------------------------------------
  // Reserves the next slot: returns its payload to be written in place and sets `pos`, or nullptr
  // when the ring is full. The slot stays invisible to consumers until publish(pos).
  SS_QUEUE_HD T* try_claim(std::uint64_t& pos) {
    AtomicRef<std::uint64_t, EnqScope> enq(*enq_);
    std::uint64_t p = enq.load(memory_order_relaxed);
    for (;;) {
      Slot& s = slots_[p & mask_];
      // Acquire: the consumer that last freed this slot finished reading it.
      const std::uint64_t seq = AtomicRef<std::uint64_t, SlotScope>(s.seq).load(memory_order_acquire);
      const auto diff = static_cast<std::int64_t>(seq - p);
      if (diff == 0) {
        if (enq.compare_exchange_weak(p, p + 1, memory_order_relaxed, memory_order_relaxed)) {
          pos = p;
          return &s.value;
        }
        // p now holds the counter's current value: retry there.
      } else if (diff < 0) {
        return nullptr;  // the slot still holds the item from one lap ago: full
      } else {
        p = enq.load(memory_order_relaxed);  // another producer took p: catch up
      }
    }
  }

  SS_QUEUE_HD void publish(std::uint64_t pos) {
    AtomicRef<std::uint64_t, SlotScope>(slots_[pos & mask_].seq).store(pos + 1, memory_order_release);
  }

  SS_QUEUE_HD bool try_push(const T& v) {
    std::uint64_t pos;
    T* dst = try_claim(pos);
    if (dst == nullptr) return false;
    *dst = v;
    publish(pos);
    return true;
  }

  // ---- consumers (any number) ---------------------------------------------------------------
  SS_QUEUE_HD bool try_pop(T& out) {
    AtomicRef<std::uint64_t, DeqScope> deq(*deq_);
    std::uint64_t p = deq.load(memory_order_relaxed);
    for (;;) {
      Slot& s = slots_[p & mask_];
      // Acquire pairs with publish(): the payload written before it is visible below.
      const std::uint64_t seq = AtomicRef<std::uint64_t, SlotScope>(s.seq).load(memory_order_acquire);
      const auto diff = static_cast<std::int64_t>(seq - (p + 1));
      if (diff == 0) {
        if (deq.compare_exchange_weak(p, p + 1, memory_order_relaxed, memory_order_relaxed)) {
          out = s.value;
          retire(p);
          return true;
        }
      } else if (diff < 0) {
        return false;  // not yet published (possibly claimed): empty as far as we may know
      } else {
        p = deq.load(memory_order_relaxed);
      }
    }
  }

  // ---- the single-consumer path: no RMW, so `deq` may even be a register ---------------------
  // ready(pos): the item at pos is published. value(pos): read it (only after ready). retire(pos):
  // hand the slot back to producers (after the payload has been read). A consumer can test several
  // positions at once (one lane each) and so pay one round trip for many items over PCIe.
  SS_QUEUE_HD bool ready(std::uint64_t pos) const {
    return AtomicRef<std::uint64_t, SlotScope>(slots_[pos & mask_].seq).load(memory_order_acquire) ==
           pos + 1;
  }
  SS_QUEUE_HD const T& value(std::uint64_t pos) const { return slots_[pos & mask_].value; }
  SS_QUEUE_HD void retire(std::uint64_t pos) {
    // Release: our reads of the payload happen before a producer may overwrite it.
    AtomicRef<std::uint64_t, SlotScope>(slots_[pos & mask_].seq)
        .store(pos + mask_ + 1, memory_order_release);
  }

  // Whether try_pop_single would take an item now (single consumer; nothing is taken).
  SS_QUEUE_HD bool can_pop_single() const { return ready(*deq_); }

  // Single consumer that keeps its position in *deq (only it touches it).
  SS_QUEUE_HD bool try_pop_single(T& out) {
    const std::uint64_t p = *deq_;
    if (!ready(p)) return false;
    out = value(p);
    retire(p);
    *deq_ = p + 1;
    return true;
  }

  SS_QUEUE_HD Slot* slots() const { return slots_; }

 private:
  Slot* slots_ = nullptr;
  std::uint64_t mask_ = 0;
  std::uint64_t* enq_ = nullptr;
  std::uint64_t* deq_ = nullptr;
};

}  // namespace ss::queues
