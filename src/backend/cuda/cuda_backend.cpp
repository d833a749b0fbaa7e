// The CUDA backend: Llama / Qwen2 / Qwen3 on one GPU. Weights are validated on the host by the
// loader, converted to bf16 (quantized GGUF types dequantized on the way) and uploaded in chunks
// through two pinned staging buffers, so reading/converting one chunk overlaps copying the other.
// Device memory is taken once at start-up, by class: weights, the KV cache (bf16, sized by
// --gpu-memory-utilization unless a block count is given), scratch for max_batch_tokens; a step
// allocates nothing. The matmuls are cuBLAS (bf16 in, fp32 accumulate and out); the rest are the
// kernels of basic_ops.cu. Greedy rows are sampled on the device (only their ids come back); rows
// that need the full sampler (temperature, penalties, a grammar, logprobs) are sampled on the host
// with the reference sampler for now.
//
// CUDA graphs: a decode step (one token per sequence, greedy rows) is captured once per batch-size
// bucket (1, 2, 4, ..., up to the slots) — input copies from fixed pinned buffers, the whole forward,
// the argmax and the ids' copy back — and replayed with the inputs rewritten in place; the rows a
// bucket has beyond the batch are padding: token 0 at position 0 of a spare slot whose table points at
// a spare KV block. --enforce-eager runs every step kernel by kernel.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/api_counts.h"
#include "backend/cuda/basic_ops.h"
#include "backend/cuda/loop_runner.h"
#include "backend/cuda/kernels/kernels.h"
#include "backend/cuda/memory_budget.h"
#include "backend/rope.h"
#include "model/model.h"

namespace ss::backend {

namespace {
using cuda::bf16_bits;

Status cuda_status(cudaError_t e, const char* what, const char* file, int line) {
  if (e == cudaSuccess) return {};
  return make_error(std::string("CUDA: ") + what + ": " + cudaGetErrorString(e) + " (" + file + ":" +
                    std::to_string(line) + ")");
}
Status cublas_status(cublasStatus_t e, const char* what, const char* file, int line) {
  if (e == CUBLAS_STATUS_SUCCESS) return {};
  return make_error(std::string("cuBLAS: ") + what + ": status " + std::to_string(static_cast<int>(e)) + " (" + file +
                    ":" + std::to_string(line) + ")");
}
#define SS_CUDA(call) SS_TRY(cuda_status((call), #call, __FILE__, __LINE__))
#define SS_CUBLAS(call) SS_TRY(cublas_status((call), #call, __FILE__, __LINE__))

// One device allocation per memory class, handed out in aligned pieces.
class Arena {
 public:
  Arena() = default;
  Arena(Arena&& o) noexcept
      : base_(std::exchange(o.base_, nullptr)), cap_(std::exchange(o.cap_, 0)), used_(std::exchange(o.used_, 0)),
        what_(o.what_) {}
  Arena& operator=(Arena&&) = delete;
  ~Arena() {
    if (base_) cudaFree(base_);
  }
  Status reserve(size_t bytes, const char* what) {
    what_ = what;
    if (bytes == 0) return {};
    SS_TRY(cuda_status(cudaMalloc(&base_, bytes), what, __FILE__, __LINE__));
    cap_ = bytes;
    return {};
  }
  template <class T>
  T* take(size_t count) {
    const size_t bytes = (count * sizeof(T) + 255) / 256 * 256;
    if (used_ + bytes > cap_) return nullptr;
    T* p = reinterpret_cast<T*>(static_cast<char*>(base_) + used_);
    used_ += bytes;
    return p;
  }
  size_t capacity() const { return cap_; }
  size_t used() const { return used_; }

 private:
  void* base_ = nullptr;
  size_t cap_ = 0, used_ = 0;
  const char* what_ = "";
};

size_t padded(size_t bytes) { return (bytes + 255) / 256 * 256; }
bool simple_greedy(const SampleRow& r);

}  // namespace

class CudaBackend final : public Backend {
 public:
  static Expected<std::unique_ptr<CudaBackend>> create(const model::Model& m, const BackendOptions& o) {
    cuda::start_api_counts();  // SS_CUDA_API_COUNTS=1: from before the first call of the backend
    std::unique_ptr<CudaBackend> be(new CudaBackend(m, o));
    SS_TRY(be->init());
    return be;
  }

  // The device, and how its projections are held (as the CPU backend's "N/M matrices packed"):
  // "bf16 weights", or how many of the fused projections stay packed GGUF blocks (native_quant_).
  std::string name() const override {
    std::string s = "cuda (" + device_name_;
    if (total_mats_ > 0)
      s += packed_mats_ == 0 ? std::string(", bf16 weights")
                             : ", " + std::to_string(packed_mats_) + "/" + std::to_string(total_mats_) + " projections packed";
    return s + ")";
  }
  const KvCacheConfig& kv_config() const override { return kv_; }
  int vocab_size() const override { return V_; }
  int max_slots() const override { return tables_.size(); }
  Status step(const StepBatch& b, StepOutput& out) override;
  Expected<std::unique_ptr<resident::LoopRunner>> make_loop_runner(const resident::Geometry& g,
                                                                  const resident::LoopShare& share) override;
  // A block's K/V is one run of block_elems per layer, the layers layer_cache_elems_ apart: one 2-D
  // copy (L_ rows) on the step stream, so the step that follows sees it. A batch issues every
  // block's copy, then waits once (write_kv_blocks, read_kv_blocks).
  int64_t kv_block_bytes() const override {
    return static_cast<int64_t>(sizeof(bf16_bits)) * 2 * nkv_ * kv_.block_size * hd_ * L_;
  }
  void register_host_memory(void* p, size_t bytes) override;
  void unregister_host_memory(void* p) override;
  Status read_kv_block(int32_t block, std::span<uint8_t> out) override {
    const KvBlockOut b{block, out};
    return read_kv_blocks(std::span<const KvBlockOut>(&b, 1));
  }
  Status write_kv_block(int32_t block, std::span<const uint8_t> in) override {
    const KvBlockIn b{block, in};
    return write_kv_blocks(std::span<const KvBlockIn>(&b, 1));
  }
  Status read_kv_blocks(std::span<const KvBlockOut> blocks) override;
  Status write_kv_blocks(std::span<const KvBlockIn> blocks) override;
  BackendMemory memory() const override {  // the three device arenas, as reserved at start-up
    BackendMemory m{static_cast<int64_t>(weights_.capacity()), static_cast<int64_t>(kv_mem_.capacity()),
                    static_cast<int64_t>(scratch_.capacity()), "device"};
    for (const auto& r : registered_) m.host_registered_bytes += static_cast<int64_t>(r.second);
    return m;
  }
  // Stage times for bench decode, only with SS_CUDA_PROFILE=1 in the environment: the step then
  // runs eagerly with an event after every kernel (no graphs, no PDL overlap across the events), so
  // each kernel's own time is measured; the per-kernel table goes to stderr when profiling stops.
  void set_profiling(bool on, bool) override;
  StepProfile profile() const override;
  void reset_profile() override;

 private:
  CudaBackend(const model::Model& m, const BackendOptions& o)
      : model_(m), c_(m.config), opts_(o), kv_(o.kv), tables_(std::max(1, o.max_slots)) {}
  Status init();
  Status upload_matrix(std::initializer_list<const model::Tensor*> parts, bf16_bits** out);
  // The projection as the decode kernels read it: packed GGUF blocks when native_quant_ and every
  // part is of one packed type (packed_format), else bf16 (upload_matrix).
  Status upload_weights(std::initializer_list<const model::Tensor*> parts, cuda::kern::DevWeights* out, int* rows);
  size_t weight_bytes(std::initializer_list<const model::Tensor*> parts, bool native) const;
  // Every weight on the device, in bytes: the projections packed where native (as weight_bytes).
  size_t all_weight_bytes(bool native) const;
  // The bf16 matrix the cuBLAS path multiplies: w itself, or w dequantized into wtmp_.
  Expected<const bf16_bits*> bf16_of(const cuda::kern::DevWeights& w, int N, int K);
  Status upload_vector(const model::Tensor& t, float** out);
  Status gemm(const bf16_bits* w, int out_dim, int in_dim, const bf16_bits* x, int n, float* y);
  Status forward(int n_tok, int n_rows);
  // Batch <= 8 (decode, small prefill chunks): the fused PDL-chained layer of kernels/decode.cu.
  Status forward_fused(int n_tok, int n_rows);
  // With --batch-invariant every step takes the fused path, 8 rows at a time (forward_chunks).
  bool fused_step(int n_tok, int n_rows) const {
    return fused_ && ((n_tok <= kFusedMaxBatch && n_rows <= kFusedMaxBatch) || opts_.batch_invariant);
  }
  // --batch-invariant past 8 tokens or rows: the fused layers over consecutive 8-token slices of the
  // step (a slice's attention reads the K/V the earlier slices wrote, as a chunked prompt does), then
  // the lm_head 8 rows at a time. Each row's arithmetic is the fused path's at batch 1.
  Status forward_chunks(int n_tok, int n_rows);
  // Positions a prefill tile holds: 64 rows, G of them a position with packed groups.
  int tile_positions() const {
    return group_tiles_ ? cuda::kern::kPrefillTileRows / (nh_ / nkv_) : cuda::kern::kPrefillTileRows;
  }
  // forward() inside the device loop's graphs: with packed-group tiles (the default) a step past the
  // fused path makes its attention tiles on the device first (the rows are the scheduler kernel's).
  Status loop_forward(int n_tok, int n_rows);
  // The step as a graph replay, when it is a decode step a graph can run; *done false otherwise.
  Status decode_graph(const StepBatch& b, StepOutput& out, bool* done);
  Status upload_table_edits(const StepBatch& b);
  Status sample_on_device(const StepBatch& b, StepOutput& out);
  bool device_samples(const StepBatch& b) const;
  // Issues one block's copy: registered host memory by DMA in place (not waited for: the caller
  // waits once for the batch, *issued_in_place set), else through a staging slot.
  Status copy_kv_block(int32_t block, uint8_t* host, bool to_host, bool* issued_in_place);
  enum Stage { kEmbed, kQkv, kAttn, kOProj, kGateUp, kDown, kNormQkvEtc, kLmHead, kSample, kStages };
  void mark(Stage st);   // the kernels since the previous mark belong to stage st
  void collect_marks();  // after the step's sync: adds the marked intervals to stage_ms_

  const model::Model& model_;
  const model::ModelConfig& c_;
  BackendOptions opts_;
  // The projections stay packed (--gpu-native-quant, or where bf16 copies would not leave room:
  // keep_weights_quantized).
  bool native_quant_ = false;
  int packed_mats_ = 0, total_mats_ = 0;  // projections uploaded packed / in all (name())
  KvCacheConfig kv_;
  BlockTables tables_;
  std::string device_name_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;

  int H_ = 0, nh_ = 0, nkv_ = 0, hd_ = 0, I_ = 0, V_ = 0, L_ = 0, rope_dim_ = 0, qd_ = 0, kvd_ = 0;
  int max_blocks_ = 0, max_position_ = 0, cap_tokens_ = 0, cap_rows_ = 0;

  Arena weights_, kv_mem_, scratch_;
  struct Layer {
    cuda::kern::DevWeights wqkv, wo, wgu, wdown;
    float *attn_norm, *ffn_norm, *bqkv = nullptr, *q_norm = nullptr, *k_norm = nullptr;
  };
  std::vector<Layer> layers_;
  bf16_bits *embd_ = nullptr, *out_w_ = nullptr;
  float *out_norm_ = nullptr, *rope_cs_ = nullptr;
  bf16_bits* cache_ = nullptr;  // [layer][block][2][n_kv][block_size][hd]
  int64_t layer_cache_elems_ = 0;

  // Scratch (device) and per-step inputs (pinned host mirror + device).
  float *x_ = nullptr, *qkv_ = nullptr, *q_ = nullptr, *tmp_ = nullptr, *gu_ = nullptr, *logits_ = nullptr;
  bf16_bits *xn_ = nullptr, *att_ = nullptr, *act_ = nullptr, *xr_ = nullptr;
  int32_t *d_tokens_ = nullptr, *d_pos_ = nullptr, *d_tok_table_ = nullptr, *d_rows_ = nullptr, *d_ids_ = nullptr,
          *d_tables_ = nullptr;
  int32_t *h_in_ = nullptr, *h_ids_ = nullptr, *h_tables_ = nullptr;
  float* h_logits_ = nullptr;
  std::vector<void*> pinned_;
  std::vector<int32_t> rows_;
  std::vector<RowSampler> samplers_;
  std::vector<float> host_logits_;
  // Graphs per bucket (index: log2 of the bucket size); the spare slot and block padding rows use.
  std::vector<cudaGraphExec_t> graphs_;
  int spare_slot_ = 0, spare_block_ = 0;
  void* blas_ws_ = nullptr;
  // Paged attention: the split (flash-decoding) kernel of kernels/ where the shape allows (16-token
  // blocks, head_dim 64/128/256, GQA group <= 8), else basic_ops' one CTA per (token, head).
  bool split_attention_ = false;
  int sm_count_ = 0, max_splits_ = 64;
  int64_t l2_prefetch_bytes_ = 0;  // kern::Attention::l2_prefetch_bytes
  int attn_cluster_ = 0;           // kern::Attention::cluster of the fused decode's attention
  bool attn_push_ = false;         // kern::Attention::cluster_push (SS_CUDA_ATTN_PUSH=1; slower, off)
  bf16_bits* wtmp_ = nullptr;  // a dequantized matrix for the cuBLAS path (native quant weights)
  size_t wtmp_elems_ = 0;
  float* attn_ws_ = nullptr;
  int32_t* d_ctx_ = nullptr;  // positions + 1
  // The fused small-batch path (kernels/decode.cu): split attention shapes without per-head q/k norms.
  bool fused_ = false;
  unsigned* attn_counters_ = nullptr;  // [kFusedMaxBatch][n_kv], zero between launches
  cuda::kern::SplitK splitk_{};        // the fused adds' K split across CTAs (SS_CUDA_SPLITK=0: off)
  static constexpr int kFusedMaxBatch = 8;
  // Prefill attention on tensor cores (kernels/prefill_attention.cu) for eager steps whose rows come in
  // prompt runs: the step's query tiles (pinned host mirror, device copy) and their count, 0 when the
  // row kernel runs. Chosen per step in step(); inside captured graphs only with packed groups
  // (group_tiles_): decode_graph copies a tile a row, the device loop's graphs make them with
  // build_tiles (d_n_tiles_, tiles_on_device_). On by default (SS_CUDA_PREFILL_ATTN=rows: the row kernel): on the H200 (2026-12-05) it passed
  // its tests and made 1B prefill 2.7x (pp512) to 11.5x (pp4096) and 8B 2.0x / 4.4x (pp512 / pp2048) faster.
  bool flash_prefill_ = false;
  bool group_tiles_ = false;  // tiles with the KV group's heads packed, decode rows too (SS_CUDA_GROUP_TILES=0: off)
  bool split_keys_ = false;   // short tiles split each key tile over the CTA's warps (SS_CUDA_SPLIT_KEYS=0: off)
  // Sampling on the device (BackendOptions::gpu_device_sampling; SS_CUDA_DEVICE_SAMPLING=0/1 overrides): rows
  // other than plain greedy are drawn by kern::sample after their bias, penalties and bans are applied
  // in place (kern::edit_logits), kSampleChunk rows a call; only ids (and asked-for logprobs) come back.
  static constexpr int kSampleChunk = 32, kEditCap = 1 << 16, kMaxTopLogprobs = 64;
  bool device_sampling_ = false;
  void* d_sample_scratch_ = nullptr;
  size_t sample_scratch_bytes_ = 0;
  cuda::kern::RowSampling *h_rowp_ = nullptr, *d_rowp_ = nullptr;
  cuda::kern::LogitEdit *h_edits_ = nullptr, *d_edits_ = nullptr;
  uint32_t *h_mask_ = nullptr, *d_mask_ = nullptr;  // [kSampleChunk][words_]
  int words_ = 0;
  float *d_lp_ = nullptr, *h_lp_ = nullptr;        // chosen [R], then top logprobs [R][kMaxTopLogprobs]
  int32_t *d_lp_ids_ = nullptr, *h_lp_ids_ = nullptr;  // [R][kMaxTopLogprobs]
  std::vector<int32_t> edit_of_;  // per token: its edit's index in this row, -1 (reset after each row)
  cuda::kern::PrefillTile *h_tiles_ = nullptr, *d_tiles_ = nullptr;
  int n_tiles_ = 0;
  int32_t* d_n_tiles_ = nullptr;  // the count build_tiles wrote (the device loop's graphs)
  bool tiles_on_device_ = false;  // n_tiles_ is a bound, the count is *d_n_tiles_
  // Profiling (SS_CUDA_PROFILE=1): events in stream order and the stage each interval ends.
  bool profile_env_ = false, profiling_ = false;
  std::vector<cudaEvent_t> events_;
  std::vector<Stage> marked_;
  double stage_ms_[kStages] = {};
  int64_t prof_forwards_ = 0, prof_tokens_ = 0;
  bool prof_active() const { return profile_env_ && profiling_; }
  bool pdl_ = true;  // fused kernels launched with programmatic dependent launch (overlap of prologues)
  // The persistent decode kernel (kernels/mega.cu) for the fused path's steps, SS_CUDA_MEGA=1 (written
  // without a GPU, opt-in until measured): bf16 weights, shapes mega_unsupported() takes. Not inside
  // the device loop's graphs (a cooperative launch from a device-launched graph is not relied on).
  bool mega_ = false, in_loop_ = false;
  bool mega_barriers_ = true;  // MegaDecode::barriers; SS_CUDA_MEGA_SYNC=counters: false
  bool mega_deal_rr_ = false;  // MegaDecode::deal_rr; SS_CUDA_MEGA_DEAL=rr: true
  bool mega_uncaptured_ = false;  // a graph capture with it failed: graphs run the PDL-chained kernels
  // SS_CUDA_MEGA_TRACE=1: eager steps stamp each part of a layer (MegaDecode::trace); the mean per
  // layer is printed at exit.
  unsigned long long* d_mega_trace_ = nullptr;
  std::vector<unsigned long long> h_mega_trace_;
  double mega_trace_us_[11] = {};
  double mega_probe_us_ = 0, mega_wait_us_[5] = {}, mega_release_us_[5] = {};
  int64_t mega_traced_ = 0;
  // SS_CUDA_CHAIN_TRACE=1 (benchmarking only): the fused decode's five kernels a layer stamp their
  // phases (kernels/common.cuh, phase()) into [L_][5][kChainPhases] words, graph steps included; the
  // means per kernel are printed at exit.
  unsigned long long* d_chain_ = nullptr;
  std::vector<unsigned long long> h_chain_;
  bool chain_pending_ = false;          // a fused forward stamped since the last collection
  double chain_us_[5][8] = {};          // phase i minus CTA 0's start (i = 7: the last CTA's exit)
  double chain_start_us_[5] = {}, chain_released_us_[5] = {};  // CTA 0's start, its wait's release: minus the
  int64_t chain_n_[5] = {}, chain_merge_n_ = 0;                // previous kernel's last exit
  int64_t chain_steps_ = 0;
  Status collect_chain_trace();
  cuda::kern::MegaLayer* d_mega_layers_ = nullptr;
  void* mega_work_ = nullptr;
  cuda::kern::MegaDecode mega_args() const;
  Status collect_mega_trace();
  bool loop_made_ = false;
  // A device loop's chain ignored its stop flag (on_close): the device never goes idle, so the
  // destructor leaves the stream, graphs and memory to the process's exit instead of waiting on them.
  bool wedged_ = false;
  // KV tier copies go through pinned staging: a host-to-device block is copied into a free stage
  // slot and its DMA left in flight (stream order puts it before the next step), device-to-host
  // lands in its own slot and is waited for. Taken at the first copy (a server without tiers never
  // makes one), kKvStages blocks plus one.
  static constexpr int kKvStages = 8;
  uint8_t* kv_stage_ = nullptr;
  cudaEvent_t kv_stage_ev_[kKvStages] = {};
  int kv_stage_next_ = 0;
  Status ensure_kv_stage();
  // Host memory registered by the tiers (register_host_memory: cudaHostRegister). A block copied out
  // of or into it moves by DMA in place, waited for before the copy returns (the tiers reuse the
  // bytes at once): no staging memcpy, which held host-tier restores to ~6 GB/s (H100, 2026-12-05).
  std::vector<std::pair<const uint8_t*, size_t>> registered_;
  bool is_registered(const uint8_t* p, size_t n) const {
    for (const auto& [b, len] : registered_)
      if (p >= b && p + n <= b + len) return true;
    return false;
  }

 public:
  ~CudaBackend() override;
};

CudaBackend::~CudaBackend() {
  if (wedged_) {
    std::fprintf(stderr, "selfserve: the CUDA backend is not freed: its device loop's chain did not stop\n");
    static_cast<void>(new Arena(std::move(weights_)));
    static_cast<void>(new Arena(std::move(kv_mem_)));
    static_cast<void>(new Arena(std::move(scratch_)));
    blas_ = nullptr, blas_ws_ = nullptr, stream_ = nullptr;
    pinned_.clear();
    events_.clear();
    graphs_.clear();
    for (cudaEvent_t& e : kv_stage_ev_) e = nullptr;
    return;
  }
  if (stream_) cudaStreamSynchronize(stream_);  // staged KV copies may still be in flight
  for (const auto& r : registered_) cudaHostUnregister(const_cast<uint8_t*>(r.first));  // the tiers forgot to
  if (mega_traced_ > 0) {
    static const char* parts[11] = {"qkv", "barrier", "attention", "barrier", "o_proj", "barrier", "gate_up",
                                    "barrier", "down", "barrier", "lm_head (once)"};
    std::fprintf(stderr, "mega trace (%lld eager forwards; CTA 0, us per layer):", static_cast<long long>(mega_traced_));
    for (int i = 0; i < 11; ++i) std::fprintf(stderr, " %s %.2f", parts[i], mega_trace_us_[i] / mega_traced_);
    std::fprintf(stderr, "\nmega barriers (us): alone %.2f; a layer's five, CTA 0 to the last arrival + the last arrival to CTA 0 leaving:",
                 mega_probe_us_ / mega_traced_);
    for (int j = 0; j < 5; ++j)
      std::fprintf(stderr, " %.2f+%.2f", mega_wait_us_[j] / mega_traced_, mega_release_us_[j] / mega_traced_);
    std::fprintf(stderr, "\n");
  }
  if (chain_steps_ > 0) {
    static const char* names[5] = {"qkv", "attention", "o_proj", "gate_up", "down"};
    std::fprintf(stderr, "chain trace (%lld steps; us, mean over layers; CTA 0's start and release against the previous "
                 "kernel's last CTA exit, then its phases and the last exit against its start):\n",
                 static_cast<long long>(chain_steps_));
    for (int k = 0; k < 5; ++k) {
      const double n = static_cast<double>(std::max<int64_t>(1, chain_n_[k]));
      std::fprintf(stderr, "  %-9s start %+.2f released %+.2f | phases", names[k], chain_start_us_[k] / n,
                   chain_released_us_[k] / n);
      for (int i = 1; i < 6; ++i) std::fprintf(stderr, " %.2f", chain_us_[k][i] / n);
      if (k == 1 && chain_merge_n_ > 0) std::fprintf(stderr, " merged %.2f", chain_us_[k][6] / static_cast<double>(chain_merge_n_));
      std::fprintf(stderr, " | last exit %.2f\n", chain_us_[k][7] / n);
    }
  }
  if (d_chain_) cudaFree(d_chain_);
  if (cuda::start_api_counts()) std::fprintf(stderr, "%s\n", cuda::format_api_counts(cuda::api_counts()).c_str());
  for (cudaEvent_t e : kv_stage_ev_)
    if (e) cudaEventDestroy(e);
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
  for (cudaGraphExec_t g : graphs_)
    if (g) cudaGraphExecDestroy(g);
  if (blas_) cublasDestroy(blas_);
  for (void* p : pinned_)
    if (p) cudaFreeHost(p);
  if (blas_ws_) cudaFree(blas_ws_);
  if (stream_) cudaStreamDestroy(stream_);
}

Status CudaBackend::init() {
  int dev = 0;
  SS_CUDA(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  SS_CUDA(cudaGetDeviceProperties(&prop, dev));
  device_name_ = prop.name;
  const char* pe = std::getenv("SS_CUDA_PROFILE");
  profile_env_ = pe && std::string(pe) == "1";
  sm_count_ = prop.multiProcessorCount;
  // The row attention's L2 prefetch stays on while a step's K/V fits half of L2;
  // SS_CUDA_ATTN_L2_PREFETCH_MB=<MiB> moves that bound (a large number: always, as before 2026-12-05).
  l2_prefetch_bytes_ = static_cast<int64_t>(prop.l2CacheSize) / 2;
  if (const char* e = std::getenv("SS_CUDA_ATTN_L2_PREFETCH_MB"); e && *e)
    l2_prefetch_bytes_ = static_cast<int64_t>(std::strtod(e, nullptr) * (1 << 20));
  SS_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  SS_CUBLAS(cublasCreate(&blas_));
  SS_CUBLAS(cublasSetStream(blas_, stream_));
  // A workspace of its own, so cuBLAS allocates nothing while a graph is captured.
  constexpr size_t kBlasWorkspace = 32u << 20;
  SS_CUDA(cudaMalloc(&blas_ws_, kBlasWorkspace));
  SS_CUBLAS(cublasSetWorkspace(blas_, blas_ws_, kBlasWorkspace));

  H_ = c_.hidden_size;
  nh_ = c_.n_heads;
  nkv_ = c_.n_kv_heads;
  hd_ = c_.head_dim > 0 ? c_.head_dim : H_ / std::max(1, nh_);
  I_ = c_.intermediate_size;
  V_ = c_.vocab_size;
  L_ = c_.n_layers;
  rope_dim_ = c_.rope_dim > 0 ? c_.rope_dim : hd_;
  qd_ = nh_ * hd_;
  kvd_ = nkv_ * hd_;
  if (L_ <= 0 || H_ <= 0 || nh_ <= 0 || nkv_ <= 0 || V_ <= 0 || I_ <= 0 || nh_ % nkv_ != 0)
    return make_error("cuda backend: model config incomplete or heads not a multiple of KV heads");
  if (hd_ > 512) return make_error("cuda backend: head_dim " + std::to_string(hd_) + " > 512 is not supported");
  // The fused decode's attention at batch 1 merges a row's splits in a cluster of 16 where the
  // device launches one (H100, 2026-12-06: 135M 1.7%, 1B 2.2%, 8B 0.5% faster a step; at batch 8,
  // 21-24 clusters of 16 a layer, 9-21% slower, so batch 1 only; the two merges are bit-identical).
  // SS_CUDA_ATTN_CLUSTER=<0|2..16> (a divisor of the 64 splits) sets it.
  attn_cluster_ = cuda::kern::attention_max_cluster(16, hd_, nh_ / std::max(1, nkv_));
  if (const char* e = std::getenv("SS_CUDA_ATTN_CLUSTER"); e && *e) attn_cluster_ = std::atoi(e);
  if (const char* e = std::getenv("SS_CUDA_ATTN_PUSH"); e && std::string(e) == "1") attn_push_ = true;
  if (const char* e = std::getenv("SS_CUDA_CHAIN_TRACE"); e && std::string(e) == "1") {
    h_chain_.assign(static_cast<size_t>(L_) * 5 * cuda::kern::kChainPhases, 0);
    SS_CUDA(cudaMalloc(reinterpret_cast<void**>(&d_chain_), sizeof(unsigned long long) * h_chain_.size()));
    std::fprintf(stderr, "SS_CUDA_CHAIN_TRACE=1: the fused decode's kernels stamp their phases (a copy back a step)\n");
  }
  if (rope_dim_ % 2 != 0 || rope_dim_ > hd_)
    return make_error("cuda backend: rope_dim " + std::to_string(rope_dim_) + " must be even and <= head_dim");
  if (kv_.block_size < 1) return make_error("cuda backend: block_size must be >= 1");
  if (kv_.dtype == KvCacheConfig::DType::Q8)
    return make_error("cuda backend: --kv-cache-dtype q8_0 is not supported on the GPU yet (bf16 cache)");

  // Weights: every matrix as bf16 (Q, K, V fused; gate and up fused), vectors as fp32; the
  // projections packed with --gpu-native-quant, or where their bf16 copies would crowd out the KV
  // cache (keep_weights_quantized; said on stderr).
  const auto& w = model_.weights;
  native_quant_ = opts_.gpu_native_quant;
  if (!native_quant_) {
    size_t free_now = 0, total = 0;
    SS_CUDA(cudaMemGetInfo(&free_now, &total));
    const double util = opts_.gpu_memory_utilization > 0 ? opts_.gpu_memory_utilization : 0.9;
    const size_t bf16_b = all_weight_bytes(false), packed_b = all_weight_bytes(true);
    if (cuda::keep_weights_quantized(static_cast<int64_t>(total), util, static_cast<int64_t>(bf16_b),
                                     static_cast<int64_t>(packed_b))) {
      native_quant_ = true;
      std::fprintf(stderr,
                   "selfserve: bf16 copies of the weights would take %.1f GiB of this process's %.1f GiB "
                   "(--gpu-memory-utilization %.2f), more than %.0f%%: the GGUF's quantized matrices stay "
                   "quantized on the GPU (%.1f GiB, as --gpu-native-quant; steps over 8 tokens dequantize a "
                   "matrix at a time)\n",
                   static_cast<double>(bf16_b) / (1 << 30), util * static_cast<double>(total) / (1 << 30), util,
                   100 * cuda::kBf16WeightShare, static_cast<double>(packed_b) / (1 << 30));
    }
  }
  SS_TRY(weights_.reserve(all_weight_bytes(native_quant_), "weights"));
  const size_t chunk = static_cast<size_t>(std::max(1, opts_.weight_chunk_mb)) << 20;
  for (int i = 0; i < 2; ++i) {
    void* p = nullptr;
    SS_CUDA(cudaMallocHost(&p, chunk));
    pinned_.push_back(p);
  }
  SS_TRY(upload_matrix({&w.token_embd}, &embd_));
  if (c_.tie_embeddings) out_w_ = embd_;
  else SS_TRY(upload_matrix({&w.output}, &out_w_));
  SS_TRY(upload_vector(w.output_norm, &out_norm_));
  layers_.resize(static_cast<size_t>(L_));
  for (int l = 0; l < L_; ++l) {
    const model::LayerWeights& lw = w.layers[static_cast<size_t>(l)];
    Layer& d = layers_[static_cast<size_t>(l)];
    int rows = 0;
    SS_TRY(upload_weights({&lw.wq, &lw.wk, &lw.wv}, &d.wqkv, &rows));
    SS_TRY(upload_weights({&lw.wo}, &d.wo, &rows));
    SS_TRY(upload_weights({&lw.w_gate, &lw.w_up}, &d.wgu, &rows));
    SS_TRY(upload_weights({&lw.w_down}, &d.wdown, &rows));
    SS_TRY(upload_vector(lw.attn_norm, &d.attn_norm));
    SS_TRY(upload_vector(lw.ffn_norm, &d.ffn_norm));
    if (c_.qkv_bias) {
      // One bias vector over the fused projection's rows.
      std::vector<float> bias;
      for (const model::Tensor* t : {&lw.bq, &lw.bk, &lw.bv}) {
        std::vector<float> v(static_cast<size_t>(t->numel()));
        model::dequantize_row(t->type, t->data, v.data(), t->numel());
        bias.insert(bias.end(), v.begin(), v.end());
      }
      d.bqkv = weights_.take<float>(bias.size());
      SS_CUDA(cudaMemcpyAsync(d.bqkv, bias.data(), sizeof(float) * bias.size(), cudaMemcpyHostToDevice, stream_));
      SS_CUDA(cudaStreamSynchronize(stream_));
    }
    if (c_.qk_norm) {
      SS_TRY(upload_vector(lw.q_norm, &d.q_norm));
      SS_TRY(upload_vector(lw.k_norm, &d.k_norm));
    }
  }

  // The largest packed matrix, dequantized for one cuBLAS call at a time (prefill, batch > 8).
  for (const Layer& d : layers_)
    for (auto [wt, n, k] : {std::tuple{&d.wqkv, qd_ + 2 * kvd_, H_}, std::tuple{&d.wo, H_, qd_},
                            std::tuple{&d.wgu, 2 * I_, H_}, std::tuple{&d.wdown, H_, I_}})
      if (wt->format != cuda::kern::WFormat::BF16) wtmp_elems_ = std::max(wtmp_elems_, static_cast<size_t>(n) * k);

  // Scratch for max_batch_tokens tokens and as many logits rows as a step can want.
  cap_tokens_ = std::max(1, opts_.max_batch_tokens);
  cap_rows_ = std::max(1, std::min(cap_tokens_, std::max(1, opts_.max_slots) + 128));
  const size_t T = static_cast<size_t>(cap_tokens_), R = static_cast<size_t>(cap_rows_);
  const size_t sbytes = padded(4 * T * H_) * 2 + padded(4 * T * (qd_ + 2 * kvd_)) + padded(4 * T * qd_) +
                        padded(4 * T * 2 * I_) + padded(4 * R * V_) + padded(2 * T * H_) + padded(2 * T * qd_) +
                        padded(2 * T * I_) + padded(2 * R * H_) + 5 * padded(4 * T) +
                        padded(4 * static_cast<size_t>(tables_.size()) * 1);  // tables sized below
  (void)sbytes;

  // KV cache: the blocks asked for, or what the memory budget leaves after weights and scratch.
  const int64_t block_elems = 2LL * nkv_ * kv_.block_size * hd_;  // one layer's K and V of a block
  const int64_t block_bytes = block_elems * 2 * L_;
  size_t free_b = 0, total_b = 0;
  SS_CUDA(cudaMemGetInfo(&free_b, &total_b));
  const double util = opts_.gpu_memory_utilization > 0 ? opts_.gpu_memory_utilization : 0.9;
  const int max_ctx = c_.max_context > 0 ? c_.max_context : 4096;
  // Scratch estimate (tables sized for the whole context of every slot).
  const int est_blocks = (max_ctx + kv_.block_size - 1) / kv_.block_size + 1;
  const size_t scratch_bytes = padded(4 * T * H_) * 2 + padded(4 * T * (qd_ + 2 * kvd_)) + padded(4 * T * qd_) +
                               padded(4 * T * 2 * I_) + padded(4 * R * V_) + padded(2 * T * H_) +
                               padded(2 * T * qd_) + padded(2 * T * I_) + padded(2 * R * H_) + 6 * padded(4 * T) +
                               padded(4 * R) + padded(4 * static_cast<size_t>(tables_.size() + 1) * est_blocks) +
                               padded(4 * static_cast<size_t>(max_ctx + 1) * rope_dim_) + (16 << 20);
  split_attention_ = kv_.block_size == cuda::kern::kBlockTokens && (hd_ == 64 || hd_ == 128 || hd_ == 256) &&
                     nh_ / nkv_ <= 8;
  fused_ = split_attention_ && H_ % 32 == 0 && qd_ % 32 == 0 && I_ % 32 == 0 && hd_ % 16 == 0 &&
           static_cast<size_t>(kFusedMaxBatch) * H_ * 2 <= 160 * 1024;
  if (opts_.batch_invariant && !fused_)
    return make_error("--batch-invariant: this model has no fused decode path on the GPU (it needs 16-token KV "
                      "blocks, head_dim 64/128/256, at most 8 query heads a KV head and sizes divisible by 32), so "
                      "its large steps could not run as its batch-1 rows do");
  int64_t attn_ws_floats = 0;
  if (split_attention_) {
    for (int n = 1; n <= cap_tokens_; ++n)
      attn_ws_floats = std::max(attn_ws_floats, cuda::kern::attention_workspace_floats(
                                                    n, nh_, hd_, cuda::kern::attention_splits(n, nkv_, sm_count_, max_splits_)));
    if (fused_)
      attn_ws_floats = std::max(attn_ws_floats, cuda::kern::attention_workspace_floats(
                                                    std::min(cap_tokens_, kFusedMaxBatch), nh_, hd_, max_splits_));
  }
  // The fused adds (o_proj, down) whose tiles leave most warp slots idle split K across up to 2 CTAs
  // (dec_add's SplitK), each warp keeping at least 8 chunks of K: on an H100 (2026-12-06 14:52 UTC)
  // Llama-3.2-1B's step 1.300 -> 1.265 ms at batch 1 and 1.690 -> 1.657 at batch 8, its down split
  // and its o_proj whole (split too, o_proj lost what down gained); the 135M and 8B shapes do not
  // split. SS_CUDA_SPLITK=<0..4> (0 or 1: off) and SS_CUDA_SPLITK_MIN=<chunks> override.
  int splitk_max = 2;
  if (const char* e = std::getenv("SS_CUDA_SPLITK"); e && *e) splitk_max = std::clamp(std::atoi(e), 0, 4);
  const int64_t splitk_floats = fused_ && splitk_max > 1 ? cuda::kern::splitk_part_floats(H_, splitk_max) : 0;
  const int splitk_tiles = (H_ + 15) / 16;
  const size_t attn_bytes = padded(4 * static_cast<size_t>(attn_ws_floats)) + padded(4 * T) +
                            padded(4 * static_cast<size_t>(kFusedMaxBatch) * nkv_) +
                            padded(sizeof(cuda::kern::PrefillTile) * T) + padded(4) +
                            (splitk_floats > 0 ? padded(4 * static_cast<size_t>(splitk_floats)) + padded(4 * static_cast<size_t>(splitk_tiles)) : 0);
  {
    const char* e = std::getenv("SS_CUDA_DEVICE_SAMPLING");
    const std::string v = e ? e : "";
    device_sampling_ = v == "1" || (v != "0" && opts_.gpu_device_sampling);
  }
  words_ = (V_ + 31) / 32;
  const int srows = std::min<int>(kSampleChunk, static_cast<int>(R));
  sample_scratch_bytes_ = device_sampling_ ? cuda::kern::sample_scratch_bytes(srows, V_) : 0;
  const size_t samp_bytes =
      device_sampling_ ? padded(sample_scratch_bytes_) + padded(sizeof(cuda::kern::RowSampling) * srows) +
                             padded(sizeof(cuda::kern::LogitEdit) * kEditCap) + padded(4 * static_cast<size_t>(srows) * words_) +
                             padded(4 * R * (1 + kMaxTopLogprobs)) + padded(4 * R * kMaxTopLogprobs)
                       : 0;
  {
    const char* e = std::getenv("SS_CUDA_MEGA");
    bool bf16 = true;
    for (const Layer& d : layers_)
      for (const auto* wt : {&d.wqkv, &d.wo, &d.wgu, &d.wdown}) bf16 = bf16 && wt->format == cuda::kern::WFormat::BF16;
    mega_ = e && std::string(e) == "1" && fused_ && bf16 && !c_.qk_norm;
    const char* sync = std::getenv("SS_CUDA_MEGA_SYNC");
    mega_barriers_ = !(sync && std::string(sync) == "counters");
    const char* deal = std::getenv("SS_CUDA_MEGA_DEAL");
    mega_deal_rr_ = deal && std::string(deal) == "rr";
    if (mega_ && opts_.batch_invariant) {  // its rows are not the chain's bits
      std::fprintf(stderr, "selfserve: SS_CUDA_MEGA=1 ignored: --batch-invariant runs the PDL-chained kernels\n");
      mega_ = false;
    }
    if (mega_) {
      const std::string why = cuda::kern::mega_unsupported(mega_args());
      if (!why.empty()) std::fprintf(stderr, "selfserve: SS_CUDA_MEGA=1 ignored: the persistent decode kernel does not take %s\n", why.c_str());
      mega_ = why.empty();
    }
  }
  const bool mega_trace = mega_ && std::getenv("SS_CUDA_MEGA_TRACE") && std::string(std::getenv("SS_CUDA_MEGA_TRACE")) == "1";
  const size_t mega_bytes = mega_ ? padded(cuda::kern::mega_work_bytes(mega_args())) +
                                        padded(sizeof(cuda::kern::MegaLayer) * static_cast<size_t>(L_)) +
                                        padded(8 * static_cast<size_t>(cuda::kern::mega_trace_words(L_)))
                                  : 0;
  if (kv_.num_blocks <= 0) {  // this process's share of the card (vLLM's meaning), less what it holds
    SS_ASSIGN(const int64_t blocks,
              cuda::kv_blocks_for_budget(static_cast<int64_t>(total_b), static_cast<int64_t>(free_b),
                                         static_cast<int64_t>(weights_.capacity() + kBlasWorkspace), util,
                                         static_cast<int64_t>(scratch_bytes + attn_bytes + samp_bytes + mega_bytes + padded(2 * wtmp_elems_)),
                                         block_bytes, 1 << 22));
    kv_.num_blocks = static_cast<int>(blocks);
  }
  kv_.dtype = KvCacheConfig::DType::F16;  // reported as 16-bit; the GPU cache holds bf16
  // One spare block beyond the engine's, written by graph padding rows only.
  spare_block_ = kv_.num_blocks;
  SS_TRY(kv_mem_.reserve(static_cast<size_t>(block_bytes) * (kv_.num_blocks + 1), "KV cache"));
  cache_ = kv_mem_.take<bf16_bits>(static_cast<size_t>(block_elems) * L_ * (kv_.num_blocks + 1));
  layer_cache_elems_ = block_elems * (kv_.num_blocks + 1);
  max_position_ = std::min(max_ctx, kv_.num_blocks * kv_.block_size);
  max_blocks_ = (max_position_ + kv_.block_size - 1) / kv_.block_size;

  SS_TRY(scratch_.reserve(scratch_bytes + attn_bytes + samp_bytes + mega_bytes + padded(2 * wtmp_elems_), "scratch"));
  if (wtmp_elems_ > 0) wtmp_ = scratch_.take<bf16_bits>(wtmp_elems_);
  x_ = scratch_.take<float>(T * H_);
  tmp_ = scratch_.take<float>(T * H_);
  qkv_ = scratch_.take<float>(T * (qd_ + 2 * kvd_));
  q_ = scratch_.take<float>(T * qd_);
  gu_ = scratch_.take<float>(T * 2 * I_);
  logits_ = scratch_.take<float>(R * V_);
  xn_ = scratch_.take<bf16_bits>(T * H_);
  att_ = scratch_.take<bf16_bits>(T * qd_);
  act_ = scratch_.take<bf16_bits>(T * I_);
  xr_ = scratch_.take<bf16_bits>(R * H_);
  d_tokens_ = scratch_.take<int32_t>(T);
  d_pos_ = scratch_.take<int32_t>(T);
  d_tok_table_ = scratch_.take<int32_t>(T);
  d_rows_ = scratch_.take<int32_t>(R);
  d_ids_ = scratch_.take<int32_t>(R);
  spare_slot_ = tables_.size();  // its table: the spare block
  d_tables_ = scratch_.take<int32_t>(static_cast<size_t>(tables_.size() + 1) * max_blocks_);
  rope_cs_ = scratch_.take<float>(static_cast<size_t>(max_position_) * rope_dim_);
  d_ctx_ = scratch_.take<int32_t>(T);
  if (attn_ws_floats > 0) attn_ws_ = scratch_.take<float>(static_cast<size_t>(attn_ws_floats));
  if (fused_) {
    attn_counters_ = scratch_.take<unsigned>(static_cast<size_t>(kFusedMaxBatch) * nkv_);
    if (!attn_counters_) return make_error("cuda backend: scratch estimate too small (a bug)");
    SS_CUDA(cudaMemsetAsync(attn_counters_, 0, sizeof(unsigned) * kFusedMaxBatch * nkv_, stream_));
  }
  if (splitk_floats > 0) {
    splitk_.part = scratch_.take<float>(static_cast<size_t>(splitk_floats));
    splitk_.tickets = scratch_.take<unsigned>(static_cast<size_t>(splitk_tiles));
    if (!splitk_.part || !splitk_.tickets) return make_error("cuda backend: scratch estimate too small (a bug)");
    SS_CUDA(cudaMemsetAsync(splitk_.tickets, 0, sizeof(unsigned) * splitk_tiles, stream_));
    splitk_.part_floats = splitk_floats, splitk_.n_tickets = splitk_tiles, splitk_.max_ks = splitk_max;
    splitk_.min_chunks_per_warp = 8;
    if (const char* e = std::getenv("SS_CUDA_SPLITK_MIN"); e && *e) splitk_.min_chunks_per_warp = std::clamp(std::atoi(e), 1, 64);
  }
  if (!d_ctx_ || (attn_ws_floats > 0 && !attn_ws_)) return make_error("cuda backend: scratch estimate too small (a bug)");
  {
    const char* e = std::getenv("SS_CUDA_PREFILL_ATTN");
    flash_prefill_ = split_attention_ && (hd_ == 64 || hd_ == 128) && !(e && std::string(e) == "rows");
    // Packed-group tiles are the default past the fused path (H200, 2026-12-05: the 8B batch-64 step
    // 10.56 -> 7.02 ms at context 512, prefill unchanged); SS_CUDA_GROUP_TILES=0 keeps the row kernel.
    const char* g = std::getenv("SS_CUDA_GROUP_TILES");
    group_tiles_ = flash_prefill_ && !(g && std::string(g) == "0") && nh_ / nkv_ <= cuda::kern::kPrefillTileRows;
    // Split keys: the default since the H100 run of 2026-12-06 (every backend test passes with them;
    // 8B context 512: batch 16 8.24 -> 7.97 ms, batch 64 9.19 -> 8.96 ms). SS_CUDA_SPLIT_KEYS=0: off.
    const char* sk = std::getenv("SS_CUDA_SPLIT_KEYS");
    split_keys_ = !(sk && std::string(sk) == "0");
  }
  if (device_sampling_) {
    d_sample_scratch_ = scratch_.take<uint8_t>(sample_scratch_bytes_);
    d_rowp_ = scratch_.take<cuda::kern::RowSampling>(std::min<size_t>(kSampleChunk, R));
    d_edits_ = scratch_.take<cuda::kern::LogitEdit>(kEditCap);
    d_mask_ = scratch_.take<uint32_t>(std::min<size_t>(kSampleChunk, R) * words_);
    d_lp_ = scratch_.take<float>(R * (1 + kMaxTopLogprobs));
    d_lp_ids_ = scratch_.take<int32_t>(R * kMaxTopLogprobs);
    if (!d_sample_scratch_ || !d_rowp_ || !d_edits_ || !d_mask_ || !d_lp_ || !d_lp_ids_)
      return make_error("cuda backend: scratch estimate too small (a bug)");
    edit_of_.assign(static_cast<size_t>(V_), -1);
  }
  if (mega_) {
    const size_t wb = cuda::kern::mega_work_bytes(mega_args());
    mega_work_ = scratch_.take<uint8_t>(wb);
    d_mega_layers_ = scratch_.take<cuda::kern::MegaLayer>(static_cast<size_t>(L_));
    if (mega_trace) {
      d_mega_trace_ = scratch_.take<unsigned long long>(static_cast<size_t>(cuda::kern::mega_trace_words(L_)));
      h_mega_trace_.resize(static_cast<size_t>(cuda::kern::mega_trace_words(L_)));
    }
    if (!mega_work_ || !d_mega_layers_ || (mega_trace && !d_mega_trace_))
      return make_error("cuda backend: scratch estimate too small (a bug)");
    std::vector<cuda::kern::MegaLayer> ml(static_cast<size_t>(L_));
    for (int l = 0; l < L_; ++l) {
      const Layer& d = layers_[static_cast<size_t>(l)];
      ml[static_cast<size_t>(l)] = {static_cast<const bf16_bits*>(d.wqkv.q), static_cast<const bf16_bits*>(d.wo.q),
                                    static_cast<const bf16_bits*>(d.wgu.q), static_cast<const bf16_bits*>(d.wdown.q),
                                    d.attn_norm, d.ffn_norm, d.bqkv, cache_ + layer_cache_elems_ * l};
    }
    SS_CUDA(cudaMemsetAsync(mega_work_, 0, wb, stream_));
    SS_CUDA(cudaMemcpyAsync(d_mega_layers_, ml.data(), sizeof(cuda::kern::MegaLayer) * ml.size(),
                            cudaMemcpyHostToDevice, stream_));
    SS_CUDA(cudaStreamSynchronize(stream_));
  }
  if (flash_prefill_) {
    d_tiles_ = scratch_.take<cuda::kern::PrefillTile>(T);
    d_n_tiles_ = scratch_.take<int32_t>(1);
    if (!d_tiles_ || !d_n_tiles_) return make_error("cuda backend: scratch estimate too small (a bug)");
  }
  if (!rope_cs_) return make_error("cuda backend: scratch estimate too small (a bug)");
  {
    std::vector<float> cs(static_cast<size_t>(max_position_) * rope_dim_);
    rope_table(rope_inv_freq(c_, rope_dim_), 0, max_position_, cs.data());
    SS_CUDA(cudaMemcpyAsync(rope_cs_, cs.data(), sizeof(float) * cs.size(), cudaMemcpyHostToDevice, stream_));
    SS_CUDA(cudaStreamSynchronize(stream_));
  }
  // Pinned host mirrors of the per-step inputs and outputs.
  auto pinned = [&](size_t bytes, void** p) -> Status {
    SS_CUDA(cudaMallocHost(p, bytes));
    pinned_.push_back(*p);
    return {};
  };
  void* p = nullptr;
  SS_TRY(pinned(4 * (4 * T + R), &p));  // tokens | positions | token slots | contexts (cap_tokens_ each) | rows
  h_in_ = static_cast<int32_t*>(p);
  SS_TRY(pinned(4 * R, &p));
  h_ids_ = static_cast<int32_t*>(p);
  if (flash_prefill_) {
    SS_TRY(pinned(sizeof(cuda::kern::PrefillTile) * T, &p));
    h_tiles_ = static_cast<cuda::kern::PrefillTile*>(p);
  }
  SS_TRY(pinned(4 * static_cast<size_t>(tables_.size() + 1) * max_blocks_, &p));
  h_tables_ = static_cast<int32_t*>(p);
  h_tables_[static_cast<size_t>(spare_slot_) * max_blocks_] = spare_block_;
  SS_CUDA(cudaMemcpyAsync(d_tables_ + static_cast<size_t>(spare_slot_) * max_blocks_,
                          h_tables_ + static_cast<size_t>(spare_slot_) * max_blocks_, 4, cudaMemcpyHostToDevice, stream_));
  SS_CUDA(cudaStreamSynchronize(stream_));
  graphs_.assign(32, nullptr);
  SS_TRY(pinned(4 * R * V_, &p));
  h_logits_ = static_cast<float*>(p);
  if (device_sampling_) {
    const size_t chunk_rows = std::min<size_t>(kSampleChunk, R);
    SS_TRY(pinned(sizeof(cuda::kern::RowSampling) * chunk_rows, &p));
    h_rowp_ = static_cast<cuda::kern::RowSampling*>(p);
    SS_TRY(pinned(sizeof(cuda::kern::LogitEdit) * kEditCap, &p));
    h_edits_ = static_cast<cuda::kern::LogitEdit*>(p);
    SS_TRY(pinned(4 * chunk_rows * words_, &p));
    h_mask_ = static_cast<uint32_t*>(p);
    SS_TRY(pinned(4 * R * (1 + kMaxTopLogprobs), &p));
    h_lp_ = static_cast<float*>(p);
    SS_TRY(pinned(4 * R * kMaxTopLogprobs, &p));
    h_lp_ids_ = static_cast<int32_t*>(p);
  }
  samplers_.emplace_back(V_);
  return {};
}

// The matrix that `parts` stacked row-wise make: every part present and of one width.
static Status stacked_shape(std::initializer_list<const model::Tensor*> parts, int64_t* rows, int64_t* cols) {
  *rows = 0, *cols = -1;
  for (const model::Tensor* t : parts) {
    if (!t->valid()) return make_error("cuda backend: a weight is missing");
    if (*cols >= 0 && t->cols() != *cols) return make_error("cuda backend: fused parts of unequal width: " + t->name);
    *cols = t->cols();
    *rows += t->rows();
  }
  return {};
}

// Rows of `parts` stacked into one bf16 matrix: each row dequantized to fp32 on the host, rounded to
// bf16 into a pinned chunk, copied while the next chunk is prepared in the other buffer.
Status CudaBackend::upload_matrix(std::initializer_list<const model::Tensor*> parts, bf16_bits** out) {
  int64_t rows = 0, cols = -1;
  SS_TRY(stacked_shape(parts, &rows, &cols));
  bf16_bits* dst = weights_.take<bf16_bits>(static_cast<size_t>(rows * cols));
  if (!dst) return make_error("cuda backend: weight arena too small (a bug)");
  *out = dst;
  const size_t chunk_elems = (static_cast<size_t>(std::max(1, opts_.weight_chunk_mb)) << 20) / sizeof(bf16_bits);
  const int64_t rows_per_chunk = std::max<int64_t>(1, static_cast<int64_t>(chunk_elems) / cols);
  std::vector<float> row(static_cast<size_t>(cols));
  cudaEvent_t done[2];
  SS_CUDA(cudaEventCreateWithFlags(&done[0], cudaEventDisableTiming));
  SS_CUDA(cudaEventCreateWithFlags(&done[1], cudaEventDisableTiming));
  int buf = 0;
  int64_t written = 0;
  Status st;
  for (const model::Tensor* t : parts) {
    for (int64_t r0 = 0; r0 < t->rows() && st.ok(); r0 += rows_per_chunk) {
      const int64_t n = std::min(rows_per_chunk, t->rows() - r0);
      st = cuda_status(cudaEventSynchronize(done[buf]), "staging buffer", __FILE__, __LINE__);
      if (!st.ok()) break;
      auto* stage = static_cast<bf16_bits*>(pinned_[static_cast<size_t>(buf)]);
      for (int64_t r = 0; r < n; ++r) {
        model::dequantize_row(t->type, t->row(r0 + r), row.data(), cols);
        for (int64_t i = 0; i < cols; ++i) stage[r * cols + i] = model::fp32_to_bf16(row[static_cast<size_t>(i)]);
      }
      st = cuda_status(cudaMemcpyAsync(dst + written * cols, stage, sizeof(bf16_bits) * n * cols, cudaMemcpyHostToDevice,
                                       stream_),
                       "weight upload", __FILE__, __LINE__);
      if (st.ok()) st = cuda_status(cudaEventRecord(done[buf], stream_), "weight upload", __FILE__, __LINE__);
      written += n;
      buf ^= 1;
    }
  }
  cudaStreamSynchronize(stream_);
  cudaEventDestroy(done[0]);
  cudaEventDestroy(done[1]);
  return st;
}

namespace {
cuda::kern::WFormat packed_format(std::initializer_list<const model::Tensor*> parts, bool enabled) {
  using cuda::kern::WFormat;
  if (!enabled) return WFormat::BF16;
  const model::DType t0 = (*parts.begin())->type;
  for (const model::Tensor* t : parts)
    if (t->type != t0 || t->cols() % 32 != 0) return WFormat::BF16;
  const bool whole_super_blocks = (*parts.begin())->cols() % 256 == 0;
  switch (t0) {
    case model::DType::Q4_0: return WFormat::Q4_0;
    case model::DType::Q4_1: return WFormat::Q4_1;
    case model::DType::Q8_0: return WFormat::Q8_0;
    case model::DType::Q4_K: return whole_super_blocks ? WFormat::Q4_K : WFormat::BF16;
    case model::DType::Q6_K: return whole_super_blocks ? WFormat::Q6_K : WFormat::BF16;
    case model::DType::Q5_K: return whole_super_blocks ? WFormat::Q5_K : WFormat::BF16;
    case model::DType::Q5_0: return WFormat::Q5_0;
    case model::DType::Q5_1: return WFormat::Q5_1;
    default: return WFormat::BF16;
  }
}
}  // namespace

size_t CudaBackend::all_weight_bytes(bool native) const {
  const auto& w = model_.weights;
  size_t wbytes = padded(sizeof(bf16_bits) * static_cast<size_t>(V_) * H_) * (c_.tie_embeddings ? 1 : 2) +
                  padded(sizeof(float) * H_);
  size_t per_layer_max = 0;
  for (int l = 0; l < L_; ++l) {
    const model::LayerWeights& lw = w.layers[static_cast<size_t>(l)];
    const size_t b = weight_bytes({&lw.wq, &lw.wk, &lw.wv}, native) + weight_bytes({&lw.wo}, native) +
                     weight_bytes({&lw.w_gate, &lw.w_up}, native) + weight_bytes({&lw.w_down}, native) +
                     2 * padded(sizeof(float) * H_) + padded(sizeof(float) * (qd_ + 2 * kvd_)) +
                     2 * padded(sizeof(float) * hd_);
    per_layer_max = std::max(per_layer_max, b);
  }
  return wbytes + per_layer_max * static_cast<size_t>(L_);
}

size_t CudaBackend::weight_bytes(std::initializer_list<const model::Tensor*> parts, bool native) const {
  int64_t rows = 0, cols = 0;
  for (const model::Tensor* t : parts) rows += t->rows(), cols = t->cols();
  const cuda::kern::WFormat f = packed_format(parts, native);
  if (f == cuda::kern::WFormat::BF16) return padded(sizeof(bf16_bits) * static_cast<size_t>(rows * cols));
  const int K = static_cast<int>(cols);
  if (cuda::kern::groups_layout()) return padded(cuda::kern::packed_bytes(f, rows, K));
  const size_t scales = padded(2 * cuda::kern::packed_scale_count(f, rows, K));
  return padded(cuda::kern::packed_q_bytes(f, rows, K)) + scales * (cuda::kern::has_min_array(f) ? 2 : 1);
}

Status CudaBackend::upload_weights(std::initializer_list<const model::Tensor*> parts, cuda::kern::DevWeights* out,
                                   int* rows_out) {
  namespace k = cuda::kern;
  const k::WFormat f = packed_format(parts, native_quant_);
  int64_t rows = 0, cols = -1;
  SS_TRY(stacked_shape(parts, &rows, &cols));
  *rows_out = static_cast<int>(rows);
  ++total_mats_;
  if (f != k::WFormat::BF16) ++packed_mats_;
  if (f == k::WFormat::BF16) {
    bf16_bits* p = nullptr;
    SS_TRY(upload_matrix(parts, &p));
    *out = k::bf16_weights(p);
    return {};
  }
  // Pack on the host (the whole matrix), then copy each array (or, in the groups layout, the blocked
  // buffer: kernels.h, to_groups) through the pinned staging buffer.
  const int K = static_cast<int>(cols);
  const size_t rq = k::packed_q_bytes(f, 1, K), rs = k::packed_scale_count(f, 1, K);
  std::vector<uint8_t> q(rq * rows);
  std::vector<uint16_t> d(rs * rows), m(k::has_min_array(f) ? rs * rows : 0);
  int64_t r = 0;
  for (const model::Tensor* t : parts)
    for (int64_t i = 0; i < t->rows(); ++i, ++r)
      SS_TRY(k::pack_row(f, t->row(i), K, q.data() + r * rq, d.data() + r * rs, m.empty() ? nullptr : m.data() + r * rs));
  auto copy = [&](const void* src, size_t bytes) -> Expected<void*> {
    void* dst = weights_.take<uint8_t>(bytes);
    if (!dst) return make_error("cuda backend: weight arena too small (a bug)");
    const size_t chunk = static_cast<size_t>(std::max(1, opts_.weight_chunk_mb)) << 20;
    for (size_t off = 0; off < bytes; off += chunk) {
      const size_t n = std::min(chunk, bytes - off);
      std::memcpy(pinned_[0], static_cast<const uint8_t*>(src) + off, n);
      SS_TRY(cuda_status(cudaMemcpyAsync(static_cast<uint8_t*>(dst) + off, pinned_[0], n, cudaMemcpyHostToDevice, stream_),
                         "weight upload", __FILE__, __LINE__));
      SS_TRY(cuda_status(cudaStreamSynchronize(stream_), "weight upload", __FILE__, __LINE__));
    }
    return dst;
  };
  if (k::groups_layout()) {
    std::vector<uint8_t> blocked(k::packed_bytes(f, rows, K));
    k::to_groups(f, rows, K, q.data(), d.data(), m.empty() ? nullptr : m.data(), blocked.data());
    auto bd = copy(blocked.data(), blocked.size());
    if (!bd.ok()) return make_error(bd.message());
    *out = k::DevWeights{f, bd.value(), nullptr, nullptr, true};
    return {};
  }
  auto qd = copy(q.data(), q.size());
  if (!qd.ok()) return make_error(qd.message());
  auto dd = copy(d.data(), 2 * d.size());
  if (!dd.ok()) return make_error(dd.message());
  void* md = nullptr;
  if (!m.empty()) {
    auto mm = copy(m.data(), 2 * m.size());
    if (!mm.ok()) return make_error(mm.message());
    md = mm.value();
  }
  *out = k::DevWeights{f, qd.value(), static_cast<const uint16_t*>(dd.value()), static_cast<const uint16_t*>(md)};
  return {};
}

Expected<const bf16_bits*> CudaBackend::bf16_of(const cuda::kern::DevWeights& w, int N, int K) {
  if (w.format == cuda::kern::WFormat::BF16) return static_cast<const bf16_bits*>(w.q);
  if (!wtmp_ || static_cast<size_t>(N) * K > wtmp_elems_) return make_error("cuda backend: no room to dequantize (a bug)");
  SS_TRY(cuda::kern::dequantize_weights(w, N, K, wtmp_, stream_));
  return static_cast<const bf16_bits*>(wtmp_);
}

Status CudaBackend::upload_vector(const model::Tensor& t, float** out) {
  if (!t.valid()) return make_error("cuda backend: a norm weight is missing");
  std::vector<float> v(static_cast<size_t>(t.numel()));
  model::dequantize_row(t.type, t.data, v.data(), t.numel());
  *out = weights_.take<float>(v.size());
  if (!*out) return make_error("cuda backend: weight arena too small (a bug)");
  SS_CUDA(cudaMemcpyAsync(*out, v.data(), sizeof(float) * v.size(), cudaMemcpyHostToDevice, stream_));
  SS_CUDA(cudaStreamSynchronize(stream_));
  return {};
}

// y[n][out] = W[out][in] . x[n][in]: bf16 in, fp32 accumulate and out.
Status CudaBackend::gemm(const bf16_bits* w, int out_dim, int in_dim, const bf16_bits* x, int n, float* y) {
  const float one = 1.0f, zero = 0.0f;
  SS_CUBLAS(cublasGemmEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, out_dim, n, in_dim, &one, w, CUDA_R_16BF, in_dim, x,
                         CUDA_R_16BF, in_dim, &zero, y, CUDA_R_32F, out_dim, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return {};
}

cuda::kern::MegaDecode CudaBackend::mega_args() const {
  cuda::kern::MegaDecode m{};
  m.L = L_, m.H = H_, m.I = I_, m.V = V_, m.eps = c_.rms_norm_eps, m.scale = 1.0f / std::sqrt(static_cast<float>(hd_));
  m.layers = d_mega_layers_, m.out_w = out_w_, m.out_norm = out_norm_;
  cuda::kern::RopeKv& rk = m.rk;
  rk.rope_cs = rope_cs_, rk.rope_dim = rope_dim_, rk.interleaved = c_.rope_style == model::RopeStyle::Interleaved;
  rk.n_heads = nh_, rk.n_kv = nkv_, rk.hd = hd_, rk.positions = d_pos_, rk.seq_of_token = d_tok_table_;
  rk.tables = d_tables_, rk.max_blocks = max_blocks_, rk.q_out = q_, rk.norm_eps = c_.rms_norm_eps;
  m.ctx_len = d_ctx_, m.resid = x_, m.att = att_, m.act = act_, m.logits = logits_, m.rows = d_rows_;
  m.work = mega_work_;
  m.barriers = mega_barriers_;
  m.deal_rr = mega_deal_rr_;
  return m;
}

Status CudaBackend::collect_mega_trace() {
  SS_CUDA(cudaMemcpyAsync(h_mega_trace_.data(), d_mega_trace_, 8 * h_mega_trace_.size(), cudaMemcpyDeviceToHost, stream_));
  SS_CUDA(cudaStreamSynchronize(stream_));
  const unsigned long long* t = h_mega_trace_.data();
  for (int l = 0; l < L_; ++l)
    for (int i = 0; i < 10; ++i) {
      const unsigned long long prev = i > 0 ? t[10 * l + i - 1] : l > 0 ? t[10 * l - 1] : t[10 * L_];
      mega_trace_us_[i] += 1e-3 * static_cast<double>(t[10 * l + i] - prev) / L_;
    }
  mega_trace_us_[10] += 1e-3 * static_cast<double>(t[10 * L_ + 1] - t[10 * L_ - 1]);
  // The barriers alone, then each of a layer's five split: CTA 0's arrival to the last CTA's
  // (waiting for the slowest), and the last arrival to CTA 0 leaving (the barrier itself).
  const unsigned long long* last = t + cuda::kern::mega_trace_arrivals(L_);
  constexpr int P = cuda::kern::kMegaTraceProbe;
  mega_probe_us_ += 1e-3 * static_cast<double>(t[10 * L_ + 3] - t[10 * L_ + 2]) / P;
  for (int l = 0; l < L_; ++l)
    for (int j = 0; j < 5; ++j) {
      const int i = 2 * j + 1;  // the barrier's part
      const double arrive = static_cast<double>(t[10 * l + i - 1]), leave = static_cast<double>(t[10 * l + i]);
      const double lst = static_cast<double>(last[P + 5 * l + j]);
      mega_wait_us_[j] += 1e-3 * (lst - arrive) / L_;
      mega_release_us_[j] += 1e-3 * (leave - lst) / L_;
    }
  ++mega_traced_;
  return {};
}

Status CudaBackend::collect_chain_trace() {
  chain_pending_ = false;
  SS_CUDA(cudaMemcpy(h_chain_.data(), d_chain_, sizeof(unsigned long long) * h_chain_.size(), cudaMemcpyDeviceToHost));
  constexpr int P = cuda::kern::kChainPhases;
  auto at = [&](int l, int kk) { return h_chain_.data() + (static_cast<size_t>(l) * 5 + kk) * P; };
  bool any = false;
  for (int l = 0; l < L_; ++l)
    for (int kk = 0; kk < 5; ++kk) {
      const unsigned long long* p = at(l, kk);
      const unsigned long long* prev = kk > 0 ? at(l, kk - 1) : l > 0 ? at(l - 1, 4) : nullptr;
      if (!p[0] || !p[P - 1] || !prev || !prev[P - 1]) continue;  // not stamped (a skipped kernel), or layer 0's QKV
      any = true;
      const double t0 = static_cast<double>(p[0]), end_prev = static_cast<double>(prev[P - 1]);
      chain_start_us_[kk] += 1e-3 * (t0 - end_prev);
      chain_released_us_[kk] += 1e-3 * (static_cast<double>(p[1]) - end_prev);
      for (int i = 1; i < P; ++i)
        if (p[i] && i != 6) chain_us_[kk][i] += 1e-3 * (static_cast<double>(p[i]) - t0);
      if (kk == 1 && p[6]) chain_us_[kk][6] += 1e-3 * (static_cast<double>(p[6]) - t0), ++chain_merge_n_;
      ++chain_n_[kk];
    }
  if (any) ++chain_steps_;
  // A later step that does not stamp (a batch past the fused path) must not count these again.
  SS_CUDA(cudaMemset(d_chain_, 0, sizeof(unsigned long long) * h_chain_.size()));
  return {};
}

Status CudaBackend::forward_chunks(int T, int R) {
  namespace k = cuda::kern;
  const int K = kFusedMaxBatch;
  int32_t *const tokens = d_tokens_, *const pos = d_pos_, *const slot = d_tok_table_, *const ctx = d_ctx_;
  float* const x = x_;
  Status st;
  for (int t0 = 0; t0 < T && st.ok(); t0 += K) {
    d_tokens_ = tokens + t0, d_pos_ = pos + t0, d_tok_table_ = slot + t0, d_ctx_ = ctx + t0;
    x_ = x + static_cast<size_t>(t0) * H_;
    st = forward_fused(std::min(K, T - t0), 0);
  }
  d_tokens_ = tokens, d_pos_ = pos, d_tok_table_ = slot, d_ctx_ = ctx, x_ = x;
  SS_TRY(st);
  // The rows index the whole step's residual.
  for (int r0 = 0; r0 < R; r0 += K)
    SS_TRY(k::dec_norm_gemv(k::bf16_weights(out_w_), x_, d_rows_ + r0, out_norm_, c_.rms_norm_eps,
                            logits_ + static_cast<size_t>(r0) * V_, V_, H_, std::min(K, R - r0), pdl_, stream_));
  mark(kLmHead);
  return {};
}

Status CudaBackend::forward_fused(int T, int R) {
  namespace k = cuda::kern;
  if (T > kFusedMaxBatch || R > kFusedMaxBatch) return forward_chunks(T, R);
  const float eps = c_.rms_norm_eps;
  const bool pdl = pdl_;
  // Benchmarking only: SS_CUDA_SKIP=<letters> leaves kernels out of the fused step (q: QKV, a: attention,
  // o: o_proj, g: gate/up, d: down), so the step's time without them gives each kernel's marginal cost
  // inside the graph, PDL overlap included (docs/perf/gpu.md). The outputs are then wrong.
  static const std::string skip = [] {
    const char* e = std::getenv("SS_CUDA_SKIP");
    if (e && *e) std::fprintf(stderr, "SS_CUDA_SKIP=%s: kernels left out of every decode step, outputs are WRONG\n", e);
    return std::string(e ? e : "");
  }();
  auto on = [&](char c) { return skip.find(c) == std::string::npos; };
  mark(kSample);  // the input copies (attributed to the step's bookkeeping)
  cuda::embed(embd_, d_tokens_, T, H_, x_, stream_);
  mark(kEmbed);
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  if (mega_) cudaStreamIsCapturing(stream_, &capturing);
  const bool in_graph = capturing != cudaStreamCaptureStatusNone;
  if (mega_ && !in_loop_ && skip.empty() && !(in_graph && mega_uncaptured_)) {
    cuda::kern::MegaDecode m = mega_args();
    const bool trace = d_mega_trace_ && !in_graph;  // eager steps only: the stamps are read after a sync
    if (trace) m.trace = d_mega_trace_;
    SS_TRY(k::mega_decode(m, T, R, stream_));
    if (trace) SS_TRY(collect_mega_trace());
    mark(kLmHead);  // the whole step: its stages are not separable
    return {};
  }
  if (d_chain_) {
    SS_CUDA(cudaMemsetAsync(d_chain_, 0, sizeof(unsigned long long) * h_chain_.size(), stream_));
    chain_pending_ = true;
  }
  // The phase trace's slot of kernel kk (0..4) of layer l, when tracing.
  auto chain_slot = [&](int l, int kk) {
    return d_chain_ ? d_chain_ + (static_cast<size_t>(l) * 5 + kk) * k::kChainPhases : nullptr;
  };
  for (int l = 0; l < L_; ++l) {
    const Layer& d = layers_[static_cast<size_t>(l)];
    bf16_bits* layer_cache = cache_ + layer_cache_elems_ * l;
    k::RopeKv rk{};
    rk.rope_cs = rope_cs_, rk.rope_dim = rope_dim_, rk.interleaved = c_.rope_style == model::RopeStyle::Interleaved;
    rk.n_heads = nh_, rk.n_kv = nkv_, rk.hd = hd_, rk.positions = d_pos_, rk.seq_of_token = d_tok_table_;
    rk.tables = d_tables_, rk.max_blocks = max_blocks_, rk.q_out = q_, rk.cache = layer_cache, rk.bias = d.bqkv;
    rk.norm_eps = eps;
    float q_scale = 1.0f / std::sqrt(static_cast<float>(hd_));  // the attention's, unless q comes pre-scaled
    if (on('q')) k::set_chain_slot(chain_slot(l, 0));
    if (!c_.qk_norm) {
      if (on('q')) SS_TRY(k::dec_qkv(d.wqkv, x_, d.attn_norm, eps, H_, T, rk, pdl, stream_));
    } else if (on('q')) {
      // Qwen3's per-head q/k RMSNorm needs a whole head's sum of squares, which the GEMV's epilogue
      // (one RoPE pair a thread) does not have: the normed projection writes fp32 rows, then the
      // unfused epilogue (norms, bias, RoPE, KV store; q pre-scaled) runs as its own kernel.
      SS_TRY(k::dec_norm_gemv(d.wqkv, x_, nullptr, d.attn_norm, eps, qkv_, qd_ + 2 * kvd_, H_, T, pdl, stream_));
      cuda::QkvEpilogue e{qkv_, d.bqkv, d.bqkv ? d.bqkv + qd_ : nullptr, d.bqkv ? d.bqkv + qd_ + kvd_ : nullptr,
                          d.q_norm, d.k_norm, eps, rope_cs_, rope_dim_,
                          c_.rope_style == model::RopeStyle::Interleaved, q_scale,
                          nh_, nkv_, hd_, kv_.block_size, max_blocks_, d_pos_, d_tok_table_, d_tables_, q_, layer_cache};
      cuda::qkv_epilogue(e, T, stream_);
      q_scale = 1.0f;
    }
    mark(kQkv);
    k::Attention a{q_,       layer_cache,    nh_,         nkv_,        hd_,  q_scale,
                   d_ctx_,   d_tok_table_,   d_tables_,   max_blocks_, att_, attn_ws_,
                   max_splits_, attn_counters_};
    a.pdl = pdl;
    a.l2_prefetch_bytes = l2_prefetch_bytes_;
    a.cluster = T == 1 ? attn_cluster_ : 0;
    a.cluster_push = attn_push_;
    a.empty = k::empty_kernels();
    a.stamps = chain_slot(l, 1);
    // The split count of the largest batch at every batch size: a row's result then depends on its
    // own context only (batch invariance); splits past the context exit at once.
    if (on('a')) SS_TRY(k::attention(a, T, max_splits_, stream_));
    mark(kAttn);
    if (on('o')) {
      k::set_chain_slot(chain_slot(l, 2));
      SS_TRY(k::dec_add(d.wo, att_, x_, H_, qd_, T, pdl, stream_, &splitk_));
    }
    mark(kOProj);
    if (on('g')) {
      k::set_chain_slot(chain_slot(l, 3));
      SS_TRY(k::dec_gate_up(d.wgu, x_, d.ffn_norm, eps, act_, I_, H_, T, pdl, stream_));
    }
    mark(kGateUp);
    if (on('d')) {
      k::set_chain_slot(chain_slot(l, 4));
      SS_TRY(k::dec_add(d.wdown, act_, x_, H_, I_, T, pdl, stream_, &splitk_));
    }
    mark(kDown);
  }
  if (R == 0) return {};
  SS_TRY(k::dec_norm_gemv(k::bf16_weights(out_w_), x_, d_rows_, out_norm_, eps, logits_, V_, H_, R, pdl, stream_));
  mark(kLmHead);
  return {};
}

void CudaBackend::mark(Stage st) {
  if (!prof_active()) return;
  if (marked_.size() == events_.size()) {
    cudaEvent_t e = nullptr;
    if (cudaEventCreate(&e) != cudaSuccess) return;
    events_.push_back(e);
  }
  cudaEventRecord(events_[marked_.size()], stream_);
  marked_.push_back(st);
}

void CudaBackend::collect_marks() {
  if (!prof_active()) return;
  mark(kSample);
  cudaEventSynchronize(events_[marked_.size() - 1]);
  for (size_t i = 1; i < marked_.size(); ++i) {
    float ms = 0;
    if (cudaEventElapsedTime(&ms, events_[i - 1], events_[i]) == cudaSuccess) stage_ms_[marked_[i]] += ms;
  }
  marked_.clear();
  ++prof_forwards_;
}

void CudaBackend::set_profiling(bool on, bool) {
  if (!profile_env_) return;
  if (profiling_ && !on && prof_forwards_ > 0) {
    static const char* names[kStages] = {"embed", "qkv", "attn", "o_proj", "gate_up", "down", "norm/rope (unfused)",
                                         "lm_head", "copies+sample"};
    double tot = 0;
    for (double v : stage_ms_) tot += v;
    std::fprintf(stderr, "cuda profile (%lld forwards, %.4f ms each):", static_cast<long long>(prof_forwards_),
                 tot / prof_forwards_);
    for (int i = 0; i < kStages; ++i)
      if (stage_ms_[i] > 0) std::fprintf(stderr, " %s %.4f", names[i], stage_ms_[i] / prof_forwards_);
    std::fprintf(stderr, " (ms per forward)\n");
  }
  profiling_ = on;
}

StepProfile CudaBackend::profile() const {
  StepProfile p;
  p.matmul_s = (stage_ms_[kQkv] + stage_ms_[kOProj] + stage_ms_[kGateUp] + stage_ms_[kDown]) * 1e-3;
  p.lm_head_s = stage_ms_[kLmHead] * 1e-3;
  p.attention_s = stage_ms_[kAttn] * 1e-3;
  p.rope_kv_s = 0;  // in the QKV projection's epilogue (matmul)
  p.other_s = (stage_ms_[kEmbed] + stage_ms_[kNormQkvEtc] + stage_ms_[kSample]) * 1e-3;
  p.forwards = prof_forwards_;
  p.tokens = prof_tokens_;
  return p;
}

void CudaBackend::reset_profile() {
  for (double& v : stage_ms_) v = 0;
  prof_forwards_ = prof_tokens_ = 0;
}

Status CudaBackend::forward(int T, int R) {
  if (fused_step(T, R)) return forward_fused(T, R);
  const float eps = c_.rms_norm_eps;
  mark(kSample);  // the input copies (attributed to the step's bookkeeping)
  cuda::embed(embd_, d_tokens_, T, H_, x_, stream_);
  mark(kEmbed);
  for (int l = 0; l < L_; ++l) {
    const Layer& d = layers_[static_cast<size_t>(l)];
    bf16_bits* layer_cache = cache_ + layer_cache_elems_ * l;
    // The previous layer's FFN output joins the residual here (none before the first layer).
    cuda::add_rmsnorm(x_, l == 0 ? nullptr : tmp_, d.attn_norm, T, H_, eps, xn_, stream_);
    mark(kNormQkvEtc);
    auto wqkv = bf16_of(d.wqkv, qd_ + 2 * kvd_, H_);
    if (!wqkv.ok()) return make_error(wqkv.message());
    SS_TRY(gemm(wqkv.value(), qd_ + 2 * kvd_, H_, xn_, T, qkv_));
    mark(kQkv);
    cuda::QkvEpilogue e{qkv_, d.bqkv, d.bqkv ? d.bqkv + qd_ : nullptr, d.bqkv ? d.bqkv + qd_ + kvd_ : nullptr,
                        d.q_norm, d.k_norm, eps, rope_cs_, rope_dim_,
                        c_.rope_style == model::RopeStyle::Interleaved, 1.0f / std::sqrt(static_cast<float>(hd_)),
                        nh_, nkv_, hd_, kv_.block_size, max_blocks_, d_pos_, d_tok_table_, d_tables_, q_, layer_cache};
    cuda::qkv_epilogue(e, T, stream_);
    mark(kNormQkvEtc);
    if (n_tiles_ > 0) {
      cuda::kern::PrefillAttention a{q_,     layer_cache, nh_,       nkv_,     hd_, 1.0f /* q is pre-scaled */,
                                     d_ctx_, d_tables_,   max_blocks_, d_tiles_, n_tiles_, att_};
      a.pack_group = group_tiles_;
      a.split_keys = split_keys_;
      a.n_tiles_dev = tiles_on_device_ ? d_n_tiles_ : nullptr;
      SS_TRY(cuda::kern::prefill_attention(a, stream_));
    } else if (split_attention_) {
      const int splits = cuda::kern::attention_splits(T, nkv_, sm_count_, max_splits_);
      cuda::kern::Attention a{q_,  layer_cache, nh_,  nkv_,     hd_,     1.0f /* q is pre-scaled */,
                              d_ctx_, d_tok_table_, d_tables_, max_blocks_, att_, attn_ws_, splits, nullptr};
      a.l2_prefetch_bytes = l2_prefetch_bytes_;
      SS_TRY(cuda::kern::attention(a, T, splits, stream_));
    } else {
      cuda::Attention a{q_, layer_cache, nh_, nkv_, hd_, kv_.block_size, max_blocks_, d_pos_, d_tok_table_, d_tables_, att_};
      cuda::attention(a, T, stream_);
    }
    mark(kAttn);
    auto wo = bf16_of(d.wo, H_, qd_);
    if (!wo.ok()) return make_error(wo.message());
    SS_TRY(gemm(wo.value(), H_, qd_, att_, T, tmp_));
    mark(kOProj);
    cuda::add_rmsnorm(x_, tmp_, d.ffn_norm, T, H_, eps, xn_, stream_);
    mark(kNormQkvEtc);
    auto wgu = bf16_of(d.wgu, 2 * I_, H_);
    if (!wgu.ok()) return make_error(wgu.message());
    SS_TRY(gemm(wgu.value(), 2 * I_, H_, xn_, T, gu_));
    mark(kGateUp);
    cuda::silu_mul(gu_, T, I_, act_, stream_);
    mark(kNormQkvEtc);
    auto wdown = bf16_of(d.wdown, H_, I_);
    if (!wdown.ok()) return make_error(wdown.message());
    SS_TRY(gemm(wdown.value(), H_, I_, act_, T, tmp_));
    mark(kDown);
  }
  if (R == 0) return {};
  cuda::add_rmsnorm(x_, tmp_, out_norm_, T, H_, eps, xn_, stream_);
  cuda::gather_rows(xn_, d_rows_, R, H_, xr_, stream_);
  mark(kNormQkvEtc);
  SS_TRY(gemm(out_w_, V_, H_, xr_, R, logits_));
  mark(kLmHead);
  return {};
}

namespace {
bool simple_greedy(const SampleRow& r) {
  const SamplingParams& p = *r.params;
  return p.greedy() && p.logit_bias.empty() && p.repetition_penalty == 1.0f && p.presence_penalty == 0.0f &&
         p.frequency_penalty == 0.0f && r.banned.empty() && !r.mask && r.logprobs < 0;
}
}  // namespace

// One block's every layer, through cudaMemcpy2DAsync over the [layer][block][2][n_kv][block_size][hd]
// cache: in place for registered host memory (written without a GPU, 2026-12-05), else staged.
// Batched (2026-12-06, written without a GPU): every block of a batch is issued, then one
// cudaStreamSynchronize, where each block used to wait for its own (a 2 MiB block's DMA is only
// ~40-80 us at 25-50 GB/s, so a wait and a launch a block were a large part of it).
Status CudaBackend::copy_kv_block(int32_t block, uint8_t* host, bool to_host, bool* issued_in_place) {
  const size_t bytes = static_cast<size_t>(kv_block_bytes());
  const size_t row = sizeof(bf16_bits) * 2 * static_cast<size_t>(nkv_) * kv_.block_size * hd_;  // one layer
  bf16_bits* dev = cache_ + static_cast<int64_t>(block) * 2 * nkv_ * kv_.block_size * hd_;
  const size_t pitch = sizeof(bf16_bits) * static_cast<size_t>(layer_cache_elems_);
  if (is_registered(host, bytes)) {  // page-locked: DMA in place, waited for with the batch
    if (to_host)
      SS_CUDA(cudaMemcpy2DAsync(host, row, dev, pitch, row, L_, cudaMemcpyDeviceToHost, stream_));
    else
      SS_CUDA(cudaMemcpy2DAsync(dev, pitch, host, row, row, L_, cudaMemcpyHostToDevice, stream_));
    *issued_in_place = true;
    return {};
  }
  SS_TRY(ensure_kv_stage());
  if (to_host) {  // the last slot is the read slot: no write ever stages there
    uint8_t* st = kv_stage_ + static_cast<size_t>(kKvStages) * bytes;
    SS_CUDA(cudaMemcpy2DAsync(st, row, dev, pitch, row, L_, cudaMemcpyDeviceToHost, stream_));
    SS_CUDA(cudaStreamSynchronize(stream_));
    std::memcpy(host, st, bytes);
    return {};
  }
  const int k = kv_stage_next_;
  kv_stage_next_ = (k + 1) % kKvStages;
  SS_CUDA(cudaEventSynchronize(kv_stage_ev_[k]));  // that slot's previous copy has left it
  uint8_t* st = kv_stage_ + static_cast<size_t>(k) * bytes;
  std::memcpy(st, host, bytes);
  SS_CUDA(cudaMemcpy2DAsync(dev, pitch, st, row, row, L_, cudaMemcpyHostToDevice, stream_));
  SS_CUDA(cudaEventRecord(kv_stage_ev_[k], stream_));
  return {};
}

Status CudaBackend::read_kv_blocks(std::span<const KvBlockOut> blocks) {
  SS_TRY(check_kv_block_copies(blocks, kv_.num_blocks, kv_block_bytes(), "cuda backend"));
  bool in_place = false;
  Status st;
  for (const KvBlockOut& b : blocks)
    if (st = copy_kv_block(b.block, b.bytes.data(), true, &in_place); !st.ok()) break;
  // The registered blocks' DMAs are in flight: the caller reads those bytes once this returns.
  if (in_place) SS_CUDA(cudaStreamSynchronize(stream_));
  return st;
}

Status CudaBackend::write_kv_blocks(std::span<const KvBlockIn> blocks) {
  SS_TRY(check_kv_block_copies(blocks, kv_.num_blocks, kv_block_bytes(), "cuda backend"));
  bool in_place = false;
  Status st;
  for (const KvBlockIn& b : blocks)
    if (st = copy_kv_block(b.block, const_cast<uint8_t*>(b.bytes.data()), false, &in_place); !st.ok()) break;
  // In place: the tiers reuse the bytes once this returns. Staged copies need no wait (their slots
  // hold the bytes; stream order puts them before the next step).
  if (in_place) SS_CUDA(cudaStreamSynchronize(stream_));
  return st;
}

void CudaBackend::register_host_memory(void* p, size_t bytes) {
  if (!p || bytes == 0) return;
  const cudaError_t e = cudaHostRegister(p, bytes, cudaHostRegisterDefault);
  if (e != cudaSuccess) {
    cudaGetLastError();
    std::fprintf(stderr, "selfserve: cuda backend: cannot page-lock %zu MiB of KV tier memory (%s): its blocks go "
                 "through staging buffers\n", bytes >> 20, cudaGetErrorString(e));
    return;
  }
  registered_.emplace_back(static_cast<const uint8_t*>(p), bytes);
}

void CudaBackend::unregister_host_memory(void* p) {
  for (auto it = registered_.begin(); it != registered_.end(); ++it)
    if (it->first == p) {  // no copy of it is in flight: in-place copies are waited for, staged ones never use it
      cudaHostUnregister(p);
      registered_.erase(it);
      return;
    }
}

Status CudaBackend::ensure_kv_stage() {
  if (kv_stage_) return {};
  void* p = nullptr;
  SS_CUDA(cudaMallocHost(&p, static_cast<size_t>(kKvStages + 1) * static_cast<size_t>(kv_block_bytes())));
  pinned_.push_back(p);
  for (cudaEvent_t& e : kv_stage_ev_) {
    SS_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    SS_CUDA(cudaEventRecord(e, stream_));
  }
  kv_stage_ = static_cast<uint8_t*>(p);
  return {};
}

Status CudaBackend::upload_table_edits(const StepBatch& b) {
  for (const TableEdit& e : b.table_edits) {
    const auto t = tables_.of(e.slot);
    if (static_cast<int>(t.size()) > max_blocks_)
      return make_error("cuda backend: slot " + std::to_string(e.slot) + " holds " + std::to_string(t.size()) +
                        " blocks, more than a sequence of the context needs");
    int32_t* row = h_tables_ + static_cast<size_t>(e.slot) * max_blocks_;
    std::copy(t.begin(), t.end(), row);
    if (!t.empty())
      SS_CUDA(cudaMemcpyAsync(d_tables_ + static_cast<size_t>(e.slot) * max_blocks_, row, 4 * t.size(),
                              cudaMemcpyHostToDevice, stream_));
  }
  return {};
}

Status CudaBackend::decode_graph(const StepBatch& b, StepOutput& out, bool* done) {
  *done = false;
  const int T = static_cast<int>(b.tokens.size());
  if (opts_.enforce_eager || prof_active() || T == 0 || b.seq_slot.size() != static_cast<size_t>(T) || !b.score_rows.empty() ||
      !b.logits_rows.empty() || b.sample_rows.size() != static_cast<size_t>(T))
    return {};
  for (int i = 0; i < T; ++i)
    if (b.seq_index[static_cast<size_t>(i)] != i || b.sample_rows[static_cast<size_t>(i)].token != i ||
        !simple_greedy(b.sample_rows[static_cast<size_t>(i)]))
      return {};
  int B = 1, lg = 0;
  while (B < T) B *= 2, ++lg;
  if (B > cap_tokens_ || B > cap_rows_) return {};
  const int C = cap_tokens_;
  int32_t* in = h_in_;
  // The pinned inputs are rewritten only once the previous replay (which reads them) has ended: every
  // step synchronises before it returns.
  for (int i = 0; i < B; ++i) {
    const bool real = i < T;
    in[i] = real ? b.tokens[static_cast<size_t>(i)] : 0;
    in[C + i] = real ? b.positions[static_cast<size_t>(i)] : 0;
    in[2 * C + i] = real ? b.seq_slot[static_cast<size_t>(i)] : spare_slot_;
    in[3 * C + i] = in[C + i] + 1;
    in[4 * C + i] = i;
  }
  // Steps past the fused path's batch run the attention as packed-group tiles when asked: a tile a
  // row, rewritten before every replay like the inputs above.
  const bool tiles = group_tiles_ && !fused_step(B, B);
  if (tiles)
    for (int i = 0; i < B; ++i) h_tiles_[i] = cuda::kern::PrefillTile{i, 1, in[2 * C + i], 0};
  cudaGraphExec_t& g = graphs_[static_cast<size_t>(lg)];
  if (!g) {
    SS_CUDA(cudaStreamSynchronize(stream_));  // the table edits are not part of the graph
    SS_CUDA(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    Status st;
    auto rec = [&](cudaError_t e, const char* what) {
      if (st.ok()) st = cuda_status(e, what, __FILE__, __LINE__);
    };
    rec(cudaMemcpyAsync(d_tokens_, in, 4 * B, cudaMemcpyHostToDevice, stream_), "graph inputs");
    rec(cudaMemcpyAsync(d_pos_, in + C, 4 * B, cudaMemcpyHostToDevice, stream_), "graph inputs");
    rec(cudaMemcpyAsync(d_tok_table_, in + 2 * C, 4 * B, cudaMemcpyHostToDevice, stream_), "graph inputs");
    rec(cudaMemcpyAsync(d_ctx_, in + 3 * C, 4 * B, cudaMemcpyHostToDevice, stream_), "graph inputs");
    rec(cudaMemcpyAsync(d_rows_, in + 4 * C, 4 * B, cudaMemcpyHostToDevice, stream_), "graph inputs");
    if (tiles)
      rec(cudaMemcpyAsync(d_tiles_, h_tiles_, sizeof(cuda::kern::PrefillTile) * B, cudaMemcpyHostToDevice, stream_),
          "graph inputs");
    n_tiles_ = tiles ? B : 0;
    if (st.ok()) st = forward(B, B);
    n_tiles_ = 0;
    if (st.ok()) cuda::argmax_rows(logits_, B, V_, d_ids_, stream_);
    rec(cudaMemcpyAsync(h_ids_, d_ids_, 4 * B, cudaMemcpyDeviceToHost, stream_), "graph outputs");
    cudaGraph_t graph = nullptr;
    const cudaError_t end = cudaStreamEndCapture(stream_, &graph);
    rec(end, "graph capture");
    if (st.ok()) rec(cudaGraphInstantiate(&g, graph, 0), "graph instantiate");
    if (graph) cudaGraphDestroy(graph);
    if (!st.ok()) {
      g = nullptr;
      cudaGetLastError();
      if (mega_ && !mega_uncaptured_) {  // captured again without the persistent kernel
        std::fprintf(stderr, "selfserve: a decode graph with the persistent kernel failed (%s); graphs use the "
                             "PDL-chained kernels\n", st.message().c_str());
        mega_uncaptured_ = true;
        return decode_graph(b, out, done);
      }
      return st;
    }
  }
  SS_CUDA(cudaGraphLaunch(g, stream_));
  SS_CUDA(cudaStreamSynchronize(stream_));
  if (d_chain_) chain_pending_ = true;  // the captured step stamps at every replay
  if (chain_pending_) SS_TRY(collect_chain_trace());
  out.tokens.assign(h_ids_, h_ids_ + T);
  out.logprobs.resize(static_cast<size_t>(T));
  for (auto& lp : out.logprobs) lp.top.clear();
  out.scores.clear();
  out.logits.clear();
  *done = true;
  return {};
}

Status CudaBackend::loop_forward(int T, int R) {
  if (!group_tiles_ || fused_step(T, R)) return forward(T, R);
  SS_TRY(cuda::kern::build_tiles(d_tok_table_, d_pos_, T, tile_positions(), d_tiles_, d_n_tiles_, stream_));
  n_tiles_ = T, tiles_on_device_ = true;
  const Status st = forward(T, R);
  n_tiles_ = 0, tiles_on_device_ = false;
  return st;
}

// The device loop's graphs: the step over T tokens (inputs already in d_tokens_ .. d_rows_, written
// by the scheduler kernel) and the argmax of R rows into d_ids_; no copies in or out.
Expected<std::unique_ptr<resident::LoopRunner>> CudaBackend::make_loop_runner(const resident::Geometry& g,
                                                                             const resident::LoopShare& share) {
  if (opts_.enforce_eager) return std::unique_ptr<resident::LoopRunner>();  // no graphs: the host loop
  if (loop_made_) return make_error("cuda backend: one device loop at a time per backend");
  if (share.first_slot < 0 || share.first_slot + g.max_slots > static_cast<int>(tables_.size()) ||
      share.first_block < 0 || share.first_block + share.blocks > kv_.num_blocks)
    return make_error("cuda backend: the device loop's share of slots or blocks is out of range");
  cuda::LoopHooks h;
  h.backend_name = name();
  h.stream = stream_;
  h.tokens = d_tokens_, h.positions = d_pos_, h.token_slot = d_tok_table_, h.ctx = d_ctx_, h.rows = d_rows_;
  h.ids = d_ids_;
  h.tables = d_tables_;
  h.max_blocks = max_blocks_;
  h.max_position = max_position_;
  h.spare_slot = spare_slot_;
  h.cap_tokens = cap_tokens_;
  h.cap_rows = cap_rows_;
  h.record_step = [this](int T, int R, bool pdl) {
    pdl_ = pdl, in_loop_ = true;
    Status st = loop_forward(T, R);
    pdl_ = true, in_loop_ = false;
    if (st.ok()) cuda::argmax_rows(logits_, R, V_, d_ids_, stream_);
    return st;
  };
  h.record_sample_step = [this](int T, int R, bool pdl, const void* params, void* scratch, size_t bytes) {
    pdl_ = pdl, in_loop_ = true;
    Status st = loop_forward(T, R);
    pdl_ = true, in_loop_ = false;
    if (st.ok())
      st = cuda::kern::sample(logits_, R, V_, static_cast<const cuda::kern::RowSampling*>(params), nullptr, 0, scratch,
                              bytes, d_ids_, stream_);
    return st;
  };
  h.on_close = [this](bool chain_stopped) {
    loop_made_ = false;
    if (!chain_stopped) wedged_ = true;
  };
  SS_CUDA(cudaStreamSynchronize(stream_));
  SS_ASSIGN(auto r, cuda::make_device_loop_runner(h, g, share));
  loop_made_ = true;
  return r;
}

Status CudaBackend::step(const StepBatch& b, StepOutput& out) {
  SS_TRY(tables_.apply(b, kv_.num_blocks));
  SS_TRY(validate_batch(b, tables_, kv_.num_blocks, kv_.block_size, V_));
  const int T = static_cast<int>(b.tokens.size());
  for (int i = 0; i < T; ++i)
    if (b.positions[static_cast<size_t>(i)] >= max_position_)
      return make_error("StepBatch row " + std::to_string(i) + ": position " + std::to_string(b.positions[i]) +
                        " is past the model's context and the KV cache (" + std::to_string(max_position_) +
                        " positions)");
  if (T > cap_tokens_)
    return make_error("cuda backend: a step of " + std::to_string(T) + " tokens is more than the " +
                      std::to_string(cap_tokens_) + " its scratch was sized for (--max-num-batched-tokens)");
  rows_.clear();
  for (const SampleRow& r : b.sample_rows) rows_.push_back(r.token);
  for (const ScoreRow& r : b.score_rows) rows_.push_back(r.token);
  rows_.insert(rows_.end(), b.logits_rows.begin(), b.logits_rows.end());
  const int R = static_cast<int>(rows_.size());
  if (R > cap_rows_)
    return make_error("cuda backend: " + std::to_string(R) + " logits rows in one step, more than " +
                      std::to_string(cap_rows_));
  if (T == 0) {
    sample_on_host(b, nullptr, V_, samplers_, nullptr, out);
    out.logits.clear();
    return {};
  }
  SS_TRY(upload_table_edits(b));
  bool done = false;
  SS_TRY(decode_graph(b, out, &done));
  if (done) return {};
  // Inputs: tokens, positions, each token's slot, the logits rows.
  const int C = cap_tokens_;
  int32_t* in = h_in_;
  for (int i = 0; i < T; ++i) {
    in[i] = b.tokens[static_cast<size_t>(i)];
    in[C + i] = b.positions[static_cast<size_t>(i)];
    in[2 * C + i] = b.seq_slot[static_cast<size_t>(b.seq_index[static_cast<size_t>(i)])];
    in[3 * C + i] = in[C + i] + 1;
  }
  std::copy(rows_.begin(), rows_.end(), in + 4 * C);
  SS_CUDA(cudaMemcpyAsync(d_tokens_, in, 4 * T, cudaMemcpyHostToDevice, stream_));
  SS_CUDA(cudaMemcpyAsync(d_pos_, in + C, 4 * T, cudaMemcpyHostToDevice, stream_));
  SS_CUDA(cudaMemcpyAsync(d_tok_table_, in + 2 * C, 4 * T, cudaMemcpyHostToDevice, stream_));
  SS_CUDA(cudaMemcpyAsync(d_ctx_, in + 3 * C, 4 * T, cudaMemcpyHostToDevice, stream_));
  if (R > 0) SS_CUDA(cudaMemcpyAsync(d_rows_, in + 4 * C, 4 * R, cudaMemcpyHostToDevice, stream_));
  n_tiles_ = 0;
  if (flash_prefill_ && !fused_step(T, R)) {
    // Tensor-core tiles pay off when rows come in runs (prompt chunks); a step of mostly decode rows
    // (one row a tile) keeps the row kernel and its splits along long contexts. With the group's
    // heads packed into a tile (the default; SS_CUDA_GROUP_TILES=0: off) every step of this path
    // takes the tiles: a decode row fills G rows of a CTA that reads its K/V once for the group.
    const int n = cuda::kern::prefill_tiles(in + 2 * C, in + C, T, h_tiles_, tile_positions());
    if ((group_tiles_ || n * 8 <= T) && n <= 65535) {  // the grid's y; more tiles keep the row kernel
      SS_CUDA(cudaMemcpyAsync(d_tiles_, h_tiles_, sizeof(cuda::kern::PrefillTile) * n, cudaMemcpyHostToDevice, stream_));
      n_tiles_ = n;
    }
  }
  const Status fw = forward(T, R);
  n_tiles_ = 0;
  SS_TRY(fw);

  const int ns = static_cast<int>(b.sample_rows.size());
  const bool device_greedy =
      b.score_rows.empty() && std::all_of(b.sample_rows.begin(), b.sample_rows.end(), simple_greedy);
  if (!device_greedy && device_sampling_ && device_samples(b)) return sample_on_device(b, out);
  const int host_rows = device_greedy ? R - ns : R;  // rows whose logits come back
  if (device_greedy && ns > 0) {
    cuda::argmax_rows(logits_, ns, V_, d_ids_, stream_);
    SS_CUDA(cudaMemcpyAsync(h_ids_, d_ids_, 4 * ns, cudaMemcpyDeviceToHost, stream_));
  }
  const int first = R - host_rows;
  if (host_rows > 0)
    SS_CUDA(cudaMemcpyAsync(h_logits_, logits_ + static_cast<size_t>(first) * V_,
                            sizeof(float) * static_cast<size_t>(host_rows) * V_, cudaMemcpyDeviceToHost, stream_));
  SS_CUDA(cudaStreamSynchronize(stream_));
  SS_CUDA(cudaGetLastError());
  collect_marks();
  if (chain_pending_) SS_TRY(collect_chain_trace());
  const size_t raw0 = static_cast<size_t>(ns + static_cast<int>(b.score_rows.size()) - first) * V_;
  out.logits.assign(h_logits_ + raw0, h_logits_ + static_cast<size_t>(host_rows) * V_);
  if (device_greedy) {
    out.tokens.assign(h_ids_, h_ids_ + ns);
    out.logprobs.resize(static_cast<size_t>(ns));
    for (auto& lp : out.logprobs) lp.top.clear();
    out.scores.clear();
  } else {
    sample_on_host(b, h_logits_, V_, samplers_, nullptr, out);
  }
  return {};
}

namespace {
// At most this many logit edits for a row (its bans, bias entries and penalised tokens).
size_t edits_bound(const SampleRow& r) {
  const SamplingParams& p = *r.params;
  size_t n = r.banned.size() + p.logit_bias.size();
  if (p.repetition_penalty != 1.0f) n += r.prompt.size() + r.output.size();
  else if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) n += r.output.size();
  return n;
}
}  // namespace

// Whether every row of the step can be sampled on the device exactly as the host samples it: no
// score rows (their raw log-softmax is the host's), at most kMaxTopLogprobs top logprobs, a row's
// edits within one batch, and no bias id twice in a row (the host adds the two one after the other).
bool CudaBackend::device_samples(const StepBatch& b) const {
  if (!b.score_rows.empty()) return false;
  for (const SampleRow& r : b.sample_rows) {
    if (r.logprobs > kMaxTopLogprobs || edits_bound(r) > static_cast<size_t>(kEditCap)) return false;
    const auto& bias = r.params->logit_bias;
    if (bias.size() > 1) {
      std::vector<int32_t> ids;
      ids.reserve(bias.size());
      for (const auto& e : bias) ids.push_back(e.first);
      std::sort(ids.begin(), ids.end());
      if (std::adjacent_find(ids.begin(), ids.end()) != ids.end()) return false;
    }
  }
  return true;
}

// Every sample row drawn on the device, the host reference sampler's rules (backend/cpu/sampler.cpp)
// step for step: bans, bias and penalties edited into the row in place; a grammar mask applied first
// where the host applies it first (top-k / top-p / min-p, logprobs), else consulted after the draw
// (counter 2n) and a refused draw redrawn from the masked row (counter 2n + 1); logprobs of the
// edited, masked row. Raw logits rows (after the sample rows) come back as they are.
Status CudaBackend::sample_on_device(const StepBatch& b, StepOutput& out) {
  namespace k = cuda::kern;
  const int ns = static_cast<int>(b.sample_rows.size());
  const int R = static_cast<int>(rows_.size());
  if (R > ns)
    SS_CUDA(cudaMemcpyAsync(h_logits_, logits_ + static_cast<size_t>(ns) * V_,
                            sizeof(float) * static_cast<size_t>(R - ns) * V_, cudaMemcpyDeviceToHost, stream_));
  int top_k = 0;
  for (const SampleRow& r : b.sample_rows) top_k = std::max(top_k, std::min(r.logprobs, kMaxTopLogprobs));
  const bool any_lp = std::any_of(b.sample_rows.begin(), b.sample_rows.end(), [](const SampleRow& r) { return r.logprobs >= 0; });
  auto mask_first = [](const SampleRow& r) {
    const SamplingParams& p = *r.params;
    const bool truncate = p.top_k > 0 || p.top_p < 1.0f || p.min_p > 0.0f;
    return r.mask && (r.logprobs >= 0 || (truncate && !p.greedy()));
  };
  // Edits of rows [c0, c1), uploaded and applied in batches of kEditCap.
  int n_edits = 0;
  auto flush_edits = [&]() -> Status {
    if (n_edits == 0) return {};
    SS_CUDA(cudaMemcpyAsync(d_edits_, h_edits_, sizeof(k::LogitEdit) * n_edits, cudaMemcpyHostToDevice, stream_));
    SS_TRY(k::edit_logits(logits_, V_, d_edits_, n_edits, stream_));
    SS_CUDA(cudaStreamSynchronize(stream_));  // h_edits_ is refilled next
    n_edits = 0;
    return {};
  };
  std::vector<int32_t> touched;
  for (int c0 = 0; c0 < ns; c0 += kSampleChunk) {
    const int c1 = std::min(ns, c0 + kSampleChunk), n = c1 - c0;
    bool any_mask = false;
    for (int i = c0; i < c1; ++i) {
      const SampleRow& r = b.sample_rows[static_cast<size_t>(i)];
      const SamplingParams& p = *r.params;
      touched.clear();
      auto edit = [&](int32_t id) -> k::LogitEdit* {
        if (id < 0 || id >= V_) return nullptr;
        int32_t& at = edit_of_[static_cast<size_t>(id)];
        if (at < 0) {
          at = n_edits++;
          h_edits_[at] = k::LogitEdit{i, id, 0u, 0.0f, 1.0f, 0.0f};
          touched.push_back(id);
        }
        return &h_edits_[at];
      };
      // A row's edits land in one batch (one edit per token; device_samples() bounded them).
      if (static_cast<size_t>(n_edits) + edits_bound(r) > static_cast<size_t>(kEditCap)) SS_TRY(flush_edits());
      for (int32_t id : r.banned)
        if (auto* e = edit(id)) e->flags |= k::kEditBan;
      for (const auto& [id, v] : p.logit_bias)  // distinct ids (device_samples())
        if (auto* e = edit(id)) e->flags |= k::kEditAdd, e->add = v;
      if (p.repetition_penalty != 1.0f) {
        auto mark = [&](int32_t id) {
          if (auto* e = edit(id)) e->flags |= k::kEditRep, e->rep = p.repetition_penalty;
        };
        for (int32_t id : r.prompt) mark(id);
        for (int32_t id : r.output) mark(id);
      }
      if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) {
        for (int32_t id : r.output)
          if (auto* e = edit(id)) e->flags |= k::kEditSub, e->sub += 1.0f;  // counts, turned into the penalty below
        for (int32_t id : touched) {
          k::LogitEdit& e = h_edits_[edit_of_[static_cast<size_t>(id)]];
          if (e.flags & k::kEditSub) e.sub = p.presence_penalty + p.frequency_penalty * e.sub;
        }
      }
      for (int32_t id : touched) edit_of_[static_cast<size_t>(id)] = -1;
      h_rowp_[i - c0] = k::RowSampling{p.greedy() ? 0.0f : p.temperature, p.top_k, p.top_p, p.min_p, p.seed, 2 * r.n};
      if (mask_first(r)) any_mask = true;
    }
    SS_TRY(flush_edits());
    const uint32_t* bitmask = nullptr;
    if (any_mask) {
      for (int i = c0; i < c1; ++i) {
        const SampleRow& r = b.sample_rows[static_cast<size_t>(i)];
        uint32_t* w = h_mask_ + static_cast<size_t>(i - c0) * words_;
        if (mask_first(r)) r.mask->fill_bitmask(w, V_);
        else std::fill_n(w, words_, 0xffffffffu);
      }
      SS_CUDA(cudaMemcpyAsync(d_mask_, h_mask_, 4 * static_cast<size_t>(n) * words_, cudaMemcpyHostToDevice, stream_));
      bitmask = d_mask_;
    }
    SS_CUDA(cudaMemcpyAsync(d_rowp_, h_rowp_, sizeof(k::RowSampling) * n, cudaMemcpyHostToDevice, stream_));
    SS_TRY(k::sample(logits_ + static_cast<size_t>(c0) * V_, n, V_, d_rowp_, bitmask, words_, d_sample_scratch_,
                     sample_scratch_bytes_, d_ids_ + c0, stream_));
    if (any_lp)
      SS_TRY(k::logprobs(logits_ + static_cast<size_t>(c0) * V_, n, V_, bitmask, words_, d_ids_ + c0, top_k, d_lp_ + c0,
                         d_lp_ids_ + static_cast<size_t>(c0) * top_k, d_lp_ + R + static_cast<size_t>(c0) * top_k, stream_));
    SS_CUDA(cudaStreamSynchronize(stream_));  // h_rowp_ and h_mask_ are refilled by the next chunk
  }
  SS_CUDA(cudaMemcpyAsync(h_ids_, d_ids_, 4 * static_cast<size_t>(ns), cudaMemcpyDeviceToHost, stream_));
  if (any_lp) {
    SS_CUDA(cudaMemcpyAsync(h_lp_, d_lp_, 4 * static_cast<size_t>(ns), cudaMemcpyDeviceToHost, stream_));
    SS_CUDA(cudaMemcpyAsync(h_lp_ + R, d_lp_ + R, 4 * static_cast<size_t>(ns) * top_k, cudaMemcpyDeviceToHost, stream_));
    SS_CUDA(cudaMemcpyAsync(h_lp_ids_, d_lp_ids_, 4 * static_cast<size_t>(ns) * top_k, cudaMemcpyDeviceToHost, stream_));
  }
  SS_CUDA(cudaStreamSynchronize(stream_));
  SS_CUDA(cudaGetLastError());
  collect_marks();
  if (chain_pending_) SS_TRY(collect_chain_trace());
  // A grammar consulted after the draw: a refused token is redrawn from the masked row.
  for (int i = 0; i < ns; ++i) {
    const SampleRow& r = b.sample_rows[static_cast<size_t>(i)];
    if (!r.mask || mask_first(r) || r.mask->allows(h_ids_[i])) continue;
    const SamplingParams& p = *r.params;
    r.mask->fill_bitmask(h_mask_, V_);
    h_rowp_[0] = k::RowSampling{p.greedy() ? 0.0f : p.temperature, p.top_k, p.top_p, p.min_p, p.seed, 2 * r.n + 1};
    SS_CUDA(cudaMemcpyAsync(d_mask_, h_mask_, 4 * static_cast<size_t>(words_), cudaMemcpyHostToDevice, stream_));
    SS_CUDA(cudaMemcpyAsync(d_rowp_, h_rowp_, sizeof(k::RowSampling), cudaMemcpyHostToDevice, stream_));
    SS_TRY(k::sample(logits_ + static_cast<size_t>(i) * V_, 1, V_, d_rowp_, d_mask_, words_, d_sample_scratch_,
                     sample_scratch_bytes_, d_ids_ + i, stream_));
    SS_CUDA(cudaMemcpyAsync(h_ids_ + i, d_ids_ + i, 4, cudaMemcpyDeviceToHost, stream_));
    SS_CUDA(cudaStreamSynchronize(stream_));
  }
  out.tokens.assign(h_ids_, h_ids_ + ns);
  out.logprobs.resize(static_cast<size_t>(ns));
  for (int i = 0; i < ns; ++i) {
    RowLogprobs& lp = out.logprobs[static_cast<size_t>(i)];
    lp.top.clear();
    const int want = b.sample_rows[static_cast<size_t>(i)].logprobs;
    if (want < 0) continue;
    lp.chosen = h_lp_[i];
    for (int j = 0; j < std::min(want, top_k); ++j)
      lp.top.emplace_back(h_lp_ids_[static_cast<size_t>(i) * top_k + j], h_lp_[R + static_cast<size_t>(i) * top_k + j]);
  }
  out.scores.clear();
  out.logits.assign(h_logits_, h_logits_ + static_cast<size_t>(R - ns) * V_);
  return {};
}

}  // namespace ss::backend

// The plugin's entry points (backend/cuda_loader.cpp resolves them with dlsym).
extern "C" __attribute__((visibility("default"))) void ss_cuda_device_summary(std::string* out) {
  out->clear();
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    cudaGetLastError();
    return;
  }
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) return;
  *out = std::string(p.name) + ", " + std::to_string(p.totalGlobalMem >> 20) + " MiB, " +
         std::to_string(p.multiProcessorCount) + " SMs, compute " + std::to_string(p.major) + "." +
         std::to_string(p.minor);
}

extern "C" __attribute__((visibility("default"))) ss::backend::Backend* ss_cuda_make_backend(
    const ss::model::Model* model, const ss::backend::BackendOptions* opts, std::string* error) {
  auto be = ss::backend::CudaBackend::create(*model, *opts);
  if (!be.ok()) {
    *error = be.message();
    return nullptr;
  }
  return std::move(be).value().release();
}
