// The fused decode layer's kernels (kernels/decode.cu) against host references in double over the
// same bf16 inputs, launched with programmatic dependent launch as the backend launches them, outputs
// poisoned first; and the property the backend relies on for batch invariance: a row's result is
// bit-for-bit the same whatever batch it is computed in.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "gpu_test_util.h"
#include "model/quant.h"

namespace ss::cuda::test {
namespace {

using namespace ss::cuda::kern;

// The kernel's staged input: bf16(x * inv * w) with inv = 1 / rms in fp32. The host computes the
// same in double; where a product lies within 1e-5 (relative) of a bf16 rounding midpoint the two
// may round apart, and that element's full ulp enters the tolerance (`slack`).
struct Normed {
  std::vector<double> xn;     // [K]
  std::vector<double> slack;  // [K]: 0, or one bf16 ulp of xn
  std::vector<double> exact;  // [K]: x * inv * w before the bf16 rounding
};
Normed host_norm(const float* x, const std::vector<float>& w, int K, double eps) {
  double ss = 0;
  for (int k = 0; k < K; ++k) ss += static_cast<double>(x[k]) * x[k];
  const double inv = 1.0 / std::sqrt(ss / K + eps);
  Normed n{std::vector<double>(K), std::vector<double>(K, 0.0), std::vector<double>(K)};
  for (int k = 0; k < K; ++k) {
    const double t = x[k] * inv * w[k];
    n.exact[k] = t;
    const float r = from_bf16(to_bf16(static_cast<float>(t)));
    n.xn[k] = r;
    // distance to the nearest rounding midpoint: half an ulp either side of r
    const double ulp = std::abs(static_cast<double>(from_bf16(static_cast<uint16_t>(to_bf16(r) + 1))) - r);
    const double mid_dist = std::abs(std::abs(t - r) - ulp / 2);
    if (mid_dist < 1e-5 * std::abs(t) + 1e-30) n.slack[k] = ulp;
  }
  return n;
}

struct Dot {
  double v, mag, slack;
};
Dot host_dot(const float* w, const Normed& n, int K) {
  Dot d{0, 0, 0};
  for (int k = 0; k < K; ++k) {
    const double t = static_cast<double>(w[k]) * n.xn[k];
    d.v += t, d.mag += std::abs(t), d.slack += std::abs(static_cast<double>(w[k])) * n.slack[k];
  }
  return d;
}

// The norm ops' input as 8-bit blocks (dec_int8_acts: Q4_0), by the CPU backend's rule
// (cpu/act_quant.h): per 32 values d = amax / 127 and q = round-to-nearest-even(x * (1 / d)) in
// float, of the fp32 normalised values; the dot product is then sum(w q d). The kernel's fp32 values
// differ from the host's by its rsqrtf and roundings (~1e-6 relative, so x / d by < 2e-4): where
// x / d lies within 1e-3 of a rounding midpoint the two may round apart, and one quantum (d |w|)
// enters `slack`.
Dot host_dot_i8(const float* w, const Normed& n, int K) {
  Dot r{0, 0, 0};
  for (int c = 0; c < K / 32; ++c) {
    float v[32], am = 0.0f;
    for (int i = 0; i < 32; ++i) v[i] = static_cast<float>(n.exact[32 * c + i]), am = std::max(am, std::fabs(v[i]));
    const float d = am / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int i = 0; i < 32; ++i) {
      const float y = v[i] * id;
      const double q = std::nearbyint(y), wk = w[32 * c + i];
      const double t = wk * q * d;
      r.v += t, r.mag += std::abs(t);
      if (std::abs(std::abs(static_cast<double>(y) - std::floor(static_cast<double>(y))) - 0.5) < 1e-3)
        r.slack += std::abs(wk) * d;
    }
  }
  return r;
}
// The norm ops' activation path for a scope (dec_set_int8_acts), back to the default after.
struct I8Mode {
  explicit I8Mode(int on) { dec_set_int8_acts(on); }
  ~I8Mode() { dec_set_int8_acts(-1); }
  I8Mode(const I8Mode&) = delete;
  I8Mode& operator=(const I8Mode&) = delete;
};
// The host reference for a norm op over weights of format f (as the kernels run it now).
Dot host_dot_f(WFormat f, const float* w, const Normed& n, int K) {
  return dec_int8_acts(f) ? host_dot_i8(w, n, K) : host_dot(w, n, K);
}

TEST(GpuDecode, AddAccumulatesIntoTheResidual) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(31);
  // K 14336 and 14368 (449 chunks, an odd number of rounds a warp) run the pipelined loop.
  for (auto [N, K] : {std::pair{577, 576}, std::pair{1003, 2048}, std::pair{64, 14336}, std::pair{64, 14368},
                      std::pair{1, 32}}) {
    std::vector<float> wf;
    auto W = random_bf16(rng, static_cast<size_t>(N) * K, -1, 1, &wf);
    DeviceBuf<uint16_t> dW(W);
    for (int batch : {1, 3, 8}) {
      std::vector<float> xf;
      auto x = random_bf16(rng, static_cast<size_t>(batch) * K, -1, 1, &xf);
      const auto r0 = random_f32(rng, static_cast<size_t>(batch) * N, -2, 2);
      DeviceBuf<uint16_t> dx(x);
      DeviceBuf<float> dr(r0);
      LAUNCH_OK(dec_add(bf16_weights(dW.get()), dx.get(), dr.get(), N, K, batch, true, nullptr));
      const auto r = dr.download();
      for (int b = 0; b < batch; ++b)
        for (int n = 0; n < N; ++n) {
          double acc = r0[static_cast<size_t>(b) * N + n], m = std::abs(acc);
          for (int k = 0; k < K; ++k) {
            const double t = static_cast<double>(wf[static_cast<size_t>(n) * K + k]) * xf[static_cast<size_t>(b) * K + k];
            acc += t, m += std::abs(t);
          }
          ASSERT_NEAR(r[static_cast<size_t>(b) * N + n], acc, 1e-5 * m + 1e-6) << "N=" << N << " K=" << K << " b=" << b << " n=" << n;
        }
    }
  }
  EXPECT_FALSE(dec_add(bf16_weights(nullptr), nullptr, nullptr, 16, 48, 1, true, nullptr).ok());  // K % 32
  EXPECT_FALSE(dec_add(bf16_weights(nullptr), nullptr, nullptr, 16, 16, 9, true, nullptr).ok());
}

TEST(GpuDecode, NormGemvMatchesHostAndIsBatchInvariant) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(32);
  for (auto [N, K] : {std::pair{1001, 576}, std::pair{515, 2048}, std::pair{33, 4096}, std::pair{20, 4128}}) {
    std::vector<float> wf;
    auto W = random_bf16(rng, static_cast<size_t>(N) * K, -1, 1, &wf);
    const auto nw = random_f32(rng, K, 0.5f, 1.5f);
    const int n_resid = 11;
    const auto resid = random_f32(rng, static_cast<size_t>(n_resid) * K, -3, 3);
    DeviceBuf<uint16_t> dW(W);
    DeviceBuf<float> dnw(nw), dres(resid);
    std::vector<int32_t> rows = {7, 0, 10, 3, 3, 9, 1, 5};
    DeviceBuf<int32_t> drows(rows);
    DeviceBuf<float> dy(8 * static_cast<size_t>(N)), dy1(static_cast<size_t>(N));
    dy.poison();
    LAUNCH_OK(dec_norm_gemv(bf16_weights(dW.get()), dres.get(), drows.get(), dnw.get(), 1e-5f, dy.get(), N, K, 8, true, nullptr));
    const auto y = dy.download();
    for (int b = 0; b < 8; ++b) {
      const Normed xn = host_norm(resid.data() + static_cast<size_t>(rows[b]) * K, nw, K, 1e-5);
      for (int n = 0; n < N; ++n) {
        const Dot d = host_dot(wf.data() + static_cast<size_t>(n) * K, xn, K);
        ASSERT_NEAR(y[static_cast<size_t>(b) * N + n], d.v, 1e-5 * d.mag + d.slack + 1e-6) << "N=" << N << " b=" << b << " n=" << n;
      }
    }
    // The same rows one at a time and three at a time: bit-identical results.
    for (int b = 0; b < 8; ++b) {
      dy1.poison();
      LAUNCH_OK(dec_norm_gemv(bf16_weights(dW.get()), dres.get(), drows.get() + b, dnw.get(), 1e-5f, dy1.get(), N, K, 1, true, nullptr));
      const auto y1 = dy1.download();
      ASSERT_EQ(0, std::memcmp(y1.data(), y.data() + static_cast<size_t>(b) * N, sizeof(float) * N)) << "row " << b;
    }
    DeviceBuf<float> dy3(3 * static_cast<size_t>(N));
    LAUNCH_OK(dec_norm_gemv(bf16_weights(dW.get()), dres.get(), drows.get() + 2, dnw.get(), 1e-5f, dy3.get(), N, K, 3, true, nullptr));
    const auto y3 = dy3.download();
    ASSERT_EQ(0, std::memcmp(y3.data(), y.data() + 2 * static_cast<size_t>(N), sizeof(float) * 3 * N));
  }
  EXPECT_FALSE(dec_norm_gemv(bf16_weights(nullptr), nullptr, nullptr, nullptr, 1e-5f, nullptr, 16, 16 * 1024 * 1024, 8, true, nullptr).ok());
}

TEST(GpuDecode, GateUpMatchesHost) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(33);
  for (auto [F, K] : {std::pair{1536, 576}, std::pair{1001, 2048}, std::pair{200, 4192}}) {  // 4192: pipelined
    std::vector<float> wf;
    auto W = random_bf16(rng, static_cast<size_t>(2 * F) * K, -1, 1, &wf);
    const auto nw = random_f32(rng, K, 0.5f, 1.5f);
    DeviceBuf<uint16_t> dW(W);
    DeviceBuf<float> dnw(nw);
    for (int batch : {1, 3, 8}) {
      const auto resid = random_f32(rng, static_cast<size_t>(batch) * K, -2, 2);
      DeviceBuf<float> dres(resid);
      DeviceBuf<uint16_t> dact(static_cast<size_t>(batch) * F);
      dact.poison();
      LAUNCH_OK(dec_gate_up(bf16_weights(dW.get()), dres.get(), dnw.get(), 1e-6f, dact.get(), F, K, batch, true, nullptr));
      const auto act = dact.download();
      for (int b = 0; b < batch; ++b) {
        const Normed xn = host_norm(resid.data() + static_cast<size_t>(b) * K, nw, K, 1e-6);
        for (int i = 0; i < F; ++i) {
          const Dot g = host_dot(wf.data() + static_cast<size_t>(i) * K, xn, K);
          const Dot u = host_dot(wf.data() + static_cast<size_t>(F + i) * K, xn, K);
          const double sg = g.v / (1 + std::exp(-g.v)), ref = sg * u.v;
          const double eg = 1e-5 * g.mag + g.slack, eu = 1e-5 * u.mag + u.slack;
          // bf16 rounding of the result, plus the dot products' error carried through silu * up
          const double tol = std::abs(ref) / 256 + eg * std::abs(u.v) * 1.1 + std::abs(sg) * eu + 1e-6;
          ASSERT_NEAR(from_bf16(act[static_cast<size_t>(b) * F + i]), ref, tol) << "F=" << F << " b=" << b << " i=" << i;
        }
      }
    }
  }
}

TEST(GpuDecode, QkvRotatesAndStoresFromTheNormalisedResidual) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(34);
  struct Shape { int n_heads, n_kv, hd, rope_dim, K; };
  for (Shape sh : {Shape{9, 3, 64, 64, 576}, Shape{8, 2, 128, 128, 2048}, Shape{4, 2, 128, 64, 256},
                   Shape{4, 2, 128, 64, 4160}}) {  // K 4160: the pipelined loop, an odd number of rounds
    for (bool inter : {false, true}) {
      for (int batch : {1, 3, 8}) {
        const int max_pos = 2048, max_blocks = max_pos / kBlockTokens, rows = (sh.n_heads + 2 * sh.n_kv) * sh.hd;
        std::vector<float> wf;
        auto W = random_bf16(rng, static_cast<size_t>(rows) * sh.K, -1, 1, &wf);
        const auto nw = random_f32(rng, sh.K, 0.5f, 1.5f);
        const auto resid = random_f32(rng, static_cast<size_t>(batch) * sh.K, -2, 2);
        std::vector<float> cs(static_cast<size_t>(max_pos) * sh.rope_dim);
        for (int p = 0; p < max_pos; ++p)
          for (int i = 0; i < sh.rope_dim / 2; ++i) {
            const double a = p * std::pow(10000.0, -2.0 * i / sh.rope_dim);
            cs[p * sh.rope_dim + i] = static_cast<float>(std::cos(a));
            cs[p * sh.rope_dim + sh.rope_dim / 2 + i] = static_cast<float>(std::sin(a));
          }
        std::vector<int32_t> tables(static_cast<size_t>(batch) * max_blocks);
        std::iota(tables.begin(), tables.end(), 0);
        std::shuffle(tables.begin(), tables.end(), rng);
        std::vector<int32_t> pos(batch), seq(batch);
        std::uniform_int_distribution<int> pd(0, max_pos - 1);
        for (int b = 0; b < batch; ++b) pos[b] = b == 0 ? max_pos - 1 : pd(rng), seq[b] = b;
        const size_t cache_sz = static_cast<size_t>(batch) * max_blocks * 2 * sh.n_kv * kBlockTokens * sh.hd;
        DeviceBuf<uint16_t> dW(W), dcache(cache_sz);
        DeviceBuf<float> dcs(cs), dq(static_cast<size_t>(batch) * sh.n_heads * sh.hd), dnw(nw), dres(resid);
        DeviceBuf<int32_t> dpos(pos), dseq(seq), dtab(tables);
        dq.poison();
        dcache.poison();
        const bool with_bias = batch == 3;
        const auto bias = random_f32(rng, rows, -0.5f, 0.5f);
        DeviceBuf<float> dbias(bias);
        RopeKv a{nullptr, dcs.get(), sh.rope_dim, inter, sh.n_heads, sh.n_kv, sh.hd, dpos.get(), dseq.get(),
                 dtab.get(), max_blocks, dq.get(), dcache.get(), with_bias ? dbias.get() : nullptr, nullptr, nullptr, 0.0f};
        LAUNCH_OK(dec_qkv(bf16_weights(dW.get()), dres.get(), dnw.get(), 1e-5f, sh.K, batch, a, true, nullptr));
        const auto q = dq.download();
        const auto cache = dcache.download();
        for (int b = 0; b < batch; ++b) {
          const Normed xn = host_norm(resid.data() + static_cast<size_t>(b) * sh.K, nw, sh.K, 1e-5);
          std::vector<double> y(rows), err(rows);
          for (int r = 0; r < rows; ++r) {
            const Dot d = host_dot(wf.data() + static_cast<size_t>(r) * sh.K, xn, sh.K);
            y[r] = d.v + (with_bias ? bias[r] : 0.0), err[r] = 1e-5 * (d.mag + (with_bias ? std::abs(bias[r]) : 0)) + d.slack;
          }
          for (int hh = 0; hh < sh.n_heads + 2 * sh.n_kv; ++hh) {
            const bool is_v = hh >= sh.n_heads + sh.n_kv;
            const double* src = y.data() + hh * sh.hd;
            const double* e = err.data() + hh * sh.hd;
            for (int i = 0; i < sh.hd; ++i) {
              double ref = src[i], tol = e[i] + 1e-6;
              if (!is_v && i < sh.rope_dim) {
                const int half = sh.rope_dim / 2;
                int p, j0, j1;
                if (inter) p = i / 2, j0 = 2 * p, j1 = 2 * p + 1;
                else p = i % half, j0 = p, j1 = p + half;
                const double c = cs[pos[b] * sh.rope_dim + p], s = cs[pos[b] * sh.rope_dim + half + p];
                ref = i == j0 ? src[j0] * c - src[j1] * s : src[j1] * c + src[j0] * s;
                tol = e[j0] + e[j1] + 1e-6;
              }
              if (hh < sh.n_heads) {
                ASSERT_NEAR(q[(static_cast<size_t>(b) * sh.n_heads + hh) * sh.hd + i], ref, tol) << "q b=" << b << " h=" << hh << " i=" << i;
              } else {
                const int kvh = is_v ? hh - sh.n_heads - sh.n_kv : hh - sh.n_heads;
                const int blk = tables[seq[b] * max_blocks + pos[b] / kBlockTokens];
                const size_t at = ((static_cast<size_t>(blk) * 2 + is_v) * sh.n_kv + kvh) * kBlockTokens * sh.hd +
                                  static_cast<size_t>(pos[b] % kBlockTokens) * sh.hd + i;
                ASSERT_NEAR(from_bf16(cache[at]), ref, std::abs(ref) / 256 + tol) << "kv b=" << b << " h=" << hh << " i=" << i;
              }
            }
          }
        }
      }
    }
  }
}


// --- packed GGUF weights -------------------------------------------------------------------------
TableType table_type(WFormat f) {
  return f == WFormat::Q4_0 ? TableType::Q4_0 : f == WFormat::Q4_1 ? TableType::Q4_1 : TableType::Q8_0;
}
const char* fname(WFormat f) {
  switch (f) {
    case WFormat::Q4_0: return "Q4_0";
    case WFormat::Q4_1: return "Q4_1";
    case WFormat::Q8_0: return "Q8_0";
    case WFormat::Q4_K: return "Q4_K";
    case WFormat::Q6_K: return "Q6_K";
    case WFormat::Q5_0: return "Q5_0";
    case WFormat::Q5_1: return "Q5_1";
    case WFormat::Q5_K: return "Q5_K";
    default: return "BF16";
  }
}
// Every packed format, and the K (row length) a test of each uses: K-quant rows are whole 256-weight
// super-blocks.
constexpr WFormat kPackedFormats[] = {WFormat::Q4_0, WFormat::Q4_1, WFormat::Q8_0, WFormat::Q4_K,
                                      WFormat::Q6_K, WFormat::Q5_0, WFormat::Q5_1, WFormat::Q5_K};
int k_for(WFormat f, int K) { return is_k_format(f) ? (K + 255) / 256 * 256 : K; }

// GGUF rows packed the device's way, on the host and uploaded; wf: the weights as host_rows reads them.
struct Packed {
  std::vector<uint8_t> q;  // pack_row's rows, one after another
  std::vector<uint16_t> d, m;
  std::vector<float> wf;
  int n = 0, k = 0;  // rows, K
};
// Rows of the 5-bit and K-quant types: random blocks (random quants and sub-block scales, small
// fp16 scales and mins where the block has them); the reference values are the model loader's
// dequantization (checked against the gguf package's in tests/unit/model).
Packed pack_k(std::mt19937& rng, WFormat f, int N, int K) {
  struct Layout {
    ss::model::DType t;
    int weights, bytes, d_at, m_at;  // block size; where d and the min (or dmin) sit (-1: none)
  };
  const Layout L = f == WFormat::Q4_K   ? Layout{ss::model::DType::Q4_K, 256, 144, 0, 2}
                   : f == WFormat::Q5_K ? Layout{ss::model::DType::Q5_K, 256, 176, 0, 2}
                   : f == WFormat::Q6_K ? Layout{ss::model::DType::Q6_K, 256, 210, 208, -1}
                   : f == WFormat::Q5_0 ? Layout{ss::model::DType::Q5_0, 32, 22, 0, -1}
                                        : Layout{ss::model::DType::Q5_1, 32, 24, 0, 2};
  const int sb = K / L.weights, bytes = L.bytes;
  std::vector<uint8_t> raw(static_cast<size_t>(N) * sb * bytes);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(0.0005f, 0.01f), mn(-0.1f, 0.1f);
  for (auto& b : raw) b = static_cast<uint8_t>(byte(rng));
  for (size_t i = 0; i < raw.size() / bytes; ++i) {
    uint8_t* p = raw.data() + i * bytes;
    const uint16_t d = to_f16(scale(rng)), m = to_f16(f == WFormat::Q5_1 ? mn(rng) : scale(rng));
    std::memcpy(p + L.d_at, &d, 2);
    if (L.m_at >= 0) std::memcpy(p + L.m_at, &m, 2);
  }
  Packed p;
  p.n = N, p.k = K;
  p.wf.resize(static_cast<size_t>(N) * K);
  const size_t rq = packed_q_bytes(f, 1, K), rs = packed_scale_count(f, 1, K);
  p.q.resize(rq * N), p.d.resize(rs * N), p.m.resize(rs * N);
  for (int r = 0; r < N; ++r) {
    const uint8_t* row = raw.data() + static_cast<size_t>(r) * sb * bytes;
    ss::model::dequantize_row(L.t, row, p.wf.data() + static_cast<size_t>(r) * K, K);
    const Status st = pack_row(f, row, K, p.q.data() + r * rq, p.d.data() + r * rs, has_min_array(f) ? p.m.data() + r * rs : nullptr);
    EXPECT_TRUE(st.ok()) << st.message();
  }
  return p;
}

Packed pack(std::mt19937& rng, WFormat f, int N, int K) {
  if (f != WFormat::Q4_0 && f != WFormat::Q4_1 && f != WFormat::Q8_0) return pack_k(rng, f, N, K);
  const auto raw = random_blocks(rng, table_type(f), static_cast<size_t>(N) * K / 32);
  Packed p;
  p.n = N, p.k = K;
  p.wf = host_rows(raw, table_type(f), N, K);
  const size_t rq = packed_q_bytes(f, 1, K), rs = packed_scale_count(f, 1, K);
  p.q.resize(rq * N), p.d.resize(rs * N), p.m.resize(rs * N);
  const size_t row_bytes = static_cast<size_t>(K / 32) * (f == WFormat::Q8_0 ? 34 : f == WFormat::Q4_0 ? 18 : 20);
  for (int r = 0; r < N; ++r) {
    const Status st = pack_row(f, raw.data() + r * row_bytes, K, p.q.data() + r * rq, p.d.data() + r * rs,
                               f == WFormat::Q4_1 ? p.m.data() + r * rs : nullptr);
    EXPECT_TRUE(st.ok()) << st.message();
  }
  return p;
}

// Host only (runs without a GPU): the packed layout holds exactly the GGUF values.
TEST(GpuDecodePacked, PackThenUnpackGivesTheGgufValues) {
  std::mt19937 rng(40);
  for (WFormat f : kPackedFormats)
    for (int K0 : {32, 96, 576, 4096, 14336 + 32}) {
      const int K = k_for(f, K0);
      const int N = 3;
      const Packed p = pack(rng, f, N, K);
      std::vector<float> out(K);
      for (int r = 0; r < N; ++r) {
        const size_t rq = packed_q_bytes(f, 1, K), rs = packed_scale_count(f, 1, K);
        unpack_row(f, p.q.data() + r * rq, p.d.data() + r * rs, p.m.data() + r * rs, K, from_f16, out.data());
        for (int k = 0; k < K; ++k)
          ASSERT_EQ(out[k], p.wf[static_cast<size_t>(r) * K + k]) << fname(f) << " K=" << K << " row " << r << " k " << k;
      }
    }
  uint8_t q[16];
  uint16_t d[8];
  EXPECT_FALSE(pack_row(WFormat::Q4_0, q, 48, q, d, nullptr).ok());   // K % 32
  EXPECT_FALSE(pack_row(WFormat::Q4_K, q, 288, q, d, nullptr).ok());  // K % 256
}

// The rows of p blocked as the device holds them (to_groups).
std::vector<uint8_t> blocked(const Packed& p, WFormat f) {
  std::vector<uint8_t> b(packed_bytes(f, p.n, p.k));
  to_groups(f, p.n, p.k, p.q.data(), p.d.data(), p.m.data(), b.data());
  return b;
}
// Host only: the groups layout (to_groups) holds each row's every round with the 8 rows of a group's
// round contiguous (quants, then scales, then mins) and the rows that pad the matrix to a multiple
// of 8 zero; packed_at, which the kernels address through, finds them there and in the rows layout.
TEST(GpuDecodePacked, BothLayoutsHoldEveryRoundOfEveryRow) {
  std::mt19937 rng(41);
  for (WFormat f : kPackedFormats) {
    const int K = k_for(f, 576), N = 13;  // 3 rounds (K formats: 768), two groups, 3 padding rows
    const Packed p = pack(rng, f, N, K);
    const std::vector<uint8_t> b = blocked(p, f);
    const PackGeom g = pack_geom(f);
    const int64_t rounds = packed_k(K) / 256, per = g.q + g.d + g.m;
    ASSERT_EQ(b.size(), static_cast<size_t>(16 * rounds * per)) << fname(f);
    const uint8_t* d8 = reinterpret_cast<const uint8_t*>(p.d.data());
    const uint8_t* m8 = reinterpret_cast<const uint8_t*>(p.m.data());
    // The groups layout by its definition: row r's round R in the block of group r / 8's round R.
    const auto at = [&](int r, int64_t R) { return (r / 8 * rounds + R) * 8 * per; };
    const PackedAt pg = packed_at(DevWeights{f, b.data(), nullptr, nullptr, true}, K);
    const PackedAt pr = packed_at(DevWeights{f, p.q.data(), p.d.data(), has_min_array(f) ? p.m.data() : nullptr}, K);
    for (int r = 0; r < 16; ++r)
      for (int64_t R = 0; R < rounds; ++R) {
        const int64_t oq = at(r, R) + (r % 8) * g.q, od = at(r, R) + 8 * g.q + (r % 8) * g.d,
                      om = at(r, R) + 8 * (g.q + g.d) + (r % 8) * g.m;
        for (int i = 0; i < g.q; ++i)
          ASSERT_EQ(b[oq + i], r < N ? p.q[(r * rounds + R) * g.q + i] : 0) << fname(f) << " q " << r;
        for (int i = 0; i < g.d; ++i)
          ASSERT_EQ(b[od + i], r < N ? d8[(r * rounds + R) * g.d + i] : 0) << fname(f) << " d " << r;
        for (int i = 0; i < g.m; ++i)
          ASSERT_EQ(b[om + i], r < N ? m8[(r * rounds + R) * g.m + i] : 0) << fname(f) << " m " << r;
        // What the kernels address (packed_at): these places in the groups layout, and pack_row's
        // rows, arrays apart, in the rows layout.
        EXPECT_EQ(part_at(pg.q, r, R), b.data() + oq);
        EXPECT_EQ(part_at(pg.d, r, R), b.data() + od);
        if (g.m > 0) {
          EXPECT_EQ(part_at(pg.m, r, R), b.data() + om);
        }
        if (r >= N) continue;
        EXPECT_EQ(part_at(pr.q, r, R), p.q.data() + (r * rounds + R) * g.q);
        EXPECT_EQ(part_at(pr.d, r, R), d8 + (r * rounds + R) * g.d);
        if (g.m > 0) {
          EXPECT_EQ(part_at(pr.m, r, R), m8 + (r * rounds + R) * g.m);
        }
      }
  }
}

// On the device in the layout the backend uploads (groups_layout(): groups, or rows under SS_CUDA_QLAYOUT=rows).
struct DevPacked {
  DeviceBuf<uint8_t> q;
  DeviceBuf<uint16_t> d, m;
  DevWeights w;
  DevPacked(const Packed& p, WFormat f)
      : q(groups_layout() ? blocked(p, f) : p.q), d(groups_layout() ? std::vector<uint16_t>{0} : p.d),
        m(groups_layout() ? std::vector<uint16_t>{0} : p.m) {
    w = groups_layout() ? DevWeights{f, q.get(), nullptr, nullptr, true}
                        : DevWeights{f, q.get(), d.get(), has_min_array(f) ? m.get() : nullptr};
  }
};

// dec_add with its K split across CTAs (SplitK): shapes whose 16-row tiles leave most warp slots
// idle (Llama-3.2-1B's down and o_proj, 128 tiles; a 37-tile one that splits 4 ways) against the host
// in double, at batches 1, 3 and 8; the split ran (its partials overwrote the poisoned workspace);
// the tickets are left at zero, so a second launch (as a graph replays) is right too; and a row's
// result is bit-for-bit the same alone and in a batch of 8.
void check_split_add(std::mt19937& rng, const DevWeights& w, const std::vector<float>& wf, int N, int K,
                     const std::string& what) {
  const int max_ks = 4;
  DeviceBuf<float> part(static_cast<size_t>(splitk_part_floats(N, max_ks)));
  DeviceBuf<unsigned> tickets(static_cast<size_t>((N + 15) / 16));
  ASSERT_TRUE(part.ok() && tickets.ok());
  CUDA_OK(cudaMemset(tickets.get(), 0, tickets.size() * sizeof(unsigned)));
  SplitK sk{part.get(), tickets.get(), static_cast<int64_t>(part.size()), static_cast<int>(tickets.size()), max_ks};
  std::vector<float> xf8;
  const auto x8 = random_bf16(rng, static_cast<size_t>(8) * K, -1, 1, &xf8);
  const auto r8 = random_f32(rng, static_cast<size_t>(8) * N, -2, 2);
  DeviceBuf<uint16_t> dx(x8);
  std::vector<float> row0;
  for (int batch : {1, 3, 8}) {
    for (int launch = 0; launch < 2; ++launch) {
      part.poison();
      DeviceBuf<float> dr(std::vector<float>(r8.begin(), r8.begin() + static_cast<size_t>(batch) * N));
      LAUNCH_OK(dec_add(w, dx.get(), dr.get(), N, K, batch, true, nullptr, &sk));
      const auto r = dr.download();
      const auto pw = part.download();
      uint32_t bits = 0;
      std::memcpy(&bits, &pw[0], 4);
      ASSERT_NE(bits, 0xFFFFFFFFu) << what << ": the K split did not run (tile 0's partials still poisoned)";
      for (unsigned v : tickets.download()) ASSERT_EQ(v, 0u) << what << ": a ticket was not left at zero";
      for (int b = 0; b < batch; ++b)
        for (int n = 0; n < N; ++n) {
          double acc = r8[static_cast<size_t>(b) * N + n], m = std::abs(acc);
          for (int k = 0; k < K; ++k) {
            const double t = static_cast<double>(wf[static_cast<size_t>(n) * K + k]) * xf8[static_cast<size_t>(b) * K + k];
            acc += t, m += std::abs(t);
          }
          ASSERT_NEAR(r[static_cast<size_t>(b) * N + n], acc, 1e-5 * m + 1e-6)
              << what << " N=" << N << " K=" << K << " batch " << batch << " b=" << b << " n=" << n;
        }
      if (batch == 1) row0.assign(r.begin(), r.begin() + N);
      else ASSERT_EQ(0, std::memcmp(row0.data(), r.data(), sizeof(float) * N)) << what << ": row 0 at batch " << batch;
    }
  }
}

TEST(GpuDecode, AddSplitAcrossCtasMatchesHost) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(33);
  for (auto [N, K] : {std::pair{2048, 8192}, std::pair{2048, 2048}, std::pair{577, 4096}}) {
    std::vector<float> wf;
    auto W = random_bf16(rng, static_cast<size_t>(N) * K, -1, 1, &wf);
    DeviceBuf<uint16_t> dW(W);
    check_split_add(rng, bf16_weights(dW.get()), wf, N, K, "bf16");
    if (HasFatalFailure()) return;
  }
}

TEST(GpuDecodePacked, AddAndNormGemvMatchHostOverPackedWeights) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(41);
  // The last shape has 2112 tiles of 16 rows: on 132 SMs the K split picks S = 1 (the others pick 8),
  // so the split's other paths run too. The norm op under both activation paths (dec_int8_acts); the
  // adds, which have one, under the first.
  for (int i8 : {0, 1})
  for (WFormat f : kPackedFormats)
    for (auto [N, K0] : {std::pair{577, 576}, std::pair{1003, 2048}, std::pair{64, 14336}, std::pair{33792, 768}}) {
      const int K = k_for(f, K0);
      const Packed p = pack(rng, f, N, K);
      DevPacked dp(p, f);
      for (int batch : {1, 3, 8}) {
        if (i8 == 1) break;  // the adds take bf16 inputs on either path: checked once
        std::vector<float> xf;
        auto x = random_bf16(rng, static_cast<size_t>(batch) * K, -1, 1, &xf);
        const auto r0 = random_f32(rng, static_cast<size_t>(batch) * N, -2, 2);
        DeviceBuf<uint16_t> dx(x);
        DeviceBuf<float> dr(r0);
        LAUNCH_OK(dec_add(dp.w, dx.get(), dr.get(), N, K, batch, true, nullptr));
        const auto r = dr.download();
        for (int b = 0; b < batch; ++b)
          for (int n = 0; n < N; ++n) {
            double acc = r0[static_cast<size_t>(b) * N + n], mg = std::abs(acc);
            for (int k = 0; k < K; ++k) {
              const double t = static_cast<double>(p.wf[static_cast<size_t>(n) * K + k]) * xf[static_cast<size_t>(b) * K + k];
              acc += t, mg += std::abs(t);
            }
            ASSERT_NEAR(r[static_cast<size_t>(b) * N + n], acc, 1e-5 * mg + 1e-6)
                << fname(f) << " add N=" << N << " K=" << K << " b=" << b << " n=" << n;
          }
      }
      if (K > 4096) continue;  // the norm ops stage batch x K in shared memory
      const I8Mode mode(i8);
      SCOPED_TRACE(i8 ? "8-bit activations" : "bf16 activations");
      const auto nw = random_f32(rng, K, 0.5f, 1.5f);
      const auto resid = random_f32(rng, 8 * static_cast<size_t>(K), -3, 3);
      DeviceBuf<float> dnw(nw), dres(resid), dy(8 * static_cast<size_t>(N)), dy1(static_cast<size_t>(N));
      dy.poison();
      LAUNCH_OK(dec_norm_gemv(dp.w, dres.get(), nullptr, dnw.get(), 1e-5f, dy.get(), N, K, 8, true, nullptr));
      const auto y = dy.download();
      for (int b = 0; b < 8; ++b) {
        const Normed xn = host_norm(resid.data() + static_cast<size_t>(b) * K, nw, K, 1e-5);
        for (int n = 0; n < N; ++n) {
          const Dot d = host_dot_f(f, p.wf.data() + static_cast<size_t>(n) * K, xn, K);
          ASSERT_NEAR(y[static_cast<size_t>(b) * N + n], d.v, 1e-5 * d.mag + d.slack + 1e-6)
              << fname(f) << " norm N=" << N << " K=" << K << " b=" << b << " n=" << n;
        }
      }
      dy1.poison();  // batch invariance over packed weights too
      LAUNCH_OK(dec_norm_gemv(dp.w, dres.get() + 5 * static_cast<size_t>(K), nullptr, dnw.get(), 1e-5f, dy1.get(), N, K, 1,
                              true, nullptr));
      const auto y1 = dy1.download();
      ASSERT_EQ(0, std::memcmp(y1.data(), y.data() + 5 * static_cast<size_t>(N), sizeof(float) * N)) << fname(f);
    }
}

// dec_gate_up's output (eps 1e-6) over packed weights against the host: SiLU(gate) * up from the
// format's dot products of the normed rows, within the bf16 output's rounding and the dots' bounds.
void check_gate_up(WFormat f, const Packed& p, const std::vector<uint16_t>& act, const std::vector<float>& resid,
                   const std::vector<float>& nw, int F, int K, int batch) {
  for (int b = 0; b < batch; ++b) {
    const Normed xn = host_norm(resid.data() + static_cast<size_t>(b) * K, nw, K, 1e-6);
    for (int i = 0; i < F; ++i) {
      const Dot g = host_dot_f(f, p.wf.data() + static_cast<size_t>(i) * K, xn, K);
      const Dot u = host_dot_f(f, p.wf.data() + static_cast<size_t>(F + i) * K, xn, K);
      const double sg = g.v / (1 + std::exp(-g.v)), ref = sg * u.v;
      const double tol = std::abs(ref) / 256 + (1e-5 * g.mag + g.slack) * std::abs(u.v) * 1.1 +
                         std::abs(sg) * (1e-5 * u.mag + u.slack) + 1e-6;
      ASSERT_NEAR(from_bf16(act[static_cast<size_t>(b) * F + i]), ref, tol) << fname(f) << " gate/up b=" << b << " i=" << i;
    }
  }
}

TEST(GpuDecodePacked, GateUpAndQkvRunOverPackedWeights) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(42);
  for (int i8 : {0, 1})
  for (WFormat f : kPackedFormats) {
    const I8Mode mode(i8);
    SCOPED_TRACE(i8 ? "8-bit activations" : "bf16 activations");
    // gate/up: F = 1001, K = 2048, batch 3
    const int F = 1001, K = 2048, batch = 3;
    const Packed p = pack(rng, f, 2 * F, K);
    DevPacked dp(p, f);
    const auto nw = random_f32(rng, K, 0.5f, 1.5f);
    const auto resid = random_f32(rng, static_cast<size_t>(batch) * K, -2, 2);
    DeviceBuf<float> dnw(nw), dres(resid);
    DeviceBuf<uint16_t> dact(static_cast<size_t>(batch) * F);
    dact.poison();
    LAUNCH_OK(dec_gate_up(dp.w, dres.get(), dnw.get(), 1e-6f, dact.get(), F, K, batch, true, nullptr));
    check_gate_up(f, p, dact.download(), resid, nw, F, K, batch);
    if (HasFatalFailure()) return;
    // QKV: q of one head shape against the host, K and V stored (the rotation itself is the bf16
    // test's; here only that packed rows land where bf16 rows do).
    const int nh = 4, nkv = 2, hd = 64, Kq = k_for(f, 576), rows = (nh + 2 * nkv) * hd, max_blocks = 4;
    const Packed pq = pack(rng, f, rows, Kq);
    DevPacked dq_w(pq, f);
    // Position 0 with rope_dim 2 (cos 1, sin 0): no rotation, so q and K, V are W . xn.
    std::vector<float> cs = {1.0f, 0.0f};
    const auto nwq = random_f32(rng, Kq, 0.5f, 1.5f);
    const auto rq = random_f32(rng, Kq, -2, 2);
    std::vector<int32_t> pos = {0}, seq = {0}, tables = {0, 1, 2, 3};
    DeviceBuf<float> dcs(cs), dnwq(nwq), drq(rq), dqo(static_cast<size_t>(nh) * hd);
    DeviceBuf<int32_t> dpos(pos), dseq(seq), dtab(tables);
    DeviceBuf<uint16_t> dcache(static_cast<size_t>(max_blocks) * 2 * nkv * kBlockTokens * hd);
    dqo.poison();
    dcache.poison();
    RopeKv a{nullptr, dcs.get(), 2, false, nh, nkv, hd, dpos.get(), dseq.get(), dtab.get(), max_blocks, dqo.get(),
             dcache.get(), nullptr, nullptr, nullptr, 0.0f};
    LAUNCH_OK(dec_qkv(dq_w.w, drq.get(), dnwq.get(), 1e-5f, Kq, 1, a, true, nullptr));
    const auto q = dqo.download();
    const auto cache = dcache.download();
    const Normed xn = host_norm(rq.data(), nwq, Kq, 1e-5);
    for (int r = 0; r < rows; ++r) {
      const Dot d = host_dot_f(f, pq.wf.data() + static_cast<size_t>(r) * Kq, xn, Kq);
      const double tol = 1e-5 * d.mag + d.slack + 1e-6;
      const int hh = r / hd, i = r % hd;
      if (hh < nh) {
        ASSERT_NEAR(q[r], d.v, tol) << fname(f) << " q row " << r;
      } else {
        const bool is_v = hh >= nh + nkv;
        const int kvh = is_v ? hh - nh - nkv : hh - nh;
        const size_t at = ((0 * 2 + (is_v ? 1 : 0)) * static_cast<size_t>(nkv) + kvh) * kBlockTokens * hd + i;
        ASSERT_NEAR(from_bf16(cache[at]), d.v, std::abs(d.v) / 256 + tol) << fname(f) << " kv row " << r;
      }
    }
  }
}

// 8B's gate/up and lm_head shapes in miniature: K = 4096 (128 chunks: S = 8 warps a tile, two
// rounds a warp) and more tiles than the grid has CTAs, so warps loop over tiles and the next tile's
// rounds load during a reduction. The other packed tests' shapes give every warp one tile of one
// round; these are the paths the pipelined packed loop takes (Q4_0's default; Q4_K's with
// SS_CUDA_DEC_QPIPE=1; neither with =0).
// Batch 3 against the host; batch 1 bit-identical to its row of batch 3.
TEST(GpuDecodePacked, WarpsLoopOverTilesAndRoundsOnPackedWeights) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(44);
  const int K = 4096, F = 4096, N = 8192, batch = 3;
  for (WFormat f : {WFormat::Q4_0, WFormat::Q4_K, WFormat::Q4_1}) {
    SCOPED_TRACE(fname(f));
    const Packed p = pack(rng, f, 2 * F, K);  // gate/up: 2F rows; lm_head: the same N = 2F rows
    DevPacked dp(p, f);
    const auto nw = random_f32(rng, K, 0.5f, 1.5f);
    const auto resid = random_f32(rng, static_cast<size_t>(batch) * K, -2, 2);
    DeviceBuf<float> dnw(nw), dres(resid), dy(static_cast<size_t>(batch) * N), dy1(static_cast<size_t>(N));
    DeviceBuf<uint16_t> dact(static_cast<size_t>(batch) * F), dact1(static_cast<size_t>(F));
    dact.poison(), dact1.poison(), dy.poison(), dy1.poison();
    LAUNCH_OK(dec_gate_up(dp.w, dres.get(), dnw.get(), 1e-6f, dact.get(), F, K, batch, true, nullptr));
    LAUNCH_OK(dec_gate_up(dp.w, dres.get() + K, dnw.get(), 1e-6f, dact1.get(), F, K, 1, true, nullptr));
    LAUNCH_OK(dec_norm_gemv(dp.w, dres.get(), nullptr, dnw.get(), 1e-5f, dy.get(), N, K, batch, true, nullptr));
    LAUNCH_OK(dec_norm_gemv(dp.w, dres.get() + K, nullptr, dnw.get(), 1e-5f, dy1.get(), N, K, 1, true, nullptr));
    const auto act = dact.download(), act1 = dact1.download();
    const auto y = dy.download(), y1 = dy1.download();
    check_gate_up(f, p, act, resid, nw, F, K, batch);
    if (HasFatalFailure()) return;
    for (int b = 0; b < batch; ++b) {
      const Normed g5 = host_norm(resid.data() + static_cast<size_t>(b) * K, nw, K, 1e-5);
      for (int n = 0; n < N; ++n) {
        const Dot d = host_dot_f(f, p.wf.data() + static_cast<size_t>(n) * K, g5, K);
        ASSERT_NEAR(y[static_cast<size_t>(b) * N + n], d.v, 1e-5 * d.mag + d.slack + 1e-6) << "lm_head b=" << b << " n=" << n;
      }
    }
    ASSERT_EQ(0, std::memcmp(act1.data(), act.data() + F, sizeof(uint16_t) * F)) << "gate/up batch 1 vs its row of 3";
    ASSERT_EQ(0, std::memcmp(y1.data(), y.data() + N, sizeof(float) * N)) << "lm_head batch 1 vs its row of 3";
  }
}

// A tile's K split over S = 1, 2, 4 and 8 warps (dec_set_s), whichever the shape's rule would pick:
// S = 1 takes no cross-warp reduction, S = 8 a reduction a round. On 8B's gate/up and lm_head shapes
// in miniature (K = 4096, 512 tiles) and an add of 14336 long rows (448 chunks, several rounds a
// warp at every S), per packed format with a pipelined loop (Q4_0, Q4_K) and one without (Q4_1):
// batch 3 against the host, batch 1 bit-identical to its row of 3 (the sums' order depends on S,
// never on the batch), the products' outputs poisoned first.
TEST(GpuDecodePacked, EveryWarpSplitOfATileMatchesHost) {
  SKIP_WITHOUT_GPU();
  struct Reset {
    ~Reset() { dec_set_s(0); }
  } reset;
  std::mt19937 rng(46);
  const int K = 4096, F = 4096, N = 8192, batch = 3, Na = 96, Ka = 14336;
  for (WFormat f : {WFormat::Q4_0, WFormat::Q4_K, WFormat::Q4_1}) {
    SCOPED_TRACE(fname(f));
    const Packed p = pack(rng, f, 2 * F, K);  // gate/up: 2F rows; lm_head: the same N = 2F rows
    const Packed pa = pack(rng, f, Na, Ka);
    DevPacked dp(p, f), dpa(pa, f);
    const auto nw = random_f32(rng, K, 0.5f, 1.5f);
    const auto resid = random_f32(rng, static_cast<size_t>(batch) * K, -2, 2);
    std::vector<float> xf;
    const auto x = random_bf16(rng, static_cast<size_t>(batch) * Ka, -1, 1, &xf);
    const auto r0 = random_f32(rng, static_cast<size_t>(batch) * Na, -2, 2);
    DeviceBuf<float> dnw(nw), dres(resid), dy(static_cast<size_t>(batch) * N), dy1(static_cast<size_t>(N));
    DeviceBuf<float> dr(r0), dr1(static_cast<size_t>(Na));
    DeviceBuf<uint16_t> dact(static_cast<size_t>(batch) * F), dact1(static_cast<size_t>(F)), dx(x);
    for (int S : {1, 2, 4, 8}) {
      SCOPED_TRACE("S = " + std::to_string(S));
      dec_set_s(S);
      dact.poison(), dact1.poison(), dy.poison(), dy1.poison();
      dr.upload(r0);
      dr1.upload(std::vector<float>(r0.begin() + Na, r0.begin() + 2 * Na));
      LAUNCH_OK(dec_gate_up(dp.w, dres.get(), dnw.get(), 1e-6f, dact.get(), F, K, batch, true, nullptr));
      LAUNCH_OK(dec_gate_up(dp.w, dres.get() + K, dnw.get(), 1e-6f, dact1.get(), F, K, 1, true, nullptr));
      LAUNCH_OK(dec_norm_gemv(dp.w, dres.get(), nullptr, dnw.get(), 1e-5f, dy.get(), N, K, batch, true, nullptr));
      LAUNCH_OK(dec_norm_gemv(dp.w, dres.get() + K, nullptr, dnw.get(), 1e-5f, dy1.get(), N, K, 1, true, nullptr));
      LAUNCH_OK(dec_add(dpa.w, dx.get(), dr.get(), Na, Ka, batch, true, nullptr));
      LAUNCH_OK(dec_add(dpa.w, dx.get() + Ka, dr1.get(), Na, Ka, 1, true, nullptr));
      const auto act = dact.download(), act1 = dact1.download();
      const auto y = dy.download(), y1 = dy1.download(), r = dr.download(), r1 = dr1.download();
      check_gate_up(f, p, act, resid, nw, F, K, batch);
      if (HasFatalFailure()) return;
      for (int b = 0; b < batch; ++b) {
        const Normed g5 = host_norm(resid.data() + static_cast<size_t>(b) * K, nw, K, 1e-5);
        for (int n = 0; n < N; ++n) {
          const Dot d = host_dot_f(f, p.wf.data() + static_cast<size_t>(n) * K, g5, K);
          ASSERT_NEAR(y[static_cast<size_t>(b) * N + n], d.v, 1e-5 * d.mag + d.slack + 1e-6) << "lm_head b=" << b << " n=" << n;
        }
        for (int n = 0; n < Na; ++n) {
          double acc = r0[static_cast<size_t>(b) * Na + n], mg = std::abs(acc);
          for (int k = 0; k < Ka; ++k) {
            const double t = static_cast<double>(pa.wf[static_cast<size_t>(n) * Ka + k]) * xf[static_cast<size_t>(b) * Ka + k];
            acc += t, mg += std::abs(t);
          }
          ASSERT_NEAR(r[static_cast<size_t>(b) * Na + n], acc, 1e-5 * mg + 1e-6) << "add b=" << b << " n=" << n;
        }
      }
      ASSERT_EQ(0, std::memcmp(act1.data(), act.data() + F, sizeof(uint16_t) * F)) << "gate/up batch 1 vs its row of 3";
      ASSERT_EQ(0, std::memcmp(y1.data(), y.data() + N, sizeof(float) * N)) << "lm_head batch 1 vs its row of 3";
      ASSERT_EQ(0, std::memcmp(r1.data(), r.data() + Na, sizeof(float) * Na)) << "add batch 1 vs its row of 3";
    }
  }
}

TEST(GpuDecodePacked, DequantizeWeightsGivesBf16OfTheGgufValues) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(43);
  for (WFormat f : kPackedFormats) {
    const int N = 37, K = k_for(f, 576);
    const Packed p = pack(rng, f, N, K);
    DevPacked dp(p, f);
    DeviceBuf<uint16_t> out(static_cast<size_t>(N) * K);
    out.poison();
    LAUNCH_OK(dequantize_weights(dp.w, N, K, out.get(), nullptr));
    const auto o = out.download();
    for (size_t i = 0; i < o.size(); ++i)
      ASSERT_EQ(o[i], to_bf16(p.wf[i])) << fname(f) << " element " << i;  // bf16 of the exact value
  }
}

TEST(GpuDecodePacked, AddSplitAcrossCtasMatchesHost) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(43);
  for (WFormat f : kPackedFormats) {
    const int N = 577, K = k_for(f, 4096);
    const Packed p = pack(rng, f, N, K);
    DevPacked dp(p, f);
    check_split_add(rng, dp.w, p.wf, N, K, fname(f));
    if (HasFatalFailure()) return;
  }
}

}  // namespace
}  // namespace ss::cuda::test
