// Paged attention (decode with and without splits, prefill over a cached prefix) against a host
// softmax in double over the same bf16 cache: odd context lengths (1, 15, 16, 17, 4095), batches 1, 3
// and 17, GQA groups 1 to 8, head dims 64 / 128 / 256. Unused block-table entries hold an id far past
// the cache, so a read beyond a context faults instead of passing quietly.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "gpu_test_util.h"

namespace ss::cuda::test {
namespace {

using namespace ss::cuda::kern;

struct Case {
  int n_heads, n_kv, hd;
};

struct Paged {
  std::vector<float> cache_f;       // the bf16 cache's values, as floats
  std::vector<uint16_t> cache;
  std::vector<int32_t> tables;
  int max_blocks = 0;
};

// A pool holding exactly the blocks the sequences need, handed out in shuffled order.
Paged make_paged(std::mt19937& rng, const std::vector<int>& seq_len, int n_kv, int hd) {
  Paged p;
  p.max_blocks = 0;
  int total = 0;
  for (int l : seq_len) {
    const int nb = (l + kBlockTokens - 1) / kBlockTokens;
    p.max_blocks = std::max(p.max_blocks, nb);
    total += nb;
  }
  p.max_blocks += 1;  // one entry past every sequence's last block, never to be read
  std::vector<int32_t> ids(total);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  p.tables.assign(seq_len.size() * p.max_blocks, 0x7fffffff);
  int next = 0;
  for (size_t s = 0; s < seq_len.size(); ++s)
    for (int b = 0; b < (seq_len[s] + kBlockTokens - 1) / kBlockTokens; ++b) p.tables[s * p.max_blocks + b] = ids[next++];
  p.cache = random_bf16(rng, static_cast<size_t>(total) * 2 * n_kv * kBlockTokens * hd, -1, 1, &p.cache_f);
  return p;
}

// out[h][d] for one query row over positions [0, ctx) of table row `seq`.
// dev (optional), per output element: the spread sum_t p_t |v_t - out| that a relative error in the
// weights p_t moves the output by, times the bound on that relative error from the scores' fp32 sums
// (2 x their worst error: hd ulps of sum_d |q_d k_d| scale) plus fp32's own 1e-5.
std::vector<double> host_attention(const Paged& p, const float* q, int seq, int ctx, const Case& c, float scale,
                                   std::vector<double>* dev = nullptr, double p_rel = 0) {
  const int G = c.n_heads / c.n_kv;
  std::vector<double> out(static_cast<size_t>(c.n_heads) * c.hd, 0.0);
  std::vector<double> s(ctx);
  auto at = [&](int t, int kv, int kvh, int d) {
    const size_t blk = static_cast<size_t>(p.tables[static_cast<size_t>(seq) * p.max_blocks + t / kBlockTokens]);
    return static_cast<double>(p.cache_f[((blk * 2 + kv) * c.n_kv + kvh) * kBlockTokens * c.hd +
                                         static_cast<size_t>(t % kBlockTokens) * c.hd + d]);
  };
  if (dev) dev->assign(out.size(), 0.0);
  for (int h = 0; h < c.n_heads; ++h) {
    const int kvh = h / G;
    double m = -INFINITY, s_err = 0;
    for (int t = 0; t < ctx; ++t) {
      double dot = 0, mag = 0;
      for (int d = 0; d < c.hd; ++d) {
        dot += static_cast<double>(q[h * c.hd + d]) * at(t, 0, kvh, d);
        mag += std::abs(static_cast<double>(q[h * c.hd + d]) * at(t, 0, kvh, d));
      }
      s[t] = dot * scale;
      s_err = std::max(s_err, c.hd * std::ldexp(mag * scale, -23));
      m = std::max(m, s[t]);
    }
    double l = 0;
    for (int t = 0; t < ctx; ++t) l += (s[t] = std::exp(s[t] - m));
    for (int t = 0; t < ctx; ++t)
      for (int d = 0; d < c.hd; ++d) out[h * c.hd + d] += s[t] / l * at(t, 1, kvh, d);
    if (dev)
      for (int d = 0; d < c.hd; ++d) {
        double spread = 0;
        for (int t = 0; t < ctx; ++t) spread += s[t] / l * std::abs(at(t, 1, kvh, d) - out[h * c.hd + d]);
        (*dev)[h * c.hd + d] = spread * (p_rel + 2 * s_err + 1e-5);
      }
  }
  return out;
}

// merge_in_place: the splits merged by their last CTA (counters) instead of the combine kernel.
void run_case(std::mt19937& rng, const Case& c, const std::vector<int>& seq_len, const std::vector<int32_t>& seq_of_q,
              const std::vector<int32_t>& ctx, int splits_wanted, bool merge_in_place = false, int cluster = 0,
              std::vector<uint16_t>* out_bits = nullptr, bool push = false) {
  const Paged p = make_paged(rng, seq_len, c.n_kv, c.hd);
  const int n_q = static_cast<int>(ctx.size());
  const size_t qsz = static_cast<size_t>(n_q) * c.n_heads * c.hd;
  const auto q = random_f32(rng, qsz, -2, 2);
  const int max_splits = 64;
  int dev = 0, sms = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  const int splits = splits_wanted > 0 ? splits_wanted : attention_splits(n_q, c.n_kv, sms, max_splits);
  DeviceBuf<float> dq(q), dws(static_cast<size_t>(attention_workspace_floats(n_q, c.n_heads, c.hd, max_splits)) + 1);
  DeviceBuf<uint16_t> dcache(p.cache), dout(qsz);
  DeviceBuf<int32_t> dctx(ctx), dseq(seq_of_q), dtab(p.tables);
  ASSERT_TRUE(dq.ok() && dws.ok() && dcache.ok() && dout.ok());
  dout.poison();
  dws.poison();
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.hd));
  DeviceBuf<unsigned> counters(static_cast<size_t>(n_q) * c.n_kv);
  CUDA_OK(cudaMemset(counters.get(), 0, counters.size() * sizeof(unsigned)));
  Attention a{dq.get(), dcache.get(), c.n_heads, c.n_kv, c.hd, scale, dctx.get(), dseq.get(), dtab.get(),
              p.max_blocks, dout.get(), dws.get(), max_splits, merge_in_place ? counters.get() : nullptr};
  a.cluster = cluster;
  a.cluster_push = push;
  LAUNCH_OK(attention(a, n_q, splits, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  for (unsigned v : counters.download()) ASSERT_EQ(v, 0u) << "a split counter was not left at zero";
  const auto out = dout.download();
  if (out_bits) *out_bits = out;
  for (int i = 0; i < n_q; ++i) {
    const auto ref = host_attention(p, q.data() + static_cast<size_t>(i) * c.n_heads * c.hd, seq_of_q[i], ctx[i], c, scale);
    for (size_t j = 0; j < ref.size(); ++j)
      ASSERT_NEAR(from_bf16(out[static_cast<size_t>(i) * ref.size() + j]), ref[j], std::abs(ref[j]) / 256 + 1e-5)
          << "heads " << c.n_heads << "/" << c.n_kv << " hd " << c.hd << " splits " << splits << " row " << i
          << " ctx " << ctx[i] << " elem " << j;
  }
}

TEST(GpuAttention, DecodeMatchesHostAtOddContextsAndBatches) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(21);
  const int lens[] = {1, 15, 16, 17, 4095};
  for (Case c : {Case{9, 3, 64}, Case{32, 8, 128}, Case{8, 1, 128}, Case{4, 4, 256}}) {
    for (int batch : {1, 3, 17}) {
      for (int splits : {1, 0 /* auto */, 7}) {
        std::vector<int> seq_len(batch);
        std::vector<int32_t> seq(batch), ctx(batch);
        for (int b = 0; b < batch; ++b) seq_len[b] = ctx[b] = lens[(b + splits) % 5], seq[b] = b;
        if (batch == 1) seq_len[0] = ctx[0] = lens[(c.hd / 64 + splits) % 5];
        run_case(rng, c, seq_len, seq, ctx, splits);
        if (HasFatalFailure()) return;
        if (splits != 1) {
          run_case(rng, c, seq_len, seq, ctx, splits, /*merge_in_place=*/true);
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

// Splits merged through distributed shared memory in a cluster (the fused decode's launch: 64
// splits, in-place merge): contexts whose live splits fit one cluster take that path, longer ones
// (and a single split) the ticket merge; both against the host, at head dims 64 and 128, and
// bit-identical to the ticket merge of the same inputs (the decode uses clusters at batch 1 only,
// so a row's result must not change with the merge).
TEST(GpuAttention, ClusterMergeMatchesHost) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(23);
  for (int cluster : {8, 16}) {
    for (Case c : {Case{9, 3, 64}, Case{32, 8, 128}}) {
      for (int len : {1, 33, 100, 256, 257, 512, 513, 1024, 1500}) {
        std::mt19937 same = rng;  // the same inputs for both merges
        std::vector<uint16_t> by_ticket, by_cluster;
        run_case(same, c, {len}, {0}, {len}, 64, /*merge_in_place=*/true, 0, &by_ticket);
        if (HasFatalFailure()) return;
        std::mt19937 same2 = rng;
        run_case(rng, c, {len}, {0}, {len}, 64, /*merge_in_place=*/true, cluster, &by_cluster);
        if (HasFatalFailure()) return;
        ASSERT_EQ(by_ticket, by_cluster) << "cluster " << cluster << " hd " << c.hd << " ctx " << len;
        // The pushed merge (every split into the first CTA's shared memory, one barrier): the same bits.
        std::vector<uint16_t> by_push;
        run_case(same2, c, {len}, {0}, {len}, 64, /*merge_in_place=*/true, cluster, &by_push, /*push=*/true);
        if (HasFatalFailure()) return;
        ASSERT_EQ(by_ticket, by_push) << "pushed, cluster " << cluster << " hd " << c.hd << " ctx " << len;
      }
      // Rows of different lengths in one launch: some merge in the cluster, some by ticket.
      run_case(rng, c, {17, 300, 1100}, {0, 1, 2}, {17, 300, 1100}, 64, /*merge_in_place=*/true, cluster);
      if (HasFatalFailure()) return;
      run_case(rng, c, {17, 300, 1100}, {0, 1, 2}, {17, 300, 1100}, 64, /*merge_in_place=*/true, cluster, nullptr,
               /*push=*/true);
      if (HasFatalFailure()) return;
    }
  }
}

TEST(GpuAttention, RejectsABadCluster) {
  Attention a{};
  a.n_heads = 8, a.n_kv = 2, a.hd = 64, a.max_splits = 64, a.cluster = 12;
  float ws = 0;
  unsigned counters = 0;
  a.workspace = &ws, a.split_counters = &counters;
  EXPECT_FALSE(attention(a, 1, 64, nullptr).ok());  // 12 does not divide 64
  a.cluster = 16, a.split_counters = nullptr;
  EXPECT_FALSE(attention(a, 1, 64, nullptr).ok());  // no split counters
  a.cluster = 32, a.split_counters = &counters;
  EXPECT_FALSE(attention(a, 1, 64, nullptr).ok());  // past 16
}

TEST(GpuAttention, EveryContextLengthWithSplits) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(22);
  for (int len : {1, 15, 16, 17, 4095}) {
    run_case(rng, Case{32, 8, 128}, {len}, {0}, {len}, 0);
    if (HasFatalFailure()) return;
    run_case(rng, Case{32, 8, 128}, {len}, {0}, {len}, 0, /*merge_in_place=*/true);
    if (HasFatalFailure()) return;
  }
}

// Prefill: 17 prompt tokens after a cached prefix of 100, each row causal over its own position.
TEST(GpuAttention, PrefillOverCachedPrefixIsCausal) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(23);
  for (Case c : {Case{9, 3, 64}, Case{32, 8, 128}}) {
    const int prefix = 100, n = 17;
    std::vector<int32_t> seq(n, 0), ctx(n);
    for (int i = 0; i < n; ++i) ctx[i] = prefix + i + 1;
    run_case(rng, c, {prefix + n}, seq, ctx, 1);
    if (HasFatalFailure()) return;
    run_case(rng, c, {prefix + n}, seq, ctx, 3);
    if (HasFatalFailure()) return;
    run_case(rng, c, {prefix + n}, seq, ctx, 3, /*merge_in_place=*/true);
    if (HasFatalFailure()) return;
  }
}

// What the fused decode path relies on: with the split count fixed, a row's output is bit-for-bit
// the same alone and among seven others of other lengths (PDL launch, splits merged in place).
TEST(GpuAttention, RowResultDoesNotDependOnTheBatch) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(26);
  const Case c{32, 8, 128};
  const std::vector<int> lens = {1, 17, 64, 65, 300, 1000, 4095, 2048};
  const int n_q = static_cast<int>(lens.size()), splits = 32, max_splits = 32;
  const Paged p = make_paged(rng, lens, c.n_kv, c.hd);
  const size_t row = static_cast<size_t>(c.n_heads) * c.hd;
  const auto q = random_f32(rng, row * n_q, -2, 2);
  std::vector<int32_t> seq(n_q), ctx(lens.begin(), lens.end());
  std::iota(seq.begin(), seq.end(), 0);
  DeviceBuf<float> dq(q), dws(static_cast<size_t>(attention_workspace_floats(n_q, c.n_heads, c.hd, max_splits)));
  DeviceBuf<uint16_t> dcache(p.cache), dout(row * n_q), dout1(row);
  DeviceBuf<int32_t> dctx(ctx), dseq(seq), dtab(p.tables);
  DeviceBuf<unsigned> counters(static_cast<size_t>(n_q) * c.n_kv);
  CUDA_OK(cudaMemset(counters.get(), 0, counters.size() * sizeof(unsigned)));
  dout.poison();
  Attention a{dq.get(), dcache.get(), c.n_heads, c.n_kv, c.hd, 1.0f / std::sqrt(128.0f), dctx.get(), dseq.get(),
              dtab.get(), p.max_blocks, dout.get(), dws.get(), max_splits, counters.get()};
  a.pdl = true;
  LAUNCH_OK(attention(a, n_q, splits, nullptr));
  const auto all = dout.download();
  for (int i = 0; i < n_q; ++i) {
    Attention one = a;
    one.q = dq.get() + row * i, one.ctx_len = dctx.get() + i, one.seq_of_query = dseq.get() + i, one.out = dout1.get();
    dout1.poison();
    LAUNCH_OK(attention(one, 1, splits, nullptr));
    const auto alone = dout1.download();
    ASSERT_EQ(0, std::memcmp(alone.data(), all.data() + row * i, row * sizeof(uint16_t))) << "row " << i << " ctx " << ctx[i];
    const auto ref = host_attention(p, q.data() + row * i, i, ctx[i], c, a.scale);
    for (size_t j = 0; j < ref.size(); ++j)
      ASSERT_NEAR(from_bf16(alone[j]), ref[j], std::abs(ref[j]) / 256 + 1e-5) << "row " << i << " elem " << j;
  }
  for (unsigned v : counters.download()) ASSERT_EQ(v, 0u);
}

// The tensor-core prefill kernel over a step that mixes prompt runs of three sequences (one from
// position 0, one after a cached prefix of 37, one a lone decode row) for several head shapes, against
// the host softmax in double. The kernel rounds q to bf16 (the reference does the same) and each
// softmax weight p to bf16 (8 significant bits: relative error <= 2^-8) with the sum taken over the
// rounded weights, so an output moves by at most 2^-8 of sum_t p_t |v_t - out| from that (host_attention's
// dev), plus the scores' fp32 sums (also in dev), its own bf16 rounding (|out| / 256) and the fp32 sum
// over the keys (ctx ulps of sum_t p_t |v_t| <= 1). The last case's q in [-8, 8] makes the softmax
// peaked, so a dropped or doubled key or a wrong rescale moves outputs far past that.
TEST(GpuAttention, PrefillTilesOnTensorCoresMatchHost) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(27);
  for (auto [c, q_max] : {std::pair{Case{9, 3, 64}, 2.0f}, std::pair{Case{32, 8, 128}, 2.0f},
                          std::pair{Case{14, 2, 64}, 2.0f}, std::pair{Case{8, 8, 128}, 2.0f},
                          std::pair{Case{9, 3, 64}, 8.0f}}) {
    // Rows: sequence 0 positions 0..149 (tiles of 64, 64, 22), sequence 2 the decode row at 300,
    // sequence 1 positions 37..106 after its cached prefix, then decode rows of sequences 3-5 at
    // contexts 1, 17 and 65 (tiles of at most 16 rows split their keys over the four warps; at
    // context 1 three of them see no key).
    const std::vector<int> seq_len = {150, 107, 301, 1, 17, 65};
    std::vector<int32_t> slot, pos;
    for (int i = 0; i < 150; ++i) slot.push_back(0), pos.push_back(i);
    slot.push_back(2), pos.push_back(300);
    for (int i = 37; i < 107; ++i) slot.push_back(1), pos.push_back(i);
    for (int s : {3, 4, 5}) slot.push_back(s), pos.push_back(seq_len[static_cast<size_t>(s)] - 1);
    const int n_q = static_cast<int>(slot.size());
    std::vector<int32_t> ctx(n_q);
    for (int i = 0; i < n_q; ++i) ctx[i] = pos[i] + 1;
    const Paged p = make_paged(rng, seq_len, c.n_kv, c.hd);
    // One query head a CTA, then the group's heads packed into the tile's rows (pack_group); each
    // with tiles of at most 16 rows run by one warp, then split over four (split_keys).
    for (const auto& [pack, split] : {std::pair{false, false}, std::pair{true, false}, std::pair{false, true},
                                     std::pair{true, true}}) {
      const int G = c.n_heads / c.n_kv;
      std::vector<PrefillTile> tiles(n_q);
      tiles.resize(prefill_tiles(slot.data(), pos.data(), n_q, tiles.data(), pack ? kPrefillTileRows / G : kPrefillTileRows));
      if (!pack) {
        ASSERT_EQ(tiles.size(), 9u);  // 64 + 64 + 22, 1, 64 + 6, 1, 1, 1
      }
      const size_t row = static_cast<size_t>(c.n_heads) * c.hd;
      auto q = random_f32(rng, row * n_q, -q_max, q_max);
      for (float& v : q) v = from_bf16(to_bf16(v));  // what the kernel multiplies
      DeviceBuf<float> dq(q);
      DeviceBuf<uint16_t> dcache(p.cache), dout(row * n_q);
      DeviceBuf<int32_t> dctx(ctx), dtab(p.tables);
      DeviceBuf<PrefillTile> dtiles(tiles);
      ASSERT_TRUE(dq.ok() && dcache.ok() && dout.ok() && dtiles.ok());
      dout.poison();
      const float scale = 1.0f / std::sqrt(static_cast<float>(c.hd));
      PrefillAttention a{dq.get(), dcache.get(), c.n_heads, c.n_kv, c.hd, scale, dctx.get(), dtab.get(),
                         p.max_blocks, dtiles.get(), static_cast<int>(tiles.size()), dout.get()};
      a.pack_group = pack;
      a.split_keys = split;
      LAUNCH_OK(prefill_attention(a, nullptr));
      CUDA_OK(cudaDeviceSynchronize());
      const auto out = dout.download();
      for (int i = 0; i < n_q; ++i) {
        std::vector<double> dev;
        const auto ref = host_attention(p, q.data() + row * i, slot[i], ctx[i], c, scale, &dev, std::ldexp(1.0, -8) * 1.01);  // 2^-8 / (1 - 2^-8), rounded up
        for (size_t j = 0; j < ref.size(); ++j)
          ASSERT_NEAR(from_bf16(out[row * i + j]), ref[j], std::abs(ref[j]) / 256 + dev[j] + ctx[i] * std::ldexp(1.0, -22))
              << (pack ? "packed groups, " : "") << (split ? "split keys, " : "") << "q in +-" << q_max << " heads " << c.n_heads << "/" << c.n_kv << " hd "
              << c.hd << " row " << i << " (slot " << slot[i] << ", position " << pos[i] << ") elem " << j;
      }
    }
  }
}

// The tiling rule, on the host: a tile is one table row at consecutive positions, at most 64 rows.
TEST(GpuAttention, PrefillTilesFollowRunsOfOneSequence) {
  const std::vector<int32_t> slot = {4, 4, 4, 4, 7, 7, 4, 4};
  const std::vector<int32_t> pos = {10, 11, 12, 20, 0, 1, 21, 22};
  std::vector<PrefillTile> t(slot.size());
  t.resize(prefill_tiles(slot.data(), pos.data(), static_cast<int>(slot.size()), t.data()));
  ASSERT_EQ(t.size(), 4u);
  const int want[4][3] = {{0, 3, 4}, {3, 1, 4}, {4, 2, 7}, {6, 2, 4}};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(t[i].row0, want[i][0]) << "tile " << i;
    EXPECT_EQ(t[i].n_rows, want[i][1]) << "tile " << i;
    EXPECT_EQ(t[i].slot, want[i][2]) << "tile " << i;
  }
  // One run of 200 positions: tiles of at most max_rows, back to back. 64 rows a tile, then packed
  // groups (pack_group) at 64 / 4 heads a group.
  std::vector<int32_t> s200(200, 1), p200(200);
  std::iota(p200.begin(), p200.end(), 5);
  for (const auto& [max_rows, tiles] : {std::pair{kPrefillTileRows, 4u}, std::pair{kPrefillTileRows / 4, 13u}}) {
    std::vector<PrefillTile> t200(200);
    t200.resize(prefill_tiles(s200.data(), p200.data(), 200, t200.data(), max_rows));
    ASSERT_EQ(t200.size(), tiles) << "max_rows " << max_rows;  // 3 x 64 + 8; 12 x 16 + 8
    int covered = 0;
    for (const PrefillTile& x : t200) {
      EXPECT_EQ(x.row0, covered);
      EXPECT_LE(x.n_rows, max_rows);
      covered += x.n_rows;
    }
    EXPECT_EQ(covered, 200);
  }
}

// build_tiles (the device loop's graphs make their tiles on the GPU) gives prefill_tiles' tiles, on
// rows in runs of random lengths (a run breaks where the slot changes or a position is skipped) at
// sizes around the warp's 32 rows and several tile limits.
TEST(GpuAttention, DeviceTilesEqualTheHostRule) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(29);
  for (int T : {1, 2, 31, 32, 33, 64, 100, 1000}) {
    for (int max_rows : {1, 3, 16, 21, 64}) {
      std::vector<int32_t> slot, pos;
      while (static_cast<int>(slot.size()) < T) {
        const int s = static_cast<int>(rng() % 4), len = 1 + static_cast<int>(rng() % 90), p0 = static_cast<int>(rng() % 50);
        for (int i = 0; i < len && static_cast<int>(slot.size()) < T; ++i) {
          slot.push_back(s);
          pos.push_back(p0 + i + (rng() % 23 == 0 ? 1 : 0));  // now and then a skipped position
        }
      }
      std::vector<PrefillTile> want(T);
      want.resize(prefill_tiles(slot.data(), pos.data(), T, want.data(), max_rows));
      DeviceBuf<int32_t> dslot(slot), dpos(pos), dcount(1);
      DeviceBuf<PrefillTile> dtiles(static_cast<size_t>(T));
      ASSERT_TRUE(dslot.ok() && dpos.ok() && dcount.ok() && dtiles.ok());
      dtiles.poison();
      LAUNCH_OK(build_tiles(dslot.get(), dpos.get(), T, max_rows, dtiles.get(), dcount.get(), nullptr));
      CUDA_OK(cudaDeviceSynchronize());
      const auto count = dcount.download();
      const auto got = dtiles.download();
      ASSERT_EQ(count[0], static_cast<int32_t>(want.size())) << "T " << T << " max_rows " << max_rows;
      for (size_t i = 0; i < want.size(); ++i) {
        EXPECT_EQ(got[i].row0, want[i].row0) << "T " << T << " max_rows " << max_rows << " tile " << i;
        EXPECT_EQ(got[i].n_rows, want[i].n_rows) << "T " << T << " max_rows " << max_rows << " tile " << i;
        EXPECT_EQ(got[i].slot, want[i].slot) << "T " << T << " max_rows " << max_rows << " tile " << i;
      }
    }
  }
  EXPECT_FALSE(build_tiles(nullptr, nullptr, 70000, 64, nullptr, nullptr, nullptr).ok());
  EXPECT_FALSE(build_tiles(nullptr, nullptr, 10, 0, nullptr, nullptr, nullptr).ok());
}

TEST(GpuAttention, PrefillRejectsUnsupportedShapes) {
  PrefillAttention a{};
  a.n_heads = 32, a.n_kv = 8, a.hd = 256, a.n_tiles = 1;
  EXPECT_FALSE(prefill_attention(a, nullptr).ok());  // head dim
  a.hd = 128, a.n_kv = 3;
  EXPECT_FALSE(prefill_attention(a, nullptr).ok());  // heads not a multiple of kv heads
  a.n_kv = 8, a.n_tiles = 70000;
  EXPECT_FALSE(prefill_attention(a, nullptr).ok());  // grid
}

TEST(GpuAttention, RejectsUnsupportedShapes) {
  Attention a{};
  a.n_heads = 32, a.n_kv = 8, a.hd = 96, a.max_splits = 1;
  EXPECT_FALSE(attention(a, 1, 1, nullptr).ok());  // head dim
  a.hd = 128, a.n_kv = 3;
  EXPECT_FALSE(attention(a, 1, 1, nullptr).ok());  // heads not a multiple of kv heads
  a.n_heads = 32, a.n_kv = 2;
  EXPECT_FALSE(attention(a, 1, 1, nullptr).ok());  // group of 16
  a.n_kv = 8;
  EXPECT_FALSE(attention(a, 1, 4, nullptr).ok());  // splits past max_splits, no workspace
}

}  // namespace
}  // namespace ss::cuda::test
