// Each kernel of backend/cuda/kernels against a host reference (double accumulation over the same
// bf16-rounded inputs), on fresh random inputs with the output poisoned (NaN) before the run, at odd
// sizes. Without a GPU these report themselves skipped; the argument checks run everywhere.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "gpu_test_util.h"

namespace ss::cuda::test {
namespace {

using namespace ss::cuda::kern;

// --- embedding ----------------------------------------------------------------------------------
TEST(GpuEmbed, EveryTableTypeGathersTheRightRows) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(11);
  const int vocab = 301, h = 576;
  for (TableType t : {TableType::F32, TableType::F16, TableType::BF16, TableType::Q8_0, TableType::Q4_0, TableType::Q4_1}) {
    for (int n_tok : {1, 3, 17}) {
      std::vector<uint8_t> raw;
      std::vector<float> ref_rows(static_cast<size_t>(vocab) * h);
      if (t == TableType::F32) {
        ref_rows = random_f32(rng, ref_rows.size(), -2, 2);
        raw.resize(ref_rows.size() * 4);
        std::memcpy(raw.data(), ref_rows.data(), raw.size());
      } else if (t == TableType::F16 || t == TableType::BF16) {
        auto f = random_f32(rng, ref_rows.size(), -2, 2);
        raw.resize(f.size() * 2);
        for (size_t i = 0; i < f.size(); ++i) {
          const uint16_t b = t == TableType::F16 ? to_f16(f[i]) : to_bf16(f[i]);
          std::memcpy(raw.data() + 2 * i, &b, 2);
          ref_rows[i] = t == TableType::F16 ? from_f16(b) : from_bf16(b);
        }
      } else {
        raw = random_blocks(rng, t, static_cast<size_t>(vocab) * h / 32);
        ref_rows = host_rows(raw, t, vocab, h);
      }
      std::vector<int32_t> tok(n_tok);
      std::uniform_int_distribution<int> id(0, vocab - 1);
      for (auto& x : tok) x = id(rng);
      tok[0] = vocab - 1;  // the last row too
      DeviceBuf<uint8_t> dt(raw);
      DeviceBuf<int32_t> dtok(tok);
      DeviceBuf<float> dx(static_cast<size_t>(n_tok) * h);
      dx.poison();
      LAUNCH_OK(embed(dt.get(), t, vocab, h, dtok.get(), n_tok, dx.get(), nullptr));
      const auto x = dx.download();
      for (int i = 0; i < n_tok; ++i)
        for (int j = 0; j < h; ++j)
          ASSERT_EQ(x[static_cast<size_t>(i) * h + j], ref_rows[static_cast<size_t>(tok[i]) * h + j])
              << "type " << static_cast<int>(t) << " token " << i << " dim " << j;
    }
  }
}

// --- residual add + RMSNorm ----------------------------------------------------------------------
TEST(GpuAddRmsNorm, MatchesHostWithAndWithoutResidual) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(12);
  for (int h : {576, 2048, 4096, 4099}) {
    for (int n : {1, 3, 17}) {
      for (bool with_d : {false, true}) {
        const size_t sz = static_cast<size_t>(n) * h;
        auto x = random_f32(rng, sz, -3, 3), d = random_f32(rng, sz, -1, 1), w = random_f32(rng, h, 0.5f, 1.5f);
        DeviceBuf<float> dx(x), dd(d), dw(w);
        DeviceBuf<uint16_t> dout(sz);
        dout.poison();
        const float eps = 1e-5f;
        LAUNCH_OK(add_rmsnorm(dx.get(), with_d ? dd.get() : nullptr, dw.get(), n, h, eps, dout.get(), nullptr));
        const auto out = dout.download();
        const auto xo = dx.download();
        for (int t = 0; t < n; ++t) {
          double ss = 0;
          std::vector<float> r(h);
          for (int i = 0; i < h; ++i) {
            r[i] = x[t * h + i] + (with_d ? d[t * h + i] : 0.0f);  // fp32 add, as the residual stream
            ss += static_cast<double>(r[i]) * r[i];
          }
          const double inv = 1.0 / std::sqrt(ss / h + eps);
          for (int i = 0; i < h; ++i) {
            ASSERT_EQ(xo[t * h + i], r[i]) << "residual t=" << t << " i=" << i;
            const double ref = r[i] * inv * w[i];
            ASSERT_NEAR(from_bf16(out[t * h + i]), ref, std::abs(ref) * (1.0 / 256) + 1e-6)
                << "h=" << h << " t=" << t << " i=" << i;
          }
        }
      }
    }
  }
}

TEST(GpuAddRmsNorm, RejectsHiddenSizeBeyondRegisters) {
  EXPECT_FALSE(add_rmsnorm(nullptr, nullptr, nullptr, 1, 8193, 1e-5f, nullptr, nullptr).ok());
  EXPECT_FALSE(add_rmsnorm(nullptr, nullptr, nullptr, 1, 0, 1e-5f, nullptr, nullptr).ok());
}

// --- RoPE + paged KV store -----------------------------------------------------------------------
TEST(GpuRopeKv, RotatesQAndKAndStoresKvInTheirBlocks) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(13);
  struct Shape { int n_heads, n_kv, hd, rope_dim; };
  for (Shape sh : {Shape{9, 3, 64, 64}, Shape{32, 8, 128, 128}, Shape{4, 2, 128, 64}}) {
    for (bool inter : {false, true}) {
      for (int n_tok : {1, 3, 17}) {
        const int max_pos = 4096, max_blocks = max_pos / kBlockTokens, n_seqs = 2, n_blocks = n_seqs * max_blocks;
        const int w = (sh.n_heads + 2 * sh.n_kv) * sh.hd;
        auto qkv = random_f32(rng, static_cast<size_t>(n_tok) * w, -2, 2);
        // cos/sin table of a real RoPE (theta 10000), positions 0..max_pos-1.
        std::vector<float> cs(static_cast<size_t>(max_pos) * sh.rope_dim);
        for (int p = 0; p < max_pos; ++p)
          for (int i = 0; i < sh.rope_dim / 2; ++i) {
            const double a = p * std::pow(10000.0, -2.0 * i / sh.rope_dim);
            cs[p * sh.rope_dim + i] = static_cast<float>(std::cos(a));
            cs[p * sh.rope_dim + sh.rope_dim / 2 + i] = static_cast<float>(std::sin(a));
          }
        std::vector<int32_t> tables(static_cast<size_t>(n_seqs) * max_blocks);
        std::iota(tables.begin(), tables.end(), 0);
        std::shuffle(tables.begin(), tables.end(), rng);
        std::vector<int32_t> pos(n_tok), seq(n_tok);
        std::uniform_int_distribution<int> pd(0, max_pos - 1), sd(0, n_seqs - 1);
        for (int t = 0; t < n_tok; ++t) pos[t] = t == 0 ? 4095 : pd(rng), seq[t] = sd(rng);
        // distinct (seq, pos) so no two tokens write one slot
        for (int t = 1; t < n_tok; ++t) pos[t] = (pos[t - 1] + 1 + pd(rng) % 7) % max_pos, seq[t] = seq[0];
        const size_t cache_sz = static_cast<size_t>(n_blocks) * 2 * sh.n_kv * kBlockTokens * sh.hd;
        DeviceBuf<float> dqkv(qkv), dcs(cs), dq(static_cast<size_t>(n_tok) * sh.n_heads * sh.hd);
        DeviceBuf<int32_t> dpos(pos), dseq(seq), dtab(tables);
        DeviceBuf<uint16_t> dcache(cache_sz);
        dq.poison();
        dcache.poison();
        // At 3 tokens, Qwen's extras too: a bias over the rows and per-head RMSNorms of q and k.
        const bool qwen = n_tok == 3;
        const auto bias = random_f32(rng, w, -0.5f, 0.5f);
        const auto qn = random_f32(rng, sh.hd, 0.5f, 1.5f), kn = random_f32(rng, sh.hd, 0.5f, 1.5f);
        DeviceBuf<float> dbias(bias), dqn(qn), dkn(kn);
        RopeKv a{dqkv.get(), dcs.get(), sh.rope_dim, inter, sh.n_heads, sh.n_kv, sh.hd, dpos.get(), dseq.get(),
                 dtab.get(), max_blocks, dq.get(), dcache.get(), qwen ? dbias.get() : nullptr,
                 qwen ? dqn.get() : nullptr, qwen ? dkn.get() : nullptr, 1e-6f};
        LAUNCH_OK(rope_kv_store(a, n_tok, nullptr));
        const auto q = dq.download();
        const auto cache = dcache.download();
        for (int t = 0; t < n_tok; ++t) {
          for (int hh = 0; hh < sh.n_heads + 2 * sh.n_kv; ++hh) {
            const bool is_v = hh >= sh.n_heads + sh.n_kv;
            std::vector<double> src(sh.hd);  // the head after bias and norm, before RoPE
            for (int i = 0; i < sh.hd; ++i)
              src[i] = static_cast<double>(qkv[static_cast<size_t>(t) * w + hh * sh.hd + i]) + (qwen ? bias[hh * sh.hd + i] : 0.0);
            if (qwen && !is_v) {
              double ss = 0;
              for (double v : src) ss += v * v;
              const double inv = 1.0 / std::sqrt(ss / sh.hd + 1e-6);
              for (int i = 0; i < sh.hd; ++i) src[i] *= inv * (hh < sh.n_heads ? qn[i] : kn[i]);
            }
            for (int i = 0; i < sh.hd; ++i) {
              double ref = src[i];
              if (!is_v && i < sh.rope_dim) {
                const int half = sh.rope_dim / 2;
                int p, j0, j1;
                if (inter) p = i / 2, j0 = 2 * p, j1 = 2 * p + 1;
                else p = i % half, j0 = p, j1 = p + half;
                const double a0 = src[j0], a1 = src[j1];
                const double c = cs[pos[t] * sh.rope_dim + p], s = cs[pos[t] * sh.rope_dim + half + p];
                ref = i == j0 ? a0 * c - a1 * s : a1 * c + a0 * s;
              }
              if (hh < sh.n_heads) {
                ASSERT_NEAR(q[(static_cast<size_t>(t) * sh.n_heads + hh) * sh.hd + i], ref, 2e-5) << "q t=" << t << " h=" << hh;
              } else {
                const int kvh = is_v ? hh - sh.n_heads - sh.n_kv : hh - sh.n_heads;
                const int blk = tables[seq[t] * max_blocks + pos[t] / kBlockTokens];
                const size_t at = ((static_cast<size_t>(blk) * 2 + is_v) * sh.n_kv + kvh) * kBlockTokens * sh.hd +
                                  static_cast<size_t>(pos[t] % kBlockTokens) * sh.hd + i;
                ASSERT_NEAR(from_bf16(cache[at]), ref, std::abs(ref) / 256 + 1e-6) << "kv t=" << t << " h=" << hh << " i=" << i;
              }
            }
          }
        }
        // Nothing else in the cache was written: count the slots that are no longer poison.
        size_t written = 0;
        for (uint16_t v : cache) written += v != 0xFFFF;
        EXPECT_LE(written, static_cast<size_t>(n_tok) * 2 * sh.n_kv * sh.hd);
      }
    }
  }
}

// The QKV GEMV with RoPE and the KV store fused: against host GEMV (double) then host RoPE.
TEST(GpuRopeKv, FusedIntoTheQkvGemvMatchesHost) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(24);
  struct Shape { int n_heads, n_kv, hd, rope_dim, K; };
  for (Shape sh : {Shape{9, 3, 64, 64, 576}, Shape{8, 2, 128, 128, 1024}, Shape{4, 2, 128, 64, 256}}) {
    for (bool inter : {false, true}) {
      for (int batch : {1, 3, 8}) {
        const int max_pos = 4096, max_blocks = max_pos / kBlockTokens, rows = (sh.n_heads + 2 * sh.n_kv) * sh.hd;
        std::vector<float> wf, xf;
        auto W = random_bf16(rng, static_cast<size_t>(rows) * sh.K, -1, 1, &wf);
        auto x = random_bf16(rng, static_cast<size_t>(batch) * sh.K, -1, 1, &xf);
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
        DeviceBuf<uint16_t> dW(W), dx(x), dcache(cache_sz);
        DeviceBuf<float> dcs(cs), dq(static_cast<size_t>(batch) * sh.n_heads * sh.hd);
        DeviceBuf<int32_t> dpos(pos), dseq(seq), dtab(tables);
        dq.poison();
        dcache.poison();
        const bool with_bias = batch == 3;  // Qwen2's QKV bias, added before the rotation
        const auto bias = random_f32(rng, rows, -0.5f, 0.5f);
        DeviceBuf<float> dbias(bias);
        RopeKv a{nullptr, dcs.get(), sh.rope_dim, inter, sh.n_heads, sh.n_kv, sh.hd, dpos.get(), dseq.get(),
                 dtab.get(), max_blocks, dq.get(), dcache.get(), with_bias ? dbias.get() : nullptr, nullptr, nullptr, 0.0f};
        LAUNCH_OK(gemv_bf16_qkv_rope(dW.get(), dx.get(), sh.K, batch, a, nullptr));
        RopeKv with_norm = a;
        with_norm.q_norm = dbias.get();
        EXPECT_FALSE(gemv_bf16_qkv_rope(dW.get(), dx.get(), sh.K, batch, with_norm, nullptr).ok());
        const auto q = dq.download();
        const auto cache = dcache.download();
        for (int b = 0; b < batch; ++b) {
          std::vector<double> y(rows), mag(rows);
          for (int r = 0; r < rows; ++r) {
            double acc = with_bias ? bias[r] : 0.0, m = std::abs(acc);
            for (int k = 0; k < sh.K; ++k) {
              const double t = static_cast<double>(wf[static_cast<size_t>(r) * sh.K + k]) * xf[static_cast<size_t>(b) * sh.K + k];
              acc += t, m += std::abs(t);
            }
            y[r] = acc, mag[r] = m;
          }
          for (int hh = 0; hh < sh.n_heads + 2 * sh.n_kv; ++hh) {
            const bool is_v = hh >= sh.n_heads + sh.n_kv;
            const double* src = y.data() + hh * sh.hd;
            const double* mg = mag.data() + hh * sh.hd;
            for (int i = 0; i < sh.hd; ++i) {
              double ref = src[i], tol = 1e-5 * mg[i] + 1e-6;
              if (!is_v && i < sh.rope_dim) {
                const int half = sh.rope_dim / 2;
                int p, j0, j1;
                if (inter) p = i / 2, j0 = 2 * p, j1 = 2 * p + 1;
                else p = i % half, j0 = p, j1 = p + half;
                const double c = cs[pos[b] * sh.rope_dim + p], s = cs[pos[b] * sh.rope_dim + half + p];
                ref = i == j0 ? src[j0] * c - src[j1] * s : src[j1] * c + src[j0] * s;
                tol = 1e-5 * (mg[j0] + mg[j1]) + 1e-6;
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

// --- GEMV ---------------------------------------------------------------------------------------
// |y - ref| within fp32 accumulation error of the sum of |terms|.
void expect_gemv(const std::vector<float>& y, const std::vector<double>& ref, const std::vector<double>& mag, const char* what) {
  for (size_t i = 0; i < y.size(); ++i)
    ASSERT_NEAR(y[i], ref[i], 1e-5 * mag[i] + 1e-6) << what << " element " << i;
}

TEST(GpuGemv, Bf16MatchesHostAtEveryBatchSize) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(14);
  struct Shape { int N, K; };
  for (Shape sh : {Shape{1, 8}, Shape{577, 576}, Shape{1003, 2048}, Shape{64, 14336}}) {
    std::vector<float> wf;
    auto W = random_bf16(rng, static_cast<size_t>(sh.N) * sh.K, -1, 1, &wf);
    DeviceBuf<uint16_t> dW(W);
    for (int batch = 1; batch <= 8; ++batch) {
      for (bool accumulate : {false, true}) {
        std::vector<float> xf;
        auto x = random_bf16(rng, static_cast<size_t>(batch) * sh.K, -1, 1, &xf);
        auto y0 = random_f32(rng, static_cast<size_t>(batch) * sh.N, -1, 1);
        DeviceBuf<uint16_t> dx(x);
        DeviceBuf<float> dy(static_cast<size_t>(batch) * sh.N);
        if (accumulate) dy.upload(y0);
        else dy.poison();
        LAUNCH_OK(gemv_bf16(dW.get(), dx.get(), dy.get(), sh.N, sh.K, batch, accumulate, nullptr));
        const auto y = dy.download();
        std::vector<double> ref(y.size()), mag(y.size());
        for (int b = 0; b < batch; ++b)
          for (int n = 0; n < sh.N; ++n) {
            double s = accumulate ? y0[b * sh.N + n] : 0.0, m = std::abs(s);
            for (int k = 0; k < sh.K; ++k) {
              const double t = static_cast<double>(wf[static_cast<size_t>(n) * sh.K + k]) * xf[static_cast<size_t>(b) * sh.K + k];
              s += t, m += std::abs(t);
            }
            ref[b * sh.N + n] = s, mag[b * sh.N + n] = m;
          }
        expect_gemv(y, ref, mag, "bf16");
      }
    }
  }
}

TEST(GpuGemv, ResidualWithFusedRmsNormMatchesHost) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(25);
  DeviceBuf<unsigned> counter(1);
  CUDA_OK(cudaMemset(counter.get(), 0, sizeof(unsigned)));
  for (auto [N, K] : {std::pair{576, 576}, std::pair{2048, 8192}, std::pair{1001, 64}}) {
    std::vector<float> wf;
    auto W = random_bf16(rng, static_cast<size_t>(N) * K, -1, 1, &wf);
    const auto nw = random_f32(rng, N, 0.5f, 1.5f);
    DeviceBuf<uint16_t> dW(W);
    DeviceBuf<float> dnw(nw);
    for (int batch : {1, 3, 8}) {
      for (int rep = 0; rep < 2; ++rep) {  // twice: the counter must have been left at zero
        std::vector<float> xf;
        auto x = random_bf16(rng, static_cast<size_t>(batch) * K, -0.1f, 0.1f, &xf);
        const auto r0 = random_f32(rng, static_cast<size_t>(batch) * N, -2, 2);
        DeviceBuf<uint16_t> dx(x), dout(static_cast<size_t>(batch) * N);
        DeviceBuf<float> dr(r0);
        dout.poison();
        LAUNCH_OK(gemv_bf16_residual_rmsnorm(dW.get(), dx.get(), dr.get(), N, K, batch, dnw.get(), 1e-5f, dout.get(),
                                             counter.get(), nullptr));
        const auto r = dr.download();
        const auto out = dout.download();
        for (int b = 0; b < batch; ++b) {
          std::vector<double> ref(N), mag(N);
          double ss = 0;
          for (int n = 0; n < N; ++n) {
            double acc = r0[static_cast<size_t>(b) * N + n], m = std::abs(acc);
            for (int k = 0; k < K; ++k) {
              const double t = static_cast<double>(wf[static_cast<size_t>(n) * K + k]) * xf[static_cast<size_t>(b) * K + k];
              acc += t, m += std::abs(t);
            }
            ref[n] = acc, mag[n] = m;
            ASSERT_NEAR(r[static_cast<size_t>(b) * N + n], acc, 1e-5 * m + 1e-6) << "resid N=" << N << " b=" << b << " n=" << n;
            ss += static_cast<double>(r[static_cast<size_t>(b) * N + n]) * r[static_cast<size_t>(b) * N + n];
          }
          // The norm of the residual as the kernel left it (its own rounding checked just above).
          const double inv = 1.0 / std::sqrt(ss / N + 1e-5);
          for (int n = 0; n < N; ++n) {
            const double o = r[static_cast<size_t>(b) * N + n] * inv * nw[n];
            ASSERT_NEAR(from_bf16(out[static_cast<size_t>(b) * N + n]), o, std::abs(o) / 256 + 1e-5) << "out b=" << b << " n=" << n;
          }
        }
      }
    }
  }
  EXPECT_EQ(counter.download()[0], 0u);
  EXPECT_FALSE(gemv_bf16_residual_rmsnorm(nullptr, nullptr, nullptr, 16, 16, 1, nullptr, 1e-5f, nullptr, nullptr, nullptr).ok());
}

TEST(GpuGemv, FusedSwigluMatchesHost) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(19);
  for (auto [F, K] : {std::pair{1536, 576}, std::pair{1001, 2048}}) {
    std::vector<float> wf;
    auto W = random_bf16(rng, static_cast<size_t>(2 * F) * K, -1, 1, &wf);
    DeviceBuf<uint16_t> dW(W);
    for (int batch : {1, 3, 8}) {
      std::vector<float> xf;
      auto x = random_bf16(rng, static_cast<size_t>(batch) * K, -0.2f, 0.2f, &xf);
      DeviceBuf<uint16_t> dx(x), dact(static_cast<size_t>(batch) * F);
      dact.poison();
      LAUNCH_OK(gemv_bf16_swiglu(dW.get(), dx.get(), dact.get(), F, K, batch, nullptr));
      const auto act = dact.download();
      for (int b = 0; b < batch; ++b)
        for (int i = 0; i < F; ++i) {
          double g = 0, u = 0, mg = 0, mu = 0;
          for (int k = 0; k < K; ++k) {
            const double xv = xf[static_cast<size_t>(b) * K + k];
            const double tg = wf[static_cast<size_t>(i) * K + k] * xv, tu = wf[static_cast<size_t>(F + i) * K + k] * xv;
            g += tg, u += tu, mg += std::abs(tg), mu += std::abs(tu);
          }
          const double sg = g / (1 + std::exp(-g)), ref = sg * u;
          // bf16 rounding of the result, plus the fp32 dot products' error carried through silu * up
          const double tol = std::abs(ref) / 256 + 1e-5 * (mg * std::abs(u) * 1.1 + std::abs(sg) * mu) + 1e-6;
          ASSERT_NEAR(from_bf16(act[static_cast<size_t>(b) * F + i]), ref, tol) << "F=" << F << " b=" << b << " i=" << i;
        }
    }
  }
  EXPECT_FALSE(gemv_bf16_swiglu(nullptr, nullptr, nullptr, 16, 12, 1, nullptr).ok());
}

// K-quants (ggml-quants.c dequantize_row_q4_K / q6_K), host side: rows of K/256 super-blocks.
std::vector<float> host_kquant_rows(const std::vector<uint8_t>& raw, QuantType t, int rows, int K) {
  std::vector<float> out(static_cast<size_t>(rows) * K);
  const int nb = K / 256, bytes = t == QuantType::Q4_K ? 144 : 210;
  for (int r = 0; r < rows; ++r)
    for (int b = 0; b < nb; ++b) {
      const uint8_t* p = raw.data() + (static_cast<size_t>(r) * nb + b) * bytes;
      float* y = out.data() + static_cast<size_t>(r) * K + b * 256;
      if (t == QuantType::Q4_K) {
        const float d = from_f16(static_cast<uint16_t>(p[0] | (p[1] << 8)));
        const float dmin = from_f16(static_cast<uint16_t>(p[2] | (p[3] << 8)));
        const uint8_t* sc = p + 4;
        auto scale_min = [&](int j, int& s, int& m) {
          if (j < 4) s = sc[j] & 63, m = sc[j + 4] & 63;
          else s = (sc[j + 4] & 0xF) | ((sc[j - 4] >> 6) << 4), m = (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
        };
        for (int c = 0; c < 4; ++c) {  // 64 weights per chunk: low nibbles, then high
          const uint8_t* q = p + 16 + 32 * c;
          int s0, m0, s1, m1;
          scale_min(2 * c, s0, m0);
          scale_min(2 * c + 1, s1, m1);
          for (int l = 0; l < 32; ++l) {
            y[64 * c + l] = d * s0 * (q[l] & 0xF) - dmin * m0;
            y[64 * c + 32 + l] = d * s1 * (q[l] >> 4) - dmin * m1;
          }
        }
      } else {
        const uint8_t* ql = p;
        const uint8_t* qh = p + 128;
        const int8_t* sc = reinterpret_cast<const int8_t*>(p + 192);
        const float d = from_f16(static_cast<uint16_t>(p[208] | (p[209] << 8)));
        for (int n = 0; n < 2; ++n)
          for (int l = 0; l < 32; ++l) {
            const int is = l / 16;
            const uint8_t* L = ql + 64 * n;
            const uint8_t* Hh = qh + 32 * n;
            const int8_t* S = sc + 8 * n;
            y[128 * n + l] = d * S[is] * (((L[l] & 0xF) | (((Hh[l] >> 0) & 3) << 4)) - 32);
            y[128 * n + l + 32] = d * S[is + 2] * (((L[l + 32] & 0xF) | (((Hh[l] >> 2) & 3) << 4)) - 32);
            y[128 * n + l + 64] = d * S[is + 4] * (((L[l] >> 4) | (((Hh[l] >> 4) & 3) << 4)) - 32);
            y[128 * n + l + 96] = d * S[is + 6] * (((L[l + 32] >> 4) | (((Hh[l] >> 6) & 3) << 4)) - 32);
          }
      }
    }
  return out;
}

TEST(GpuGemv, KQuantBlocksMatchHostDequantization) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(20);
  const int N = 131, K = 1536;
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(0.0005f, 0.005f);
  for (QuantType qt : {QuantType::Q4_K, QuantType::Q6_K}) {
    const int bytes = qt == QuantType::Q4_K ? 144 : 210;
    std::vector<uint8_t> raw(static_cast<size_t>(N) * K / 256 * bytes);
    for (auto& b : raw) b = static_cast<uint8_t>(byte(rng));
    for (size_t b = 0; b < raw.size() / bytes; ++b) {  // sane f16 scales (random bytes can be inf/NaN)
      uint8_t* p = raw.data() + b * bytes;
      const uint16_t d = to_f16(scale(rng)), dm = to_f16(scale(rng));
      if (qt == QuantType::Q4_K) p[0] = d & 0xff, p[1] = d >> 8, p[2] = dm & 0xff, p[3] = dm >> 8;
      else p[208] = d & 0xff, p[209] = d >> 8;
    }
    const auto wf = host_kquant_rows(raw, qt, N, K);
    DeviceBuf<uint8_t> dW(raw);
    for (int batch : {1, 3, 8}) {
      std::vector<float> xf;
      auto x = random_bf16(rng, static_cast<size_t>(batch) * K, -1, 1, &xf);
      DeviceBuf<uint16_t> dx(x);
      DeviceBuf<float> dy(static_cast<size_t>(batch) * N);
      dy.poison();
      LAUNCH_OK(gemv_quant(dW.get(), qt, dx.get(), dy.get(), N, K, batch, false, nullptr));
      const auto y = dy.download();
      std::vector<double> ref(y.size()), mag(y.size());
      for (int b = 0; b < batch; ++b)
        for (int n = 0; n < N; ++n) {
          double sum = 0, m = 0;
          for (int k = 0; k < K; ++k) {
            const double t = static_cast<double>(wf[static_cast<size_t>(n) * K + k]) * xf[static_cast<size_t>(b) * K + k];
            sum += t, m += std::abs(t);
          }
          ref[b * N + n] = sum, mag[b * N + n] = m;
        }
      expect_gemv(y, ref, mag, qt == QuantType::Q4_K ? "q4_K" : "q6_K");
    }
  }
  EXPECT_FALSE(gemv_quant(nullptr, QuantType::Q4_K, nullptr, nullptr, 16, 512 + 32, 1, false, nullptr).ok());  // K % 256
}

TEST(GpuGemv, QuantBlocksMatchHostDequantization) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(15);
  const int N = 259, K = 1024;
  for (auto [qt, tt] : {std::pair{QuantType::Q8_0, TableType::Q8_0}, std::pair{QuantType::Q4_0, TableType::Q4_0},
                        std::pair{QuantType::Q4_1, TableType::Q4_1}}) {
    auto raw = random_blocks(rng, tt, static_cast<size_t>(N) * K / 32);
    const auto wf = host_rows(raw, tt, N, K);
    DeviceBuf<uint8_t> dW(raw);
    for (int batch : {1, 3, 8}) {
      std::vector<float> xf;
      auto x = random_bf16(rng, static_cast<size_t>(batch) * K, -1, 1, &xf);
      DeviceBuf<uint16_t> dx(x);
      DeviceBuf<float> dy(static_cast<size_t>(batch) * N);
      dy.poison();
      LAUNCH_OK(gemv_quant(dW.get(), qt, dx.get(), dy.get(), N, K, batch, false, nullptr));
      const auto y = dy.download();
      std::vector<double> ref(y.size()), mag(y.size());
      for (int b = 0; b < batch; ++b)
        for (int n = 0; n < N; ++n) {
          double s = 0, m = 0;
          for (int k = 0; k < K; ++k) {
            const double t = static_cast<double>(wf[static_cast<size_t>(n) * K + k]) * xf[static_cast<size_t>(b) * K + k];
            s += t, m += std::abs(t);
          }
          ref[b * N + n] = s, mag[b * N + n] = m;
        }
      expect_gemv(y, ref, mag, "quant");
    }
  }
}

TEST(GpuGemv, RejectsShapesItCannotRun) {
  EXPECT_FALSE(gemv_bf16(nullptr, nullptr, nullptr, 16, 12, 1, false, nullptr).ok());  // K % 8
  EXPECT_FALSE(gemv_bf16(nullptr, nullptr, nullptr, 16, 16, 9, false, nullptr).ok());  // batch > 8
  EXPECT_FALSE(gemv_bf16(nullptr, nullptr, nullptr, 0, 16, 1, false, nullptr).ok());
  EXPECT_FALSE(gemv_quant(nullptr, QuantType::Q4_0, nullptr, nullptr, 16, 48, 1, false, nullptr).ok());  // K % 32
}

// --- cuBLASLt GEMM --------------------------------------------------------------------------------
TEST(GpuLtGemm, Bf16GemmMatchesHost) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(16);
  auto g = lt_create(32u << 20);
  ASSERT_TRUE(g.ok()) << g.message();
  struct Shape { int M, N, K; };
  for (Shape sh : {Shape{17, 300, 256}, Shape{64, 1024, 576}, Shape{3, 40, 64}}) {
    std::vector<float> wf, xf;
    auto W = random_bf16(rng, static_cast<size_t>(sh.N) * sh.K, -1, 1, &wf);
    auto x = random_bf16(rng, static_cast<size_t>(sh.M) * sh.K, -1, 1, &xf);
    DeviceBuf<uint16_t> dW(W), dx(x);
    DeviceBuf<float> dy(static_cast<size_t>(sh.M) * sh.N);
    dy.poison();
    LAUNCH_OK(lt_gemm_bf16(*g, dW.get(), dx.get(), dy.get(), sh.M, sh.N, sh.K, false, nullptr));
    const auto y = dy.download();
    std::vector<double> ref(y.size()), mag(y.size());
    for (int m = 0; m < sh.M; ++m)
      for (int n = 0; n < sh.N; ++n) {
        double s = 0, a = 0;
        for (int k = 0; k < sh.K; ++k) {
          const double t = static_cast<double>(wf[static_cast<size_t>(n) * sh.K + k]) * xf[static_cast<size_t>(m) * sh.K + k];
          s += t, a += std::abs(t);
        }
        ref[m * sh.N + n] = s, mag[m * sh.N + n] = a;
      }
    expect_gemv(y, ref, mag, "lt");
  }
  lt_destroy(*g);
}

// --- SwiGLU ---------------------------------------------------------------------------------------
TEST(GpuSwiglu, MatchesHost) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(17);
  for (int inter : {1536, 8193}) {
    for (int n : {1, 3, 17}) {
      auto gu = random_f32(rng, static_cast<size_t>(n) * 2 * inter, -6, 6);
      DeviceBuf<float> dgu(gu);
      DeviceBuf<uint16_t> dact(static_cast<size_t>(n) * inter);
      dact.poison();
      LAUNCH_OK(swiglu(dgu.get(), n, inter, dact.get(), nullptr));
      const auto act = dact.download();
      for (int t = 0; t < n; ++t)
        for (int i = 0; i < inter; ++i) {
          const double g = gu[static_cast<size_t>(t) * 2 * inter + i], u = gu[static_cast<size_t>(t) * 2 * inter + inter + i];
          const double ref = g / (1 + std::exp(-g)) * u;
          ASSERT_NEAR(from_bf16(act[static_cast<size_t>(t) * inter + i]), ref, std::abs(ref) / 128 + 1e-6) << t << "," << i;
        }
    }
  }
}

// --- argmax ---------------------------------------------------------------------------------------
TEST(GpuArgmax, PicksTheLargestAndTheLowestIdOnTies) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(18);
  for (int V : {1, 49152, 128256, 1001}) {
    for (int n : {1, 3, 17}) {
      auto l = random_f32(rng, static_cast<size_t>(n) * V, -10, 10);
      std::uniform_int_distribution<int> id(0, V - 1);
      for (int r = 0; r < n; ++r) {
        float* row = l.data() + static_cast<size_t>(r) * V;
        if (r % 3 == 1) {  // a tie at the top: the lower id must win
          const int a = id(rng), b = id(rng);
          row[a] = row[b] = 50.0f;
        } else if (r % 3 == 2) {
          row[id(rng)] = NAN;  // NaN never wins
        }
      }
      DeviceBuf<float> dl(l);
      DeviceBuf<int32_t> dids(n);
      dids.poison();
      LAUNCH_OK(argmax(dl.get(), n, V, dids.get(), nullptr));
      const auto ids = dids.download();
      for (int r = 0; r < n; ++r) {
        const float* row = l.data() + static_cast<size_t>(r) * V;
        int best = 0;
        while (best < V && std::isnan(row[best])) ++best;
        if (best == V) best = 0;  // all NaN: id 0, as the host's argmax
        for (int i = best + 1; i < V; ++i)
          if (row[i] > row[best]) best = i;
        EXPECT_EQ(ids[r], best) << "V=" << V << " row " << r;
      }
    }
  }
}

}  // namespace
}  // namespace ss::cuda::test
