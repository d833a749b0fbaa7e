// The CUDA backend's resident loop (issue 17): the control plane of backend/resident/loop.h in a
// one-block scheduler kernel that tail-launches the step's decode graph and then itself, so once
// started the GPU admits, plans, steps, samples, stops and streams with no host launch and
// no host sync per token. The host only pushes into rings in pinned mapped memory and drains the
// completion ring. loop_runner.cu has the design.
// While the chain runs, nothing else in the process may allocate or free device or pinned memory
// (cudaMalloc/cudaFree/cudaFreeHost synchronise the whole device, and the chain ends only at its
// stop flag) or synchronise the device: such work goes through LoopRunner::run_on_loop, which
// pauses the chain. A second backend on the same GPU counts (DeviceLoopControl hung on that).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "backend/resident/runner.h"
#include "common/status.h"

namespace ss::cuda {

// What the loop needs of the backend: the device buffers a step's graph reads and writes, and a
// way to record one step (forward over T tokens, logits of R rows, argmax into ids) into a stream
// being captured.
struct LoopHooks {
  std::string backend_name;
  cudaStream_t stream = nullptr;  // the backend's; the loop's chain of graphs runs in it
  int32_t *tokens = nullptr, *positions = nullptr, *token_slot = nullptr, *ctx = nullptr, *rows = nullptr;
  const int32_t* ids = nullptr;  // the argmax of row j after a step
  int32_t* tables = nullptr;     // the backend's block tables, [slot][max_blocks]
  int max_blocks = 0;
  int max_position = 0;          // positions the model and the KV cache take
  int spare_slot = 0;            // padding rows' slot (its table points at a spare block)
  int cap_tokens = 0, cap_rows = 0;
  std::function<Status(int tokens, int rows, bool pdl)> record_step;
  // The same step with the device sampler (kern::sample) drawing row j with params[j] (device
  // kern::RowSampling, written by the scheduler) into ids, using scratch of scratch_bytes; unset:
  // the loop runs greedy sequences only.
  std::function<Status(int tokens, int rows, bool pdl, const void* params, void* scratch, size_t scratch_bytes)>
      record_sample_step;
  // The runner is gone (the backend may make another). chain_stopped false: its chain ignored the
  // stop flag, so the device is still busy with it and anything that synchronises or frees on it
  // would wait for ever; the runner left its own memory to the process's exit, and the backend
  // should do the same with its own.
  std::function<void(bool chain_stopped)> on_close;
};

Expected<std::unique_ptr<resident::LoopRunner>> make_device_loop_runner(const LoopHooks& hooks,
                                                                       const resident::Geometry& g,
                                                                       const resident::LoopShare& share);

}  // namespace ss::cuda
