// Private to cpu/: the body of cpu_ops.h's kernels, included by exactly one .cpp per ISA
// (cpu_ops.cpp: baseline, cpu_ops_avx2.cpp, cpu_ops_avx512.cpp; CMake gives the last two their -m
// flags). Everything sits in an anonymous namespace so the per-ISA copies never meet at link time;
// for the same reason this file uses no out-of-line standard-library templates.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "backend/cpu/cpu_ops.h"
#include "model/model.h"

#if defined(__AVX512F__) || defined(__AVX2__)
// GCC 12 flags the deliberately undefined vectors inside AVX-512 intrinsics (_mm512_undefined_ps).
// (GCC only: clang, used for the fuzz builds, has no -Wmaybe-uninitialized and -Werror rejects it.)
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>
#endif

namespace ss::cpu::ops {
namespace {

#define SS_INLINE inline __attribute__((always_inline))

// exp(x) by the Cephes polynomial (~1 ulp), operation for operation what the SIMD vexp below does
// (same clamps, round-to-nearest-even, fused multiply-adds), so every ISA gets the same bits; exact 0
// below -87.3 (and for -inf).
// Every multiply-add here is an explicit fma and no product feeds an add, so compiler contraction
// (-ffp-contract=fast, GCC's default, in -mfma files only) cannot change the bits.
SS_INLINE float exp_poly(float x) {
  const bool tiny = x < -87.3365478515625f;
  x = x > -87.3365478515625f ? x : -87.3365478515625f;
  x = x < 88.0f ? x : 88.0f;
  const float n = std::nearbyint(x * 1.44269504088896341f);
  float r = std::fma(-n, 0.693359375f, x);
  r = std::fma(-n, -2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = std::fma(p, r, 1.3981999507e-3f);
  p = std::fma(p, r, 8.3334519073e-3f);
  p = std::fma(p, r, 4.1665795894e-2f);
  p = std::fma(p, r, 1.6666665459e-1f);
  p = std::fma(p, r, 5.0000001201e-1f);
  p = std::fma(p, r * r, r + 1.0f);
  const int32_t e = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &e, sizeof scale);
  return tiny ? 0.0f : p * scale;
}

// ---- a minimal vector vocabulary: vf has W lanes ------------------------------------------------
#if defined(__AVX512F__)
using vf = __m512;
constexpr int W = 16;
constexpr int kRows = 8;  // query rows per QK micro-tile: 8 accumulators + 1 key vector
SS_INLINE vf vzero() { return _mm512_setzero_ps(); }
SS_INLINE vf vset(float a) { return _mm512_set1_ps(a); }
SS_INLINE vf vload(const float* p) { return _mm512_loadu_ps(p); }
SS_INLINE void vstore(float* p, vf a) { _mm512_storeu_ps(p, a); }
SS_INLINE vf vfma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
SS_INLINE vf vadd(vf a, vf b) { return _mm512_add_ps(a, b); }
SS_INLINE vf vsub(vf a, vf b) { return _mm512_sub_ps(a, b); }
SS_INLINE vf vmul(vf a, vf b) { return _mm512_mul_ps(a, b); }
SS_INLINE vf vdiv(vf a, vf b) { return _mm512_div_ps(a, b); }
SS_INLINE vf vmax(vf a, vf b) { return _mm512_max_ps(a, b); }
SS_INLINE vf vload(const uint16_t* p) {  // fp16
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
SS_INLINE vf vload(const int8_t* p) {  // Q8 (unscaled)
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
// fp32 -> fp16 (round to nearest even), n <= W values.
SS_INLINE void store_f16(uint16_t* dst, const float* src, int n) {
  const __mmask16 m = static_cast<__mmask16>(n >= 16 ? 0xFFFF : (1u << n) - 1);
  const __m256i h = _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, src), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  _mm256_mask_storeu_epi16(dst, m, h);
}
SS_INLINE float vhsum(vf a) { return _mm512_reduce_add_ps(a); }
SS_INLINE float vhmax(vf a) { return _mm512_reduce_max_ps(a); }
// exp(x), Cephes polynomial (~1 ulp); exact 0 below -87.3 (and for -inf).
SS_INLINE vf vexp(vf x) {
  const __mmask16 tiny = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.3365478515625f), _CMP_LT_OQ);
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3365478515625f)), _mm512_set1_ps(88.0f));
  const vf n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  vf r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  vf p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_maskz_mul_ps(static_cast<__mmask16>(~tiny), p, _mm512_castsi512_ps(e));
}
#elif defined(__AVX2__) && defined(__FMA__)
using vf = __m256;
constexpr int W = 8;
constexpr int kRows = 4;  // 4 rows x 2 vectors = 8 accumulators of 16 ymm registers
SS_INLINE vf vzero() { return _mm256_setzero_ps(); }
SS_INLINE vf vset(float a) { return _mm256_set1_ps(a); }
SS_INLINE vf vload(const float* p) { return _mm256_loadu_ps(p); }
SS_INLINE void vstore(float* p, vf a) { _mm256_storeu_ps(p, a); }
SS_INLINE vf vload(const uint16_t* p) {  // fp16
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
SS_INLINE vf vload(const int8_t* p) {  // Q8 (unscaled)
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
SS_INLINE void store_f16(uint16_t* dst, const float* src, int n) {
  alignas(16) uint16_t tmp[8];
  alignas(32) float in[8] = {};
  for (int i = 0; i < n; ++i) in[i] = src[i];
  _mm_store_si128(reinterpret_cast<__m128i*>(tmp), _mm256_cvtps_ph(_mm256_load_ps(in), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  for (int i = 0; i < n; ++i) dst[i] = tmp[i];
}
SS_INLINE vf vfma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
SS_INLINE vf vadd(vf a, vf b) { return _mm256_add_ps(a, b); }
SS_INLINE vf vsub(vf a, vf b) { return _mm256_sub_ps(a, b); }
SS_INLINE vf vmul(vf a, vf b) { return _mm256_mul_ps(a, b); }
SS_INLINE vf vdiv(vf a, vf b) { return _mm256_div_ps(a, b); }
SS_INLINE vf vmax(vf a, vf b) { return _mm256_max_ps(a, b); }
SS_INLINE float vhsum(vf a) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
SS_INLINE float vhmax(vf a) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
SS_INLINE vf vexp(vf x) {
  const vf tiny = _mm256_cmp_ps(x, _mm256_set1_ps(-87.3365478515625f), _CMP_LT_OQ);
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3365478515625f)), _mm256_set1_ps(88.0f));
  const vf n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  vf r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  vf p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(tiny, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}
#else
using vf = float;
constexpr int W = 1;
constexpr int kRows = 4;
SS_INLINE vf vzero() { return 0.0f; }
SS_INLINE vf vset(float a) { return a; }
SS_INLINE vf vload(const float* p) { return *p; }
SS_INLINE vf vload(const uint16_t* p) { return model::fp16_to_fp32(*p); }
SS_INLINE vf vload(const int8_t* p) { return static_cast<float>(*p); }
SS_INLINE void store_f16(uint16_t* dst, const float* src, int n) {
  for (int i = 0; i < n; ++i) dst[i] = model::fp32_to_fp16(src[i]);
}
SS_INLINE void vstore(float* p, vf a) { *p = a; }
SS_INLINE vf vfma(vf a, vf b, vf c) { return a * b + c; }
SS_INLINE vf vadd(vf a, vf b) { return a + b; }
SS_INLINE vf vsub(vf a, vf b) { return a - b; }
SS_INLINE vf vmul(vf a, vf b) { return a * b; }
SS_INLINE vf vdiv(vf a, vf b) { return a / b; }
SS_INLINE vf vmax(vf a, vf b) { return a > b ? a : b; }
SS_INLINE float vhsum(vf a) { return a; }
SS_INLINE float vhmax(vf a) { return a; }
SS_INLINE vf vexp(vf x) { return exp_poly(x); }
#endif

constexpr int NV = kKeyChunk / W;  // vectors per key chunk
SS_INLINE float vload_scalar(const float* p) { return *p; }
SS_INLINE float vload_scalar(const uint16_t* p) { return model::fp16_to_fp32(*p); }
SS_INLINE float vload_scalar(const int8_t* p) { return static_cast<float>(*p); }
// Q8 caches (KT = int8_t) carry a scale per slot: a score is (q . K_int) * k_scale, and a key's weight
// in P V is P * v_scale; float caches have neither multiply.
template <class KT>
constexpr bool kScaled = sizeof(KT) == 1;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

SS_INLINE float sum_squares(const float* x, int n) {
  vf a = vzero();
  int i = 0;
  for (; i + W <= n; i += W) {
    const vf v = vload(x + i);
    a = vfma(v, v, a);
  }
  float s = vhsum(a);
  for (; i < n; ++i) s += x[i] * x[i];
  return s;
}

SS_INLINE void scale_mul(const float* x, float inv, const float* w, float* out, int n) {
  const vf vi = vset(inv);
  int i = 0;
  for (; i + W <= n; i += W) vstore(out + i, vmul(vmul(vload(x + i), vi), vload(w + i)));
  for (; i < n; ++i) out[i] = x[i] * inv * w[i];
}

void rmsnorm_impl(const float* x, const float* w, float* out, int n, float eps) {
  const float inv = 1.0f / std::sqrt(sum_squares(x, n) / static_cast<float>(n) + eps);
  scale_mul(x, inv, w, out, n);
}

void add_impl(float* x, const float* d, int n) {
  int i = 0;
  for (; i + W <= n; i += W) vstore(x + i, vadd(vload(x + i), vload(d + i)));
  for (; i < n; ++i) x[i] += d[i];
}

void add_rmsnorm_impl(float* x, const float* d, const float* w, float* out, int n, float eps) {
  add_impl(x, d, n);
  rmsnorm_impl(x, w, out, n, eps);
}

void silu_mul_impl(float* g, const float* u, int n) {
  const vf one = vset(1.0f), zero = vzero();
  int i = 0;
  for (; i + W <= n; i += W) {
    const vf x = vload(g + i);
    vstore(g + i, vmul(vdiv(x, vadd(one, vexp(vsub(zero, x)))), vload(u + i)));
  }
  for (; i < n; ++i) g[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}

void rope_impl(float* x, int n_heads, int head_dim, int rope_dim, const float* cs, bool interleaved, float scale) {
  const int half = rope_dim / 2;
  const float* c = cs;
  const float* s = cs + half;
  for (int h = 0; h < n_heads; ++h) {
    float* v = x + static_cast<int64_t>(h) * head_dim;
    if (interleaved) {
      for (int i = 0; i < half; ++i) {
        const float x0 = v[2 * i], x1 = v[2 * i + 1];
        v[2 * i] = x0 * c[i] - x1 * s[i];
        v[2 * i + 1] = x1 * c[i] + x0 * s[i];
      }
    } else {
      for (int i = 0; i < half; ++i) {
        const float x0 = v[i], x1 = v[i + half];
        v[i] = x0 * c[i] - x1 * s[i];
        v[i + half] = x1 * c[i] + x0 * s[i];
      }
    }
    if (scale != 1.0f)
      for (int i = 0; i < head_dim; ++i) v[i] *= scale;
  }
}

// ---- attention -----------------------------------------------------------------------------------
// A micro-tile of up to kRows query rows (one head, one sequence) is processed on its own, in passes
// of up to kPassChunks key chunks (a chunk = 16 padded slots of one KV block):
//   1. S = q . K for every chunk of the pass (one FMA chain over d per score);
//   2. mask keys past each row's position (-inf), row max over the pass;
//   3. P = exp(S - max), row sum;  4. O = O * exp(old max - new max) + P V;  finally O / sum.
// Only a context longer than one pass (2048 keys at block_size 16) rescales. Every step is per row
// and walks keys in one fixed order, so a row's result does not depend on which rows share its
// micro-tile, tile or batch (decode, chunked prefill and prefill agree bit for bit).

constexpr int kSStride = kPassChunks * kKeyChunk;  // floats per row of S
// K is prefetched one qk_group call ahead: measured the same as 2-4 ahead (the single-thread loop is
// at DRAM bandwidth by then).
constexpr int kPfGroups = 1;
// attention_token's prefetches (the next chunks' K, these chunks' V) go to L2, not L1 (prefetcht1, not
// prefetcht0): a decode item reads ~123 KB of f16 K/V from DRAM, and with prefetcht0 it ran at ~10 GB/s
// per thread on Zen 4 whatever the distance (1, 2 or 4 calls ahead), 11.5 us an item against 6 us from
// cache; to L2 it takes ~8 us (docs/perf/cpu.md, 2026-12-05).
constexpr int kTokenPfLocality = 2;


template <class KT>
struct Chunk {
  const KT* K;  // transposed [hd][bs_pad] at this chunk's first slot
  const KT* V;  // [slot][hd] at this chunk's first slot
  int key0;        // position of slot 0
  int len;         // slots that exist in the block (< 16 only when block_size % 16 != 0)
  const float* ks;  // Q8: K and V scales of this chunk's slots (else null)
  const float* vs;
};

// A key's weight in P V: its softmax weight p, times its V scale in a Q8 cache.
template <class KT>
SS_INLINE float key_weight(float p, const Chunk<KT>& c, int i) {
  if constexpr (kScaled<KT>) return p * c.vs[i];
  return p;
}

// Slots of chunk c that a query at position pos sees.
template <class KT>
SS_INLINE int visible_keys(int pos, const Chunk<KT>& c) {
  const int valid = pos - c.key0 + 1;
  return valid < 0 ? 0 : valid > c.len ? c.len : valid;
}

// S[r * kSStride + c * 16 + lane] = q_r . K_c[:, lane] for NR rows and NC chunks; each score is one
// FMA chain over d whatever NR and NC, so decode (one row) gets its parallel chains from chunks.
// qt: the NR query rows transposed, qt[d * NR + r].
// While the d loop walks these chunks' K, it prefetches the next chunks' K (pk, the same layout, nk
// of them) and these chunks' V (2 KiB each, needed after the softmax), one touch per row so the
// requests spread over the loop instead of filling the line fill buffers in a burst.
template <class KT, int NR, int NC>
__attribute__((noinline)) void qk_group(const float* qt, const Chunk<KT>* ch, int64_t bs_pad, int hd, float* S,
                                        const Chunk<KT>* pk, int nk) {
  vf acc[NR][NC][NV];
  for (int r = 0; r < NR; ++r)
    for (int c = 0; c < NC; ++c)
      for (int v = 0; v < NV; ++v) acc[r][c][v] = vzero();
  const KT* kp[NC];
  for (int c = 0; c < NC; ++c) kp[c] = ch[c].K;
  constexpr int64_t vrow = kKeyChunk;  // V elements per d step: the chunk (16 x hd) over hd steps
  for (int d = 0; d < hd; ++d) {
    for (int c = 0; c < nk; ++c) __builtin_prefetch(pk[c].K + d * bs_pad, 0, 3);
    for (int c = 0; c < NC; ++c) __builtin_prefetch(ch[c].V + d * vrow, 0, 3);
    vf kv[NC][NV];
    for (int c = 0; c < NC; ++c) {
      for (int v = 0; v < NV; ++v) kv[c][v] = vload(kp[c] + v * W);
      kp[c] += bs_pad;
    }
    for (int r = 0; r < NR; ++r) {
      const vf qb = vset(qt[d * NR + r]);
      for (int c = 0; c < NC; ++c)
        for (int v = 0; v < NV; ++v) acc[r][c][v] = vfma(qb, kv[c][v], acc[r][c][v]);
    }
  }
  if constexpr (kScaled<KT>)
    for (int c = 0; c < NC; ++c)
      for (int v = 0; v < NV; ++v) {
        const vf sc = vload(ch[c].ks + v * W);
        for (int r = 0; r < NR; ++r) acc[r][c][v] = vmul(acc[r][c][v], sc);
      }
  for (int r = 0; r < NR; ++r)
    for (int c = 0; c < NC; ++c)
      for (int v = 0; v < NV; ++v) vstore(S + r * kSStride + c * kKeyChunk + v * W, acc[r][c][v]);
}

// o[r][d0 .. d0 + NVEC*W) = o * corr[r] + sum over keys of P[r][key] V[key] for NR rows (P rows
// kSStride apart, o rows hd apart) sharing each V load. One FMA chain per element in key order,
// whatever NR; keys a row cannot see have P = 0 exactly and add nothing.
template <class KT, int NR, int NVEC>
SS_INLINE void pv_block(float* o, const float* P, const float* corr, const Chunk<KT>* ch, const int* nk, int n_chunks,
                        int hd, int d0) {
  vf a[NR][NVEC];
  for (int r = 0; r < NR; ++r) {
    const vf c = vset(corr[r]);
    for (int v = 0; v < NVEC; ++v) a[r][v] = vmul(vload(o + r * hd + d0 + v * W), c);
  }
  for (int c = 0; c < n_chunks; ++c) {
    const KT* V = ch[c].V + d0;
    const float* Pc = P + c * kKeyChunk;
    const int n = nk[c];
    for (int i = 0; i < n; ++i) {
      vf x[NVEC];
      for (int v = 0; v < NVEC; ++v) x[v] = vload(V + static_cast<int64_t>(i) * hd + v * W);
      for (int r = 0; r < NR; ++r) {
        const vf p = vset(key_weight(Pc[r * kSStride + i], ch[c], i));
        for (int v = 0; v < NVEC; ++v) a[r][v] = vfma(p, x[v], a[r][v]);
      }
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int v = 0; v < NVEC; ++v) vstore(o + r * hd + d0 + v * W, a[r][v]);
}

// Accumulator budget: NR * NVEC vectors (16 on AVX-512, 8 on AVX2).
template <class KT, int NR>
__attribute__((noinline)) void pv_rows(float* o, const float* P, const float* corr, const Chunk<KT>* ch, const int* nk,
                                       int n_chunks, int hd) {
  constexpr int kAcc = W == 16 ? 16 : 8;
  constexpr int NVEC = kAcc / NR >= 4 ? 4 : kAcc / NR >= 2 ? 2 : 1;
  int d = 0;
  for (; d + NVEC * W <= hd; d += NVEC * W) pv_block<KT, NR, NVEC>(o, P, corr, ch, nk, n_chunks, hd, d);
  for (; d + W <= hd; d += W) pv_block<KT, NR, 1>(o, P, corr, ch, nk, n_chunks, hd, d);
  for (; d < hd; ++d)  // only when hd % W != 0
    for (int r = 0; r < NR; ++r) {
      float a = o[r * hd + d] * corr[r];
      for (int c = 0; c < n_chunks; ++c)
        for (int i = 0; i < nk[c]; ++i)
          a += key_weight(P[r * kSStride + c * kKeyChunk + i], ch[c], i) *
               vload_scalar(ch[c].V + static_cast<int64_t>(i) * hd + d);
      o[r * hd + d] = a;
    }
}

// Key chunk i (of the whole context) of KV head g.
template <class KT>
SS_INLINE Chunk<KT> make_chunk(const AttnLayer& L, const int32_t* table, int i, int g) {
  const int cpb = L.bs_pad / kKeyChunk, bs = L.block_size;
  const int j = i / cpb, c0 = (i % cpb) * kKeyChunk;
  const int64_t base = static_cast<int64_t>(table[j]) * L.block_stride;
  const int64_t head = static_cast<int64_t>(g) * L.head_dim * L.bs_pad;  // K's [hd][bs_pad], V's [bs_pad][hd]
  Chunk<KT> ch{static_cast<const KT*>(L.k_cache) + base + head + c0,
               static_cast<const KT*>(L.v_cache) + base + head + static_cast<int64_t>(c0) * L.head_dim,
               j * bs + c0, bs - c0 < kKeyChunk ? bs - c0 : kKeyChunk, nullptr, nullptr};
  if constexpr (kScaled<KT>) {
    const int64_t sc = L.scale_offset / static_cast<int64_t>(sizeof(float)) + static_cast<int64_t>(g) * L.bs_pad + c0;
    ch.ks = reinterpret_cast<const float*>(static_cast<const KT*>(L.k_cache) + base) + sc;
    ch.vs = reinterpret_cast<const float*>(static_cast<const KT*>(L.v_cache) + base) + sc;
  }
  return ch;
}

// One row's softmax pass over its scores Sr (n_chunks chunks; keys past `pos` masked to -inf): the
// running max m and sum l are updated, Sr becomes exp(S - max), and the factor for the row's O so
// far is returned. Every micro-tile calls exactly this per row, which keeps their rows bit-identical.
template <class KT>
SS_INLINE float softmax_row_pass(float* Sr, int pos, const Chunk<KT>* ch, int n_chunks, float& m, float& l) {
  vf mx = vset(kNegInf);
  for (int c = 0; c < n_chunks; ++c) {
    float* sc = Sr + c * kKeyChunk;
    for (int i = visible_keys(pos, ch[c]); i < kKeyChunk; ++i) sc[i] = kNegInf;
    for (int v = 0; v < NV; ++v) mx = vmax(mx, vload(sc + v * W));
  }
  const float m_pass = vhmax(mx);
  const float m_new = m > m_pass ? m : m_pass;
  const float corr = m == kNegInf ? 0.0f : m_new != m ? std::exp(m - m_new) : 1.0f;
  const vf mv = vset(m_new);
  vf sum = vzero();
  for (int c = 0; c < n_chunks; ++c)
    for (int v = 0; v < NV; ++v) {
      float* sp = Sr + c * kKeyChunk + v * W;
      const vf e = vexp(vsub(vload(sp), mv));
      vstore(sp, e);
      sum = vadd(sum, e);
    }
  l = l * corr + vhsum(sum);
  m = m_new;
  return corr;
}

// O rows /= their softmax sums.
SS_INLINE void normalize_rows(float* O, const float* l, int nr, int hd) {
  for (int r = 0; r < nr; ++r) {
    float* o = O + static_cast<int64_t>(r) * hd;
    const vf vi = vset(1.0f / l[r]);
    int d = 0;
    for (; d + W <= hd; d += W) vstore(o + d, vmul(vload(o + d), vi));
    for (; d < hd; ++d) o[d] = o[d] * (1.0f / l[r]);
  }
}

// Rows r0 .. r0+nr (nr <= kRows) of one head; q/pos indexed by row; O/Msc/Lsc per row in scratch.
template <class KT, int NR, int NC>
void attend_microtile(const AttnLayer& L, const int32_t* table, const float* const* q, const int32_t* pos, int nr,
                      int g, float* scratch) {
  const int hd = L.head_dim, bs = L.block_size;
  const int cpb = L.bs_pad / kKeyChunk;  // chunks per block
  float* S = scratch;                                  // [kRows][kSStride]
  float* O = S + static_cast<int64_t>(kRows) * kSStride;  // [kRows][hd], then q transposed [hd][kRows]
  float m[kRows], l[kRows];
  int last_chunk[kRows];
  int last = 0;
  for (int r = 0; r < nr; ++r) {
    m[r] = kNegInf;
    l[r] = 0.0f;
    last_chunk[r] = (pos[r] / bs) * cpb + (pos[r] % bs) / kKeyChunk;
    last = last_chunk[r] > last ? last_chunk[r] : last;
  }
  std::memset(O, 0, sizeof(float) * static_cast<size_t>(NR) * hd);
  float* qt = O + static_cast<int64_t>(kRows) * hd;  // [hd][NR]; padding rows repeat row 0 (discarded)
  for (int d = 0; d < hd; ++d)
    for (int r = 0; r < NR; ++r) qt[d * NR + r] = q[r < nr ? r : 0][d];

  Chunk<KT> ch[kPassChunks];
  int nk[kPassChunks];
  for (int p0 = 0; p0 <= last; p0 += kPassChunks) {
    const int n_chunks = last + 1 - p0 < kPassChunks ? last + 1 - p0 : kPassChunks;
    for (int c = 0; c < n_chunks; ++c) ch[c] = make_chunk<KT>(L, table, p0 + c, g);
    // 1. scores, NC chunks per pass over K (the tail one chunk at a time). A decode step reads each
    // chunk once, from DRAM, in 2 KiB pieces too short for the hardware prefetcher: while NC chunks
    // compute, the next NC chunks' K and these chunks' V (needed after the softmax) are prefetched.
    const int rows_per_line = static_cast<int>(64 / (L.bs_pad * sizeof(KT)));  // K rows of d per cache line
    const int d_step = rows_per_line > 1 ? rows_per_line : 1;
    for (int c = 0; c < kPfGroups * NC && c < n_chunks; ++c)
      for (int d = 0; d < hd; d += d_step) __builtin_prefetch(ch[c].K + d * L.bs_pad, 0, 3);  // each line
    for (int c = 0; c < n_chunks; c += NC) {
      const int p0 = c + kPfGroups * NC;  // the chunks whose K this call prefetches
      const int nk = p0 >= n_chunks ? 0 : n_chunks - p0 < NC ? n_chunks - p0 : NC;
      if (c + NC <= n_chunks) {
        qk_group<KT, NR, NC>(qt, ch + c, L.bs_pad, hd, S + c * kKeyChunk, ch + p0, nk);
      } else {
        for (int cc = c; cc < n_chunks; ++cc) qk_group<KT, NR, 1>(qt, ch + cc, L.bs_pad, hd, S + cc * kKeyChunk, ch, 0);
      }
    }
    // 2-3. mask, max, exp, sum: per row.
    float corr[kRows];
    for (int r = nr; r < NR; ++r)  // padding rows: P = 0
      std::memset(S + static_cast<int64_t>(r) * kSStride, 0, sizeof(float) * n_chunks * kKeyChunk);
    for (int r = 0; r < nr; ++r)
      corr[r] = softmax_row_pass(S + static_cast<int64_t>(r) * kSStride, pos[r], ch, n_chunks, m[r], l[r]);
    // 4. O = O * corr + P V, all rows sharing each V load; per chunk, the slots any row can see.
    for (int c = 0; c < n_chunks; ++c) {
      int n = 0;
      for (int r = 0; r < nr; ++r) {
        const int valid = visible_keys(pos[r], ch[c]);
        n = valid > n ? valid : n;
      }
      nk[c] = n;
    }
    for (int r = nr; r < NR; ++r) corr[r] = 0.0f;  // padding rows: O rows beyond nr are scratch
    pv_rows<KT, NR>(O, S, corr, ch, nk, n_chunks, hd);
  }
  normalize_rows(O, l, nr, hd);  // back into O; the caller copies the rows out
}

// The micro-tile instance for nr rows: fewer rows trade rows for chunks per K pass.
template <class KT>
void attend_rows(const AttnLayer& L, const int32_t* table, const float* const* q, const int32_t* pos, int nr, int g,
                 float* scratch) {
  if (nr == 1)
    attend_microtile<KT, 1, kRows>(L, table, q, pos, nr, g, scratch);
  else if (nr == 2)
    attend_microtile<KT, 2, kRows / 2>(L, table, q, pos, nr, g, scratch);
  else if (nr == 3)  // a decode row's GQA group of 3 heads (SmolLM2, Llama-3 8B...): no padding row
    attend_microtile<KT, 3, kRows == 8 ? 3 : 1>(L, table, q, pos, nr, g, scratch);
  else if (nr <= 4)
    attend_microtile<KT, 4, kRows / 4>(L, table, q, pos, nr, g, scratch);
  else
    attend_microtile<KT, kRows, 1>(L, table, q, pos, nr, g, scratch);
}

template <class KT>
void attention_typed(const AttnLayer& L, const int32_t* rows, int n_rows, int head, const int32_t* table,
                     float* scratch) {
  const int hd = L.head_dim;
  const int g = head / L.n_rep;
  float* O = scratch + static_cast<int64_t>(kRows) * kSStride;
  static_assert(kRows == 8 || kRows == 4);
  for (int r0 = 0; r0 < n_rows; r0 += kRows) {
    const int nr = n_rows - r0 < kRows ? n_rows - r0 : kRows;
    const float* q[kRows];
    int32_t pos[kRows];
    for (int r = 0; r < nr; ++r) {
      q[r] = L.q + rows[r0 + r] * L.q_stride + static_cast<int64_t>(head) * hd;
      pos[r] = L.positions[rows[r0 + r]];
    }
    attend_rows<KT>(L, table, q, pos, nr, g, scratch);
    for (int r = 0; r < nr; ++r)
      std::memcpy(L.out + rows[r0 + r] * L.out_stride + static_cast<int64_t>(head) * hd,
                  O + static_cast<int64_t>(r) * hd, sizeof(float) * hd);
  }
}

template <class KT>
void attention_group_typed(const AttnLayer& L, int32_t row, int head0, int n_heads, const int32_t* table,
                           float* scratch) {
  const int hd = L.head_dim;
  const int g = head0 / L.n_rep;
  float* O = scratch + static_cast<int64_t>(kRows) * kSStride;
  for (int h0 = 0; h0 < n_heads; h0 += kRows) {
    const int nr = n_heads - h0 < kRows ? n_heads - h0 : kRows;
    const float* q[kRows];
    int32_t pos[kRows];
    for (int r = 0; r < nr; ++r) {
      q[r] = L.q + row * L.q_stride + static_cast<int64_t>(head0 + h0 + r) * hd;
      pos[r] = L.positions[row];
    }
    attend_rows<KT>(L, table, q, pos, nr, g, scratch);
    for (int r = 0; r < nr; ++r)
      std::memcpy(L.out + row * L.out_stride + static_cast<int64_t>(head0 + h0 + r) * hd,
                  O + static_cast<int64_t>(r) * hd, sizeof(float) * hd);
  }
}

// ---- one decode token, G GQA groups at once (AVX-512: a key chunk is one vector) --------------------
// Rows g * R + r (query head (g0 + g) * R + r) attend to KV head g0 + g. Every row's arithmetic is that
// of attend_microtile for its group alone: scores as one FMA chain over d, the same mask / max / exp /
// sum per row, O as one FMA chain per element in key order. Only the order of memory reads differs:
// per chunk, the G heads' K back to back (they are adjacent in a block), and in the P V pass the G
// heads' V of each key back to back.
// Prefetches, spread over d: the K of the G heads of the nk chunks at pk[0] (group 0's chunks: the G
// heads' K of a chunk is one run of k_lines lines when a block is one chunk) and these chunks' V
// (v_lines). (Passing one chunk pointer and one line count instead measured ~5% slower attention.)
template <class KT, int G, int R, int NC>
__attribute__((noinline)) void qk_multi(const float* qt, const Chunk<KT>* const* ch, int c, int64_t bs_pad, int hd,
                                        float* S, const Chunk<KT>* const* pk, int nk, int k_lines, int v_lines) {
  vf acc[G][R][NC];
  for (int g = 0; g < G; ++g)
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < NC; ++j) acc[g][r][j] = vzero();
  const KT* kp[G][NC];
  for (int g = 0; g < G; ++g)
    for (int j = 0; j < NC; ++j) kp[g][j] = ch[g][c + j].K;
  for (int d = 0; d < hd; ++d) {
    const int k0 = d * k_lines / hd, k1 = (d + 1) * k_lines / hd;
    for (int j = 0; j < nk; ++j)
      for (int i = k0; i < k1; ++i)
        __builtin_prefetch(reinterpret_cast<const char*>(pk[0][j].K) + i * 64, 0, kTokenPfLocality);
    const int v0 = d * v_lines / hd, v1 = (d + 1) * v_lines / hd;
    for (int j = 0; j < NC; ++j)
      for (int i = v0; i < v1; ++i)
        __builtin_prefetch(reinterpret_cast<const char*>(ch[0][c + j].V) + i * 64, 0, kTokenPfLocality);
    for (int g = 0; g < G; ++g)
      for (int j = 0; j < NC; ++j) {
        const vf kv = vload(kp[g][j]);
        kp[g][j] += bs_pad;
        for (int r = 0; r < R; ++r) acc[g][r][j] = vfma(vset(qt[(g * hd + d) * R + r]), kv, acc[g][r][j]);
      }
  }
  if constexpr (kScaled<KT>)
    for (int g = 0; g < G; ++g)
      for (int j = 0; j < NC; ++j) {
        const vf sc = vload(ch[g][c + j].ks);
        for (int r = 0; r < R; ++r) acc[g][r][j] = vmul(acc[g][r][j], sc);
      }
  for (int g = 0; g < G; ++g)
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < NC; ++j) vstore(S + (g * R + r) * kSStride + (c + j) * kKeyChunk, acc[g][r][j]);
}

template <class KT, int G, int R, int NVEC>
SS_INLINE void pv_multi_block(float* o, const float* P, const float* corr, const Chunk<KT>* const* ch, const int* nk,
                              int n_chunks, int hd, int d0) {
  vf a[G][R][NVEC];
  for (int g = 0; g < G; ++g)
    for (int r = 0; r < R; ++r) {
      const vf cr = vset(corr[g * R + r]);
      for (int v = 0; v < NVEC; ++v) a[g][r][v] = vmul(vload(o + (g * R + r) * hd + d0 + v * W), cr);
    }
  for (int c = 0; c < n_chunks; ++c) {
    const int n = nk[c];
    for (int i = 0; i < n; ++i)
      for (int g = 0; g < G; ++g) {
        const KT* V = ch[g][c].V + static_cast<int64_t>(i) * hd + d0;
        vf x[NVEC];
        for (int v = 0; v < NVEC; ++v) x[v] = vload(V + v * W);
        for (int r = 0; r < R; ++r) {
          const vf p = vset(key_weight(P[(g * R + r) * kSStride + c * kKeyChunk + i], ch[g][c], i));
          for (int v = 0; v < NVEC; ++v) a[g][r][v] = vfma(p, x[v], a[g][r][v]);
        }
      }
  }
  for (int g = 0; g < G; ++g)
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < NVEC; ++v) vstore(o + (g * R + r) * hd + d0 + v * W, a[g][r][v]);
}

template <class KT, int G, int R>
__attribute__((noinline)) void pv_multi(float* o, const float* P, const float* corr, const Chunk<KT>* const* ch,
                                        const int* nk, int n_chunks, int hd) {
  constexpr int NVEC = G * R * 2 <= 24 ? 2 : 1;  // accumulators: G * R * NVEC of 32 registers
  int d = 0;
  for (; d + NVEC * W <= hd; d += NVEC * W) pv_multi_block<KT, G, R, NVEC>(o, P, corr, ch, nk, n_chunks, hd, d);
  for (; d + W <= hd; d += W) pv_multi_block<KT, G, R, 1>(o, P, corr, ch, nk, n_chunks, hd, d);
}

// Rows of G groups of one token at position pos; q[g * R + r]; O rows in scratch as attend_microtile.
template <class KT, int G, int R>
void attend_token_multi(const AttnLayer& L, const int32_t* table, const float* const* q, int pos, int g0,
                        float* scratch) {
  constexpr int NR = G * R, NC = 2;
  const int hd = L.head_dim, bs = L.block_size;
  const int cpb = L.bs_pad / kKeyChunk;
  float* S = scratch;                                   // [NR][kSStride]
  float* O = S + static_cast<int64_t>(kMultiRows) * kSStride;  // [NR][hd], then q transposed [G][hd][R]
  float* qt = O + static_cast<int64_t>(kMultiRows) * hd;
  float m[NR], l[NR];
  for (int r = 0; r < NR; ++r) {
    m[r] = kNegInf;
    l[r] = 0.0f;
  }
  const int last = (pos / bs) * cpb + (pos % bs) / kKeyChunk;
  std::memset(O, 0, sizeof(float) * static_cast<size_t>(NR) * hd);
  for (int g = 0; g < G; ++g)
    for (int d = 0; d < hd; ++d)
      for (int r = 0; r < R; ++r) qt[(g * hd + d) * R + r] = q[g * R + r][d];
  // K (and V) lines of the G heads of one chunk: contiguous when a block is one chunk.
  const int lines = cpb == 1 ? static_cast<int>(G * hd * kKeyChunk * sizeof(KT) / 64) : 0;
  Chunk<KT> chs[G][kPassChunks];
  const Chunk<KT>* ch[G];
  for (int g = 0; g < G; ++g) ch[g] = chs[g];
  int nk[kPassChunks];
  for (int p0 = 0; p0 <= last; p0 += kPassChunks) {
    const int n_chunks = last + 1 - p0 < kPassChunks ? last + 1 - p0 : kPassChunks;
    for (int c = 0; c < n_chunks; ++c)
      for (int g = 0; g < G; ++g)
        chs[g][c] = make_chunk<KT>(L, table, p0 + c, g0 + g);
    // 1. scores, NC chunks per call (the tail one at a time), prefetching the next NC chunks' K.
    for (int c = 0; c < NC && c < n_chunks; ++c)
      for (int i = 0; i < lines; ++i)
        __builtin_prefetch(reinterpret_cast<const char*>(ch[0][c].K) + i * 64, 0, kTokenPfLocality);
    for (int c = 0; c < n_chunks; c += NC) {
      const int p1 = c + NC;
      const int n_ahead = p1 >= n_chunks ? 0 : n_chunks - p1 < NC ? n_chunks - p1 : NC;
      const Chunk<KT>* ahead[G];
      for (int g = 0; g < G; ++g) ahead[g] = ch[g] + (p1 < n_chunks ? p1 : 0);
      if (c + NC <= n_chunks) {
        qk_multi<KT, G, R, NC>(qt, ch, c, L.bs_pad, hd, S, ahead, lines ? n_ahead : 0, lines, lines);
      } else {
        for (int cc = c; cc < n_chunks; ++cc)
          qk_multi<KT, G, R, 1>(qt, ch, cc, L.bs_pad, hd, S, ahead, 0, lines, lines);
      }
    }
    // 2-3. mask, max, exp, sum: per row (all rows share the position).
    float corr[NR];
    for (int r = 0; r < NR; ++r)
      corr[r] = softmax_row_pass(S + static_cast<int64_t>(r) * kSStride, pos, ch[0], n_chunks, m[r], l[r]);
    // 4. O = O * corr + P V over the slots the row can see.
    for (int c = 0; c < n_chunks; ++c) nk[c] = visible_keys(pos, ch[0][c]);
    pv_multi<KT, G, R>(O, S, corr, ch, nk, n_chunks, hd);
  }
  normalize_rows(O, l, NR, hd);
}

template <class KT, int G, int R>
void token_groups(const AttnLayer& L, int32_t row, const int32_t* table, float* scratch, int g0) {
  const int hd = L.head_dim;
  const float* q[G * R];
  for (int g = 0; g < G; ++g)
    for (int r = 0; r < R; ++r) q[g * R + r] = L.q + row * L.q_stride + static_cast<int64_t>((g0 + g) * R + r) * hd;
  attend_token_multi<KT, G, R>(L, table, q, L.positions[row], g0, scratch);
  const float* O = scratch + static_cast<int64_t>(kMultiRows) * kSStride;
  for (int g = 0; g < G; ++g)
    for (int r = 0; r < R; ++r)
      std::memcpy(L.out + row * L.out_stride + static_cast<int64_t>((g0 + g) * R + r) * hd,
                  O + static_cast<int64_t>(g * R + r) * hd, sizeof(float) * hd);
}

template <class KT>
void attention_token_typed(const AttnLayer& L, int32_t row, const int32_t* table, float* scratch) {
  int g = 0;
  if constexpr (W == 16 && kKeyChunk == 16) {
    if (L.head_dim % W == 0) {
      if (L.n_rep == 3)
        for (; g + 3 <= L.n_kv; g += 3) token_groups<KT, 3, 3>(L, row, table, scratch, g);
      else if (L.n_rep == 4)
        for (; g + 2 <= L.n_kv; g += 2) token_groups<KT, 2, 4>(L, row, table, scratch, g);
      else if (L.n_rep == 2)
        for (; g + 4 <= L.n_kv; g += 4) token_groups<KT, 4, 2>(L, row, table, scratch, g);
    }
  }
  for (; g < L.n_kv; ++g) attention_group_typed<KT>(L, row, g * L.n_rep, L.n_rep, table, scratch);
}

// f(KT{}) for the cache's element type.
template <class F>
SS_INLINE void with_kv_type(KvElem e, F&& f) {
  switch (e) {
    case KvElem::F16: return f(uint16_t{});
    case KvElem::Q8: return f(int8_t{});
    case KvElem::F32: return f(float{});
  }
}

void attention_token_impl(const AttnLayer& L, int32_t row, const int32_t* table, float* scratch) {
  with_kv_type(L.kv_elem, [&](auto kt) { attention_token_typed<decltype(kt)>(L, row, table, scratch); });
}

void attention_group_impl(const AttnLayer& L, int32_t row, int head0, int n_heads, const int32_t* table,
                          float* scratch) {
  with_kv_type(L.kv_elem,
               [&](auto kt) { attention_group_typed<decltype(kt)>(L, row, head0, n_heads, table, scratch); });
}

void attention_impl(const AttnLayer& L, const int32_t* rows, int n_rows, int head, const int32_t* table,
                    float* scratch) {
  with_kv_type(L.kv_elem, [&](auto kt) { attention_typed<decltype(kt)>(L, rows, n_rows, head, table, scratch); });
}

// One head's hd values as Q8 (cpu_ops.h's KvElem rule), element i at dst[i * step]; returns the scale.
// Plain scalar code, the same on every ISA (the cache is written once per token: not hot).
inline float quantize_head_q8(const float* x, int hd, int8_t* dst, int64_t step) {
  float amax = 0.0f;
  bool finite = true;
  for (int i = 0; i < hd; ++i) {
    const float a = std::fabs(x[i]);
    finite = finite && a <= std::numeric_limits<float>::max();
    amax = a > amax ? a : amax;
  }
  if (!finite) {
    for (int i = 0; i < hd; ++i) dst[i * step] = 0;
    return std::numeric_limits<float>::quiet_NaN();
  }
  const float scale = amax / 127.0f;
  const float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
  for (int i = 0; i < hd; ++i) {
    float y = std::nearbyint(x[i] * inv);
    y = y > 127.0f ? 127.0f : y < -127.0f ? -127.0f : y;
    dst[i * step] = static_cast<int8_t>(y);
  }
  return scale;
}

// One token's K (n_kv heads of hd, contiguous) into its slot of the transposed block layout, and V.
void store_kv_impl(const float* k, const float* v, void* k_block, void* v_block, int n_kv, int hd, int64_t bs_pad,
                   int slot, KvElem elem, int64_t scale_offset) {
  for (int g = 0; g < n_kv; ++g) {
    const float* ks = k + static_cast<int64_t>(g) * hd;
    const float* vs = v + static_cast<int64_t>(g) * hd;
    const int64_t kofs = static_cast<int64_t>(g) * hd * bs_pad + slot;
    const int64_t vofs = (static_cast<int64_t>(g) * bs_pad + slot) * hd;
    if (elem == KvElem::Q8) {
      const int64_t sofs = static_cast<int64_t>(g) * bs_pad + slot;
      reinterpret_cast<float*>(static_cast<char*>(k_block) + scale_offset)[sofs] =
          quantize_head_q8(ks, hd, static_cast<int8_t*>(k_block) + kofs, bs_pad);
      reinterpret_cast<float*>(static_cast<char*>(v_block) + scale_offset)[sofs] =
          quantize_head_q8(vs, hd, static_cast<int8_t*>(v_block) + vofs, 1);
    } else if (elem == KvElem::F16) {
      uint16_t* kd = static_cast<uint16_t*>(k_block) + kofs;
      alignas(64) uint16_t tmp[16];
      for (int d0 = 0; d0 < hd; d0 += 16) {
        const int n = hd - d0 < 16 ? hd - d0 : 16;
        store_f16(tmp, ks + d0, n < W ? n : W);
        if (W < 16)
          for (int d1 = W; d1 < n; d1 += W) store_f16(tmp + d1, ks + d0 + d1, n - d1 < W ? n - d1 : W);
        for (int i = 0; i < n; ++i) kd[(d0 + i) * bs_pad] = tmp[i];
      }
      uint16_t* vd = static_cast<uint16_t*>(v_block) + vofs;
      for (int d0 = 0; d0 < hd; d0 += W) store_f16(vd + d0, vs + d0, hd - d0 < W ? hd - d0 : W);
    } else {
      float* kd = static_cast<float*>(k_block) + kofs;
      for (int d = 0; d < hd; ++d) kd[d * bs_pad] = ks[d];
      std::memcpy(static_cast<float*>(v_block) + vofs, vs, sizeof(float) * hd);
    }
  }
}

// ---- sampling weights ----------------------------------------------------------------------------
// Eight double chains over one block: chain j adds the values at block offsets j, j + 8, j + 16, ...
// in order, then a fixed pairing. AVX-512 holds the chains in one vector (a 16-float vector is lanes
// 0-7 then 8-15: two adds, in offset order), AVX2 in two, scalar in an array: the same adds in the
// same order on every ISA, so the same bits.
struct DSum8 {
#if defined(__AVX512F__)
  __m512d a = _mm512_setzero_pd();
  SS_INLINE void add(vf x) {  // 16 values at an offset that is a multiple of 16
    a = _mm512_add_pd(a, _mm512_cvtps_pd(_mm512_castps512_ps256(x)));
    a = _mm512_add_pd(a, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1))));
  }
  SS_INLINE void spill(double* c) const { _mm512_storeu_pd(c, a); }
#elif defined(__AVX2__) && defined(__FMA__)
  __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd();
  SS_INLINE void add(vf x) {  // 8 values at an offset that is a multiple of 8
    a0 = _mm256_add_pd(a0, _mm256_cvtps_pd(_mm256_castps256_ps128(x)));
    a1 = _mm256_add_pd(a1, _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1)));
  }
  SS_INLINE void spill(double* c) const {
    _mm256_storeu_pd(c, a0);
    _mm256_storeu_pd(c + 4, a1);
  }
#else  // the scalar path sums every value in the tail loop
  SS_INLINE void add(vf) {}
  SS_INLINE void spill(double* c) const {
    for (int j = 0; j < 8; ++j) c[j] = 0.0;
  }
#endif
};

void exp_weights_impl(const float* x, int n, float scale, float shift, float* w, double* block_sums) {
  static_assert(kSampleBlock % 16 == 0, "vector chains start at block offsets that are multiples of W");
  const vf vs = vset(scale), vsh = vset(shift);
  for (int b0 = 0, j = 0; b0 < n; b0 += kSampleBlock, ++j) {
    const int e = n - b0 < kSampleBlock ? n : b0 + kSampleBlock;
    int i = b0;
    DSum8 acc;
    // x * scale - shift as one explicit fma on every path: GCC contracts a*b-c into an fma only in
    // files built with -mfma, so the plain expression would round differently per ISA.
    if constexpr (W > 1)  // (the scalar build's vfma is a*b+c, two roundings: it takes the tail loop)
      for (; i + W <= e; i += W) {
        const vf v = vexp(vfma(vload(x + i), vs, vsub(vzero(), vsh)));
        vstore(w + i, v);
        acc.add(v);
      }
    double c[8];
    acc.spill(c);
    for (; i < e; ++i) {
      w[i] = exp_poly(std::fma(x[i], scale, -shift));
      c[(i - b0) & 7] += static_cast<double>(w[i]);
    }
    block_sums[j] = ((c[0] + c[1]) + (c[2] + c[3])) + ((c[4] + c[5]) + (c[6] + c[7]));
  }
}

float max_value_impl(const float* x, int n) {
  vf m = vset(x[0]);
  int i = 0;
  for (; i + W <= n; i += W) m = vmax(m, vload(x + i));
  float r = vhmax(m);
  for (; i < n; ++i) r = x[i] > r ? x[i] : r;
  return r;
}

OpsTable make_table(const char* name) {
  return OpsTable{name,           rmsnorm_impl,        add_rmsnorm_impl, add_impl,         silu_mul_impl,
                  rope_impl,      attention_impl,      attention_group_impl, attention_token_impl, store_kv_impl,
                  exp_weights_impl, max_value_impl};
}

}  // namespace
}  // namespace ss::cpu::ops
