// The decode layer's row tiles and epilogues, shared by the PDL-chained kernels (decode.cu) and the
// persistent decode kernel (mega.cu): which weight rows a 16-row tile holds and what a tile's
// results become (RoPE + KV store, residual add, SwiGLU, logits). Private to this folder.
#pragma once
#include "backend/cuda/kernels/common.cuh"

namespace ss::cuda::kern::dec {

using namespace dev;

enum class Op { Qkv, Add, GateUp, Logits };

struct DecArgs {
  const uint16_t* W;     // bf16 rows, or the packed quants (DevWeights)
  PackedAt pk;           // the packed formats: where each row's rounds lie (either layout)
  int Kp;                // K rounded up to 256 (quantized formats)
  int K;
  int tiles;             // 16-row tiles
  int N;                 // Add / Logits: rows of W; GateUp: F (W has 2F rows)
  int B;                 // batch rows (<= 8: the mma's N dimension)
  int S;                 // warps splitting K for one tile (1, 2, 4, 8)
  int KS = 1;            // CTAs splitting K for one tile (Add only; > 1: partials to `part`, a ticket)
  float* part;           // KS > 1: [tiles][KS][32 lanes][4] partial sums
  unsigned* tickets;     // KS > 1: [tiles], zero between launches
  const uint16_t* x;     // Add: the input [B][K] bf16
  const float* resid;    // the norm ops: the fp32 residual, rows of K
  const int32_t* rows;   // Logits: the residual row of each batch row (null: row b)
  const float* norm_w;
  float eps;
  float* y;              // Add: the residual [B][N] (+=); Logits: [B][N]
  uint16_t* act;         // GateUp: [B][F]
  RopeKv rk;             // Qkv
  bool full_rounds;      // rounds wholly inside a warp's K range skip the bound check a chunk
  bool hold;             // the norm ops at batch 1: the residual read once, held in registers
  bool empty;            // benchmarking only (SS_CUDA_EMPTY=1): the grid launches, waits and exits
  unsigned long long* stamps;  // the phase trace's slot (SS_CUDA_CHAIN_TRACE=1), else null
  uint32_t zero;         // always 0, unknown to the compiler: dec_k's pipelined packed loop makes the next
                         // round's addresses depend on the current round's data through it (decode.cu)
};

// Row `lr` (0..15) of tile `tile`, or -1. Rows lr and lr + 8 land in the same thread's accumulators,
// so the tiles pair what an epilogue needs together: a RoPE pair (i0, i1) of one head, gate row i
// and up row i; plain rows otherwise.
template <Op OP>
__device__ __forceinline__ int64_t tile_row(const DecArgs& a, int tile, int lr) {
  if constexpr (OP == Op::Qkv) {
    const QkvPair pp = qkv_pair(a.rk, tile * 8 + (lr & 7));
    return static_cast<int64_t>(pp.hh) * a.rk.hd + (lr < 8 ? pp.i0 : pp.i1);
  } else if constexpr (OP == Op::GateUp) {
    const int i = tile * 8 + (lr & 7);
    if (i >= a.N) return -1;
    return lr < 8 ? i : static_cast<int64_t>(a.N) + i;
  } else {
    const int64_t r = static_cast<int64_t>(tile) * 16 + lr;
    return r < a.N ? r : -1;
  }
}

// What a tile's epilogue reads besides its products, loaded before the kernel's dependency wait
// (EpiIn::load) for the first tile a thread reduces: no kernel of the step's last two writes it.
// Qkv: the position, rotation and KV block of batch rows 2t, 2t + 1 (QkvIn); Add: the residual at
// c's four places, whose last writer is the add two kernels back (o_proj after down, through QKV
// and attention; down after o_proj, through gate/up), complete and visible before the previous
// kernel passed its own wait, which is before it let this one launch.
template <Op OP>
struct EpiIn {
  QkvIn q[2];
  float r[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  __device__ __forceinline__ static EpiIn load(const DecArgs& a, int tile, int g, int t) {
    EpiIn e;
    if constexpr (OP == Op::Qkv) {
      const QkvPair pp = qkv_pair(a.rk, tile * 8 + g);
#pragma unroll
      for (int j = 0; j < 2; ++j)
        if (2 * t + j < a.B) e.q[j] = QkvIn::load(a.rk, 2 * t + j, pp.hh, pp.p, pp.rotate);
    } else if constexpr (OP == Op::Add) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t row = static_cast<int64_t>(tile) * 16 + g + 8 * h;
#pragma unroll
        for (int j = 0; j < 2; ++j)
          if (row < a.N && 2 * t + j < a.B) e.r[2 * h + j] = __ldcg(a.y + static_cast<int64_t>(2 * t + j) * a.N + row);
      }
    }
    return e;
  }
};

// Thread (g = lane / 4, t = lane % 4) holds rows g and g + 8 of the tile for batch rows 2t, 2t + 1:
// c[0] (g, 2t), c[1] (g, 2t+1), c[2] (g+8, 2t), c[3] (g+8, 2t+1). kL2: the residual read and written
// through L2 only (ld/st.global.cg), for a kernel in which other CTAs rewrite it between two reads.
// in: the tile's EpiIn, loaded earlier (null: read here).
template <Op OP, bool kL2 = false>
__device__ __forceinline__ void epilogue(const DecArgs& a, int tile, int g, int t, const float (&c)[4],
                                         const EpiIn<OP>* in = nullptr) {
  if constexpr (OP == Op::Qkv) {
    const QkvPair pp = qkv_pair(a.rk, tile * 8 + g);
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int b = 2 * t + j;
      if (b >= a.B) break;
      if (in) qkv_pair_out(a.rk, b, pp.hh, pp.i0, pp.i1, pp.rotate, c[j], c[2 + j], in->q[j]);
      else qkv_pair_out(a.rk, b, pp.hh, pp.p, pp.i0, pp.i1, pp.rotate, c[j], c[2 + j]);
    }
  } else if constexpr (OP == Op::GateUp) {
    const int i = tile * 8 + g;
    if (i >= a.N) return;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int b = 2 * t + j;
      if (b >= a.B) break;
      const float gt = c[j], up = c[2 + j];
      a.act[static_cast<int64_t>(b) * a.N + i] = f2bf(gt / (1.0f + __expf(-gt)) * up);
    }
  } else {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row = static_cast<int64_t>(tile) * 16 + g + 8 * h;
      if (row >= a.N) continue;
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int b = 2 * t + j;
        if (b >= a.B) break;
        float* o = a.y + static_cast<int64_t>(b) * a.N + row;
        if constexpr (OP == Op::Add && kL2) __stcg(o, __ldcg(o) + c[2 * h + j]);
        else if constexpr (OP == Op::Add) *o = (in ? in->r[2 * h + j] : *o) + c[2 * h + j];
        else *o = c[2 * h + j];
      }
    }
  }
}

}  // namespace ss::cuda::kern::dec
