// Test support: a deterministic toy "model" behind backend::Backend. Its K/V cache stores the
// (token, position) written to each slot; the logits for a row are a hash of the tokens it reads
// back at positions 0..p through the block table. A paging mistake (wrong block, stale slot, a
// shared block written twice) therefore changes the sampled tokens or fails the forward.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "engine/engine.h"

namespace ss::engine::testing {

inline uint64_t mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// The toy model's logits for a row whose context hashed to h.
inline void logits_from_hash(uint64_t h, int vocab, float* out) {
  for (int v = 0; v < vocab; ++v) out[v] = static_cast<float>(mix(h + v) >> 40) * (6.0f / 16777216.0f);
}
inline uint64_t hash_step(uint64_t h, int32_t token, int pos) {
  return mix(h ^ (static_cast<uint64_t>(token) << 20) ^ static_cast<uint64_t>(pos));
}
// What FakeBackend returns at position p of a sequence of `tokens`, computed from the tokens alone.
inline std::vector<float> reference_logits(const std::vector<int32_t>& tokens, int p, int vocab) {
  uint64_t h = 12345;
  for (int q = 0; q <= p; ++q) h = hash_step(h, tokens[q], q);
  std::vector<float> out(vocab);
  logits_from_hash(h, vocab, out.data());
  return out;
}

// Request::prompt_logprobs against the toy model: token p + 1's log-softmax at position p, and the
// k most likely tokens there (ties by id), recomputed from the prompt alone in double precision.
inline void expect_prompt_logprobs(const std::vector<int32_t>& prompt, const std::vector<PromptLogprob>& got, int k,
                                   int vocab, const std::string& what) {
  ASSERT_EQ(got.size(), prompt.size() - 1) << what;
  for (size_t p = 0; p + 1 < prompt.size(); ++p) {
    const std::vector<float> l = reference_logits(prompt, static_cast<int>(p), vocab);
    double mx = l[0], z = 0;
    for (float v : l) mx = std::max<double>(mx, v);
    for (float v : l) z += std::exp(v - mx);
    const double lse = mx + std::log(z);
    EXPECT_NEAR(got[p].logprob, l[prompt[p + 1]] - lse, 1e-4) << what << " position " << p;
    std::vector<int32_t> order(vocab);
    for (int v = 0; v < vocab; ++v) order[v] = v;
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return l[a] > l[b]; });
    ASSERT_EQ(got[p].top.size(), static_cast<size_t>(std::min(k, vocab))) << what;
    for (int j = 0; j < k && j < vocab; ++j) {
      EXPECT_EQ(got[p].top[j].first, order[j]) << what << " position " << p << " rank " << j;
      EXPECT_NEAR(got[p].top[j].second, l[order[j]] - lse, 1e-4) << what;
    }
  }
}

class FakeBackend : public backend::Backend {
 public:
  FakeBackend(int num_blocks, int block_size, int vocab, int slots = 256) : vocab_(vocab), tables_(slots) {
    kv_.num_blocks = num_blocks;
    kv_.block_size = block_size;
    cache_.assign(static_cast<size_t>(num_blocks) * block_size, Cell{});
    samplers_.emplace_back(vocab);
  }
  std::string name() const override { return "fake"; }
  const backend::KvCacheConfig& kv_config() const override { return kv_; }
  int vocab_size() const override { return vocab_; }
  int max_slots() const override { return tables_.size(); }

  // A block's cells as bytes (the KV tiers move these): a restored block that is not the demoted
  // one reads back the wrong (token, position) pairs, and the step fails or samples differently.
  int64_t kv_block_bytes() const override { return static_cast<int64_t>(sizeof(Cell)) * kv_.block_size; }
  Status read_kv_block(int32_t block, std::span<uint8_t> out) override {
    if (block < 0 || block >= kv_.num_blocks || static_cast<int64_t>(out.size()) != kv_block_bytes())
      return make_error("read_kv_block: bad block or size");
    if (fail_reads.count(block)) return make_error("read_kv_block: failing block " + std::to_string(block));
    std::memcpy(out.data(), cache_.data() + static_cast<size_t>(block) * kv_.block_size, out.size());
    ++blocks_read;
    return {};
  }
  Status write_kv_block(int32_t block, std::span<const uint8_t> in) override {
    if (block < 0 || block >= kv_.num_blocks || static_cast<int64_t>(in.size()) != kv_block_bytes())
      return make_error("write_kv_block: bad block or size");
    std::memcpy(cache_.data() + static_cast<size_t>(block) * kv_.block_size, in.data(), in.size());
    ++blocks_written;
    return {};
  }
  int blocks_read = 0, blocks_written = 0;
  // Batched writes (the tiers' restores): the size of each call, in order.
  Status write_kv_blocks(std::span<const backend::KvBlockIn> blocks) override {
    write_batches.push_back(static_cast<int>(blocks.size()));
    return Backend::write_kv_blocks(blocks);
  }
  std::vector<int> write_batches;
  // Batched reads (the tiers' demotions): the size of each call, in order.
  Status read_kv_blocks(std::span<const backend::KvBlockOut> blocks) override {
    read_batches.push_back(static_cast<int>(blocks.size()));
    return Backend::read_kv_blocks(blocks);
  }
  std::vector<int> read_batches;
  std::set<int32_t> fail_reads;  // blocks whose reads fail (a device error standing in)

  // Limits every batch must respect (0: unchecked).
  int max_tokens = 0, max_seqs = 0;
  bool fail_next = false;
  std::function<void(const backend::StepBatch&)> on_batch;
  int forwards = 0;

  // The step: K/V written, then the logits of the sampled, scored and raw rows computed from what
  // the cache holds, then sampled by the host reference sampler.
  Status step(const backend::StepBatch& b, backend::StepOutput& out) override {
    ++forwards;
    if (fail_next) {
      fail_next = false;
      return make_error("injected failure");
    }
    SS_TRY(tables_.apply(b, kv_.num_blocks));
    SS_TRY(validate(b));
    if (on_batch) on_batch(b);
    const int bs = kv_.block_size;
    for (size_t i = 0; i < b.tokens.size(); ++i) {
      const auto table = table_of(b, b.seq_index[i]);
      const int p = b.positions[i];
      cache_[static_cast<size_t>(table[p / bs]) * bs + p % bs] = Cell{b.tokens[i], p};
    }
    rows_.clear();
    for (const auto& r : b.sample_rows) rows_.push_back(r.token);
    for (const auto& r : b.score_rows) rows_.push_back(r.token);
    rows_.insert(rows_.end(), b.logits_rows.begin(), b.logits_rows.end());
    logits_.resize(rows_.size() * static_cast<size_t>(vocab_));
    float* logits = logits_.data();
    for (size_t r = 0; r < rows_.size(); ++r) {
      const int i = rows_[r];
      const auto table = table_of(b, b.seq_index[i]);
      uint64_t h = 12345;
      for (int q = 0; q <= b.positions[i]; ++q) {
        const Cell& c = cache_[static_cast<size_t>(table[q / bs]) * bs + q % bs];
        if (c.pos != q)
          return make_error("row " + std::to_string(r) + " reads position " + std::to_string(q) + " from block " +
                            std::to_string(table[q / bs]) + ", which holds position " + std::to_string(c.pos));
        h = hash_step(h, c.token, q);
      }
      logits_from_hash(h, vocab_, logits + r * static_cast<size_t>(vocab_));
    }
    const size_t ns = b.sample_rows.size() + b.score_rows.size();
    out.logits.assign(logits_.begin() + static_cast<std::ptrdiff_t>(ns * vocab_), logits_.end());
    backend::sample_on_host(b, logits, vocab_, samplers_, nullptr, out);
    return {};
  }

 private:
  struct Cell {
    int32_t token = -1, pos = -1;
  };
  std::span<const int32_t> table_of(const backend::StepBatch& b, int s) const { return tables_.of(b.seq_slot[s]); }
  Status validate(const backend::StepBatch& b) const {
    const size_t n = b.tokens.size();
    if (n == 0 || b.positions.size() != n || b.seq_index.size() != n) return make_error("ragged batch");
    if (max_tokens && static_cast<int>(n) > max_tokens)
      return make_error("batch has " + std::to_string(n) + " tokens, budget " + std::to_string(max_tokens));
    const size_t S = b.seq_slot.size();
    if (max_seqs && static_cast<int>(S) > max_seqs)
      return make_error("batch has " + std::to_string(S) + " seqs, limit " + std::to_string(max_seqs));
    if (std::set<int32_t>(b.seq_slot.begin(), b.seq_slot.end()).size() != S) return make_error("a slot twice");
    for (int32_t slot : b.seq_slot)
      if (slot < 0 || slot >= tables_.size()) return make_error("slot out of range");
    // One sampling row per sequence at most, plus prompt-logprob rows: never a token twice.
    std::vector<int32_t> rows;
    for (const auto& r : b.sample_rows) rows.push_back(r.token);
    for (const auto& r : b.score_rows) rows.push_back(r.token);
    rows.insert(rows.end(), b.logits_rows.begin(), b.logits_rows.end());
    if (std::set<int32_t>(rows.begin(), rows.end()).size() != rows.size()) return make_error("a logits row twice");
    std::vector<int> last(S, -1);
    std::map<int32_t, std::set<size_t>> written;  // block -> writing sequences
    for (size_t i = 0; i < n; ++i) {
      const int s = b.seq_index[i];
      if (s < 0 || s >= static_cast<int>(S)) return make_error("bad seq_index");
      if (last[s] >= 0 && b.positions[i] != last[s] + 1) return make_error("positions not contiguous");
      last[s] = b.positions[i];
      const auto t = table_of(b, s);
      const int blk = b.positions[i] / kv_.block_size;
      if (blk >= static_cast<int>(t.size())) return make_error("position beyond the block table");
      if (t[blk] < 0 || t[blk] >= kv_.num_blocks) return make_error("block id out of range");
      written[t[blk]].insert(s);
    }
    for (size_t s = 0; s < S; ++s) {
      if (last[s] < 0) return make_error("a sequence without tokens");
      const auto t = table_of(b, static_cast<int>(s));
      if (std::set<int32_t>(t.begin(), t.end()).size() != t.size()) return make_error("a block twice in one table");
    }
    // A block written this step must belong to exactly one sequence of the batch.
    for (const auto& [blk, writers] : written)
      for (size_t s = 0; s < S; ++s)
        if (!writers.count(s))
          for (int32_t x : table_of(b, static_cast<int>(s)))
            if (x == blk) return make_error("block " + std::to_string(blk) + " is written while shared");
    for (int32_t r : rows)
      if (r < 0 || r >= static_cast<int>(n)) return make_error("logits row out of range");
    return {};
  }

  backend::KvCacheConfig kv_;
  int vocab_;
  backend::BlockTables tables_;
  std::vector<Cell> cache_;
  std::vector<int32_t> rows_;
  std::vector<float> logits_;
  std::vector<backend::RowSampler> samplers_;
};

// What a test asks for; turned into a Request with a collecting callback.
struct Spec {
  std::vector<int32_t> prompt;
  int max_tokens = 8;
  float temperature = 0.0f;
  uint64_t seed = 0;
  std::vector<int32_t> stop_ids;
  int top_k = 0;  // the truncations, off by default
  float top_p = 1.0f;
  float min_p = 0.0f;
};

inline Spec spec(std::vector<int32_t> prompt, int max_tokens, float temperature = 0.0f, uint64_t seed = 0) {
  Spec s;
  s.prompt = std::move(prompt);
  s.max_tokens = max_tokens;
  s.temperature = temperature;
  s.seed = seed;
  return s;
}

struct Outcome {
  std::vector<int32_t> tokens;
  std::vector<PromptLogprob> prompt_lp;  // from the event that carried them
  int prompt_lp_events = 0;              // events that carried any
  FinishReason finish = FinishReason::None;
  int events_after_finish = 0;
  std::string error;
};

struct Collector {
  std::map<RequestId, Outcome> out;
  EventCallback callback() {
    return [this](const TokenEvent& e) {
      Outcome& o = out[e.id];
      if (o.finish != FinishReason::None) ++o.events_after_finish;
      if (e.token >= 0) o.tokens.push_back(e.token);
      if (!e.prompt_logprobs.empty()) {
        o.prompt_lp = e.prompt_logprobs;
        ++o.prompt_lp_events;
      }
      o.finish = e.finish;
      o.error = e.error;
    };
  }
};

inline Request make_request(const Spec& s, Collector* c, RequestId id = 0) {
  Request r;
  r.id = id;
  r.prompt = s.prompt;
  r.max_tokens = s.max_tokens;
  r.sampling.temperature = s.temperature;
  r.sampling.seed = s.seed;
  r.sampling.top_k = s.top_k;
  r.sampling.top_p = s.top_p;
  r.sampling.min_p = s.min_p;
  r.stop_ids = s.stop_ids;
  if (c) r.on_event = c->callback();
  return r;
}

inline std::vector<int32_t> random_tokens(std::mt19937& g, int n, int vocab) {
  std::uniform_int_distribution<int32_t> d(0, vocab - 1);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

// Steps until nothing is live, checking the scheduler's invariants after every step.
inline void run_all(Engine& e, int max_steps = 10000) {
  for (int i = 0; i < max_steps && e.has_work(); ++i) {
    Status st = e.step();
    ASSERT_TRUE(st.ok()) << st.message();
    Status inv = e.check_invariants();
    ASSERT_TRUE(inv.ok()) << inv.message();
  }
  ASSERT_FALSE(e.has_work()) << "not done after " << max_steps << " steps";
}

inline std::unique_ptr<Engine> make_engine(backend::Backend& be, const SchedulerConfig& sc, int vocab) {
  EXPECT_EQ(be.vocab_size(), vocab);
  EngineConfig cfg;
  cfg.scheduler = sc;
  auto e = Engine::create(be, cfg);
  EXPECT_TRUE(e.ok()) << (e.ok() ? "" : e.message());
  return e.ok() ? std::move(e).value() : nullptr;
}

// The request alone, on an engine with room to spare and no prefix cache.
inline Outcome run_alone(const Spec& s, int vocab) {
  FakeBackend be(256, 16, vocab);
  SchedulerConfig sc;
  sc.enable_prefix_caching = false;
  auto e = make_engine(be, sc, vocab);
  Collector c;
  auto id = e->add_request(make_request(s, &c));
  EXPECT_TRUE(id.ok());
  run_all(*e);
  return c.out[*id];
}

}  // namespace ss::engine::testing
