// The CPU implementation of backend::Backend: Llama / Qwen2 / Qwen3 forward pass over a paged KV
// cache it owns, then the host sampler over the rows that want a token. Private to cpu/:
// make_cpu_backend() (backend.h) is the way in.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/kernels.h"
#include "common/huge_buffer.h"
#include "common/thread_pool.h"
#include "model/model.h"

namespace ss::backend {

using CpuProfile = StepProfile;

class CpuBackend final : public Backend {
 public:
  static Expected<std::unique_ptr<CpuBackend>> create(const model::Model& model, const BackendOptions& opts);

  std::string name() const override;
  const KvCacheConfig& kv_config() const override { return kv_; }
  int vocab_size() const override { return V_; }
  int max_slots() const override { return tables_.size(); }
  Status step(const StepBatch& batch, StepOutput& out) override;
  int64_t kv_block_bytes() const override { return 2 * kv_layer_bytes_ * cfg_.n_layers; }
  Status read_kv_block(int32_t block, std::span<uint8_t> out) override;
  Status write_kv_block(int32_t block, std::span<const uint8_t> in) override;
  BackendMemory memory() const override;

  void set_profiling(bool on, bool thread_cpu_time = false) override {
    profiling_ = on;
    profile_cpu_time_ = thread_cpu_time;
  }
  StepProfile profile() const override { return profile_; }
  void reset_profile() override { profile_ = CpuProfile{}; }
  int threads() const { return pool_.size(); }

  ~CpuBackend() override;

 private:
  CpuBackend(const model::Model& model, const BackendOptions& opts, int threads);
  Status init();
  Status validate(const StepBatch& batch);
  // The forward pass; logits of tokens rows_[0 .. R) go to logits_ (R x vocab).
  Status forward(const StepBatch& batch);
  void ensure_rows(int rows);
  void ensure_rope(int max_pos);
  void plan_attention(const StepBatch& batch);
  // The products of layer `layer - 1` (and layer's Q/K/V) prefetch `layer`'s K/V blocks of this
  // batch's sequences as they go (cpu/side_prefetch.h), when n_tok rows make them compute bound.
  void arm_kv_prefetch(int layer, int n_tok);
  void disarm_kv_prefetch();  // and counts the lines the products took (profile.prefetched_kv_bytes)
  // The products' scratch, with the armed K/V prefetch cursors (null when none is armed).
  cpu::MatmulScratch mm_scratch() { return {mm_scratch_.data(), mm_scratch_.size(), side_}; }
  void matmul(const model::Tensor& W, const cpu::PackedMatrix& P, const float* x, int n, int64_t ldx, float* y,
              int64_t ldy);
  // Runs fn(begin, end) over [0, n) rows: on the pool when the work is big enough to pay for the
  // dispatch, else inline. Either way each row is computed by the same code.
  template <class Fn>
  void for_rows(int n, int64_t work_per_row, const Fn& fn);

  struct FloatBuf {
    float* p = nullptr;
    size_t n = 0;
  };
  struct LayerConsts {  // 1-D weights converted to fp32 once
    std::vector<float> attn_norm, ffn_norm, bq, bk, bv, q_norm, k_norm;
  };

  const model::Model& model_;
  const model::ModelConfig& cfg_;
  BackendOptions opts_;
  KvCacheConfig kv_;
  ThreadPool pool_;
  bool profiling_ = false;
  bool profile_cpu_time_ = false;
  CpuProfile profile_;

  int H_ = 0, nh_ = 0, nkv_ = 0, hd_ = 0, I_ = 0, V_ = 0, rope_dim_ = 0, bs_pad_ = 0;
  int max_position_ = 0;      // positions past this are rejected (max of context and KV capacity)
  int64_t block_stride_ = 0;  // elements of K (or V) per KV block per layer
  cpu::ops::KvElem kv_elem_ = cpu::ops::KvElem::F32;
  int64_t kv_layer_bytes_ = 0;  // one block's K (or V) of one layer, with its Q8 scales
  int64_t kv_scale_offset_ = 0; // Q8: bytes from a block's K (V) to its scales
  std::vector<LayerConsts> layer_consts_;
  // Matrices in the packed layout (cpu/kernels.h), when the ISA has a packed kernel for the type; empty
  // otherwise. The model's own pages of a packed tensor are released (read again only by get_row and
  // by matmul under a forced ISA without that kernel).
  struct LayerPacked {
    cpu::PackedMatrix wq, wk, wv, wo, w_gate, w_up, w_down;
  };
  std::vector<LayerPacked> packed_;
  cpu::PackedMatrix packed_out_;
  HugeBuffer packed_buf_;  // every packed matrix, back to back
  std::vector<float> output_norm_;
  std::vector<float> inv_freq_;

  // KV cache, one anonymous mapping: [block][layer][K, then V] (cpu_ops.h's per-layer layouts inside),
  // so the memory a sequence touches is its blocks, and a block's K and V of one layer are one
  // contiguous run (a decode step reads all of it; longer runs stream faster from DRAM). Pages are
  // committed (zero) at start-up; transparent huge pages are requested (a decode step walks tens of MB
  // of KV, and with 4 KiB pages the TLB misses cost as much as the loads).
  HugeBuffer kv_cache_;

  // Scratch sized for cap_rows_ token rows; grown (never shrunk) when a bigger batch arrives.
  int cap_rows_ = 0;
  std::vector<float> x_, xn_, xg_, q_, k_, v_, att_, tmp_, gate_, up_;
  std::vector<unsigned char> mm_scratch_;
  std::vector<float> rope_cs_;  // [rope_len_][rope_dim] (cos half, sin half)
  int rope_len_ = 0;
  std::vector<float> attn_scratch_;  // per thread
  size_t attn_scratch_stride_ = 0;

  // Attention plan for the current batch (capacity reserved up front).
  std::vector<int32_t> order_;       // token indices grouped by sequence, batch order inside
  std::vector<int32_t> seq_count_, seq_start_, seq_max_pos_;
  struct Tile {
    int32_t begin, n, seq, cost;
    bool whole;  // one attention item for all heads (a decode row; see plan_attention)
  };
  std::vector<Tile> tiles_;
  std::vector<int32_t> items_;       // tile * n_heads + head, most expensive first
  // items_ as lists [list_begin_[i], list_begin_[i + 1]), list i first taken by thread i (one list: any
  // thread). Decode rows are listed by the thread whose side stream prefetched their K/V.
  std::vector<int32_t> list_begin_;
  struct alignas(64) ItemCounter {
    std::atomic<int> next{0};
  };
  std::vector<ItemCounter> list_next_;  // one per list
  std::vector<int32_t> items_by_list_;  // plan_attention's scratch
  std::vector<int64_t> slot_keys_;   // validation: written (block, slot) pairs

  BlockTables tables_;               // per slot, edited by each batch
  std::vector<const int32_t*> seq_tables_;  // this batch's sequences' tables
  std::vector<int32_t> rows_;        // tokens whose logits are wanted: sample, score, then raw rows
  std::vector<float> logits_;        // rows_.size() x vocab, grown on demand
  bool kv_prefetch_ = true;          // SS_CPU_KV_PREFETCH=0 turns arm_kv_prefetch off (A/B runs)
  std::vector<cpu::SideRange> side_ranges_;
  std::vector<int> side_split_;                // thread t's ranges: [side_split_[t], side_split_[t + 1])
  std::vector<cpu::SideCursor> side_cursors_;  // one per pool thread
  cpu::SideCursor* side_ = nullptr;            // armed: the products prefetch these cursors' lines
  std::vector<RowSampler> samplers_; // one per pool thread
};

}  // namespace ss::backend
