// The rings on the GPU (CTest label `gpu`; without a usable device every test reports itself
// skipped): producers and consumers in one resident grid (device memory), inside one block (shared
// memory), and across the bus through mapped host memory in both directions, with std::threads at
// the CPU end. Millions of checksummed items; every id must arrive exactly once and intact.
// SS_QUEUE_TEST_SCALE (default 1) scales the item counts: the sanitizer runs use a small fraction.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "payload.h"

namespace {

using namespace ss::queues;
using ss::queues::test::intact;
using ss::queues::test::Item;
using ss::queues::test::make_item;

#define CUDA_OK(expr)                                                                   \
  do {                                                                                  \
    cudaError_t e_ = (expr);                                                            \
    ASSERT_EQ(e_, cudaSuccess) << #expr << ": " << cudaGetErrorString(e_);             \
  } while (0)

#define SKIP_WITHOUT_GPU()                                              \
  do {                                                                  \
    int n_ = 0;                                                         \
    if (cudaGetDeviceCount(&n_) != cudaSuccess || n_ == 0) {            \
      cudaGetLastError();                                               \
      GTEST_SKIP() << "no CUDA device";                                 \
    }                                                                   \
  } while (0)

std::uint64_t scaled(std::uint64_t n) {
  const char* s = std::getenv("SS_QUEUE_TEST_SCALE");
  const double f = s != nullptr ? std::atof(s) : 1.0;
  const auto v = static_cast<std::uint64_t>(static_cast<double>(n) * (f > 0 ? f : 1.0));
  return v < 64 ? 64 : v;
}

// A kernel that waits on another agent gives up after this long and says so, instead of hanging the
// test run; the host side likewise.
constexpr std::uint64_t kDeadlineNs = 20ull * 1000 * 1000 * 1000;

__device__ std::uint64_t now_ns() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

struct Tally {
  unsigned long long consumed;
  unsigned long long bad;        // checksum mismatch, id out of range or out of order
  unsigned int timed_out;
};

__device__ void record(Tally* t, const Item& it, std::uint64_t n, unsigned int* seen) {
  if (!intact(it) || it.id >= n) {
    atomicAdd(&t->bad, 1ull);
  } else {
    atomicAdd(&seen[it.id], 1u);
  }
}

struct DeviceTally {  // Tally + the per-id counters, in device memory
  Tally* tally = nullptr;
  unsigned int* seen = nullptr;
  std::uint64_t n = 0;
  ~DeviceTally() {
    cudaFree(tally);
    cudaFree(seen);
  }
};

void alloc_tally(DeviceTally& d, std::uint64_t n) {
  d.n = n;
  CUDA_OK(cudaMalloc(&d.tally, sizeof(Tally)));
  CUDA_OK(cudaMemset(d.tally, 0, sizeof(Tally)));
  CUDA_OK(cudaMalloc(&d.seen, n * sizeof(unsigned int)));
  CUDA_OK(cudaMemset(d.seen, 0, n * sizeof(unsigned int)));
}

void expect_exactly_once(const DeviceTally& d) {
  Tally t{};
  std::vector<unsigned int> seen(d.n);
  CUDA_OK(cudaMemcpy(&t, d.tally, sizeof t, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(seen.data(), d.seen, d.n * sizeof(unsigned int), cudaMemcpyDeviceToHost));
  EXPECT_EQ(t.timed_out, 0u) << "a kernel gave up waiting (deadlock or lost item)";
  EXPECT_EQ(t.bad, 0u) << "torn, stale or out-of-range items";
  std::uint64_t missing = 0, duplicated = 0;
  for (unsigned int c : seen) {
    missing += c == 0;
    duplicated += c > 1;
  }
  EXPECT_EQ(missing, 0u);
  EXPECT_EQ(duplicated, 0u);
}

// Bad input is an error a caller can act on, found before any CUDA call (so this runs without a GPU).
TEST(CrossRing, RejectsACapacityThatIsNotAPowerOfTwo) {
  for (std::uint32_t bad : {0u, 3u, 100u}) {
    auto r = SubmissionRing<Item>::create(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.message().find("power of two"), std::string::npos) << r.message();
    auto c = CompletionRing<Item>::create(bad);
    EXPECT_FALSE(c.ok()) << bad;
  }
}

// ---- many producers, many consumers, one GPU ------------------------------------------------
using DeviceRing = SeqRing<Item, kDevice>;

__global__ void mpmc_kernel(DeviceRing ring, unsigned int producer_blocks, std::uint64_t n, Tally* tally,
                            unsigned int* seen) {
  const std::uint64_t start = now_ns();
  Backoff b;
  if (blockIdx.x < producer_blocks) {
    const std::uint64_t producers = static_cast<std::uint64_t>(producer_blocks) * blockDim.x;
    const std::uint64_t me = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    std::uint32_t k = 0;
    for (std::uint64_t id = me; id < n; id += producers, ++k) {
      const Item it = make_item(id, static_cast<std::uint32_t>(me), k);
      while (!ring.try_push(it)) {
        if (now_ns() - start > kDeadlineNs) {
          atomicExch(&tally->timed_out, 1u);
          return;
        }
        b.pause();
      }
      b.reset();
    }
    return;
  }
  AtomicRef<unsigned long long, kDevice> consumed(tally->consumed);
  while (consumed.load(memory_order_relaxed) < n) {
    Item it;
    if (ring.try_pop(it)) {
      b.reset();
      record(tally, it, n, seen);
      consumed.fetch_add(1, memory_order_relaxed);
    } else {
      if (now_ns() - start > kDeadlineNs) {
        atomicExch(&tally->timed_out, 1u);
        return;
      }
      b.pause();
    }
  }
}

// Producers spin on consumers of the same launch, so all blocks must be resident at once: a
// cooperative launch guarantees it (or refuses).
template <class... Args>
cudaError_t launch_resident(void (*kernel)(Args...), unsigned int blocks, unsigned int threads, Args... args) {
  void* argv[] = {static_cast<void*>(&args)...};
  return cudaLaunchCooperativeKernel(reinterpret_cast<void*>(kernel), dim3(blocks), dim3(threads), argv, 0, nullptr);
}

TEST(GpuQueues, DeviceMpmcManyProducersManyConsumers) {
  SKIP_WITHOUT_GPU();
  for (std::uint32_t capacity : {1024u, 32u}) {  // roomy, and small enough to be full most of the time
    SCOPED_TRACE("capacity " + std::to_string(capacity));
    const std::uint64_t n = scaled(capacity > 32 ? 4'000'000 : 1'000'000);
    DeviceTally d;
    alloc_tally(d, n);
    std::vector<DeviceRing::Slot> init(capacity);
    DeviceRing::init_slots(init.data(), capacity);
    DeviceRing::Slot* slots = nullptr;
    std::uint64_t* counters = nullptr;  // enq and deq, a line apart
    CUDA_OK(cudaMalloc(&slots, capacity * sizeof(DeviceRing::Slot)));
    CUDA_OK(cudaMemcpy(slots, init.data(), capacity * sizeof(DeviceRing::Slot), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMalloc(&counters, 2 * kLine));
    CUDA_OK(cudaMemset(counters, 0, 2 * kLine));
    DeviceRing ring(slots, capacity, counters, counters + kLine / sizeof(std::uint64_t));
    int sms = 0;
    CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const unsigned int blocks = 2 * static_cast<unsigned int>(sms < 32 ? sms : 32);  // ≤ 1 per SM each role
    CUDA_OK(launch_resident(mpmc_kernel, blocks, 128u, ring, blocks / 2, n, d.tally, d.seen));
    CUDA_OK(cudaDeviceSynchronize());
    expect_exactly_once(d);
    cudaFree(slots);
    cudaFree(counters);
  }
}

// ---- SPSC: inside one block (shared memory, block scope) and between blocks (global) ---------
__global__ void block_spsc_kernel(std::uint32_t n, Tally* tally, unsigned int* seen) {
  __shared__ SpscRing<Item, 16, kBlock> ring;
  if (threadIdx.x == 0) ring.init();
  __syncthreads();
  const std::uint64_t start = now_ns();
  const std::uint64_t base = static_cast<std::uint64_t>(blockIdx.x) * n;
  Backoff b;
  if (threadIdx.x == 0) {  // warp 0 produces
    for (std::uint32_t i = 0; i < n; ++i) {
      const Item it = make_item(base + i, blockIdx.x, i);
      while (!ring.try_push(it)) {
        if (now_ns() - start > kDeadlineNs) { atomicExch(&tally->timed_out, 1u); return; }
        b.pause();
      }
      b.reset();
    }
  } else if (threadIdx.x == 32) {  // warp 1 consumes, in order
    for (std::uint32_t i = 0; i < n;) {
      Item it;
      if (!ring.try_pop(it)) {
        if (now_ns() - start > kDeadlineNs) { atomicExch(&tally->timed_out, 1u); return; }
        b.pause();
        continue;
      }
      b.reset();
      if (it.id != base + i) atomicAdd(&tally->bad, 1ull);
      record(tally, it, static_cast<std::uint64_t>(gridDim.x) * n, seen);
      ++i;
    }
  }
}

TEST(GpuQueues, BlockScopeSpscInSharedMemory) {
  SKIP_WITHOUT_GPU();
  const unsigned int blocks = 64;
  const auto per_block = static_cast<std::uint32_t>(scaled(40'000));
  DeviceTally d;
  alloc_tally(d, static_cast<std::uint64_t>(blocks) * per_block);
  block_spsc_kernel<<<blocks, 64>>>(per_block, d.tally, d.seen);
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaDeviceSynchronize());
  expect_exactly_once(d);
}

using GlobalSpsc = SpscRing<Item, 64, kDevice>;

__global__ void pair_spsc_kernel(GlobalSpsc* rings, std::uint32_t n, Tally* tally, unsigned int* seen) {
  if (threadIdx.x != 0) return;
  GlobalSpsc& ring = rings[blockIdx.x / 2];
  const std::uint64_t base = static_cast<std::uint64_t>(blockIdx.x / 2) * n;
  const std::uint64_t start = now_ns();
  Backoff b;
  if (blockIdx.x % 2 == 0) {
    for (std::uint32_t i = 0; i < n; ++i) {
      const Item it = make_item(base + i, blockIdx.x, i);
      while (!ring.try_push(it)) {
        if (now_ns() - start > kDeadlineNs) { atomicExch(&tally->timed_out, 1u); return; }
        b.pause();
      }
      b.reset();
    }
  } else {
    for (std::uint32_t i = 0; i < n;) {
      Item it;
      if (!ring.try_pop(it)) {
        if (now_ns() - start > kDeadlineNs) { atomicExch(&tally->timed_out, 1u); return; }
        b.pause();
        continue;
      }
      b.reset();
      if (it.id != base + i) atomicAdd(&tally->bad, 1ull);
      record(tally, it, static_cast<std::uint64_t>(gridDim.x / 2) * n, seen);
      ++i;
    }
  }
}

TEST(GpuQueues, DeviceSpscBetweenBlocks) {
  SKIP_WITHOUT_GPU();
  const unsigned int pairs = 32;
  const auto per_pair = static_cast<std::uint32_t>(scaled(50'000));
  DeviceTally d;
  alloc_tally(d, static_cast<std::uint64_t>(pairs) * per_pair);
  GlobalSpsc* rings = nullptr;
  CUDA_OK(cudaMalloc(&rings, pairs * sizeof(GlobalSpsc)));
  CUDA_OK(cudaMemset(rings, 0, pairs * sizeof(GlobalSpsc)));  // == init(): head = tail = 0
  CUDA_OK(launch_resident(pair_spsc_kernel, 2 * pairs, 32u, rings, per_pair, d.tally, d.seen));
  CUDA_OK(cudaDeviceSynchronize());
  expect_exactly_once(d);
  cudaFree(rings);
}

// ---- CPU -> GPU: host threads submit, GPU threads consume -----------------------------------
using Submission = SubmissionRing<Item>;

__global__ void submission_consumer_kernel(Submission::Ring ring, bool single, std::uint64_t n, Tally* tally,
                                           unsigned int* seen) {
  const std::uint64_t start = now_ns();
  AtomicRef<unsigned long long, kDevice> consumed(tally->consumed);
  Backoff b;
  while (consumed.load(memory_order_relaxed) < n) {
    Item it;
    if (single ? ring.try_pop_single(it) : ring.try_pop(it)) {
      b.reset();
      record(tally, it, n, seen);
      consumed.fetch_add(1, memory_order_relaxed);
    } else {
      if (now_ns() - start > kDeadlineNs) { atomicExch(&tally->timed_out, 1u); return; }
      b.pause();
    }
  }
}

void host_producers(Submission::Ring ring, int threads, std::uint64_t n, std::atomic<bool>& gave_up) {
  std::vector<std::thread> ts;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::nanoseconds(kDeadlineNs);
  for (int p = 0; p < threads; ++p) {
    ts.emplace_back([&, ring, p] {
      Submission::Ring r = ring;
      Backoff b;
      std::uint32_t k = 0;
      for (std::uint64_t id = static_cast<std::uint64_t>(p); id < n; id += static_cast<std::uint64_t>(threads), ++k) {
        const Item it = make_item(id, static_cast<std::uint32_t>(p), k);
        while (!r.try_push(it)) {
          if (std::chrono::steady_clock::now() > deadline) { gave_up = true; return; }
          b.pause();
        }
        b.reset();
      }
    });
  }
  for (auto& t : ts) t.join();
}

void run_submission(bool single_consumer, unsigned int blocks, unsigned int threads, std::uint64_t n) {
  auto ring = Submission::create(256);
  ASSERT_TRUE(ring.ok()) << ring.message();
  DeviceTally d;
  alloc_tally(d, n);
  submission_consumer_kernel<<<blocks, threads>>>(ring->device_view(), single_consumer, n, d.tally, d.seen);
  CUDA_OK(cudaGetLastError());
  std::atomic<bool> gave_up{false};
  host_producers(ring->host_view(), 4, n, gave_up);  // while the kernel polls
  EXPECT_FALSE(gave_up.load()) << "host producers found the ring full for too long";
  CUDA_OK(cudaDeviceSynchronize());
  expect_exactly_once(d);
}

TEST(GpuQueues, HostToDeviceManyConsumers) {
  SKIP_WITHOUT_GPU();
  // 256 consumers: enough to contend on the device counter without saturating the bus with polls.
  run_submission(false, 8, 32, scaled(1'000'000));
}

TEST(GpuQueues, HostToDeviceSingleConsumerNoDeviceRmw) {
  SKIP_WITHOUT_GPU();
  run_submission(true, 1, 1, scaled(200'000));
}

// ---- GPU -> CPU: GPU threads complete, host threads consume ---------------------------------
using Completion = CompletionRing<Item>;

__global__ void completion_producer_kernel(Completion::Ring ring, std::uint64_t n, Tally* tally) {
  const std::uint64_t start = now_ns();
  const std::uint64_t producers = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  const std::uint64_t me = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  Backoff b;
  std::uint32_t k = 0;
  for (std::uint64_t id = me; id < n; id += producers, ++k) {
    std::uint64_t pos;
    Item* slot;
    while ((slot = ring.try_claim(pos)) == nullptr) {
      if (now_ns() - start > kDeadlineNs) { atomicExch(&tally->timed_out, 1u); return; }
      b.pause();
    }
    b.reset();
    *slot = make_item(id, static_cast<std::uint32_t>(me), k);  // written in place, over the bus
    ring.publish(pos);
  }
}

TEST(GpuQueues, DeviceToHostManyProducersManyHostConsumers) {
  SKIP_WITHOUT_GPU();
  const std::uint64_t n = scaled(1'000'000);
  auto ring = Completion::create(1024);
  ASSERT_TRUE(ring.ok()) << ring.message();
  Tally* tally = nullptr;
  CUDA_OK(cudaMalloc(&tally, sizeof(Tally)));
  CUDA_OK(cudaMemset(tally, 0, sizeof(Tally)));
  completion_producer_kernel<<<8, 64>>>(ring->device_view(), n, tally);
  CUDA_OK(cudaGetLastError());

  std::vector<std::atomic<std::uint32_t>> seen(n);
  std::atomic<std::uint64_t> popped{0}, bad{0};
  std::atomic<bool> gave_up{false};
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::nanoseconds(kDeadlineNs);
  std::vector<std::thread> consumers;
  for (int c = 0; c < 4; ++c) {
    consumers.emplace_back([&, r = ring->host_view()]() mutable {
      Backoff b;
      while (popped.load(std::memory_order_relaxed) < n) {
        Item it;
        if (!r.try_pop(it)) {
          if (std::chrono::steady_clock::now() > deadline) { gave_up = true; return; }
          b.pause();
          continue;
        }
        b.reset();
        popped.fetch_add(1, std::memory_order_relaxed);
        if (!intact(it) || it.id >= n) { bad.fetch_add(1); continue; }
        seen[it.id].fetch_add(1, std::memory_order_relaxed);
      }
    });
  }
  for (auto& t : consumers) t.join();
  CUDA_OK(cudaDeviceSynchronize());
  Tally t{};
  CUDA_OK(cudaMemcpy(&t, tally, sizeof t, cudaMemcpyDeviceToHost));
  cudaFree(tally);
  EXPECT_FALSE(gave_up.load());
  EXPECT_EQ(t.timed_out, 0u);
  EXPECT_EQ(bad.load(), 0u);
  std::uint64_t missing = 0, duplicated = 0;
  for (auto& s : seen) {
    missing += s.load() == 0;
    duplicated += s.load() > 1;
  }
  EXPECT_EQ(missing, 0u);
  EXPECT_EQ(duplicated, 0u);
}

// ---- the executor's round trip: CPU submits, GPU works, GPU completes, CPU collects ----------
__global__ void echo_kernel(Submission::Ring in, Completion::Ring out, std::uint64_t n, Tally* tally) {
  const std::uint64_t start = now_ns();
  AtomicRef<unsigned long long, kDevice> taken(tally->consumed);
  Backoff b;
  while (taken.load(memory_order_relaxed) < n) {
    Item it;
    if (!in.try_pop(it)) {
      if (now_ns() - start > kDeadlineNs) { atomicExch(&tally->timed_out, 1u); return; }
      b.pause();
      continue;
    }
    b.reset();
    taken.fetch_add(1, memory_order_relaxed);
    if (!intact(it)) atomicAdd(&tally->bad, 1ull);
    // The answer: a fresh item for the same id, made on the device (its own checksum).
    const Item answer = make_item(it.id, 0xffffffffu - it.producer, it.seq);
    while (!out.try_push(answer)) {
      if (now_ns() - start > kDeadlineNs) { atomicExch(&tally->timed_out, 1u); return; }
      b.pause();
    }
  }
}

TEST(GpuQueues, HostSubmitsGpuCompletesHostCollects) {
  SKIP_WITHOUT_GPU();
  const std::uint64_t n = scaled(500'000);
  auto in = Submission::create(128);
  auto out = Completion::create(128);
  ASSERT_TRUE(in.ok()) << in.message();
  ASSERT_TRUE(out.ok()) << out.message();
  Tally* tally = nullptr;
  CUDA_OK(cudaMalloc(&tally, sizeof(Tally)));
  CUDA_OK(cudaMemset(tally, 0, sizeof(Tally)));
  echo_kernel<<<8, 32>>>(in->device_view(), out->device_view(), n, tally);
  CUDA_OK(cudaGetLastError());

  std::vector<std::atomic<std::uint32_t>> seen(n);
  std::atomic<std::uint64_t> collected{0}, bad{0};
  std::atomic<bool> gave_up{false};
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::nanoseconds(kDeadlineNs);
  std::vector<std::thread> collectors;
  for (int c = 0; c < 2; ++c) {
    collectors.emplace_back([&, r = out->host_view()]() mutable {
      Backoff bo;
      while (collected.load(std::memory_order_relaxed) < n) {
        Item it;
        if (!r.try_pop(it)) {
          if (std::chrono::steady_clock::now() > deadline) { gave_up = true; return; }
          bo.pause();
          continue;
        }
        bo.reset();
        collected.fetch_add(1, std::memory_order_relaxed);
        if (!intact(it) || it.id >= n || it.producer < 0xffffffffu - 1u) { bad.fetch_add(1); continue; }
        seen[it.id].fetch_add(1, std::memory_order_relaxed);
      }
    });
  }
  host_producers(in->host_view(), 2, n, gave_up);
  for (auto& t : collectors) t.join();
  CUDA_OK(cudaDeviceSynchronize());
  Tally t{};
  CUDA_OK(cudaMemcpy(&t, tally, sizeof t, cudaMemcpyDeviceToHost));
  cudaFree(tally);
  EXPECT_FALSE(gave_up.load());
  EXPECT_EQ(t.timed_out, 0u);
  EXPECT_EQ(t.bad, 0u) << "submissions arrived torn on the device";
  EXPECT_EQ(bad.load(), 0u) << "completions arrived torn on the host";
  std::uint64_t missing = 0, duplicated = 0;
  for (auto& c : seen) {
    missing += c.load() == 0;
    duplicated += c.load() > 1;
  }
  EXPECT_EQ(missing, 0u);
  EXPECT_EQ(duplicated, 0u);
}

}  // namespace
