// The device loop's scheduler (backend/cuda/loop_iteration.h: the phases loop_runner.cu's kernel
// runs between its barriers) on the host, one thread, with the paging-checking fake backend standing
// in for the decode graph: it reads only what the phases wrote where the graph reads it (tokens,
// positions, slots, context lengths and sample rows, padded to the bucket; the backend's block
// tables) and writes the argmax ids where the next commit reads them. Through the ResidentExecutor,
// every greedy sequence's tokens must equal the model's alone (the toy model's own arithmetic),
// with the loop's share of slots and blocks offset inside the backend's; a stop() delivers nothing
// after it, every block comes back, and the padding rows only ever touch the spare slot.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <random>
#include <span>
#include <thread>
#include <vector>

#include "../../unit/engine/fake_backend.h"
#include "backend/cuda/loop_iteration.h"
#include "engine/resident_executor.h"

using namespace ss;
using namespace ss::engine;
using namespace ss::engine::testing;

namespace {

constexpr int kVocab = 97;

template <class T>
struct HostRing {
  explicit HostRing(uint32_t cap) : slots(cap) { queues::SeqSlot<T>* p = slots.data(); devloop::InRing<T>::init_slots(p, cap); }
  std::vector<queues::SeqSlot<T>> slots;
  uint64_t enq = 0, deq = 0;
};

// A LoopRunner whose loop is loop_iteration.h's phases on a host thread.
class PhaseRunner final : public LoopRunner {
 public:
  // sampling: the scheduler writes each sample row's parameters (the device sampler's input) and
  // the graph's stand-in draws with them; else every row is drawn greedy and sampled sequences are
  // turned away, as a loop without sampling graphs does.
  PhaseRunner(backend::Backend& be, const resident::Geometry& g, LoopShare share, int bucket_cap, bool sampling = false)
      : be_(be), geo_(g), share_(share), submits_(256), blocks_(512), done_(1u << 14) {
    sampling_ = sampling;
    const size_t prompts = static_cast<size_t>(g.max_slots) * g.max_len;
    const size_t tables = static_cast<size_t>(g.max_slots) * g.max_blocks;
    host_prompts_.assign(prompts, 0), dev_prompts_.assign(prompts, 0);
    host_tables_.assign(tables, -1), dev_tables_.assign(tables, -1);
    synced_.assign(static_cast<size_t>(g.max_slots), 0);
    slots_.assign(static_cast<size_t>(g.max_slots), resident::Slot{});
    for (auto* v : {&row_tokens_, &row_pos_, &row_slots_}) v->assign(static_cast<size_t>(g.max_rows), 0);
    row_sample_.assign(static_cast<size_t>(g.max_rows), 0);
    for (auto* v : {&tokens_, &positions_, &token_slot_, &ctx_, &rows_, &ids_}) v->assign(static_cast<size_t>(bucket_cap), -7);
    be_max_blocks_ = g.max_blocks + 3;  // a backend row longer than the loop's
    spare_slot_ = share.first_slot + g.max_slots;
    be_tables_.assign(static_cast<size_t>(spare_slot_ + 1) * be_max_blocks_, -1);
    ds_.st.geo = g;
    ds_.st.slots = slots_.data();
    ds_.st.tables = dev_tables_.data();
    ds_.st.prompts = dev_prompts_.data();
    a_.ds = &ds_;
    a_.ctl = &ctl_;
    a_.submits = devloop::InRing<resident::Submit>(submits_.slots.data(), 256, &submits_.enq, &submits_.deq);
    a_.blocks = devloop::InRing<int32_t>(blocks_.slots.data(), 512, &blocks_.enq, &blocks_.deq);
    a_.done = devloop::OutRing<resident::Completion>(done_.slots.data(), 1u << 14, &done_.enq, &done_.deq);
    a_.host_prompts = host_prompts_.data();
    a_.prompts = dev_prompts_.data();
    a_.host_tables = host_tables_.data();
    a_.synced = synced_.data();
    a_.row_tokens = row_tokens_.data(), a_.row_pos = row_pos_.data(), a_.row_slots = row_slots_.data();
    a_.row_sample = row_sample_.data();
    a_.tokens = tokens_.data(), a_.positions = positions_.data(), a_.token_slot = token_slot_.data();
    a_.ctx = ctx_.data(), a_.rows = rows_.data(), a_.ids = ids_.data();
    a_.be_tables = be_tables_.data();
    a_.be_max_blocks = be_max_blocks_;
    a_.first_slot = share.first_slot, a_.first_block = share.first_block, a_.spare_slot = spare_slot_;
    a_.r_cap = 1;
    while (a_.r_cap < g.max_slots) a_.r_cap *= 2;
    greedy_.temperature = 0.0f;
    if (sampling_) {
      row_params_.assign(static_cast<size_t>(a_.r_cap), devloop::RowParams{-1.0f, -1, -1.0f, -1.0f, 0, 0});
      a_.row_params = row_params_.data();
      row_sampling_.resize(static_cast<size_t>(a_.r_cap));
    }
    thread_ = std::thread([this] { run(); });
  }
  ~PhaseRunner() override {
    __atomic_store_n(&ctl_.stop, 1u, __ATOMIC_RELEASE);
    thread_.join();
  }

  std::string name() const override { return "phases on the host"; }
  const resident::Geometry& geometry() const override { return geo_; }
  int num_blocks() const override { return share_.blocks; }
  int32_t* prompt_row(int slot) override { return host_prompts_.data() + static_cast<size_t>(slot) * geo_.max_len; }
  const int32_t* table_row(int slot) const override {
    return host_tables_.data() + static_cast<size_t>(slot) * geo_.max_blocks;
  }
  int32_t* admit_table_row(int slot) override { return host_tables_.data() + static_cast<size_t>(slot) * geo_.max_blocks; }
  bool submit(const resident::Submit& m) override { return host_submits().try_push(m); }
  bool grant_block(int32_t b) override { return host_blocks().try_push(b); }
  size_t drain(std::vector<resident::Completion>& out, std::chrono::microseconds wait) override {
    const size_t first = out.size();
    devloop::OutRing<resident::Completion> r(done_.slots.data(), 1u << 14, &done_.enq, &done_.deq);
    const auto end = std::chrono::steady_clock::now() + wait;
    resident::Completion c;
    do {
      while (r.try_pop(c)) out.push_back(c);
      if (out.size() > first) break;
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    } while (std::chrono::steady_clock::now() < end);
    return out.size() - first;
  }
  int64_t now_ns() const override {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  void run_on_loop(const std::function<void()>& fn) override {
    std::lock_guard<std::mutex> lk(mu_);
    fn();
  }
  bool greedy_only() const override { return !sampling_; }
  bool bans_tokens() const override { return false; }
  Status error() const override {
    std::lock_guard<std::mutex> lk(mu_);
    return err_;
  }
  // As loop_runner.cu's: the mapped counter phase_take and phase_report write.
  int64_t steps() const override { return static_cast<int64_t>(__atomic_load_n(&ctl_.steps, __ATOMIC_ACQUIRE)); }
  // Steps whose tokens were published while the mapped counter did not yet count them.
  int steps_lagging() const { return steps_lagging_.load(); }
  int padding_errors() const { return padding_errors_.load(); }
  int64_t padded_rows() const { return padded_rows_.load(); }

 private:
  devloop::InRing<resident::Submit> host_submits() {
    return devloop::InRing<resident::Submit>(submits_.slots.data(), 256, &submits_.enq, &submits_.deq);
  }
  devloop::InRing<int32_t> host_blocks() {
    return devloop::InRing<int32_t>(blocks_.slots.data(), 512, &blocks_.enq, &blocks_.deq);
  }

  void run() {
    devloop::Shared sh{};
    for (;;) {
      std::lock_guard<std::mutex> lk(mu_);
      const size_t published = done_.enq;
      devloop::phase_take(a_, sh);
      if (done_.enq != published && ctl_.steps < static_cast<uint64_t>(ds_.st.steps)) ++steps_lagging_;
      devloop::phase_copy_prompts(a_, sh, 0, 1);
      devloop::phase_plan(a_, sh, now_ns());
      devloop::phase_inputs(a_, sh, 0, 1);
      devloop::phase_report(a_);
      if (!sh.go) return;
      if (sh.n > 0) {
        if (Status st = graph(1 << sh.lg); !st.ok()) {
          err_ = st;
          return;
        }
      } else if (!devloop::idle_wake(a_)) {
        mu_.unlock();
        std::this_thread::sleep_for(std::chrono::microseconds(50));
        mu_.lock();
      }
    }
  }

  // The decode graph's stand-in: the bucket's T rows as the graph reads them.
  Status graph(int T) {
    batch_.clear();
    const int n = ds_.n;
    for (int i = n; i < T; ++i) {  // padding: the spare slot at position 0, nothing else
      ++padded_rows_;
      if (token_slot_[i] != spare_slot_ || positions_[i] != 0 || ctx_[i] != 1 || tokens_[i] != 0) ++padding_errors_;
    }
    int prev = -1;
    for (int i = 0; i < n; ++i) {
      const int slot = token_slot_[static_cast<size_t>(i)];
      if (ctx_[static_cast<size_t>(i)] != positions_[static_cast<size_t>(i)] + 1) return make_error("ctx != position + 1");
      if (slot != prev) {
        batch_.seq_slot.push_back(slot);
        prev = slot;
      }
      batch_.tokens.push_back(tokens_[static_cast<size_t>(i)]);
      batch_.positions.push_back(positions_[static_cast<size_t>(i)]);
      batch_.seq_index.push_back(static_cast<int32_t>(batch_.seq_slot.size()) - 1);
    }
    // Each slot's table as the backend's rows hold it, up to the blocks its rows reach.
    for (size_t s = 0; s < batch_.seq_slot.size(); ++s) {
      int top = 0;
      for (int i = 0; i < n; ++i)
        if (batch_.seq_index[static_cast<size_t>(i)] == static_cast<int>(s)) top = std::max(top, positions_[static_cast<size_t>(i)]);
      const int nb = top / geo_.block_size + 1;
      const int32_t* row = be_tables_.data() + static_cast<size_t>(batch_.seq_slot[s]) * be_max_blocks_;
      // The loop stays in its share of the backend's slots and blocks.
      if (batch_.seq_slot[s] < share_.first_slot || batch_.seq_slot[s] >= share_.first_slot + geo_.max_slots)
        return make_error("a row outside the loop's slots");
      for (int k = 0; k < nb; ++k)
        if (row[k] < share_.first_block || row[k] >= share_.first_block + share_.blocks)
          return make_error("a block outside the loop's share: " + std::to_string(row[k]));
      batch_.edit_table(batch_.seq_slot[s], 0, std::span<const int32_t>(row, static_cast<size_t>(nb)));
    }
    for (int j = 0; j < ds_.n_sample; ++j) {
      backend::SampleRow r;
      r.token = rows_[static_cast<size_t>(j)];
      r.params = &greedy_;
      if (sampling_) {  // what the device sampler would read for row j
        const devloop::RowParams& q = row_params_[static_cast<size_t>(j)];
        if (q.counter % 2 != 0) return make_error("an odd draw counter");
        backend::SamplingParams& p = row_sampling_[static_cast<size_t>(j)];
        p = backend::SamplingParams{};
        p.temperature = q.temperature, p.top_k = q.top_k, p.top_p = q.top_p, p.min_p = q.min_p, p.seed = q.seed;
        r.params = &p;
        r.n = q.counter / 2;
      }
      batch_.sample_rows.push_back(r);
    }
    if (sampling_)  // padding rows of the bucket's sample rows are greedy
      for (int j = ds_.n_sample; j < std::min(T, a_.r_cap); ++j)
        if (row_params_[static_cast<size_t>(j)].temperature != 0.0f) return make_error("a padding row that samples");
    SS_TRY(be_.step(batch_, out_));
    for (int j = 0; j < ds_.n_sample; ++j) ids_[static_cast<size_t>(j)] = out_.tokens[static_cast<size_t>(j)];
    return {};
  }

  backend::Backend& be_;
  resident::Geometry geo_;
  LoopShare share_;
  HostRing<resident::Submit> submits_;
  HostRing<int32_t> blocks_;
  HostRing<resident::Completion> done_;
  devloop::Control ctl_{};
  devloop::DevState ds_{};
  devloop::Args a_{};
  std::vector<int32_t> host_prompts_, dev_prompts_, host_tables_, dev_tables_, synced_;
  std::vector<resident::Slot> slots_;
  std::vector<int32_t> row_tokens_, row_pos_, row_slots_, tokens_, positions_, token_slot_, ctx_, rows_, ids_, be_tables_;
  std::vector<uint8_t> row_sample_;
  int be_max_blocks_ = 0, spare_slot_ = 0;
  backend::SamplingParams greedy_;
  bool sampling_ = false;
  std::vector<devloop::RowParams> row_params_;
  std::vector<backend::SamplingParams> row_sampling_;
  backend::StepBatch batch_;
  backend::StepOutput out_;
  std::atomic<int> padding_errors_{0};
  std::atomic<int> steps_lagging_{0};
  std::atomic<int64_t> padded_rows_{0};
  mutable std::mutex mu_;
  Status err_;
  std::thread thread_;
};

std::vector<int32_t> greedy_alone(const Spec& s) {
  std::vector<int32_t> tokens = s.prompt, out;
  while (static_cast<int>(out.size()) < s.max_tokens) {
    const std::vector<float> l = reference_logits(tokens, static_cast<int>(tokens.size()) - 1, kVocab);
    const int32_t t = static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
    out.push_back(t);
    tokens.push_back(t);
    if (std::find(s.stop_ids.begin(), s.stop_ids.end(), t) != s.stop_ids.end()) break;
  }
  return out;
}

resident::Geometry geometry(int slots, int rows, int max_len, int block_size) {
  resident::Geometry g;
  g.max_slots = slots, g.max_rows = rows, g.max_len = max_len, g.block_size = block_size;
  g.max_blocks = (max_len + block_size - 1) / block_size;
  g.vocab = kVocab;
  return g;
}

}  // namespace

TEST(DeviceLoopPhases, GreedyTokensMatchTheModelAloneWithAnOffsetShare) {
  std::mt19937 g(21);
  // The loop owns slots [3, 9) and blocks [11, 11 + 120) of the backend's; rows budget 20 (buckets
  // of 1..32 with padding, prompts chunked beside the decodes).
  FakeBackend be(11 + 120 + 4, 16, kVocab, 16);
  const LoopShare share{11, 120, 3, 6};
  auto runner = std::make_unique<PhaseRunner>(be, geometry(6, 20, 256, 16), share, 32);
  PhaseRunner* pr = runner.get();
  auto e = Engine::create(std::make_unique<ResidentExecutor>(std::move(runner)));
  ASSERT_TRUE(e.ok());
  Collector c;
  std::vector<Spec> specs;
  std::vector<RequestId> ids;
  for (int i = 0; i < 16; ++i) {
    Spec s = spec(random_tokens(g, 1 + static_cast<int>(g() % 70), kVocab), 1 + static_cast<int>(g() % 40), 0.0f, 5);
    if (i % 3 == 1) s.stop_ids = {static_cast<int32_t>(g() % kVocab), greedy_alone(s)[std::min<size_t>(3, greedy_alone(s).size() - 1)]};
    specs.push_back(s);
    auto id = (*e)->add_request(make_request(s, &c));
    ASSERT_TRUE(id.ok()) << id.message();
    ids.push_back(*id);
  }
  run_all(**e);
  for (size_t i = 0; i < specs.size(); ++i) {
    const Outcome& o = c.out[ids[i]];
    EXPECT_EQ(o.tokens, greedy_alone(specs[i])) << "request " << i;
    EXPECT_EQ(o.events_after_finish, 0);
  }
  EXPECT_EQ((*e)->stats().kv_blocks_used, 0);
  EXPECT_GT(pr->padded_rows(), 0);
  EXPECT_EQ(pr->padding_errors(), 0);
  // Each step is in the mapped step counter before its tokens are published (the steps metric and
  // the watchdog never lag the tokens a client has).
  EXPECT_EQ(pr->steps_lagging(), 0);
  EXPECT_GT((*e)->stats().steps, 0);
}

// A cached prefix: the host writes the shared blocks into the slot's mapped table row before the
// Admit, the scheduler copies them into its table (and the backend's, with the block-id offset);
// the paging-checking backend reads the shared cells.
TEST(DeviceLoopPhases, SharedPrefixBlocksReachTheBackendsTable) {
  std::mt19937 g(33);
  FakeBackend be(7 + 80 + 2, 8, kVocab, 12);
  auto ex = std::make_unique<ResidentExecutor>(
      std::make_unique<PhaseRunner>(be, geometry(4, 16, 128, 8), LoopShare{7, 80, 2, 4}, 16), nullptr, true);
  auto e = Engine::create(std::move(ex));
  ASSERT_TRUE(e.ok());
  Collector c;
  const std::vector<int32_t> base = random_tokens(g, 45, kVocab);
  std::vector<Spec> specs;
  std::vector<RequestId> ids;
  for (int round = 0; round < 3; ++round) {
    // Fillers first, so the prefix's next user sits in another slot than the one that cached it.
    for (int f = 0; f < round; ++f) {
      specs.push_back(spec(random_tokens(g, 12, kVocab), 20, 0.0f));
      auto id = (*e)->add_request(make_request(specs.back(), &c));
      ASSERT_TRUE(id.ok());
      ids.push_back(*id);
    }
    std::vector<int32_t> p = base;
    for (int i = 0; i < round * 5; ++i) p.push_back(static_cast<int32_t>(g() % kVocab));
    specs.push_back(spec(p, 6 + round, 0.0f));
    auto id = (*e)->add_request(make_request(specs.back(), &c));
    ASSERT_TRUE(id.ok());
    ids.push_back(*id);
    run_all(**e);
  }
  for (size_t i = 0; i < specs.size(); ++i) EXPECT_EQ(c.out[ids[i]].tokens, greedy_alone(specs[i])) << "request " << i;
  EXPECT_EQ((*e)->stats().prefix_hit_tokens, 40 + 40);  // 5 blocks of 8 of the 45-token base, twice
  EXPECT_EQ((*e)->stats().kv_blocks_used, 0);
}

TEST(DeviceLoopPhases, StopDeliversNothingAfterItAndEveryBlockComesBack) {
  std::mt19937 g(8);
  FakeBackend be(64 + 2, 8, kVocab, 8);
  be.on_batch = [](const backend::StepBatch&) { std::this_thread::sleep_for(std::chrono::microseconds(200)); };
  auto ex = std::make_unique<ResidentExecutor>(
      std::make_unique<PhaseRunner>(be, geometry(5, 16, 96, 8), LoopShare{2, 64, 1, 5}, 16));
  ResidentExecutor* rex = ex.get();
  std::map<backend::SeqId, std::vector<backend::SeqEvent>> events;
  std::map<backend::SeqId, bool> stopped;
  std::map<backend::SeqId, Spec> specs;
  backend::SeqId next = 1;
  std::vector<backend::SeqEvent> out;
  for (int round = 0; round < 300 || rex->has_work(); ++round) {
    ASSERT_LT(round, 40000) << "not done";
    if (round < 300 && g() % 3 == 0) {
      backend::SeqStart s;
      s.id = next++;
      const Spec sp = spec(random_tokens(g, 1 + static_cast<int>(g() % 30), kVocab), 1 + static_cast<int>(g() % 30), 0.0f, 1);
      s.prompt = sp.prompt;
      s.max_tokens = sp.max_tokens;
      s.sampling.temperature = 0.0f;
      ASSERT_TRUE(rex->check(s).ok()) << rex->check(s).message();
      specs[s.id] = sp;
      rex->start(std::move(s));
    }
    if (round < 300 && g() % 5 == 0 && next > 1) {
      const backend::SeqId victim = 1 + g() % (next - 1);
      if (!stopped[victim] && (events[victim].empty() || events[victim].back().finish == FinishReason::None)) {
        stopped[victim] = true;
        rex->stop(victim, FinishReason::Abort);
      }
    }
    out.clear();
    ASSERT_TRUE(rex->poll(out).ok());
    ASSERT_TRUE(rex->check_invariants().ok());
    for (auto& ev : out) {
      auto& v = events[ev.id];
      ASSERT_TRUE(v.empty() || v.back().finish == FinishReason::None) << "event after the end of " << ev.id;
      if (stopped[ev.id]) {
        ASSERT_EQ(ev.token, -1) << "a token after stop() for " << ev.id;
      }
      v.push_back(ev);
    }
  }
  for (backend::SeqId id = 1; id < next; ++id) {
    const auto& v = events[id];
    ASSERT_FALSE(v.empty()) << id;
    ASSERT_NE(v.back().finish, FinishReason::None) << id;
    if (stopped[id]) {
      EXPECT_EQ(v.back().finish, FinishReason::Abort) << id;
      continue;
    }
    std::vector<int32_t> toks;
    for (const auto& ev : v)
      if (ev.token >= 0) toks.push_back(ev.token);
    EXPECT_EQ(toks, greedy_alone(specs[id])) << id;
  }
  EXPECT_EQ(rex->stats().kv_blocks_used, 0);
}

// Sequences the device cannot sample go elsewhere: check() turns them away with a reason.
TEST(DeviceLoopPhases, GreedyOnlyRunnerTurnsOtherSamplingAway) {
  FakeBackend be(40, 8, kVocab, 8);
  ResidentExecutor ex(std::make_unique<PhaseRunner>(be, geometry(4, 8, 64, 8), LoopShare{0, 32, 0, 4}, 8));
  backend::SeqStart s;
  s.prompt = {1, 2, 3};
  s.max_tokens = 4;
  s.sampling.temperature = 0.0f;
  EXPECT_TRUE(ex.check(s).ok()) << ex.check(s).message();
  s.sampling.temperature = 0.7f;
  EXPECT_FALSE(ex.check(s).ok());
  s.sampling.temperature = 0.0f;
  s.min_tokens = 2;
  s.stop_ids = {5};
  EXPECT_FALSE(ex.check(s).ok());
}

// With sampling: the scheduler writes each sample row's parameters and draw counter where the
// device sampler reads them; drawn with those, sampled sequences (temperatures, top-k, top-p,
// min-p, seeds), sharing steps with greedy ones and chunked prefills, get the tokens the host
// executor gives each of them alone (the same counter-based draws: a token's counter is 2 x the
// output tokens before it).
TEST(DeviceLoopPhases, SampledTokensEqualTheHostExecutorsAlone) {
  std::mt19937 g(77);
  FakeBackend be(5 + 100 + 4, 16, kVocab, 16);
  auto runner = std::make_unique<PhaseRunner>(be, geometry(6, 20, 256, 16), LoopShare{5, 100, 2, 6}, 32, true);
  auto e = Engine::create(std::make_unique<ResidentExecutor>(std::move(runner)));
  ASSERT_TRUE(e.ok());
  Collector c;
  std::vector<Spec> specs;
  std::vector<RequestId> ids;
  for (int i = 0; i < 12; ++i) {  // greedy, temperature, top-k, top-p + min-p
    Spec s = spec(random_tokens(g, 1 + static_cast<int>(g() % 50), kVocab), 1 + static_cast<int>(g() % 30),
                  i % 4 == 0 ? 0.0f : 0.5f + 0.25f * static_cast<float>(i % 3), 1000 + static_cast<uint64_t>(i));
    if (i % 4 == 2) s.top_k = 5;
    if (i % 4 == 3) s.top_p = 0.8f, s.min_p = 0.05f;
    specs.push_back(s);
    Request r = make_request(s, &c);
    auto id = (*e)->add_request(std::move(r));
    ASSERT_TRUE(id.ok()) << id.message();
    ids.push_back(*id);
  }
  run_all(**e);
  int sampled_differs_from_greedy = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    // The reference: the request alone on a host executor, the same sampling.
    const Outcome alone = run_alone(specs[i], kVocab);
    EXPECT_EQ(c.out[ids[i]].tokens, alone.tokens) << "request " << i << " T=" << specs[i].temperature;
    if (specs[i].temperature > 0.0f && c.out[ids[i]].tokens != greedy_alone(specs[i])) ++sampled_differs_from_greedy;
  }
  EXPECT_GT(sampled_differs_from_greedy, 3) << "the draws were not random: the test would not see a wrong counter";
  EXPECT_EQ((*e)->stats().kv_blocks_used, 0);
}
