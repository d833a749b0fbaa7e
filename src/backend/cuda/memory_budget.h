// The CUDA backend's KV cache size at start-up, as vLLM reads --gpu-memory-utilization: this process
// may hold `util` of the card's memory in all. What it already holds (weights, cuBLAS workspace:
// free memory when it started minus free memory now) and its scratch come off that share; the rest
// is KV blocks. Other processes on the card do not shrink the share (two servers at 0.45 each share
// one card), but the share must fit in what is free, or start-up fails saying how much is missing.
// Host-only arithmetic, tested without a GPU (tests/gpu/kernels/memory_budget_test.cpp).
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>

#include "common/status.h"

namespace ss::cuda {

inline Expected<int64_t> kv_blocks_for_budget(int64_t total, int64_t free_at_start, int64_t free_now, double util,
                                              int64_t scratch, int64_t block_bytes, int64_t max_blocks) {
  const auto mib = [](double b) { return std::to_string(static_cast<int64_t>(b / (1 << 20))); };
  const int64_t own = std::max<int64_t>(0, free_at_start - free_now);
  const double share = static_cast<double>(total) * util;
  const double kv = share - static_cast<double>(own) - static_cast<double>(scratch);
  if (kv < static_cast<double>(block_bytes))
    return make_error("cuda backend: no room for the KV cache: --gpu-memory-utilization " + std::to_string(util) +
                      " of " + mib(static_cast<double>(total)) + " MiB is " + mib(share) + " MiB, and the weights and " +
                      "buffers take " + mib(static_cast<double>(own + scratch)) + " MiB of it");
  if (kv + static_cast<double>(scratch) > static_cast<double>(free_now))
    return make_error("cuda backend: --gpu-memory-utilization " + std::to_string(util) + " asks for " +
                      mib(kv + static_cast<double>(scratch)) + " MiB more, but only " +
                      mib(static_cast<double>(free_now)) + " MiB of the card are free (" +
                      mib(static_cast<double>(total - free_at_start)) +
                      " MiB were taken before this process started): lower it, or free the card");
  return std::min<int64_t>(static_cast<int64_t>(kv / static_cast<double>(block_bytes)), max_blocks);
}

}  // namespace ss::cuda
