// The pool must run every index exactly once, across many back-to-back dispatches and after its
// workers have gone to sleep.
#include "common/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <vector>

TEST(ThreadPool, ParallelForCoversEveryIndexOnce) {
  for (int threads : {1, 2, 3, 5}) {
    ss::ThreadPool pool(threads);
    for (int64_t n : {0, 1, 2, 7, 64, 1000, 1023}) {
      for (int64_t grain : {1, 4, 16, 333}) {
        std::vector<std::atomic<int>> hits(n);
        pool.parallel_for(n, grain, [&](int64_t b, int64_t e, int t) {
          ASSERT_GE(t, 0);
          ASSERT_LT(t, threads);
          for (int64_t i = b; i < e; ++i) hits[i]++;
        });
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "n=" << n << " grain=" << grain;
      }
    }
  }
}

TEST(ThreadPool, ManyDispatchesAndWakeAfterSleep) {
  ss::ThreadPool pool(3);
  std::atomic<int64_t> sum{0};
  for (int r = 0; r < 20000; ++r) pool.run([&](int t) { sum += t + 1; });
  EXPECT_EQ(sum.load(), 20000 * 6);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // workers are asleep by now
  pool.run([&](int t) { sum += t + 1; });
  EXPECT_EQ(sum.load(), 20001 * 6);
}
