// selfserve synth's promise that a GGUF and a safetensors folder of one seed are the same model, held
// through the whole CPU forward pass: the llama GGUF's Q/K rows are permuted (interleaved RoPE
// pairs), the folder's are not (half-split pairs), and both must give the same logits.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "model/model.h"
#include "model/synth.h"

namespace {

using ss::backend::Backend;
using ss::backend::BackendOptions;
using ss::backend::StepBatch;
using ss::backend::StepOutput;

struct Dir {
  std::string path = (std::filesystem::temp_directory_path() / ("ss_synth_fwd_" + std::to_string(::getpid()))).string();
  Dir() { std::filesystem::create_directories(path); }
  ~Dir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

std::unique_ptr<ss::model::Model> synth_and_load(const std::string& shape, ss::model::SynthFormat fmt,
                                                 const std::string& out) {
  ss::model::SynthOptions o;
  o.shape = shape;
  o.format = fmt;
  o.dtype = ss::model::DType::F32;
  o.seed = 77;
  o.layers = 2;
  o.vocab = 300;
  o.out = out;
  o.threads = 2;
  auto r = ss::model::write_synth_model(o);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.message());
  ss::model::LoadOptions lo;
  lo.load_tokenizer = false;
  auto m = ss::model::load_model(out, lo);
  EXPECT_TRUE(m.ok()) << (m.ok() ? "" : m.message());
  return m.ok() ? std::move(m).value() : nullptr;
}

// Logits of every position of `ids`, one prefill step.
std::vector<float> logits(const ss::model::Model& m, const std::vector<int32_t>& ids) {
  BackendOptions o;
  o.threads = 2;
  o.kv.num_blocks = 4;
  o.kv.block_size = 16;
  o.kv.dtype = ss::backend::KvCacheConfig::DType::F32;
  auto be = ss::backend::make_cpu_backend(m, o);
  EXPECT_TRUE(be.ok()) << (be.ok() ? "" : be.message());
  if (!be.ok()) return {};
  StepBatch b;
  for (size_t i = 0; i < ids.size(); ++i) {
    b.tokens.push_back(ids[i]);
    b.positions.push_back(static_cast<int32_t>(i));
    b.seq_index.push_back(0);
    b.logits_rows.push_back(static_cast<int32_t>(i));
  }
  b.seq_slot = {0};
  const std::vector<int32_t> table = {0, 1};
  b.edit_table(0, 0, table);
  StepOutput out;
  auto st = (*be)->step(b, out);
  EXPECT_TRUE(st.ok()) << (st.ok() ? "" : st.message());
  return out.logits;
}

TEST(SynthForward, GgufAndSafetensorsOfOneSeedGiveTheSameLogits) {
  for (const char* shape : {"smollm2-135m", "qwen25-05b"}) {
    SCOPED_TRACE(shape);
    Dir dir;
    auto g = synth_and_load(shape, ss::model::SynthFormat::Gguf, dir.path + "/m.gguf");
    auto h = synth_and_load(shape, ss::model::SynthFormat::Safetensors, dir.path + "/hf");
    ASSERT_TRUE(g && h);
    const std::vector<int32_t> ids = {1, 17, 250, 3, 99, 42, 42, 7, 0, 299, 128, 64, 5, 200, 31, 8, 150, 11, 260, 2};
    const auto lg = logits(*g, ids), lh = logits(*h, ids);
    ASSERT_EQ(lg.size(), ids.size() * 300);
    ASSERT_EQ(lh.size(), lg.size());
    // The two differ only in the order of float sums (RoPE pairs, row layout): a few ulps of the
    // logits' scale. A wrong permutation moves them by the logits' own size.
    float scale = 0, diff = 0;
    for (size_t i = 0; i < lg.size(); ++i) {
      scale = std::max(scale, std::fabs(lg[i]));
      diff = std::max(diff, std::fabs(lg[i] - lh[i]));
    }
    EXPECT_GT(scale, 0.1f);
    EXPECT_LE(diff, 1e-4f * scale) << "max |logit| " << scale;
  }
}

}  // namespace
