#include "common/thread_pool.h"

#include <pthread.h>

#include <algorithm>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define SS_PAUSE() _mm_pause()
#else
#define SS_PAUSE() std::this_thread::yield()
#endif

namespace ss {

namespace {
// Some tens of µs of spinning (a pause is ~40-140 cycles depending on the core): longer than the gap
// between back-to-back dispatches of a forward pass, far shorter than the gap between requests, so
// an idle pool sleeps. Every few pauses the spinner yields, so an oversubscribed machine (more
// runnable threads than cores) still lets the thread we wait for run.
constexpr int kSpinIterations = 1 << 11;
inline void spin_pause(int i) {
  if ((i & 63) == 63)
    std::this_thread::yield();
  else
    SS_PAUSE();
}
}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(std::max(1, n_threads)) {
  for (int i = 1; i < n_threads_; ++i)
    threads_.emplace_back([this, i] {
      pthread_setname_np(pthread_self(), "ss-cpu");
      worker(i);
    });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_.store(true);
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void ThreadPool::worker(int index) {
  uint64_t seen = 0;
  for (;;) {
    uint64_t g = generation_.load(std::memory_order_acquire);
    for (int i = 0; g == seen && i < kSpinIterations && !stop_.load(std::memory_order_relaxed); ++i) {
      spin_pause(i);
      g = generation_.load(std::memory_order_acquire);
    }
    if (g == seen) {
      std::unique_lock<std::mutex> lk(mu_);
      // Announce the sleep before the last check (seq_cst on both sides): the dispatcher either sees
      // a sleeper and notifies under the mutex, or this check sees its new generation.
      sleepers_.fetch_add(1);
      cv_.wait(lk, [&] { return stop_.load() || generation_.load() != seen; });
      sleepers_.fetch_sub(1);
      if (stop_.load()) return;
      g = generation_.load(std::memory_order_acquire);
    }
    if (stop_.load(std::memory_order_relaxed)) return;
    seen = g;
    job_.call(job_.fn, index);
    if (pending_.fetch_sub(1) == 1 && caller_sleeping_.load()) {
      std::lock_guard<std::mutex> lk(mu_);
      done_cv_.notify_one();
    }
  }
}

void ThreadPool::dispatch(Job job) {
  if (n_threads_ == 1) {
    job.call(job.fn, 0);
    return;
  }
  job_ = job;
  pending_.store(n_threads_ - 1);
  generation_.fetch_add(1);  // publishes job_ (seq_cst)
  if (sleepers_.load() > 0) {
    std::lock_guard<std::mutex> lk(mu_);
    cv_.notify_all();
  }
  job.call(job.fn, 0);
  for (int i = 0; pending_.load(std::memory_order_acquire) != 0 && i < kSpinIterations; ++i) spin_pause(i);
  if (pending_.load() != 0) {
    std::unique_lock<std::mutex> lk(mu_);
    caller_sleeping_.store(true);
    done_cv_.wait(lk, [&] { return pending_.load() == 0; });
    caller_sleeping_.store(false);
  }
}

}  // namespace ss
