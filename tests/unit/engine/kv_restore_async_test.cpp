// Restores from the KV tiers run on the tiers' loader thread while the other sequences keep
// stepping. The loader is held on a latch (a tier read that takes as long as the test wants), so a
// restore is in flight for as many steps as the test runs. Outputs are checked against the request
// run alone on the fake backend, whose K/V cells hold the (token, position) written there: a block
// restored with wrong bytes, or read before its bytes are in, fails the step or changes the tokens.
#include <gtest/gtest.h>
#include <unistd.h>

#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>

#include "engine/host_executor.h"
#include "engine/kv_cache_manager.h"
#include "engine/kv_tiers.h"
#include "fake_backend.h"

using namespace ss;
using namespace ss::engine;
using namespace ss::engine::testing;
namespace fs = std::filesystem;

namespace {
constexpr int kVocab = 97;
constexpr int kBlock = 16;

// Blocks the loader thread until opened; counts the items that reached it.
struct Latch {
  std::mutex m;
  std::condition_variable cv;
  bool open = false;
  int arrived = 0;
  void wait() {
    std::unique_lock<std::mutex> lk(m);
    ++arrived;
    cv.notify_all();
    cv.wait(lk, [&] { return open; });
  }
  void release() {
    std::lock_guard<std::mutex> lk(m);
    open = true;
    cv.notify_all();
  }
  bool wait_arrived(int n) {
    std::unique_lock<std::mutex> lk(m);
    return cv.wait_for(lk, std::chrono::seconds(10), [&] { return arrived >= n; });
  }
};
// Opens the latch when the test leaves, before the executor (declared before it) joins the loader.
struct OpenOnExit {
  Latch& l;
  ~OpenOnExit() { l.release(); }
};

struct TestClock {
  Clock::time_point now = Clock::now();
  std::function<Clock::time_point()> fn() {
    return [this] { return now; };
  }
};

struct Life {
  std::vector<int32_t> tokens;
  FinishReason finish = FinishReason::None;
  std::vector<backend::SeqMark> marks;
};

// Drives a HostExecutor directly: one poll is one step.
struct Driver {
  explicit Driver(HostExecutor& e) : ex(e) {}
  HostExecutor& ex;
  std::map<SeqId, Life> lives;
  int poll() {  // returns the number of token events
    std::vector<SeqEvent> evs;
    Status st = ex.poll(evs);
    EXPECT_TRUE(st.ok()) << st.message();
    Status inv = ex.check_invariants();
    EXPECT_TRUE(inv.ok()) << inv.message();
    int n = 0;
    for (SeqEvent& e : evs) {
      Life& l = lives[e.id];
      if (e.token >= 0) {
        l.tokens.push_back(e.token);
        ++n;
      }
      if (e.finish != FinishReason::None) l.finish = e.finish;
      l.marks.insert(l.marks.end(), e.marks.begin(), e.marks.end());
    }
    return n;
  }
  void start(SeqId id, const Spec& s) {
    SeqStart r;
    r.id = id;
    r.prompt = s.prompt;
    r.max_tokens = s.max_tokens;
    r.sampling.temperature = 0;
    ASSERT_TRUE(ex.check(r).ok());
    ex.start(std::move(r));
  }
  void run_all(int max_steps = 2000) {
    for (int i = 0; i < max_steps && ex.has_work(); ++i) poll();
    ASSERT_FALSE(ex.has_work());
  }
};

// A disk tier alone (no host tier) in dir, 1 MiB, a 1 s TTL; bound to model_hash.
KvTierConfig disk_tier(const std::string& dir, uint64_t model_hash) {
  KvTierConfig tc;
  tc.disk_dir = dir;
  tc.disk_bytes = 1 << 20;
  tc.model_hash = model_hash;
  tc.ttl_ms = 1000;
  return tc;
}

std::unique_ptr<HostExecutor> make_executor(backend::Backend& be, const KvTierConfig& tc,
                                            std::function<Clock::time_point()> clock, int64_t restore_bytes_per_step = 0,
                                            double restore_ms_per_step = -1) {
  SchedulerConfig sc;
  sc.max_num_seqs = 4;
  sc.max_num_batched_tokens = 64;
  if (restore_bytes_per_step > 0) sc.max_restore_bytes_per_step = restore_bytes_per_step;
  if (restore_ms_per_step >= 0) sc.restore_ms_per_step = restore_ms_per_step;
  auto ex = HostExecutor::create(be, sc, std::move(clock), tc);
  EXPECT_TRUE(ex.ok()) << (ex.ok() ? "" : ex.message());
  return ex.ok() ? std::move(ex).value() : nullptr;
}

// The next turn of a conversation: its history (prompt and answer) and a new message.
Spec next_turn(const Spec& t1, const std::vector<int32_t>& answer, std::mt19937& g, int max_tokens) {
  Spec t2 = t1;
  t2.prompt.insert(t2.prompt.end(), answer.begin(), answer.end());
  const auto msg = random_tokens(g, 20, kVocab);
  t2.prompt.insert(t2.prompt.end(), msg.begin(), msg.end());
  t2.max_tokens = max_tokens;
  return t2;
}

std::string fresh_dir(const std::string& name) {
  const std::string d = ::testing::TempDir() + "ss_kv_async_" + name + "_" + std::to_string(::getpid());
  fs::remove_all(d);
  return d;
}
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
  return v;
}

// Runs turn 1, lets its blocks idle past the TTL into the tiers, and returns its answer.
std::vector<int32_t> run_and_demote(Driver& d, TestClock& clock, const Spec& t1, int64_t ttl_ms) {
  d.start(1, t1);
  d.run_all();
  EXPECT_EQ(d.lives[1].finish, FinishReason::Length);
  clock.now += std::chrono::milliseconds(ttl_ms + 1);
  d.poll();  // an idle tick: every idle block leaves the pool
  EXPECT_EQ(d.ex.stats().kv_blocks_cached, 0);
  return d.lives[1].tokens;
}
}  // namespace

// While a returning turn's history is being read from the host tier (the loader held), a running
// stream gets a token every step; the returning turn waits, holding its blocks and no seat in the
// batch, and once the blocks are in it gives the tokens it gives alone, from the restored prefix.
TEST(KvRestoreAsync, RestoreInFlightDoesNotStallOtherSequences) {
  std::mt19937 g(31);
  Latch latch;
  TestClock clock;
  FakeBackend be(64, kBlock, kVocab);
  KvTierConfig tc;
  tc.host_bytes = 1 << 20;
  tc.ttl_ms = 1000;
  auto ex = make_executor(be, tc, clock.fn());
  ASSERT_TRUE(ex);
  OpenOnExit guard{latch};
  Driver d(*ex);
  const Spec t1 = spec(random_tokens(g, 100, kVocab), 8);
  const auto answer = run_and_demote(d, clock, t1, tc.ttl_ms);
  ASSERT_EQ(ex->stats().kv_demoted_idle, (100 + 8 - 1) / kBlock);
  const Spec t2 = next_turn(t1, answer, g, 6);
  const int history_blocks = (100 + 8 - 1) / kBlock;  // 6 full blocks of prompt + answer

  const Spec stream = spec(random_tokens(g, 10, kVocab), 40);
  d.start(2, stream);
  d.poll();  // the stream's prefill and first token
  ASSERT_EQ(d.lives[2].tokens.size(), 1u);

  ex->tiers()->set_load_hook([&](BlockHash) { latch.wait(); });
  d.start(3, t2);
  const int forwards = be.forwards;
  for (int i = 0; i < 12; ++i) {
    EXPECT_EQ(d.poll(), 1) << "step " << i << ": the stream alone gets its token";
    if (i == 0) {
      ASSERT_TRUE(latch.wait_arrived(1));
    }
  }
  EXPECT_EQ(be.forwards - forwards, 12);  // every step ran a forward
  EXPECT_TRUE(d.lives[3].tokens.empty());
  const backend::ExecutorStats mid = ex->stats();
  EXPECT_EQ(mid.num_running, 1);
  EXPECT_EQ(mid.num_waiting, 1);                     // the restoring turn
  const int stream_blocks = (10 + 12 + kBlock - 1) / kBlock;  // its prompt and 12 decodes
  EXPECT_EQ(mid.kv_blocks_used, stream_blocks + history_blocks);  // the stream's and the held history
  EXPECT_EQ(mid.kv_restored_host, 0);
  EXPECT_EQ(be.blocks_written, 0);                    // nothing copied into the pool yet

  latch.release();
  d.run_all();
  EXPECT_EQ(d.lives[2].tokens, run_alone(stream, kVocab).tokens);
  EXPECT_EQ(d.lives[3].tokens, run_alone(t2, kVocab).tokens);
  const backend::ExecutorStats st = ex->stats();
  EXPECT_EQ(st.kv_restored_host, history_blocks);
  EXPECT_EQ(be.blocks_written, history_blocks);
  // The history was not recomputed: turn 2 computed its new tokens and its decodes only.
  EXPECT_EQ(st.computed_tokens - mid.computed_tokens - (40 - 1 - 12),
            static_cast<int64_t>(t2.prompt.size()) - history_blocks * kBlock + t2.max_tokens - 1);
  int restore_marks = 0;
  for (const backend::SeqMark& m : d.lives[3].marks) {
    if (m.kind != backend::SeqMark::Kind::KvRestore) continue;
    ++restore_marks;
    EXPECT_EQ(m.position, 0);
    EXPECT_EQ(m.tokens, history_blocks * kBlock);
    EXPECT_EQ(m.from_disk, 0);
    EXPECT_LE(m.at, m.end);
  }
  EXPECT_EQ(restore_marks, 1);
}

// With sequences running, a step copies at most k loaded blocks into the pool, all in one batched
// copy, whichever bound sets k (`bound` makes the executor and says how); the restored turn still
// matches the request run alone.
void expect_restores_of_k_blocks_a_step(int k, const std::function<std::unique_ptr<HostExecutor>(
                                                   FakeBackend&, const KvTierConfig&, TestClock&)>& bound) {
  std::mt19937 g(37);
  TestClock clock;
  FakeBackend be(256, kBlock, kVocab);
  KvTierConfig tc;
  tc.host_bytes = 1 << 22;
  tc.ttl_ms = 1000;
  auto ex = bound(be, tc, clock);
  ASSERT_TRUE(ex);
  Driver d(*ex);
  const Spec t1 = spec(random_tokens(g, (2 * k + 5) * kBlock + 3, kVocab), 1);
  const auto answer = run_and_demote(d, clock, t1, tc.ttl_ms);
  const Spec t2 = next_turn(t1, answer, g, 4);
  const int history_blocks = (static_cast<int>(t1.prompt.size()) + 1 - 1) / kBlock;
  const Spec stream = spec(random_tokens(g, 10, kVocab), 30);
  d.start(2, stream);
  d.poll();
  // Hold the loader until every block is loaded, so the copies, not the reads, set the pace.
  Latch latch;
  OpenOnExit guard{latch};
  ex->tiers()->set_load_hook([&](BlockHash) { latch.wait(); });
  d.start(3, t2);
  d.poll();  // the restore starts
  ASSERT_TRUE(latch.wait_arrived(1));
  ex->tiers()->set_load_hook({});
  latch.release();
  for (int i = 0; i < 500 && ex->tiers()->stats().loads_ready < history_blocks; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  std::vector<int> per_step;
  int before = be.blocks_written;
  be.write_batches.clear();
  while (d.lives[3].tokens.empty() && ex->has_work()) {
    d.poll();
    per_step.push_back(be.blocks_written - before);
    before = be.blocks_written;
  }
  ASSERT_GE(per_step.size(), 3u);
  EXPECT_EQ(per_step[0], k);
  EXPECT_EQ(per_step[1], k);
  EXPECT_EQ(per_step[2], history_blocks - 2 * k);
  EXPECT_EQ(be.write_batches, (std::vector<int>{k, k, history_blocks - 2 * k}));  // one batched copy a step
  d.run_all();
  EXPECT_EQ(d.lives[3].tokens, run_alone(t2, kVocab).tokens);
  EXPECT_EQ(d.lives[2].tokens, run_alone(stream, kVocab).tokens);
  EXPECT_EQ(ex->stats().kv_restored_host, history_blocks);
}

// With nothing else running, a returning history held by the host tier reaches the pool in one
// batched copy: the loader hands a run of in-place blocks over together, and the step takes them all.
// (Without that hand-over this held here too, because the loader outran the engine's wake-up with
// these tiny blocks; the hand-over makes it hold whatever the threads' timing.)
TEST(KvRestoreAsync, ReturningHostHistoryIsOneBatchedCopyWhenNothingRuns) {
  std::mt19937 g(43);
  TestClock clock;
  FakeBackend be(256, kBlock, kVocab);
  KvTierConfig tc;
  tc.host_bytes = 1 << 22;
  tc.ttl_ms = 1000;
  auto ex = make_executor(be, tc, clock.fn());
  ASSERT_TRUE(ex);
  Driver d(*ex);
  const Spec t1 = spec(random_tokens(g, 40 * kBlock + 5, kVocab), 3);
  const auto answer = run_and_demote(d, clock, t1, tc.ttl_ms);
  const Spec t2 = next_turn(t1, answer, g, 4);
  const int history_blocks = (static_cast<int>(t1.prompt.size()) + 3 - 1) / kBlock;
  be.write_batches.clear();
  d.start(3, t2);
  d.run_all();
  EXPECT_EQ(be.write_batches, std::vector<int>{history_blocks});
  EXPECT_EQ(ex->stats().kv_restored_host, history_blocks);
  EXPECT_EQ(d.lives[3].tokens, run_alone(t2, kVocab).tokens);
}

// The byte cap (max_restore_bytes_per_step, rounded down to whole blocks): 24.5 blocks' bytes give
// 24 a step. The time bound does not bind: no batch was big enough to time, so it allows 8 MiB.
TEST(KvRestoreAsync, CopiesIntoThePoolAreBoundedInBytesPerStepWhileStreamsRun) {
  expect_restores_of_k_blocks_a_step(24, [](FakeBackend& be, const KvTierConfig& tc, TestClock& clock) {
    return make_executor(be, tc, clock.fn(), 24 * be.kv_block_bytes() + be.kv_block_bytes() / 2);
  });
}

// The time bound (restore_ms_per_step at the tiers' measured copy rate): at a rate that moves 10.5
// blocks in 2 ms, 10 a step, under a byte cap of 1 GiB.
TEST(KvRestoreAsync, CopiesIntoThePoolTakeTheirTimeBudgetAtTheMeasuredRate) {
  expect_restores_of_k_blocks_a_step(10, [](FakeBackend& be, const KvTierConfig& tc, TestClock& clock) {
    auto ex = make_executor(be, tc, clock.fn(), int64_t(1) << 30, 2.0);
    if (ex) ex->tiers()->set_copy_bytes_per_s(10.5 * double(be.kv_block_bytes()) / 0.002);
    return ex;
  });
}

// A returning turn cancelled while its blocks are being read from disk: its finish event comes at
// once, every block it held is free again, nothing is copied into the pool when the read ends, and
// no staging memory is left behind; the tier still has the entries for the next turn.
TEST(KvRestoreAsync, CancelWhileRestoringFreesEverything) {
  std::mt19937 g(41);
  const ScopedDir dir("cancel");
  Latch latch;
  TestClock clock;
  FakeBackend be(64, kBlock, kVocab);
  KvTierConfig tc = disk_tier(dir.path, 7);
  auto ex = make_executor(be, tc, clock.fn());
  ASSERT_TRUE(ex);
  OpenOnExit guard{latch};
  Driver d(*ex);
  const Spec t1 = spec(random_tokens(g, 100, kVocab), 8);
  const auto answer = run_and_demote(d, clock, t1, tc.ttl_ms);
  ex->tiers()->wait_for_writes();
  const int history_blocks = (100 + 8 - 1) / kBlock;
  ASSERT_EQ(ex->tiers()->stats().disk_blocks, history_blocks);
  const Spec t2 = next_turn(t1, answer, g, 6);

  ex->tiers()->set_load_hook([&](BlockHash) { latch.wait(); });
  d.start(3, t2);
  d.poll();
  ASSERT_TRUE(latch.wait_arrived(1));
  EXPECT_EQ(ex->stats().kv_blocks_used, history_blocks);
  ex->stop(3, FinishReason::Abort);
  d.poll();
  EXPECT_EQ(d.lives[3].finish, FinishReason::Abort);
  EXPECT_TRUE(d.lives[3].tokens.empty());
  EXPECT_FALSE(ex->has_work());
  EXPECT_EQ(ex->stats().kv_blocks_used, 0);
  EXPECT_EQ(ex->stats().kv_blocks_cached, 0);  // none was copied in, so none is cached

  latch.release();
  for (int i = 0; i < 500 && ex->tiers()->stats().loads_pending > 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  const KvTierStats ts = ex->tiers()->stats();
  EXPECT_EQ(ts.loads_pending, 0);
  EXPECT_EQ(ts.staging_bytes, 0);
  EXPECT_EQ(ts.restored_disk, 0);
  d.poll();  // an idle tick: nothing to apply
  EXPECT_EQ(be.blocks_written, 0);
  EXPECT_TRUE(ex->check_invariants().ok());

  ex->tiers()->set_load_hook({});
  d.start(4, t2);  // the turn again: the disk still has its history
  d.run_all();
  EXPECT_EQ(d.lives[4].tokens, run_alone(t2, kVocab).tokens);
  EXPECT_EQ(ex->stats().kv_restored_disk, history_blocks);
}

// A disk entry that fails its checksum when read ends the restored prefix there: the blocks before
// it are restored, it is deleted and counted, and the rest is recomputed with the same output.
TEST(KvRestoreAsync, CorruptReadFallsBackToRecompute) {
  std::mt19937 g(43);
  const ScopedDir dir("corrupt");
  TestClock clock;
  FakeBackend be(64, kBlock, kVocab);
  KvTierConfig tc = disk_tier(dir.path, 9);
  auto ex = make_executor(be, tc, clock.fn());
  ASSERT_TRUE(ex);
  Driver d(*ex);
  const Spec t1 = spec(random_tokens(g, 100, kVocab), 8);
  const auto answer = run_and_demote(d, clock, t1, tc.ttl_ms);
  ex->tiers()->wait_for_writes();
  const int history_blocks = (100 + 8 - 1) / kBlock;
  ASSERT_EQ(ex->tiers()->stats().disk_blocks, history_blocks);
  const Spec t2 = next_turn(t1, answer, g, 6);
  // Block 3 of the history, named by its chain hash: flip a byte of its payload.
  BlockHash h = kRootBlockHash;
  for (int b = 0; b <= 3; ++b)
    h = hash_block(h, std::span<const int32_t>(t2.prompt).subspan(static_cast<size_t>(b) * kBlock, kBlock));
  char name[32];
  std::snprintf(name, sizeof name, "/%016llx.kvb", static_cast<unsigned long long>(h));
  const std::string path = dir.path + name;
  ASSERT_TRUE(fs::exists(path));
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(64 + 64 + 10);
    char c;
    f.get(c);
    f.seekp(64 + 64 + 10);
    f.put(static_cast<char>(c ^ 0x20));
  }
  const int64_t computed = ex->stats().computed_tokens;
  d.start(3, t2);
  d.run_all();
  EXPECT_EQ(d.lives[3].tokens, run_alone(t2, kVocab).tokens);
  const backend::ExecutorStats st = ex->stats();
  EXPECT_EQ(st.kv_restored_disk, 3);
  EXPECT_EQ(st.kv_disk_rejected, 1);
  EXPECT_FALSE(fs::exists(path));
  EXPECT_EQ(st.computed_tokens - computed, static_cast<int64_t>(t2.prompt.size()) - 3 * kBlock + t2.max_tokens - 1);
  EXPECT_EQ(ex->tiers()->stats().load_failures, 1);
  EXPECT_EQ(ex->tiers()->stats().staging_bytes, 0);
}

// Several returning conversations restoring at once, interleaved with new requests and a stream,
// under a pool small enough to evict: every output is the request's output run alone, and the
// invariants hold after every step (Driver::poll checks them).
TEST(KvRestoreAsync, ConcurrentRestoresUnderEvictionKeepOutputsExact) {
  std::mt19937 g(47);
  TestClock clock;
  FakeBackend be(40, kBlock, kVocab);
  KvTierConfig tc;
  tc.host_bytes = 1 << 22;
  tc.ttl_ms = 1000;
  auto ex = make_executor(be, tc, clock.fn());
  ASSERT_TRUE(ex);
  Driver d(*ex);
  std::vector<Spec> firsts, seconds;
  SeqId id = 1;
  for (int c = 0; c < 4; ++c) {
    firsts.push_back(spec(random_tokens(g, 60 + 13 * c, kVocab), 5));
    d.start(id, firsts.back());
    d.run_all();
    seconds.push_back(next_turn(firsts.back(), d.lives[id].tokens, g, 5));
    ++id;
  }
  clock.now += std::chrono::milliseconds(tc.ttl_ms + 1);
  d.poll();
  ASSERT_GT(ex->stats().kv_host_blocks, 0);
  const Spec stream = spec(random_tokens(g, 12, kVocab), 30);
  const SeqId stream_id = id++;
  d.start(stream_id, stream);
  d.poll();
  std::vector<SeqId> ids;
  for (const Spec& s : seconds) {
    ids.push_back(id);
    d.start(id++, s);
    d.poll();
  }
  d.run_all();
  for (size_t i = 0; i < seconds.size(); ++i)
    EXPECT_EQ(d.lives[ids[i]].tokens, run_alone(seconds[i], kVocab).tokens) << "conversation " << i;
  EXPECT_EQ(d.lives[stream_id].tokens, run_alone(stream, kVocab).tokens);
  EXPECT_GT(ex->stats().kv_restored_host, 0);
}

// A block demoted to a disk-only tier whose write has not landed (the writer held on a latch) is
// found and restored from the write queue's bytes, by both restore paths, bit-exact; when the write
// then lands, the file is indexed, intact, and serves the same bytes after a restart.
TEST(KvRestoreAsync, QueuedDiskWriteIsRestoredBeforeItLands) {
  for (bool compress : {false, true}) {
    SCOPED_TRACE(compress ? "zstd" : "plain");
    std::mt19937 g(compress ? 47 : 45);
    const ScopedDir dir(compress ? "queued_z" : "queued");
    FakeBackend be(8, 1024, kVocab);  // 8 KiB blocks: zstd spans several arena chunks
    const size_t bb = static_cast<size_t>(be.kv_block_bytes());
    std::vector<uint8_t> bytes(bb);
    for (size_t i = 0; i < bb; ++i) bytes[i] = i % 2 ? 0 : static_cast<uint8_t>(g());
    ASSERT_TRUE(be.write_kv_block(2, bytes).ok());
    const auto tokens = random_tokens(g, 1024, kVocab);
    const BlockHash hash = hash_block(kRootBlockHash, tokens);
    KvTierConfig tc;
    tc.disk_dir = dir.path;
    tc.disk_bytes = 1 << 20;
    tc.model_hash = 11;
    tc.host_compress = compress;
    std::vector<uint8_t> back(bb);
    {
      Latch latch;
      auto t = KvTiers::create(tc, be);
      ASSERT_TRUE(t.ok()) << t.message();
      OpenOnExit guard{latch};  // before the tiers join the writer
      (*t)->set_write_hook([&](BlockHash) { latch.wait(); });
      (*t)->demote(2, hash, kRootBlockHash, tokens, KvTiers::Why::Idle);
      ASSERT_TRUE(latch.wait_arrived(1));  // the writer holds it: no file yet
      EXPECT_TRUE(kv_files(dir.path).empty());
      EXPECT_EQ((*t)->stats().disk_blocks, 0);
      EXPECT_GT((*t)->stats().write_queue_bytes, 0);
      ASSERT_EQ((*t)->find(hash, kRootBlockHash, tokens), KvTiers::Where::Disk);

      ASSERT_TRUE((*t)->restore(hash, kRootBlockHash, tokens, 5));  // the synchronous path
      ASSERT_TRUE(be.read_kv_block(5, back).ok());
      EXPECT_EQ(back, bytes);
      const KvTiers::LoadItem item{hash, kRootBlockHash, tokens};  // the loader's path
      (*t)->load_async(std::span<const KvTiers::LoadItem>(&item, 1));
      ASSERT_TRUE((*t)->wait_loaded(std::chrono::seconds(10)));
      std::vector<KvTiers::Loaded> got;
      ASSERT_EQ((*t)->take_loaded(1, got), 1);
      ASSERT_TRUE(got[0].ok);
      EXPECT_TRUE(got[0].queued);
      ASSERT_TRUE((*t)->apply_load(got[0], item, 6));
      ASSERT_TRUE(be.read_kv_block(6, back).ok());
      EXPECT_EQ(back, bytes);
      KvTierStats st = (*t)->stats();
      EXPECT_EQ(st.restored_disk, 2);
      EXPECT_EQ(st.restored_queued, 2);
      EXPECT_EQ(st.disk_writes, 0);

      latch.release();  // the write lands after the restores
      (*t)->wait_for_writes();
      st = (*t)->stats();
      EXPECT_EQ(st.disk_writes, 1);
      EXPECT_EQ(st.disk_blocks, 1);
      EXPECT_EQ(st.write_queue_bytes, 0);
      EXPECT_EQ(st.arena_bytes > 0 && st.host_used_bytes == 0, true);  // no host tier: the arena is the queue's
      EXPECT_EQ(kv_files(dir.path).size(), 1u);
      ASSERT_EQ((*t)->find(hash, kRootBlockHash, tokens), KvTiers::Where::Disk);
      ASSERT_TRUE((*t)->restore(hash, kRootBlockHash, tokens, 7));  // now from the file
      ASSERT_TRUE(be.read_kv_block(7, back).ok());
      EXPECT_EQ(back, bytes);
      EXPECT_EQ((*t)->stats().restored_queued, 2);
    }
    auto t = KvTiers::create(tc, be);  // a restart: the index is rebuilt from the file
    ASSERT_TRUE(t.ok()) << t.message();
    const KvTierStats st = (*t)->stats();
    EXPECT_EQ(st.disk_blocks, 1);
    EXPECT_EQ(st.disk_rejected, 0);
    ASSERT_TRUE((*t)->restore(hash, kRootBlockHash, tokens, 4));
    ASSERT_TRUE(be.read_kv_block(4, back).ok());
    EXPECT_EQ(back, bytes);
  }
}

// The same through the engine: a returning turn whose history is still queued for the disk
// writer is restored (not recomputed) and gives the tokens it gives alone; the writes land later.
TEST(KvRestoreAsync, ReturningTurnIsRestoredFromQueuedDiskWrites) {
  std::mt19937 g(49);
  const ScopedDir dir("queued_turn");
  Latch latch;
  TestClock clock;
  FakeBackend be(64, kBlock, kVocab);
  KvTierConfig tc = disk_tier(dir.path, 13);
  auto ex = make_executor(be, tc, clock.fn());
  ASSERT_TRUE(ex);
  OpenOnExit guard{latch};
  ex->tiers()->set_write_hook([&](BlockHash) { latch.wait(); });
  Driver d(*ex);
  const Spec t1 = spec(random_tokens(g, 100, kVocab), 8);
  const auto answer = run_and_demote(d, clock, t1, tc.ttl_ms);
  const int history_blocks = (100 + 8 - 1) / kBlock;
  ASSERT_TRUE(latch.wait_arrived(1));
  EXPECT_EQ(ex->tiers()->stats().disk_blocks, 0);  // every write still queued
  const Spec t2 = next_turn(t1, answer, g, 6);
  d.start(2, t2);
  d.run_all();
  EXPECT_EQ(d.lives[2].tokens, run_alone(t2, kVocab).tokens);
  KvTierStats st = ex->tiers()->stats();
  EXPECT_EQ(st.restored_disk, history_blocks);
  EXPECT_EQ(st.restored_queued, history_blocks);
  EXPECT_EQ(ex->stats().kv_restored_disk, history_blocks);
  EXPECT_EQ(st.disk_blocks, 0);
  latch.release();
  ex->tiers()->wait_for_writes();
  st = ex->tiers()->stats();
  EXPECT_EQ(st.disk_blocks, history_blocks);
  EXPECT_EQ(st.disk_rejected, 0);
  EXPECT_TRUE(ex->check_invariants().ok());
}

// The disk writer far behind (held on a latch) with a write queue of three blocks, and one long
// chain leaving the pool: first idle past the TTL, then evicted for another request's room. No
// block is dropped from the middle of the chain: the idle ones the queue cannot take wait in the
// pool, and the evictions drop the chain from its tail. Whatever is queued or on disk is a prefix
// of the chain (each block's ancestors are there too), and the returning turn restores exactly
// that prefix and gives the tokens it gives alone.
TEST(KvRestoreAsync, WriterBehindDropsChainsFromTheirTailOnly) {
  std::mt19937 g(53);
  const ScopedDir dir("behind");
  Latch latch;
  TestClock clock;
  FakeBackend be(16, kBlock, kVocab);
  KvTierConfig tc = disk_tier(dir.path, 17);
  tc.disk_queue_bytes = 3 * be.kv_block_bytes();
  auto ex = make_executor(be, tc, clock.fn());
  ASSERT_TRUE(ex);
  OpenOnExit guard{latch};
  ex->tiers()->set_write_hook([&](BlockHash) { latch.wait(); });
  Driver d(*ex);
  const Spec t1 = spec(random_tokens(g, 190, kVocab), 8);
  d.start(1, t1);
  d.run_all();
  const int chain = (190 + 8 - 1) / kBlock;  // full blocks of turn 1's history: 12
  ASSERT_EQ(ex->stats().kv_blocks_cached, chain);

  // Idle past the TTL: the queue takes three, the rest stay in the pool (deferred, not dropped).
  clock.now += std::chrono::milliseconds(tc.ttl_ms + 1);
  d.poll();
  ASSERT_TRUE(latch.wait_arrived(1));
  KvTierStats st = ex->tiers()->stats();
  EXPECT_EQ(st.demoted_idle, 3);
  EXPECT_EQ(ex->stats().kv_blocks_cached, chain - 3);
  EXPECT_GT(st.demote_deferred, 0);
  EXPECT_EQ(st.disk_behind_dropped, 0);
  EXPECT_EQ(st.disk_write_errors, 0);

  // Another request takes the whole pool: the rest of the chain is evicted with the queue full.
  const Spec other = spec(random_tokens(g, 250, kVocab), 6);
  d.start(2, other);
  d.run_all();
  EXPECT_EQ(d.lives[2].tokens, run_alone(other, kVocab).tokens);
  st = ex->tiers()->stats();
  EXPECT_EQ(st.demoted_evicted, chain - 3);
  EXPECT_GT(st.disk_behind_dropped, 0);
  EXPECT_EQ(st.disk_write_errors, 0);  // the writer being behind is no I/O error

  // The chain's blocks in the tiers (queued now, on disk later) form a prefix: none is kept
  // without its parent (the pool holds none of them any more: the other request took every block).
  std::vector<int32_t> history = t1.prompt;
  history.insert(history.end(), d.lives[1].tokens.begin(), d.lives[1].tokens.end());
  std::vector<BlockHash> hashes;
  BlockHash parent = kRootBlockHash;
  for (int b = 0; b < chain; ++b) {
    hashes.push_back(hash_block(parent, std::span<const int32_t>(history).subspan(b * kBlock, kBlock)));
    parent = hashes.back();
  }
  auto kept_prefix = [&] {  // the number of leading blocks kept; fails if any block after is kept
    int k = 0;
    for (int b = 0; b < chain; ++b) {
      const auto toks = std::span<const int32_t>(history).subspan(b * kBlock, kBlock);
      const bool kept = ex->tiers()->find(hashes[b], b ? hashes[b - 1] : kRootBlockHash, toks) != KvTiers::Where::None;
      if (kept && k == b) ++k;
      EXPECT_TRUE(!kept || k > b) << "block " << b << " is kept without block " << k << " of its chain";
    }
    return k;
  };
  const int queued = kept_prefix();
  EXPECT_GE(queued, 1);
  latch.release();
  ex->tiers()->wait_for_writes();
  const int on_disk = kept_prefix();
  EXPECT_EQ(on_disk, queued);
  st = ex->tiers()->stats();
  EXPECT_EQ(st.disk_blocks, on_disk);
  EXPECT_EQ(static_cast<int>(kv_files(dir.path).size()), on_disk);

  // The returning turn: restored from disk as far as the chain was kept, recomputed after.
  const Spec t2 = next_turn(t1, d.lives[1].tokens, g, 6);
  d.start(3, t2);
  d.run_all();
  EXPECT_EQ(d.lives[3].tokens, run_alone(t2, kVocab).tokens);
  EXPECT_EQ(ex->tiers()->stats().restored_disk, on_disk);
  EXPECT_TRUE(ex->check_invariants().ok());
}
