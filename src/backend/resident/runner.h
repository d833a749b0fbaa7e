// Who runs the resident loop (loop.h): the interface the host side (engine/resident_executor.h)
// feeds. A host thread over any Backend's step() (the reference), or the backend itself: the CUDA
// backend runs the control plane in a scheduler kernel between device-launched decode graphs, its
// rings in pinned mapped memory (Backend::make_loop_runner).
#pragma once
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "backend/resident/loop.h"
#include "common/status.h"

namespace ss::resident {

class LoopRunner {
 public:
  virtual ~LoopRunner() = default;
  virtual std::string name() const = 0;
  virtual const Geometry& geometry() const = 0;
  virtual int num_blocks() const = 0;
  // The slot's prompt row (geometry().max_len tokens): written before the Admit that names it.
  virtual int32_t* prompt_row(int slot) = 0;
  // The slot's block-table row: the host's to read once the slot's final completion is drained.
  virtual const int32_t* table_row(int slot) const = 0;
  // The same row, for the host to write a cached prefix's blocks into before the Admit that names
  // the (free) slot.
  virtual int32_t* admit_table_row(int slot) = 0;
  virtual bool submit(const Submit& m) = 0;     // false: the ring is full (try again later)
  virtual bool grant_block(int32_t block) = 0;  // false: the free-block ring is full
  // Appends completions, waiting up to `wait` for the first; returns how many were appended.
  virtual size_t drain(std::vector<Completion>& out, std::chrono::microseconds wait) = 0;
  // The loop's clock (deadlines are sent in it), nanoseconds.
  virtual int64_t now_ns() const = 0;
  virtual Status error() const { return {}; }  // a failed forward pass stops the loop
  // Steps the loop has run so far (any thread may ask): the server's watchdog reads progress from it,
  // so a wedged loop (a hung kernel, a stuck step) turns /health to 503.
  virtual int64_t steps() const = 0;
  // Runs fn where the loop runs, between two of its steps, and returns when it has run: how a host
  // executor sharing the backend (requests the loop cannot run) gets its steps in.
  virtual void run_on_loop(const std::function<void()>& fn) = 0;
  // Draws only greedy tokens: other sequences go to the host executor.
  virtual bool greedy_only() const { return false; }
  // Whether it bans stop ids before min_tokens (a mask on the draw); false: such sequences go to
  // the host executor.
  virtual bool bans_tokens() const { return true; }
};

// The part of a backend's KV pool and block-table slots a loop uses: blocks
// [first_block, first_block + blocks), slots [first_slot, first_slot + slots). blocks 0: all.
struct LoopShare {
  int first_block = 0, blocks = 0;
  int first_slot = 0, slots = 0;
};

}  // namespace ss::resident
