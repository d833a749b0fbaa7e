// 32-value block types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL) on AVX-512 VNNI. vpdpbusd multiplies unsigned
// weight bytes by signed activation bytes, so weights are used as w + C (nibbles as stored, Q8_0 as
// w ^ 0x80) and the quantizer's C * sum(aq) comes off the integer dot.
//
// Two kernels, chosen by n_tok, bit-identical per (t, o) (contract: kernels_internal.h):
//  - per token (decode): lanes are 16 weight rows. Each row's dot over two blocks is one vpdpbusd;
//    a transpose-and-add tree turns 16 such vectors into per-block sums with lanes = rows, so the
//    weights stream from memory once per token with no staging.
//  - tiled (prefill): lanes are 16 tokens (activations interleaved by 4 bytes). 16 weight rows are
//    unpacked once to bytes; each 4-byte weight broadcast feeds 16 tokens and each activation vector
//    feeds 8 rows, so the loop is mostly vpdpbusd (8 per block and row, plus 4 ops of block_step).
#include <immintrin.h>

#include <algorithm>

#include "backend/cpu/amx_tiles.h"
#include "backend/cpu/kernels_internal.h"

namespace ss::cpu::detail::avx512 {

namespace {

using model::DType;

// Block layout: bytes per block, offsets of qs and qh; nib: 4-bit values (else Q8_0 bytes); five: a 5th
// bit in qh; min: has the m term; zp: the kernel's integer dot needs the C * sum(aq) correction.
// nl: nibbles index the IQ4_NL levels (signed, stored + 128 like Q8_0's bytes).
struct Layout {
  int bytes, qs, qh;
  bool nib, five, min, zp, nl = false;
};
template <DType T>
constexpr Layout kFmt{};
template <> constexpr Layout kFmt<DType::Q4_0>{18, 2, 0, true, false, false, true};
template <> constexpr Layout kFmt<DType::Q4_1>{20, 4, 0, true, false, true, false};
template <> constexpr Layout kFmt<DType::Q5_0>{22, 6, 2, true, true, false, true};
template <> constexpr Layout kFmt<DType::Q5_1>{24, 8, 4, true, true, true, false};
template <> constexpr Layout kFmt<DType::Q8_0>{34, 2, 0, false, false, false, true};
template <> constexpr Layout kFmt<DType::IQ4_NL>{18, 2, 0, true, false, false, true, true};

// Nibbles (in each 128-bit lane) to IQ4_NL levels + 128.
inline __m512i nl_levels(__m512i nib) {
  const __m512i table = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(model::kIq4nlValues)));
  return _mm512_xor_si512(_mm512_shuffle_epi8(table, nib), _mm512_set1_epi8(static_cast<char>(0x80)));
}

// One block as 32 unsigned bytes in element order.
template <DType T>
inline __m256i unpack_block(const uint8_t* blk) {
  constexpr Layout F = kFmt<T>;
  if constexpr (F.nib) {
    const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + F.qs));
    __m256i v = _mm256_and_si256(_mm256_inserti128_si256(_mm256_castsi128_si256(x), _mm_srli_epi16(x, 4), 1),
                                 _mm256_set1_epi8(0x0F));
    if constexpr (F.five) v = _mm256_mask_add_epi8(v, load_as<uint32_t>(blk + F.qh), v, _mm256_set1_epi8(16));
    if constexpr (F.nl) v = _mm512_castsi512_si256(nl_levels(_mm512_castsi256_si512(v)));
    return v;
  } else {
    return _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + F.qs)),
                            _mm256_set1_epi8(static_cast<char>(0x80)));
  }
}

// Two blocks as 64 unsigned bytes. Nibble types come out as 128-bit quarters [b lo, b1 lo, b hi, b1 hi]
// (no shuffle needed; the activations are permuted to match once per block pair), Q8_0 as [b, b1].
template <DType T>
inline __m512i unpack_pair(const uint8_t* blk0, const uint8_t* blk1) {
  constexpr Layout F = kFmt<T>;
  if constexpr (F.nib) {
    const __m256i x = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk0 + F.qs))),
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk1 + F.qs)), 1);
    __m512i v = _mm512_and_si512(_mm512_inserti64x4(_mm512_castsi256_si512(x), _mm256_srli_epi16(x, 4), 1),
                                 _mm512_set1_epi8(0x0F));
    if constexpr (F.five) {
      const uint64_t h0 = load_as<uint32_t>(blk0 + F.qh), h1 = load_as<uint32_t>(blk1 + F.qh);
      const uint64_t m = (h0 & 0xFFFF) | (h1 & 0xFFFF) << 16 | (h0 >> 16) << 32 | (h1 >> 16) << 48;
      v = _mm512_mask_add_epi8(v, m, v, _mm512_set1_epi8(16));
    }
    if constexpr (F.nl) v = nl_levels(v);
    return v;
  } else {
    const __m512i x = _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk0 + F.qs))),
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk1 + F.qs)), 1);
    return _mm512_xor_si512(x, _mm512_set1_epi8(static_cast<char>(0x80)));
  }
}

// p[r]: row r's 16 dword partial dots over two blocks. Returns per-block sums with lanes = rows.
// kSplit: the 128-bit quarters of block b (b1 the others) are {0, 2} for nibble types, {0, 1} for Q8_0.
template <bool kNib>
inline void reduce_rows(const __m512i* p, __m512i& out0, __m512i& out1) {
  __m512i u[4];
  for (int q = 0; q < 4; ++q) {
    const __m512i* s = p + 4 * q;
    // Within each quarter: [r0, r1, r0, r1] pairwise sums, then the 4 rows' quarter totals.
    const __m512i t0 = _mm512_add_epi32(_mm512_unpacklo_epi32(s[0], s[1]), _mm512_unpackhi_epi32(s[0], s[1]));
    const __m512i t1 = _mm512_add_epi32(_mm512_unpacklo_epi32(s[2], s[3]), _mm512_unpackhi_epi32(s[2], s[3]));
    u[q] = _mm512_add_epi32(_mm512_unpacklo_epi64(t0, t1), _mm512_unpackhi_epi64(t0, t1));
  }
  // Combine quarters per block: x = [rows 0-3 of b, rows 0-3 of b1, rows 4-7 of b, rows 4-7 of b1].
  constexpr int kA = kNib ? _MM_SHUFFLE(1, 0, 1, 0) : _MM_SHUFFLE(2, 0, 2, 0);
  constexpr int kB = kNib ? _MM_SHUFFLE(3, 2, 3, 2) : _MM_SHUFFLE(3, 1, 3, 1);
  const __m512i x01 = _mm512_add_epi32(_mm512_shuffle_i64x2(u[0], u[1], kA), _mm512_shuffle_i64x2(u[0], u[1], kB));
  const __m512i x23 = _mm512_add_epi32(_mm512_shuffle_i64x2(u[2], u[3], kA), _mm512_shuffle_i64x2(u[2], u[3], kB));
  out0 = _mm512_shuffle_i64x2(x01, x23, _MM_SHUFFLE(2, 0, 2, 0));
  out1 = _mm512_shuffle_i64x2(x01, x23, _MM_SHUFFLE(3, 1, 3, 1));
}

// The per-block float step of the contract; both kernels call exactly this, lane for lane.
template <DType T>
inline __m512 block_step(__m512 acc, __m512i I, __m512 dw, __m512 mw, __m512 da, __m512 sa, __m512i corr) {
  if constexpr (kFmt<T>.zp) I = _mm512_sub_epi32(I, corr);
  acc = _mm512_fmadd_ps(_mm512_mul_ps(dw, da), _mm512_cvtepi32_ps(I), acc);
  if constexpr (kFmt<T>.min) acc = _mm512_fmadd_ps(mw, sa, acc);
  return acc;
}

// GFNI's affine byte transform (vgf2p8affineqb, imm 0): bit i of each result byte is the parity of
// (the source byte AND byte 7 - i of A's qword), so one op moves or masks bits within every byte.
// Through inline asm: the rest of this file must not need -mgfni (AVX-512 CPUs before Ice Lake and
// Zen 4 lack it); the packed kernels take it only where gfni_active().
[[gnu::always_inline]] inline __m512i gf_affine(__m512i x, __m512i A) {
  __m512i r;
  asm("vgf2p8affineqb $0, %2, %1, %0" : "=v"(r) : "v"(x), "v"(A));
  return r;
}
// A for: the high nibble of each byte to its low nibble (bits 4..7 -> 0..3, the rest 0).
constexpr uint64_t kGfHighNibble = 0x1020408000000000ull;
// A for: bit b of each byte to bit 4, the rest 0 (byte 3 of A makes result bit 4).
constexpr uint64_t gf_bit_to_4(int b) { return (uint64_t{1} << b) << 24; }

template <DType T>
void rows_per_token(const model::Tensor& W, const QActs& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  constexpr Layout F = kFmt<T>;
  const int64_t nb = W.cols() / 32;
  const int64_t rs = static_cast<int64_t>(W.row_stride());
  const auto* base = static_cast<const uint8_t*>(W.data);
  for (int64_t o0 = r0; o0 < r1; o0 += 16) {
    const int nr = static_cast<int>(std::min<int64_t>(16, r1 - o0));
    const uint8_t* row[16];
    alignas(64) int32_t off[16];
    for (int r = 0; r < 16; ++r) {  // rows past the end repeat the last one; their lanes are dropped
      off[r] = static_cast<int32_t>(std::min(r, nr - 1) * rs);
      row[r] = base + o0 * rs + off[r];
    }
    const __m512i vidx = _mm512_load_si512(off);
    const uint8_t* grp = base + o0 * rs;
    const __mmask16 keep = static_cast<__mmask16>((1u << nr) - 1);
    // Block headers of 16 rows: (d | m << 16) as fp16 pairs.
    auto header = [&](int64_t b, __m512& dw, __m512& mw) {
      const __m512i h = _mm512_i32gather_epi32(vidx, grp + b * F.bytes, 1);
      dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(h));
      mw = F.min ? _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(h, 16))) : dw;
    };
    for (int t = 0; t < a.n_tok; ++t) {
      const int8_t* at = a.qs + a.qidx(t, 0);
      const int64_t s0 = a.sidx(t, 0);
      __m512 acc = _mm512_setzero_ps();
      for (int64_t b = 0; b < nb; b += 2) {
        const int64_t b1 = std::min(b + 1, nb - 1);  // an odd last block pairs with itself; dropped
        __m512i av = _mm512_loadu_si512(at + 32 * b);  // may read 32 bytes past the row: scratch tail
        if constexpr (F.nib) av = _mm512_shuffle_i64x2(av, av, _MM_SHUFFLE(3, 1, 2, 0));
        __m512i p[16];
        for (int r = 0; r < 16; ++r)
          p[r] = _mm512_dpbusd_epi32(_mm512_setzero_si512(),
                                     unpack_pair<T>(row[r] + b * F.bytes, row[r] + b1 * F.bytes), av);
        __m512i i0, i1;
        reduce_rows<F.nib>(p, i0, i1);
        __m512 dw, mw;
        header(b, dw, mw);
        acc = block_step<T>(acc, i0, dw, mw, _mm512_set1_ps(a.d[s0 + b]), _mm512_set1_ps(a.s[s0 + b]),
                            _mm512_set1_epi32(a.corr[s0 + b]));
        if (b1 != b) {
          header(b1, dw, mw);
          acc = block_step<T>(acc, i1, dw, mw, _mm512_set1_ps(a.d[s0 + b1]), _mm512_set1_ps(a.s[s0 + b1]),
                              _mm512_set1_epi32(a.corr[s0 + b1]));
        }
      }
      _mm512_mask_storeu_ps(y + t * ldy + o0, keep, acc);
    }
  }
}

// Values of a row staged per pass: 16 rows x kChunk bytes (32 KiB) on the stack. Longer rows carry the
// accumulators through y between passes (a float round trip is exact, so the contract holds).
constexpr int64_t kChunk = 2048;
constexpr int64_t kL2Bytes = 1024 * 1024;  // activation bytes per token block

// Activations of one 16-token group within the staged chunk.
struct GroupActs {
  const int8_t* q;  // 8 x 64 bytes per block
  const float* d;
  const float* s;
  const int32_t* corr;
};

// R rows x NG groups of 16 tokens over blocks [0, nb) of the staged chunk; acc holds the running sums.
// Each 4-byte weight broadcast feeds NG x 16 tokens, each activation vector R rows.
template <DType T, int R, int NG>
[[gnu::always_inline]] inline void tile_rows(const uint8_t (*wq)[kChunk], const float (*dw)[kChunk / 32],
                                             const float (*mw)[kChunk / 32], const GroupActs* ga, int64_t nb,
                                             __m512 (&acc)[NG][R]) {
  constexpr int G = 16;
  for (int64_t b = 0; b < nb; ++b) {
    __m512i isum[NG][R];
#pragma GCC unroll 8
    for (int g = 0; g < NG; ++g)
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) isum[g][r] = _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) {
      __m512i av[NG];
#pragma GCC unroll 8
      for (int g = 0; g < NG; ++g) av[g] = _mm512_load_si512(ga[g].q + b * 8 * 64 + 64 * k);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m512i w = _mm512_set1_epi32(load_as<int32_t>(wq[r] + 32 * b + 4 * k));
#pragma GCC unroll 8
        for (int g = 0; g < NG; ++g) isum[g][r] = _mm512_dpbusd_epi32(isum[g][r], w, av[g]);
      }
    }
#pragma GCC unroll 8
    for (int g = 0; g < NG; ++g) {
      const __m512 vda = _mm512_load_ps(ga[g].d + b * G), vsa = _mm512_load_ps(ga[g].s + b * G);
      const __m512i vcorr = _mm512_load_si512(ga[g].corr + b * G);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r)
        acc[g][r] = block_step<T>(acc[g][r], isum[g][r], _mm512_set1_ps(dw[r][b]), _mm512_set1_ps(mw[r][b]), vda,
                                  vsa, vcorr);
    }
  }
}

// 16 rows at a time, in sub-tiles of R rows x NG groups of 16 tokens; each 16 x 16 result tile is
// transposed so each token's 16 outputs go to y as one store (y rows can be far apart, e.g. the
// 49152-wide lm_head).
template <DType T, int R, int NG>
void rows_tiled(const model::Tensor& W, const QActs& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  constexpr Layout F = kFmt<T>;
  constexpr int G = 16, RB = 16;
  const int64_t cols = W.cols();
  const int64_t rs = static_cast<int64_t>(W.row_stride());
  const auto* base = static_cast<const uint8_t*>(W.data);
  const int ng = a.n_pad() / G;
  alignas(64) uint8_t wq[RB][kChunk];
  alignas(64) float dw[RB][kChunk / 32], mw[RB][kChunk / 32];
  alignas(64) float tile[NG][RB][G];  // [group][row][token]
  const __m512i col_idx = _mm512_setr_epi32(0, 16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240);

  // Token blocks whose activations stay in L2 while every row block passes over them.
  const int gb = static_cast<int>(std::max<int64_t>(NG, kL2Bytes / (cols * G) / NG * NG));
  for (int gb0 = 0; gb0 < ng; gb0 += gb)
  for (int64_t o0 = r0; o0 < r1; o0 += RB) {
    const int nr = static_cast<int>(std::min<int64_t>(RB, r1 - o0));
    const int nsub = (nr + R - 1) / R;
    const __mmask16 keep = static_cast<__mmask16>((1u << nr) - 1);
    for (int64_t c0 = 0; c0 < cols; c0 += kChunk) {
      const int64_t b0 = c0 / 32, nbc = (std::min(cols, c0 + kChunk) - c0) / 32;
      for (int r = 0; r < nsub * R; ++r) {  // rows past the end repeat the last one; never stored
        const uint8_t* row = base + (o0 + std::min(r, nr - 1)) * rs + b0 * F.bytes;
        for (int64_t b = 0; b < nbc; ++b) {
          const uint8_t* blk = row + b * F.bytes;
          _mm256_store_si256(reinterpret_cast<__m256i*>(wq[r] + 32 * b), unpack_block<T>(blk));
          dw[r][b] = _cvtsh_ss(load_as<uint16_t>(blk));
          mw[r][b] = F.min ? _cvtsh_ss(load_as<uint16_t>(blk + 2)) : 0.0f;
        }
      }
      const int g_end = std::min(ng, gb0 + gb);
      for (int g0 = gb0; g0 < g_end; g0 += NG) {
        // A last odd group runs with a duplicate (same lanes, same ops); only real groups are stored.
        const int nreal = std::min(NG, g_end - g0);
        GroupActs ga[NG];
        for (int j = 0; j < NG; ++j) {
          const int g = g0 + std::min(j, nreal - 1);
          const int64_t si = a.sidx(g * G, b0);
          ga[j] = {a.qs + a.qidx(g * G, c0), a.d + si, a.s + si, a.corr + si};
          const int nt = std::min(G, a.n_tok - g * G);
          if (c0 > 0)  // resume: tile[j][r][l] = y[token l][row r]
            for (int l = 0; l < nt; ++l) {
              const __m512 v = _mm512_maskz_loadu_ps(keep, y + (g * G + l) * ldy + o0);
              _mm512_mask_i32scatter_ps(&tile[j][0][l], keep, col_idx, v, 4);
            }
        }
        for (int sub = 0; sub < nsub; ++sub) {
          __m512 acc[NG][R];
          for (int j = 0; j < NG; ++j)
            for (int r = 0; r < R; ++r)
              acc[j][r] = c0 > 0 ? _mm512_load_ps(tile[j][sub * R + r]) : _mm512_setzero_ps();
          tile_rows<T, R, NG>(wq + sub * R, dw + sub * R, mw + sub * R, ga, nbc, acc);
          for (int j = 0; j < NG; ++j)
            for (int r = 0; r < R; ++r) _mm512_store_ps(tile[j][sub * R + r], acc[j][r]);
        }
        for (int j = 0; j < nreal; ++j) {
          const int g = g0 + j, nt = std::min(G, a.n_tok - g * G);
          for (int l = 0; l < nt; ++l)
            _mm512_mask_storeu_ps(y + (g * G + l) * ldy + o0, keep,
                                  _mm512_mask_i32gather_ps(_mm512_setzero_ps(), keep, col_idx, &tile[j][0][l], 4));
        }
      }
    }
  }
}

// 8 rows x 1 group: 8 accumulators + 8 integer sums in registers. Measured (bench_kernels, 576x1536
// Q4_1, 512 tokens): 8x1 ~400 GFLOP/s, 4x2 ~400, 4x1 ~350, 8x2 ~390 (spills), 16x1 ~190 (spills).
constexpr int kTileRows = 8, kTileGroups = 1;

template <DType T>
void rows_t(const model::Tensor& W, const QActs& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  if (a.group == 1) rows_per_token<T>(W, a, y, ldy, r0, r1);
  else rows_tiled<T, kTileRows, kTileGroups>(W, a, y, ldy, r0, r1);
}

// ---- packed weights (PackedMatrix, layout in kernels_internal.h): lanes = 16 output rows ----------
// Per block, each group's 4 (nibble) or 8 (Q8_0) weight vectors are loaded once and each feeds NT
// tokens, whose 4 activation bytes are broadcast. No staging, no horizontal sums: the 16 lanes are the
// 16 rows' running sums, stored to y as one vector per token. With NG = 2 row groups per pass each
// broadcast feeds two vpdpbusd (one per group): at 16 tokens the broadcasts take vector-pipe slots
// beside the vpdpbusd and the float step, and halving them made the 16-token lm_head (Q8_0) 9-12% and
// the Q4_1 products 1-6% faster (docs/perf/serving.md). Each group's arithmetic (integer sums, float step, order over blocks) is
// the same whatever NG and NT, so the bits are too.
// gp: the first group, group g + 1 at gp + group_bytes; keep_last: the last group's valid rows (the
// others are whole). pf, pf_lines: lines to prefetch during this pass, spread over its blocks.
template <DType T, int NT, int NG, bool kGf>
[[gnu::always_inline]] inline void packed_tokens(const uint8_t* gp, int64_t group_bytes, int64_t nb, int block_bytes,
                                                 const QActs& a, int t0, float* y, int64_t ldy, int64_t o0,
                                                 __mmask16 keep_last, const uint8_t* pf, int64_t pf_lines,
                                                 const SideSpread& side) {
  constexpr Layout F = kFmt<T>;
  constexpr int H = F.min ? 64 : 32;
  // Few chains (NG x NT) split each block's integer sum over two (an exact integer add joins them) so
  // the vpdpbusd latency chain is not the limit; the float step per block is the contract's.
  constexpr int C = NG * NT < 4 ? 2 : 1;
  const int64_t cols = a.cols;
  const int8_t* at[NT];
  const float* ad[NT];
  const float* as[NT];
  const int32_t* ac[NT];
  __m512 acc[NG][NT];
  for (int i = 0; i < NT; ++i) {
    at[i] = a.qs + (t0 + i) * cols;
    ad[i] = a.d + (t0 + i) * nb;
    as[i] = a.s + (t0 + i) * nb;
    ac[i] = a.corr + (t0 + i) * nb;
    for (int g = 0; g < NG; ++g) acc[g][i] = _mm512_setzero_ps();
  }
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  const int64_t pf_per_block = (pf_lines + nb - 1) / nb;  // no division inside the loop
  for (int64_t b = 0; b < nb; ++b) {
    for (int64_t l = b * pf_per_block, le = std::min(l + pf_per_block, pf_lines); l < le; ++l)
      prefetch_next_weights(pf + 64 * l, F.nib ? 1 : a.n_tok);  // nibble types: L1 measured as good
    side.at(b);
    const uint8_t* p[NG];
    for (int g = 0; g < NG; ++g) p[g] = gp + g * group_bytes + b * block_bytes;
    __m512i isum[NG][NT][C];
    for (int g = 0; g < NG; ++g)
      for (int i = 0; i < NT; ++i)
        for (int c = 0; c < C; ++c) isum[g][i][c] = _mm512_setzero_si512();
    if constexpr (F.nib) {
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {
        __m512i lo[NG], hi[NG];
        for (int g = 0; g < NG; ++g) {
          const __m512i w = _mm512_loadu_si512(p[g] + H + 64 * j);
          if constexpr (kGf) {  // the same bytes, 5 ops a group for Q5_0's (7 below), 2 for 4-bit ones (3)
            hi[g] = gf_affine(w, _mm512_set1_epi64(static_cast<long long>(kGfHighNibble)));
            if constexpr (F.five) {
              const __m512i h = _mm512_loadu_si512(p[g] + H + 256);
              const __m512i bl = gf_affine(h, _mm512_set1_epi64(static_cast<long long>(gf_bit_to_4(j))));
              const __m512i bh = gf_affine(h, _mm512_set1_epi64(static_cast<long long>(gf_bit_to_4(4 + j))));
              lo[g] = _mm512_ternarylogic_epi32(w, bl, low4, 0xEC);  // (w & 0x0F) | bit
              hi[g] = _mm512_or_si512(hi[g], bh);
            } else {
              lo[g] = _mm512_and_si512(w, low4);
            }
          } else {
            lo[g] = _mm512_and_si512(w, low4);
            hi[g] = _mm512_and_si512(_mm512_srli_epi16(w, 4), low4);
            if constexpr (F.five) {  // bits j and 4 + j of the 5th-bit vector to 0x10: x | (h' & 0x10), one op (0xF8)
              const __m512i h = _mm512_loadu_si512(p[g] + H + 256);
              const __m512i bit5 = _mm512_set1_epi8(0x10);
              lo[g] = _mm512_ternarylogic_epi32(lo[g], _mm512_slli_epi16(h, 4 - j), bit5, 0xF8);
              hi[g] = _mm512_ternarylogic_epi32(hi[g], _mm512_srli_epi16(h, j), bit5, 0xF8);
            }
          }
          if constexpr (F.nl) {  // the levels + 128, as the unpacked kernel's bytes
            lo[g] = nl_levels(lo[g]);
            hi[g] = nl_levels(hi[g]);
          }
        }
        for (int i = 0; i < NT; ++i) {
          const int8_t* x = at[i] + 32 * b + 4 * j;
          const __m512i xl = _mm512_set1_epi32(load_as<int32_t>(x)), xh = _mm512_set1_epi32(load_as<int32_t>(x + 16));
          for (int g = 0; g < NG; ++g) {
            isum[g][i][0] = _mm512_dpbusd_epi32(isum[g][i][0], lo[g], xl);
            isum[g][i][C - 1] = _mm512_dpbusd_epi32(isum[g][i][C - 1], hi[g], xh);
          }
        }
      }
    } else {
#pragma GCC unroll 8
      for (int k = 0; k < 8; ++k) {
        __m512i w[NG];
        for (int g = 0; g < NG; ++g) w[g] = _mm512_loadu_si512(p[g] + H + 64 * k);
        for (int i = 0; i < NT; ++i) {
          const __m512i x = _mm512_set1_epi32(load_as<int32_t>(at[i] + 32 * b + 4 * k));
          for (int g = 0; g < NG; ++g) isum[g][i][k % C] = _mm512_dpbusd_epi32(isum[g][i][k % C], w[g], x);
        }
      }
    }
    for (int g = 0; g < NG; ++g) {
      const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p[g])));
      const __m512 mw = F.min ? _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p[g] + 32))) : dw;
      for (int i = 0; i < NT; ++i) {
        const __m512i I = C == 2 ? _mm512_add_epi32(isum[g][i][0], isum[g][i][C - 1]) : isum[g][i][0];
        acc[g][i] = block_step<T>(acc[g][i], I, dw, mw, _mm512_set1_ps(ad[i][b]), _mm512_set1_ps(as[i][b]),
                                  _mm512_set1_epi32(ac[i][b]));
      }
    }
  }
  for (int i = 0; i < NT; ++i)
    for (int g = 0; g < NG; ++g)
      _mm512_mask_storeu_ps(y + (t0 + i) * ldy + o0 + g * kPackRows, g + 1 == NG ? keep_last : __mmask16(0xFFFF),
                            acc[g][i]);
}

// f.template operator()<n>() for a run-time n in [1, N].
template <int N, class F>
[[gnu::always_inline]] inline void with_tokens(int n, F&& f) {
  if constexpr (N > 1)
    if (n < N) return with_tokens<N - 1>(n, f);
  f.template operator()<N>();
}

// All tokens over NG groups starting at group g, in passes of up to KT tokens (registers: NG x KT float
// and integer accumulators). The next NG groups (contiguous, fewer at the end of [g, g1)) are
// prefetched while these compute, their lines split evenly over the passes so DRAM stays busy through
// all of them.
template <DType T, int NG, int KT, bool kGf>
void packed_groups(const PackedMatrix& P, const QActs& a, float* y, int64_t ldy, int64_t g, int64_t g1) {
  const int64_t nb = P.cols / 32;
  const int bb = packed_format(T).block_bytes;
  const uint8_t* gp = P.data + g * P.group_bytes;
  const int64_t o0 = g * kPackRows;
  const int nr = static_cast<int>(std::min<int64_t>(kPackRows, P.rows - o0 - (NG - 1) * kPackRows));
  const __mmask16 keep = static_cast<__mmask16>((1u << nr) - 1);
  const int64_t next_lines = (std::clamp<int64_t>(g1 - g - NG, 0, NG) * P.group_bytes + 63) / 64;
  const uint8_t* pf = gp + NG * P.group_bytes;
  const int passes = (a.n_tok + KT - 1) / KT;
  for (int pass = 0, t = 0; t < a.n_tok; ++pass, t += KT) {
    const int64_t l0 = next_lines * pass / passes, l1 = next_lines * (pass + 1) / passes;
    const SideSpread side = side_take(a.side, NG * nb, nb);
    with_tokens<KT>(std::min(KT, a.n_tok - t), [&]<int NT>() {
      packed_tokens<T, NT, NG, kGf>(gp, P.group_bytes, nb, bb, a, t, y, ldy, o0, keep, pf + 64 * l0, l1 - l0, side);
    });
  }
}

// Tokens per pass: over one group 8 (8 float + 8 integer accumulators, 2 weight vectors), over a pair
// 4 (2 x 4 + 2 x 4, 4 weight vectors). Below 4 tokens one group at a time.
constexpr int kPackedTokens = 8, kPairTokens = 4;

template <DType T, bool kGf>
void rows_packed_g(const PackedMatrix& P, const QActs& a, float* y, int64_t ldy, int64_t g0, int64_t g1) {
  int64_t g = g0;
  if (a.n_tok >= kPairTokens)
    for (; g + 2 <= g1; g += 2) packed_groups<T, 2, kPairTokens, kGf>(P, a, y, ldy, g, g1);
  for (; g < g1; ++g) packed_groups<T, 1, kPackedTokens, kGf>(P, a, y, ldy, g, g1);
}
// The nibble types' unpack through GFNI where the CPU has it (the same bytes either way).
template <DType T>
void rows_packed_t(const PackedMatrix& P, const QActs& a, float* y, int64_t ldy, int64_t g0, int64_t g1) {
  if constexpr (kFmt<T>.nib)
    if (gfni_active()) return rows_packed_g<T, true>(P, a, y, ldy, g0, g1);
  rows_packed_g<T, false>(P, a, y, ldy, g0, g1);
}

// ---- AMX-INT8 (Sapphire Rapids and later): the packed layout is already the B tile ---------------
// TDPBSUD multiplies an A tile of signed bytes (M rows x K) by a B tile of unsigned bytes laid out as
// K/4 rows of N lanes x 4 bytes: C[m][n] += sum_k A[m][k] B[k/4][4n + k%4]. A packed block's vector j
// (lane r = values 4j..4j+3 of row r) is B's row j, so with A = nt tokens x the 32 activation bytes
// of one block (straight from the row-major scratch, stride cols) and B = the block's 8 weight
// vectors (the nibbles unpacked with vector ops once per group into a stack buffer: tile loads of
// weights still in DRAM stall), C row t is the very integer vector isum of packed_tokens for token t: one
// instruction per block and 16 tokens instead of 8 vpdpbusd and 8 broadcasts per token. The float
// step is block_step on those integers, block after block, so the bits are those of the VNNI kernels.
// Tiles: amx_configure(nt, 32) (amx_tiles.h): A = nt tokens x one block's 32 activation bytes,
// B = its 8 weight vectors, C = nt x 16 int32; 3-5 the same for the odd block of a pair.

constexpr int kAmxTokens = 16;         // tokens per pass (A and C tile rows)
constexpr int kAmxCachedBlocks = 64;   // nibble blocks of a group kept unpacked across passes (32 KiB)
constexpr int kAmxBlockBytes = 8 * 64;  // one unpacked block: B's 8 rows

// Tokens [t0, t0 + nt) over one group; NT >= nt accumulators (the extra lanes repeat the last token
// and are never stored). unpack: write the group's unpacked blocks into ub (else they are there).
template <DType T, int NT>
SS_AMX void amx_tokens(const uint8_t* gp, int64_t nb, uint8_t* ub, bool cached, bool unpack, const QActs& a, int t0,
                       int nt, float* y, int64_t ldy, int64_t o0, __mmask16 keep, const uint8_t* pf,
                       int64_t pf_lines, const SideSpread& side) {
  constexpr Layout F = kFmt<T>;
  constexpr int H = F.min ? 64 : 32;
  constexpr int bb = packed_format(T).block_bytes;
  // Q4_0/Q5_0: the unpacked B holds the signed values (TDPBSSD), which saves the per-token correction.
  constexpr bool kSigned = F.nib && F.zp && !F.nl;
  const int64_t cols = a.cols;
  const float* ad[NT];
  const float* as[NT];
  const int32_t* ac[NT];
  __m512 acc[NT];
  for (int i = 0; i < NT; ++i) {
    const int t = t0 + (i < nt ? i : nt - 1);
    ad[i] = a.d + t * nb;
    as[i] = a.s + t * nb;
    ac[i] = a.corr + t * nb;
    acc[i] = _mm512_setzero_ps();
  }
  // C of pair k (blocks 2k, 2k + 1) goes to cb[k % kRing]; its float step runs kLag pairs later, so
  // the vector loads do not wait on tile stores just issued and the tile unit works ahead meanwhile.
  constexpr int kRing = 2, kLag = 1;
  alignas(64) int32_t cb[kRing][2][kAmxTokens * 16] = {};
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  const int64_t pf_per_block = (pf_lines + nb - 1) / nb;
  // Blocks [b0, b1) to B tiles in ub (slot b - b0). Done a whole range ahead of their tile loads: a
  // tile load of bytes still in the store buffer stalls until they drain.
  auto unpack_range = [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        const uint8_t* p = gp + b * bb;
        uint8_t* u = ub + (b - b0) * kAmxBlockBytes;
        for (int j = 0; j < 4; ++j) {  // B rows j (values 4j..) and 4 + j (values 16 + 4j..)
          const __m512i w = _mm512_loadu_si512(p + H + 64 * j);
          __m512i lo = _mm512_and_si512(w, low4), hi = _mm512_and_si512(_mm512_srli_epi16(w, 4), low4);
          if constexpr (F.five) {
            const __m512i h = _mm512_loadu_si512(p + H + 256);
            const __m512i bit5 = _mm512_set1_epi8(0x10);
            lo = _mm512_or_si512(lo, _mm512_and_si512(_mm512_slli_epi16(h, 4 - j), bit5));
            hi = _mm512_or_si512(hi, _mm512_and_si512(_mm512_srli_epi16(h, j), bit5));
          }
          if constexpr (kSigned) {  // w = q - C: the tile's integer is then I - corr itself
            const __m512i zc = _mm512_set1_epi8(F.five ? 16 : 8);
            lo = _mm512_sub_epi8(lo, zc);
            hi = _mm512_sub_epi8(hi, zc);
          }
          _mm512_store_si512(u + 64 * j, lo);
          _mm512_store_si512(u + 256 + 64 * j, hi);
        }
      }
  };
  auto float_step = [&](int64_t b, const int32_t* c) {
    const uint8_t* p = gp + b * bb;
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    const __m512 mw = F.min ? _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32))) : dw;
    for (int i = 0; i < NT; ++i) {
      if constexpr (kSigned)  // block_step's arithmetic on I - corr, which the tile produced
        acc[i] = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(ad[i][b])),
                                 _mm512_cvtepi32_ps(_mm512_load_si512(c + 16 * i)), acc[i]);
      else
        acc[i] = block_step<T>(acc[i], _mm512_load_si512(c + 16 * i), dw, mw, _mm512_set1_ps(ad[i][b]),
                               _mm512_set1_ps(as[i][b]), _mm512_set1_epi32(ac[i][b]));
    }
  };
  const int8_t* aq = a.qs + t0 * cols;
  const int64_t npairs = (nb + 1) / 2;
  auto pair_step = [&](int64_t k) {
    float_step(2 * k, cb[k % kRing][0]);
    if (2 * k + 1 < nb) float_step(2 * k + 1, cb[k % kRing][1]);
  };
  for (int64_t c0 = 0; c0 < nb; c0 += kAmxCachedBlocks) {
    const int64_t c1 = std::min(nb, c0 + kAmxCachedBlocks);
    if (unpack || !cached) unpack_range(c0, c1);
    auto wt = [&](int64_t b) -> const void* { return ub + (b - c0) * kAmxBlockBytes; };
    for (int64_t b = c0; b < c1; b += 2) {
      for (int64_t l = b * pf_per_block, le = std::min(l + 2 * pf_per_block, pf_lines); l < le; ++l)
        prefetch_next_weights(pf + 64 * l, a.n_tok);  // to L2, as the VNNI passes (kernels_internal.h)
      const int64_t k = b / 2;
      side.at(k);
      _tile_loadd(0, aq + 32 * b, cols);
      _tile_loadd(1, wt(b), 64);
      _tile_zero(2);
      if constexpr (kSigned) _tile_dpbssd(2, 0, 1);
      else _tile_dpbsud(2, 0, 1);
      const bool two = b + 1 < c1;
      if (two) {
        _tile_loadd(3, aq + 32 * (b + 1), cols);
        _tile_loadd(4, wt(b + 1), 64);
        _tile_zero(5);
        if constexpr (kSigned) _tile_dpbssd(5, 3, 4);
        else _tile_dpbsud(5, 3, 4);
      }
      _tile_stored(2, cb[k % kRing][0], 64);
      if (two) _tile_stored(5, cb[k % kRing][1], 64);
      if (k >= kLag) pair_step(k - kLag);
    }
  }
  for (int64_t k = std::max<int64_t>(0, npairs - kLag); k < npairs; ++k) pair_step(k);
  for (int i = 0; i < NT; ++i)
    if (i < nt) _mm512_mask_storeu_ps(y + (t0 + i) * ldy + o0, keep, acc[i]);
}

template <DType T>
SS_AMX void rows_packed_amx_t(const PackedMatrix& P, const QActs& a, float* y, int64_t ldy, int64_t g0, int64_t g1) {
  const int64_t nb = P.cols / 32;
  const bool cached = nb <= kAmxCachedBlocks;
  static_assert(kFmt<T>.nib && !kFmt<T>.nl, "AMX: Q4_0, Q4_1, Q5_0, Q5_1 (see rows_packed)");
  alignas(64) uint8_t ub[kAmxCachedBlocks * kAmxBlockBytes];
  amx_walk_groups(P, a.n_tok, kAmxTokens, 32, g0, g1,
                  [&](const uint8_t* gp, int64_t o0, __mmask16 keep, int t, int nt, const uint8_t* pf) SS_AMX {
                    const int64_t pf_lines = pf ? static_cast<int64_t>(P.group_bytes / 64) : 0;
                    const bool unpack = t == 0;
                    // The side stream's lines of two 4-token VNNI passes (per_block per 16 rows x 32
                    // columns: cpu_backend.cpp), spread over its block pairs: half of the full share,
                    // as rows_packed_amx_k (matmul_qk_packed_avx512.cpp) says why.
                    const SideSpread side = side_take(a.side, 2 * nb, (nb + 1) / 2);
                    if (nt > 12) amx_tokens<T, 16>(gp, nb, ub, cached, unpack, a, t, nt, y, ldy, o0, keep, pf, pf_lines, side);
                    else if (nt > 8) amx_tokens<T, 12>(gp, nb, ub, cached, unpack, a, t, nt, y, ldy, o0, keep, pf, pf_lines, side);
                    else if (nt > 4) amx_tokens<T, 8>(gp, nb, ub, cached, unpack, a, t, nt, y, ldy, o0, keep, pf, pf_lines, side);
                    else amx_tokens<T, 4>(gp, nb, ub, cached, unpack, a, t, nt, y, ldy, o0, keep, pf, pf_lines, side);
                  });
}

}  // namespace

// AMX for the nibble types. Not for Q8_0: its largest product, the lm_head (30 MB), is bound by
// reading the weights, and there AMX was slower in the 16-stream step (bench decode, lm_head 1.96 ->
// 2.20 ms per step; tile loads straight from the packed bytes or a vector copy first alike), while
// the Q8_0 layer products (attn_v of Q4_K_M) are small.
void rows_packed(const PackedMatrix& P, const QActs& a, float* y, int64_t ldy, int64_t g0, int64_t g1) {
  if (a.n_tok >= kAmxMinTokens && amx_active()) {
    switch (P.type) {
      case DType::Q4_0: return rows_packed_amx_t<DType::Q4_0>(P, a, y, ldy, g0, g1);
      case DType::Q4_1: return rows_packed_amx_t<DType::Q4_1>(P, a, y, ldy, g0, g1);
      case DType::Q5_0: return rows_packed_amx_t<DType::Q5_0>(P, a, y, ldy, g0, g1);
      case DType::Q5_1: return rows_packed_amx_t<DType::Q5_1>(P, a, y, ldy, g0, g1);
      default: break;  // Q8_0 and IQ4_NL stay on VNNI: see below
    }
  }
  switch (P.type) {
    case DType::Q4_0: return rows_packed_t<DType::Q4_0>(P, a, y, ldy, g0, g1);
    case DType::Q4_1: return rows_packed_t<DType::Q4_1>(P, a, y, ldy, g0, g1);
    case DType::Q5_0: return rows_packed_t<DType::Q5_0>(P, a, y, ldy, g0, g1);
    case DType::Q5_1: return rows_packed_t<DType::Q5_1>(P, a, y, ldy, g0, g1);
    case DType::Q8_0: return rows_packed_t<DType::Q8_0>(P, a, y, ldy, g0, g1);
    case DType::IQ4_NL: return rows_packed_t<DType::IQ4_NL>(P, a, y, ldy, g0, g1);
    case DType::Q2_K: case DType::Q3_K: case DType::Q4_K: case DType::Q5_K: case DType::Q6_K: case DType::IQ4_XS:
      return rows_packed_k(P, a, y, ldy, g0, g1);
    default: return;
  }
}

// The tiled kernel stages every weight row once per call; below ~5 tokens the per-token kernel wins
// (measured: docs/perf/cpu-kernels.md).
int act_group(model::DType wtype, int n_tok) { return is_k_type(wtype) || n_tok < 5 ? 1 : 16; }

void rows_q32(const model::Tensor& W, const QActs& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  switch (W.type) {
    case DType::Q4_0: return rows_t<DType::Q4_0>(W, a, y, ldy, r0, r1);
    case DType::Q4_1: return rows_t<DType::Q4_1>(W, a, y, ldy, r0, r1);
    case DType::Q5_0: return rows_t<DType::Q5_0>(W, a, y, ldy, r0, r1);
    case DType::Q5_1: return rows_t<DType::Q5_1>(W, a, y, ldy, r0, r1);
    case DType::Q8_0: return rows_t<DType::Q8_0>(W, a, y, ldy, r0, r1);
    case DType::IQ4_NL: return rows_t<DType::IQ4_NL>(W, a, y, ldy, r0, r1);
    default: return;
  }
}

}  // namespace ss::cpu::detail::avx512
