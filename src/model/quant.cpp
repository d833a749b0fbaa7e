// Type table, fp16/bf16 conversions and scalar reference dequantization.
// Block layouts and arithmetic order follow ggml-quants.c dequantize_row_* so results match bit for bit.
#include "model/quant.h"
#include "model/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace ss::model {

namespace {

struct Entry {
  uint32_t id;
  DTypeInfo info;
};

constexpr Entry kTypes[] = {
    {0, {"F32", 1, 4, true}},
    {1, {"F16", 1, 2, true}},
    {2, {"Q4_0", QK4_0, sizeof(block_q4_0), true}},
    {3, {"Q4_1", QK4_1, sizeof(block_q4_1), true}},
    {6, {"Q5_0", QK5_0, sizeof(block_q5_0), true}},
    {7, {"Q5_1", QK5_1, sizeof(block_q5_1), true}},
    {8, {"Q8_0", QK8_0, sizeof(block_q8_0), true}},
    {9, {"Q8_1", QK8_1, sizeof(block_q8_1), false}},
    {10, {"Q2_K", QK_K, sizeof(block_q2_K), true}},
    {11, {"Q3_K", QK_K, sizeof(block_q3_K), true}},
    {12, {"Q4_K", QK_K, sizeof(block_q4_K), true}},
    {13, {"Q5_K", QK_K, sizeof(block_q5_K), true}},
    {14, {"Q6_K", QK_K, sizeof(block_q6_K), true}},
    {15, {"Q8_K", QK_K, sizeof(block_q8_K), false}},
    {20, {"IQ4_NL", QK4_NL, sizeof(block_iq4_nl), true}},
    {23, {"IQ4_XS", QK_K, sizeof(block_iq4_xs), true}},
    {30, {"BF16", 1, 2, true}},
};

uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float bits_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Blocks are read with memcpy: mapped tensor data carries no alignment guarantee beyond 2 bytes.
template <class B>
B load_block(const void* src, int64_t i) {
  B b;
  std::memcpy(&b, static_cast<const uint8_t*>(src) + i * sizeof(B), sizeof(B));
  return b;
}

void deq_q4_0(const void* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += QK4_0) {
    const auto b = load_block<block_q4_0>(src, i);
    const float d = fp16_to_fp32(b.d);
    for (int j = 0; j < QK4_0 / 2; ++j) {
      const int x0 = (b.qs[j] & 0x0F) - 8;
      const int x1 = (b.qs[j] >> 4) - 8;
      y[j] = x0 * d;
      y[j + QK4_0 / 2] = x1 * d;
    }
  }
}

void deq_q4_1(const void* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += QK4_1) {
    const auto b = load_block<block_q4_1>(src, i);
    const float d = fp16_to_fp32(b.d), m = fp16_to_fp32(b.m);
    for (int j = 0; j < QK4_1 / 2; ++j) {
      const int x0 = b.qs[j] & 0x0F;
      const int x1 = b.qs[j] >> 4;
      y[j] = x0 * d + m;
      y[j + QK4_1 / 2] = x1 * d + m;
    }
  }
}

void deq_q5_0(const void* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += QK5_0) {
    const auto b = load_block<block_q5_0>(src, i);
    const float d = fp16_to_fp32(b.d);
    uint32_t qh;
    std::memcpy(&qh, b.qh, 4);
    for (int j = 0; j < QK5_0 / 2; ++j) {
      const uint8_t xh0 = ((qh >> j) << 4) & 0x10;
      const uint8_t xh1 = (qh >> (j + 12)) & 0x10;
      const int x0 = ((b.qs[j] & 0x0F) | xh0) - 16;
      const int x1 = ((b.qs[j] >> 4) | xh1) - 16;
      y[j] = x0 * d;
      y[j + QK5_0 / 2] = x1 * d;
    }
  }
}

void deq_q5_1(const void* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += QK5_1) {
    const auto b = load_block<block_q5_1>(src, i);
    const float d = fp16_to_fp32(b.d), m = fp16_to_fp32(b.m);
    uint32_t qh;
    std::memcpy(&qh, b.qh, 4);
    for (int j = 0; j < QK5_1 / 2; ++j) {
      const uint8_t xh0 = ((qh >> j) << 4) & 0x10;
      const uint8_t xh1 = (qh >> (j + 12)) & 0x10;
      const int x0 = (b.qs[j] & 0x0F) | xh0;
      const int x1 = (b.qs[j] >> 4) | xh1;
      y[j] = x0 * d + m;
      y[j + QK5_1 / 2] = x1 * d + m;
    }
  }
}

void deq_q8_0(const void* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += QK8_0) {
    const auto b = load_block<block_q8_0>(src, i);
    const float d = fp16_to_fp32(b.d);
    for (int j = 0; j < QK8_0; ++j) y[j] = b.qs[j] * d;
  }
}

void deq_q8_1(const void* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += QK8_1) {
    const auto b = load_block<block_q8_1>(src, i);
    for (int j = 0; j < QK8_1; ++j) y[j] = b.qs[j] * b.d;
  }
}

void deq_q8_k(const void* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += QK_K) {
    const auto b = load_block<block_q8_K>(src, i);
    for (int j = 0; j < QK_K; ++j) y[j] = b.qs[j] * b.d;
  }
}

// The 12 scale bytes hold eight 6-bit (scale, min) pairs; see ggml-quants.c get_scale_min_k4.
void scale_min_k4(int j, const uint8_t* q, uint8_t* d, uint8_t* m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

void deq_q4_k(const void* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const auto b = load_block<block_q4_K>(src, i);
    const float d = fp16_to_fp32(b.d), dmin = fp16_to_fp32(b.dmin);
    const uint8_t* q = b.qs;
    for (int j = 0, is = 0; j < QK_K; j += 64, is += 2, q += 32) {
      uint8_t sc, m;
      scale_min_k4(is, b.scales, &sc, &m);
      const float d1 = d * sc, m1 = dmin * m;
      scale_min_k4(is + 1, b.scales, &sc, &m);
      const float d2 = d * sc, m2 = dmin * m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * (q[l] & 0xF) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * (q[l] >> 4) - m2;
    }
  }
}

void deq_q6_k(const void* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const auto b = load_block<block_q6_K>(src, i);
    const float d = fp16_to_fp32(b.d);
    const uint8_t* ql = b.ql;
    const uint8_t* qh = b.qh;
    const int8_t* sc = b.scales;
    for (int n = 0; n < QK_K; n += 128, y += 128, ql += 64, qh += 32, sc += 8) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = static_cast<int8_t>((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = static_cast<int8_t>((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = static_cast<int8_t>((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = static_cast<int8_t>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l + 0] = d * sc[is + 0] * q1;
        y[l + 32] = d * sc[is + 2] * q2;
        y[l + 64] = d * sc[is + 4] * q3;
        y[l + 96] = d * sc[is + 6] * q4;
      }
    }
  }
}

// Q2_K: per 128 values, four 2-bit planes of 32 bytes; plane j, byte l < 16 -> value 32j + l (sub-block
// 2j), byte 16 + l -> value 32j + 16 + l (sub-block 2j + 1).
void deq_q2_k(const void* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const auto b = load_block<block_q2_K>(src, i);
    const float d = fp16_to_fp32(b.d), dmin = fp16_to_fp32(b.dmin);
    const uint8_t* q = b.qs;
    int is = 0;
    for (int n = 0; n < QK_K; n += 128, q += 32)
      for (int shift = 0; shift < 8; shift += 2)
        for (int half = 0; half < 2; ++half) {
          const uint8_t sc = b.scales[is++];
          const float dl = d * (sc & 0xF), ml = dmin * (sc >> 4);
          for (int l = 0; l < 16; ++l) *y++ = dl * ((q[16 * half + l] >> shift) & 3) - ml;
        }
  }
}

// Q3_K's 16 6-bit scales from their 12 bytes (ggml's kmask1/kmask2 unpacking), unsigned 0..63.
void q3k_scales(const uint8_t* s12, uint8_t* out16) {
  uint32_t aux[4];
  std::memcpy(aux, s12, 12);
  constexpr uint32_t kmask1 = 0x03030303, kmask2 = 0x0f0f0f0f;
  const uint32_t tmp = aux[2];
  aux[2] = ((aux[0] >> 4) & kmask2) | (((tmp >> 4) & kmask1) << 4);
  aux[3] = ((aux[1] >> 4) & kmask2) | (((tmp >> 6) & kmask1) << 4);
  aux[0] = (aux[0] & kmask2) | (((tmp >> 0) & kmask1) << 4);
  aux[1] = (aux[1] & kmask2) | (((tmp >> 2) & kmask1) << 4);
  std::memcpy(out16, aux, 16);
}

// Q3_K: Q2_K's plane order; the high bit of value 128n + 32j + l is bit 4n + j of hmask[l].
void deq_q3_k(const void* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const auto b = load_block<block_q3_K>(src, i);
    const float d_all = fp16_to_fp32(b.d);
    uint8_t sc[16];
    q3k_scales(b.scales, sc);
    const uint8_t* q = b.qs;
    int is = 0;
    unsigned m = 1;
    for (int n = 0; n < QK_K; n += 128, q += 32)
      for (int shift = 0; shift < 8; shift += 2, m <<= 1)
        for (int half = 0; half < 2; ++half) {
          const float dl = d_all * (sc[is++] - 32);
          for (int l = 0; l < 16; ++l) {
            const int k = 16 * half + l;
            *y++ = dl * (((q[k] >> shift) & 3) - ((b.hmask[k] & m) ? 0 : 4));
          }
        }
  }
}

void deq_q5_k(const void* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const auto b = load_block<block_q5_K>(src, i);
    const float d = fp16_to_fp32(b.d), dmin = fp16_to_fp32(b.dmin);
    const uint8_t* ql = b.qs;
    unsigned u1 = 1, u2 = 2;
    for (int j = 0, is = 0; j < QK_K; j += 64, is += 2, ql += 32, u1 <<= 2, u2 <<= 2) {
      uint8_t sc, m;
      scale_min_k4(is, b.scales, &sc, &m);
      const float d1 = d * sc, m1 = dmin * m;
      scale_min_k4(is + 1, b.scales, &sc, &m);
      const float d2 = d * sc, m2 = dmin * m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * ((ql[l] & 0xF) + (b.qh[l] & u1 ? 16 : 0)) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * ((ql[l] >> 4) + (b.qh[l] & u2 ? 16 : 0)) - m2;
    }
  }
}

void deq_iq4_nl(const void* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += QK4_NL) {
    const auto b = load_block<block_iq4_nl>(src, i);
    const float d = fp16_to_fp32(b.d);
    for (int j = 0; j < QK4_NL / 2; ++j) {
      y[j] = d * kIq4nlValues[b.qs[j] & 0xF];
      y[j + QK4_NL / 2] = d * kIq4nlValues[b.qs[j] >> 4];
    }
  }
}

void deq_iq4_xs(const void* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const auto b = load_block<block_iq4_xs>(src, i);
    const float d = fp16_to_fp32(b.d);
    const uint8_t* qs = b.qs;
    for (int ib = 0; ib < QK_K / 32; ++ib, y += 32, qs += 16) {
      const int ls = ((b.scales_l[ib / 2] >> 4 * (ib % 2)) & 0xF) | (((b.scales_h >> 2 * ib) & 3) << 4);
      const float dl = d * (ls - 32);
      for (int j = 0; j < 16; ++j) {
        y[j] = dl * kIq4nlValues[qs[j] & 0xF];
        y[j + 16] = dl * kIq4nlValues[qs[j] >> 4];
      }
    }
  }
}

}  // namespace

const DTypeInfo* dtype_info(uint32_t id) {
  for (const auto& e : kTypes)
    if (e.id == id) return &e.info;
  return nullptr;
}

std::string_view dtype_name(DType t) {
  const DTypeInfo* i = dtype_info(static_cast<uint32_t>(t));
  return i ? i->name : std::string_view("?");
}

size_t row_bytes(DType t, int64_t cols) {
  const DTypeInfo* i = dtype_info(static_cast<uint32_t>(t));
  if (!i || cols < 0) return 0;
  return static_cast<size_t>(cols / i->block_size) * static_cast<size_t>(i->block_bytes);
}

float fp16_to_fp32(half_bits h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1F;
  const uint32_t mant = h & 0x3FF;
  if (exp == 0x1F) return bits_f32(sign | 0x7F800000 | (mant << 13));  // inf / nan (payload kept)
  if (exp != 0) return bits_f32(sign | ((exp + 112) << 23) | (mant << 13));
  // Zero or subnormal: mant * 2^-24, exact in float.
  const float v = static_cast<float>(mant) * bits_f32(0x33800000);
  return sign ? -v : v;
}

half_bits fp32_to_fp16(float f) {
  uint32_t x = f32_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000;
  uint32_t ax = x & 0x7FFFFFFF;
  if (ax > 0x7F800000) return static_cast<half_bits>(sign | 0x7E00 | ((ax >> 13) & 0x3FF));  // quiet NaN
  if (ax >= 0x477FF000) return static_cast<half_bits>(sign | 0x7C00);  // >= 65520 rounds to inf
  if (ax < 0x38800000) {
    // Below the smallest normal: adding 0.5 puts the fp16 subnormal step (2^-24) at the float ulp,
    // so the hardware's round-to-nearest-even does the rounding.
    const float t = bits_f32(ax) + 0.5f;
    return static_cast<half_bits>(sign | (f32_bits(t) - 0x3F000000));
  }
  const uint32_t odd = (ax >> 13) & 1;
  ax += 0xC8000FFF + odd;  // rebias exponent (127 -> 15) and round to nearest even
  return static_cast<half_bits>(sign | (ax >> 13));
}

float bf16_to_fp32(uint16_t b) { return bits_f32(static_cast<uint32_t>(b) << 16); }

uint16_t fp32_to_bf16(float f) {
  const uint32_t x = f32_bits(f);
  if ((x & 0x7FFFFFFF) > 0x7F800000) return static_cast<uint16_t>((x >> 16) | 0x40);  // quiet NaN
  return static_cast<uint16_t>((static_cast<uint64_t>(x) + 0x7FFF + ((x >> 16) & 1)) >> 16);
}

void dequantize_row(DType t, const void* src, float* dst, int64_t n) {
  const DTypeInfo* i = dtype_info(static_cast<uint32_t>(t));
  if (!i || n <= 0) return;
  const int64_t nb = n / i->block_size;
  const auto* p = static_cast<const uint8_t*>(src);
  switch (t) {
    case DType::F32:
      std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    case DType::F16:
      for (int64_t k = 0; k < n; ++k) {
        half_bits h;
        std::memcpy(&h, p + 2 * k, 2);
        dst[k] = fp16_to_fp32(h);
      }
      return;
    case DType::BF16:
      for (int64_t k = 0; k < n; ++k) {
        uint16_t h;
        std::memcpy(&h, p + 2 * k, 2);
        dst[k] = bf16_to_fp32(h);
      }
      return;
    case DType::Q4_0: return deq_q4_0(src, dst, nb);
    case DType::Q4_1: return deq_q4_1(src, dst, nb);
    case DType::Q5_0: return deq_q5_0(src, dst, nb);
    case DType::Q5_1: return deq_q5_1(src, dst, nb);
    case DType::Q8_0: return deq_q8_0(src, dst, nb);
    case DType::Q8_1: return deq_q8_1(src, dst, nb);
    case DType::Q2_K: return deq_q2_k(src, dst, nb);
    case DType::Q3_K: return deq_q3_k(src, dst, nb);
    case DType::Q4_K: return deq_q4_k(src, dst, nb);
    case DType::Q5_K: return deq_q5_k(src, dst, nb);
    case DType::IQ4_NL: return deq_iq4_nl(src, dst, nb);
    case DType::IQ4_XS: return deq_iq4_xs(src, dst, nb);
    case DType::Q6_K: return deq_q6_k(src, dst, nb);
    case DType::Q8_K: return deq_q8_k(src, dst, nb);
  }
}


// --- quantization ----------------------------------------------------------------------------------

namespace {

template <class B>
void store_block(void* dst, int64_t i, const B& b) {
  std::memcpy(static_cast<uint8_t*>(dst) + i * sizeof(B), &b, sizeof(B));
}

// The element of largest magnitude, with its sign (ggml's q4_0/q5_0 scale is built from it).
float signed_absmax(const float* x, int n) {
  float amax = 0, max = 0;
  for (int j = 0; j < n; ++j) {
    const float v = x[j] < 0 ? -x[j] : x[j];
    if (amax < v) {
      amax = v;
      max = x[j];
    }
  }
  return max;
}

void q_q4_0(const float* x, void* dst, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += QK4_0) {
    const float max = signed_absmax(x, QK4_0);
    const float d = max / -8, id = d ? 1.0f / d : 0.0f;
    block_q4_0 b{};
    b.d = fp32_to_fp16(d);
    for (int j = 0; j < QK4_0 / 2; ++j) {
      const int a = std::min(15, static_cast<int>(static_cast<int8_t>(x[j] * id + 8.5f)));
      const int c = std::min(15, static_cast<int>(static_cast<int8_t>(x[QK4_0 / 2 + j] * id + 8.5f)));
      b.qs[j] = static_cast<uint8_t>(a | (c << 4));
    }
    store_block(dst, i, b);
  }
}

void q_q4_1(const float* x, void* dst, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += QK4_1) {
    float mn = x[0], mx = x[0];
    for (int j = 1; j < QK4_1; ++j) mn = std::min(mn, x[j]), mx = std::max(mx, x[j]);
    const float d = (mx - mn) / 15, id = d ? 1.0f / d : 0.0f;
    block_q4_1 b{};
    b.d = fp32_to_fp16(d);
    b.m = fp32_to_fp16(mn);
    for (int j = 0; j < QK4_1 / 2; ++j) {
      const int a = std::min(15, static_cast<int>(static_cast<int8_t>((x[j] - mn) * id + 0.5f)));
      const int c = std::min(15, static_cast<int>(static_cast<int8_t>((x[QK4_1 / 2 + j] - mn) * id + 0.5f)));
      b.qs[j] = static_cast<uint8_t>(a | (c << 4));
    }
    store_block(dst, i, b);
  }
}

// q5 packing shared by Q5_0 and Q5_1: low nibbles in qs, the fifth bits in qh.
template <class B>
void pack_q5(B& b, const int* q) {
  uint32_t qh = 0;
  for (int j = 0; j < 16; ++j) {
    b.qs[j] = static_cast<uint8_t>((q[j] & 0xF) | ((q[16 + j] & 0xF) << 4));
    qh |= static_cast<uint32_t>((q[j] & 0x10) >> 4) << j;
    qh |= static_cast<uint32_t>((q[16 + j] & 0x10) >> 4) << (j + 16);
  }
  std::memcpy(b.qh, &qh, 4);
}

void q_q5_0(const float* x, void* dst, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += QK5_0) {
    const float max = signed_absmax(x, QK5_0);
    const float d = max / -16, id = d ? 1.0f / d : 0.0f;
    block_q5_0 b{};
    b.d = fp32_to_fp16(d);
    int q[QK5_0];
    for (int j = 0; j < QK5_0; ++j) q[j] = std::min(31, static_cast<int>(static_cast<int8_t>(x[j] * id + 16.5f)));
    pack_q5(b, q);
    store_block(dst, i, b);
  }
}

void q_q5_1(const float* x, void* dst, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += QK5_1) {
    float mn = x[0], mx = x[0];
    for (int j = 1; j < QK5_1; ++j) mn = std::min(mn, x[j]), mx = std::max(mx, x[j]);
    const float d = (mx - mn) / 31, id = d ? 1.0f / d : 0.0f;
    block_q5_1 b{};
    b.d = fp32_to_fp16(d);
    b.m = fp32_to_fp16(mn);
    int q[QK5_1];
    for (int j = 0; j < QK5_1; ++j) q[j] = std::min(31, static_cast<int>((x[j] - mn) * id + 0.5f));
    pack_q5(b, q);
    store_block(dst, i, b);
  }
}

void q_q8_0(const float* x, void* dst, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += QK8_0) {
    float amax = 0;
    for (int j = 0; j < QK8_0; ++j) amax = std::max(amax, x[j] < 0 ? -x[j] : x[j]);
    const float d = amax / 127, id = d ? 1.0f / d : 0.0f;
    block_q8_0 b{};
    b.d = fp32_to_fp16(d);
    for (int j = 0; j < QK8_0; ++j) b.qs[j] = static_cast<int8_t>(std::round(x[j] * id));  // roundf, as ggml
    store_block(dst, i, b);
  }
}

// Clamped in float first: a value past int's range must not reach the conversion.
int clamp_round(float v, int lo, int hi) {
  return static_cast<int>(std::clamp(std::nearbyint(v), static_cast<float>(lo), static_cast<float>(hi)));
}

// Q4_K: eight sub-blocks of 32, each y = d*sc*q - dmin*m with 6-bit sc, m (packed as ggml does).
void q_q4_k(const float* x, void* dst, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    float scale[8], minv[8];
    float max_scale = 0, max_min = 0;
    for (int s = 0; s < 8; ++s) {
      float mn = x[32 * s], mx = x[32 * s];
      for (int j = 1; j < 32; ++j) mn = std::min(mn, x[32 * s + j]), mx = std::max(mx, x[32 * s + j]);
      mn = std::min(mn, 0.0f);  // the offset is subtracted: only a non-positive minimum is stored
      scale[s] = (mx - mn) / 15;
      minv[s] = -mn;
      max_scale = std::max(max_scale, scale[s]);
      max_min = std::max(max_min, minv[s]);
    }
    const float d = max_scale / 63, dmin = max_min / 63;
    const float id = d ? 1.0f / d : 0.0f, idmin = dmin ? 1.0f / dmin : 0.0f;
    block_q4_K b{};
    b.d = fp32_to_fp16(d);
    b.dmin = fp32_to_fp16(dmin);
    const float d16 = fp16_to_fp32(b.d), dmin16 = fp16_to_fp32(b.dmin);
    uint8_t L[QK_K];
    for (int s = 0; s < 8; ++s) {
      // Round the scale up so the quantized range still covers the sub-block.
      int ls = std::min(63, static_cast<int>(std::ceil(scale[s] * id)));
      const int lm = clamp_round(minv[s] * idmin, 0, 63);
      if (s < 4) {
        b.scales[s] = static_cast<uint8_t>(ls);
        b.scales[s + 4] = static_cast<uint8_t>(lm);
      } else {
        b.scales[s + 4] = static_cast<uint8_t>((ls & 0xF) | ((lm & 0xF) << 4));
        b.scales[s - 4] |= static_cast<uint8_t>((ls >> 4) << 6);
        b.scales[s] |= static_cast<uint8_t>((lm >> 4) << 6);
      }
      const float sd = d16 * static_cast<float>(ls), sm = dmin16 * static_cast<float>(lm);
      const float isd = sd ? 1.0f / sd : 0.0f;
      for (int j = 0; j < 32; ++j) L[32 * s + j] = static_cast<uint8_t>(clamp_round((x[32 * s + j] + sm) * isd, 0, 15));
    }
    uint8_t* q = b.qs;
    for (int j = 0; j < QK_K; j += 64, q += 32)
      for (int l = 0; l < 32; ++l) q[l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 4));
    store_block(dst, i, b);
  }
}

// Q6_K: sixteen sub-blocks of 16, y = d*sc*(q-32) with int8 sc and 6-bit q.
void q_q6_k(const float* x, void* dst, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    float scale[16];
    float max_scale = 0;
    for (int s = 0; s < 16; ++s) {
      float amax = 0;
      for (int j = 0; j < 16; ++j) amax = std::max(amax, std::fabs(x[16 * s + j]));
      scale[s] = amax / 31;
      max_scale = std::max(max_scale, scale[s]);
    }
    const float d = max_scale / 127, id = d ? 1.0f / d : 0.0f;
    block_q6_K b{};
    b.d = fp32_to_fp16(d);
    const float d16 = fp16_to_fp32(b.d);
    uint8_t L[QK_K];
    for (int s = 0; s < 16; ++s) {
      const int ls = std::min(127, static_cast<int>(std::ceil(scale[s] * id)));
      b.scales[s] = static_cast<int8_t>(ls);
      const float sd = d16 * static_cast<float>(ls), isd = sd ? 1.0f / sd : 0.0f;
      for (int j = 0; j < 16; ++j) L[16 * s + j] = static_cast<uint8_t>(clamp_round(x[16 * s + j] * isd, -32, 31) + 32);
    }
    uint8_t* ql = b.ql;
    uint8_t* qh = b.qh;
    for (int j = 0; j < QK_K; j += 128, ql += 64, qh += 32) {
      for (int l = 0; l < 32; ++l) {
        const uint8_t a = L[j + l], c = L[j + l + 32], e = L[j + l + 64], f = L[j + l + 96];
        ql[l] = static_cast<uint8_t>((a & 0xF) | ((e & 0xF) << 4));
        ql[l + 32] = static_cast<uint8_t>((c & 0xF) | ((f & 0xF) << 4));
        qh[l] = static_cast<uint8_t>((a >> 4) | ((c >> 4) << 2) | ((e >> 4) << 4) | ((f >> 4) << 6));
      }
    }
    store_block(dst, i, b);
  }
}

}  // namespace

bool quantize_row(DType t, const float* src, void* dst, int64_t n) {
  const DTypeInfo* info = dtype_info(static_cast<uint32_t>(t));
  if (!info || !info->weight_type || n < 0 || n % info->block_size != 0) return false;
  const int64_t nb = n / info->block_size;
  auto* p = static_cast<uint8_t*>(dst);
  switch (t) {
    case DType::F32: std::memcpy(dst, src, static_cast<size_t>(n) * 4); return true;
    case DType::F16:
      for (int64_t k = 0; k < n; ++k) {
        const half_bits h = fp32_to_fp16(src[k]);
        std::memcpy(p + 2 * k, &h, 2);
      }
      return true;
    case DType::BF16:
      for (int64_t k = 0; k < n; ++k) {
        const uint16_t h = fp32_to_bf16(src[k]);
        std::memcpy(p + 2 * k, &h, 2);
      }
      return true;
    case DType::Q4_0: q_q4_0(src, dst, nb); return true;
    case DType::Q4_1: q_q4_1(src, dst, nb); return true;
    case DType::Q5_0: q_q5_0(src, dst, nb); return true;
    case DType::Q5_1: q_q5_1(src, dst, nb); return true;
    case DType::Q8_0: q_q8_0(src, dst, nb); return true;
    case DType::Q4_K: q_q4_k(src, dst, nb); return true;
    case DType::Q6_K: q_q6_k(src, dst, nb); return true;
    default: return false;
  }
}

}  // namespace ss::model
