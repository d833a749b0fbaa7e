// A fixed pool of worker threads for data-parallel loops in the CPU backend.
// parallel_for blocks the caller, which works as thread 0; no allocation per call.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace ss {

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);  // n_threads >= 1, including the caller
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }
  // Runs fn(thread_index) on every thread (0..size()-1) and waits for all.
  void run(const std::function<void(int)>& fn);
  // Splits [0, n) into size() contiguous chunks (aligned to `grain`) and runs fn(begin, end, thread).
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t, int)>& fn);

 private:
  void worker(int index);
  int n_threads_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_;
  const std::function<void(int)>* job_ = nullptr;
  uint64_t generation_ = 0;
  std::atomic<int> pending_{0};
  bool stop_ = false;
};

}  // namespace ss
