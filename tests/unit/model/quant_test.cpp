// quant.cpp against gguf.quants (fixtures from tools/gen_quant_ref.py).
#include <cmath>
#include <cstring>

#include "model_test_util.h"

namespace ss::model {
namespace {

using test::data_dir;
using test::read_file;

struct Fixture {
  uint32_t type = 0;
  std::vector<uint8_t> blocks;
  std::vector<float> expected;
};

Fixture load_fixture(const std::string& name) {
  const auto b = read_file(data_dir() + "/quant/" + name + ".bin");
  Fixture f;
  if (b.size() < 12) return f;
  uint32_t n = 0, nbytes = 0;
  std::memcpy(&f.type, b.data(), 4);
  std::memcpy(&n, b.data() + 4, 4);
  std::memcpy(&nbytes, b.data() + 8, 4);
  if (b.size() != 12 + nbytes + size_t{n} * 4) return f;
  f.blocks.assign(b.begin() + 12, b.begin() + 12 + nbytes);
  f.expected.resize(n);
  std::memcpy(f.expected.data(), b.data() + 12 + nbytes, size_t{n} * 4);
  return f;
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Same value, or both NaN; at most 1 ulp apart otherwise.
bool close_ulp(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  if (a == b) return true;
  if ((a < 0) != (b < 0)) return false;
  const int64_t d = int64_t{bits(a)} - int64_t{bits(b)};
  return d >= -1 && d <= 1;
}

class QuantRef : public ::testing::TestWithParam<std::pair<const char*, DType>> {};

TEST_P(QuantRef, MatchesGgufPackage) {
  const auto [name, type] = GetParam();
  const Fixture f = load_fixture(name);
  ASSERT_FALSE(f.expected.empty()) << "missing or malformed fixture tests/data/quant/" << name
                                   << ".bin (run tools/gen_quant_ref.py)";
  ASSERT_EQ(f.type, static_cast<uint32_t>(type));
  const int64_t n = static_cast<int64_t>(f.expected.size());
  ASSERT_EQ(f.blocks.size(), row_bytes(type, n));
  std::vector<float> out(f.expected.size(), -12345.0f);
  dequantize_row(type, f.blocks.data(), out.data(), n);
  int bad = 0;
  for (size_t i = 0; i < out.size() && bad < 5; ++i)
    if (!close_ulp(out[i], f.expected[i])) {
      ++bad;
      ADD_FAILURE() << name << "[" << i << "]: got " << out[i] << ", gguf.quants says " << f.expected[i];
    }
  // Row by row from an unaligned address gives the same result (mapped data has no alignment promise).
  std::vector<uint8_t> shifted(f.blocks.size() + 1);
  std::memcpy(shifted.data() + 1, f.blocks.data(), f.blocks.size());
  std::vector<float> out2(out.size());
  dequantize_row(type, shifted.data() + 1, out2.data(), n);
  EXPECT_EQ(0, std::memcmp(out.data(), out2.data(), out.size() * 4));
}

INSTANTIATE_TEST_SUITE_P(
    AllTypes, QuantRef,
    ::testing::Values(std::make_pair("f32", DType::F32), std::make_pair("f16", DType::F16),
                      std::make_pair("bf16", DType::BF16), std::make_pair("q4_0", DType::Q4_0),
                      std::make_pair("q4_1", DType::Q4_1), std::make_pair("q5_0", DType::Q5_0),
                      std::make_pair("q5_1", DType::Q5_1), std::make_pair("q8_0", DType::Q8_0),
                      std::make_pair("q4_k", DType::Q4_K), std::make_pair("q6_k", DType::Q6_K),
                      std::make_pair("q2_k", DType::Q2_K), std::make_pair("q3_k", DType::Q3_K),
                      std::make_pair("q5_k", DType::Q5_K), std::make_pair("iq4_nl", DType::IQ4_NL),
                      std::make_pair("iq4_xs", DType::IQ4_XS)),
    [](const auto& info) { return std::string(info.param.first); });

TEST(Quant, Fp32ToHalfAndBf16MatchNumpyAndGguf) {
  const auto b = read_file(data_dir() + "/quant/conv.bin");
  ASSERT_GE(b.size(), 4u) << "missing tests/data/quant/conv.bin (run tools/gen_quant_ref.py)";
  uint32_t n;
  std::memcpy(&n, b.data(), 4);
  ASSERT_EQ(b.size(), 4 + size_t{n} * 8);
  for (uint32_t i = 0; i < n; ++i) {
    float x;
    uint16_t h, bf;
    std::memcpy(&x, b.data() + 4 + 4 * i, 4);
    std::memcpy(&h, b.data() + 4 + 4 * n + 2 * i, 2);
    std::memcpy(&bf, b.data() + 4 + 6 * n + 2 * i, 2);
    if (std::isnan(x)) {
      EXPECT_TRUE(std::isnan(fp16_to_fp32(fp32_to_fp16(x))));
      EXPECT_EQ(bf, fp32_to_bf16(x));
      continue;
    }
    EXPECT_EQ(h, fp32_to_fp16(x)) << "fp16 of " << x << " (bits " << std::hex << bits(x) << ")";
    EXPECT_EQ(bf, fp32_to_bf16(x)) << "bf16 of " << x << " (bits " << std::hex << bits(x) << ")";
  }
}

TEST(Quant, HalfRoundTripsExhaustively) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = fp16_to_fp32(static_cast<half_bits>(h));
    if (std::isnan(f)) {
      EXPECT_EQ((h & 0x7C00u), 0x7C00u);
      continue;
    }
    ASSERT_EQ(h, fp32_to_fp16(f)) << std::hex << h;
  }
  for (uint32_t b = 0; b < 65536; ++b) {
    const float f = bf16_to_fp32(static_cast<uint16_t>(b));
    if (std::isnan(f)) continue;
    ASSERT_EQ(b, fp32_to_bf16(f)) << std::hex << b;
  }
}

TEST(Quant, TypeTable) {
  EXPECT_EQ(dtype_info(4), nullptr);
  EXPECT_EQ(dtype_info(16), nullptr);  // IQ2_XXS: a GGML type we do not load
  EXPECT_EQ(dtype_info(21), nullptr);  // IQ3_S
  EXPECT_EQ(dtype_name(DType::IQ4_XS), "IQ4_XS");
  EXPECT_EQ(info(DType::IQ4_NL).block_size, 32);
  EXPECT_EQ(row_bytes(DType::Q5_K, 512), 352u);
  EXPECT_EQ(row_bytes(DType::Q3_K, 256), 110u);
  EXPECT_EQ(row_bytes(DType::Q2_K, 256), 84u);
  EXPECT_EQ(row_bytes(DType::IQ4_XS, 256), 136u);
  EXPECT_EQ(dtype_name(DType::Q4_K), "Q4_K");
  EXPECT_EQ(info(DType::Q8_0).block_size, 32);
  EXPECT_EQ(info(DType::Q8_0).block_bytes, 34);
  EXPECT_FALSE(info(DType::Q8_K).weight_type);
  EXPECT_EQ(row_bytes(DType::Q4_0, 64), 36u);
  EXPECT_EQ(row_bytes(DType::Q6_K, 512), 420u);
  EXPECT_EQ(row_bytes(DType::F32, 3), 12u);
  EXPECT_EQ(row_bytes(DType::BF16, 5), 10u);
}

}  // namespace
}  // namespace ss::model
