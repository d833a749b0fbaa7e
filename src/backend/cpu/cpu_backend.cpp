// CPU forward pass: embedding -> per layer [RMSNorm, Q/K/V, (bias | q/k norm), RoPE, paged KV write,
// causal GQA attention, O, residual+RMSNorm, SwiGLU FFN, residual] -> final norm + lm_head for the
// requested rows only.
//
// Threading: the matmuls split output rows across the pool (kernels.h); the per-token stages run one
// pool dispatch each (rows split evenly) or inline when the batch is too small to pay for a
// dispatch; attention is one dispatch per layer whose threads pull (query tile, head) items from an
// atomic counter, costliest first.
//
// Batch invariance: each token row goes through the same per-row code whatever else is in the batch
// (norms, RoPE, SwiGLU are per row; attention is per (row, head) with a fixed 16-key online-softmax
// step; the matmuls guarantee it per (t, o)), so logits are bit-identical alone or batched.
#include "backend/cpu/cpu_backend.h"
#include "backend/rope.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numbers>
#include <string_view>
#include <thread>

#include <time.h>

namespace ss::backend {

namespace {

using Clock = std::chrono::steady_clock;

cpu::ops::KvElem to_kv_elem(KvCacheConfig::DType t) {
  switch (t) {
    case KvCacheConfig::DType::F16: return cpu::ops::KvElem::F16;
    case KvCacheConfig::DType::Q8: return cpu::ops::KvElem::Q8;
    case KvCacheConfig::DType::F32: break;
  }
  return cpu::ops::KvElem::F32;
}

// Per-token stages below this many floats of work run inline (a pool dispatch costs ~10 us).
constexpr int64_t kParallelMinWork = 1 << 15;

std::string shape_str(const model::Tensor& t) {
  std::string s = "[";
  for (int i = 0; i < std::max(1, t.n_dims); ++i) s += (i ? " x " : "") + std::to_string(t.ne[i]);
  return s + "]";
}

Status check_matrix(const model::Tensor& t, int64_t rows, int64_t cols, const std::string& what) {
  if (!t.valid()) return make_error(what + ": tensor missing");
  if (t.rows() != rows || t.cols() != cols)
    return make_error(what + " (" + t.name + "): expected " + std::to_string(rows) + " rows x " +
                      std::to_string(cols) + " columns, got ne " + shape_str(t));
  return {};
}

Expected<std::vector<float>> to_f32(const model::Tensor& t, int64_t n, const std::string& what) {
  if (!t.valid()) return make_error(what + ": tensor missing");
  if (t.numel() != n)
    return make_error(what + " (" + t.name + "): expected " + std::to_string(n) + " elements, got " + shape_str(t));
  if (t.type != model::DType::F32 && t.type != model::DType::F16 && t.type != model::DType::BF16)
    return make_error(what + " (" + t.name + "): type " + std::string(model::dtype_name(t.type)) +
                      " not supported for a 1-D weight (want F32, F16 or BF16)");
  std::vector<float> v(static_cast<size_t>(n));
  model::dequantize_row(t.type, t.data, v.data(), n);
  return v;
}

class Stopwatch {
 public:
  Stopwatch(bool on, bool cpu_time) : on_(on), cpu_(cpu_time) {
    if (on_) t_ = now();
  }
  void lap(double& acc) {
    if (!on_) return;
    const double n = now();
    acc += n - t_;
    t_ = n;
  }

 private:
  double now() const {
    if (cpu_) {
      timespec ts;
      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
      return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
    }
    return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
  }
  bool on_, cpu_;
  double t_ = 0;
};

}  // namespace


CpuBackend::CpuBackend(const model::Model& model, const BackendOptions& opts, int threads)
    : model_(model), cfg_(model.config), opts_(opts), kv_(opts.kv), pool_(threads), tables_(std::max(1, opts.max_slots)) {
  if (const char* e = std::getenv("SS_CPU_KV_PREFETCH"); e && std::string_view(e) == "0") kv_prefetch_ = false;
}

CpuBackend::~CpuBackend() = default;

Expected<std::unique_ptr<CpuBackend>> CpuBackend::create(const model::Model& model, const BackendOptions& opts) {
  int threads = opts.threads;
  if (threads <= 0) threads = std::max(1u, std::thread::hardware_concurrency());
  std::unique_ptr<CpuBackend> be(new CpuBackend(model, opts, threads));
  SS_TRY(be->init());
  return be;
}

// Says which kernels run: the ISA and how many matrices took the packed form (none on scalar).
std::string CpuBackend::name() const {
  int packed = packed_out_.empty() ? 0 : 1, total = 1;
  for (const auto& P : packed_)
    for (const cpu::PackedMatrix* m : {&P.wq, &P.wk, &P.wv, &P.wo, &P.w_gate, &P.w_up, &P.w_down}) {
      packed += m->empty() ? 0 : 1;
      ++total;
    }
  std::string s = std::string("cpu (") + std::to_string(pool_.size()) + " threads, " + cpu::isa_name(cpu::active_isa());
  if (cpu::amx_active()) s += "+amx";
  if (cpu::active_isa() == cpu::Isa::Avx512 && cpu::gfni_active()) s += "+gfni";
  if (cpu::active_isa() != cpu::Isa::Scalar)
    s += ", " + std::to_string(packed) + "/" + std::to_string(total) + " matrices packed";
  return s + ")";
}

Status CpuBackend::init() {
  const auto& c = cfg_;
  const auto& w = model_.weights;
  if (c.n_layers <= 0 || c.hidden_size <= 0 || c.n_heads <= 0 || c.n_kv_heads <= 0 || c.vocab_size <= 0 ||
      c.intermediate_size <= 0)
    return make_error("cpu backend: model config incomplete (layers, hidden, heads, kv heads, vocab, ffn size)");
  if (c.n_heads % c.n_kv_heads != 0)
    return make_error("cpu backend: " + std::to_string(c.n_heads) + " heads is not a multiple of " +
                      std::to_string(c.n_kv_heads) + " KV heads");
  H_ = c.hidden_size;
  nh_ = c.n_heads;
  nkv_ = c.n_kv_heads;
  hd_ = c.head_dim > 0 ? c.head_dim : H_ / nh_;
  I_ = c.intermediate_size;
  V_ = c.vocab_size;
  rope_dim_ = c.rope_dim > 0 ? c.rope_dim : hd_;
  if (rope_dim_ % 2 != 0 || rope_dim_ > hd_)
    return make_error("cpu backend: rope_dim " + std::to_string(rope_dim_) + " must be even and <= head_dim " +
                      std::to_string(hd_));
  if (static_cast<int>(w.layers.size()) != c.n_layers)
    return make_error("cpu backend: config has " + std::to_string(c.n_layers) + " layers, weights have " +
                      std::to_string(w.layers.size()));

  SS_TRY(check_matrix(w.token_embd, V_, H_, "token_embd"));
  const model::Tensor& out = w.output.valid() ? w.output : w.token_embd;
  SS_TRY(check_matrix(out, V_, H_, "output"));
  SS_ASSIGN(output_norm_, to_f32(w.output_norm, H_, "output_norm"));
  const int qd = nh_ * hd_, kvd = nkv_ * hd_;
  layer_consts_.resize(c.n_layers);
  for (int l = 0; l < c.n_layers; ++l) {
    const auto& L = w.layers[l];
    const std::string p = "layer " + std::to_string(l) + " ";
    SS_TRY(check_matrix(L.wq, qd, H_, p + "attn_q"));
    SS_TRY(check_matrix(L.wk, kvd, H_, p + "attn_k"));
    SS_TRY(check_matrix(L.wv, kvd, H_, p + "attn_v"));
    SS_TRY(check_matrix(L.wo, H_, qd, p + "attn_output"));
    SS_TRY(check_matrix(L.w_gate, I_, H_, p + "ffn_gate"));
    SS_TRY(check_matrix(L.w_up, I_, H_, p + "ffn_up"));
    SS_TRY(check_matrix(L.w_down, H_, I_, p + "ffn_down"));
    auto& lc = layer_consts_[l];
    SS_ASSIGN(lc.attn_norm, to_f32(L.attn_norm, H_, p + "attn_norm"));
    SS_ASSIGN(lc.ffn_norm, to_f32(L.ffn_norm, H_, p + "ffn_norm"));
    if (c.qkv_bias) {
      SS_ASSIGN(lc.bq, to_f32(L.bq, qd, p + "attn_q.bias"));
      SS_ASSIGN(lc.bk, to_f32(L.bk, kvd, p + "attn_k.bias"));
      SS_ASSIGN(lc.bv, to_f32(L.bv, kvd, p + "attn_v.bias"));
    }
    if (c.qk_norm) {
      SS_ASSIGN(lc.q_norm, to_f32(L.q_norm, hd_, p + "attn_q_norm"));
      SS_ASSIGN(lc.k_norm, to_f32(L.k_norm, hd_, p + "attn_k_norm"));
    }
  }
  inv_freq_ = rope_inv_freq(c, rope_dim_);

  // KV cache.
  if (kv_.block_size <= 0) return make_error("cpu backend: kv.block_size must be positive");
  if (kv_.num_blocks <= 0) {
    const int ctx = std::min(c.max_context > 0 ? c.max_context : 4096, 4096);
    kv_.num_blocks = (ctx + kv_.block_size - 1) / kv_.block_size;
  }
  bs_pad_ = (kv_.block_size + cpu::ops::kKeyChunk - 1) / cpu::ops::kKeyChunk * cpu::ops::kKeyChunk;
  block_stride_ = static_cast<int64_t>(nkv_) * hd_ * bs_pad_;
  kv_elem_ = to_kv_elem(kv_.dtype);
  kv_scale_offset_ = kv_elem_ == cpu::ops::KvElem::Q8 ? block_stride_ : 0;
  kv_layer_bytes_ = cpu_kv_block_bytes(kv_, 1, nkv_, hd_) / 2;
  const size_t kv_bytes = static_cast<size_t>(cpu_kv_block_bytes(kv_, c.n_layers, nkv_, hd_)) * kv_.num_blocks;
  // Anonymous pages are zero: never-written padding slots read as finite zeros. The whole cache is
  // committed now, as vLLM and llama.cpp reserve theirs at start: no step pays page faults (measured:
  // ~6% of a fresh server's time under 16 streams went to zeroing pages on first touch), and a
  // cache that does not fit in memory fails at start-up (an error here, at worst the OOM killer) instead
  // of later under load.
  const std::string kv_what = std::to_string(kv_bytes) + " bytes for " +
                              std::to_string(kv_.num_blocks) + " blocks of " + std::to_string(kv_.block_size) +
                              " tokens); lower kv.num_blocks";
  if (!kv_cache_.allocate(kv_bytes))
    return make_error("cpu backend: cannot allocate the KV cache (" + kv_what);
  {
    std::atomic<bool> ok{true};
    pool_.run([&](int t) {  // page faults are kernel work: every thread takes a share
      const size_t n = kv_cache_.size(), nt = static_cast<size_t>(pool_.size());
      if (!kv_cache_.populate(n * t / nt, n * (t + 1) / nt - n * t / nt)) ok = false;
    });
    if (!ok) {
      kv_cache_ = HugeBuffer();
      return make_error("cpu backend: cannot commit the KV cache (" + kv_what);
    }
  }

  // Pack the matrices for the packed kernels into one buffer, releasing each original as soon as it
  // is copied so resident memory stays about one copy of the weights.
  size_t packed_total = cpu::packed_bytes(out);
  for (const auto& L : w.layers)
    for (const model::Tensor* t : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down})
      packed_total += cpu::packed_bytes(*t);
  packed_.resize(c.n_layers);
  if (packed_total > 0 && packed_buf_.allocate(packed_total)) {  // without the buffer: unpacked kernels
    size_t at = 0;
    auto pack = [&](const model::Tensor& t) {
      cpu::PackedMatrix p = cpu::pack_weights(t, packed_buf_.data() + at, pool_);
      at += cpu::packed_bytes(t);
      if (!p.empty()) model_.release_pages(t);
      return p;
    };
    for (int l = 0; l < c.n_layers; ++l) {
      const auto& L = w.layers[l];
      auto& P = packed_[l];
      P.wq = pack(L.wq), P.wk = pack(L.wk), P.wv = pack(L.wv), P.wo = pack(L.wo);
      P.w_gate = pack(L.w_gate), P.w_up = pack(L.w_up), P.w_down = pack(L.w_down);
    }
    packed_out_ = pack(out);
  }

  max_position_ = std::max(c.max_context, kv_.num_blocks * kv_.block_size);
  attn_scratch_stride_ = (cpu::ops::attn_scratch_floats(hd_) + 15) / 16 * 16;
  attn_scratch_.assign(attn_scratch_stride_ * pool_.size(), 0.0f);
  ensure_rows(std::max(1, opts_.max_batch_tokens));
  ensure_rope(std::min(c.max_context > 0 ? c.max_context : 4096, 4096));
  for (int t = 0; t < pool_.size(); ++t) samplers_.emplace_back(V_);
  return {};
}

void CpuBackend::ensure_rows(int rows) {
  if (rows <= cap_rows_) return;
  cap_rows_ = rows;
  const size_t n = static_cast<size_t>(rows);
  const size_t qd = static_cast<size_t>(nh_) * hd_, kvd = static_cast<size_t>(nkv_) * hd_;
  x_.resize(n * H_);
  xn_.resize(n * H_);
  xg_.resize(n * H_);
  tmp_.resize(n * H_);
  q_.resize(n * qd);
  att_.resize(n * qd);
  k_.resize(n * kvd);
  v_.resize(n * kvd);
  gate_.resize(n * I_);
  up_.resize(n * I_);

  size_t mm = 0;
  auto need = [&](const model::Tensor& t) { mm = std::max(mm, cpu::matmul_scratch_bytes(t.type, t.cols(), rows)); };
  for (const auto& L : model_.weights.layers) {
    need(L.wq), need(L.wk), need(L.wv), need(L.wo), need(L.w_gate), need(L.w_up), need(L.w_down);
  }
  need(model_.weights.output.valid() ? model_.weights.output : model_.weights.token_embd);
  mm_scratch_.resize(mm + 64);

  order_.resize(n);
  tiles_.reserve(n + 64);
  items_.reserve((n + 64) * nh_);
  items_by_list_.reserve((n + 64) * nh_);
  slot_keys_.resize(n);
}

void CpuBackend::ensure_rope(int len) {
  if (len <= rope_len_) return;
  len = std::max(len, 2 * rope_len_);
  rope_cs_.resize(static_cast<size_t>(len) * rope_dim_);
  rope_table(inv_freq_, rope_len_, len, rope_cs_.data() + static_cast<size_t>(rope_len_) * rope_dim_);
  rope_len_ = len;
}

void CpuBackend::matmul(const model::Tensor& W, const cpu::PackedMatrix& P, const float* x, int n, int64_t ldx,
                        float* y, int64_t ldy) {
  cpu::matmul(W, P, x, n, ldx, y, ldy, mm_scratch(), pool_);
}

template <class Fn>
void CpuBackend::for_rows(int n, int64_t work_per_row, const Fn& fn) {
  const int nt = pool_.size();
  if (nt == 1 || n < 2 || static_cast<int64_t>(n) * work_per_row < kParallelMinWork) {
    fn(0, n);
    return;
  }
  struct Ctx {
    const Fn* fn;
    int n, nt;
  } ctx{&fn, n, nt};
  // One pointer captured: fits std::function's small buffer, so no allocation.
  pool_.run([c = &ctx](int t) {
    const int b = static_cast<int>(static_cast<int64_t>(c->n) * t / c->nt);
    const int e = static_cast<int>(static_cast<int64_t>(c->n) * (t + 1) / c->nt);
    if (b < e) (*c->fn)(b, e);
  });
}

Status CpuBackend::validate(const StepBatch& b) {
  SS_TRY(validate_batch(b, tables_, kv_.num_blocks, kv_.block_size, V_));
  const size_t T = b.tokens.size();
  const int bs = kv_.block_size;
  for (size_t i = 0; i < T; ++i)
    if (b.positions[i] >= max_position_)
      return make_error("StepBatch row " + std::to_string(i) + ": position " + std::to_string(b.positions[i]) +
                        " is past the model's context and the KV cache (" + std::to_string(max_position_) +
                        " positions)");
  seq_tables_.resize(b.seq_slot.size());
  for (size_t s = 0; s < b.seq_slot.size(); ++s) seq_tables_[s] = tables_.of(b.seq_slot[s]).data();
  // Two rows writing the same KV slot would race and leave the cache ambiguous.
  if (slot_keys_.size() < T) slot_keys_.resize(T);
  for (size_t i = 0; i < T; ++i) {
    const int p = b.positions[i];
    const int64_t blk = seq_tables_[b.seq_index[i]][p / bs];
    slot_keys_[i] = (blk * bs + p % bs) * static_cast<int64_t>(T) + static_cast<int64_t>(i);
  }
  std::sort(slot_keys_.begin(), slot_keys_.begin() + T);
  for (size_t i = 1; i < T; ++i)
    if (slot_keys_[i] / static_cast<int64_t>(T) == slot_keys_[i - 1] / static_cast<int64_t>(T)) {
      const int64_t a = slot_keys_[i - 1] % static_cast<int64_t>(T), c = slot_keys_[i] % static_cast<int64_t>(T);
      const int64_t key = slot_keys_[i] / static_cast<int64_t>(T);
      return make_error("StepBatch: rows " + std::to_string(a) + " and " + std::to_string(c) +
                        " write the same KV slot (block " + std::to_string(key / bs) + ", slot " +
                        std::to_string(key % bs) + ")");
    }
  return {};
}

void CpuBackend::plan_attention(const StepBatch& b) {
  const int T = static_cast<int>(b.tokens.size());
  const int S = static_cast<int>(b.seq_slot.size());
  seq_count_.assign(S, 0);
  seq_start_.assign(S + 1, 0);
  for (int i = 0; i < T; ++i) ++seq_count_[b.seq_index[i]];
  for (int s = 0; s < S; ++s) seq_start_[s + 1] = seq_start_[s] + seq_count_[s];
  for (int s = 0; s < S; ++s) seq_count_[s] = seq_start_[s];  // reuse as fill cursor
  for (int i = 0; i < T; ++i) order_[seq_count_[b.seq_index[i]]++] = i;
  seq_max_pos_.assign(S, -1);  // -1: a sequence with no token in this batch (attends nothing)
  for (int i = 0; i < T; ++i) seq_max_pos_[b.seq_index[i]] = std::max(seq_max_pos_[b.seq_index[i]], b.positions[i]);

  tiles_.clear();
  for (int s = 0; s < S; ++s) {
    for (int t0 = seq_start_[s]; t0 < seq_start_[s + 1]; t0 += cpu::ops::kAttnTile) {
      const int n = std::min(cpu::ops::kAttnTile, seq_start_[s + 1] - t0);
      int max_pos = 0;
      for (int i = t0; i < t0 + n; ++i) max_pos = std::max(max_pos, b.positions[order_[i]]);
      tiles_.push_back(Tile{t0, n, s, n * (max_pos + 1), false});
    }
  }
  std::sort(tiles_.begin(), tiles_.end(), [](const Tile& a, const Tile& c) {
    return a.cost != c.cost ? a.cost > c.cost : a.begin < c.begin;
  });
  // A one-token tile (a decode row) is one item per GQA group: the group's query heads share each
  // K/V load. With enough decode rows to keep every thread busy, it is one item for all its heads
  // instead (ops attention_token), which reads each block's K of several KV heads, and then their V,
  // as contiguous runs: attention at 16 sequences 1.94 -> 1.57 ms (docs/perf/serving.md). Longer
  // tiles are one item per head (their rows already share the loads). The arithmetic per head is the
  // same whichever way, so the bits are too.
  items_.clear();
  const int n_rep = nh_ / nkv_;
  int decode_tiles = 0;
  for (const Tile& t : tiles_) decode_tiles += t.n == 1;
  const bool token_items = decode_tiles >= 2 * pool_.size();
  for (int t = 0; t < static_cast<int>(tiles_.size()); ++t) {
    Tile& tile = tiles_[t];
    tile.whole = tile.n == 1 && token_items;
    if (tile.whole) {
      items_.push_back(t * nh_);
      continue;
    }
    for (int h = 0; h < nh_; h += tile.n == 1 ? n_rep : 1) items_.push_back(t * nh_ + h);
  }
  // Decode rows alone (each tile one row of its own sequence): thread i first takes the rows of the
  // sequences [S i / nt, S (i + 1) / nt), whose K/V its side stream prefetched into its own L2 during
  // the products before (arm_kv_prefetch splits the sequences the same way), then helps the others.
  const int nt = pool_.size();
  bool all_whole = nt > 1 && !tiles_.empty();
  for (const Tile& t : tiles_) all_whole = all_whole && t.whole;
  list_begin_.assign(1, 0);
  if (all_whole) {  // a stable split by owner, so each list keeps the costliest-first order
    auto owner = [&](int item) { return static_cast<int>(static_cast<int64_t>(tiles_[item / nh_].seq) * nt / S); };
    items_by_list_.clear();
    for (int i = 0; i < nt; ++i) {
      for (int item : items_)
        if (owner(item) == i) items_by_list_.push_back(item);
      list_begin_.push_back(static_cast<int>(items_by_list_.size()));
    }
    items_.swap(items_by_list_);
  } else {
    list_begin_.push_back(static_cast<int>(items_.size()));
  }
  if (list_next_.size() < list_begin_.size()) list_next_ = std::vector<ItemCounter>(list_begin_.size());
}

void CpuBackend::arm_kv_prefetch(int layer, int n_tok) {
  disarm_kv_prefetch();
  if (!kv_prefetch_ || layer <= 0 || layer >= cfg_.n_layers) return;
  const int bs = kv_.block_size;
  const char* base = reinterpret_cast<const char*>(kv_cache_.data()) + 2 * layer * kv_layer_bytes_;
  const int64_t block_bytes = kv_block_bytes();
  const int64_t lines = (2 * kv_layer_bytes_ + 63) / 64;  // the layer's K, then its V
  // Only the K/V lines that fit in the products' spare read time, estimated as (their vector ops / their
  // weight reads - 1) times their reads: the ratio is ~2 at 16 rows on a Zen 4 (bench_kernels
  // --step-floor) and grows with the rows, so n_tok / 8 - 1, of which 0.8 is used. Up to 8 rows
  // nothing is armed; at 16 rows of the Q4_K_M file, context 160, all of it (2.1 MB a layer); at
  // context 512 a third. Past the spare time the products slow by as much as attention gains
  // (measured: docs/perf/cpu.md, 2026-12-05).
  const auto& W = model_.weights;
  const auto& Lp = W.layers[layer - 1];
  const auto& Ln = W.layers[layer];
  const double wbytes = static_cast<double>(Lp.wo.nbytes + Lp.w_gate.nbytes + Lp.w_up.nbytes + Lp.w_down.nbytes +
                                            Ln.wq.nbytes + Ln.wk.nbytes + Ln.wv.nbytes);
  const int64_t budget = static_cast<int64_t>(0.8 * (n_tok / 8.0 - 1.0) * wbytes / 64);
  // Thread t's share: the blocks of sequences [S t / nt, S (t + 1) / nt), up to budget / nt lines, so
  // that its L2 holds the K/V of the decode rows it attends first (plan_attention's lists).
  const int nt = pool_.size();
  const int S = static_cast<int>(seq_tables_.size());
  side_ranges_.clear();
  side_split_.assign(1, 0);
  for (int t = 0; t < nt; ++t) {
    int64_t taken = 0;
    const int64_t share = budget / nt;
    for (int s = S * t / nt; s < S * (t + 1) / nt && taken + lines <= share; ++s)
      for (int j = 0; seq_max_pos_[s] >= 0 && j <= seq_max_pos_[s] / bs && taken + lines <= share; ++j, taken += lines)
        side_ranges_.push_back({base + static_cast<int64_t>(seq_tables_[s][j]) * block_bytes, lines});
    side_split_.push_back(static_cast<int>(side_ranges_.size()));
  }
  if (side_ranges_.empty()) return;
  // Lines a pass of 16 rows x 32 columns: enough that each thread's share is done by about two thirds
  // of the products it rides on (layer - 1's output, gate, up and down, then layer's Q, K and V), with
  // passes of 4 rows (the kernels run 4 or 8).
  const int64_t H = H_, I = I_, qd = int64_t{nh_} * hd_, kvd = int64_t{nkv_} * hd_;
  const int64_t units = std::max<int64_t>(1, (H * qd + 3 * H * I + H * (qd + 2 * kvd)) / (16 * 32) * ((n_tok + 3) / 4));
  const int64_t total = static_cast<int64_t>(side_ranges_.size()) * lines;
  const int per_block = static_cast<int>(std::clamp<int64_t>((3 * total + 2 * units - 1) / (2 * units), 1, 16));
  side_cursors_.assign(nt, {});
  for (int t = 0; t < nt; ++t) {
    cpu::SideCursor& c = side_cursors_[t];
    c.next = side_ranges_.data() + side_split_[t];
    c.end = side_ranges_.data() + side_split_[t + 1];
    c.per_block = per_block;
  }
  side_ = side_cursors_.data();
}

void CpuBackend::disarm_kv_prefetch() {
  if (!side_) return;
  if (profiling_)
    for (const cpu::SideCursor& c : side_cursors_) profile_.prefetched_kv_bytes += 64 * c.taken;
  side_ = nullptr;
}

Status CpuBackend::step(const StepBatch& b, StepOutput& out) {
  SS_TRY(tables_.apply(b, kv_.num_blocks));
  SS_TRY(validate(b));
  // Logits rows: the sampled ones, the scored ones, then the raw ones.
  rows_.clear();
  for (const SampleRow& r : b.sample_rows) rows_.push_back(r.token);
  for (const ScoreRow& r : b.score_rows) rows_.push_back(r.token);
  rows_.insert(rows_.end(), b.logits_rows.begin(), b.logits_rows.end());
  const size_t need = rows_.size() * static_cast<size_t>(V_);
  if (logits_.size() < need) logits_.resize(need);
  SS_TRY(forward(b));
  Stopwatch sw(profiling_, profile_cpu_time_);
  const size_t ns = b.sample_rows.size() + b.score_rows.size();
  if (ns == 0) {  // raw rows only (benchmarks, tests): hand the buffer over instead of copying it
    std::swap(out.logits, logits_);
    out.logits.resize(need);
  } else {
    out.logits.assign(logits_.begin() + static_cast<std::ptrdiff_t>(ns * V_),
                      logits_.begin() + static_cast<std::ptrdiff_t>(need));
  }
  sample_on_host(b, logits_.data(), V_, samplers_, &pool_, out);
  sw.lap(profile_.other_s);
  return {};
}

Status CpuBackend::forward(const StepBatch& b) {
  Stopwatch sw(profiling_, profile_cpu_time_);
  CpuProfile& pf = profile_;
  float* logits = logits_.data();
  const int T = static_cast<int>(b.tokens.size());
  const int R = static_cast<int>(rows_.size());
  if (T == 0) return {};
  int max_pos = 0;
  for (int p : b.positions) max_pos = std::max(max_pos, p);
  ensure_rows(std::max(T, R));
  ensure_rope(max_pos + 1);
  plan_attention(b);
  if (profiling_) {
    ++pf.forwards;
    pf.tokens += T;
  }

  const auto& ops = cpu::ops::ops_for(cpu::active_isa());
  const auto& W = model_.weights;
  const float eps = cfg_.rms_norm_eps;
  const int qd = nh_ * hd_, kvd = nkv_ * hd_, bs = kv_.block_size;
  const int64_t bsp = bs_pad_;
  const bool interleaved = cfg_.rope_style == model::RopeStyle::Interleaved;
  const float q_scale = 1.0f / std::sqrt(static_cast<float>(hd_));
  // Block-major KV: block j holds every layer's slice of it, so a sequence's memory is its blocks;
  // a layer's slice is its K (layer_bytes) and then its V.
  const int64_t layer_bytes = kv_layer_bytes_;
  const int64_t block_bytes = 2 * layer_bytes * cfg_.n_layers;

  // The activations of a packed product are quantized by the loop that produces them, each thread its
  // rows (cpu/kernels.h, quantize_for_packed): none waits while one thread quantizes them all.
  // pq: the consumer's weight (null: it quantizes for itself); extra work per row for for_rows.
  auto qkv_jobs = [&](int l, cpu::MatmulJob* jobs) {
    const auto& L = W.layers[l];
    const LayerPacked& P = packed_[l];
    jobs[0] = {&L.wq, &P.wq, q_.data(), qd};
    jobs[1] = {&L.wk, &P.wk, k_.data(), kvd};
    jobs[2] = {&L.wv, &P.wv, v_.data(), kvd};
  };
  auto packed_weight = [&](const cpu::MatmulJob* jobs, int n_jobs) -> const model::Tensor* {
    return cpu::packed_path(jobs, n_jobs) ? jobs[0].W : nullptr;
  };
  auto quantize_rows = [&](const model::Tensor* pq, const float* x, int64_t ldx, int n, int r0, int r1) {
    if (pq) cpu::quantize_for_packed(pq->type, pq->cols(), x, ldx, n, r0, r1, mm_scratch());
  };
  constexpr int64_t kQuantizeWork = 4;  // per value, in for_rows' units
  cpu::MatmulJob qkv[3];  // the current layer's (the previous layer's end fills in the next one's)
  qkv_jobs(0, qkv);
  const model::Tensor* pq = packed_weight(qkv, 3);
  const model::Tensor& out_w = W.output.valid() ? W.output : W.token_embd;
  const cpu::MatmulJob head{&out_w, &packed_out_, logits, V_};

  // Embedding + first RMSNorm.
  for_rows(T, (2 + (pq ? kQuantizeWork : 0)) * H_, [&](int r0, int r1) {
    for (int t = r0; t < r1; ++t) {
      float* xt = x_.data() + static_cast<size_t>(t) * H_;
      cpu::get_row(W.token_embd, b.tokens[t], xt);
      ops.rmsnorm(xt, layer_consts_[0].attn_norm.data(), xn_.data() + static_cast<size_t>(t) * H_, H_, eps);
    }
    quantize_rows(pq, xn_.data(), H_, T, r0, r1);
  });
  sw.lap(pf.other_s);

  for (int l = 0; l < cfg_.n_layers; ++l) {
    const auto& L = W.layers[l];
    const auto& lc = layer_consts_[l];
    const bool last = l + 1 == cfg_.n_layers;
    unsigned char* kc = kv_cache_.data() + 2 * l * layer_bytes;
    unsigned char* vc = kc + layer_bytes;

    const LayerPacked& P = packed_[l];
    cpu::matmul_multi(qkv, 3, xn_.data(), T, H_, mm_scratch(), pool_, pq != nullptr);  // pq: the loop before quantized xn_
    sw.lap(pf.matmul_s);
    disarm_kv_prefetch();  // the last products that carry this layer's K/V prefetch

    // Bias, q/k norm, RoPE (q pre-scaled by 1/sqrt(hd)), then K/V into their cache slots.
    for_rows(T, 4 * (qd + kvd), [&](int r0, int r1) {
      for (int t = r0; t < r1; ++t) {
        float* qt = q_.data() + static_cast<size_t>(t) * qd;
        float* kt = k_.data() + static_cast<size_t>(t) * kvd;
        float* vt = v_.data() + static_cast<size_t>(t) * kvd;
        if (cfg_.qkv_bias) {
          ops.add(qt, lc.bq.data(), qd);
          ops.add(kt, lc.bk.data(), kvd);
          ops.add(vt, lc.bv.data(), kvd);
        }
        if (cfg_.qk_norm) {
          for (int h = 0; h < nh_; ++h) ops.rmsnorm(qt + h * hd_, lc.q_norm.data(), qt + h * hd_, hd_, eps);
          for (int h = 0; h < nkv_; ++h) ops.rmsnorm(kt + h * hd_, lc.k_norm.data(), kt + h * hd_, hd_, eps);
        }
        const int p = b.positions[t];
        const float* cs = rope_cs_.data() + static_cast<size_t>(p) * rope_dim_;
        ops.rope(qt, nh_, hd_, rope_dim_, cs, interleaved, q_scale);
        ops.rope(kt, nkv_, hd_, rope_dim_, cs, interleaved, 1.0f);
        const int64_t blk = seq_tables_[b.seq_index[t]][p / bs];
        ops.store_kv(kt, vt, kc + blk * block_bytes, vc + blk * block_bytes, nkv_, hd_, bsp, p % bs, kv_elem_,
                     kv_scale_offset_);
      }
    });
    sw.lap(pf.rope_kv_s);
    if (last && R == 0) break;  // nothing more is needed than this layer's K/V

    // Attention: (query tile, head) items pulled from shared counters, costliest first (plan_attention's lists).
    {
      const int64_t kv_stride = block_bytes / cpu::ops::kv_elem_bytes(kv_elem_);  // in elements
      cpu::ops::AttnLayer A{q_.data(), qd,      att_.data(), qd,         kc,   vc, kv_stride,
                            hd_,       bs,      bs_pad_,     nh_ / nkv_, b.positions.data(), kv_elem_, nkv_,
                            kv_scale_offset_};
      struct Ctx {
        CpuBackend* self;
        const cpu::ops::AttnLayer* A;
        const StepBatch* b;
        const cpu::ops::OpsTable* ops;
        int n_lists;
      } ctx{this, &A, &b, &ops, static_cast<int>(list_begin_.size()) - 1};
      for (int i = 0; i < ctx.n_lists; ++i) list_next_[i].next.store(0, std::memory_order_relaxed);
      auto work = [c = &ctx](int thread) {
        CpuBackend& s = *c->self;
        float* scratch = s.attn_scratch_.data() + s.attn_scratch_stride_ * thread;
        for (int k = 0; k < c->n_lists; ++k) {  // its own list first, then the others'
          const int li = (thread + k) % c->n_lists;
          std::atomic<int>& next = s.list_next_[li].next;
          for (int it; (it = s.list_begin_[li] + next.fetch_add(1, std::memory_order_relaxed)) < s.list_begin_[li + 1];) {
            const int item = s.items_[it];
            const Tile& tile = s.tiles_[item / s.nh_];
            if (tile.whole)
              c->ops->attention_token(*c->A, s.order_[tile.begin], s.seq_tables_[tile.seq], scratch);
            else if (tile.n == 1)
              c->ops->attention_group(*c->A, s.order_[tile.begin], item % s.nh_, s.nh_ / s.nkv_,
                                      s.seq_tables_[tile.seq], scratch);
            else
              c->ops->attention(*c->A, s.order_.data() + tile.begin, tile.n, item % s.nh_,
                                s.seq_tables_[tile.seq], scratch);
          }
        }
      };
      int64_t work_total = 0;
      for (const Tile& t : tiles_) work_total += static_cast<int64_t>(t.cost) * nh_ * hd_;
      if (pool_.size() == 1 || work_total < 8 * kParallelMinWork)
        work(0);
      else
        pool_.run(work);
    }
    sw.lap(pf.attention_s);

    // After the last attention only the rows whose logits are wanted matter: gather them.
    float* xr = x_.data();
    const float* ar = att_.data();
    int n = T;
    if (last) {
      for (int i = 0; i < R; ++i) {
        const int r = rows_[i];
        std::memcpy(xg_.data() + static_cast<size_t>(i) * H_, x_.data() + static_cast<size_t>(r) * H_,
                    sizeof(float) * H_);
        std::memcpy(q_.data() + static_cast<size_t>(i) * qd, att_.data() + static_cast<size_t>(r) * qd,
                    sizeof(float) * qd);
      }
      xr = xg_.data();
      ar = q_.data();
      n = R;
      sw.lap(pf.other_s);
    }

    if (!last) arm_kv_prefetch(l + 1, n);
    matmul(L.wo, P.wo, ar, n, qd, tmp_.data(), H_);
    sw.lap(pf.matmul_s);
    const cpu::MatmulJob gate_up[2] = {{&L.w_gate, &P.w_gate, gate_.data(), I_}, {&L.w_up, &P.w_up, up_.data(), I_}};
    pq = packed_weight(gate_up, 2);
    for_rows(n, (3 + (pq ? kQuantizeWork : 0)) * H_, [&](int r0, int r1) {
      for (int t = r0; t < r1; ++t)
        ops.add_rmsnorm(xr + static_cast<size_t>(t) * H_, tmp_.data() + static_cast<size_t>(t) * H_,
                        lc.ffn_norm.data(), xn_.data() + static_cast<size_t>(t) * H_, H_, eps);
      quantize_rows(pq, xn_.data(), H_, n, r0, r1);
    });
    sw.lap(pf.other_s);
    cpu::matmul_multi(gate_up, 2, xn_.data(), n, H_, mm_scratch(), pool_, pq != nullptr);
    sw.lap(pf.matmul_s);
    const cpu::MatmulJob down{&L.w_down, &P.w_down, tmp_.data(), H_};
    pq = packed_weight(&down, 1);
    for_rows(n, (8 + (pq ? kQuantizeWork : 0)) * I_, [&](int r0, int r1) {
      for (int t = r0; t < r1; ++t)
        ops.silu_mul(gate_.data() + static_cast<size_t>(t) * I_, up_.data() + static_cast<size_t>(t) * I_, I_);
      quantize_rows(pq, gate_.data(), I_, n, r0, r1);
    });
    sw.lap(pf.other_s);
    cpu::matmul_multi(&down, 1, gate_.data(), n, I_, mm_scratch(), pool_, pq != nullptr);
    sw.lap(pf.matmul_s);
    // Residual, then the next RMSNorm (the next layer's, or the final one before lm_head).
    const float* next_norm = last ? output_norm_.data() : layer_consts_[l + 1].attn_norm.data();
    if (last) {
      pq = packed_weight(&head, 1);
    } else {
      qkv_jobs(l + 1, qkv);
      pq = packed_weight(qkv, 3);
    }
    for_rows(n, (3 + (pq ? kQuantizeWork : 0)) * H_, [&](int r0, int r1) {
      for (int t = r0; t < r1; ++t)
        ops.add_rmsnorm(xr + static_cast<size_t>(t) * H_, tmp_.data() + static_cast<size_t>(t) * H_, next_norm,
                        xn_.data() + static_cast<size_t>(t) * H_, H_, eps);
      quantize_rows(pq, xn_.data(), H_, n, r0, r1);
    });
    sw.lap(pf.other_s);
  }

  if (R > 0) {
    cpu::matmul_multi(&head, 1, xn_.data(), R, H_, mm_scratch(), pool_, pq != nullptr);  // pq: the last loop's, for head
    sw.lap(pf.lm_head_s);
  }
  return {};
}

// Block-major cache: a block's every layer is one contiguous run of kv_block_bytes().
Status CpuBackend::read_kv_block(int32_t block, std::span<uint8_t> out) {
  const int64_t n = kv_block_bytes();
  if (block < 0 || block >= kv_.num_blocks || static_cast<int64_t>(out.size()) != n)
    return make_error("cpu backend: read_kv_block(" + std::to_string(block) + ", " + std::to_string(out.size()) +
                      " bytes): want a block in [0, " + std::to_string(kv_.num_blocks) + ") and " +
                      std::to_string(n) + " bytes");
  std::memcpy(out.data(), kv_cache_.data() + static_cast<size_t>(block) * n, static_cast<size_t>(n));
  return {};
}

Status CpuBackend::write_kv_block(int32_t block, std::span<const uint8_t> in) {
  const int64_t n = kv_block_bytes();
  if (block < 0 || block >= kv_.num_blocks || static_cast<int64_t>(in.size()) != n)
    return make_error("cpu backend: write_kv_block(" + std::to_string(block) + ", " + std::to_string(in.size()) +
                      " bytes): want a block in [0, " + std::to_string(kv_.num_blocks) + ") and " +
                      std::to_string(n) + " bytes");
  std::memcpy(kv_cache_.data() + static_cast<size_t>(block) * n, in.data(), static_cast<size_t>(n));
  return {};
}

const char* kv_dtype_name(KvCacheConfig::DType t) {
  switch (t) {
    case KvCacheConfig::DType::F32: return "f32";
    case KvCacheConfig::DType::F16: return "f16";
    case KvCacheConfig::DType::Q8: return "q8_0";
  }
  return "?";
}

bool parse_kv_dtype(const std::string& s, KvCacheConfig::DType* out) {
  for (auto t : {KvCacheConfig::DType::F32, KvCacheConfig::DType::F16, KvCacheConfig::DType::Q8})
    if (s == kv_dtype_name(t)) {
      *out = t;
      return true;
    }
  return false;
}

BackendMemory CpuBackend::memory() const {
  BackendMemory m;
  // Weights: the packed copies, plus every tensor still read from the model's own pages (a packed
  // tensor's pages were released; a tied lm_head is token_embd, counted once).
  auto add = [&](const model::Tensor& t, const cpu::PackedMatrix* p) {
    if (t.valid() && (!p || p->empty())) m.weights_bytes += static_cast<int64_t>(t.nbytes);
  };
  const auto& w = model_.weights;
  add(w.token_embd, nullptr);
  add(w.output_norm, nullptr);
  if (w.output.valid() && w.output.data != w.token_embd.data) add(w.output, &packed_out_);
  for (size_t l = 0; l < w.layers.size(); ++l) {
    const auto& L = w.layers[l];
    const LayerPacked* P = l < packed_.size() ? &packed_[l] : nullptr;
    add(L.wq, P ? &P->wq : nullptr), add(L.wk, P ? &P->wk : nullptr), add(L.wv, P ? &P->wv : nullptr);
    add(L.wo, P ? &P->wo : nullptr), add(L.w_gate, P ? &P->w_gate : nullptr), add(L.w_up, P ? &P->w_up : nullptr);
    add(L.w_down, P ? &P->w_down : nullptr);
    for (const model::Tensor* t : {&L.attn_norm, &L.ffn_norm, &L.bq, &L.bk, &L.bv, &L.q_norm, &L.k_norm}) add(*t, nullptr);
  }
  m.weights_bytes += static_cast<int64_t>(packed_buf_.size());
  m.kv_pool_bytes = static_cast<int64_t>(kv_cache_.size());
  auto vec = [](const auto& v) { return static_cast<int64_t>(v.capacity() * sizeof(v[0])); };
  for (const auto* v : {&x_, &xn_, &xg_, &q_, &k_, &v_, &att_, &tmp_, &gate_, &up_, &rope_cs_, &attn_scratch_, &logits_})
    m.scratch_bytes += vec(*v);
  m.scratch_bytes += vec(mm_scratch_);
  return m;
}

int64_t cpu_kv_block_bytes(const KvCacheConfig& kv, int n_layers, int n_kv_heads, int head_dim) {
  const int64_t slots = (kv.block_size + cpu::ops::kKeyChunk - 1) / cpu::ops::kKeyChunk * cpu::ops::kKeyChunk;
  const int64_t elems = static_cast<int64_t>(n_kv_heads) * head_dim * slots;  // K (or V) of one layer
  const cpu::ops::KvElem e = to_kv_elem(kv.dtype);
  const int64_t scales = e == cpu::ops::KvElem::Q8 ? 4 * static_cast<int64_t>(n_kv_heads) * slots : 0;
  return 2 * (cpu::ops::kv_elem_bytes(e) * elems + scales) * n_layers;
}

Expected<std::unique_ptr<Backend>> make_cpu_backend(const model::Model& model, const BackendOptions& opts) {
  SS_ASSIGN(auto be, CpuBackend::create(model, opts));
  return std::unique_ptr<Backend>(std::move(be));
}

}  // namespace ss::backend
