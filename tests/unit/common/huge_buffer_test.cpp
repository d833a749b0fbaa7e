// HugeBuffer: 2 MiB-aligned zeroed mappings; populate commits pages without changing their content.
#include "common/huge_buffer.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <thread>

TEST(HugeBuffer, AlignedZeroedAndPopulatedInParts) {
  ss::HugeBuffer b;
  ASSERT_TRUE(b.allocate(5 << 20));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % (2 << 20), 0u);
  EXPECT_EQ(b.size(), size_t{6} << 20);  // rounded up to whole huge pages
  b.data()[12345] = 7;
  // Two threads, disjoint unaligned ranges that cover the buffer, as the CPU backend does.
  const size_t half = b.size() / 2 + 1000;
  bool ok0 = false, ok1 = false;
  std::thread t([&] { ok1 = b.populate(half, b.size() - half); });
  ok0 = b.populate(0, half);
  t.join();
  EXPECT_TRUE(ok0 && ok1);
  EXPECT_EQ(b.data()[12345], 7) << "populate changed content";
  for (size_t i = 0; i < b.size(); i += 4096)
    ASSERT_EQ(b.data()[i], 0) << i;
  EXPECT_TRUE(b.populate(b.size() - 10, 1000)) << "a range past the end is clipped";
  EXPECT_TRUE(b.populate(b.size(), 0));
  EXPECT_FALSE(b.populate(b.size() + 4096, 10)) << "a range wholly outside is refused";
}

TEST(HugeBuffer, ImpossibleSizeFailsCleanly) {
  ss::HugeBuffer b;
  EXPECT_FALSE(b.allocate(0));
  EXPECT_FALSE(b.allocate(SIZE_MAX / 2));
  EXPECT_TRUE(b.empty());
  EXPECT_FALSE(b.populate(0, 10));
}
