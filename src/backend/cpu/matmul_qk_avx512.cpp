// K types (Q2_K..Q6_K, IQ4_XS: 256-value super-blocks with 16/32-value sub-block scales) on AVX-512.
// A super-block is unpacked once to bytes and reused for every token. Per token: vpmaddubsw makes
// pairwise 16-bit products, vpdpwssd multiplies them by the sub-block scales into 32-bit lanes, one
// horizontal sum gives the super-block's integer; the big blocks amortize that sum. One kernel
// serves every n_tok, so batch invariance is immediate; y carries each (t, o) accumulator between
// super-blocks (exact float round trip).
#include <immintrin.h>

#include "backend/cpu/kernels_internal.h"

namespace ss::cpu::detail::avx512 {

namespace {

using model::DType;

inline float fmadd(float a, float b, float c) {
  return _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(a), _mm_set_ss(b), _mm_set_ss(c)));
}

inline int32_t hsum256(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(s);
}

// A super-block ready for the dot: 256 unsigned values as 4 x 64 bytes in element order, the scale of
// each value pair as int16 (same order), and what the offset term needs.
// The i-quants' levels are signed: q holds |w| and neg the lanes where w < 0 (the activation byte is
// negated there, so vpmaddubsw stays unsigned x signed; |w|, |a| <= 127 keep the pairs in int16).
struct Super {
  __m512i q[4];
  __m512i scale[4];
  __m256i off_scale;  // per 16-value group, multiplies the activation sums
  __mmask64 neg[4];
  float d, dmin;
};

// How a type's integer dot becomes a float (kernels_internal.h): Min: d*I - dmin*off (Q2_K, Q4_K, Q5_K);
// Offset: d*(I - off) (Q3_K, Q6_K); Signed: d*I with negated activation lanes (IQ4_XS).
enum class Form { Min, Offset, Signed };
template <DType T>
constexpr Form kForm = T == DType::Q3_K || T == DType::Q6_K ? Form::Offset
                       : T == DType::IQ4_XS                ? Form::Signed
                                                           : Form::Min;
template <DType T>
constexpr int kBytes = T == DType::Q2_K ? 84 : T == DType::Q3_K ? 110 : T == DType::Q4_K ? 144
                     : T == DType::Q5_K ? 176 : T == DType::Q6_K ? 210 : 136;

// Scale index of value pair p (0..31) of vector c: sub-block (64c + 2p) / span.
struct PairIndex {
  alignas(64) int16_t v[2][4][32];  // [span 16, span 32][c][p]
  constexpr PairIndex() : v{} {
    for (int s = 0; s < 2; ++s)
      for (int c = 0; c < 4; ++c)
        for (int p = 0; p < 32; ++p) v[s][c][p] = static_cast<int16_t>((64 * c + 2 * p) / (s ? 32 : 16));
  }
};
constexpr PairIndex kPairIndex;

inline __m512i pair_scales(__m256i scales16, int c, int span) {
  return _mm512_permutexvar_epi16(_mm512_load_si512(kPairIndex.v[span == 32][c]), _mm512_castsi256_si512(scales16));
}

// The 12 scale bytes hold eight 6-bit (scale, min) pairs (ggml get_scale_min_k4); returns them as
// 16 int16 [scale 0..7, min 0..7], computed in registers (scalar stores then a vector load would stall).
inline __m256i q4k_scales_mins(const uint8_t* p) {
  constexpr uint32_t m6 = 0x3f3f3f3f, m4 = 0x0f0f0f0f, m2 = 0x03030303;
  const uint32_t a = load_as<uint32_t>(p), b = load_as<uint32_t>(p + 4), c = load_as<uint32_t>(p + 8);
  const uint32_t sc_lo = a & m6, sc_hi = (c & m4) | (((a >> 6) & m2) << 4);
  const uint32_t mn_lo = b & m6, mn_hi = ((c >> 4) & m4) | (((b >> 6) & m2) << 4);
  return _mm256_cvtepu8_epi16(_mm_setr_epi32(static_cast<int>(sc_lo), static_cast<int>(sc_hi),
                                             static_cast<int>(mn_lo), static_cast<int>(mn_hi)));
}

inline void unpack_q4k(const uint8_t* blk, Super& s) {
  const __m256i scl16 = q4k_scales_mins(blk + 4);
  // Activation sums come per 16 values: each min twice.
  const __m256i dup_mins = _mm256_setr_epi16(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);
  s.off_scale = _mm256_permutexvar_epi16(dup_mins, scl16);
  for (int c = 0; c < 4; ++c) {  // bytes 32c..32c+31: low nibbles = sub-block 2c, high = 2c+1
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16 + 32 * c));
    s.q[c] = _mm512_and_si512(_mm512_inserti64x4(_mm512_castsi256_si512(x), _mm256_srli_epi16(x, 4), 1),
                              _mm512_set1_epi8(0x0F));
    s.scale[c] = pair_scales(scl16, c, 32);
  }
  s.d = _cvtsh_ss(load_as<uint16_t>(blk));
  s.dmin = _cvtsh_ss(load_as<uint16_t>(blk + 2));
}

inline void unpack_q6k(const uint8_t* blk, Super& s) {
  const uint8_t* ql = blk;
  const uint8_t* qh = blk + 128;
  const __m256i lo4 = _mm256_set1_epi8(0x0F), hi2 = _mm256_set1_epi8(0x30);
  for (int h = 0; h < 2; ++h) {  // 128 values: quarter r takes a nibble of ql and 2 bits of qh
    const __m256i A = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 64 * h));
    const __m256i B = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 64 * h + 32));
    const __m256i H = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh + 32 * h));
    const __m256i q0 = _mm256_or_si256(_mm256_and_si256(A, lo4), _mm256_and_si256(_mm256_slli_epi16(H, 4), hi2));
    const __m256i q1 = _mm256_or_si256(_mm256_and_si256(B, lo4), _mm256_and_si256(_mm256_slli_epi16(H, 2), hi2));
    const __m256i q2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(A, 4), lo4), _mm256_and_si256(H, hi2));
    const __m256i q3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(B, 4), lo4),
                                       _mm256_and_si256(_mm256_srli_epi16(H, 2), hi2));
    s.q[2 * h] = _mm512_inserti64x4(_mm512_castsi256_si512(q0), q1, 1);
    s.q[2 * h + 1] = _mm512_inserti64x4(_mm512_castsi256_si512(q2), q3, 1);
  }
  const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 192)));
  for (int c = 0; c < 4; ++c) s.scale[c] = pair_scales(sc16, c, 16);
  s.off_scale = _mm256_slli_epi16(sc16, 5);  // values are stored + 32: subtract 32 * sc_j * sum_j
  s.d = _cvtsh_ss(load_as<uint16_t>(blk + 208));
  s.dmin = 0.0f;
}

// A 64-byte vector whose low 32 bytes are lo and high 32 bytes hi.
inline __m512i join(__m256i lo, __m256i hi) { return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1); }
inline __m512i bit_pair(int lo_bit, int hi_bit) {
  return join(_mm256_set1_epi8(static_cast<char>(1 << lo_bit)), _mm256_set1_epi8(static_cast<char>(1 << hi_bit)));
}

// Q5_K: Q4_K plus bit 2c (low half) / 2c+1 (high half) of qh[l] adding 16 to value 64c + l (+ 32).
inline void unpack_q5k(const uint8_t* blk, Super& s) {
  const __m256i scl16 = q4k_scales_mins(blk + 4);
  const __m256i dup_mins = _mm256_setr_epi16(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);
  s.off_scale = _mm256_permutexvar_epi16(dup_mins, scl16);
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16));
  const __m512i H = join(h, h);
  for (int c = 0; c < 4; ++c) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 48 + 32 * c));
    const __m512i lo4 = _mm512_and_si512(join(x, _mm256_srli_epi16(x, 4)), _mm512_set1_epi8(0x0F));
    const __mmask64 hb = _mm512_test_epi8_mask(H, bit_pair(2 * c, 2 * c + 1));
    s.q[c] = _mm512_mask_add_epi8(lo4, hb, lo4, _mm512_set1_epi8(16));
    s.scale[c] = pair_scales(scl16, c, 32);
  }
  s.d = _cvtsh_ss(load_as<uint16_t>(blk));
  s.dmin = _cvtsh_ss(load_as<uint16_t>(blk + 2));
}

// Q2_K / Q3_K low bits: 128 values per 32 bytes Q, value 32j + l = (Q[l] >> 2j) & 3. Vector c holds
// planes 2(c%2) and 2(c%2)+1 of bytes 32(c/2)..
inline __m512i two_bit_planes(const uint8_t* qs, int c) {
  const __m256i Q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * (c / 2)));
  const int j = 2 * (c % 2);
  const __m256i m3 = _mm256_set1_epi8(3);
  return join(_mm256_and_si256(_mm256_srli_epi16(Q, 2 * j), m3), _mm256_and_si256(_mm256_srli_epi16(Q, 2 * j + 2), m3));
}

inline void unpack_q2k(const uint8_t* blk, Super& s) {
  const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk));  // scale | min << 4
  const __m256i sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(sc, _mm_set1_epi8(0x0F)));
  s.off_scale = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc, 4), _mm_set1_epi8(0x0F)));
  for (int c = 0; c < 4; ++c) {
    s.q[c] = two_bit_planes(blk + 16, c);
    s.scale[c] = pair_scales(sc16, c, 16);
  }
  s.d = _cvtsh_ss(load_as<uint16_t>(blk + 80));
  s.dmin = _cvtsh_ss(load_as<uint16_t>(blk + 82));
}

// Q3_K's 16 6-bit scales (ggml's kmask unpacking of 12 bytes) minus 32, as int16.
inline __m256i q3k_scales(const uint8_t* p) {
  constexpr uint32_t k1 = 0x03030303, k2 = 0x0f0f0f0f;
  const uint32_t a0 = load_as<uint32_t>(p), a1 = load_as<uint32_t>(p + 4), t = load_as<uint32_t>(p + 8);
  const uint32_t s0 = (a0 & k2) | ((t & k1) << 4), s1 = (a1 & k2) | (((t >> 2) & k1) << 4);
  const uint32_t s2 = ((a0 >> 4) & k2) | (((t >> 4) & k1) << 4), s3 = ((a1 >> 4) & k2) | (((t >> 6) & k1) << 4);
  const __m128i u = _mm_setr_epi32(static_cast<int>(s0), static_cast<int>(s1), static_cast<int>(s2), static_cast<int>(s3));
  return _mm256_sub_epi16(_mm256_cvtepu8_epi16(u), _mm256_set1_epi16(32));
}

// Q3_K: values stored as u = q + 4h in 0..7 (h: bit 4(c/2) + j of hmask[l]); the dot subtracts 4 * sc * sum.
inline void unpack_q3k(const uint8_t* blk, Super& s) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk));
  const __m512i H = join(h, h);
  const __m256i sc16 = q3k_scales(blk + 96);
  for (int c = 0; c < 4; ++c) {
    const __m512i lo = two_bit_planes(blk + 32, c);
    const int bit = 4 * (c / 2) + 2 * (c % 2);
    const __mmask64 hb = _mm512_test_epi8_mask(H, bit_pair(bit, bit + 1));
    s.q[c] = _mm512_mask_add_epi8(lo, hb, lo, _mm512_set1_epi8(4));
    s.scale[c] = pair_scales(sc16, c, 16);
  }
  s.off_scale = _mm256_slli_epi16(sc16, 2);
  s.d = _cvtsh_ss(load_as<uint16_t>(blk + 108));
  s.dmin = 0.0f;
}

inline __m512i iq4_table() {
  return _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(model::kIq4nlValues)));
}

// IQ4_XS: sub-block ib's 16 bytes at qs + 16 ib give values 32 ib + l (low nibbles) and + 16 (high).
inline void unpack_iq4xs(const uint8_t* blk, Super& s) {
  const uint16_t sh = load_as<uint16_t>(blk + 2);
  const __m128i sl = _mm_cvtsi32_si128(static_cast<int>(load_as<uint32_t>(blk + 4)));
  const __m128i lo = _mm_and_si128(sl, _mm_set1_epi8(0x0F)), hi = _mm_and_si128(_mm_srli_epi16(sl, 4), _mm_set1_epi8(0x0F));
  const __m128i h2 = _mm_and_si128(_mm_srlv_epi16(_mm_set1_epi16(static_cast<int16_t>(sh)), _mm_setr_epi16(0, 2, 4, 6, 8, 10, 12, 14)),
                                   _mm_set1_epi16(3));
  const __m128i ls = _mm_or_si128(_mm_cvtepu8_epi16(_mm_unpacklo_epi8(lo, hi)), _mm_slli_epi16(h2, 4));
  const __m256i sc16 = _mm256_zextsi128_si256(_mm_sub_epi16(ls, _mm_set1_epi16(32)));
  const __m512i table = iq4_table();
  for (int c = 0; c < 4; ++c) {  // sub-blocks 2c, 2c+1
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 8 + 32 * c));
    const __m512i nib = join(_mm256_and_si256(x, _mm256_set1_epi8(0x0F)),
                             _mm256_and_si256(_mm256_srli_epi16(x, 4), _mm256_set1_epi8(0x0F)));
    // [lo(x0..15), lo(x16..31), hi(x0..15), hi(x16..31)] -> element order [lo 0..15, hi 0..15, lo 16.., hi 16..]
    const __m512i idx = _mm512_shuffle_i64x2(nib, nib, _MM_SHUFFLE(3, 1, 2, 0));
    const __m512i w = _mm512_shuffle_epi8(table, idx);
    s.neg[c] = _mm512_movepi8_mask(w);
    s.q[c] = _mm512_abs_epi8(w);
    s.scale[c] = pair_scales(sc16, c, 32);
  }
  s.off_scale = _mm256_setzero_si256();
  s.d = _cvtsh_ss(load_as<uint16_t>(blk));
  s.dmin = 0.0f;
}

template <DType T>
inline void unpack(const uint8_t* blk, Super& s) {
  if constexpr (T == DType::Q2_K) unpack_q2k(blk, s);
  else if constexpr (T == DType::Q3_K) unpack_q3k(blk, s);
  else if constexpr (T == DType::Q4_K) unpack_q4k(blk, s);
  else if constexpr (T == DType::Q5_K) unpack_q5k(blk, s);
  else if constexpr (T == DType::Q6_K) unpack_q6k(blk, s);
  else unpack_iq4xs(blk, s);
}

template <DType T>
void rows_k(const model::Tensor& W, const QActs& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  constexpr int bytes = kBytes<T>;
  constexpr Form form = kForm<T>;
  const int64_t nsb = W.cols() / 256;
  const int64_t rs = static_cast<int64_t>(W.row_stride());
  const auto* base = static_cast<const uint8_t*>(W.data);
  for (int64_t o = r0; o < r1; ++o) {
    for (int64_t sb = 0; sb < nsb; ++sb) {
      const uint8_t* blk = base + o * rs + sb * bytes;
      if (sb + 1 < nsb) _mm_prefetch(reinterpret_cast<const char*>(blk + bytes), _MM_HINT_T0);
      Super s;
      unpack<T>(blk, s);
      for (int t = 0; t < a.n_tok; ++t) {
        const int8_t* at = a.qs + a.qidx(t, 256 * sb);
        __m512i acc = _mm512_setzero_si512();
        for (int c = 0; c < 4; ++c) {
          __m512i av = _mm512_load_si512(at + 64 * c);
          if constexpr (form == Form::Signed) av = _mm512_mask_sub_epi8(av, s.neg[c], _mm512_setzero_si512(), av);
          const __m512i p = _mm512_maddubs_epi16(s.q[c], av);
          acc = _mm512_dpwssd_epi32(acc, p, s.scale[c]);
        }
        const float da = a.d[a.sidx(t, sb)];
        float& out = y[t * ldy + o];
        float v = sb == 0 ? 0.0f : out;
        if constexpr (form == Form::Signed) {
          v = fmadd(s.d * da, static_cast<float>(_mm512_reduce_add_epi32(acc)), v);
        } else {
          const __m256i bs =
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.bsum + t * (a.cols / 16) + 16 * sb));
          const int32_t off = hsum256(_mm256_madd_epi16(s.off_scale, bs));
          if constexpr (form == Form::Min) {
            v = fmadd(s.d * da, static_cast<float>(_mm512_reduce_add_epi32(acc)), v);
            v = fmadd(-(s.dmin * da), static_cast<float>(off), v);
          } else {
            v = fmadd(s.d * da, static_cast<float>(_mm512_reduce_add_epi32(acc) - off), v);
          }
        }
        out = v;
      }
    }
  }
}

}  // namespace

void rows_qk(const model::Tensor& W, const QActs& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  switch (W.type) {
    case DType::Q2_K: return rows_k<DType::Q2_K>(W, a, y, ldy, r0, r1);
    case DType::Q3_K: return rows_k<DType::Q3_K>(W, a, y, ldy, r0, r1);
    case DType::Q4_K: return rows_k<DType::Q4_K>(W, a, y, ldy, r0, r1);
    case DType::Q5_K: return rows_k<DType::Q5_K>(W, a, y, ldy, r0, r1);
    case DType::Q6_K: return rows_k<DType::Q6_K>(W, a, y, ldy, r0, r1);
    case DType::IQ4_XS: return rows_k<DType::IQ4_XS>(W, a, y, ldy, r0, r1);
    default: return;
  }
}

}  // namespace ss::cpu::detail::avx512
