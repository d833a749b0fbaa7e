// The rings compiled by the host compiler and driven by std::threads (no GPU involved): FIFO order,
// full/empty at the right counts, no ghost reads of claimed-but-unwritten slots, and under
// contention every item delivered exactly once and intact. On the 2-core CI machine the threads
// oversubscribe the cores, which interleaves them at arbitrary points: a good race finder.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

#include "payload.h"

namespace {

using namespace ss::queues;
using ss::queues::test::Item;
using ss::queues::test::intact;
using ss::queues::test::make_item;

template <class Ring>
struct SeqStorage {  // heap storage for a SeqRing, counters on their own lines
  explicit SeqStorage(std::uint32_t capacity) : slots(capacity) {
    Ring::init_slots(slots.data(), capacity);
    ring = Ring(slots.data(), capacity, &enq.v, &deq.v);
  }
  struct alignas(kLine) Counter {
    std::uint64_t v = 0;
  };
  std::vector<typename Ring::Slot> slots;
  Counter enq, deq;
  Ring ring;
};

TEST(SpscRingHost, FifoFullAndEmptyWithWrapAround) {
  auto r = std::make_unique<SpscRing<std::uint64_t, 8, kSystem>>();
  r->init();
  std::uint64_t v = 0, next_in = 0, next_out = 0;
  EXPECT_FALSE(r->try_pop(v));
  for (int lap = 0; lap < 5; ++lap) {  // 5 laps of 8 slots: positions wrap
    while (r->try_push(next_in)) ++next_in;
    EXPECT_EQ(r->size(), 8u);
    for (int k = 0; k < 8; ++k) {
      ASSERT_TRUE(r->try_pop(v));
      EXPECT_EQ(v, next_out++);
    }
    EXPECT_FALSE(r->try_pop(v));
  }
  EXPECT_EQ(next_in, 40u);
}

TEST(SpscRingHost, TwoThreadsDeliverInOrderAndIntact) {
  constexpr std::uint32_t kItems = 1'000'000;
  auto r = std::make_unique<SpscRing<Item, 64, kSystem>>();
  r->init();
  std::thread producer([&] {
    Backoff b;
    for (std::uint32_t i = 0; i < kItems; ++i) {
      const Item it = make_item(i, 0, i);
      while (!r->try_push(it)) b.pause();
      b.reset();
    }
  });
  std::uint32_t got = 0, bad = 0, out_of_order = 0;
  Backoff b;
  while (got < kItems) {
    Item it;
    if (!r->try_pop(it)) {
      b.pause();
      continue;
    }
    b.reset();
    bad += !intact(it);
    out_of_order += it.id != got;
    ++got;
  }
  producer.join();
  EXPECT_EQ(bad, 0u);
  EXPECT_EQ(out_of_order, 0u);
  EXPECT_EQ(r->size(), 0u);
}

using HostRing = SeqRing<std::uint64_t, kSystem>;

TEST(SeqRingHost, FifoFullAndEmpty) {
  SeqStorage<HostRing> s(4);
  std::uint64_t v = 0;
  EXPECT_FALSE(s.ring.try_pop(v));
  for (std::uint64_t lap = 0; lap < 3; ++lap) {
    for (std::uint64_t k = 0; k < 4; ++k) EXPECT_TRUE(s.ring.try_push(lap * 10 + k));
    EXPECT_FALSE(s.ring.try_push(99)) << "a 4-slot ring accepted a fifth item";
    for (std::uint64_t k = 0; k < 4; ++k) {
      ASSERT_TRUE(s.ring.try_pop(v));
      EXPECT_EQ(v, lap * 10 + k);
    }
    EXPECT_FALSE(s.ring.try_pop(v));
  }
}

// The ghost-task case: producer A reserves slot 0, producer B reserves and fills slot 1. The
// reservation counter says two items exist; a consumer must still see none until A publishes, and
// then both, in order.
TEST(SeqRingHost, ClaimedButUnwrittenSlotIsNeverRead) {
  SeqStorage<HostRing> s(8);
  std::uint64_t pos_a = 0, pos_b = 0, v = 0;
  std::uint64_t* a = s.ring.try_claim(pos_a);
  std::uint64_t* b = s.ring.try_claim(pos_b);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(pos_a, 0u);
  EXPECT_EQ(pos_b, 1u);
  EXPECT_EQ(s.enq.v, 2u);  // the tail index already covers both
  *b = 222;
  s.ring.publish(pos_b);
  EXPECT_FALSE(s.ring.try_pop(v)) << "read a slot that was claimed but not written";
  EXPECT_FALSE(s.ring.ready(0));
  *a = 111;
  s.ring.publish(pos_a);
  ASSERT_TRUE(s.ring.try_pop(v));
  EXPECT_EQ(v, 111u);
  ASSERT_TRUE(s.ring.try_pop(v));
  EXPECT_EQ(v, 222u);
  EXPECT_FALSE(s.ring.try_pop(v));
}

TEST(SeqRingHost, RejectsNothingItShouldAcceptAcrossManyLaps) {
  SeqStorage<HostRing> s(2);
  std::uint64_t v = 0;
  for (std::uint64_t i = 0; i < 10'000; ++i) {
    ASSERT_TRUE(s.ring.try_push(i));
    ASSERT_TRUE(s.ring.try_pop(v));
    ASSERT_EQ(v, i);
  }
}

// Many producers, many consumers (or one consumer on the RMW-free path). Checks: every id exactly
// once, every payload intact, and per consumer the items of one producer in that producer's order
// (each consumer's positions increase, and one producer's positions increase).
void stress(int producers, int consumers, bool single_consumer_path, std::uint32_t capacity) {
  using Ring = SeqRing<Item, kSystem, kSystem, kDevice>;  // the CPU->GPU layout, all on the host here
  const std::uint64_t per_producer = 100'000;
  const std::uint64_t total = per_producer * static_cast<std::uint64_t>(producers);
  SeqStorage<Ring> s(capacity);
  std::vector<std::atomic<std::uint32_t>> seen(total);
  std::atomic<std::uint64_t> popped{0}, bad{0}, out_of_order{0};

  std::vector<std::thread> threads;
  for (int p = 0; p < producers; ++p) {
    threads.emplace_back([&, p] {
      Backoff b;
      for (std::uint64_t k = 0; k < per_producer; ++k) {
        const Item it = make_item(k * static_cast<std::uint64_t>(producers) + static_cast<std::uint64_t>(p),
                                  static_cast<std::uint32_t>(p), static_cast<std::uint32_t>(k));
        while (!s.ring.try_push(it)) b.pause();
        b.reset();
      }
    });
  }
  for (int c = 0; c < consumers; ++c) {
    threads.emplace_back([&] {
      std::vector<std::int64_t> last(static_cast<std::size_t>(producers), -1);
      Backoff b;
      while (popped.load(std::memory_order_relaxed) < total) {
        Item it;
        const bool ok = single_consumer_path ? s.ring.try_pop_single(it) : s.ring.try_pop(it);
        if (!ok) {
          b.pause();
          continue;
        }
        b.reset();
        popped.fetch_add(1, std::memory_order_relaxed);
        if (!intact(it) || it.id >= total || it.producer >= static_cast<std::uint32_t>(producers)) {
          bad.fetch_add(1);
          continue;
        }
        seen[it.id].fetch_add(1, std::memory_order_relaxed);
        auto& l = last[it.producer];
        if (static_cast<std::int64_t>(it.seq) <= l) out_of_order.fetch_add(1);
        l = it.seq;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0u);
  EXPECT_EQ(out_of_order.load(), 0u);
  std::uint64_t missing = 0, duplicated = 0;
  for (auto& n : seen) {
    missing += n.load() == 0;
    duplicated += n.load() > 1;
  }
  EXPECT_EQ(missing, 0u);
  EXPECT_EQ(duplicated, 0u);
  EXPECT_EQ(popped.load(), total);
}

TEST(SeqRingHost, ManyProducersManyConsumersExactlyOnce) { stress(4, 4, false, 64); }
TEST(SeqRingHost, ManyProducersManyConsumersTinyRing) { stress(3, 3, false, 2); }
TEST(SeqRingHost, ManyProducersOneRmwFreeConsumer) { stress(4, 1, true, 32); }

}  // namespace
