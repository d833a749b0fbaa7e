// CPU kernels against an independent reference: fresh random blocks every run (the seed is printed;
// set SS_KERNEL_SEED to replay), every weight type, every ISA path the machine supports.
//
// Tolerances (per output y[t][o], S = sum_i |w_i * x_i|, the dot computed in double on the exact
// fp32 weights of the private dequantizer below):
//  - Scalar path: fp32 recursive summation, |err| <= gamma(n) * S with gamma(n) = n u / (1 - n u),
//    u = 2^-24 (Higham, Accuracy and Stability, 3.1). Weights dequantize to the same floats.
//  - SIMD paths quantize each activation block to int8 with step d = amax/127, rounding to nearest,
//    so |x_i - q_i d| <= d/2; hence |err| <= sum_i |w_i| * amax(block of i) / 254 + gamma(n) * S'.
//    Everything after the int8 rounding is exact integer math plus a few fp32 roundings per block,
//    which gamma covers. We check against 1.01x that bound (a worst case: it proves the error is the
//    quantization's, not that the code is right) and, tightly, against a double dot with the very
//    activations the kernel used (the quantization rule of cpu/act_quant.h replayed here):
//    |err| <= 8 (nb + 8) u * sum_i |w_i xq_i|, nb blocks per row. One wrong nibble fails that.
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/kernels_internal.h"
#include "common/huge_buffer.h"

#include <array>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace {

using ss::ThreadPool;
using ss::cpu::Isa;
using ss::model::DType;
namespace m = ss::model;

uint32_t seed() {
  static const uint32_t s = [] {
    const char* e = std::getenv("SS_KERNEL_SEED");
    const uint32_t v = e ? static_cast<uint32_t>(std::strtoul(e, nullptr, 10))
                         : static_cast<uint32_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    std::printf("kernels_test seed: %u (SS_KERNEL_SEED=%u to replay)\n", v, v);
    return v;
  }();
  return s;
}

// ---- private reference: ggml-common.h layouts, ggml-quants.c arithmetic, written independently ----
float h2f(uint16_t h) {
  const int s = h >> 15, e = (h >> 10) & 31, mnt = h & 1023;
  double v = e == 0 ? std::ldexp(mnt, -24) : std::ldexp(1024 + mnt, e - 25);
  if (e == 31) v = mnt ? NAN : INFINITY;
  return static_cast<float>(s ? -v : v);
}
float bf2f(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t rd16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }

// Dequantizes one row of `cols` elements stored at p.
std::vector<float> ref_row(DType t, const uint8_t* p, int64_t cols) {
  std::vector<float> y(cols);
  switch (t) {
    case DType::F32: std::memcpy(y.data(), p, cols * 4); break;
    case DType::F16: for (int64_t i = 0; i < cols; ++i) y[i] = h2f(rd16(p + 2 * i)); break;
    case DType::BF16: for (int64_t i = 0; i < cols; ++i) y[i] = bf2f(rd16(p + 2 * i)); break;
    case DType::Q4_0: case DType::Q4_1: case DType::Q5_0: case DType::Q5_1: {
      const bool has_m = t == DType::Q4_1 || t == DType::Q5_1, five = t == DType::Q5_0 || t == DType::Q5_1;
      const int bb = static_cast<int>(m::info(t).block_bytes);
      for (int64_t b = 0; b < cols / 32; ++b, p += bb) {
        const float d = h2f(rd16(p)), mn = has_m ? h2f(rd16(p + 2)) : 0.0f;
        const uint8_t* q = p + (has_m ? 4 : 2);
        uint32_t qh = 0;
        if (five) { std::memcpy(&qh, q, 4); q += 4; }
        for (int j = 0; j < 32; ++j) {
          int v = j < 16 ? (q[j] & 15) : (q[j - 16] >> 4);
          if (five) v |= ((qh >> j) & 1) << 4;
          if (!has_m) v -= five ? 16 : 8;
          y[b * 32 + j] = has_m ? v * d + mn : v * d;
        }
      }
      break;
    }
    case DType::Q8_0:
      for (int64_t b = 0; b < cols / 32; ++b, p += 34)
        for (int j = 0; j < 32; ++j) y[b * 32 + j] = static_cast<int8_t>(p[2 + j]) * h2f(rd16(p));
      break;
    case DType::Q4_K:
      for (int64_t b = 0; b < cols / 256; ++b, p += 144) {
        const float d = h2f(rd16(p)), dmin = h2f(rd16(p + 2));
        const uint8_t* s = p + 4;
        const uint8_t* q = p + 16;
        for (int j = 0; j < 8; ++j) {  // sub-block j: 32 values, nibble half j%2 of bytes 32*(j/2)..
          int sc, mn;
          if (j < 4) { sc = s[j] & 63; mn = s[j + 4] & 63; }
          else { sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4); mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4); }
          const float d1 = d * sc, m1 = dmin * mn;
          for (int l = 0; l < 32; ++l) {
            const int v = (j & 1) ? q[32 * (j / 2) + l] >> 4 : q[32 * (j / 2) + l] & 15;
            y[b * 256 + 32 * j + l] = d1 * v - m1;
          }
        }
      }
      break;
    case DType::Q6_K:
      for (int64_t b = 0; b < cols / 256; ++b, p += 210) {
        const uint8_t* ql = p;
        const uint8_t* qh = p + 128;
        const int8_t* sc = reinterpret_cast<const int8_t*>(p + 192);
        const float d = h2f(rd16(p + 208));
        for (int i = 0; i < 256; ++i) {  // element i: half h = i/128, quarter r = (i%128)/32, l = i%32
          const int h = i / 128, r = (i % 128) / 32, l = i % 32;
          const uint8_t lo = ql[64 * h + 32 * (r & 1) + l];
          const int v = ((r < 2 ? lo & 15 : lo >> 4) | (((qh[32 * h + l] >> (2 * r)) & 3) << 4)) - 32;
          y[b * 256 + i] = d * sc[8 * h + 2 * r + l / 16] * v;
        }
      }
      break;
    case DType::Q2_K: case DType::Q3_K: case DType::Q5_K: case DType::IQ4_NL: case DType::IQ4_XS:
      // The model library's scalar dequantization, itself held to the gguf package's (quant_test).
      m::dequantize_row(t, p, y.data(), cols);
      break;
    default: ADD_FAILURE() << "no reference for type"; break;
  }
  return y;
}

// Types ref_row decodes itself (the others it takes from model::dequantize_row).
bool has_own_reference(DType t) {
  return t == DType::Q4_0 || t == DType::Q4_1 || t == DType::Q5_0 || t == DType::Q5_1 || t == DType::Q8_0 ||
         t == DType::Q4_K || t == DType::Q6_K;
}

// ---- random tensors ----
struct RandTensor {
  m::Tensor t;
  std::vector<uint8_t> bytes;
};

uint16_t f2h(float f) { return m::fp32_to_fp16(f); }

RandTensor make_tensor(DType type, int64_t rows, int64_t cols, std::mt19937& g) {
  RandTensor r;
  const auto& ti = m::info(type);
  const size_t rb = cols / ti.block_size * ti.block_bytes;
  r.bytes.resize(rows * rb + 64);  // the +64 tail stays untouched: kernels must not need it
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (auto& b : r.bytes) b = static_cast<uint8_t>(byte(g));
  // Overwrite scales with sane values (random bits would be NaN/Inf).
  uint8_t* p = r.bytes.data();
  auto put16 = [](uint8_t* q, uint16_t v) { q[0] = v & 255; q[1] = v >> 8; };
  const int64_t nblk = rows * (cols / ti.block_size);
  for (int64_t b = 0; b < nblk; ++b) {
    uint8_t* q = p + b * ti.block_bytes;
    switch (type) {
      case DType::F32: { const float f = u(g); std::memcpy(q, &f, 4); break; }
      case DType::F16: put16(q, f2h(u(g))); break;
      case DType::BF16: put16(q, m::fp32_to_bf16(u(g))); break;
      case DType::Q4_0: case DType::Q5_0: case DType::Q8_0: put16(q, f2h(u(g) * 0.05f)); break;
      case DType::Q4_1: case DType::Q5_1: put16(q, f2h(u(g) * 0.05f)); put16(q + 2, f2h(u(g) * 0.5f)); break;
      case DType::Q4_K: put16(q, f2h(u(g) * 0.01f)); put16(q + 2, f2h(u(g) * 0.01f)); break;
      case DType::Q6_K: put16(q + 208, f2h(u(g) * 0.005f)); break;
      case DType::Q5_K: put16(q, f2h(u(g) * 0.01f)); put16(q + 2, f2h(u(g) * 0.01f)); break;
      case DType::Q3_K: put16(q + 108, f2h(u(g) * 0.01f)); break;
      case DType::Q2_K: put16(q + 80, f2h(u(g) * 0.01f)); put16(q + 82, f2h(u(g) * 0.01f)); break;
      case DType::IQ4_NL: case DType::IQ4_XS: put16(q, f2h(u(g) * 0.005f)); break;
      default: break;
    }
  }
  r.t.name = "rand";
  r.t.type = type;
  r.t.n_dims = 2;
  r.t.ne[0] = cols;
  r.t.ne[1] = rows;
  r.t.data = r.bytes.data();
  r.t.nbytes = rows * rb;
  return r;
}

std::vector<float> rand_acts(int n_tok, int64_t ld, std::mt19937& g) {
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> x(n_tok * ld);
  for (auto& v : x) v = n(g);
  for (int i = 0; i < 32 && i < ld; ++i) x[i] = 0.0f;  // an all-zero block: scale 0 must not divide by 0
  return x;
}

const DType kAllTypes[] = {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1,
                           DType::Q5_0, DType::Q5_1, DType::Q4_K, DType::Q6_K, DType::Q2_K, DType::Q3_K,
                           DType::Q5_K, DType::IQ4_NL, DType::IQ4_XS};

std::vector<Isa> supported_isas() {
  std::vector<Isa> v{Isa::Scalar};
  if (ss::cpu::detected_isa() >= Isa::Avx2) v.push_back(Isa::Avx2);
  if (ss::cpu::detected_isa() >= Isa::Avx512) v.push_back(Isa::Avx512);
  return v;
}

struct IsaGuard {
  explicit IsaGuard(Isa i) { ss::cpu::force_isa(i); }
  ~IsaGuard() { ss::cpu::clear_forced_isa(); }
};

// Runs matmul with a poisoned output and exactly-sized scratch (plus a guard tail checked afterwards).
std::vector<float> run_matmul(const m::Tensor& W, const std::vector<float>& x, int n_tok, int64_t ldx,
                              ThreadPool& pool) {
  const int64_t ldy = W.rows() + 3;  // a stride != rows checks the ldy handling
  std::vector<float> y(n_tok * ldy, NAN);
  const size_t sb = ss::cpu::matmul_scratch_bytes(W.type, W.cols(), n_tok);
  std::vector<uint8_t> scratch(sb + 64, 0xA5);
  ss::cpu::matmul(W, x.data(), n_tok, ldx, y.data(), ldy, {scratch.data(), sb}, pool);
  for (size_t i = sb; i < scratch.size(); ++i) EXPECT_EQ(scratch[i], 0xA5) << "scratch overrun";
  std::vector<float> out(n_tok * W.rows());
  for (int t = 0; t < n_tok; ++t)
    for (int64_t o = 0; o < W.rows(); ++o) {
      out[t * W.rows() + o] = y[t * ldy + o];
      for (int64_t pad = W.rows(); pad < ldy; ++pad) EXPECT_TRUE(std::isnan(y[t * ldy + pad]));
    }
  return out;
}

// The activation quantization rule documented in cpu/act_quant.h, replayed here so the SIMD paths can
// also be checked tightly against a dot with exactly the activations they use.
std::vector<float> fake_quantize(const float* x, int64_t cols, int qblock) {
  std::vector<float> out(cols);
  for (int64_t b = 0; b < cols; b += qblock) {
    float amax = 0;
    for (int i = 0; i < qblock; ++i) amax = std::max(amax, std::fabs(x[b + i]));
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int i = 0; i < qblock; ++i) out[b + i] = std::nearbyint(x[b + i] * id) * d;
  }
  return out;
}

void check_against_reference(DType type, Isa isa, int64_t rows, int64_t cols, int n_tok, ThreadPool& pool,
                             std::mt19937& g) {
  SCOPED_TRACE(testing::Message() << m::dtype_name(type) << " " << ss::cpu::isa_name(isa) << " rows=" << rows
                                  << " cols=" << cols << " n_tok=" << n_tok << " threads=" << pool.size());
  IsaGuard guard(isa);
  RandTensor w = make_tensor(type, rows, cols, g);
  const int64_t ldx = cols + 5;
  std::vector<float> x = rand_acts(n_tok, ldx, g);
  std::vector<float> y = run_matmul(w.t, x, n_tok, ldx, pool);
  // Activation blocks: 256 values for the super-block types, 32 otherwise (IQ4_NL included).
  const int qblock = m::info(type).block_size == 256 ? 256 : 32;
  const bool quantized_acts = isa != Isa::Scalar && m::info(type).block_size > 1;
  const double u = std::ldexp(1.0, -24), n = static_cast<double>(cols) + 8;
  const double gamma = n * u / (1 - n * u);
  // Against the activations the kernel really used: only fp32 rounding differs, a few roundings per
  // block on top of the block sum, and the weights' own fp32 rounding (d*q+m): 8 u per term covers it.
  const double gamma_q = (static_cast<double>(cols) / qblock + 8) * u;
  std::vector<std::vector<float>> xq(n_tok);
  if (quantized_acts)
    for (int t = 0; t < n_tok; ++t) xq[t] = fake_quantize(x.data() + t * ldx, cols, qblock);
  int bad = 0;
  for (int64_t o = 0; o < rows; ++o) {
    const std::vector<float> wr = ref_row(type, w.t.row(o), cols);
    for (int t = 0; t < n_tok; ++t) {
      const float* xt = x.data() + t * ldx;
      double ref = 0, S = 0, qerr = 0;
      for (int64_t i0 = 0; i0 < cols; i0 += qblock) {
        double amax = 0, wsum = 0;
        for (int64_t i = i0; i < std::min(cols, i0 + qblock); ++i) {
          ref += static_cast<double>(wr[i]) * xt[i];
          S += std::fabs(static_cast<double>(wr[i]) * xt[i]);
          amax = std::max(amax, std::fabs(static_cast<double>(xt[i])));
          wsum += std::fabs(static_cast<double>(wr[i]));
        }
        qerr += wsum * amax / 254.0;
      }
      const double tol = quantized_acts ? 1.01 * qerr + 2 * gamma * (S + qerr) : gamma * S;
      const double got = y[t * rows + o];
      if (!(std::fabs(got - ref) <= tol) && ++bad <= 5)
        ADD_FAILURE() << "y[" << t << "][" << o << "] = " << got << ", reference " << ref << ", tol " << tol;
      if (quantized_acts) {
        double refq = 0, Sq = 0;
        for (int64_t i = 0; i < cols; ++i) {
          refq += static_cast<double>(wr[i]) * xq[t][i];
          Sq += std::fabs(static_cast<double>(wr[i]) * xq[t][i]);
        }
        const double tolq = 8 * gamma_q * Sq;
        if (!(std::fabs(got - refq) <= tolq) && ++bad <= 5)
          ADD_FAILURE() << "y[" << t << "][" << o << "] = " << got << ", reference on quantized x " << refq
                        << ", tol " << tolq;
      }
    }
  }
}

}  // namespace

TEST(Kernels, GetRowMatchesReferenceExactly) {
  std::mt19937 g(seed());
  for (DType type : kAllTypes) {
    if (m::info(type).block_size > 1 && !has_own_reference(type)) continue;  // get_row is their reference
    SCOPED_TRACE(m::dtype_name(type));
    RandTensor w = make_tensor(type, 5, 512, g);
    std::vector<float> out(512);
    for (int64_t r = 0; r < 5; ++r) {
      ss::cpu::get_row(w.t, r, out.data());
      const std::vector<float> ref = ref_row(type, w.t.row(r), 512);
      for (int i = 0; i < 512; ++i) ASSERT_EQ(out[i], ref[i]) << "row " << r << " col " << i;
    }
  }
}

TEST(Kernels, MatmulMatchesReference) {
  std::mt19937 g(seed() + 1);
  ThreadPool pool1(1), pool2(2);
  for (Isa isa : supported_isas())
    for (DType type : kAllTypes) {
      const int64_t cols = m::info(type).block_size == 256 ? 512 : 576;
      for (int n_tok : {1, 2, 3, 4, 5, 6, 7, 8, 9, 17})
        check_against_reference(type, isa, 37, cols, n_tok, n_tok % 2 ? pool1 : pool2, g);
      check_against_reference(type, isa, 3, m::info(type).block_size == 256 ? 256 : 32, 5, pool2, g);
      if (m::info(type).block_size == 1)  // float rows need not be a multiple of the vector width
        for (int n_tok : {1, 7}) check_against_reference(type, isa, 9, 101, n_tok, pool2, g);
    }
}

// The SmolLM2 shapes' row lengths, and rows longer than the tiled kernels' 4096-value staging chunk.
TEST(Kernels, MatmulMatchesReferenceLongRows) {
  std::mt19937 g(seed() + 3);
  ThreadPool pool2(2);
  for (Isa isa : supported_isas())
    for (DType type : kAllTypes) {
      check_against_reference(type, isa, 21, 1536, 20, pool2, g);
      check_against_reference(type, isa, 13, 4608, 19, pool2, g);
      check_against_reference(type, isa, 13, 4608, 1, pool2, g);
    }
}

// y[t][o] must not depend on n_tok, on the tile (t, o) falls in, or on the thread split.
TEST(Kernels, BatchInvariance) {
  std::mt19937 g(seed() + 2);
  ThreadPool pool1(1), pool2(2);
  for (Isa isa : supported_isas())
    for (DType type : kAllTypes)
      for (int64_t cols : {m::info(type).block_size == 256 ? 768 : 576, 4608}) {  // 4608: chunked rows
        SCOPED_TRACE(testing::Message() << m::dtype_name(type) << " " << ss::cpu::isa_name(isa) << " cols=" << cols);
        IsaGuard guard(isa);
        const int64_t rows = 53;
        RandTensor w = make_tensor(type, rows, cols, g);
        const int max_tok = 33;
        std::vector<float> x = rand_acts(max_tok, cols, g);
        // Reference: each token alone, one thread.
        std::vector<float> single(max_tok * rows);
        for (int t = 0; t < max_tok; ++t) {
          std::vector<float> xt(x.begin() + t * cols, x.begin() + (t + 1) * cols);
          std::vector<float> yt = run_matmul(w.t, xt, 1, cols, pool1);
          std::copy(yt.begin(), yt.end(), single.begin() + t * rows);
        }
        for (int n_tok : {2, 7, 16, 33})
          for (ThreadPool* pool : {&pool1, &pool2}) {
            std::vector<float> y = run_matmul(w.t, x, n_tok, cols, *pool);
            for (int t = 0; t < n_tok; ++t)
              for (int64_t o = 0; o < rows; ++o)
                ASSERT_EQ(std::memcmp(&y[t * rows + o], &single[t * rows + o], 4), 0)
                    << "n_tok=" << n_tok << " threads=" << pool->size() << " t=" << t << " o=" << o << ": "
                    << y[t * rows + o] << " vs " << single[t * rows + o];
          }
      }
}

// The packed form (PackedMatrix) must give the very bits of the unpacked kernels of the same ISA, for
// every token count (full 8-token passes over one group, 4-token passes over pairs of groups, and each
// remainder; AVX2's block-outer path in 64-token chunks: 70), row counts that leave a partial 16-row group (45 rows: a partial second 8-row AVX2
// half; 29 rows the same for the 32-value types), or an odd group after the pairs (83 rows: 6 groups, 3
// per thread), and the thread split.
static void check_packed(Isa isa, DType type, std::mt19937& g,
                         std::initializer_list<int64_t> col_list = {32, 96, 160, 576, 1536, 256, 768}) {
  ThreadPool pool1(1), pool2(2);
  IsaGuard guard(isa);
  for (int64_t cols : col_list) {
    // K types: super-blocks of 256, so 256 (one), 768 (three) and 1536 (six) values per row.
    const bool k = m::info(type).block_size == 256;
    if (k ? cols % 256 != 0 : cols == 256 || cols == 768) continue;
    const int64_t rows = cols == 32 || cols == 256 ? 5
                         : cols == 96              ? 29
                         : cols == 160             ? 32
                         : cols == 576             ? 53
                         : cols == 768             ? 45
                                         : cols == 1536            ? 83
                                                   : 21;
    RandTensor w = make_tensor(type, rows, cols, g);
    ss::HugeBuffer buf;
    ASSERT_TRUE(buf.allocate(ss::cpu::packed_bytes(w.t))) << m::dtype_name(type);
    const ss::cpu::PackedMatrix P = ss::cpu::pack_weights(w.t, buf.data(), pool2);
    ASSERT_FALSE(P.empty()) << m::dtype_name(type);
    for (int n_tok : {1, 2, 3, 4, 5, 7, 8, 9, 12, 16, 17, 28, 33, 48, 70})
      for (ThreadPool* pool : {&pool1, &pool2}) {
        SCOPED_TRACE(testing::Message() << m::dtype_name(type) << " " << ss::cpu::isa_name(isa) << " cols=" << cols
                                        << " n_tok=" << n_tok << " threads=" << pool->size());
        const int64_t ldx = cols + 3, ldy = rows + 5;
        std::vector<float> x = rand_acts(n_tok, ldx, g);
        const size_t sb = ss::cpu::matmul_scratch_bytes(type, cols, n_tok);
        std::vector<uint8_t> scratch(sb + 64, 0xA5);
        std::vector<float> ref(n_tok * ldy, NAN), got(n_tok * ldy, NAN);
        ss::cpu::matmul(w.t, x.data(), n_tok, ldx, ref.data(), ldy, {scratch.data(), sb}, *pool);
        ss::cpu::matmul(w.t, P, x.data(), n_tok, ldx, got.data(), ldy, {scratch.data(), sb}, *pool);
        for (size_t i = sb; i < scratch.size(); ++i) ASSERT_EQ(scratch[i], 0xA5) << "scratch overrun";
        for (int t = 0; t < n_tok; ++t)
          for (int64_t o = 0; o < ldy; ++o) {
            if (o >= rows) {
              ASSERT_TRUE(std::isnan(got[t * ldy + o])) << "wrote past the rows: t=" << t << " o=" << o;
              continue;
            }
            ASSERT_EQ(std::memcmp(&got[t * ldy + o], &ref[t * ldy + o], 4), 0)
                << "t=" << t << " o=" << o << ": packed " << got[t * ldy + o] << " vs " << ref[t * ldy + o];
          }
      }
  }
}

struct AmxGuard {
  explicit AmxGuard(bool on) { ss::cpu::force_amx(on); }
  ~AmxGuard() { ss::cpu::clear_forced_amx(); }
};

struct GfniGuard {
  explicit GfniGuard(bool on) { ss::cpu::force_gfni(on); }
  ~GfniGuard() { ss::cpu::clear_forced_gfni(); }
};

TEST(Kernels, PackedMatchesUnpackedBitForBit) {
  if (ss::cpu::detected_isa() < Isa::Avx2) GTEST_SKIP() << "no AVX2 on this CPU: nothing is packed";
  AmxGuard vnni(false);  // the VNNI packed kernels (PackedAmxMatchesUnpackedBitForBit: the AMX ones)
  std::mt19937 g(seed() + 4);
  for (Isa isa : {Isa::Avx512, Isa::Avx2}) {
    if (ss::cpu::detected_isa() < isa) continue;
    // AVX-512: the nibble types' unpack by shifts and masks, and by GFNI where the CPU has it.
    for (bool gfni : {false, true}) {
      if (gfni && (isa != Isa::Avx512 || !ss::cpu::gfni_available())) continue;
      GfniGuard gg(gfni);
      SCOPED_TRACE(gfni ? "GFNI" : "no GFNI");
      for (DType type : {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::IQ4_NL, DType::Q2_K,
                         DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ4_XS})
        check_packed(isa, type, g);
    }
  }
}

// force_gfni(true) takes GFNI only where the CPU has it; off, the kernels never use it.
TEST(Kernels, GfniOnlyWhereTheCpuHasIt) {
  {
    GfniGuard on(true);
    EXPECT_EQ(ss::cpu::gfni_active(), ss::cpu::gfni_available());
  }
  {
    GfniGuard off(false);
    EXPECT_FALSE(ss::cpu::gfni_active());
  }
}

// The AMX tile kernels (Q4_0/Q4_1/Q5_0/Q5_1 from 12 tokens, Q4_K/Q5_K/Q6_K from 8) against the
// unpacked VNNI kernels: the same bits. 2208 columns (69 blocks) is more than a group's blocks kept unpacked (64),
// and odd: the blocks are unpacked per pass and the last block is a single.
TEST(Kernels, PackedAmxMatchesUnpackedBitForBit) {
  if (!ss::cpu::amx_available()) GTEST_SKIP() << "no AMX-INT8 on this CPU (or the OS did not grant it)";
  AmxGuard amx(true);
  ASSERT_TRUE([] {
    IsaGuard guard(Isa::Avx512);
    return ss::cpu::amx_active();
  }());
  std::mt19937 g(seed() + 14);
  for (DType type : {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1})
    check_packed(Isa::Avx512, type, g, {32, 160, 576, 1536, 2208});
  for (DType type : {DType::Q4_K, DType::Q5_K, DType::Q6_K}) check_packed(Isa::Avx512, type, g, {256, 768, 1536});
}

// The side stream (cpu/side_prefetch.h): at 16 tokens every packed kernel, VNNI, AVX2 and the AMX
// tile passes alike, takes lines of each thread's cursor and prefetches them, and the products keep
// matmul's bits. Every path the machine has: AVX2, AVX-512 with AMX off, AVX-512 with AMX on.
TEST(Kernels, PackedKernelsTakeSideLinesOnEveryPath) {
  if (ss::cpu::detected_isa() < Isa::Avx2) GTEST_SKIP() << "no AVX2 on this CPU: nothing is packed";
  std::mt19937 g(seed() + 21);
  ThreadPool pool2(2);
  const int n_tok = 16;
  std::vector<char> kv(64 * 4096, 1);  // the lines the cursors hand out (prefetched, never written)
  struct Mode {
    Isa isa;
    bool amx;
  };
  for (const Mode mode : {Mode{Isa::Avx2, false}, Mode{Isa::Avx512, false}, Mode{Isa::Avx512, true}}) {
    if (mode.isa > ss::cpu::detected_isa() || (mode.amx && !ss::cpu::amx_available())) continue;
    AmxGuard amx(mode.amx);
    IsaGuard guard(mode.isa);
    ASSERT_EQ(ss::cpu::amx_active(), mode.amx);
    for (DType type : {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::Q4_K, DType::Q5_K,
                       DType::Q6_K}) {
      SCOPED_TRACE(testing::Message() << m::dtype_name(type) << " " << ss::cpu::isa_name(mode.isa)
                                      << (mode.amx ? " + AMX" : ""));
      const int64_t rows = 83, cols = 1536;
      RandTensor w = make_tensor(type, rows, cols, g);
      ss::HugeBuffer buf;
      ASSERT_TRUE(buf.allocate(ss::cpu::packed_bytes(w.t)));
      const ss::cpu::PackedMatrix P = ss::cpu::pack_weights(w.t, buf.data(), pool2);
      ASSERT_FALSE(P.empty());
      const int64_t ldx = cols + 3, ldy = rows + 5;
      std::vector<float> x = rand_acts(n_tok, ldx, g);
      const size_t sb = ss::cpu::matmul_scratch_bytes(type, cols, n_tok);
      std::vector<uint8_t> scratch(sb);
      std::vector<float> ref(n_tok * ldy, NAN), got(n_tok * ldy, NAN);
      ss::cpu::matmul(w.t, x.data(), n_tok, ldx, ref.data(), ldy, {scratch.data(), sb}, pool2);
      // One range per thread, longer than any kernel takes, so each cursor's count is what it took.
      const ss::cpu::SideRange ranges[2] = {{kv.data(), 2048}, {kv.data() + 64 * 2048, 2048}};
      ss::cpu::SideCursor cursors[2];
      for (int t = 0; t < 2; ++t) {
        cursors[t].next = ranges + t;
        cursors[t].end = ranges + t + 1;
        cursors[t].per_block = 1;
      }
      const ss::cpu::MatmulJob job{&w.t, &P, got.data(), ldy};
      ASSERT_TRUE(ss::cpu::packed_path(&job, 1));
      ss::cpu::matmul_multi(&job, 1, x.data(), n_tok, ldx, {scratch.data(), sb, cursors}, pool2);
      for (int t = 0; t < 2; ++t) EXPECT_GT(cursors[t].taken, 0) << "thread " << t;
      for (int t = 0; t < n_tok; ++t)
        ASSERT_EQ(std::memcmp(&ref[t * ldy], &got[t * ldy], 4 * rows), 0) << "t=" << t;
    }
  }
}

// SS_CPU_AMX / force_amx turn it off; under a lower ISA it is never active.
TEST(Kernels, AmxOnlyUnderAvx512) {
  {
    AmxGuard off(false);
    EXPECT_FALSE(ss::cpu::amx_active());
  }
  AmxGuard on(true);
  IsaGuard guard(Isa::Avx2);
  EXPECT_FALSE(ss::cpu::amx_active());
}

// A type without a packed form, or a CPU without AVX2, packs to nothing and matmul uses W itself.
TEST(Kernels, PackedFallsBackToTheTensor) {
  std::mt19937 g(seed() + 5);
  ThreadPool pool(2);
  std::vector<uint8_t> dummy(1 << 16);
  for (DType type : {DType::F16, DType::BF16, DType::F32}) {
    RandTensor w = make_tensor(type, 16, 512, g);
    EXPECT_EQ(ss::cpu::packed_bytes(w.t), 0u) << m::dtype_name(type);
    EXPECT_TRUE(ss::cpu::pack_weights(w.t, dummy.data(), pool).empty()) << m::dtype_name(type);
  }
  RandTensor w = make_tensor(DType::Q4_1, 19, 576, g);
  ss::HugeBuffer buf;
  const size_t pb = ss::cpu::packed_bytes(w.t);
  if (pb) {
    ASSERT_TRUE(buf.allocate(pb));
  }
  const ss::cpu::PackedMatrix P = ss::cpu::pack_weights(w.t, buf.data(), pool);
  EXPECT_EQ(P.empty(), pb == 0);
  std::vector<float> x = rand_acts(3, 576, g);
  const size_t sb = ss::cpu::matmul_scratch_bytes(DType::Q4_1, 576, 3);
  std::vector<uint8_t> scratch(sb);
  for (Isa isa : supported_isas()) {
    IsaGuard guard(isa);
    std::vector<float> ref(3 * 19), got(3 * 19);
    ss::cpu::matmul(w.t, x.data(), 3, 576, ref.data(), 19, {scratch.data(), sb}, pool);
    ss::cpu::matmul(w.t, P, x.data(), 3, 576, got.data(), 19, {scratch.data(), sb}, pool);
    EXPECT_EQ(std::memcmp(ref.data(), got.data(), ref.size() * 4), 0) << ss::cpu::isa_name(isa);
  }
}

// Sampling weights: exp(fma(x, scale, -shift)) with the same bits on every ISA, within 2 ulp of exp in
// double, exact 0 far below; block sums equal to a double sum of the block in another order.
TEST(CpuOps, ExpWeightsSameBitsOnEveryIsaAndAccurate) {
  std::mt19937 g(seed() + 6);
  std::normal_distribution<float> nd(0.0f, 8.0f);
  for (int n : {1, 15, 64, 65, 1000, 49152}) {
    std::vector<float> x(n);
    for (auto& v : x) v = nd(g);
    if (n > 1) x[0] = -std::numeric_limits<float>::infinity();  // a masked logit
    if (n > 3) x[3] = -200.0f;                       // underflows to exactly 0
    const float scale = 1.0f / 0.7f;
    float mx = x[0];
    for (float v : x) mx = std::max(mx, v);
    const float shift = mx * scale;
    const int nb = (n + ss::cpu::ops::kSampleBlock - 1) / ss::cpu::ops::kSampleBlock;
    std::vector<std::vector<float>> w;
    std::vector<std::vector<double>> sums;
    for (Isa isa : supported_isas()) {
      const auto& ops = ss::cpu::ops::ops_for(isa);
      EXPECT_EQ(ops.max_value(x.data(), n), mx) << ss::cpu::isa_name(isa);
      w.emplace_back(n);
      sums.emplace_back(nb);
      ops.exp_weights(x.data(), n, scale, shift, w.back().data(), sums.back().data());
    }
    for (size_t k = 1; k < w.size(); ++k) {
      ASSERT_EQ(std::memcmp(w[k].data(), w[0].data(), 4 * n), 0) << "ISA #" << k << " n=" << n;
      ASSERT_EQ(std::memcmp(sums[k].data(), sums[0].data(), 8 * nb), 0) << "ISA #" << k << " n=" << n;
    }
    for (int i = 0; i < n; ++i) {
      const double arg = static_cast<double>(std::fma(x[i], scale, -shift)), ref = std::exp(arg);  // as documented
      if (arg < -87.3365478515625) {  // the documented flush to zero
        ASSERT_EQ(w[0][i], 0.0f) << i;
        continue;
      }
      ASSERT_LE(std::fabs(w[0][i] - ref), 2 * std::ldexp(1.0, -23) * ref + 1e-44) << "i=" << i << " arg " << arg;
    }
    for (int j = 0; j < nb; ++j) {
      double s = 0;
      for (int i = j * 64; i < std::min(n, (j + 1) * 64); ++i) s += w[0][i];
      // Two orders of <= 64 positive double adds: each within 63 u of the exact sum (u = 2^-53).
      ASSERT_NEAR(sums[0][j], s, 2 * 63 * std::ldexp(1.0, -53) * s) << "block " << j;
    }
  }
}

// matmul_multi (one quantization and one dispatch for several matrices on the same input) gives each
// job exactly matmul's bits, fused (all packed, one type, or 32-value types whose activation
// correction follows from the first job's: Q5_0 Q and K with a Q8_0 V as in Q4_K_M files, a Q4_1 or
// Q4_0 beside them) or not (Q4_1 first with a Q5_0: no correction to derive; unpacked, other ISAs).
// 64 tokens: the quantization inside the dispatch, each thread its tokens.
TEST(Kernels, MatmulMultiEqualsSeparateMatmuls) {
  std::mt19937 g(seed() + 7);
  ThreadPool pool1(1), pool2(2);
  const int64_t cols = 576;
  const std::vector<std::array<DType, 3>> sets = {{DType::Q4_1, DType::Q4_1, DType::Q4_1},
                                                  {DType::Q4_1, DType::Q5_0, DType::Q4_1},
                                                  {DType::Q5_0, DType::Q5_0, DType::Q8_0},
                                                  {DType::Q8_0, DType::Q4_0, DType::Q8_0},
                                                  {DType::Q5_0, DType::Q4_1, DType::Q5_0}};
  for (const auto& types : sets) {
    const bool mixed = types[0] != types[1] || types[1] != types[2];
    std::vector<RandTensor> ws;
    ws.push_back(make_tensor(types[0], 40, cols, g));
    ws.push_back(make_tensor(types[1], 17, cols, g));
    ws.push_back(make_tensor(types[2], 64, cols, g));
    std::vector<ss::HugeBuffer> bufs(ws.size());
    std::vector<ss::cpu::PackedMatrix> ps;
    for (size_t j = 0; j < ws.size(); ++j) {
      const size_t pb = ss::cpu::packed_bytes(ws[j].t);
      if (pb) {
        ASSERT_TRUE(bufs[j].allocate(pb));
      }
      ps.push_back(ss::cpu::pack_weights(ws[j].t, bufs[j].data(), pool2));
    }
    for (Isa isa : supported_isas()) {
      IsaGuard guard(isa);
      for (int n_tok : {1, 5, 16, 21, 64})
        for (ThreadPool* pool : {&pool1, &pool2}) {
          SCOPED_TRACE(testing::Message() << (mixed ? "mixed " : "same type ") << static_cast<int>(types[0]) << "/"
                                          << static_cast<int>(types[1]) << "/" << static_cast<int>(types[2]) << " "
                                          << ss::cpu::isa_name(isa)
                                          << " n_tok=" << n_tok << " threads=" << pool->size());
          const int64_t ldx = cols + 3;  // strides != widths check the ld handling
          std::vector<float> x = rand_acts(n_tok, ldx, g);
          size_t sb = 0;
          for (auto& w : ws) sb = std::max(sb, ss::cpu::matmul_scratch_bytes(w.t.type, cols, n_tok));
          std::vector<uint8_t> scratch(sb);
          std::vector<std::vector<float>> ref(ws.size()), got(ws.size());
          std::vector<ss::cpu::MatmulJob> jobs;
          for (size_t j = 0; j < ws.size(); ++j) {
            const int64_t ldy = ws[j].t.rows() + 5;
            ref[j].assign(n_tok * ldy, NAN);
            got[j].assign(n_tok * ldy, NAN);
            ss::cpu::matmul(ws[j].t, x.data(), n_tok, ldx, ref[j].data(), ldy, {scratch.data(), sb}, *pool);
            jobs.push_back({&ws[j].t, &ps[j], got[j].data(), ldy});
          }
          ss::cpu::matmul_multi(jobs.data(), static_cast<int>(jobs.size()), x.data(), n_tok, ldx,
                                {scratch.data(), sb}, *pool);
          for (size_t j = 0; j < ws.size(); ++j) {
            const int64_t rows = ws[j].t.rows(), ldy = rows + 5;
            for (int t = 0; t < n_tok; ++t) {
              ASSERT_EQ(std::memcmp(&ref[j][t * ldy], &got[j][t * ldy], 4 * rows), 0) << "job " << j << " t=" << t;
              for (int64_t o = rows; o < ldy; ++o) ASSERT_TRUE(std::isnan(got[j][t * ldy + o])) << "wrote past the rows";
            }
          }
        }
    }
  }
}

// Activation quantization (cpu/act_quant.h's rule, replayed here with scalar float ops): every SIMD
// path, each layout (row-major for the packed decode kernel, 16-token groups for the tiled one), whole
// runs of 16 blocks and tails, all-zero blocks and huge values, gives exactly the rule's q, d, d*sum(q)
// and C*sum(q) (C: the kernel's weight zero point), and zero padding tokens.
TEST(Kernels, ActivationQuantizationFollowsTheRule) {
  namespace d = ss::cpu::detail;
  std::mt19937 g(seed() + 8);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  for (Isa isa : supported_isas()) {
    if (isa == Isa::Scalar) continue;  // the scalar path dequantizes weights instead
    const auto quantize = isa == Isa::Avx512 ? d::avx512::quantize : d::avx2::quantize;
    for (DType type : {DType::Q4_1, DType::Q8_0, DType::Q4_0})
      for (int group : {1, 16})
        for (int64_t cols : {96, 576, 1536})
          for (int n_tok : {1, 3, 17}) {
            SCOPED_TRACE(testing::Message() << ss::cpu::isa_name(isa) << " " << m::dtype_name(type) << " group "
                                            << group << " cols " << cols << " n_tok " << n_tok);
            // The weight encodings' zero points: nibbles as w + 8 (Q4_0); Q8_0 as w + 128 for VNNI (AVX2
            // multiplies signed bytes by the sign trick instead: no correction).
            const int C = type == DType::Q4_0 ? 8 : type == DType::Q8_0 && isa == Isa::Avx512 ? 128 : 0;
            std::vector<float> x(static_cast<size_t>(cols * n_tok));
            for (auto& v : x) v = nd(g);
            for (int t = 0; t < n_tok; ++t) {
              std::fill_n(x.begin() + t * cols + 32 * (t % (cols / 32)), 32, 0.0f);  // an all-zero block
              x[t * cols + cols - 1] = 3e4f * (t % 2 ? -1.0f : 1.0f);                   // a huge value
            }
            std::vector<uint8_t> scratch(d::qacts_bytes(cols, n_tok) + 64, 0xA5);
            const d::QActs a = d::carve_qacts(scratch.data(), cols, n_tok, group, 32);
            quantize(type, x.data(), cols, 0, a.n_pad(), a);
            for (int t = 0; t < n_tok; ++t)
              for (int64_t b = 0; b < cols / 32; ++b) {
                const float* xb = x.data() + t * cols + 32 * b;
                float amax = 0.0f;
                for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(xb[i]));
                const float dd = amax / 127.0f, id = dd != 0.0f ? 1.0f / dd : 0.0f;
                int32_t sum = 0;
                for (int i = 0; i < 32; ++i) {
                  const float q = std::nearbyint(xb[i] * id);
                  sum += static_cast<int32_t>(q);
                  ASSERT_EQ(a.qs[a.qidx(t, 32 * b + i)], static_cast<int8_t>(q))
                      << "t " << t << " value " << 32 * b + i;
                }
                const int64_t si = a.sidx(t, b);
                ASSERT_EQ(a.d[si], dd) << "t " << t << " block " << b;
                ASSERT_EQ(a.s[si], dd * static_cast<float>(sum)) << "t " << t << " block " << b;
                ASSERT_EQ(a.corr[si], C * sum) << "t " << t << " block " << b;
              }
            for (int t = n_tok; t < a.n_pad(); ++t)
              for (int64_t b = 0; b < cols / 32; ++b) {
                for (int i = 0; i < 32; ++i) ASSERT_EQ(a.qs[a.qidx(t, 32 * b + i)], 0) << "padding token " << t;
                const int64_t si = a.sidx(t, b);
                ASSERT_TRUE(a.d[si] == 0.0f && a.s[si] == 0.0f && a.corr[si] == 0) << "padding token " << t;
              }
          }
  }
}

// attention_token (one decode row, every head; several GQA groups per micro-tile where the ISA allows)
// gives attention_group's bits for each group, on every ISA, for GQA shapes of 1-4 heads per group
// and group counts that leave a remainder, fp16, fp32 and Q8 caches, scattered blocks, one-pass and
// multi-pass contexts; and both agree with softmax attention computed in double from the values the
// cache holds (for Q8: int8 times its slot's scale).
TEST(CpuOps, AttentionTokenEqualsPerGroupAttention) {
  namespace o = ss::cpu::ops;
  std::mt19937 g(seed() + 9);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<int> qd(-127, 127);
  std::uniform_real_distribution<float> sd(0.002f, 0.03f);
  struct Shape {
    int n_kv, n_rep, hd;
  };
  for (const Shape sh : {Shape{3, 3, 64}, Shape{2, 4, 64}, Shape{4, 2, 64}, Shape{5, 2, 32}, Shape{3, 4, 64},
                         Shape{2, 7, 64}, Shape{1, 1, 64}})
    for (o::KvElem elem : {o::KvElem::F16, o::KvElem::F32, o::KvElem::Q8})
      for (int pos : {0, 17, 130, 2100}) {
        const char* ename = elem == o::KvElem::F16 ? " f16" : elem == o::KvElem::F32 ? " f32" : " q8";
        SCOPED_TRACE(testing::Message() << "n_kv " << sh.n_kv << " n_rep " << sh.n_rep << " hd " << sh.hd << ename
                                        << " pos " << pos);
        const int bs = 16, n_blocks = pos / bs + 1, nh = sh.n_kv * sh.n_rep, hd = sh.hd;
        const int64_t per = static_cast<int64_t>(sh.n_kv) * hd * bs;  // K (or V) elements of a block
        const int64_t stride = 2 * per;                                  // K then V, as the backend lays them
        const int total_blocks = 2 * n_blocks + 3;
        std::vector<int32_t> table(n_blocks);
        for (int j = 0; j < n_blocks; ++j) table[j] = (j * 7 + 2) % total_blocks;  // scattered, distinct
        // kf: the values the kernels see, in the fp32 layout; the fp16 / Q8 caches encode exactly these.
        std::vector<float> kf(static_cast<size_t>(total_blocks * stride));
        std::vector<uint16_t> kh(kf.size());
        // Q8: per block K (per int8s, then n_kv * bs float scales) then V the same way.
        const int64_t q8_region = per + 4 * static_cast<int64_t>(sh.n_kv) * bs;
        std::vector<uint32_t> q8_words(static_cast<size_t>(total_blocks * 2 * q8_region / 4));
        auto* q8 = reinterpret_cast<unsigned char*>(q8_words.data());
        if (elem == o::KvElem::Q8) {
          for (int b = 0; b < total_blocks; ++b)
            for (int kind = 0; kind < 2; ++kind)
              for (int kv = 0; kv < sh.n_kv; ++kv)
                for (int slot = 0; slot < bs; ++slot) {
                  unsigned char* region = q8 + (2 * b + kind) * q8_region;
                  const float scale = sd(g);
                  std::memcpy(region + per + 4 * (kv * bs + slot), &scale, 4);
                  for (int d = 0; d < hd; ++d) {
                    const int64_t at = kind == 0 ? (kv * hd + d) * bs + slot : (kv * bs + slot) * hd + d;
                    const int v = qd(g);
                    region[at] = static_cast<unsigned char>(static_cast<int8_t>(v));
                    kf[b * stride + kind * per + at] = static_cast<float>(v) * scale;
                  }
                }
        } else {
          for (auto& v : kf) v = nd(g);
          for (size_t i = 0; i < kf.size(); ++i) {
            kh[i] = ss::model::fp32_to_fp16(kf[i]);
            if (elem == o::KvElem::F16) kf[i] = ss::model::fp16_to_fp32(kh[i]);  // the values the fp16 kernels see
          }
        }
        std::vector<float> q(static_cast<size_t>(nh) * hd);
        for (auto& v : q) v = 0.3f * nd(g);
        const int32_t positions[1] = {pos};
        const char* base = elem == o::KvElem::F16   ? reinterpret_cast<const char*>(kh.data())
                           : elem == o::KvElem::F32 ? reinterpret_cast<const char*>(kf.data())
                                                    : reinterpret_cast<const char*>(q8);
        const int64_t el = elem == o::KvElem::F16 ? 2 : elem == o::KvElem::F32 ? 4 : 1;
        const int64_t region = elem == o::KvElem::Q8 ? q8_region : per * el;  // bytes of a block's K
        std::vector<float> out_tok(q.size(), NAN), out_grp(q.size(), NAN);
        o::AttnLayer L{q.data(), nh * hd, out_tok.data(), nh * hd, base,     base + region, 2 * region / el,
                       hd,       bs,      bs,             sh.n_rep, positions, elem,          sh.n_kv,
                       per};
        std::vector<float> scratch(o::attn_scratch_floats(hd));
        for (Isa isa : supported_isas()) {
          SCOPED_TRACE(ss::cpu::isa_name(isa));
          const auto& ops = o::ops_for(isa);
          std::fill(out_tok.begin(), out_tok.end(), NAN);
          std::fill(out_grp.begin(), out_grp.end(), NAN);
          L.out = out_tok.data();
          ops.attention_token(L, 0, table.data(), scratch.data());
          L.out = out_grp.data();
          for (int k = 0; k < sh.n_kv; ++k)
            ops.attention_group(L, 0, k * sh.n_rep, sh.n_rep, table.data(), scratch.data());
          ASSERT_EQ(std::memcmp(out_tok.data(), out_grp.data(), sizeof(float) * out_tok.size()), 0);
          // Reference in double: softmax(q . K) V over positions 0..pos.
          for (int h = 0; h < nh; ++h) {
            const int kv = h / sh.n_rep;
            std::vector<double> s(pos + 1);
            double mx = -1e300, sum = 0;
            for (int p = 0; p <= pos; ++p) {
              const int64_t b = static_cast<int64_t>(table[p / bs]) * stride;
              double d = 0;
              for (int i = 0; i < hd; ++i)
                d += static_cast<double>(q[h * hd + i]) * kf[b + (kv * hd + i) * bs + p % bs];
              s[p] = d;
              mx = std::max(mx, d);
            }
            for (int p = 0; p <= pos; ++p) sum += (s[p] = std::exp(s[p] - mx));
            for (int i = 0; i < hd; ++i) {
              double r = 0;
              for (int p = 0; p <= pos; ++p) {
                const int64_t b = static_cast<int64_t>(table[p / bs]) * stride + per;
                r += s[p] * kf[b + (kv * bs + p % bs) * hd + i];
              }
              ASSERT_NEAR(out_tok[h * hd + i], r / sum, 1e-4) << "head " << h << " dim " << i;
            }
          }
        }
      }
}

// store_kv with Q8 writes, per KV head, scale = max|x| / 127 and q = round-half-even(x * (1 / scale))
// (cpu_ops.h's rule, replayed here in scalar code) into the token's slot only, on every ISA; the
// stored value is within half a step of the input; an all-zero head stores zeros with scale 0, and a
// head holding inf or NaN stores zeros with a NaN scale.
TEST(CpuOps, StoreKvQ8FollowsTheRule) {
  namespace o = ss::cpu::ops;
  std::mt19937 g(seed() + 10);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int n_kv = 4, hd = 64, bs = 16, slot = 5;
  const int64_t per = static_cast<int64_t>(n_kv) * hd * bs, region = per + 4 * n_kv * bs;
  std::vector<float> k(n_kv * hd), v(n_kv * hd);
  for (int i = 0; i < n_kv * hd; ++i) {
    k[i] = nd(g) * (i < hd ? 1.0f : i < 2 * hd ? 1e-20f : 300.0f);  // heads of very different magnitude
    v[i] = nd(g);
  }
  for (int i = 0; i < hd; ++i) v[2 * hd + i] = 0.0f;  // an all-zero head
  k[3 * hd + 7] = INFINITY;
  v[3 * hd + 9] = NAN;
  for (Isa isa : supported_isas()) {
    SCOPED_TRACE(ss::cpu::isa_name(isa));
    std::vector<uint32_t> words(static_cast<size_t>(2 * region / 4), 0x5A5A5A5Au);
    auto* kb = reinterpret_cast<unsigned char*>(words.data());
    unsigned char* vb = kb + region;
    o::ops_for(isa).store_kv(k.data(), v.data(), kb, vb, n_kv, hd, bs, slot, o::KvElem::Q8, per);
    std::vector<bool> written(2 * region, false);
    for (int kind = 0; kind < 2; ++kind)
      for (int h = 0; h < n_kv; ++h) {
        SCOPED_TRACE(testing::Message() << (kind ? "V" : "K") << " head " << h);
        const float* x = (kind ? v.data() : k.data()) + h * hd;
        unsigned char* rb = kind ? vb : kb;
        float scale;
        std::memcpy(&scale, rb + per + 4 * (h * bs + slot), 4);
        for (int b = 0; b < 4; ++b) written[kind * region + per + 4 * (h * bs + slot) + b] = true;
        float amax = 0;
        bool finite = true;
        for (int i = 0; i < hd; ++i) {
          finite = finite && std::isfinite(x[i]);
          amax = std::max(amax, std::abs(x[i]));
        }
        if (!finite)
          EXPECT_TRUE(std::isnan(scale));
        else
          EXPECT_EQ(scale, amax / 127.0f);
        for (int i = 0; i < hd; ++i) {
          const int64_t at = kind == 0 ? (h * hd + i) * bs + slot : (h * bs + slot) * hd + i;
          written[kind * region + at] = true;
          const int q = static_cast<int8_t>(rb[at]);
          if (!finite || amax == 0) {
            EXPECT_EQ(q, 0) << i;
            continue;
          }
          const float want = std::clamp(std::nearbyint(x[i] * (1.0f / scale)), -127.0f, 127.0f);
          EXPECT_EQ(q, static_cast<int>(want)) << i;
          EXPECT_LE(std::abs(q * static_cast<double>(scale) - x[i]), 0.5 * scale * (1 + 1e-5)) << i;
        }
      }
    for (int64_t i = 0; i < 2 * region; ++i) {
      if (!written[i]) {
        ASSERT_EQ(kb[i], 0x5A) << "byte " << i << " outside the slot was written";
      }
    }
  }
}
