// Private to cpu/: the forward pass's non-matmul kernels (attention, norms, activation, RoPE), built
// once per ISA from cpu_ops_impl.h and picked at run time like the matmul kernels.
//
// Batch invariance: every function computes each token row (and each (token, head) pair of the
// attention) with an operation order that depends only on that row's data and position, never on
// how many rows are processed together or where the row sits in a tile.
#pragma once
#include <cstddef>
#include <cstdint>

#include "backend/cpu/kernels.h"

namespace ss::cpu::ops {

constexpr int kAttnTile = 32;   // query rows of one sequence sharing each K/V block read
constexpr int kKeyChunk = 16;   // keys per score vector; blocks are padded to a multiple
constexpr int kPassChunks = 128;  // key chunks per softmax pass (longer contexts rescale between passes)
constexpr int kMultiRows = 12;    // query rows of attention_token's widest micro-tile (3 groups x 4 heads)

// How the cache stores an element. Q8: int8 with one fp32 scale per (slot, KV head) -- the 8-bit
// cache of llama.cpp's q8_0 with one block per head: scale = max|x| / 127 over the head's head_dim
// values, q = round-half-even(x * (1 / scale)) clamped to +-127, x ~ q * scale. A head holding a
// non-finite value stores q = 0 and a NaN scale, so the NaN reaches the output as from a float cache.
enum class KvElem : uint8_t { F32, F16, Q8 };
constexpr int kv_elem_bytes(KvElem e) { return e == KvElem::F32 ? 4 : e == KvElem::F16 ? 2 : 1; }

// Per layer: where q, the output and this layer's paged K/V cache live.
// K cache: [num_blocks][n_kv][head_dim][bs_pad] (transposed so 16 keys fill one vector);
// V cache: [num_blocks][n_kv][bs_pad][head_dim]; bs_pad = block_size rounded up to kKeyChunk.
// Consecutive blocks are block_stride elements apart, which may hold other layers' blocks in between.
// Elements are fp32, fp16 (IEEE, round to nearest even) or Q8; a Q8 block's K scales,
// [n_kv][bs_pad] floats, sit scale_offset bytes past the block's K (its V scales likewise past its V).
struct AttnLayer {
  const float* q;          // q[t * q_stride + h * head_dim + d], RoPE'd and pre-scaled by 1/sqrt(hd)
  int64_t q_stride;
  float* out;              // out[t * out_stride + h * head_dim + d]
  int64_t out_stride;
  const void* k_cache;
  const void* v_cache;
  int64_t block_stride;    // elements from one block to the next (>= n_kv * head_dim * bs_pad), K and V
  int head_dim;
  int block_size;
  int bs_pad;
  int n_rep;               // query heads per KV head (GQA)
  const int32_t* positions;  // by token index
  KvElem kv_elem;
  int n_kv;                // KV heads: a block's K (and its V) is n_kv * head_dim * bs_pad elements
  int64_t scale_offset;    // Q8 only: bytes from a block's K (V) to its K (V) scales
};

// Attention of query rows `rows[0..n_rows)` (token indices of one sequence, n_rows <= kAttnTile)
// for query head `head`, over positions 0..positions[row] through `block_table`.
// scratch: attn_scratch_floats(head_dim) floats, private to the calling thread.
using AttnFn = void (*)(const AttnLayer& L, const int32_t* rows, int n_rows, int head, const int32_t* block_table,
                        float* scratch);
size_t attn_scratch_floats(int head_dim);
// Attention of one token `row` for the query heads head0..head0+n_heads-1, which must share one KV
// head (a GQA group): they form one micro-tile, so every K/V load serves all of them. Each head's
// result is bit-identical to attention() of that head alone (rows never mix in the arithmetic).
using AttnGroupFn = void (*)(const AttnLayer& L, int32_t row, int head0, int n_heads, const int32_t* block_table,
                             float* scratch);

// Attention of one token `row` for every query head: attention_group() for each GQA group, bit for
// bit, but where the vector width allows, several groups form one micro-tile so that each block's K
// of those KV heads, and then its V, are read as one contiguous run (a decode step's attention is
// bound by reading the cache: measured ~24 GB/s for 2 KiB per-head pieces, ~30 for 6 KiB runs).
using AttnTokenFn = void (*)(const AttnLayer& L, int32_t row, const int32_t* block_table, float* scratch);

struct OpsTable {
  const char* name;
  // out = x / rms(x) * w
  void (*rmsnorm)(const float* x, const float* w, float* out, int n, float eps);
  // x += d; out = x / rms(x) * w
  void (*add_rmsnorm)(float* x, const float* d, const float* w, float* out, int n, float eps);
  // x += d
  void (*add)(float* x, const float* d, int n);
  // g = silu(g) * u
  void (*silu_mul)(float* g, const float* u, int n);
  // In-place rotation of n_heads heads of `head_dim` (stride head_dim) over the first rope_dim dims.
  // cs: [rope_dim/2 cos][rope_dim/2 sin] for this token's position. interleaved: pairs (2i, 2i+1),
  // else pairs (i, i + rope_dim/2). Then every element is multiplied by `scale`.
  void (*rope)(float* x, int n_heads, int head_dim, int rope_dim, const float* cs, bool interleaved, float scale);
  AttnFn attention;
  AttnGroupFn attention_group;
  AttnTokenFn attention_token;
  // One token's K and V (n_kv heads of head_dim each) into `slot` of their blocks (block bases);
  // scale_offset as AttnLayer's (Q8 only).
  void (*store_kv)(const float* k, const float* v, void* k_block, void* v_block, int n_kv, int head_dim,
                   int64_t bs_pad, int slot, KvElem elem, int64_t scale_offset);
  // Sampling weights w[i] = exp(fma(x[i], scale, -shift)) for i < n, with the same bits on every ISA
  // (one polynomial, evaluated with the same roundings), and block_sums[j] = the sum of block j's weights
  // (kSampleBlock values; the last block may be shorter) in double, in a fixed order.
  void (*exp_weights)(const float* x, int n, float scale, float shift, float* w, double* block_sums);
  // The largest of x[0 .. n), n >= 1, x without NaN.
  float (*max_value)(const float* x, int n);
};

constexpr int kSampleBlock = 64;

const OpsTable& ops_for(Isa isa);

// One table per ISA (defined in cpu_ops.cpp / cpu_ops_avx2.cpp / cpu_ops_avx512.cpp).
const OpsTable& ops_scalar();
const OpsTable& ops_avx2();
const OpsTable& ops_avx512();

}  // namespace ss::cpu::ops
