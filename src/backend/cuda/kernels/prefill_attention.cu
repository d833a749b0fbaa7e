// Causal prefill attention on tensor cores (kernels.h, "prefill attention on tensor cores").
//
// A CTA: one tile of up to 64 query rows (one sequence, consecutive positions) and one query head;
// four warps, sixteen rows each. With pack_group the CTA takes a KV head instead, and its rows are
// (position, query head of the group) pairs, so the group reads each K/V tile once. Q is rounded to
// bf16 into shared memory once and held as mma A fragments. The sequence's keys are walked in tiles
// of 64 (four 16-token pages of the paged cache): K and V of the next tile are copied into the other
// half of a double buffer with cp.async while the current one is multiplied. Per key tile a warp
// computes S = Q K^T (16 x 64, fp32), masks the keys past each row's context, updates its rows'
// running max and sum, rounds P to bf16 (the S accumulators are already laid out as the next mma's
// A fragments) and accumulates O += P V. Shared rows are XOR-swizzled in 16-byte chunks (chunk c of
// row r at c ^ (r & 7)) so ldmatrix reads eight rows of one chunk from eight different bank groups.
//
// A tile of at most 16 rows (a decode row's G rows with pack_group, a prompt's short tail) keeps
// one warp of four busy. With split_keys the four warps split every key tile instead, 16 keys
// each, each with its own running max, sum and output for the same 16 rows, merged through shared
// memory at the end in a fixed order (warp 0, 1, 2, 3). The KV read is the same; each warp's
// multiplies and shared-memory reads a key tile fall to a quarter.
//
// The longest tiles (the last rows of a prompt see the most keys) are scheduled first; the heads of
// one KV group are neighbours in the grid, so the K/V tiles they share are read from L2.
#include <string>

#include "backend/cuda/kernels/common.cuh"

namespace ss::cuda::kern {
namespace {

using namespace dev;

constexpr int kRows = kPrefillTileRows;  // query rows a CTA
constexpr int kKeys = 64;                // keys a tile
constexpr int kWarps = kRows / 16;
constexpr float kLog2e = 1.4426950408889634f;

// Offset (in bf16 elements) of 16-byte chunk c of row r in a swizzled [rows][HD] tile.
template <int HD>
__device__ __forceinline__ int swz(int r, int c) {
  return r * HD + ((c ^ (r & 7)) << 3);
}

template <int HD>
constexpr int smem_bytes() {
  return (kRows * HD + 2 * 2 * kKeys * HD) * 2;  // Q, then K[2] and V[2]
}

// Issues the cp.async copies of key tile kt's K and V into buffer `buf`. Keys at or past kend are
// zero-filled (their scores are masked; a zero V keeps 0 * garbage from making a NaN).
template <int HD>
__device__ __forceinline__ void load_kv(const PrefillAttention& a, const int32_t* table, int kvh, int kt, int kend,
                                        uint16_t* sK, uint16_t* sV) {
  constexpr int CPR = HD / 8;
  const int64_t kv_stride = static_cast<int64_t>(a.n_kv) * kBlockTokens * HD;  // K -> V of a block
  for (int i = threadIdx.x; i < kKeys * CPR; i += kWarps * 32) {
    const int r = i / CPR, c = i % CPR;
    const int t = kt * kKeys + r;
    const bool valid = t < kend;
    const uint16_t* src = a.cache;
    if (valid) {
      const int64_t blk = table[t / kBlockTokens];
      src = a.cache + (blk * 2 * a.n_kv + kvh) * kBlockTokens * HD + static_cast<int64_t>(t % kBlockTokens) * HD + c * 8;
    }
    cp_async16(sK + swz<HD>(r, c), src, valid);
    cp_async16(sV + swz<HD>(r, c), valid ? src + kv_stride : src, valid);
  }
}

// One key tile for one warp's sixteen rows: keys key0 .. key0 + NK - 1 of tile kt (NK = 64, or 16 when
// the four warps split the tile). S = Q K^T (fp32), scores in the log2 domain with the keys past a
// row's context masked, the running max and sum updated, P rounded to bf16 (the S accumulators are
// already laid out as the next mma's A fragments) and O += P V. Rows g and g + 8 of the sixteen are
// this thread's (A and B).
template <int HD, int NK>
__device__ __forceinline__ void key_tile(const uint16_t* K, const uint16_t* V, const uint32_t (&qf)[HD / 16][4], int key0,
                                         int kt, int ctx_min, int ctxA, int ctxB, float sl2, int lane, float& mA,
                                         float& mB, float& lA, float& lB, float (&o)[HD / 8][4]) {
  constexpr int KS = HD / 16, DT = HD / 8;
  const int tq = lane & 3;
  float s[NK / 8][4];
#pragma unroll
  for (int j = 0; j < NK / 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < KS; ++kk) {
#pragma unroll
    for (int jp = 0; jp < NK / 16; ++jp) {
      // Matrices: (keys 16jp..+7, chunk 2kk), (same keys, 2kk+1), (keys 16jp+8..+15, 2kk), (…, 2kk+1).
      const int mi = lane >> 3;
      const int key = key0 + jp * 16 + (mi >> 1) * 8 + (lane & 7);
      uint32_t b0, b1, b2, b3;
      ldsm_x4(K + swz<HD>(key, 2 * kk + (mi & 1)), b0, b1, b2, b3);
      mma_bf16(s[2 * jp], qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3], b0, b1);
      mma_bf16(s[2 * jp + 1], qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3], b2, b3);
    }
  }

  // Scores in the log2 domain; keys past a row's context masked.
  const bool full = (kt + 1) * kKeys <= ctx_min;
  float xA = -INFINITY, xB = -INFINITY;
#pragma unroll
  for (int j = 0; j < NK / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int key = kt * kKeys + key0 + j * 8 + tq * 2 + e;
      float va = s[j][e] * sl2, vb = s[j][2 + e] * sl2;
      if (!full) {
        if (key >= ctxA) va = -INFINITY;
        if (key >= ctxB) vb = -INFINITY;
      }
      s[j][e] = va, s[j][2 + e] = vb;
      xA = fmaxf(xA, va), xB = fmaxf(xB, vb);
    }
  }
  xA = fmaxf(xA, __shfl_xor_sync(0xffffffffu, xA, 1));
  xA = fmaxf(xA, __shfl_xor_sync(0xffffffffu, xA, 2));
  xB = fmaxf(xB, __shfl_xor_sync(0xffffffffu, xB, 1));
  xB = fmaxf(xB, __shfl_xor_sync(0xffffffffu, xB, 2));
  const float nA = fmaxf(mA, xA), nB = fmaxf(mB, xB);
  // A row that has seen no key yet keeps max -inf: exponents taken against 0 then give 0, not NaN.
  const float uA = nA == -INFINITY ? 0.0f : nA, uB = nB == -INFINITY ? 0.0f : nB;
  const float cA = exp2f(mA - uA), cB = exp2f(mB - uB);
  mA = nA, mB = nB;
  lA *= cA, lB *= cB;
#pragma unroll
  for (int d = 0; d < DT; ++d) o[d][0] *= cA, o[d][1] *= cA, o[d][2] *= cB, o[d][3] *= cB;

  // P = exp2(S - max), rounded to bf16 as the A operand of P V (two 8-key column tiles make one
  // 16-key k-step); the sums take the rounded values, so the normalisation matches what was summed.
#pragma unroll
  for (int kk = 0; kk < NK / 16; ++kk) {
    uint32_t pa[4];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float* c = s[2 * kk + half];
      const __nv_bfloat162 top = __floats2bfloat162_rn(exp2f(c[0] - uA), exp2f(c[1] - uA));
      const __nv_bfloat162 bot = __floats2bfloat162_rn(exp2f(c[2] - uB), exp2f(c[3] - uB));
      lA += __low2float(top) + __high2float(top);
      lB += __low2float(bot) + __high2float(bot);
      pa[half * 2] = *reinterpret_cast<const uint32_t*>(&top);
      pa[half * 2 + 1] = *reinterpret_cast<const uint32_t*>(&bot);
    }
#pragma unroll
    for (int dp = 0; dp < DT / 2; ++dp) {
      // Matrices (transposed): (keys 16kk..+7, chunk 2dp), (keys 16kk+8..+15, 2dp), (…+0..7, 2dp+1), (…+8..15, 2dp+1).
      const int mi = lane >> 3;
      const int key = key0 + kk * 16 + (mi & 1) * 8 + (lane & 7);
      uint32_t b0, b1, b2, b3;
      ldsm_x4_t(V + swz<HD>(key, 2 * dp + (mi >> 1)), b0, b1, b2, b3);
      mma_bf16(o[2 * dp], pa[0], pa[1], pa[2], pa[3], b0, b1);
      mma_bf16(o[2 * dp + 1], pa[0], pa[1], pa[2], pa[3], b2, b3);
    }
  }
}

template <int HD>
__global__ void __launch_bounds__(kWarps * 32) prefill_attn_k(PrefillAttention a) {
  constexpr int CPR = HD / 8;   // 16-byte chunks a row
  constexpr int KS = HD / 16;   // k-steps of Q K^T
  constexpr int DT = HD / 8;    // 8-wide output column tiles
  extern __shared__ uint4 smem_raw[];
  uint16_t* sQ = reinterpret_cast<uint16_t*>(smem_raw);
  uint16_t* sKV = sQ + kRows * HD;  // K0 V0 K1 V1
  auto sK = [&](int b) { return sKV + b * 2 * kKeys * HD; };
  auto sV = [&](int b) { return sKV + (b * 2 + 1) * kKeys * HD; };

  const int n_tiles = a.n_tiles_dev ? *a.n_tiles_dev : static_cast<int>(gridDim.y);
  if (static_cast<int>(blockIdx.y) >= n_tiles) return;  // a grid sized for the step's rows
  const PrefillTile tl = a.tiles[n_tiles - 1 - blockIdx.y];
  const int G = a.n_heads / a.n_kv;
  // Tile row r is position r / rpp of the tile and query head head_of(r): one head (blockIdx.x) per
  // CTA, or with pack_group the G heads of KV head blockIdx.x, position-major.
  const int rpp = a.pack_group ? G : 1;
  const int kvh = a.pack_group ? blockIdx.x : blockIdx.x / G;
  auto head_of = [&](int r) { return a.pack_group ? kvh * G + r % G : static_cast<int>(blockIdx.x); };
  const int tile_rows = tl.n_rows * rpp;  // valid rows of the 64
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  // At most 16 rows: every warp takes rows 0-15 and a quarter of each key tile (the header).
  const bool split = a.split_keys && tile_rows <= 16;
  const int row0 = split ? 0 : warp * 16;  // this warp's first row
  const int g = lane >> 2, tq = lane & 3;
  const int32_t* table = a.tables + static_cast<int64_t>(tl.slot) * a.max_blocks;
  const int kend = a.ctx_len[tl.row0 + tl.n_rows - 1];  // the tile's last row sees the most keys
  const int nkt = (kend + kKeys - 1) / kKeys;

  load_kv<HD>(a, table, kvh, 0, kend, sK(0), sV(0));
  cp_async_commit();

  // Q: fp32 rows -> bf16, swizzled; rows past the tile are zeros.
  for (int i = threadIdx.x; i < kRows * CPR; i += kWarps * 32) {
    const int r = i / CPR, c = i % CPR;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (r < tile_rows) {
      const float4* p = reinterpret_cast<const float4*>(
          a.q + (static_cast<int64_t>(tl.row0 + r / rpp) * a.n_heads + head_of(r)) * HD + c * 8);
      const float4 x = p[0], y = p[1];
      v.x = pack_bf2(x.x, x.y), v.y = pack_bf2(x.z, x.w), v.z = pack_bf2(y.x, y.y), v.w = pack_bf2(y.z, y.w);
    }
    *reinterpret_cast<uint4*>(sQ + swz<HD>(r, c)) = v;
  }
  __syncthreads();
  uint32_t qf[KS][4];
  {
    const int r = row0 + (lane & 15);
#pragma unroll
    for (int kk = 0; kk < KS; ++kk) ldsm_x4(sQ + swz<HD>(r, 2 * kk + (lane >> 4)), qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3]);
  }

  // This thread's two rows (g and g + 8 of the warp's sixteen) and the keys they see; padding rows
  // see every key (their q is zero, their output is not written).
  const int rA = row0 + g, rB = rA + 8;
  const int ctxA = rA < tile_rows ? a.ctx_len[tl.row0 + rA / rpp] : kend;
  const int ctxB = rB < tile_rows ? a.ctx_len[tl.row0 + rB / rpp] : kend;
  const int ctx_min = a.ctx_len[tl.row0];  // the first row sees the fewest
  const float sl2 = a.scale * kLog2e;

  float o[DT][4];
#pragma unroll
  for (int d = 0; d < DT; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
  float mA = -INFINITY, mB = -INFINITY, lA = 0.0f, lB = 0.0f;

  for (int kt = 0; kt < nkt; ++kt) {
    const int buf = kt & 1;
    if (kt + 1 < nkt) load_kv<HD>(a, table, kvh, kt + 1, kend, sK(buf ^ 1), sV(buf ^ 1));
    cp_async_commit();  // an empty group on the last tile keeps the count uniform
    cp_async_wait<1>();
    __syncthreads();
    const uint16_t* K = sK(buf);
    const uint16_t* V = sV(buf);
    // A split tile: every warp, 16 keys of the 64. Otherwise a warp whose sixteen rows are all padding
    // only helps load and waits.
    if (split)
      key_tile<HD, 16>(K, V, qf, warp * 16, kt, ctx_min, ctxA, ctxB, sl2, lane, mA, mB, lA, lB, o);
    else if (warp * 16 < tile_rows)
      key_tile<HD, kKeys>(K, V, qf, 0, kt, ctx_min, ctxA, ctxB, sl2, lane, mA, mB, lA, lB, o);
    __syncthreads();  // every warp is done with this buffer before the next iteration refills it
  }
  cp_async_wait<0>();

  if (split) {
    // Merge the four warps' partial rows: each rescales its output and sum to the rows' common max;
    // warps 1-3 leave theirs in shared memory (the K/V buffers are free: the last iteration ended at
    // a barrier and its copy group was empty) and warp 0 adds them in order.
    float* sm = reinterpret_cast<float*>(sKV);  // [4 warps][16 rows] maxima
    float* so = sm + kWarps * 16;              // [3 warps][32 lanes][DT x 4 outputs, 2 sums]
    constexpr int W = DT * 4 + 2;
    static_assert((kWarps * 16 + (kWarps - 1) * 32 * W) * 4 <= 2 * 2 * kKeys * HD * 2, "merge fits the K/V buffers");
    if (tq == 0) sm[warp * 16 + g] = mA, sm[warp * 16 + g + 8] = mB;
    __syncthreads();
    float MA = -INFINITY, MB = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) MA = fmaxf(MA, sm[w * 16 + g]), MB = fmaxf(MB, sm[w * 16 + g + 8]);
    // A warp whose keys were all past a row's context has max -inf there and adds nothing.
    const float fA = mA == -INFINITY ? 0.0f : exp2f(mA - MA), fB = mB == -INFINITY ? 0.0f : exp2f(mB - MB);
    lA *= fA, lB *= fB;
#pragma unroll
    for (int d = 0; d < DT; ++d) o[d][0] *= fA, o[d][1] *= fA, o[d][2] *= fB, o[d][3] *= fB;
    if (warp > 0) {
      float* dst = so + ((warp - 1) * 32 + lane) * W;
#pragma unroll
      for (int d = 0; d < DT; ++d) dst[d * 4] = o[d][0], dst[d * 4 + 1] = o[d][1], dst[d * 4 + 2] = o[d][2], dst[d * 4 + 3] = o[d][3];
      dst[DT * 4] = lA, dst[DT * 4 + 1] = lB;
    }
    __syncthreads();
    if (warp > 0) return;
#pragma unroll
    for (int w = 0; w < kWarps - 1; ++w) {
      const float* src = so + (w * 32 + lane) * W;
#pragma unroll
      for (int d = 0; d < DT; ++d) o[d][0] += src[d * 4], o[d][1] += src[d * 4 + 1], o[d][2] += src[d * 4 + 2], o[d][3] += src[d * 4 + 3];
      lA += src[DT * 4], lB += src[DT * 4 + 1];
    }
  }

  lA += __shfl_xor_sync(0xffffffffu, lA, 1);
  lA += __shfl_xor_sync(0xffffffffu, lA, 2);
  lB += __shfl_xor_sync(0xffffffffu, lB, 1);
  lB += __shfl_xor_sync(0xffffffffu, lB, 2);
  const float iA = lA > 0.0f ? 1.0f / lA : 0.0f, iB = lB > 0.0f ? 1.0f / lB : 0.0f;
#pragma unroll
  for (int d = 0; d < DT; ++d) {
    const int col = d * 8 + tq * 2;
    if (rA < tile_rows)
      *reinterpret_cast<uint32_t*>(a.out + (static_cast<int64_t>(tl.row0 + rA / rpp) * a.n_heads + head_of(rA)) * HD +
                                   col) = pack_bf2(o[d][0] * iA, o[d][1] * iA);
    if (rB < tile_rows)
      *reinterpret_cast<uint32_t*>(a.out + (static_cast<int64_t>(tl.row0 + rB / rpp) * a.n_heads + head_of(rB)) * HD +
                                   col) = pack_bf2(o[d][2] * iB, o[d][3] * iB);
  }
}

// prefill_tiles' rule, 32 rows at a time: a row starts a run where the slot changes or the position
// is not the previous one's + 1, and a tile where a run starts or max_rows rows of the run have gone.
__global__ void build_tiles_k(const int32_t* slot, const int32_t* pos, int T, int max_rows, PrefillTile* tiles,
                              int32_t* n_tiles) {
  const int lane = threadIdx.x;
  int run0 = 0, count = 0;  // the current run's first row, tiles so far
  for (int base = 0; base < T; base += 32) {
    const int i = base + lane;
    const bool in = i < T;
    const bool brk = in && (i == 0 || slot[i] != slot[i - 1] || pos[i] != pos[i - 1] + 1);
    const unsigned breaks = __ballot_sync(0xffffffffu, brk);
    const unsigned upto = breaks & (0xffffffffu >> (31 - lane));  // breaks at lanes <= this one
    const int my_run0 = upto ? base + 31 - __clz(upto) : run0;
    const bool start = in && (brk || (i - my_run0) % max_rows == 0);
    const unsigned starts = __ballot_sync(0xffffffffu, start);
    if (start) tiles[count + __popc(starts & ((1u << lane) - 1))] = PrefillTile{i, 0, slot[i], 0};
    count += __popc(starts);
    run0 = breaks ? base + 31 - __clz(breaks) : run0;
  }
  __syncwarp();
  // Each tile runs to the next one's first row (the last to T).
  for (int t = lane; t < count; t += 32) tiles[t].n_rows = (t + 1 < count ? tiles[t + 1].row0 : T) - tiles[t].row0;
  if (lane == 0) *n_tiles = count;
}

template <int HD>
Status launch_prefill(const PrefillAttention& a, cudaStream_t s) {
  constexpr int smem = smem_bytes<HD>();
  static_assert(smem <= 227 * 1024, "shared memory");
  if (smem > 48 * 1024)
    SS_CUDA_TRY(cudaFuncSetAttribute(prefill_attn_k<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  prefill_attn_k<HD><<<dim3(a.pack_group ? a.n_kv : a.n_heads, a.n_tiles), kWarps * 32, smem, s>>>(a);
  SS_CUDA_LAUNCHED();
  return {};
}

}  // namespace

Status build_tiles(const int32_t* slot_of_row, const int32_t* pos_of_row, int T, int max_rows, PrefillTile* tiles,
                   int32_t* n_tiles, cudaStream_t s) {
  if (T < 0 || T > 65535 || max_rows < 1)
    return make_error("build_tiles: " + std::to_string(T) + " rows (at most 65535), " + std::to_string(max_rows) +
                      " rows a tile (at least 1)");
  build_tiles_k<<<1, 32, 0, s>>>(slot_of_row, pos_of_row, T, max_rows, tiles, n_tiles);
  SS_CUDA_LAUNCHED();
  return {};
}

Status prefill_attention(const PrefillAttention& a, cudaStream_t s) {
  if (a.n_kv <= 0 || a.n_heads % a.n_kv != 0)
    return make_error("prefill attention: n_heads (" + std::to_string(a.n_heads) + ") must be a multiple of n_kv (" +
                      std::to_string(a.n_kv) + ")");
  if (a.hd != 64 && a.hd != 128)
    return make_error("prefill attention: head dim " + std::to_string(a.hd) + " not supported (64, 128)");
  if (a.n_tiles < 0 || a.n_tiles > 65535 || a.n_heads > 65535)
    return make_error("prefill attention: " + std::to_string(a.n_tiles) + " tiles of " + std::to_string(a.n_heads) +
                      " heads do not fit the grid");
  if (a.pack_group && a.n_heads / a.n_kv > kRows)
    return make_error("prefill attention: a group of " + std::to_string(a.n_heads / a.n_kv) +
                      " query heads does not fit a tile of " + std::to_string(kRows) + " rows");
  if (a.n_tiles == 0) return {};
  return a.hd == 64 ? launch_prefill<64>(a, s) : launch_prefill<128>(a, s);
}

}  // namespace ss::cuda::kern
