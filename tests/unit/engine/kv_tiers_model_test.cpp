// KV tiers on the CPU backend with the default model (SmolLM2-135M-Instruct Q4_1; skipped when it
// is not downloaded: `selfserve fetch`): a three-turn greedy conversation whose history idles
// past the TTL between turns gives the same tokens and the same prefix hits as one whose history
// stayed in the pool, whether restored from host RAM or, across restarts, from disk.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <random>

#include "backend/backend.h"
#include "engine/engine.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

using namespace ss;
using namespace ss::engine;
namespace fs = std::filesystem;

namespace {

std::string default_model_path() {
  std::string base;
  if (const char* h = std::getenv("SELFSERVE_HOME"); h && *h) {
    base = std::string(h) + "/models";
  } else if (const char* home = std::getenv("HOME"); home && *home) {
    base = std::string(home) + "/.cache/selfserve/models";
  }
  return base + "/SmolLM2-135M-Instruct.Q4_1.gguf";
}

class TiersOnModel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!fs::exists(default_model_path())) return;
    auto m = model::load_model(default_model_path());
    ASSERT_TRUE(m.ok()) << m.message();
    model_ = std::move(m).value().release();
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }
  void SetUp() override {
    if (!model_) GTEST_SKIP() << "default model not found at " << default_model_path() << " (selfserve fetch)";
  }

  static std::unique_ptr<backend::Backend> backend() {
    backend::BackendOptions o;
    o.threads = 2;
    o.kv.num_blocks = 96;
    o.kv.block_size = 16;
    o.max_slots = 4;
    auto be = backend::make_cpu_backend(*model_, o);
    EXPECT_TRUE(be.ok()) << be.message();
    return std::move(be).value();
  }
  static std::unique_ptr<Engine> engine(backend::Backend& be, const KvTierConfig& tc,
                                        std::function<Clock::time_point()> clock = {}) {
    EngineConfig cfg;
    cfg.scheduler.max_num_seqs = 4;
    cfg.scheduler.max_num_batched_tokens = 256;
    cfg.tiers = tc;
    cfg.clock = std::move(clock);
    auto e = Engine::create(be, cfg);
    EXPECT_TRUE(e.ok()) << e.message();
    return std::move(e).value();
  }
  static std::vector<int32_t> greedy(Engine& e, const std::vector<int32_t>& prompt, int n) {
    Request r;
    r.prompt = prompt;
    r.max_tokens = n;
    r.sampling.temperature = 0;
    std::vector<int32_t> out;
    FinishReason fin = FinishReason::None;
    r.on_event = [&](const TokenEvent& ev) {
      if (ev.token >= 0) out.push_back(ev.token);
      fin = ev.finish;
    };
    EXPECT_TRUE(e.add_request(std::move(r)).ok());
    for (int i = 0; i < 10000 && e.has_work(); ++i) EXPECT_TRUE(e.step().ok());
    EXPECT_NE(fin, FinishReason::Error);
    return out;
  }
  static std::vector<int32_t> encode(const std::string& s) { return model_->tokenizer->encode(s, false, true); }

  // The conversation: each turn is the history, the previous answer and a new user message.
  // `between` runs between turns (advance a clock, restart an engine). Returns every answer.
  template <class Between>
  static std::vector<std::vector<int32_t>> converse(Engine*& e, Between between) {
    const char* users[] = {"Tell me about the history of the city of Paris, in a few sentences.",
                           "And what is its food known for?", "Which museum should I visit first, and why?"};
    std::vector<int32_t> history =
        encode("<|im_start|>system\nYou are a helpful assistant named SmolLM, trained by Hugging Face<|im_end|>\n");
    std::vector<std::vector<int32_t>> answers;
    for (const char* u : users) {
      const auto msg = encode(std::string("<|im_start|>user\n") + u + "<|im_end|>\n<|im_start|>assistant\n");
      history.insert(history.end(), msg.begin(), msg.end());
      answers.push_back(greedy(*e, history, 40));
      history.insert(history.end(), answers.back().begin(), answers.back().end());
      const auto end = encode("<|im_end|>\n");
      history.insert(history.end(), end.begin(), end.end());
      between();
    }
    return answers;
  }

  static model::Model* model_;
};
model::Model* TiersOnModel::model_ = nullptr;

TEST_F(TiersOnModel, CpuBlockCopiesRoundTrip) {
  auto be = backend();
  std::mt19937 g(1);
  std::vector<uint8_t> bytes(static_cast<size_t>(be->kv_block_bytes())), back(bytes.size());
  ASSERT_GT(bytes.size(), 0u);
  for (auto& b : bytes) b = static_cast<uint8_t>(g());
  ASSERT_TRUE(be->write_kv_block(7, bytes).ok());
  ASSERT_TRUE(be->read_kv_block(7, back).ok());
  EXPECT_EQ(back, bytes);
  EXPECT_FALSE(be->read_kv_block(96, back).ok());  // out of range: an error, not a crash
  back.pop_back();
  EXPECT_FALSE(be->read_kv_block(0, back).ok());
}

TEST_F(TiersOnModel, ConversationOutlivingTheTtlIsIdenticalFromHostAndDisk) {
  // Reference: tiers off; the history stays in the pool between turns.
  auto be_ref = backend();
  auto e_ref = engine(*be_ref, {});
  Engine* ep = e_ref.get();
  const auto ref = converse(ep, [] {});
  const EngineStats ref_st = e_ref->stats();
  ASSERT_GT(ref_st.prefix_hit_tokens, 0);

  // Host tier: the clock jumps past the TTL between turns, so the history leaves the pool.
  {
    Clock::time_point now = Clock::now();
    auto be = backend();
    KvTierConfig tc;
    tc.host_bytes = int64_t(64) << 20;
    tc.ttl_ms = 30000;
    auto e = engine(*be, tc, [&] { return now; });
    ep = e.get();
    const auto got = converse(ep, [&] {
      now += std::chrono::milliseconds(tc.ttl_ms + 1000);
      ASSERT_TRUE(ep->step().ok());
      EXPECT_EQ(ep->stats().kv_blocks_cached, 0);
    });
    EXPECT_EQ(got, ref);
    const EngineStats st = e->stats();
    EXPECT_EQ(st.prefix_hit_tokens, ref_st.prefix_hit_tokens);
    EXPECT_GT(st.kv_demoted_idle, 0);
    EXPECT_EQ(st.kv_restored_host * 16, st.prefix_hit_tokens);
    EXPECT_EQ(st.computed_tokens, ref_st.computed_tokens);
  }
  // Host tier, zstd.
  {
    Clock::time_point now = Clock::now();
    auto be = backend();
    KvTierConfig tc;
    tc.host_bytes = int64_t(64) << 20;
    tc.host_compress = true;
    auto e = engine(*be, tc, [&] { return now; });
    ep = e.get();
    const auto got = converse(ep, [&] {
      now += std::chrono::milliseconds(tc.ttl_ms + 1000);
      ASSERT_TRUE(ep->step().ok());
    });
    EXPECT_EQ(got, ref);
    EXPECT_EQ(e->stats().kv_restored_host * 16, ref_st.prefix_hit_tokens);
  }
  // Disk tier only, and a restart (new backend, new engine) between turns.
  {
    const std::string dir = ::testing::TempDir() + "ss_kv_tiers_model_" + std::to_string(::getpid());
    fs::remove_all(dir);
    KvTierConfig tc;
    tc.disk_dir = dir;
    tc.disk_bytes = int64_t(256) << 20;
    tc.model_hash = 42;
    auto be = backend();
    auto e = engine(*be, tc);
    ep = e.get();
    int64_t restored = 0, hits = 0;
    const auto got = converse(ep, [&] {
      restored += e->stats().kv_restored_disk;
      hits += e->stats().prefix_hit_tokens;
      e.reset();  // shutdown writes the pool's blocks
      be = backend();
      e = engine(*be, tc);
      ep = e.get();
    });
    EXPECT_EQ(got, ref);
    EXPECT_EQ(hits, ref_st.prefix_hit_tokens);
    EXPECT_EQ(restored * 16, hits);
    EXPECT_EQ(e->stats().kv_disk_rejected, 0);
    fs::remove_all(dir);
  }
}

}  // namespace
