// Type table, fp16/bf16 conversions and scalar reference dequantization.
// Block layouts and arithmetic order follow ggml-quants.c dequantize_row_* so results match bit for bit.
#include "model/quant.h"

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
    {12, {"Q4_K", QK_K, sizeof(block_q4_K), true}},
    {14, {"Q6_K", QK_K, sizeof(block_q6_K), true}},
    {15, {"Q8_K", QK_K, sizeof(block_q8_K), false}},
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
    case DType::Q4_K: return deq_q4_k(src, dst, nb);
    case DType::Q6_K: return deq_q6_k(src, dst, nb);
    case DType::Q8_K: return deq_q8_k(src, dst, nb);
  }
}

}  // namespace ss::model
