// A fixed pool of worker threads for data-parallel loops in the CPU backend.
// run/parallel_for block the caller, which works as thread 0. A dispatch allocates nothing (the
// callable is passed by reference) and costs well under a microsecond when the workers are
// spinning: each waits by spinning for a short while before it sleeps, since a decode step issues
// a few hundred dispatches back to back and a sleep/wake pair per dispatch costs several µs.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <type_traits>
#include <utility>
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
  template <class Fn>
  void run(Fn&& fn) {
    using F = std::remove_reference_t<Fn>;
    dispatch(Job{const_cast<void*>(static_cast<const void*>(&fn)),
                 [](void* f, int t) { (*static_cast<F*>(f))(t); }});
  }

  // Splits [0, n) into size() contiguous chunks (aligned to `grain`) and runs fn(begin, end, thread).
  template <class Fn>
  void parallel_for(int64_t n, int64_t grain, Fn&& fn) {
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    const int64_t units = (n + grain - 1) / grain;
    const int nt = n_threads_;
    run([&](int t) {
      const int64_t u0 = units * t / nt, u1 = units * (t + 1) / nt;
      const int64_t b = std::min(n, u0 * grain), e = std::min(n, u1 * grain);
      if (b < e) fn(b, e, t);
    });
  }

 private:
  struct Job {
    void* fn;
    void (*call)(void*, int);
  };
  void dispatch(Job job);
  void worker(int index);

  int n_threads_;
  std::vector<std::thread> threads_;
  Job job_{nullptr, nullptr};
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<int> sleepers_{0};        // workers blocked on cv_
  std::atomic<bool> caller_sleeping_{false};
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::condition_variable cv_;          // workers wait here for a new generation
  std::condition_variable done_cv_;     // the caller waits here for pending_ == 0
};

}  // namespace ss
