// The item the queue tests push: its id, who made it, filler words derived from the id, and a
// checksum over all of it, so a torn, stale or mixed-up read shows as a checksum mismatch.
#pragma once
#include <cstdint>

#include "backend/cuda/queues/queues.h"

namespace ss::queues::test {

struct Item {
  std::uint64_t id;
  std::uint32_t producer;
  std::uint32_t seq;  // the producer's running count: per-producer order checks
  std::uint64_t words[3];
  std::uint64_t check;
};

SS_QUEUE_HD inline std::uint64_t mix64(std::uint64_t x) {  // splitmix64's finalizer
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

SS_QUEUE_HD inline std::uint64_t checksum(const Item& it) {
  std::uint64_t h = mix64(it.id ^ 0x9e3779b97f4a7c15ull);
  h = mix64(h ^ (static_cast<std::uint64_t>(it.producer) << 32 | it.seq));
  for (std::uint64_t w : it.words) h = mix64(h ^ w);
  return h;
}

SS_QUEUE_HD inline Item make_item(std::uint64_t id, std::uint32_t producer, std::uint32_t seq) {
  Item it{};
  it.id = id;
  it.producer = producer;
  it.seq = seq;
  for (int k = 0; k < 3; ++k) it.words[k] = mix64(id * 3 + static_cast<std::uint64_t>(k) + 1);
  it.check = checksum(it);
  return it;
}

SS_QUEUE_HD inline bool intact(const Item& it) {
  if (it.check != checksum(it)) return false;
  for (int k = 0; k < 3; ++k)
    if (it.words[k] != mix64(it.id * 3 + static_cast<std::uint64_t>(k) + 1)) return false;
  return true;
}

}  // namespace ss::queues::test
