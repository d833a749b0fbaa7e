// Shared by the kernel tests: skip without a GPU, checked CUDA calls, device buffers poisoned with
// 0xFF bytes (NaN in fp32 and bf16) before each run, host bf16 rounding and seeded random inputs.
#pragma once
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cuda/kernels/kernels.h"

namespace ss::cuda::test {

inline bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

#define SKIP_WITHOUT_GPU()                                       \
  do {                                                           \
    if (!::ss::cuda::test::have_gpu()) GTEST_SKIP() << "no CUDA device"; \
  } while (0)

// A CUDA call that must succeed: fails the test with file:line and CUDA's message.
#define CUDA_OK(expr)                                                                        \
  do {                                                                                       \
    const cudaError_t e_ = (expr);                                                           \
    ASSERT_EQ(e_, cudaSuccess) << __FILE__ << ":" << __LINE__ << ": " #expr ": " << cudaGetErrorString(e_); \
  } while (0)
// A launch function's Status that must be ok.
#define LAUNCH_OK(expr)                                             \
  do {                                                              \
    const ::ss::Status st_ = (expr);                                \
    ASSERT_TRUE(st_.ok()) << #expr ": " << st_.message();           \
  } while (0)

template <class T>
class DeviceBuf {
 public:
  explicit DeviceBuf(size_t n) : n_(n) {
    if (n && cudaMalloc(reinterpret_cast<void**>(&p_), n * sizeof(T)) != cudaSuccess) p_ = nullptr;
  }
  explicit DeviceBuf(const std::vector<T>& h) : DeviceBuf(h.size()) { upload(h); }
  ~DeviceBuf() { if (p_) cudaFree(p_); }
  DeviceBuf(const DeviceBuf&) = delete;
  DeviceBuf& operator=(const DeviceBuf&) = delete;
  T* get() const { return p_; }
  size_t size() const { return n_; }
  bool ok() const { return p_ != nullptr || n_ == 0; }
  void upload(const std::vector<T>& h) { cudaMemcpy(p_, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice); }
  void poison() { cudaMemset(p_, 0xFF, n_ * sizeof(T)); }
  std::vector<T> download() const {
    std::vector<T> h(n_);
    cudaDeviceSynchronize();
    cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost);
    return h;
  }

 private:
  T* p_ = nullptr;
  size_t n_;
};

inline uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}
inline float from_bf16(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// IEEE half from float (round to nearest even; the test values are normal and in range).
inline uint16_t to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t sign = (u >> 16) & 0x8000u;
  int exp = static_cast<int>((u >> 23) & 0xff) - 127 + 15;
  uint32_t man = u & 0x7fffffu;
  if (exp <= 0) return static_cast<uint16_t>(sign);  // flush tiny values (not used by the tests)
  uint32_t h = sign | (static_cast<uint32_t>(exp) << 10) | (man >> 13);
  const uint32_t rest = man & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(h);
}
inline float from_f16(uint16_t h) {
  const int exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  float v = exp == 0 ? std::ldexp(static_cast<float>(man), -24) : std::ldexp(static_cast<float>(man | 0x400), exp - 25);
  return (h & 0x8000) ? -v : v;
}

// Uniform values in [lo, hi), rounded to bf16 (returned as the bits and as floats).
inline std::vector<uint16_t> random_bf16(std::mt19937& rng, size_t n, float lo, float hi, std::vector<float>* as_float) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<uint16_t> b(n);
  if (as_float) as_float->resize(n);
  for (size_t i = 0; i < n; ++i) {
    b[i] = to_bf16(d(rng));
    if (as_float) (*as_float)[i] = from_bf16(b[i]);
  }
  return b;
}
inline std::vector<float> random_f32(std::mt19937& rng, size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Host dequantization of GGUF rows (ggml-common.h layouts), written apart from the kernels'.
inline std::vector<float> host_rows(const std::vector<uint8_t>& raw, kern::TableType t, int vocab, int h) {
  std::vector<float> out(static_cast<size_t>(vocab) * h);
  const int nb = h / 32;
  const int bytes = t == kern::TableType::Q8_0 ? 34 : t == kern::TableType::Q4_0 ? 18 : 20;
  for (int r = 0; r < vocab; ++r)
    for (int b = 0; b < nb; ++b) {
      const uint8_t* p = raw.data() + (static_cast<size_t>(r) * nb + b) * bytes;
      const float d = from_f16(static_cast<uint16_t>(p[0] | (p[1] << 8)));
      for (int j = 0; j < 32; ++j) {
        float v;
        if (t == kern::TableType::Q8_0) {
          v = d * static_cast<int8_t>(p[2 + j]);
        } else if (t == kern::TableType::Q4_0) {
          const int q = j < 16 ? (p[2 + j] & 0xf) : (p[2 + j - 16] >> 4);
          v = d * (q - 8);
        } else {
          const float m = from_f16(static_cast<uint16_t>(p[2] | (p[3] << 8)));
          const int q = j < 16 ? (p[4 + j] & 0xf) : (p[4 + j - 16] >> 4);
          v = d * q + m;
        }
        out[static_cast<size_t>(r) * h + b * 32 + j] = v;
      }
    }
  return out;
}

// Random GGUF blocks: a positive f16 scale (and f16 min), random quants.
inline std::vector<uint8_t> random_blocks(std::mt19937& rng, kern::TableType t, size_t n_blocks) {
  const int bytes = t == kern::TableType::Q8_0 ? 34 : t == kern::TableType::Q4_0 ? 18 : 20;
  std::vector<uint8_t> raw(n_blocks * bytes);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(0.001f, 0.05f), mn(-0.2f, 0.2f);
  for (size_t b = 0; b < n_blocks; ++b) {
    uint8_t* p = raw.data() + b * bytes;
    for (int i = 0; i < bytes; ++i) p[i] = static_cast<uint8_t>(byte(rng));
    const uint16_t d = to_f16(scale(rng));
    p[0] = d & 0xff, p[1] = d >> 8;
    if (t == kern::TableType::Q4_1) {
      const uint16_t m = to_f16(mn(rng));
      p[2] = m & 0xff, p[3] = m >> 8;
    }
  }
  return raw;
}

}  // namespace ss::cuda::test
