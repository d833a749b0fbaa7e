// K types (Q2_K..Q6_K, IQ4_XS) on AVX2; same scheme as matmul_qk_avx512.cpp with 32-byte vectors:
// vpmaddubsw pairs, vpmaddwd by the sub-block scales, one horizontal sum per super-block and token.
#include <immintrin.h>

#include "backend/cpu/kernels_internal.h"

namespace ss::cpu::detail::avx2 {

namespace {

using model::DType;

inline float fmadd(float a, float b, float c) {
  return _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(a), _mm_set_ss(b), _mm_set_ss(c)));
}

inline int32_t hsum(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(s);
}

// 256 unsigned values as 8 x 32 bytes in element order, each value pair's scale as int16.
// IQ4_XS: q holds |w| and w the signed levels (vpsignb moves w's sign onto the activations).
struct Super {
  __m256i q[8];
  __m256i scale[8];
  __m256i off_scale;  // per 16-value group, multiplies the activation sums
  __m256i w[8];
  float d, dmin;
};

// See matmul_qk_avx512.cpp.
enum class Form { Min, Offset, Signed };
template <DType T>
constexpr Form kForm = T == DType::Q3_K || T == DType::Q6_K ? Form::Offset
                       : T == DType::IQ4_XS                ? Form::Signed
                                                           : Form::Min;
template <DType T>
constexpr int kBytes = T == DType::Q2_K ? 84 : T == DType::Q3_K ? 110 : T == DType::Q4_K ? 144
                     : T == DType::Q5_K ? 176 : T == DType::Q6_K ? 210 : 136;

// Scales of 16-value sub-blocks: vector j (values 32j..32j+31) takes sub-blocks 2j and 2j+1.
inline void scales16(const int16_t* sc, Super& s) {
  for (int j = 0; j < 8; ++j) s.scale[j] = _mm256_setr_m128i(_mm_set1_epi16(sc[2 * j]), _mm_set1_epi16(sc[2 * j + 1]));
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
  const __m256i sm = q4k_scales_mins(blk + 4);
  const __m256i sc2 = _mm256_permute2x128_si256(sm, sm, 0x00);  // the 8 scales in both halves
  for (int j = 0; j < 8; ++j)  // broadcast int16 j
    s.scale[j] = _mm256_shuffle_epi8(sc2, _mm256_set1_epi16(static_cast<int16_t>(0x0100 + 0x0202 * j)));
  // Activation sums come per 16 values: each min twice.
  const __m128i m = _mm256_extracti128_si256(sm, 1);
  s.off_scale = _mm256_setr_m128i(_mm_unpacklo_epi16(m, m), _mm_unpackhi_epi16(m, m));
  for (int c = 0; c < 4; ++c) {  // bytes 32c..32c+31: low nibbles = sub-block 2c, high = 2c+1
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16 + 32 * c));
    s.q[2 * c] = _mm256_and_si256(x, _mm256_set1_epi8(0x0F));
    s.q[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(x, 4), _mm256_set1_epi8(0x0F));
  }
  s.d = _cvtsh_ss(load_as<uint16_t>(blk));
  s.dmin = _cvtsh_ss(load_as<uint16_t>(blk + 2));
}

inline void unpack_q6k(const uint8_t* blk, Super& s) {
  const uint8_t* ql = blk;
  const uint8_t* qh = blk + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(blk + 192);
  const __m256i lo4 = _mm256_set1_epi8(0x0F), hi2 = _mm256_set1_epi8(0x30);
  for (int h = 0; h < 2; ++h) {  // 128 values: quarter r takes a nibble of ql and 2 bits of qh
    const __m256i A = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 64 * h));
    const __m256i B = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 64 * h + 32));
    const __m256i H = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh + 32 * h));
    s.q[4 * h] = _mm256_or_si256(_mm256_and_si256(A, lo4), _mm256_and_si256(_mm256_slli_epi16(H, 4), hi2));
    s.q[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(B, lo4), _mm256_and_si256(_mm256_slli_epi16(H, 2), hi2));
    s.q[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(A, 4), lo4), _mm256_and_si256(H, hi2));
    s.q[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(B, 4), lo4),
                                     _mm256_and_si256(_mm256_srli_epi16(H, 2), hi2));
  }
  for (int j = 0; j < 8; ++j)  // vector j holds sub-blocks 2j and 2j+1 (16 values each)
    s.scale[j] = _mm256_setr_m128i(_mm_set1_epi16(sc[2 * j]), _mm_set1_epi16(sc[2 * j + 1]));
  const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sc)));
  s.off_scale = _mm256_slli_epi16(sc16, 5);  // values are stored + 32: subtract 32 * sc_j * sum_j
  s.d = _cvtsh_ss(load_as<uint16_t>(blk + 208));
  s.dmin = 0.0f;
}

// Q5_K: Q4_K plus bit 2c / 2c+1 of qh[l] adding 16 to value 64c + l / 64c + 32 + l.
inline void unpack_q5k(const uint8_t* blk, Super& s) {
  const __m256i sm = q4k_scales_mins(blk + 4);
  const __m256i sc2 = _mm256_permute2x128_si256(sm, sm, 0x00);
  for (int j = 0; j < 8; ++j)
    s.scale[j] = _mm256_shuffle_epi8(sc2, _mm256_set1_epi16(static_cast<int16_t>(0x0100 + 0x0202 * j)));
  const __m128i m = _mm256_extracti128_si256(sm, 1);
  s.off_scale = _mm256_setr_m128i(_mm_unpacklo_epi16(m, m), _mm_unpackhi_epi16(m, m));
  const __m256i H = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16));
  const __m256i m4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
  for (int c = 0; c < 4; ++c) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 48 + 32 * c));
    const __m256i h0 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(H, 2 * c), one), 4);
    const __m256i h1 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(H, 2 * c + 1), one), 4);
    s.q[2 * c] = _mm256_or_si256(_mm256_and_si256(x, m4), h0);
    s.q[2 * c + 1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(x, 4), m4), h1);
  }
  s.d = _cvtsh_ss(load_as<uint16_t>(blk));
  s.dmin = _cvtsh_ss(load_as<uint16_t>(blk + 2));
}

// Q2_K / Q3_K low bits: vector 4n + j = (Q_n >> 2j) & 3, Q_n the 32 bytes at qs + 32n.
inline __m256i two_bit_plane(const uint8_t* qs, int v) {
  const __m256i Q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * (v / 4)));
  return _mm256_and_si256(_mm256_srli_epi16(Q, 2 * (v % 4)), _mm256_set1_epi8(3));
}

inline void unpack_q2k(const uint8_t* blk, Super& s) {
  int16_t sc[16];
  for (int j = 0; j < 16; ++j) sc[j] = blk[j] & 0xF;
  scales16(sc, s);
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk));
  s.off_scale = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(0x0F)));
  for (int v = 0; v < 8; ++v) s.q[v] = two_bit_plane(blk + 16, v);
  s.d = _cvtsh_ss(load_as<uint16_t>(blk + 80));
  s.dmin = _cvtsh_ss(load_as<uint16_t>(blk + 82));
}

// Q3_K: u = q + 4h in 0..7 (h: bit v of hmask[l] for vector v); the dot subtracts 4 * sc * sum.
inline void unpack_q3k(const uint8_t* blk, Super& s) {
  constexpr uint32_t k1 = 0x03030303, k2 = 0x0f0f0f0f;
  const uint8_t* p = blk + 96;
  const uint32_t a0 = load_as<uint32_t>(p), a1 = load_as<uint32_t>(p + 4), t = load_as<uint32_t>(p + 8);
  const uint32_t u[4] = {(a0 & k2) | ((t & k1) << 4), (a1 & k2) | (((t >> 2) & k1) << 4),
                         ((a0 >> 4) & k2) | (((t >> 4) & k1) << 4), ((a1 >> 4) & k2) | (((t >> 6) & k1) << 4)};
  int16_t sc[16];
  for (int j = 0; j < 16; ++j) sc[j] = static_cast<int16_t>(((u[j / 4] >> (8 * (j % 4))) & 0xFF) - 32);
  scales16(sc, s);
  s.off_scale = _mm256_slli_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sc)), 2);
  const __m256i H = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk));
  for (int v = 0; v < 8; ++v) {
    const __m256i h = _mm256_and_si256(_mm256_srli_epi16(H, v), _mm256_set1_epi8(1));
    s.q[v] = _mm256_or_si256(two_bit_plane(blk + 32, v), _mm256_slli_epi16(h, 2));
  }
  s.d = _cvtsh_ss(load_as<uint16_t>(blk + 108));
  s.dmin = 0.0f;
}

inline __m256i iq4_table() {
  return _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(model::kIq4nlValues)));
}

// 16 bytes of nibbles -> 32 signed levels in element order (low nibbles, then high).
inline __m256i iq4_levels(const uint8_t* q16, __m256i table) {
  const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q16));
  const __m256i nib = _mm256_and_si256(_mm256_setr_m128i(x, _mm_srli_epi16(x, 4)), _mm256_set1_epi8(0x0F));
  return _mm256_shuffle_epi8(table, nib);
}

inline void unpack_iq4xs(const uint8_t* blk, Super& s) {
  const uint16_t sh = load_as<uint16_t>(blk + 2);
  const __m256i table = iq4_table();
  for (int ib = 0; ib < 8; ++ib) {
    const int ls = ((blk[4 + ib / 2] >> 4 * (ib % 2)) & 0xF) | (((sh >> 2 * ib) & 3) << 4);
    s.scale[ib] = _mm256_set1_epi16(static_cast<int16_t>(ls - 32));
    s.w[ib] = iq4_levels(blk + 8 + 16 * ib, table);
    s.q[ib] = _mm256_abs_epi8(s.w[ib]);
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
      Super s;
      unpack<T>(blk, s);
      for (int t = 0; t < a.n_tok; ++t) {
        const int8_t* at = a.qs + a.qidx(t, 256 * sb);
        __m256i acc = _mm256_setzero_si256();
        for (int j = 0; j < 8; ++j) {
          __m256i av = _mm256_load_si256(reinterpret_cast<const __m256i*>(at + 32 * j));
          if constexpr (form == Form::Signed) av = _mm256_sign_epi8(av, s.w[j]);
          const __m256i p = _mm256_maddubs_epi16(s.q[j], av);
          acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, s.scale[j]));
        }
        const float da = a.d[a.sidx(t, sb)];
        float& out = y[t * ldy + o];
        float v = sb == 0 ? 0.0f : out;
        if constexpr (form == Form::Signed) {
          v = fmadd(s.d * da, static_cast<float>(hsum(acc)), v);
        } else {
          const __m256i bs =
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.bsum + t * (a.cols / 16) + 16 * sb));
          const int32_t off = hsum(_mm256_madd_epi16(s.off_scale, bs));
          if constexpr (form == Form::Min) {
            v = fmadd(s.d * da, static_cast<float>(hsum(acc)), v);
            v = fmadd(-(s.dmin * da), static_cast<float>(off), v);
          } else {
            v = fmadd(s.d * da, static_cast<float>(hsum(acc) - off), v);
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

}  // namespace ss::cpu::detail::avx2
