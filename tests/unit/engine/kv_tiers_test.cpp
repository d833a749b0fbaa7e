// KV tiers below the pool over the fake backend, whose blocks hold the (token, position) of each
// slot: a block restored with the wrong bytes makes a step fail or sample differently from the
// request run alone. Round trips, eviction and TTL demotion, restart, rejected files, disk full,
// kill -9 during writes.
#include "engine/kv_tiers.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "engine/kv_cache_manager.h"
#include "fake_backend.h"

using namespace ss;
using namespace ss::engine;
using namespace ss::engine::testing;
namespace fs = std::filesystem;

namespace {
constexpr int kVocab = 97;

std::string fresh_dir(const std::string& name) {
  const std::string d = ::testing::TempDir() + "ss_kv_tiers_" + name + "_" + std::to_string(::getpid());
  fs::remove_all(d);
  return d;
}

// A fresh directory, removed with everything in it when the test ends.
struct ScopedDir {
  std::string path;
  explicit ScopedDir(const std::string& name) : path(fresh_dir(name)) {}
  ~ScopedDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

std::vector<fs::path> kv_files(const std::string& dir) {
  std::vector<fs::path> v;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".kvb") v.push_back(e.path());
  std::sort(v.begin(), v.end());
  return v;
}

struct TestClock {
  Clock::time_point now = Clock::now();
  std::function<Clock::time_point()> fn() {
    return [this] { return now; };
  }
};

std::unique_ptr<Engine> tier_engine(backend::Backend& be, const KvTierConfig& tc, std::function<Clock::time_point()> clock = {}) {
  EngineConfig cfg;
  cfg.scheduler.max_num_seqs = 4;
  cfg.scheduler.max_num_batched_tokens = 64;
  cfg.tiers = tc;
  cfg.clock = std::move(clock);
  auto e = Engine::create(be, cfg);
  EXPECT_TRUE(e.ok()) << (e.ok() ? "" : e.message());
  return e.ok() ? std::move(e).value() : nullptr;
}

Outcome run_one(Engine& e, const Spec& s) {
  Collector c;
  auto id = e.add_request(make_request(s, &c));
  EXPECT_TRUE(id.ok()) << (id.ok() ? "" : id.message());
  run_all(e);
  return c.out[*id];
}

KvTierConfig host_config(int64_t bytes = 1 << 20) {
  KvTierConfig tc;
  tc.host_bytes = bytes;
  return tc;
}
KvTierConfig disk_config(const std::string& dir, int64_t host = 1 << 20) {
  KvTierConfig tc;
  tc.host_bytes = host;
  tc.disk_dir = dir;
  tc.disk_bytes = 1 << 20;
  tc.model_hash = 0x1234;
  return tc;
}
}  // namespace

// A backend that page-locks what the tiers register (as the CUDA backend does) and notes whether each
// block copy's host bytes lie in registered memory.
class RegisteringBackend : public FakeBackend {
 public:
  using FakeBackend::FakeBackend;
  std::vector<std::pair<const uint8_t*, size_t>> live;  // registered, not yet unregistered
  int registered = 0, copies = 0, copies_in_place = 0;
  void register_host_memory(void* p, size_t bytes) override {
    live.emplace_back(static_cast<const uint8_t*>(p), bytes);
    ++registered;
  }
  void unregister_host_memory(void* p) override {
    std::erase_if(live, [p](const auto& r) { return r.first == p; });
  }
  void note(const uint8_t* p, size_t n) {
    ++copies;
    for (const auto& [b, len] : live)
      if (p >= b && p + n <= b + len) return static_cast<void>(++copies_in_place);
  }
  Status read_kv_block(int32_t block, std::span<uint8_t> out) override {
    note(out.data(), out.size());
    return FakeBackend::read_kv_block(block, out);
  }
  Status write_kv_block(int32_t block, std::span<const uint8_t> in) override {
    note(in.data(), in.size());
    return FakeBackend::write_kv_block(block, in);
  }
};

// The tiers register the memory they copy blocks through (the arena, their block buffer) and let it
// go when they end. Through the engine (TTL demotions, then the returning turn's restores by the
// loader): a plain host tier's every copy uses registered memory; a compressed one's demotions do
// (through the block buffer), its restores not (the loader unpacks into its own buffer).
TEST(KvTiers, BlockCopiesUseRegisteredMemoryAndTheTiersUnregisterIt) {
  for (bool compress : {false, true}) {
    std::mt19937 g(11);
    TestClock clock;
    RegisteringBackend be(64, 16, kVocab);
    KvTierConfig tc = host_config();
    tc.ttl_ms = 1000;
    tc.host_compress = compress;
    {
      auto e = tier_engine(be, tc, clock.fn());
      ASSERT_NE(e, nullptr);
      ASSERT_EQ(be.live.size(), 2u);  // the arena and the block buffer
      ASSERT_EQ(be.copies, 0);
      const Spec t1 = spec(random_tokens(g, 70, kVocab), 10);
      const Outcome o1 = run_one(*e, t1);
      clock.now += std::chrono::seconds(2);
      ASSERT_TRUE(e->step().ok());  // an idle step: every cached block leaves for the host tier
      const int demoted = static_cast<int>(e->stats().kv_demoted_idle);
      ASSERT_GT(demoted, 0);
      EXPECT_EQ(be.copies, demoted);
      EXPECT_EQ(be.copies_in_place, demoted) << (compress ? "compressed" : "plain");
      Spec t2 = t1;
      t2.prompt.insert(t2.prompt.end(), o1.tokens.begin(), o1.tokens.end());
      const auto msg = random_tokens(g, 20, kVocab);
      t2.prompt.insert(t2.prompt.end(), msg.begin(), msg.end());
      EXPECT_EQ(run_one(*e, t2).tokens, run_alone(t2, kVocab).tokens);
      const int restored = static_cast<int>(e->stats().kv_restored_host);
      ASSERT_EQ(restored, demoted);
      EXPECT_EQ(be.copies, demoted + restored);
      EXPECT_EQ(be.copies_in_place, compress ? demoted : demoted + restored);
    }
    EXPECT_TRUE(be.live.empty()) << "still registered after the engine ended";
    EXPECT_EQ(be.registered, 2);
  }
}

// Bytes in, the same bytes out, from host (plain and zstd) and from disk after a restart.
TEST(KvTiers, BlockRoundTripIsBitExactThroughEveryTier) {
  std::mt19937 g(7);
  for (bool compress : {false, true}) {
    const ScopedDir scoped_dir(compress ? "rt_z" : "rt");
    const std::string& dir = scoped_dir.path;
    FakeBackend be(8, 16, kVocab);
    std::vector<uint8_t> bytes(static_cast<size_t>(be.kv_block_bytes()));
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = compress && i % 4 ? 0 : static_cast<uint8_t>(g());
    ASSERT_TRUE(be.write_kv_block(2, bytes).ok());
    const auto tokens = random_tokens(g, 16, kVocab);
    const BlockHash parent = kRootBlockHash, hash = hash_block(parent, tokens);
    KvTierConfig tc = disk_config(dir);
    tc.host_compress = compress;
    std::vector<uint8_t> back(bytes.size());
    {
      auto t = KvTiers::create(tc, be);
      ASSERT_TRUE(t.ok()) << t.message();
      (*t)->demote(2, hash, parent, tokens, KvTiers::Why::Evicted);
      (*t)->wait_for_writes();
      EXPECT_EQ((*t)->find(hash, parent, tokens), KvTiers::Where::Host);
      auto other = tokens;
      other[3] ^= 1;  // same hash asked with other tokens: never found
      EXPECT_EQ((*t)->find(hash, parent, other), KvTiers::Where::None);
      ASSERT_TRUE((*t)->restore(hash, parent, tokens, 5));
      ASSERT_TRUE(be.read_kv_block(5, back).ok());
      EXPECT_EQ(back, bytes);
      const auto tokens2 = random_tokens(g, 16, kVocab);  // a shutdown copy: written, not a demotion
      (*t)->demote(3, hash_block(hash, tokens2), hash, tokens2, KvTiers::Why::Shutdown);
      (*t)->wait_for_writes();
      const KvTierStats st = (*t)->stats();
      EXPECT_EQ(st.disk_writes, 2);
      EXPECT_EQ(st.demoted_evicted, 1);
      EXPECT_EQ(st.demoted_idle, 0);
      EXPECT_EQ(st.restored_host, 1);
      if (compress) {
        EXPECT_LT(st.host_used_bytes, static_cast<int64_t>(bytes.size()));
      }
    }
    auto t = KvTiers::create(tc, be);  // a restart: only the disk remembers
    ASSERT_TRUE(t.ok()) << t.message();
    EXPECT_EQ((*t)->find(hash, parent, tokens), KvTiers::Where::Disk);
    ASSERT_TRUE((*t)->restore(hash, parent, tokens, 6));
    ASSERT_TRUE(be.read_kv_block(6, back).ok());
    EXPECT_EQ(back, bytes);
    EXPECT_EQ((*t)->stats().restored_disk, 1);
    EXPECT_EQ((*t)->find(hash, parent, tokens), KvTiers::Where::Host);  // promoted on the way up
  }
}

// A prefix evicted by other work comes back from the host tier: same tokens, no recompute.
TEST(KvTiers, EvictedPrefixIsRestoredFromHostWithSameOutputs) {
  std::mt19937 g(3);
  const Spec a = spec(random_tokens(g, 100, kVocab), 8);  // 6 full blocks cacheable
  std::vector<Spec> others;
  for (int i = 0; i < 3; ++i) others.push_back(spec(random_tokens(g, 100, kVocab), 8));
  const Outcome ref = run_alone(a, kVocab);
  for (bool tiers : {false, true}) {
    FakeBackend be(12, 16, kVocab);  // 192 slots: one request's blocks at a time
    auto e = tier_engine(be, tiers ? host_config() : KvTierConfig{});
    EXPECT_EQ(run_one(*e, a).tokens, ref.tokens);
    for (const Spec& s : others) EXPECT_EQ(run_one(*e, s).tokens, run_alone(s, kVocab).tokens);
    const EngineStats before = e->stats();
    const int64_t computed_before = before.computed_tokens;
    EXPECT_EQ(run_one(*e, a).tokens, ref.tokens);
    const EngineStats st = e->stats();
    if (!tiers) {
      EXPECT_EQ(st.prefix_hit_tokens, before.prefix_hit_tokens) << "the pool should have lost the prefix";
      continue;
    }
    EXPECT_GT(before.kv_demoted_evicted, 0);
    EXPECT_EQ(st.kv_restored_host - before.kv_restored_host, 6);
    EXPECT_EQ(st.prefix_hit_tokens - before.prefix_hit_tokens, 96);
    EXPECT_EQ(st.computed_tokens - computed_before, 100 - 96 + 8 - 1);  // the rest, then decodes
    EXPECT_EQ(be.blocks_written, 6);
  }
}

// Cached blocks idle past the TTL leave the pool for the host tier (no sooner), and a returning
// turn of the conversation finds them there.
TEST(KvTiers, IdleBlocksLeaveThePoolAfterTheTtlAndComeBack) {
  std::mt19937 g(5);
  TestClock clock;
  FakeBackend be(64, 16, kVocab);
  KvTierConfig tc = host_config();
  tc.ttl_ms = 30000;
  auto e = tier_engine(be, tc, clock.fn());
  const Spec t1 = spec(random_tokens(g, 70, kVocab), 10);
  const Outcome o1 = run_one(*e, t1);
  EXPECT_EQ(o1.tokens, run_alone(t1, kVocab).tokens);
  const int cached = e->stats().kv_blocks_cached;
  EXPECT_EQ(cached, (70 + 10 - 1) / 16);
  clock.now += std::chrono::seconds(29);
  ASSERT_TRUE(e->step().ok());
  EXPECT_EQ(e->stats().kv_demoted_idle, 0);
  EXPECT_EQ(e->stats().kv_blocks_cached, cached);
  clock.now += std::chrono::seconds(2);
  ASSERT_TRUE(e->step().ok());  // an idle step: housekeeping only
  EXPECT_EQ(e->stats().kv_demoted_idle, cached);
  EXPECT_EQ(e->stats().kv_blocks_cached, 0);
  EXPECT_EQ(e->stats().kv_host_blocks, cached);

  Spec t2 = t1;  // the next turn: history + answer + a new message
  t2.prompt.insert(t2.prompt.end(), o1.tokens.begin(), o1.tokens.end());
  const auto msg = random_tokens(g, 20, kVocab);
  t2.prompt.insert(t2.prompt.end(), msg.begin(), msg.end());
  const int64_t hits = e->stats().prefix_hit_tokens;
  EXPECT_EQ(run_one(*e, t2).tokens, run_alone(t2, kVocab).tokens);
  EXPECT_EQ(e->stats().kv_restored_host, cached);
  EXPECT_EQ(e->stats().prefix_hit_tokens - hits, cached * 16);
}

// While streams decode, TTL demotions are spread over steps (each copies a block out), at most
// Scheduler::kMaxIdleDemotionsPerStep a step, oldest first; an idle engine demotes them all at once.
TEST(KvTiers, IdleDemotionsAreSpreadOverStepsWhileStreamsRun) {
  std::mt19937 g(21);
  TestClock clock;
  FakeBackend be(256, 16, kVocab);
  KvTierConfig tc = host_config(int64_t(1) << 24);
  auto e = tier_engine(be, tc, clock.fn());
  const Spec a = spec(random_tokens(g, 80 * 16 + 1, kVocab), 1);  // leaves 80 cached blocks
  run_one(*e, a);
  ASSERT_EQ(e->stats().kv_blocks_cached, 80);
  const Spec b = spec(random_tokens(g, 8, kVocab), 12);
  Collector c;
  const RequestId id = *e->add_request(make_request(b, &c));
  ASSERT_TRUE(e->step().ok());  // b is running
  clock.now += std::chrono::milliseconds(tc.ttl_ms + 1);
  std::vector<int64_t> per_step;
  std::vector<std::vector<int>> reads_per_step;
  int64_t before = e->stats().kv_demoted_idle;
  while (e->has_work()) {
    be.read_batches.clear();
    ASSERT_TRUE(e->step().ok());
    reads_per_step.push_back(be.read_batches);
    per_step.push_back(e->stats().kv_demoted_idle - before);
    before = e->stats().kv_demoted_idle;
  }
  const int k = Scheduler::kMaxIdleDemotionsPerStep;
  ASSERT_GE(per_step.size(), 3u);
  EXPECT_EQ(per_step[0], k);
  EXPECT_EQ(per_step[1], k);
  EXPECT_EQ(per_step[2], 80 - 2 * k);
  // Each step's demotions were read out of the pool in one batched read (one wait on a GPU).
  EXPECT_EQ(reads_per_step[0], std::vector<int>{k});
  EXPECT_EQ(reads_per_step[1], std::vector<int>{k});
  EXPECT_EQ(reads_per_step[2], std::vector<int>{80 - 2 * k});
  EXPECT_EQ(c.out[id].tokens, run_alone(b, kVocab).tokens);
  // Idle: b's blocks too, all in one tick.
  clock.now += std::chrono::milliseconds(tc.ttl_ms + 1);
  ASSERT_TRUE(e->step().ok());
  EXPECT_EQ(e->stats().kv_blocks_cached, 0);
}

// Demotions that leave the pool together (one allocate()'s evictions, one step's TTL expiries)
// are read in one batched read, with the outcome of demoting them one at a time: the same counts,
// the same blocks kept in each tier, bit-identical bytes; a block whose read fails, or that finds
// no arena room, is the only one lost.
namespace {

struct BatchRun {
  std::vector<int> read_batches;
  int blocks_read = 0;
  KvTierStats st;
  std::vector<KvTiers::Where> where;  // each block's tier afterwards
  std::vector<char> exact;            // found, and restored bit-identical
};

// `n` pool blocks (0..n-1) holding random bytes, a chain of hashes (or n roots), demoted as one
// batch or one by one, after `before` (run on the tiers first). fail: blocks whose reads fail.
BatchRun demote_run(bool batched, const KvTierConfig& tc, int n, bool chain, std::set<int32_t> fail,
                    const std::function<void(KvTiers&, FakeBackend&)>& before = {},
                    const std::function<void(KvTiers&)>& after = {}) {
  std::mt19937 g(41);
  FakeBackend be(2 * n + 8, 16, kVocab);
  const size_t bb = static_cast<size_t>(be.kv_block_bytes());
  std::vector<std::vector<uint8_t>> bytes(static_cast<size_t>(n), std::vector<uint8_t>(bb));
  std::vector<std::vector<int32_t>> toks;
  std::vector<CachedBlock> blocks;
  BlockHash parent = kRootBlockHash;
  for (int b = 0; b < n; ++b) {
    for (auto& x : bytes[static_cast<size_t>(b)]) x = static_cast<uint8_t>(g());
    EXPECT_TRUE(be.write_kv_block(b, bytes[static_cast<size_t>(b)]).ok());
    toks.push_back(random_tokens(g, 16, kVocab));
  }
  for (int b = 0; b < n; ++b) {
    const BlockHash p = chain ? parent : kRootBlockHash;
    blocks.push_back(CachedBlock{b, hash_block(p, toks[static_cast<size_t>(b)]), p, toks[static_cast<size_t>(b)]});
    parent = blocks.back().hash;
  }
  BatchRun r;
  auto t = KvTiers::create(tc, be);
  EXPECT_TRUE(t.ok()) << t.message();
  if (!t.ok()) return r;
  if (before) before(**t, be);
  be.read_batches.clear();
  be.blocks_read = 0;
  be.fail_reads = std::move(fail);
  if (batched) {
    (*t)->demote(blocks, KvTiers::Why::Evicted);
  } else {
    for (const CachedBlock& c : blocks) (*t)->demote(c.block, c.hash, c.parent, c.tokens, KvTiers::Why::Evicted);
  }
  r.read_batches = be.read_batches;
  r.blocks_read = be.blocks_read;
  be.fail_reads.clear();
  if (after) after(**t);
  (*t)->wait_for_writes();
  r.st = (*t)->stats();
  std::vector<uint8_t> back(bb);
  for (int b = 0; b < n; ++b) {
    const CachedBlock& c = blocks[static_cast<size_t>(b)];
    r.where.push_back((*t)->find(c.hash, c.parent, c.tokens));
    const int32_t dst = n + 4 + b;
    const bool ok = r.where.back() != KvTiers::Where::None && (*t)->restore(c.hash, c.parent, c.tokens, dst) &&
                    be.read_kv_block(dst, back).ok() && back == bytes[static_cast<size_t>(b)];
    r.exact.push_back(ok);
  }
  return r;
}

void expect_same_outcome(const BatchRun& a, const BatchRun& b) {
  EXPECT_EQ(a.st.demoted_evicted, b.st.demoted_evicted);
  EXPECT_EQ(a.st.demote_no_room, b.st.demote_no_room);
  EXPECT_EQ(a.st.host_blocks, b.st.host_blocks);
  EXPECT_EQ(a.st.host_dropped, b.st.host_dropped);
  EXPECT_EQ(a.st.disk_writes, b.st.disk_writes);
  EXPECT_EQ(a.st.disk_blocks, b.st.disk_blocks);
  EXPECT_EQ(a.st.disk_behind_dropped, b.st.disk_behind_dropped);
  EXPECT_EQ(a.where, b.where);
  EXPECT_EQ(a.exact, b.exact);
}

}  // namespace

TEST(KvTiers, DemotingABatchIsOneBatchedReadWithTheSameOutcome) {
  const ScopedDir d1("batch1"), d2("batch2");
  for (bool chain : {true, false}) {
    const BatchRun one = demote_run(false, disk_config(d1.path), 8, chain, {});
    const BatchRun all = demote_run(true, disk_config(d2.path), 8, chain, {});
    EXPECT_EQ(all.read_batches, std::vector<int>{8});
    EXPECT_EQ(all.blocks_read, 8);
    EXPECT_EQ(all.st.demoted_evicted, 8);
    EXPECT_EQ(all.st.host_blocks, 8);
    EXPECT_EQ(all.st.disk_writes, 8);
    EXPECT_EQ(all.exact, std::vector<char>(8, 1));
    expect_same_outcome(all, one);
    EXPECT_EQ(one.read_batches, std::vector<int>(8, 1));  // one by one: a read (a GPU wait) each
    fs::remove_all(d1.path);
    fs::remove_all(d2.path);
  }
  // zstd: read and compressed a block at a time, as before.
  KvTierConfig z = host_config();
  z.host_compress = true;
  const BatchRun zall = demote_run(true, z, 8, true, {});
  EXPECT_TRUE(zall.read_batches.empty());
  EXPECT_EQ(zall.blocks_read, 8);
  EXPECT_EQ(zall.exact, std::vector<char>(8, 1));
  expect_same_outcome(zall, demote_run(false, z, 8, true, {}));
}

TEST(KvTiers, AFailedReadInABatchDropsOnlyThatBlock) {
  const ScopedDir d1("batchfail1"), d2("batchfail2");
  const BatchRun one = demote_run(false, disk_config(d1.path), 6, true, {2});
  const BatchRun all = demote_run(true, disk_config(d2.path), 6, true, {2});
  EXPECT_EQ(all.read_batches, std::vector<int>{6});  // then each read alone, to find the failing one
  EXPECT_EQ(all.st.demoted_evicted, 5);
  EXPECT_EQ(all.st.host_blocks, 5);
  EXPECT_EQ(all.st.disk_behind_dropped, 1);
  EXPECT_EQ(all.where[2], KvTiers::Where::None);
  EXPECT_EQ(all.exact, (std::vector<char>{1, 1, 0, 1, 1, 1}));
  expect_same_outcome(all, one);
}

// The arena holds 4 blocks: a batch of 6 is cut where its next chunk needs an earlier block of
// the batch pushed out (as demoting them one by one would have pushed it out).
TEST(KvTiers, ABatchBiggerThanTheArenaPushesOutWhatOneByOneWould) {
  FakeBackend probe(1, 16, kVocab);
  const KvTierConfig tc = host_config(4 * probe.kv_block_bytes());
  const BatchRun one = demote_run(false, tc, 6, false, {});
  const BatchRun all = demote_run(true, tc, 6, false, {});
  EXPECT_EQ(all.read_batches, (std::vector<int>{4, 2}));
  EXPECT_EQ(all.st.host_blocks, 4);
  EXPECT_EQ(all.st.host_dropped, 2);
  EXPECT_EQ(all.exact, (std::vector<char>{0, 0, 1, 1, 1, 1}));
  expect_same_outcome(all, one);
}

// With the disk writer stuck, the 4 queued blocks hold every arena chunk: the batch's blocks 5
// and 6 find no room and are dropped (with what hangs below them); the first 4 are kept.
TEST(KvTiers, NoArenaRoomInABatchDropsOnlyThoseBlocks) {
  FakeBackend probe(1, 16, kVocab);
  for (bool chain : {true, false}) {
    const ScopedDir d1("batchroom1"), d2("batchroom2");
    std::atomic<bool> go{false};
    const auto latch = [&](KvTiers& t, FakeBackend&) {
      go = false;
      t.set_write_hook([&](BlockHash) {
        while (!go) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      });
    };
    const auto release = [&](KvTiers&) { go = true; };
    const BatchRun one = demote_run(false, disk_config(d1.path, 4 * probe.kv_block_bytes()), 6, chain, {}, latch, release);
    const BatchRun all = demote_run(true, disk_config(d2.path, 4 * probe.kv_block_bytes()), 6, chain, {}, latch, release);
    EXPECT_EQ(all.read_batches, std::vector<int>{4});
    EXPECT_EQ(all.st.demote_no_room, 2);
    EXPECT_EQ(all.st.disk_behind_dropped, 2);
    EXPECT_EQ(all.st.demoted_evicted, 4);
    EXPECT_EQ(all.st.disk_writes, 4);
    EXPECT_EQ(all.exact, (std::vector<char>{1, 1, 1, 1, 0, 0}));
    expect_same_outcome(all, one);
  }
}

// Random batches (chains and roots, blocks demoted again, failing reads, a small arena that the
// batches overflow; host, host + disk, zstd) give after every batch what demoting the same blocks
// one at a time gives. The writer finishes between batches, so both runs see the same disk.
// Failing reads only where the arena holds every block: with a full arena a failed block's chunk
// comes back at its batch's end, not before the next block's is taken (kv_tiers.h), so a batch
// may push out one more older host entry than one-by-one demotion does.
TEST(KvTiers, RandomBatchesMatchOneByOneDemotion) {
  FakeBackend probe(1, 16, kVocab);
  const int64_t bb = probe.kv_block_bytes();
  int64_t pushed_out = 0, failed = 0, written = 0, behind = 0;  // what the seeds covered
  for (int seed = 0; seed < 24; ++seed) {
    const ScopedDir d1("rnd1"), d2("rnd2");
    std::mt19937 g(static_cast<uint32_t>(1000 + seed));
    const int kind = seed % 3;  // host / host + disk / zstd host + disk
    const int n = 24;
    const bool with_fails = seed % 2 == 1;
    const int64_t host = bb * static_cast<int64_t>(with_fails ? n : 3 + g() % 10);
    std::vector<std::vector<int32_t>> toks;
    std::vector<CachedBlock> blocks;
    for (int b = 0; b < n; ++b) toks.push_back(random_tokens(g, 16, kVocab));
    for (int b = 0; b < n; ++b) {  // a few chains: a block's parent is the one before it, or a root
      const BlockHash p = b == 0 || g() % 4 == 0 ? kRootBlockHash : blocks.back().hash;
      blocks.push_back(CachedBlock{b, hash_block(p, toks[static_cast<size_t>(b)]), p, toks[static_cast<size_t>(b)]});
    }
    std::vector<std::vector<int>> batches;
    std::vector<std::set<int32_t>> fails;
    for (int k = 0; k < 8; ++k) {
      std::vector<int> order(static_cast<size_t>(n));
      for (int b = 0; b < n; ++b) order[static_cast<size_t>(b)] = b;
      std::shuffle(order.begin(), order.end(), g);
      order.resize(1 + g() % 10);
      if (g() % 2) std::sort(order.begin(), order.end());  // parents first, as a chain leaves
      batches.push_back(order);
      std::set<int32_t> f;
      if (with_fails && g() % 3 == 0) f.insert(order[g() % order.size()]);
      fails.push_back(f);
    }
    struct Snap {
      KvTierStats st;
      std::vector<KvTiers::Where> where;
      std::vector<char> exact;
    };
    const auto run = [&](bool batched, const std::string& dir) {
      FakeBackend be(2 * n, 16, kVocab);
      std::mt19937 gb(7);
      std::vector<std::vector<uint8_t>> bytes(static_cast<size_t>(n), std::vector<uint8_t>(static_cast<size_t>(bb)));
      for (int b = 0; b < n; ++b) {
        for (auto& x : bytes[static_cast<size_t>(b)]) x = static_cast<uint8_t>(gb() % 4);  // compressible
        EXPECT_TRUE(be.write_kv_block(b, bytes[static_cast<size_t>(b)]).ok());
      }
      KvTierConfig tc = kind == 0 ? host_config(host) : disk_config(dir, host);
      tc.host_compress = kind == 2;
      auto t = KvTiers::create(tc, be);
      EXPECT_TRUE(t.ok()) << t.message();
      std::vector<Snap> snaps;
      std::vector<CachedBlock> batch;
      std::vector<uint8_t> back(static_cast<size_t>(bb));
      for (size_t k = 0; k < batches.size(); ++k) {
        batch.clear();
        for (int b : batches[k]) batch.push_back(blocks[static_cast<size_t>(b)]);
        be.fail_reads = fails[k];
        const auto why = k % 2 ? KvTiers::Why::Idle : KvTiers::Why::Evicted;
        if (batched) {
          (*t)->demote(batch, why);
        } else {
          for (const CachedBlock& c : batch) (*t)->demote(c.block, c.hash, c.parent, c.tokens, why);
        }
        be.fail_reads.clear();
        (*t)->wait_for_writes();
        Snap sn;
        sn.st = (*t)->stats();
        for (const CachedBlock& c : blocks) sn.where.push_back((*t)->find(c.hash, c.parent, c.tokens));
        snaps.push_back(std::move(sn));
      }
      // Last: everything still kept comes back bit-identical (restores promote, so only now).
      for (int b = 0; b < n; ++b) {
        const CachedBlock& c = blocks[static_cast<size_t>(b)];
        const bool ok = snaps.back().where[static_cast<size_t>(b)] != KvTiers::Where::None &&
                        (*t)->restore(c.hash, c.parent, c.tokens, n + b) && be.read_kv_block(n + b, back).ok() &&
                        back == bytes[static_cast<size_t>(b)];
        snaps.back().exact.push_back(ok);
      }
      return snaps;
    };
    const auto one = run(false, d1.path), all = run(true, d2.path);
    ASSERT_EQ(one.size(), all.size());
    for (size_t k = 0; k < one.size(); ++k) {
      SCOPED_TRACE("seed " + std::to_string(seed) + " batch " + std::to_string(k));
      EXPECT_EQ(all[k].st.demoted_evicted, one[k].st.demoted_evicted);
      EXPECT_EQ(all[k].st.demoted_idle, one[k].st.demoted_idle);
      EXPECT_EQ(all[k].st.demote_no_room, one[k].st.demote_no_room);
      EXPECT_EQ(all[k].st.host_blocks, one[k].st.host_blocks);
      EXPECT_EQ(all[k].st.host_used_bytes, one[k].st.host_used_bytes);
      EXPECT_EQ(all[k].st.host_dropped, one[k].st.host_dropped);
      EXPECT_EQ(all[k].st.disk_writes, one[k].st.disk_writes);
      EXPECT_EQ(all[k].st.disk_blocks, one[k].st.disk_blocks);
      EXPECT_EQ(all[k].st.disk_behind_dropped, one[k].st.disk_behind_dropped);
      EXPECT_EQ(all[k].where, one[k].where);
    }
    EXPECT_EQ(all.back().exact, one.back().exact);
    for (size_t b = 0; b < all.back().exact.size(); ++b)
      EXPECT_EQ(all.back().exact[b], all.back().where[b] != KvTiers::Where::None) << "block " << b;
    pushed_out += all.back().st.host_dropped;
    written += all.back().st.disk_writes;
    behind += all.back().st.disk_behind_dropped;
    for (const auto& f : fails) failed += static_cast<int64_t>(f.size());
  }
  EXPECT_GT(pushed_out, 0);
  EXPECT_GT(failed, 0);
  EXPECT_GT(written, 0);
  EXPECT_GT(behind, 0);
}

// The disk tier survives a restart: a new engine on a blank backend hits the old prefix.
TEST(KvTiers, DiskTierKeepsPrefixHitsAcrossRestart) {
  std::mt19937 g(9);
  const ScopedDir scoped_dir("restart");
  const std::string& dir = scoped_dir.path;
  const Spec a = spec(random_tokens(g, 100, kVocab), 8);
  const Outcome ref = run_alone(a, kVocab);
  {
    FakeBackend be(64, 16, kVocab);
    auto e = tier_engine(be, disk_config(dir));
    EXPECT_EQ(run_one(*e, a).tokens, ref.tokens);
  }  // shutdown: the pool's cached blocks go to disk
  EXPECT_EQ(kv_files(dir).size(), 6u);
  FakeBackend be(64, 16, kVocab);
  auto e = tier_engine(be, disk_config(dir));
  EXPECT_EQ(e->stats().kv_disk_blocks, 6);
  EXPECT_EQ(run_one(*e, a).tokens, ref.tokens);
  const EngineStats st = e->stats();
  EXPECT_EQ(st.kv_restored_disk, 6);
  EXPECT_EQ(st.prefix_hit_tokens, 96);
  EXPECT_EQ(st.kv_disk_rejected, 0);
}

// Flipped bytes, a truncated file, a partial write and another model's files are deleted and
// counted, never served; what is intact is still used.
TEST(KvTiers, CorruptTruncatedPartialAndForeignFilesAreRejected) {
  std::mt19937 g(11);
  const ScopedDir scoped_dir("reject");
  const std::string& dir = scoped_dir.path;
  const Spec a = spec(random_tokens(g, 100, kVocab), 8);
  const Spec b = spec(random_tokens(g, 100, kVocab), 8);
  {
    FakeBackend be(64, 16, kVocab);
    auto e = tier_engine(be, disk_config(dir));
    run_one(*e, a);
    run_one(*e, b);
  }
  auto files = kv_files(dir);
  ASSERT_EQ(files.size(), 12u);
  // Damage three of the files: a flipped payload byte, a cut tail, a flipped header byte.
  auto flip = [](const fs::path& p, std::streamoff at) {
    std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(at);
    char c;
    f.get(c);
    f.seekp(at);
    f.put(static_cast<char>(c ^ 0x40));
  };
  flip(files[0], 64 + 64 + 10);
  fs::resize_file(files[1], fs::file_size(files[1]) - 5);
  flip(files[2], 40);
  std::ofstream(dir + "/00000000deadbeef.kvb.tmp") << "half a write";
  {
    FakeBackend be(64, 16, kVocab);
    auto e = tier_engine(be, disk_config(dir, 0));
    EXPECT_EQ(e->stats().kv_disk_rejected, 4);
    EXPECT_EQ(e->stats().kv_disk_blocks, 9);
    EXPECT_EQ(kv_files(dir).size(), 9u);
    // Whatever survived of each chain is used; the rest recomputed; outputs exact.
    EXPECT_EQ(run_one(*e, a).tokens, run_alone(a, kVocab).tokens);
    EXPECT_EQ(run_one(*e, b).tokens, run_alone(b, kVocab).tokens);
    EXPECT_GT(e->stats().kv_restored_disk, 0);
  }
  {  // damage after start-up: caught when read, deleted, recomputed
    FakeBackend be(64, 16, kVocab);
    auto e = tier_engine(be, disk_config(dir, 0));
    const int64_t rejected = e->stats().kv_disk_rejected;
    EXPECT_EQ(rejected, 0);
    for (const auto& p : kv_files(dir)) flip(p, static_cast<std::streamoff>(fs::file_size(p) - 20));
    EXPECT_EQ(run_one(*e, a).tokens, run_alone(a, kVocab).tokens);
    EXPECT_EQ(e->stats().kv_restored_disk, 0);
    EXPECT_GE(e->stats().kv_disk_rejected, 1);
  }
  {  // another model: every file rejected
    FakeBackend be(64, 16, kVocab);
    KvTierConfig tc = disk_config(dir, 0);
    const size_t n = kv_files(dir).size();
    ASSERT_GT(n, 0u);
    tc.model_hash ^= 1;
    auto e = tier_engine(be, tc);
    EXPECT_EQ(e->stats().kv_disk_rejected, static_cast<int64_t>(n));
    EXPECT_EQ(e->stats().kv_disk_blocks, 0);
  }
}

// The disk tier's byte bound drops the oldest files; a failing disk (the file-size limit stands in
// for a full filesystem) stops the writes while every request still completes exactly.
TEST(KvTiers, DiskBoundAndDiskFull) {
  std::mt19937 g(13);
  std::vector<Spec> specs;
  for (int i = 0; i < 4; ++i) specs.push_back(spec(random_tokens(g, 100, kVocab), 8));
  {
    const ScopedDir scoped_dir("bound");
    const std::string& dir = scoped_dir.path;
    FakeBackend be(12, 16, kVocab);
    KvTierConfig tc = disk_config(dir);
    const int64_t file_bytes = 64 + 16 * 4 + be.kv_block_bytes() + 8;
    tc.disk_bytes = 5 * file_bytes;
    auto e = tier_engine(be, tc);
    for (const Spec& s : specs) EXPECT_EQ(run_one(*e, s).tokens, run_alone(s, kVocab).tokens);
    e.reset();
    EXPECT_LE(kv_files(dir).size(), 5u);
    FakeBackend be2(12, 16, kVocab);
    auto e2 = tier_engine(be2, tc);
    EXPECT_LE(e2->stats().kv_disk_used_bytes, tc.disk_bytes);
  }
  const ScopedDir scoped_dir("full");
  const std::string& dir = scoped_dir.path;
  FakeBackend be(12, 16, kVocab);
  auto e = tier_engine(be, disk_config(dir));
  rlimit old{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
  auto old_handler = signal(SIGXFSZ, SIG_IGN);
  rlimit small = old;
  small.rlim_cur = 100;  // smaller than one entry: every write fails (EFBIG)
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  for (const Spec& s : specs) EXPECT_EQ(run_one(*e, s).tokens, run_alone(s, kVocab).tokens);
  EXPECT_EQ(run_one(*e, specs[0]).tokens, run_alone(specs[0], kVocab).tokens);
  EngineStats st = e->stats();
  for (int i = 0; i < 500 && !st.kv_disk_writes_stopped; ++i) {  // the writer thread is asynchronous
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ASSERT_TRUE(e->step().ok());  // an idle step refreshes the stats
    st = e->stats();
  }
  e.reset();
  setrlimit(RLIMIT_FSIZE, &old);
  signal(SIGXFSZ, old_handler);
  EXPECT_TRUE(st.kv_disk_writes_stopped);
  EXPECT_GE(st.kv_disk_write_errors, 1);
  EXPECT_EQ(st.kv_disk_writes, 0);
  EXPECT_GT(st.kv_restored_host, 0);  // the host tier still serves
  EXPECT_TRUE(kv_files(dir).empty());
}

// kill -9 while the disk tier writes: the next start serves nothing wrong and uses the rest.
TEST(KvTiers, KillDuringWritesNeverServesWrongKv) {
  const ScopedDir scoped_dir("kill");
  const std::string& dir = scoped_dir.path;
  auto make_specs = [] {
    std::mt19937 g(17);
    std::vector<Spec> v;
    for (int i = 0; i < 40; ++i) v.push_back(spec(random_tokens(g, 100, kVocab), 4));
    return v;
  };
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {  // the child demotes as fast as it can until killed
    FakeBackend be(12, 16, kVocab);
    auto e = tier_engine(be, disk_config(dir));
    for (;;)
      for (const Spec& s : make_specs()) run_one(*e, s);
  }
  for (int i = 0; i < 500 && (!fs::exists(dir) || kv_files(dir).size() < 20); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_GT(kv_files(dir).size(), 0u);
  FakeBackend be(12, 16, kVocab);
  auto e = tier_engine(be, disk_config(dir));
  for (const Spec& s : make_specs()) EXPECT_EQ(run_one(*e, s).tokens, run_alone(s, kVocab).tokens);
  EXPECT_GT(e->stats().kv_restored_disk, 0);
}

TEST(KvTiers, BadConfigurationsAreClearErrors) {
  FakeBackend be(8, 16, kVocab);
  KvTierConfig tc;
  tc.disk_dir = fresh_dir("cfg");
  EXPECT_FALSE(KvTiers::create(tc, be).ok());  // no bound
  tc = host_config();
  tc.ttl_ms = -1;
  EXPECT_FALSE(KvTiers::create(tc, be).ok());
  EngineConfig cfg;
  cfg.tiers = host_config();
  cfg.scheduler.enable_prefix_caching = false;
  auto e = Engine::create(be, cfg);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.message().find("prefix caching"), std::string::npos);
}
