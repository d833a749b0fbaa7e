// The CPU forward pass against logits computed independently by Hugging Face transformers
// (tools/reference/*.py), plus the KV-cache paths (prefill, token-by-token decode, chunked prefill,
// several sequences in one batch), batch invariance and batch validation.
//
// Tolerances, and why:
//  * Synthetic models (tests/data/models, F32/F16/BF16 weights): our matmuls on float weights are
//    fp32 FMA with no activation rounding, so the only differences from transformers' fp32 forward
//    are summation order and exp/sqrt/cos ulps: max |dlogit| <= kSynthRelTol * max|logit| (measured
//    ~1e-6 relative; kSynthRelTol = 1e-4) and top-1 identical wherever the reference top-2 margin
//    exceeds that bound.
//  * SmolLM2-135M Q4_1 (the default model), fp32 kernels (Isa::Scalar: weights dequantized exactly as
//    transformers does, fp32 dot products): the same arithmetic as the reference up to summation
//    order, so |dlogit| <= kExactTol = 0.02 (the reference's full rows are stored as fp16: 0.0078
//    rounding at |logit| < 32; measured max 0.0078) and top-1 identical unless the margin is below it.
//  * The same model on the SIMD kernels, which (like llama.cpp) round every matmul input to 8-bit
//    blocks of 32. make_logits_ref.py measures that rounding alone in transformers ("q8sim"): it moves
//    logits by up to 2.13 (|logit| reaches 35) and the top-2 gap by up to 0.65, flipping top-1 at 9 of
//    146 positions (float margin <= 0.44). The noise is chaotic (1e-6 relative jitter before rounding
//    changes the logits by 2.10), so no 8-bit implementation can be held closer than that. Hence:
//    |dlogit| <= kQuantTol = 3.0 on the stored full rows and the top-8 of every position (1.4x the
//    measured noise; we measure <= 1.6), and top-1 equal to the reference wherever its margin exceeds
//    kQuantMargin = 1.0 (1.5x the largest measured gap shift), differing at <= 10% of positions.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "model/model.h"

namespace {

using ss::backend::Backend;
using ss::backend::BackendOptions;
using ss::backend::StepBatch;
using ss::backend::StepOutput;
using json = nlohmann::json;

constexpr double kSynthRelTol = 2e-5;
constexpr double kF16KvRelTol = 2e-3;
constexpr double kExactTol = 0.02;
constexpr double kQuantTol = 3.0;
constexpr double kQuantMargin = 1.0;

const std::string kData = std::string(SS_SOURCE_DIR) + "/tests/data";

json read_json(const std::string& path) {
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << path;
  return json::parse(f);
}

std::vector<char> read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << path;
  return std::vector<char>(std::istreambuf_iterator<char>(f), {});
}

std::unique_ptr<ss::model::Model> load(const std::string& path) {
  ss::model::LoadOptions lo;
  lo.load_tokenizer = false;  // forward needs none; tokenizer.json is the tokenizer tests' business
  auto m = ss::model::load_model(path, lo);
  EXPECT_TRUE(m.ok()) << (m.ok() ? "" : m.message());
  return m.ok() ? std::move(m).value() : nullptr;
}

using KvType = ss::backend::KvCacheConfig::DType;

std::unique_ptr<Backend> make_backend(const ss::model::Model& m, int num_blocks, int threads = 2, int block_size = 16,
                                      KvType kv_type = KvType::F32) {
  BackendOptions o;
  o.threads = threads;
  o.kv.num_blocks = num_blocks;
  o.kv.block_size = block_size;
  o.kv.dtype = kv_type;
  auto be = ss::backend::make_cpu_backend(m, o);
  EXPECT_TRUE(be.ok()) << (be.ok() ? "" : be.message());
  return be.ok() ? std::move(be).value() : nullptr;
}

// The tests speak in whole block tables per batch sequence; forward() hands them to the backend as
// table edits of slots 0..n-1 and copies the raw logits rows out.
struct Batch : StepBatch {
  std::vector<std::vector<int32_t>> block_tables;
};
ss::Status forward(Backend& be, const Batch& b, float* logits) {
  StepBatch s = b;
  s.seq_slot.clear();
  s.table_edits.clear();
  s.edit_blocks.clear();
  for (size_t i = 0; i < b.block_tables.size(); ++i) {
    s.seq_slot.push_back(static_cast<int32_t>(i));
    s.edit_table(static_cast<int32_t>(i), 0, b.block_tables[i]);
  }
  StepOutput out;
  SS_TRY(be.step(s, out));
  if (!out.logits.empty()) std::memcpy(logits, out.logits.data(), out.logits.size() * sizeof(float));
  return {};
}

std::vector<int32_t> blocks(int first, int n) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = first + i;
  return t;
}

// Tokens [begin, end) of one sequence as one step; logits for every row, [end-begin][V].
std::vector<float> step(Backend& be, int V, const std::vector<int32_t>& ids, int begin, int end,
                        const std::vector<int32_t>& table) {
  Batch b;
  b.block_tables = {table};
  for (int i = begin; i < end; ++i) {
    b.tokens.push_back(ids[i]);
    b.positions.push_back(i);
    b.seq_index.push_back(0);
    b.logits_rows.push_back(i - begin);
  }
  std::vector<float> out(static_cast<size_t>(end - begin) * V);
  auto st = forward(be, b, out.data());
  EXPECT_TRUE(st.ok()) << (st.ok() ? "" : st.message());
  return out;
}

// Whole sequence in chunks of `chunk` tokens: logits of every position.
std::vector<float> run_chunked(Backend& be, int V, const std::vector<int32_t>& ids, const std::vector<int32_t>& table,
                               int chunk) {
  std::vector<float> all;
  for (int b = 0; b < static_cast<int>(ids.size()); b += chunk) {
    auto l = step(be, V, ids, b, std::min<int>(ids.size(), b + chunk), table);
    all.insert(all.end(), l.begin(), l.end());
  }
  return all;
}

// Several sequences in one batch, tokens interleaved round-robin; logits of every position, per sequence.
std::vector<std::vector<float>> run_interleaved(Backend& be, int V, const std::vector<std::vector<int32_t>>& seqs,
                                                const std::vector<std::vector<int32_t>>& tables) {
  Batch b;
  b.block_tables = tables;
  std::vector<std::pair<int, int>> where;  // (seq, pos) per row
  size_t longest = 0;
  for (const auto& s : seqs) longest = std::max(longest, s.size());
  for (size_t p = 0; p < longest; ++p)
    for (size_t s = 0; s < seqs.size(); ++s)
      if (p < seqs[s].size()) {
        b.tokens.push_back(seqs[s][p]);
        b.positions.push_back(static_cast<int32_t>(p));
        b.seq_index.push_back(static_cast<int32_t>(s));
        b.logits_rows.push_back(static_cast<int32_t>(where.size()));
        where.emplace_back(static_cast<int>(s), static_cast<int>(p));
      }
  std::vector<float> out(where.size() * V);
  auto st = forward(be, b, out.data());
  EXPECT_TRUE(st.ok()) << (st.ok() ? "" : st.message());
  std::vector<std::vector<float>> res(seqs.size());
  for (size_t s = 0; s < seqs.size(); ++s) res[s].resize(seqs[s].size() * V);
  for (size_t r = 0; r < where.size(); ++r)
    std::memcpy(res[where[r].first].data() + static_cast<size_t>(where[r].second) * V, out.data() + r * V,
                sizeof(float) * V);
  return res;
}

int argmax(const float* x, int n) { return static_cast<int>(std::max_element(x, x + n) - x); }

bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// ------------------------------------------------------------------------------------------------
// Synthetic models: qwen2-tiny (BF16, QKV bias), qwen3-tiny (F16, q/k norm, linear RoPE scaling),
// llama3-tiny (F32, llama3 RoPE scaling, untied lm_head).

struct SynthRef {
  std::vector<std::vector<int32_t>> ids;
  std::vector<std::vector<float>> logits;  // per sequence [n][V]
  std::vector<std::vector<float>> margin;
  int V = 0;
};

SynthRef load_synth_ref(const std::string& name) {
  SynthRef r;
  const json j = read_json(kData + "/reference/" + name + ".json");
  const auto bytes = read_bytes(kData + "/reference/" + j["logits_file"].get<std::string>());
  r.V = j["vocab_size"];
  size_t off = 0;
  for (const auto& s : j["sequences"]) {
    r.ids.push_back(s["ids"].get<std::vector<int32_t>>());
    r.margin.push_back(s["margin"].get<std::vector<float>>());
    std::vector<float> l(r.ids.back().size() * r.V);
    EXPECT_LE(off + l.size() * 4, bytes.size());
    if (off + l.size() * 4 <= bytes.size()) std::memcpy(l.data(), bytes.data() + off, l.size() * 4);
    off += l.size() * 4;
    r.logits.push_back(std::move(l));
  }
  EXPECT_EQ(off, bytes.size());
  return r;
}

class SynthForward : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    ref_ = load_synth_ref(GetParam());
    model_ = load(kData + "/models/" + GetParam());
    ASSERT_NE(model_, nullptr);
    ASSERT_EQ(model_->config.vocab_size, ref_.V);
    V_ = ref_.V;
  }
  void TearDown() override { ss::cpu::clear_forced_isa(); }
  // Sequence s uses blocks [32s, 32s+32): 512 positions each; kBlocks covers two sets of tables.
  static constexpr int kSeqBlocks = 32;
  std::vector<int32_t> table(size_t s) const { return blocks(kSeqBlocks * static_cast<int>(s), kSeqBlocks); }
  int n_blocks() const { return 2 * kSeqBlocks * static_cast<int>(ref_.ids.size()); }
  std::vector<std::vector<int32_t>> tables(size_t first) const {
    std::vector<std::vector<int32_t>> t;
    for (size_t s = 0; s < ref_.ids.size(); ++s) t.push_back(table(first + s));
    return t;
  }

  void expect_lossy_cache(KvType type, double rel_tol, const char* name);

  void expect_matches_ref(const std::vector<float>& got, size_t s, const char* what) {
    const auto& ref = ref_.logits[s];
    ASSERT_EQ(got.size(), ref.size());
    const int n = static_cast<int>(ref_.ids[s].size());
    double scale = 0, max_d = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      scale = std::max(scale, std::abs(static_cast<double>(ref[i])));
      max_d = std::max(max_d, std::abs(static_cast<double>(got[i]) - ref[i]));
    }
    const double tol = kSynthRelTol * std::max(1.0, scale);
    EXPECT_LE(max_d, tol) << what << ": sequence " << s << " max |dlogit| " << max_d << " (logit scale " << scale << ")";
    for (int p = 0; p < n; ++p) {
      const int a = argmax(got.data() + static_cast<size_t>(p) * V_, V_);
      const int e = argmax(ref.data() + static_cast<size_t>(p) * V_, V_);
      if (ref_.margin[s][p] > 2 * tol) {
        EXPECT_EQ(a, e) << what << ": sequence " << s << " position " << p;
      }
    }
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3g", max_d / scale);
    RecordProperty(std::string(what) + "_seq" + std::to_string(s) + "_max_rel_diff", buf);
  }

  SynthRef ref_;
  std::unique_ptr<ss::model::Model> model_;
  int V_ = 0;
};

TEST_P(SynthForward, PrefillMatchesReference) {
  auto be = make_backend(*model_, n_blocks());
  ASSERT_NE(be, nullptr);
  for (size_t s = 0; s < ref_.ids.size(); ++s) {
    const auto& ids = ref_.ids[s];
    expect_matches_ref(step(*be, V_, ids, 0, ids.size(), table(s)), s, "prefill");
  }
}

TEST_P(SynthForward, DecodeAndChunkedPrefillAreBitIdenticalToPrefill) {
  auto be = make_backend(*model_, n_blocks());
  ASSERT_NE(be, nullptr);
  const size_t s = ref_.ids.size() - 1;  // the longest: spans 3 or more KV blocks
  const auto& ids = ref_.ids[s];
  const auto prefill = step(*be, V_, ids, 0, ids.size(), table(s));
  const auto decode = run_chunked(*be, V_, ids, table(s), 1);
  expect_matches_ref(decode, s, "decode");
  EXPECT_TRUE(bit_equal(prefill, decode)) << "token-by-token decode differs from one-batch prefill";
  const auto chunked = run_chunked(*be, V_, ids, table(s), 5);
  EXPECT_TRUE(bit_equal(prefill, chunked)) << "prefill in chunks of 5 differs from one-batch prefill";
}

TEST_P(SynthForward, SequencesBatchedTogether) {
  auto be = make_backend(*model_, n_blocks());
  ASSERT_NE(be, nullptr);
  std::vector<std::vector<float>> alone;
  for (size_t s = 0; s < ref_.ids.size(); ++s)
    alone.push_back(step(*be, V_, ref_.ids[s], 0, ref_.ids[s].size(), table(s)));
  const auto batched = run_interleaved(*be, V_, ref_.ids, tables(ref_.ids.size()));
  for (size_t s = 0; s < ref_.ids.size(); ++s) {
    expect_matches_ref(batched[s], s, "batched");
    EXPECT_TRUE(bit_equal(alone[s], batched[s])) << "sequence " << s << ": batched logits differ from alone";
  }
}

TEST_P(SynthForward, MixedPrefillAndDecodeStep) {
  // One step holding a decode token of sequence 1 (its prefix already cached) and the whole prompt of
  // sequence 2, with block tables in scattered order: same bits as each alone.
  auto be = make_backend(*model_, 40);
  ASSERT_NE(be, nullptr);
  const auto& a = ref_.ids[1];
  const auto& c = ref_.ids[2];
  const std::vector<int32_t> ta = {33, 5, 17, 2}, tc = {9, 30, 1, 22, 38};
  const auto a_alone = step(*be, V_, a, 0, a.size(), ta);
  const auto c_alone = step(*be, V_, c, 0, c.size(), tc);

  auto be2 = make_backend(*model_, 40);
  step(*be2, V_, a, 0, a.size() - 1, ta);  // cache the prefix of a
  Batch b;
  b.block_tables = {ta, tc};
  b.tokens.push_back(a.back());
  b.positions.push_back(static_cast<int32_t>(a.size() - 1));
  b.seq_index.push_back(0);
  for (size_t p = 0; p < c.size(); ++p) {
    b.tokens.push_back(c[p]);
    b.positions.push_back(static_cast<int32_t>(p));
    b.seq_index.push_back(1);
  }
  b.logits_rows = {static_cast<int32_t>(c.size()), 0};  // last of c, then the decode row
  std::vector<float> out(2 * V_);
  ASSERT_TRUE(forward(*be2, b, out.data()).ok());
  EXPECT_EQ(0, std::memcmp(out.data(), c_alone.data() + (c.size() - 1) * V_, sizeof(float) * V_));
  EXPECT_EQ(0, std::memcmp(out.data() + V_, a_alone.data() + (a.size() - 1) * V_, sizeof(float) * V_));
}

TEST_P(SynthForward, ThreadCountAndBlockSizeDoNotChangeResults) {
  const size_t s = ref_.ids.size() - 1;
  const auto& ids = ref_.ids[s];
  auto be1 = make_backend(*model_, n_blocks(), 1);
  auto be3 = make_backend(*model_, n_blocks(), 3);
  const auto l1 = step(*be1, V_, ids, 0, ids.size(), table(s));
  const auto l3 = step(*be3, V_, ids, 0, ids.size(), table(s));
  EXPECT_TRUE(bit_equal(l1, l3)) << "1 thread vs 3 threads";
  // Other block sizes pad/split the 16-key chunks differently (block_size 1: one key per chunk, so
  // 128 keys per softmax pass and several passes for the longest sequence); within tolerance.
  for (int bs : {1, 7, 32}) {
    auto be = make_backend(*model_, (ids.size() + bs - 1) / bs, 2, bs);
    ASSERT_NE(be, nullptr);
    expect_matches_ref(step(*be, V_, ids, 0, ids.size(), blocks(0, (ids.size() + bs - 1) / bs)), s,
                       ("block_size_" + std::to_string(bs)).c_str());
  }
}

// The last reference sequence through a cache of `type` on every ISA: logits within rel_tol of the
// (fp32) reference's scale, and token by token and batched bit for bit equal to the prefill.
void SynthForward::expect_lossy_cache(KvType type, double rel_tol, const char* name) {
  const size_t s = ref_.ids.size() - 1;
  const auto& ids = ref_.ids[s];
  for (auto isa : {ss::cpu::Isa::Scalar, ss::cpu::Isa::Avx2, ss::cpu::Isa::Avx512}) {
    if (static_cast<int>(isa) > static_cast<int>(ss::cpu::detected_isa())) continue;
    ss::cpu::force_isa(isa);
    SCOPED_TRACE(ss::cpu::isa_name(isa));
    auto be = make_backend(*model_, n_blocks(), 2, 16, type);
    ASSERT_NE(be, nullptr);
    const auto prefill = step(*be, V_, ids, 0, ids.size(), table(s));
    double scale = 0, max_d = 0;
    for (size_t i = 0; i < prefill.size(); ++i) {
      scale = std::max(scale, std::abs(double(ref_.logits[s][i])));
      max_d = std::max(max_d, std::abs(double(prefill[i]) - ref_.logits[s][i]));
    }
    EXPECT_LE(max_d, rel_tol * scale) << "max |dlogit| " << max_d << " (scale " << scale << ")";
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3g", max_d / scale);
    RecordProperty(std::string(name) + "_" + ss::cpu::isa_name(isa) + "_max_rel_diff", buf);
    EXPECT_TRUE(bit_equal(prefill, run_chunked(*be, V_, ids, table(s), 1)));
    const auto batched = run_interleaved(*be, V_, ref_.ids, tables(ref_.ids.size()));
    EXPECT_TRUE(bit_equal(prefill, batched[s]));
  }
}

TEST_P(SynthForward, Fp16KvCache) {
  // fp16 K/V (11-bit significand) perturbs scores and values by <= 2^-12 relative: logits move by
  // <= 3.3e-4 of their scale here (measured); hold them to kF16KvRelTol, and keep every invariance.
  expect_lossy_cache(KvType::F16, kF16KvRelTol, "f16kv");
}

TEST_P(SynthForward, Q8KvCache) {
  // Q8 K/V: each element within half a step of max|head| / 127, i.e. <= 2^-8 of the head's largest
  // value, where fp16's bound is 2^-12 of the element itself: held to 16x kF16KvRelTol (measured
  // 0.0043-0.0058 of the scale). Every invariance (token by token, batched) stays bit for bit.
  expect_lossy_cache(KvType::Q8, 16 * kF16KvRelTol, "q8kv");
}

TEST_P(SynthForward, EveryIsaMatchesReference) {
  for (auto isa : {ss::cpu::Isa::Scalar, ss::cpu::Isa::Avx2, ss::cpu::Isa::Avx512}) {
    if (static_cast<int>(isa) > static_cast<int>(ss::cpu::detected_isa())) continue;
    ss::cpu::force_isa(isa);
    SCOPED_TRACE(ss::cpu::isa_name(isa));
    auto be = make_backend(*model_, n_blocks());
    ASSERT_NE(be, nullptr);
    for (size_t s = 0; s < ref_.ids.size(); ++s) {
      const auto& ids = ref_.ids[s];
      const auto prefill = step(*be, V_, ids, 0, ids.size(), table(s));
      expect_matches_ref(prefill, s, (std::string(ss::cpu::isa_name(isa)) + "_prefill").c_str());
      EXPECT_TRUE(bit_equal(prefill, run_chunked(*be, V_, ids, table(s), 1))) << "sequence " << s;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, SynthForward, ::testing::Values("qwen2-tiny", "qwen3-tiny", "llama3-tiny"),
                         [](const auto& info) {
                           std::string n = info.param;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

// ------------------------------------------------------------------------------------------------
// Batch validation: a bad batch is an error, never a crash or an out-of-bounds write.

class BadBatch : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = load(kData + "/models/qwen2-tiny");
    ASSERT_NE(model_, nullptr);
    be_ = make_backend(*model_, 4);
    ASSERT_NE(be_, nullptr);
    good_.tokens = {1, 2, 3};
    good_.positions = {0, 1, 2};
    good_.seq_index = {0, 0, 0};
    good_.block_tables = {{0}};
    good_.logits_rows = {2};
    logits_.resize(4 * model_->config.vocab_size);
    ASSERT_TRUE(forward(*be_, good_, logits_.data()).ok());
  }
  std::string error_of(const Batch& b, float* logits) {
    auto st = forward(*be_, b, logits);
    return st.ok() ? std::string("<ok>") : st.message();
  }
  std::unique_ptr<ss::model::Model> model_;
  std::unique_ptr<Backend> be_;
  Batch good_;
  std::vector<float> logits_;
};

TEST_F(BadBatch, ReturnsErrors) {
  float* out = logits_.data();
  auto b = good_;
  b.tokens[1] = model_->config.vocab_size;
  EXPECT_NE(error_of(b, out).find("outside the vocabulary"), std::string::npos) << error_of(b, out);
  b = good_;
  b.tokens[0] = -1;
  EXPECT_NE(error_of(b, out).find("outside the vocabulary"), std::string::npos);
  b = good_;
  b.positions[2] = 16;  // needs block 1; the table has 1 entry
  EXPECT_NE(error_of(b, out).find("block table has 1 entries"), std::string::npos) << error_of(b, out);
  b = good_;
  b.positions[0] = -3;
  EXPECT_NE(error_of(b, out).find("negative position"), std::string::npos);
  b = good_;
  b.positions[2] = 1 << 24;  // a table long enough for it must not make the backend allocate for it
  b.block_tables = {std::vector<int32_t>((1 << 24) / 16 + 1, 0)};
  EXPECT_NE(error_of(b, out).find("past the model's context"), std::string::npos) << error_of(b, out);
  b = good_;
  b.block_tables = {{4}};  // the cache has blocks 0..3
  EXPECT_NE(error_of(b, out).find("outside the KV cache"), std::string::npos) << error_of(b, out);
  b = good_;
  b.seq_index[1] = 1;
  EXPECT_NE(error_of(b, out).find("sequence index"), std::string::npos);
  b = good_;
  b.positions.pop_back();
  EXPECT_NE(error_of(b, out).find("positions"), std::string::npos);
  b = good_;
  b.logits_rows = {3};
  EXPECT_NE(error_of(b, out).find("logits_rows"), std::string::npos);
  b = good_;
  b.positions = {0, 1, 1};
  EXPECT_NE(error_of(b, out).find("same KV slot"), std::string::npos) << error_of(b, out);
  b = good_;
  b.block_tables = {{0}, {0}};
  b.seq_index = {0, 0, 1};
  b.positions = {0, 1, 1};  // two sequences sharing block 0 and both writing slot 1
  EXPECT_NE(error_of(b, out).find("same KV slot"), std::string::npos);
  // The backend still works after rejected batches.
  EXPECT_TRUE(forward(*be_, good_, out).ok());
  // An empty batch is a no-op.
  EXPECT_TRUE(forward(*be_, Batch{}, nullptr).ok());
}

TEST(CpuBackendOptions, RejectsBadKvConfig) {
  auto model = load(kData + "/models/qwen2-tiny");
  ASSERT_NE(model, nullptr);
  BackendOptions o;
  o.kv.block_size = 0;
  auto be = ss::backend::make_cpu_backend(*model, o);
  ASSERT_FALSE(be.ok());
  EXPECT_NE(be.message().find("block_size"), std::string::npos);
}

TEST(CpuBackendOptions, GrowsPastMaxBatchTokens) {
  auto model = load(kData + "/models/llama3-tiny");
  ASSERT_NE(model, nullptr);
  BackendOptions o;
  o.threads = 2;
  o.kv.num_blocks = 8;
  o.max_batch_tokens = 4;
  auto be = ss::backend::make_cpu_backend(*model, o);
  ASSERT_TRUE(be.ok());
  auto ref = load_synth_ref("llama3-tiny");
  const auto l = step(**be, ref.V, ref.ids[1], 0, ref.ids[1].size(), blocks(0, 8));
  double max_d = 0;
  for (size_t i = 0; i < l.size(); ++i) max_d = std::max(max_d, std::abs(double(l[i]) - ref.logits[1][i]));
  EXPECT_LT(max_d, 1e-2);
}

// Batched KV block copies (what the tiers' restores use): a prompt's blocks read out in one batch
// and written back into other blocks in one batch come back bit-identical; a batch with one bad
// entry (a block out of range, negative, a wrong size) is an error naming it, and copies nothing,
// not even the good entries before it.
TEST(CpuBackendKvBlocks, BatchedCopiesAreExactAndBadEntriesCopyNothing) {
  auto model = load(kData + "/models/llama3-tiny");
  ASSERT_NE(model, nullptr);
  auto be = make_backend(*model, 8, 2, 16, KvType::F16);
  ASSERT_NE(be, nullptr);
  auto ref = load_synth_ref("llama3-tiny");
  const int n = std::min<int>(32, static_cast<int>(ref.ids[1].size()));
  ASSERT_GE(n, 17);  // two blocks hold computed K/V
  step(*be, ref.V, ref.ids[1], 0, n, blocks(0, 2));
  const size_t bytes = static_cast<size_t>(be->kv_block_bytes());
  ASSERT_GT(bytes, 0u);
  auto snapshot = [&] {  // every block, one at a time (the single-block path as the reference)
    std::vector<std::vector<uint8_t>> all(8, std::vector<uint8_t>(bytes));
    for (int b = 0; b < 8; ++b) EXPECT_TRUE(be->read_kv_block(b, all[static_cast<size_t>(b)]).ok());
    return all;
  };
  const auto before = snapshot();
  std::vector<std::vector<uint8_t>> got(2, std::vector<uint8_t>(bytes, 0xAB));
  const std::vector<ss::backend::KvBlockOut> out = {{0, got[0]}, {1, got[1]}};
  ASSERT_TRUE(be->read_kv_blocks(out).ok());
  EXPECT_EQ(got[0], before[0]);
  EXPECT_EQ(got[1], before[1]);
  const std::vector<ss::backend::KvBlockIn> in = {{6, got[0]}, {5, got[1]}};
  ASSERT_TRUE(be->write_kv_blocks(in).ok());
  auto after = snapshot();
  EXPECT_EQ(after[6], before[0]);
  EXPECT_EQ(after[5], before[1]);

  const std::vector<uint8_t> noise(bytes, 0x5A), short_block(bytes - 1, 0x5A);
  const auto error_of = [&](std::vector<ss::backend::KvBlockIn> batch) {
    const auto st = be->write_kv_blocks(batch);
    return st.ok() ? std::string("<ok>") : st.message();
  };
  std::string e = error_of({{2, noise}, {8, noise}});  // the cache has blocks 0..7
  EXPECT_NE(e.find("copy 1 of 2 (block 8,"), std::string::npos) << e;
  EXPECT_NE(e.find("[0, 8)"), std::string::npos) << e;
  EXPECT_NE(e.find("nothing copied"), std::string::npos) << e;
  e = error_of({{-1, noise}});
  EXPECT_NE(e.find("block -1"), std::string::npos) << e;
  e = error_of({{2, noise}, {3, noise}, {4, short_block}});
  EXPECT_NE(e.find("copy 2 of 3 (block 4, " + std::to_string(bytes - 1) + " bytes)"), std::string::npos) << e;
  EXPECT_NE(e.find(std::to_string(bytes) + " bytes; nothing copied"), std::string::npos) << e;
  EXPECT_EQ(snapshot(), after) << "a rejected batch wrote some of its blocks";
  std::vector<uint8_t> untouched(bytes, 0xCD), small(bytes / 2, 0xCD);
  const auto st = be->read_kv_blocks(std::vector<ss::backend::KvBlockOut>{{0, untouched}, {1, small}});
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(untouched, std::vector<uint8_t>(bytes, 0xCD)) << "a rejected read batch copied its first block";
  EXPECT_TRUE(be->write_kv_blocks({}).ok());  // an empty batch is a no-op
}

// ------------------------------------------------------------------------------------------------
// The default model, SmolLM2-135M-Instruct Q4_1, against transformers (skipped when not downloaded).

std::string default_model_path() {
  std::string base;
  if (const char* h = std::getenv("SELFSERVE_HOME"); h && *h) {
    base = std::string(h) + "/models";
  } else if (const char* home = std::getenv("HOME"); home && *home) {
    base = std::string(home) + "/.cache/selfserve/models";
  }
  return base + "/SmolLM2-135M-Instruct.Q4_1.gguf";
}

float half_to_float(uint16_t h) { return ss::model::fp16_to_fp32(h); }

struct Prompt {
  std::vector<int32_t> ids, argmax;
  std::vector<float> margin;
  std::vector<std::vector<int32_t>> topk_ids;
  std::vector<std::vector<float>> topk_logits;
};
struct FullRow {
  int prompt, pos;
  std::vector<float> logits;
};

class DefaultModel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string path = default_model_path();
    if (!std::filesystem::exists(path)) return;
    model_ = load(path).release();
    const json j = read_json(kData + "/reference/smollm2-135m-instruct-q4_1.json");
    V_ = j["vocab_size"];
    for (const auto& p : j["prompts"]) {
      Prompt q;
      q.ids = p["ids"].get<std::vector<int32_t>>();
      q.argmax = p["argmax"].get<std::vector<int32_t>>();
      q.margin = p["margin"].get<std::vector<float>>();
      q.topk_ids = p["topk_ids"].get<std::vector<std::vector<int32_t>>>();
      q.topk_logits = p["topk_logits"].get<std::vector<std::vector<float>>>();
      prompts_.push_back(std::move(q));
    }
    const auto bytes = read_bytes(kData + "/reference/" + j["logits_file"].get<std::string>());
    size_t off = 0;
    for (const auto& f : j["full_logits"]) {
      FullRow r{f["prompt"], f["pos"], std::vector<float>(V_)};
      for (int i = 0; i < V_; ++i) {
        uint16_t h;
        std::memcpy(&h, bytes.data() + off + 2 * i, 2);
        r.logits[i] = half_to_float(h);
      }
      off += 2 * static_cast<size_t>(V_);
      full_.push_back(std::move(r));
    }
    EXPECT_EQ(off, bytes.size());
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }
  void SetUp() override {
    if (!model_) GTEST_SKIP() << "default model not found at " << default_model_path() << " (download it to run)";
  }
  void TearDown() override { ss::cpu::clear_forced_isa(); }

  // Checks the logits of every position of prompt `pi` against the reference: |dlogit| <= tol on its
  // top-8 at every position and on the stored full rows; top-1 equal wherever the margin exceeds
  // `margin`, and equal at >= 90% of positions.
  void check_prompt(int pi, const std::vector<float>& got, const char* what, double tol, double margin) {
    const Prompt& p = prompts_[pi];
    const int n = static_cast<int>(p.ids.size());
    ASSERT_EQ(got.size(), static_cast<size_t>(n) * V_);
    int top1_diff = 0;
    double max_topk = 0, max_full = 0;
    for (int pos = 0; pos < n; ++pos) {
      const float* l = got.data() + static_cast<size_t>(pos) * V_;
      const int a = argmax(l, V_);
      if (a != p.argmax[pos]) {
        ++top1_diff;  // allowed only where the reference itself is nearly tied
        EXPECT_LT(p.margin[pos], margin) << what << ": prompt " << pi << " pos " << pos << " top-1 " << a
                                         << " vs reference " << p.argmax[pos];
      }
      for (size_t k = 0; k < p.topk_ids[pos].size(); ++k)
        max_topk = std::max(max_topk, std::abs(double(l[p.topk_ids[pos][k]]) - p.topk_logits[pos][k]));
    }
    for (const FullRow& r : full_) {
      if (r.prompt != pi) continue;
      for (int i = 0; i < V_; ++i)
        max_full = std::max(max_full, std::abs(double(got[static_cast<size_t>(r.pos) * V_ + i]) - r.logits[i]));
    }
    EXPECT_LE(max_topk, tol) << what << ": prompt " << pi << " top-8 logits";
    EXPECT_LE(max_full, tol) << what << ": prompt " << pi << " full logit rows";
    EXPECT_LE(top1_diff * 10, n) << what << ": prompt " << pi << " top-1 differs at " << top1_diff << " positions";
    std::printf("[ %s ] prompt %d: %d tokens, top-1 differs at %d, max|dlogit| top-8 %.4f, full rows %.4f\n", what, pi,
                n, top1_diff, max_topk, max_full);
  }

  static ss::model::Model* model_;
  static int V_;
  static std::vector<Prompt> prompts_;
  static std::vector<FullRow> full_;
};
ss::model::Model* DefaultModel::model_ = nullptr;
int DefaultModel::V_ = 0;
std::vector<Prompt> DefaultModel::prompts_;
std::vector<FullRow> DefaultModel::full_;

TEST_F(DefaultModel, Fp32KernelsMatchTransformersClosely) {
  // Isa::Scalar matmuls dequantize the weights and dot in fp32 (no activation rounding): this pins
  // the forward pass itself (interleaved RoPE, GQA, tied Q8_0 embeddings) to the reference.
  ss::cpu::force_isa(ss::cpu::Isa::Scalar);
  auto be = make_backend(*model_, 64);  // fp32 KV
  ASSERT_NE(be, nullptr);
  for (int pi : {0, 2}) {
    const auto& ids = prompts_[pi].ids;
    check_prompt(pi, step(*be, V_, ids, 0, ids.size(), blocks(0, 8)), "fp32 kernels", kExactTol, kExactTol);
  }
}

TEST_F(DefaultModel, PrefillMatchesTransformers) {
  auto be = make_backend(*model_, 64, 2, 16, KvType::F16);
  ASSERT_NE(be, nullptr);
  for (size_t pi = 0; pi < prompts_.size(); ++pi) {
    const auto& ids = prompts_[pi].ids;
    check_prompt(static_cast<int>(pi), step(*be, V_, ids, 0, ids.size(), blocks(0, 8)), "prefill", kQuantTol,
                 kQuantMargin);
  }
}

TEST_F(DefaultModel, EveryIsaMatchesTransformers) {
  for (auto isa : {ss::cpu::Isa::Avx2, ss::cpu::Isa::Avx512}) {
    if (static_cast<int>(isa) > static_cast<int>(ss::cpu::detected_isa())) continue;
    ss::cpu::force_isa(isa);
    auto be = make_backend(*model_, 64, 2, 16, KvType::F16);
    ASSERT_NE(be, nullptr);
    const auto& ids = prompts_[3].ids;
    const auto prefill = step(*be, V_, ids, 0, ids.size(), blocks(0, 8));
    check_prompt(3, prefill, ss::cpu::isa_name(isa), kQuantTol, kQuantMargin);
    EXPECT_TRUE(bit_equal(prefill, run_chunked(*be, V_, ids, blocks(8, 8), 1))) << ss::cpu::isa_name(isa);
  }
}

TEST_F(DefaultModel, DecodeAndBatchingAreBitIdentical) {
  auto be = make_backend(*model_, 64, 2, 16, KvType::F16);
  ASSERT_NE(be, nullptr);
  const auto& a = prompts_[0].ids;  // chat prompt, 37 tokens
  const auto& c = prompts_[4].ids;  // story, 44 tokens
  const auto a_prefill = step(*be, V_, a, 0, a.size(), blocks(0, 8));
  const auto a_decode = run_chunked(*be, V_, a, blocks(8, 8), 1);
  check_prompt(0, a_decode, "decode", kQuantTol, kQuantMargin);
  EXPECT_TRUE(bit_equal(a_prefill, a_decode)) << "token-by-token decode differs from one-batch prefill";
  const auto c_alone = step(*be, V_, c, 0, c.size(), blocks(16, 8));
  const auto both = run_interleaved(*be, V_, {a, c}, {blocks(24, 8), blocks(32, 8)});
  EXPECT_TRUE(bit_equal(a_prefill, both[0])) << "prompt 0 batched with prompt 4 differs from alone";
  EXPECT_TRUE(bit_equal(c_alone, both[1])) << "prompt 4 batched with prompt 0 differs from alone";
  check_prompt(4, both[1], "batched", kQuantTol, kQuantMargin);
}

// The 8-bit KV cache against transformers (whose attention is fp32): the same bars as the fp16 cache
// (PrefillMatchesTransformers), and next-token distributions close to the fp16 cache's: mean
// KL(f16 || q8) over every position of every prompt below 0.01 nats (llama.cpp's q8_0 KV cache is
// judged the same way, by KL divergence against the f16 cache). Decode token by token and decode among
// other prompts stay bit-identical to the prefill.
TEST_F(DefaultModel, Q8KvCacheMatchesTransformers) {
  auto f16 = make_backend(*model_, 64, 2, 16, KvType::F16);
  auto q8 = make_backend(*model_, 64, 2, 16, KvType::Q8);
  ASSERT_NE(f16, nullptr);
  ASSERT_NE(q8, nullptr);
  double kl_sum = 0, kl_max = 0;
  int n_pos = 0, top1_same = 0;
  for (size_t pi = 0; pi < prompts_.size(); ++pi) {
    const auto& ids = prompts_[pi].ids;
    const auto lq = step(*q8, V_, ids, 0, ids.size(), blocks(0, 8));
    check_prompt(static_cast<int>(pi), lq, "q8 kv prefill", kQuantTol, kQuantMargin);
    const auto lf = step(*f16, V_, ids, 0, ids.size(), blocks(0, 8));
    for (size_t pos = 0; pos < ids.size(); ++pos) {
      const float* a = lf.data() + pos * V_;
      const float* b = lq.data() + pos * V_;
      const double ma = *std::max_element(a, a + V_), mb = *std::max_element(b, b + V_);
      double za = 0, zb = 0;
      for (int i = 0; i < V_; ++i) za += std::exp(a[i] - ma), zb += std::exp(b[i] - mb);
      double kl = 0;
      for (int i = 0; i < V_; ++i) {
        const double la = a[i] - ma - std::log(za), lb = b[i] - mb - std::log(zb);
        kl += std::exp(la) * (la - lb);
      }
      kl_sum += kl;
      kl_max = std::max(kl_max, kl);
      ++n_pos;
      top1_same += argmax(a, V_) == argmax(b, V_);
    }
  }
  std::printf("[ q8 kv ] KL(f16 || q8) mean %.2e max %.2e over %d positions; top-1 equal at %d\n", kl_sum / n_pos,
              kl_max, n_pos, top1_same);
  EXPECT_LT(kl_sum / n_pos, 0.01);
  const auto& a = prompts_[0].ids;
  const auto& c = prompts_[4].ids;
  const auto a_prefill = step(*q8, V_, a, 0, a.size(), blocks(0, 8));
  EXPECT_TRUE(bit_equal(a_prefill, run_chunked(*q8, V_, a, blocks(8, 8), 1)));
  const auto c_alone = step(*q8, V_, c, 0, c.size(), blocks(16, 8));
  const auto both = run_interleaved(*q8, V_, {a, c}, {blocks(24, 8), blocks(32, 8)});
  EXPECT_TRUE(bit_equal(a_prefill, both[0]));
  EXPECT_TRUE(bit_equal(c_alone, both[1]));
}

// One decode step of `n_seqs` sequences (sequence s holds reference prompt s % prompts, its earlier
// tokens cached by its own prefill, blocks of different sequences interleaved): each sequence's last
// logits must be those of its one-batch prefill, bit for bit.
void expect_decode_of_many_matches_prefill(Backend& be, int V, const std::vector<Prompt>& prompts, int n_seqs) {
  const int np = static_cast<int>(prompts.size());
  std::vector<std::vector<int32_t>> tables(n_seqs);
  for (int s = 0; s < n_seqs; ++s)
    for (int j = 0; j < 8; ++j) tables[s].push_back(j * n_seqs + s);  // interleaved across sequences
  Batch b;
  b.block_tables = tables;
  std::vector<std::vector<float>> alone(n_seqs);
  for (int s = 0; s < n_seqs; ++s) {
    const auto& ids = prompts[s % np].ids;
    ASSERT_LE(ids.size(), 8u * 16u);
    const int len = static_cast<int>(ids.size());
    const auto full = step(be, V, ids, 0, len, tables[s]);  // fills the cache, then is the reference
    alone[s].assign(full.end() - V, full.end());
    b.tokens.push_back(ids[len - 1]);
    b.positions.push_back(len - 1);
    b.seq_index.push_back(s);
    b.logits_rows.push_back(s);
  }
  std::vector<float> out(static_cast<size_t>(n_seqs) * V);
  be.reset_profile();  // the profile of this decode step alone
  const auto st = forward(be, b, out.data());  // rewrites each last slot with the same K/V
  ASSERT_TRUE(st.ok()) << st.message();
  for (int s = 0; s < n_seqs; ++s)
    EXPECT_EQ(std::memcmp(out.data() + static_cast<size_t>(s) * V, alone[s].data(), sizeof(float) * V), 0)
        << "sequence " << s << ": decode among " << n_seqs << " sequences differs from its prefill";
}

// Every reference prompt in one decode step, with 1 and 2 threads: many decode rows take the attention
// path that reads several KV heads per block together (ops attention_token), few rows the per-group
// path; either way the bits are those of each prompt's prefill.
TEST_F(DefaultModel, DecodeStepOfManySequencesIsBitIdenticalToPrefill) {
  const int n = static_cast<int>(prompts_.size());
  ASSERT_GE(n, 5);
  for (int threads : {1, 2}) {
    SCOPED_TRACE(testing::Message() << threads << " threads");
    auto be = make_backend(*model_, 8 * n, threads, 16, KvType::F16);
    ASSERT_NE(be, nullptr);
    expect_decode_of_many_matches_prefill(*be, V_, prompts_, n);
  }
}

// 16 decode rows make the products compute bound, so they prefetch the next layer's K/V as they go
// (cpu/side_prefetch.h). On every SIMD path the machine has and with both KV element types, the
// profile of the decode step must show the kernels took lines of the stream, and the bits must still
// be each prefill's; with SS_CPU_KV_PREFETCH=0 no line is taken and the bits are the same. Where the
// CPU has AMX, the AVX-512 path runs once with AMX off and once with it on: the default model's
// products (Q4_1) then run as AMX passes (rows_packed_amx_t), which must take lines of the stream too.
TEST_F(DefaultModel, KvPrefetchDuringProductsKeepsDecodeBitIdentical) {
  struct Mode {
    ss::cpu::Isa isa;
    bool amx;
  };
  for (const Mode mode : {Mode{ss::cpu::Isa::Avx2, false}, Mode{ss::cpu::Isa::Avx512, false},
                          Mode{ss::cpu::Isa::Avx512, true}}) {
    const ss::cpu::Isa isa = mode.isa;
    if (isa > ss::cpu::detected_isa() || (mode.amx && !ss::cpu::amx_available())) continue;
    ss::cpu::force_isa(isa);
    ss::cpu::force_amx(mode.amx);
    for (const KvType kv : {KvType::F16, KvType::Q8})
      for (const bool on : {true, false}) {
        SCOPED_TRACE(testing::Message() << ss::cpu::isa_name(isa) << (mode.amx ? " + AMX" : "") << ", KV "
                                        << ss::backend::kv_dtype_name(kv)
                                        << (on ? ", prefetch on" : ", SS_CPU_KV_PREFETCH=0"));
        if (!on) setenv("SS_CPU_KV_PREFETCH", "0", 1);
        auto be = make_backend(*model_, 8 * 16, 2, 16, kv);
        unsetenv("SS_CPU_KV_PREFETCH");
        ASSERT_NE(be, nullptr);
        be->set_profiling(true);
        expect_decode_of_many_matches_prefill(*be, V_, prompts_, 16);
        if (on)
          EXPECT_GT(be->profile().prefetched_kv_bytes, 0);
        else
          EXPECT_EQ(be->profile().prefetched_kv_bytes, 0);
      }
  }
  ss::cpu::clear_forced_amx();
}

}  // namespace

namespace {

// Not a check: the per-stage time split quoted in design notes (benchmark numbers come from
// `selfserve bench`). Run with --gtest_also_run_disabled_tests --gtest_filter='*TimingBreakdown*'.
TEST_F(DefaultModel, DISABLED_TimingBreakdown) {
  const int n_prompt = 512, n_gen = 128;
  std::vector<int32_t> ids(n_prompt + n_gen);
  uint32_t r = 1234;
  for (auto& t : ids) t = static_cast<int32_t>((r = r * 1664525u + 1013904223u) >> 8) % V_;
  // SS_PROFILE_CPU=1: stages timed in the calling thread's CPU time (1 thread on a busy machine).
  const bool cpu_time = std::getenv("SS_PROFILE_CPU") != nullptr;
  for (int threads : {1, 2}) {
    if (cpu_time && threads > 1) break;
    BackendOptions o;
    o.threads = threads;
    o.kv.num_blocks = (n_prompt + n_gen) / 16 + 1;
    if (const char* kv = std::getenv("SS_KV"); kv && std::string(kv) == "f32") o.kv.dtype = KvType::F32;
    auto made = ss::backend::CpuBackend::create(*model_, o);
    ASSERT_TRUE(made.ok());
    auto& be = **made;
    const auto table = blocks(0, o.kv.num_blocks);
    step(be, V_, ids, 0, 64, table);  // warm-up: page weights in, touch buffers
    auto report = [&](const char* what, double wall, int tokens) {
      const auto& p = be.profile();
      std::printf("%d thread(s) %-8s %4d tok: %8.1f ms (%7.1f tok/s) | matmul %6.1f  attn %6.1f  rope+kv %5.1f  "
                  "other %5.1f  lm_head %5.1f ms\n",
                  threads, what, tokens, wall * 1e3, tokens / wall, p.matmul_s * 1e3, p.attention_s * 1e3,
                  p.rope_kv_s * 1e3, p.other_s * 1e3, p.lm_head_s * 1e3);
    };
    for (int rep = 0; rep < 2; ++rep) {
      be.set_profiling(true, cpu_time);
      be.reset_profile();
      Batch b;
      b.block_tables = {table};
      for (int i = 0; i < n_prompt; ++i) {
        b.tokens.push_back(ids[i]);
        b.positions.push_back(i);
        b.seq_index.push_back(0);
      }
      b.logits_rows = {n_prompt - 1};
      std::vector<float> logits(V_);
      auto t0 = std::chrono::steady_clock::now();
      ASSERT_TRUE(forward(be, b, logits.data()).ok());
      report("prefill", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), n_prompt);
      be.reset_profile();
      t0 = std::chrono::steady_clock::now();
      b.logits_rows = {0};
      b.seq_index = {0};
      for (int i = n_prompt; i < n_prompt + n_gen; ++i) {
        b.tokens = {ids[i]};
        b.positions = {i};
        ASSERT_TRUE(forward(be, b, logits.data()).ok());
      }
      report("decode", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), n_gen);
    }
  }
}

}  // namespace
