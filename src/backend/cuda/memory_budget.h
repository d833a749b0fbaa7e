// The CUDA backend's KV cache size at start-up, as vLLM reads --gpu-memory-utilization: this process
// may hold `util` of the card's memory in all. What this backend already holds (own: its weights and
// cuBLAS workspace, counted exactly, not as a change in free memory, which other processes move) and
// its scratch come off that share; the rest is KV blocks. Other processes on the card do not shrink
// the share (two servers at 0.45 each share one card), but the share must fit in what is free with
// a reserve for what is allocated later (graphs, the device loop's rings and sampler scratch, lazily
// loaded kernels), or start-up fails saying how much is missing.
// Host-only arithmetic, tested without a GPU (tests/gpu/kernels/memory_budget_test.cpp).
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>

#include "common/status.h"

namespace ss::cuda {

constexpr int64_t kKvBudgetReserve = 512LL << 20;  // free memory kept back for later allocations

inline Expected<int64_t> kv_blocks_for_budget(int64_t total, int64_t free_now, int64_t own, double util,
                                              int64_t scratch, int64_t block_bytes, int64_t max_blocks) {
  const auto mib = [](double b) { return std::to_string(static_cast<int64_t>(b / (1 << 20))); };
  char u[16];
  std::snprintf(u, sizeof u, "%.2f", util);
  const double share = static_cast<double>(total) * util;
  const double kv = share - static_cast<double>(own) - static_cast<double>(scratch);
  if (kv < static_cast<double>(block_bytes))
    return make_error(std::string("cuda backend: no room for the KV cache: --gpu-memory-utilization ") + u + " of " +
                      mib(static_cast<double>(total)) + " MiB is " + mib(share) + " MiB, and the weights and " +
                      "buffers take " + mib(static_cast<double>(own + scratch)) + " MiB of it");
  const double need = kv + static_cast<double>(scratch + block_bytes + kKvBudgetReserve);
  if (need > static_cast<double>(free_now))
    return make_error(std::string("cuda backend: --gpu-memory-utilization ") + u + " asks for " + mib(need) +
                      " MiB more (KV cache, scratch and a " + mib(static_cast<double>(kKvBudgetReserve)) +
                      " MiB reserve), but only " + mib(static_cast<double>(free_now)) + " MiB of the card are free (" +
                      mib(static_cast<double>(total - free_now - own)) +
                      " MiB in use besides this backend's weights, the CUDA context included): lower it, or free the card");
  return std::min<int64_t>(static_cast<int64_t>(kv / static_cast<double>(block_bytes)), max_blocks);
}

// Whether a GGUF's quantized matrices stay quantized on the GPU when --gpu-native-quant was not
// given. bf16 copies are the default (the cuBLAS path of prefill and batches over 8 reads them as
// they are; packed weights are dequantized a matrix at a time there), but not when they would take
// more than kBf16WeightShare of this process's share of the card (util x total), leaving too little
// for the KV cache and scratch, or not fit at all (Llama-3-70B at Q4_K_M: 42 GB of GGUF, 141 GB as
// bf16), and the packed copies are smaller (some matrix is of a type the fused kernels read).
constexpr double kBf16WeightShare = 0.8;
inline bool keep_weights_quantized(int64_t total, double util, int64_t bf16_bytes, int64_t packed_bytes) {
  return packed_bytes < bf16_bytes && static_cast<double>(bf16_bytes) > kBf16WeightShare * util * static_cast<double>(total);
}

}  // namespace ss::cuda
