// The CUDA backend's resident loop (issue 17).
//
// One launch from the host starts a chain that needs no host again until it is stopped:
//
//   scheduler graph (1 block)  ──tail──▶  decode graph[bucket]  ──▶  scheduler graph  ──tail──▶ ...
//
// The scheduler kernel (one CTA; thread 0 runs the control plane of backend/resident/loop.h, the
// others copy) does, at every step boundary:
//   1. commit the step just run: each sampled id (the decode graph's argmax) appended, stop ids,
//      max tokens and the context checked, a completion published per token;
//   2. take up to kMaxMsgs Admit/Cancel messages from the submission ring (pinned mapped memory;
//      prompts copied to device memory by the whole CTA), apply them;
//   3. plan the next step (decode rows, then prompt chunks; KV blocks from the free-block ring the
//      host keeps topped up), copy new block-table entries to the backend's tables and to the
//      host's mirror, write the graph's inputs (tokens, positions, slots, context lengths, sample
//      rows) straight into the buffers the captured graphs read, padding to the bucket;
//   4. tail-launch the bucket's decode graph, then itself (device graph launch: the tail launches
//      run in order once this graph ends). With nothing to run it sleeps (__nanosleep, bounded)
//      until a message, a block a stalled sequence waits for, or the stop flag, then relaunches.
// The host pushes into rings with plain stores and a release, and drains the completion ring:
// no launch, no copy and no sync per token. A stop flag ends the chain after a commit (pause());
// run_on_loop() uses that to run a host executor's step on the same backend between two of the
// loop's. A step whose rows are all greedy runs the argmax graph of its bucket; one with a
// temperature runs the same step with the device sampler (kern::sample: temperature, top-k, top-p,
// min-p, the counter-based RNG), each row's parameters written by the scheduler. Stop ids banned
// before min_tokens need a mask the loop does not build: such sequences go to the host executor
// (bans_tokens()).
#include "backend/cuda/loop_runner.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <thread>
#include <type_traits>
#include <vector>

#include "backend/cuda/kernels/kernels.h"
#include "backend/cuda/loop_iteration.h"
#include "backend/cuda/queues/queues.h"
#include "backend/resident/loop.h"

namespace ss::cuda {
namespace {

using SubmitRing = queues::SubmissionRing<resident::Submit>;
using BlockRing = queues::SubmissionRing<int32_t>;
using DoneRing = queues::CompletionRing<resident::Completion>;
static_assert(std::is_same_v<SubmitRing::Ring, devloop::InRing<resident::Submit>>);
static_assert(std::is_same_v<BlockRing::Ring, devloop::InRing<int32_t>>);
static_assert(std::is_same_v<DoneRing::Ring, devloop::OutRing<resident::Completion>>);
using devloop::Args;
using devloop::Control;
using devloop::DevState;
using devloop::kMaxGraphs;
using devloop::RowParams;
static_assert(sizeof(RowParams) == sizeof(kern::RowSampling) && offsetof(RowParams, temperature) == offsetof(kern::RowSampling, temperature) &&
                  offsetof(RowParams, top_k) == offsetof(kern::RowSampling, top_k) &&
                  offsetof(RowParams, top_p) == offsetof(kern::RowSampling, top_p) &&
                  offsetof(RowParams, min_p) == offsetof(kern::RowSampling, min_p) &&
                  offsetof(RowParams, seed) == offsetof(kern::RowSampling, seed) &&
                  offsetof(RowParams, counter) == offsetof(kern::RowSampling, counter),
              "the scheduler writes the device sampler's row parameters");
// The sampling graphs' scratch (the sort of every row for top-k/top-p/min-p) above this: greedy only.
constexpr size_t kMaxSampleScratch = size_t(1) << 30;

constexpr int kThreads = 256;

__device__ __forceinline__ int64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return static_cast<int64_t>(t);
}

// One step boundary (loop_iteration.h's phases, a barrier between two), then the tail launches:
// the step's graph and this graph again, or, with nothing to run, a bounded sleep and this graph.
__global__ void __launch_bounds__(kThreads) scheduler_kernel(Args a) {
  __shared__ devloop::Shared sh;
  if (threadIdx.x == 0) devloop::phase_take(a, sh);
  __syncthreads();
  devloop::phase_copy_prompts(a, sh, threadIdx.x, blockDim.x);
  __syncthreads();
  if (threadIdx.x == 0) devloop::phase_plan(a, sh, global_ns());
  __syncthreads();
  devloop::phase_inputs(a, sh, threadIdx.x, blockDim.x);
  if (threadIdx.x != 0) return;
  if (!sh.go) {  // stopped: the chain ends here
    devloop::phase_report(a);
    return;
  }
  if (sh.n > 0) {
    const auto g = static_cast<cudaGraphExec_t>(sh.sampled && a.sgraphs[sh.lg] ? a.sgraphs[sh.lg] : a.graphs[sh.lg]);
    if (const cudaError_t e = cudaGraphLaunch(g, cudaStreamGraphTailLaunch); e != cudaSuccess) {
      devloop::store_mapped(a.ctl->error, static_cast<uint32_t>(e));
      return;
    }
  } else {
    ++a.ds->idle;
    const int64_t until = global_ns() + a.idle_ns;
    unsigned sleep = 128;
    while (global_ns() < until && !devloop::idle_wake(a)) {
      __nanosleep(sleep);
      sleep = min(sleep * 2, 4096u);
    }
  }
  devloop::phase_report(a);
  if (const cudaError_t e = cudaGraphLaunch(cudaGetCurrentGraphExec(), cudaStreamGraphTailLaunch); e != cudaSuccess)
    devloop::store_mapped(a.ctl->error, static_cast<uint32_t>(e));
}

__global__ void read_global_ns(int64_t* out) { *out = global_ns(); }

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

Error cuda_err(const char* what, cudaError_t e) {
  return make_error(std::string("device loop: ") + what + ": " + cudaGetErrorString(e));
}
#define LOOP_CUDA(call)                                                         \
  do {                                                                          \
    if (const cudaError_t e_ = (call); e_ != cudaSuccess) return cuda_err(#call, e_); \
  } while (0)

uint32_t pow2_at_least(uint32_t n) {
  uint32_t p = 1;
  while (p < n) p *= 2;
  return p;
}

class DeviceLoopRunner final : public resident::LoopRunner {
 public:
  static Expected<std::unique_ptr<resident::LoopRunner>> create(const LoopHooks& h, resident::Geometry g,
                                                                const resident::LoopShare& share) {
    std::unique_ptr<DeviceLoopRunner> r(new DeviceLoopRunner(h, share));
    SS_TRY(r->init(g));
    return std::unique_ptr<resident::LoopRunner>(std::move(r));
  }

  ~DeviceLoopRunner() override {
    if (running_) pause();
    if (running_) {
      // The chain did not stop (pause() gave up): cudaFree / cudaFreeHost would synchronise with it
      // and never return. Everything that owns device or mapped memory is moved into storage that
      // is never freed; the process's exit reclaims it with the context.
      std::fprintf(stderr, "selfserve: %s; its memory is left to the process's exit\n", err_.message().c_str());
      static_cast<void>(new auto(std::move(submits_)));
      static_cast<void>(new auto(std::move(blocks_)));
      static_cast<void>(new auto(std::move(done_)));
      static_cast<void>(new auto(std::move(ctl_)));
      static_cast<void>(new auto(std::move(host_prompts_)));
      static_cast<void>(new auto(std::move(host_tables_)));
      for (queues::DeviceBuffer* b : {&dev_state_, &dev_slots_, &dev_tables_, &dev_prompts_, &dev_synced_, &dev_rows_,
                                      &row_params_, &sample_scratch_})
        static_cast<void>(new auto(std::move(*b)));
      if (h_.on_close) h_.on_close(false);
      return;
    }
    for (cudaGraphExec_t e : graphs_)
      if (e) cudaGraphExecDestroy(e);
    for (cudaGraphExec_t e : sgraphs_)
      if (e) cudaGraphExecDestroy(e);
    if (sched_) cudaGraphExecDestroy(sched_);
    if (h_.on_close) h_.on_close(true);
  }

  std::string name() const override {
    return "device loop, " + h_.backend_name + (pdl_ ? "" : ", graphs without PDL") +
           (sgraphs_.empty() ? ", greedy only (" + no_sampling_ + ")" : "");
  }
  const resident::Geometry& geometry() const override { return geo_; }
  int num_blocks() const override { return share_.blocks; }
  int32_t* prompt_row(int slot) override {
    return static_cast<int32_t*>(host_prompts_.host()) + static_cast<size_t>(slot) * geo_.max_len;
  }
  const int32_t* table_row(int slot) const override {
    return static_cast<const int32_t*>(host_tables_.host()) + static_cast<size_t>(slot) * geo_.max_blocks;
  }
  int32_t* admit_table_row(int slot) override {
    return static_cast<int32_t*>(host_tables_.host()) + static_cast<size_t>(slot) * geo_.max_blocks;
  }
  bool submit(const resident::Submit& m) override { return submit_host_.try_push(m); }
  bool grant_block(int32_t b) override { return block_host_.try_push(b); }
  int64_t now_ns() const override { return steady_ns() + clock_offset_; }
  bool greedy_only() const override { return sgraphs_.empty(); }
  bool bans_tokens() const override { return false; }
  Status error() const override { return err_; }
  int64_t steps() const override {
    return static_cast<int64_t>(__atomic_load_n(&ctl()->steps, __ATOMIC_RELAXED));
  }

  size_t drain(std::vector<resident::Completion>& out, std::chrono::microseconds wait) override {
    const size_t first = out.size();
    out.insert(out.end(), stash_.begin(), stash_.end());  // drained while the loop was paused
    stash_.clear();
    resident::Completion c;
    auto pull = [&] {
      while (done_host_.try_pop(c)) out.push_back(c);
      return out.size() > first;
    };
    if (pull() || !err_.ok()) return out.size() - first;
    const int64_t t0 = steady_ns(), end = t0 + static_cast<int64_t>(wait.count()) * 1000;
    for (int64_t now = t0; now < end; now = steady_ns()) {
      if (now - t0 < 200'000) std::this_thread::yield();
      else std::this_thread::sleep_for(std::chrono::microseconds(50));
      if (pull()) break;
      if (alive_check_due(now) && !check_alive(out)) break;
    }
    if (out.size() == first && alive_check_due(steady_ns())) check_alive(out);
    return out.size() - first;
  }

  // Whether drain() should ask the stream if the chain still runs: at most once every
  // kAliveCheckNs. Asking on every empty poll of the ring cost 344 cudaStreamQuery calls a token on
  // the H200 (CUPTI counts, 2026-12-05), host work per token the loop exists to remove; a dead
  // chain is now noticed within 1 ms instead.
  static constexpr int64_t kAliveCheckNs = 1'000'000;
  int64_t last_alive_check_ns_ = 0;
  bool alive_check_due(int64_t now) {
    if (now - last_alive_check_ns_ < kAliveCheckNs) return false;
    last_alive_check_ns_ = now;
    return true;
  }

  void run_on_loop(const std::function<void()>& fn) override {
    const bool was = running_;
    if (was) pause();
    if (running_) return;  // the chain did not stop (err_ says so): fn must not share its stream
    fn();
    if (was && err_.ok()) resume();
  }

 private:
  DeviceLoopRunner(const LoopHooks& h, const resident::LoopShare& share) : h_(h), share_(share) {}

  Control* ctl() const { return static_cast<Control*>(ctl_.host()); }

  Status init(resident::Geometry g) {
    if (g.max_slots < 1 || g.max_rows < 1 || g.max_len < 2) return make_error("device loop: empty geometry");
    // Buckets of 1, 2, 4, ... tokens up to the backend's scratch; sample rows up to the slots.
    const int r_cap = static_cast<int>(pow2_at_least(static_cast<uint32_t>(g.max_slots)));
    if (r_cap > h_.cap_rows)
      return make_error("device loop: " + std::to_string(g.max_slots) + " slots need " + std::to_string(r_cap) +
                        " logits rows, the backend has " + std::to_string(h_.cap_rows));
    int n_graphs = 0;
    while (n_graphs < kMaxGraphs && (1 << n_graphs) <= h_.cap_tokens && (1 << n_graphs) < 2 * g.max_rows) ++n_graphs;
    if (n_graphs == 0) return make_error("device loop: no room for a step");
    g.max_rows = std::min(g.max_rows, 1 << (n_graphs - 1));
    if (g.max_rows < g.max_slots) g.max_slots = g.max_rows;  // a decode row per running sequence
    if (g.max_len > h_.max_position) g.max_len = h_.max_position;  // positions stay in the RoPE table and the cache
    g.max_blocks = (g.max_len + g.block_size - 1) / g.block_size;
    if (g.max_blocks > h_.max_blocks) return make_error("device loop: a sequence's blocks exceed the backend's table row");
    geo_ = g;

    SS_ASSIGN(submits_, SubmitRing::create(1024));
    SS_ASSIGN(blocks_, BlockRing::create(pow2_at_least(static_cast<uint32_t>(share_.blocks) + 1)));
    SS_ASSIGN(done_, DoneRing::create(1u << 16));
    submit_host_ = submits_->host_view();
    block_host_ = blocks_->host_view();
    done_host_ = done_->host_view();
    SS_ASSIGN(ctl_, queues::MappedBuffer::allocate(sizeof(Control)));
    std::memset(ctl_.host(), 0, sizeof(Control));
    const size_t prompt_elems = static_cast<size_t>(g.max_slots) * g.max_len;
    const size_t table_elems = static_cast<size_t>(g.max_slots) * g.max_blocks;
    SS_ASSIGN(host_prompts_, queues::MappedBuffer::allocate(4 * prompt_elems));
    SS_ASSIGN(host_tables_, queues::MappedBuffer::allocate(4 * table_elems));
    std::fill_n(static_cast<int32_t*>(host_tables_.host()), table_elems, -1);
    SS_ASSIGN(dev_state_, queues::DeviceBuffer::allocate(sizeof(DevState)));
    SS_ASSIGN(dev_slots_, queues::DeviceBuffer::allocate(sizeof(resident::Slot) * g.max_slots));
    SS_ASSIGN(dev_tables_, queues::DeviceBuffer::allocate(4 * table_elems));
    SS_ASSIGN(dev_prompts_, queues::DeviceBuffer::allocate(4 * prompt_elems));
    SS_ASSIGN(dev_synced_, queues::DeviceBuffer::allocate(4 * static_cast<size_t>(g.max_slots)));
    SS_ASSIGN(dev_rows_, queues::DeviceBuffer::allocate(13 * static_cast<size_t>(g.max_rows) + 64));

    DevState ds;
    ds.st.geo = g;
    ds.st.slots = static_cast<resident::Slot*>(dev_slots_.get());
    ds.st.tables = static_cast<int32_t*>(dev_tables_.get());
    ds.st.prompts = static_cast<const int32_t*>(dev_prompts_.get());
    LOOP_CUDA(cudaMemcpy(dev_state_.get(), &ds, sizeof ds, cudaMemcpyHostToDevice));

    Args a{};
    a.ds = static_cast<DevState*>(dev_state_.get());
    a.ctl = static_cast<Control*>(ctl_.device());
    a.submits = submits_->device_view();
    a.blocks = blocks_->device_view();
    a.done = done_->device_view();
    a.host_prompts = static_cast<const int32_t*>(host_prompts_.device());
    a.prompts = static_cast<int32_t*>(dev_prompts_.get());
    a.host_tables = static_cast<int32_t*>(host_tables_.device());
    a.synced = static_cast<int32_t*>(dev_synced_.get());
    auto* rows = static_cast<int32_t*>(dev_rows_.get());
    a.row_tokens = rows;
    a.row_pos = rows + g.max_rows;
    a.row_slots = rows + 2 * g.max_rows;
    a.row_sample = reinterpret_cast<uint8_t*>(rows + 3 * g.max_rows);
    a.tokens = h_.tokens, a.positions = h_.positions, a.token_slot = h_.token_slot, a.ctx = h_.ctx, a.rows = h_.rows;
    a.ids = h_.ids;
    a.be_tables = h_.tables;
    a.be_max_blocks = h_.max_blocks;
    a.first_slot = share_.first_slot, a.first_block = share_.first_block, a.spare_slot = h_.spare_slot;
    a.n_graphs = n_graphs, a.r_cap = r_cap;
    a.idle_ns = 500'000;

    // The decode graphs, for launch from the device. Programmatic dependent launch edges first;
    // where the driver does not take them in a device graph, the same graphs without.
    Status st = capture_steps(n_graphs, r_cap, true, &graphs_, h_.record_step);
    if (!st.ok()) {
      first_capture_error_ = st.message();
      pdl_ = false;
      SS_TRY(capture_steps(n_graphs, r_cap, false, &graphs_, h_.record_step));
    }
    for (int i = 0; i < n_graphs; ++i) a.graphs[i] = graphs_[static_cast<size_t>(i)];
    // The sampling graphs: the same steps with the device sampler drawing each row. Without them
    // (too much scratch, or a capture the driver refuses) the loop runs greedy sequences only.
    const size_t scratch = kern::sample_scratch_bytes(r_cap, g.vocab);
    if (!h_.record_sample_step) {
      no_sampling_ = "the backend records no sampling step";
    } else if (g.vocab < 1 || scratch > kMaxSampleScratch) {
      no_sampling_ = "the sampler's scratch would be " + std::to_string(scratch >> 20) + " MiB";
    } else {
      Status made = [&]() -> Status {
        SS_ASSIGN(row_params_, queues::DeviceBuffer::allocate(sizeof(RowParams) * static_cast<size_t>(r_cap)));
        SS_ASSIGN(sample_scratch_, queues::DeviceBuffer::allocate(scratch));
        LOOP_CUDA(cudaMemset(row_params_.get(), 0, sizeof(RowParams) * static_cast<size_t>(r_cap)));
        return capture_steps(n_graphs, r_cap, pdl_, &sgraphs_, [&](int T, int R, bool pdl) {
          return h_.record_sample_step(T, R, pdl, row_params_.get(), sample_scratch_.get(), scratch);
        });
      }();
      if (!made.ok()) {
        no_sampling_ = made.message();
        for (cudaGraphExec_t& e : sgraphs_)
          if (e) cudaGraphExecDestroy(e), e = nullptr;
        sgraphs_.clear();
        row_params_ = queues::DeviceBuffer{};  // the scratch goes back with the graphs
        sample_scratch_ = queues::DeviceBuffer{};
      }
    }
    if (!sgraphs_.empty()) {
      a.row_params = static_cast<RowParams*>(row_params_.get());
      for (int i = 0; i < n_graphs; ++i) a.sgraphs[i] = sgraphs_[static_cast<size_t>(i)];
    }

    // The scheduler's graph: one kernel node that relaunches its own graph.
    LOOP_CUDA(cudaStreamBeginCapture(h_.stream, cudaStreamCaptureModeThreadLocal));
    scheduler_kernel<<<1, kThreads, 0, h_.stream>>>(a);
    cudaGraph_t graph = nullptr;
    const cudaError_t launched = cudaGetLastError();
    LOOP_CUDA(cudaStreamEndCapture(h_.stream, &graph));
    if (launched != cudaSuccess) {
      cudaGraphDestroy(graph);
      return cuda_err("scheduler kernel", launched);
    }
    const cudaError_t inst = cudaGraphInstantiateWithFlags(&sched_, graph, cudaGraphInstantiateFlagDeviceLaunch);
    cudaGraphDestroy(graph);
    if (inst != cudaSuccess) return cuda_err("instantiate the scheduler graph for device launch", inst);
    LOOP_CUDA(cudaGraphUpload(sched_, h_.stream));

    // The loop's clock: the GPU's global timer, offset from the host's steady clock.
    int64_t* gt = nullptr;
    LOOP_CUDA(cudaMalloc(&gt, sizeof(int64_t)));
    const int64_t t0 = steady_ns();
    read_global_ns<<<1, 1, 0, h_.stream>>>(gt);
    int64_t dev_ns = 0;
    const cudaError_t e1 = cudaMemcpyAsync(&dev_ns, gt, sizeof dev_ns, cudaMemcpyDeviceToHost, h_.stream);
    const cudaError_t e2 = cudaStreamSynchronize(h_.stream);
    const int64_t t1 = steady_ns();
    cudaFree(gt);
    LOOP_CUDA(e1);
    LOOP_CUDA(e2);
    clock_offset_ = dev_ns - (t0 + t1) / 2;
    resume();
    return err_;
  }

  Status capture_steps(int n_graphs, int r_cap, bool pdl, std::vector<cudaGraphExec_t>* out,
                       const std::function<Status(int, int, bool)>& record) {
    std::vector<cudaGraphExec_t>& gs = *out;
    for (cudaGraphExec_t& e : gs)
      if (e) cudaGraphExecDestroy(e), e = nullptr;
    gs.assign(static_cast<size_t>(n_graphs), nullptr);
    for (int i = 0; i < n_graphs; ++i) {
      const int T = 1 << i, R = std::min(T, r_cap);
      LOOP_CUDA(cudaStreamBeginCapture(h_.stream, cudaStreamCaptureModeThreadLocal));
      Status st = record(T, R, pdl);
      cudaGraph_t graph = nullptr;
      const cudaError_t end = cudaStreamEndCapture(h_.stream, &graph);
      if (st.ok() && end != cudaSuccess) static_cast<void>(st = cuda_err("capture a step", end));
      if (st.ok()) {
        const cudaError_t inst =
            cudaGraphInstantiateWithFlags(&gs[static_cast<size_t>(i)], graph, cudaGraphInstantiateFlagDeviceLaunch);
        if (inst != cudaSuccess)
          static_cast<void>(st = cuda_err(("instantiate the step of " + std::to_string(T) + " tokens for device launch").c_str(), inst));
      }
      if (graph) cudaGraphDestroy(graph);
      if (st.ok()) {
        const cudaError_t up = cudaGraphUpload(gs[static_cast<size_t>(i)], h_.stream);
        if (up != cudaSuccess) static_cast<void>(st = cuda_err("upload a step graph", up));
      }
      if (!st.ok()) {
        cudaGetLastError();
        return st;
      }
    }
    return {};
  }

  void resume() {
    __atomic_store_n(&ctl()->stop, 0u, __ATOMIC_RELEASE);
    if (const cudaError_t e = cudaGraphLaunch(sched_, h_.stream); e != cudaSuccess) {
      static_cast<void>(err_ = cuda_err("launch the scheduler", e));
      return;
    }
    running_ = true;
  }

  // The loop's stream: cudaErrorNotReady while the chain runs. The runtime also records that as the
  // thread's last error, which the next cudaGetLastError() on this thread returns: the backend's own
  // step (through run_on_loop) checks it after its launches, and would fail with "device not ready"
  // whenever a host executor's step follows a poll of the running loop (the likely cause of
  // DeviceLoopControl.CancelDeadlineAndHostFallback's step error). So a not-ready answer is cleared;
  // a sticky error is returned again by every later call, and any other answer is returned as is.
  cudaError_t query() {
    const cudaError_t e = cudaStreamQuery(h_.stream);
    if (e == cudaErrorNotReady) static_cast<void>(cudaGetLastError());
    return e;
  }

  // Ends the chain after the step in flight is committed; returns when the GPU is idle. Completions
  // are drained meanwhile (kept for the next drain()): a kernel waiting for room in a full ring
  // would otherwise never end.
  // A chain that has not ended 10 s (SS_CUDA_LOOP_PAUSE_LIMIT_MS: the tests' wedged chain) after the
  // stop flag is reported as an error instead of waited on for ever, and the runner stays unusable
  // (running_ stays set). Teardown after that frees nothing on the device (the destructor and the
  // backend's on_close(false)).
  static constexpr int64_t kPauseLimitNs = 10'000'000'000;
  static int64_t pause_limit_ns() {
    const char* e = std::getenv("SS_CUDA_LOOP_PAUSE_LIMIT_MS");
    char* end = nullptr;
    const double ms = e ? std::strtod(e, &end) : 0.0;
    if (!e || end == e || !(ms >= 0.0)) return kPauseLimitNs;  // unset or not a number
    return static_cast<int64_t>(std::min(ms, 1e9) * 1e6);
  }
  void pause() {
    __atomic_store_n(&ctl()->stop, 1u, __ATOMIC_RELEASE);
    resident::Completion c;
    // Once a pause has given up, later ones (host steps, teardown) look once and do not wait again.
    const int64_t limit = gave_up_ ? 0 : pause_limit_ns();
    // SS_CUDA_LOOP_PAUSE_LIMIT_MS=0 (the tests): as if the chain ignored the flag, without a look.
    cudaError_t e = limit > 0 || gave_up_ ? query() : cudaErrorNotReady;
    for (const int64_t t0 = steady_ns(); e == cudaErrorNotReady; e = query()) {
      while (done_host_.try_pop(c)) stash_.push_back(c);
      if (steady_ns() - t0 >= limit) {
        gave_up_ = true;
        if (err_.ok())
          static_cast<void>(err_ = make_error("device loop: the scheduler's chain did not stop within " +
                                              std::to_string(limit / 1'000'000) + " ms of the stop flag (device error word " +
                                              std::to_string(__atomic_load_n(&ctl()->error, __ATOMIC_ACQUIRE)) + ")"));
        return;
      }
      std::this_thread::yield();
    }
    while (done_host_.try_pop(c)) stash_.push_back(c);
    running_ = false;
    if (e != cudaSuccess && err_.ok()) static_cast<void>(err_ = cuda_err("the loop's stream", e));
    if (const uint32_t d = __atomic_load_n(&ctl()->error, __ATOMIC_ACQUIRE); d != 0 && err_.ok())
      static_cast<void>(err_ = cuda_err("a device-side graph launch", static_cast<cudaError_t>(d)));
  }

  // The chain must be running (unless paused by us); when it ended by itself (a failed device
  // launch, a fault) every live sequence ends with the error. False when it is dead.
  bool check_alive(std::vector<resident::Completion>& out) {
    if (!running_) return err_.ok();
    const cudaError_t q = query();
    if (q == cudaErrorNotReady) return true;
    running_ = false;
    if (q != cudaSuccess) {
      static_cast<void>(err_ = cuda_err("the loop's stream", q));
      return false;  // the context is gone: nothing more can be read from the device
    }
    const uint32_t d = __atomic_load_n(&ctl()->error, __ATOMIC_ACQUIRE);
    static_cast<void>(err_ = d != 0 ? cuda_err("a device-side graph launch", static_cast<cudaError_t>(d))
                  : make_error("device loop: the scheduler's chain ended by itself"));
    resident::Completion c;
    while (done_host_.try_pop(c)) out.push_back(c);
    std::vector<resident::Slot> slots(static_cast<size_t>(geo_.max_slots));
    if (cudaMemcpy(slots.data(), dev_slots_.get(), sizeof(resident::Slot) * slots.size(), cudaMemcpyDeviceToHost) ==
        cudaSuccess)
      for (int i = 0; i < geo_.max_slots; ++i) {
        const resident::Slot& s = slots[static_cast<size_t>(i)];
        if (s.live) out.push_back(resident::Completion{s.id, -1, i, s.n_blocks, s.len, resident::Finish::Rejected});
      }
    return false;
  }

  LoopHooks h_;
  resident::LoopShare share_;
  resident::Geometry geo_{};
  std::optional<SubmitRing> submits_;
  std::optional<BlockRing> blocks_;
  std::optional<DoneRing> done_;
  SubmitRing::Ring submit_host_;
  BlockRing::Ring block_host_;
  DoneRing::Ring done_host_;
  queues::MappedBuffer ctl_, host_prompts_, host_tables_;
  queues::DeviceBuffer dev_state_, dev_slots_, dev_tables_, dev_prompts_, dev_synced_, dev_rows_;
  std::vector<cudaGraphExec_t> graphs_, sgraphs_;  // argmax steps; sampling steps (empty: greedy only)
  queues::DeviceBuffer row_params_, sample_scratch_;
  std::string no_sampling_;
  cudaGraphExec_t sched_ = nullptr;
  bool pdl_ = true, running_ = false;
  bool gave_up_ = false;  // a pause() gave up on the chain: later ones do not wait again
  std::string first_capture_error_;
  std::vector<resident::Completion> stash_;
  int64_t clock_offset_ = 0;
  Status err_;
};

}  // namespace

Expected<std::unique_ptr<resident::LoopRunner>> make_device_loop_runner(const LoopHooks& hooks,
                                                                       const resident::Geometry& g,
                                                                       const resident::LoopShare& share) {
  return DeviceLoopRunner::create(hooks, g, share);
}

}  // namespace ss::cuda
