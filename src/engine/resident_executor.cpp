#include "engine/resident_executor.h"

#include "engine/host_executor.h"
#include "engine/kv_cache_manager.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <thread>

namespace ss::engine {

using backend::FinishReason;
using backend::SeqEvent;
using backend::SeqId;
using backend::SeqStart;
using backend::Clock;

namespace {

// The transport of the host runner: a mutex and a queue each way. (The GPU runner's are the mapped
// rings of backend/cuda/queues; the protocol over them is the same.)
template <class T>
class Channel {
 public:
  explicit Channel(size_t capacity) : cap_(capacity) {}
  bool push(const T& v) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (q_.size() >= cap_) return false;
      q_.push_back(v);
    }
    cv_.notify_one();
    return true;
  }
  bool pop(T& out) {
    std::lock_guard<std::mutex> lk(mu_);
    if (q_.empty()) return false;
    out = q_.front();
    q_.pop_front();
    return true;
  }
  // Everything queued, waiting up to `wait` for the first item.
  size_t drain(std::vector<T>& out, std::chrono::microseconds wait) {
    std::unique_lock<std::mutex> lk(mu_);
    if (q_.empty() && wait.count() > 0) cv_.wait_for(lk, wait, [&] { return !q_.empty(); });
    const size_t n = q_.size();
    out.insert(out.end(), q_.begin(), q_.end());
    q_.clear();
    return n;
  }
  void notify() { cv_.notify_all(); }
  template <class Pred>
  void wait_for(std::chrono::microseconds d, Pred p) {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait_for(lk, d, [&] { return !q_.empty() || p(); });
  }

 private:
  size_t cap_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<T> q_;
};

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

class HostLoopRunner final : public LoopRunner {
 public:
  HostLoopRunner(backend::Backend& be, const resident::Geometry& g, LoopShare share)
      : be_(be),
        geo_(g),
        share_(share),
        slots_(static_cast<size_t>(g.max_slots)),
        tables_(static_cast<size_t>(g.max_slots) * g.max_blocks, -1),
        prompts_(static_cast<size_t>(g.max_slots) * g.max_len, 0),
        params_(static_cast<size_t>(g.max_slots)),
        submits_(1024),
        blocks_(static_cast<size_t>(share.blocks) + 1),
        completions_(1u << 20),
        rows_tokens_(static_cast<size_t>(g.max_rows)),
        rows_pos_(static_cast<size_t>(g.max_rows)),
        rows_slots_(static_cast<size_t>(g.max_rows)),
        rows_sample_(static_cast<size_t>(g.max_rows)) {
    sent_.assign(static_cast<size_t>(g.max_slots), 0);
    st_.geo = geo_;
    st_.slots = slots_.data();
    st_.tables = tables_.data();
    st_.prompts = prompts_.data();
    thread_ = std::thread([this] { run(); });
  }
  ~HostLoopRunner() override {
    quit_.store(true, std::memory_order_release);
    submits_.notify();
    thread_.join();
  }

  std::string name() const override { return "host loop, " + be_.name(); }
  const resident::Geometry& geometry() const override { return geo_; }
  int num_blocks() const override { return share_.blocks; }
  int32_t* prompt_row(int slot) override { return prompts_.data() + static_cast<size_t>(slot) * geo_.max_len; }
  const int32_t* table_row(int slot) const override { return tables_.data() + static_cast<size_t>(slot) * geo_.max_blocks; }
  int32_t* admit_table_row(int slot) override { return tables_.data() + static_cast<size_t>(slot) * geo_.max_blocks; }
  bool submit(const resident::Submit& m) override { return submits_.push(m); }
  bool grant_block(int32_t b) override {
    if (!blocks_.push(b)) return false;
    submits_.notify();  // a loop waiting for a block
    return true;
  }
  size_t drain(std::vector<resident::Completion>& out, std::chrono::microseconds wait) override {
    return completions_.drain(out, wait);
  }
  int64_t now_ns() const override { return steady_ns(); }
  void run_on_loop(const std::function<void()>& fn) override {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    {
      std::lock_guard<std::mutex> lk(foreign_mu_);
      foreign_.push_back([&] {
        fn();
        std::lock_guard<std::mutex> lk2(mu);
        done = true;
        cv.notify_one();
      });
    }
    submits_.notify();
    std::unique_lock<std::mutex> lk(mu);
    cv.wait(lk, [&] { return done; });
  }
  Status error() const override {
    std::lock_guard<std::mutex> lk(err_mu_);
    return err_;
  }
  int64_t steps() const override { return steps_.load(std::memory_order_relaxed); }

 private:
  void emit(const resident::Completion& c) {
    while (!completions_.push(c)) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }

  // The resident loop: messages at the step boundary, plan, forward + sample, commit; idle: wait
  // for a message (the GPU loop sleeps with __nanosleep instead).
  void run() {
    resident::StepRows r{rows_tokens_.data(), rows_pos_.data(), rows_slots_.data(), rows_sample_.data(), 0, 0};
    backend::StepBatch batch;
    backend::StepOutput out;
    auto emit_fn = [this](const resident::Completion& c) { emit(c); };
    auto take = [this](int32_t* b) { return blocks_.pop(*b); };
    while (!quit_.load(std::memory_order_acquire)) {
      run_foreign();
      resident::Submit m;
      while (submits_.pop(m)) {
        if (m.kind == resident::MsgKind::Admit && m.slot >= 0 && m.slot < geo_.max_slots) {
          // The host mirror of the slot's sampling parameters (a Backend samples from these).
          sent_[static_cast<size_t>(m.slot)] = 0;  // a new sequence: its table is sent whole once
          backend::SamplingParams& p = params_[static_cast<size_t>(m.slot)];
          p = backend::SamplingParams{};
          p.temperature = m.sampling.temperature;
          p.top_k = m.sampling.top_k;
          p.top_p = m.sampling.top_p;
          p.min_p = m.sampling.min_p;
          p.seed = m.sampling.seed;
        }
        resident::apply(st_, m, emit_fn);
      }
      resident::plan(st_, r, now_ns(), take, emit_fn);
      if (r.n == 0) {
        idle_wait();
        continue;
      }
      Status s = forward(r, batch, out);
      if (!s.ok()) {
        {
          std::lock_guard<std::mutex> lk(err_mu_);
          err_ = s;
        }
        // Every live sequence ends with the error; the loop stops taking work (but still runs the
        // host executor's steps, which report their own errors).
        for (int32_t i = 0; i < geo_.max_slots; ++i) {
          resident::Slot& sl = slots_[static_cast<size_t>(i)];
          if (!sl.live) continue;
          sl.live = 0;
          emit(resident::Completion{sl.id, -1, i, sl.n_blocks, sl.len, resident::Finish::Rejected});
        }
        while (!quit_.load(std::memory_order_acquire)) {
          run_foreign();
          idle_wait();
        }
        return;
      }
      // The step is counted before its tokens are published: whoever sees a token also sees the
      // forward pass that made it in steps() (the watchdog's progress and the stats never lag).
      steps_.store(st_.steps + 1, std::memory_order_relaxed);
      resident::commit(st_, r, out.tokens.data(), emit_fn);
    }
  }

  // Nothing to run: until a message, a granted block, a host executor's step or quit (at most 2 ms).
  void idle_wait() {
    submits_.wait_for(std::chrono::microseconds(2000), [this] {
      std::lock_guard<std::mutex> lk(foreign_mu_);
      return quit_.load(std::memory_order_acquire) || !foreign_.empty();
    });
  }

  void run_foreign() {
    std::vector<std::function<void()>> tasks;
    {
      std::lock_guard<std::mutex> lk(foreign_mu_);
      tasks.swap(foreign_);
    }
    for (auto& t : tasks) t();
  }

  // One step through the Backend interface: rows grouped per slot (contiguous already), each
  // slot's whole table row sent as an edit, slots and blocks moved to the loop's share of the
  // backend's (a GPU runner's tables live on the device instead).
  Status forward(const resident::StepRows& r, backend::StepBatch& b, backend::StepOutput& out) {
    b.clear();
    int32_t prev_slot = -1;
    for (int32_t k = 0; k < r.n; ++k) {
      const int32_t slot = r.slots[k];
      if (slot != prev_slot) {
        b.seq_slot.push_back(share_.first_slot + slot);
        const resident::Slot& s = slots_[static_cast<size_t>(slot)];
        int32_t& sent = sent_[static_cast<size_t>(slot)];
        if (sent < s.n_blocks) {  // only the blocks the backend's table lacks
          row_.assign(table_row(slot) + sent, table_row(slot) + s.n_blocks);
          for (int32_t& x : row_) x += share_.first_block;
          b.edit_table(share_.first_slot + slot, sent, row_);
          sent = s.n_blocks;
        }
        prev_slot = slot;
      }
      b.tokens.push_back(r.tokens[k]);
      b.positions.push_back(r.positions[k]);
      b.seq_index.push_back(static_cast<int32_t>(b.seq_slot.size()) - 1);
      if (r.sample[k]) {
        const resident::Slot& s = slots_[static_cast<size_t>(slot)];
        backend::SampleRow row;
        row.token = k;
        row.params = &params_[static_cast<size_t>(slot)];
        row.n = static_cast<uint64_t>(s.n_output);
        if (resident::stop_ids_banned(s)) row.banned = std::span<const int32_t>(s.stop_ids, static_cast<size_t>(s.n_stop));
        b.sample_rows.push_back(row);
      }
    }
    return be_.step(b, out);
  }

  backend::Backend& be_;
  resident::Geometry geo_;
  LoopShare share_;
  std::vector<int32_t> row_;
  std::vector<int32_t> sent_;  // per slot: table entries the backend already has
  std::mutex foreign_mu_;
  std::vector<std::function<void()>> foreign_;
  std::vector<resident::Slot> slots_;
  std::vector<int32_t> tables_;
  std::vector<int32_t> prompts_;
  std::vector<backend::SamplingParams> params_;
  resident::State st_;
  Channel<resident::Submit> submits_;
  Channel<int32_t> blocks_;
  Channel<resident::Completion> completions_;
  std::vector<int32_t> rows_tokens_, rows_pos_, rows_slots_;
  std::vector<uint8_t> rows_sample_;
  std::atomic<bool> quit_{false};
  std::atomic<int64_t> steps_{0};
  mutable std::mutex err_mu_;
  Status err_;
  std::thread thread_;
};

FinishReason to_reason(resident::Finish f) {
  switch (f) {
    case resident::Finish::None: return FinishReason::None;
    case resident::Finish::Length: return FinishReason::Length;
    case resident::Finish::Stop: return FinishReason::Stop;
    case resident::Finish::Abort: return FinishReason::Abort;
    case resident::Finish::Timeout: return FinishReason::Timeout;
    case resident::Finish::Rejected: break;
  }
  return FinishReason::Error;
}

resident::Finish to_finish(FinishReason r) {
  switch (r) {
    case FinishReason::Timeout: return resident::Finish::Timeout;
    case FinishReason::Stop: return resident::Finish::Stop;
    case FinishReason::Length: return resident::Finish::Length;
    default: return resident::Finish::Abort;
  }
}

}  // namespace

namespace {
resident::Geometry loop_geometry(const backend::Backend& be, int max_slots, int max_rows, int max_len, LoopShare share) {
  resident::Geometry g;
  g.block_size = be.kv_config().block_size;
  g.max_slots = std::min(max_slots, share.slots);
  g.max_len = max_len;
  g.max_blocks = (max_len + g.block_size - 1) / g.block_size;
  g.max_rows = max_rows;
  g.vocab = be.vocab_size();
  return g;
}
}  // namespace

std::unique_ptr<LoopRunner> make_host_loop_runner(backend::Backend& be, int max_slots, int max_rows, int max_len,
                                                  LoopShare share) {
  if (share.blocks <= 0) share = LoopShare{0, be.kv_config().num_blocks, 0, be.max_slots()};
  return std::make_unique<HostLoopRunner>(be, loop_geometry(be, max_slots, max_rows, max_len, share), share);
}

Expected<std::unique_ptr<LoopRunner>> make_loop_runner(backend::Backend& be, int max_slots, int max_rows, int max_len,
                                                       LoopShare share, bool host_only) {
  if (share.blocks <= 0) share = LoopShare{0, be.kv_config().num_blocks, 0, be.max_slots()};
  if (!host_only) {
    auto dev = be.make_loop_runner(loop_geometry(be, max_slots, max_rows, max_len, share), share);
    if (dev.ok() && *dev) return std::move(dev).value();
    // As a graph capture that fails falls back to eager steps: the same loop, on a host thread.
    if (!dev.ok())
      std::fprintf(stderr, "selfserve: the %s backend's own loop is unavailable (%s); the resident loop runs on a host thread\n",
                   be.name().c_str(), dev.message().c_str());
  }
  return make_host_loop_runner(be, max_slots, max_rows, max_len, share);
}

ResidentExecutor::ResidentExecutor(std::unique_ptr<LoopRunner> runner, std::function<Clock::time_point()> clock,
                                   bool prefix_caching)
    : runner_(std::move(runner)),
      clock_(clock ? std::move(clock) : std::function<Clock::time_point()>([] { return Clock::now(); })),
      slot_used_(static_cast<size_t>(runner_->geometry().max_slots), 0) {
  const int n = runner_->num_blocks();
  free_blocks_.reserve(static_cast<size_t>(n));
  for (int b = n - 1; b >= 0; --b) free_blocks_.push_back(b);
  stats_.kv_blocks_total = n;
  prefix_caching_ = prefix_caching;
  grant_blocks();
}

void ResidentExecutor::unref_cached(int32_t block) {
  Cached& c = cached_.at(block);
  if (--c.refs == 0) {
    --pinned_;
    c.lru = lru_.insert(lru_.end(), block);
  }
}

bool ResidentExecutor::evict_one() {
  if (lru_.empty()) return false;
  const int32_t b = lru_.front();
  lru_.pop_front();
  by_hash_.erase(cached_.at(b).hash);
  cached_.erase(b);
  free_blocks_.push_back(b);
  return true;
}

// A finished sequence's blocks: the shared prefix unreferenced; its own full blocks (their K/V
// computed: len tokens) into the cache when no block holds that prefix yet; the rest freed.
void ResidentExecutor::release_blocks(Live& lv, const int32_t* row, int n_blocks, int len) {
  const int bs = runner_->geometry().block_size;
  uint64_t h = lv.root;
  for (int i = 0; i < n_blocks; ++i) {
    const int32_t b = row[i];
    const bool full = (i + 1) * bs <= len && static_cast<int>(lv.tokens.size()) >= (i + 1) * bs;
    if (prefix_caching_ && full)
      h = hash_block(h, std::span<const int32_t>(lv.tokens.data() + static_cast<size_t>(i) * bs, static_cast<size_t>(bs)));
    if (i < lv.shared) {
      unref_cached(lv.shared_blocks[static_cast<size_t>(i)]);
    } else if (prefix_caching_ && full && !by_hash_.count(h)) {
      by_hash_[h] = b;
      Cached& c = cached_[b];
      c.hash = h;
      c.refs = 0;
      c.lru = lru_.insert(lru_.end(), b);
    } else {
      free_blocks_.push_back(b);
    }
  }
}

ResidentExecutor::~ResidentExecutor() = default;

int ResidentExecutor::blocks_needed(const SeqStart& s) const {
  const resident::Geometry& g = runner_->geometry();
  const int64_t most = std::min<int64_t>(static_cast<int64_t>(s.prompt.size()) + s.max_tokens, g.max_len);
  return static_cast<int>((most + g.block_size - 1) / g.block_size);
}

Status ResidentExecutor::check(const SeqStart& s) const {
  const resident::Geometry& g = runner_->geometry();
  const auto unsupported = [](const char* what) {
    return make_error(std::string("the resident loop does not run ") + what +
                      " yet; serve this request with --scheduling host");
  };
  if (s.prompt.empty()) return make_error("empty prompt");
  if (static_cast<int64_t>(s.prompt.size()) >= g.max_len)
    return make_error("prompt of " + std::to_string(s.prompt.size()) + " tokens leaves no room in the context of " +
                      std::to_string(g.max_len));
  if (s.max_tokens < 1) return make_error("max_tokens must be at least 1");
  if (s.min_tokens < 0 || s.min_tokens > s.max_tokens) return make_error("min_tokens must be in [0, max_tokens]");
  if (static_cast<int>(s.stop_ids.size()) > resident::kMaxStopIds)
    return make_error("at most " + std::to_string(resident::kMaxStopIds) + " stop ids");
  for (int32_t t : s.stop_ids)
    if (t < 0 || t >= g.vocab) return make_error("stop id " + std::to_string(t) + " outside the vocabulary");
  for (int32_t t : s.prompt)
    if (t < 0 || t >= g.vocab) return make_error("prompt token " + std::to_string(t) + " outside the vocabulary");
  if (Status st = s.sampling.validate(); !st.ok()) return st;
  const auto& p = s.sampling;
  if (p.repetition_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f)
    return unsupported("penalties");
  if (!p.logit_bias.empty()) return unsupported("logit_bias");
  if (s.constraint) return unsupported("structured output");
  if (s.logprobs >= 0 || s.prompt_logprobs >= 0) return unsupported("logprobs");
  if (s.cached_prefix > 0 || !s.reserved_blocks.empty()) return unsupported("restored prefixes");
  if (runner_->greedy_only() && !p.greedy()) return unsupported("sampling beyond greedy on the device");
  if (!runner_->bans_tokens() && s.min_tokens > 0 && !s.stop_ids.empty())
    return unsupported("min_tokens with stop ids on the device");
  if (blocks_needed(s) > runner_->num_blocks())
    return make_error("the request needs " + std::to_string(blocks_needed(s)) + " KV blocks, the cache has " +
                      std::to_string(runner_->num_blocks()));
  return {};
}

void ResidentExecutor::start(SeqStart s) { waiting_.push_back(std::move(s)); }

void ResidentExecutor::finish_waiting(SeqId id, FinishReason why, std::vector<SeqEvent>& out) {
  SeqEvent ev;
  ev.id = id;
  ev.finish = why;
  out.push_back(std::move(ev));
  ++stats_.finished_requests;
}

void ResidentExecutor::stop(SeqId id, FinishReason why) {
  for (auto it = waiting_.begin(); it != waiting_.end(); ++it) {
    if (it->id != id) continue;
    waiting_.erase(it);
    finish_waiting(id, why, pending_);
    return;
  }
  auto it = live_.find(id);
  if (it == live_.end() || it->second.cancel != FinishReason::None) return;
  it->second.cancel = why;
  resident::Submit m;
  m.kind = resident::MsgKind::Cancel;
  m.slot = it->second.slot;
  m.id = id;
  m.reason = to_finish(why);
  while (!runner_->submit(m)) std::this_thread::sleep_for(std::chrono::microseconds(50));
}

void ResidentExecutor::grant_blocks() {
  while (!free_blocks_.empty() && runner_->grant_block(free_blocks_.back())) free_blocks_.pop_back();
}

void ResidentExecutor::admit_waiting() {
  while (!waiting_.empty()) {
    SeqStart& s = waiting_.front();
    const int need = blocks_needed(s);
    const auto free_slot = std::find(slot_used_.begin(), slot_used_.end(), 0);
    if (free_slot == slot_used_.end()) return;
    const int slot = static_cast<int>(free_slot - slot_used_.begin());
    // The longest cached run of the prompt's full blocks, the block of its last token excepted
    // (that token's logits are needed); shared blocks are pinned, then the least recently used
    // unreferenced ones make room for the new blocks, or the sequence waits.
    std::vector<int32_t> shared;
    const uint64_t root = salted_root(s.cache_salt);
    if (prefix_caching_) {
      const int bs = runner_->geometry().block_size;
      uint64_t h = root;
      for (int i = 0; (i + 1) * bs <= static_cast<int>(s.prompt.size()) - 1; ++i) {
        h = hash_block(h, std::span<const int32_t>(s.prompt.data() + static_cast<size_t>(i) * bs, static_cast<size_t>(bs)));
        auto it = by_hash_.find(h);
        if (it == by_hash_.end()) break;
        shared.push_back(it->second);
      }
      for (int32_t b : shared) {
        Cached& c = cached_.at(b);
        if (c.refs++ == 0) {
          lru_.erase(c.lru);
          ++pinned_;
        }
      }
    }
    const int need_new = need - static_cast<int>(shared.size());
    while (runner_->num_blocks() - static_cast<int>(cached_.size()) - reserved_ < need_new && evict_one()) {
    }
    if (runner_->num_blocks() - static_cast<int>(cached_.size()) - reserved_ < need_new) {
      for (int32_t b : shared) unref_cached(b);
      return;  // in arrival order: no overtaking
    }
    resident::Submit m;
    m.kind = resident::MsgKind::Admit;
    m.slot = slot;
    m.id = s.id;
    m.prompt_len = static_cast<int32_t>(s.prompt.size());
    m.cached_len = static_cast<int32_t>(shared.size()) * runner_->geometry().block_size;
    m.max_tokens = s.max_tokens;
    m.min_tokens = s.min_tokens;
    m.n_stop = static_cast<int32_t>(s.stop_ids.size());
    std::copy(s.stop_ids.begin(), s.stop_ids.end(), m.stop_ids);
    if (s.deadline) {
      const int64_t left = std::chrono::duration_cast<std::chrono::nanoseconds>(*s.deadline - clock_()).count();
      m.deadline_ns = std::max<int64_t>(1, runner_->now_ns() + left);
    }
    m.sampling.temperature = s.sampling.temperature;
    m.sampling.top_k = s.sampling.top_k;
    m.sampling.top_p = s.sampling.top_p;
    m.sampling.min_p = s.sampling.min_p;
    m.sampling.seed = s.sampling.seed;
    std::copy(s.prompt.begin(), s.prompt.end(), runner_->prompt_row(slot));
    std::copy(shared.begin(), shared.end(), runner_->admit_table_row(slot));
    if (!runner_->submit(m)) {  // the ring is full: next poll
      for (int32_t b : shared) unref_cached(b);
      return;
    }
    slot_used_[static_cast<size_t>(slot)] = 1;
    reserved_ += need_new;
    Live lv;
    lv.slot = slot;
    lv.reserved = need_new;
    lv.shared = static_cast<int>(shared.size());
    lv.shared_blocks = shared;
    lv.root = root;
    if (prefix_caching_) {
      lv.tokens.reserve(s.prompt.size() + static_cast<size_t>(std::max(0, s.max_tokens)));
      lv.tokens = s.prompt;
    }
    live_[s.id] = std::move(lv);
    stats_.prompt_tokens += static_cast<int64_t>(s.prompt.size());
    stats_.prefix_queried_tokens += static_cast<int64_t>(s.prompt.size());
    stats_.prefix_hit_tokens += m.cached_len;
    waiting_.pop_front();
  }
}

Status ResidentExecutor::poll(std::vector<SeqEvent>& out) {
  for (auto& e : pending_) out.push_back(std::move(e));
  pending_.clear();
  if (!waiting_.empty()) {  // a deadline passes while waiting for room too
    const Clock::time_point now = clock_();
    for (auto it = waiting_.begin(); it != waiting_.end();) {
      if (it->deadline && now >= *it->deadline) {
        finish_waiting(it->id, FinishReason::Timeout, out);
        it = waiting_.erase(it);
      } else {
        ++it;
      }
    }
  }
  admit_waiting();
  grant_blocks();
  completions_.clear();
  runner_->drain(completions_, live_.empty() ? std::chrono::microseconds(0) : poll_wait_);
  for (const resident::Completion& c : completions_) {
    auto it = live_.find(c.id);
    if (it == live_.end() || it->second.slot != c.slot) continue;  // not a live sequence's (cannot happen)
    Live& lv = it->second;
    SeqEvent ev;
    ev.id = c.id;
    ev.token = c.token;
    ev.finish = to_reason(c.finish);
    const int bs = runner_->geometry().block_size;
    lv.filled_blocks = c.len / bs;
    ev.kv_blocks_filled = lv.filled_blocks;
    if (c.token >= 0) ++stats_.generation_tokens;
    if (c.token >= 0 && prefix_caching_) lv.tokens.push_back(c.token);
    if (lv.cancel != FinishReason::None) {
      if (c.finish == resident::Finish::None) continue;  // made before the loop saw the Cancel
      ev.token = -1;
      ev.finish = lv.cancel;
    }
    if (c.finish == resident::Finish::Rejected)
      ev.error = runner_->error().ok() ? "the resident loop rejected the sequence (a bug)" : runner_->error().message();
    if (c.finish != resident::Finish::None) {
      // The slot's blocks come back; those still in the free-block ring stay the loop's. (n_blocks
      // < 0: an Admit for a slot in use was rejected; the slot is not this sequence's to free.)
      if (c.n_blocks > 0) {
        release_blocks(lv, runner_->table_row(c.slot), c.n_blocks, c.len);
      } else {  // refused before it took the slot: its shared prefix was never the loop's
        for (int32_t b : lv.shared_blocks) unref_cached(b);
      }
      if (c.n_blocks >= 0) slot_used_[static_cast<size_t>(c.slot)] = 0;
      reserved_ -= lv.reserved;
      live_.erase(it);
      ++stats_.finished_requests;
    }
    out.push_back(std::move(ev));
  }
  grant_blocks();
  admit_waiting();
  stats_.steps = runner_->steps();
  stats_.num_running = static_cast<int>(live_.size());
  stats_.num_waiting = static_cast<int>(waiting_.size());
  stats_.kv_blocks_used = reserved_ + pinned_;
  stats_.kv_blocks_cached = static_cast<int>(cached_.size());
  stats_.kv_usage = stats_.kv_blocks_total > 0 ? static_cast<double>(stats_.kv_blocks_used) / stats_.kv_blocks_total : 0.0;
  stats_.prefix_hit_rate = stats_.prefix_queried_tokens > 0
                               ? static_cast<double>(stats_.prefix_hit_tokens) / static_cast<double>(stats_.prefix_queried_tokens)
                               : 0.0;
  return runner_->error();
}

Status ResidentExecutor::check_invariants() const {
  int used = 0, reserved = 0;
  for (uint8_t u : slot_used_) used += u;
  for (const auto& [id, lv] : live_) reserved += lv.reserved;
  if (used != static_cast<int>(live_.size())) return make_error("resident: slots in use != live sequences");
  if (reserved != reserved_) return make_error("resident: reservations do not add up");
  if (reserved_ + static_cast<int>(cached_.size()) > runner_->num_blocks())
    return make_error("resident: more blocks reserved and cached than exist");
  int pinned = 0;
  for (const auto& [b, c] : cached_) pinned += c.refs > 0;
  if (pinned != pinned_ || static_cast<int>(lru_.size()) + pinned_ != static_cast<int>(cached_.size()) ||
      by_hash_.size() != cached_.size())
    return make_error("resident: prefix cache bookkeeping does not add up");
  int shared = 0;
  for (const auto& [id, lv] : live_) shared += lv.shared;
  int refs = 0;
  for (const auto& [b, c] : cached_) refs += c.refs;
  if (refs != shared) return make_error("resident: cached blocks' references != live sequences' shared blocks");
  return {};
}


namespace {

// The host executor's view of a backend shared with a resident loop: its own share of the blocks
// and slots (ids from 0, moved to the share here) and every call made on the loop's thread.
class SharedBackend final : public backend::Backend {
 public:
  SharedBackend(backend::Backend& inner, LoopRunner& loop, LoopShare share) : in_(inner), loop_(loop), share_(share) {
    kv_ = inner.kv_config();
    kv_.num_blocks = share.blocks;
  }
  std::string name() const override { return in_.name(); }
  const backend::KvCacheConfig& kv_config() const override { return kv_; }
  int vocab_size() const override { return in_.vocab_size(); }
  int max_slots() const override { return share_.slots; }
  inline static const Status kNotRun = make_error("device loop: the host step did not run (the loop could not be paused)");
  Status step(const backend::StepBatch& batch, backend::StepOutput& out) override {
    b_ = batch;
    for (int32_t& slot : b_.seq_slot) slot += share_.first_slot;
    for (backend::TableEdit& e : b_.table_edits) e.slot += share_.first_slot;
    for (int32_t& blk : b_.edit_blocks) blk += share_.first_block;
    Status st = kNotRun;  // a runner that cannot stop its loop does not run fn
    loop_.run_on_loop([&] { st = in_.step(b_, out); });
    return st;
  }
  int64_t kv_block_bytes() const override { return in_.kv_block_bytes(); }
  Status read_kv_block(int32_t block, std::span<uint8_t> out) override {
    Status st = kNotRun;
    loop_.run_on_loop([&] { st = in_.read_kv_block(block + share_.first_block, out); });
    return st;
  }
  Status write_kv_block(int32_t block, std::span<const uint8_t> in) override {
    Status st = kNotRun;
    loop_.run_on_loop([&] { st = in_.write_kv_block(block + share_.first_block, in); });
    return st;
  }
  // Batched: checked against this share (the inner backend knows only its whole pool), then one
  // batch on the loop's thread.
  Status read_kv_blocks(std::span<const backend::KvBlockOut> blocks) override {
    SS_TRY(backend::check_kv_block_copies(blocks, kv_.num_blocks, kv_block_bytes(), name()));
    out_copies_.assign(blocks.begin(), blocks.end());
    for (backend::KvBlockOut& b : out_copies_) b.block += share_.first_block;
    Status st = kNotRun;
    loop_.run_on_loop([&] { st = in_.read_kv_blocks(out_copies_); });
    return st;
  }
  Status write_kv_blocks(std::span<const backend::KvBlockIn> blocks) override {
    SS_TRY(backend::check_kv_block_copies(blocks, kv_.num_blocks, kv_block_bytes(), name()));
    in_copies_.assign(blocks.begin(), blocks.end());
    for (backend::KvBlockIn& b : in_copies_) b.block += share_.first_block;
    Status st = kNotRun;
    loop_.run_on_loop([&] { st = in_.write_kv_blocks(in_copies_); });
    return st;
  }
  // Between the loop's steps too: page-locking must not meet a running chain or a graph capture.
  void register_host_memory(void* p, size_t bytes) override {
    loop_.run_on_loop([&] { in_.register_host_memory(p, bytes); });
  }
  void unregister_host_memory(void* p) override {
    loop_.run_on_loop([&] { in_.unregister_host_memory(p); });
  }

 private:
  backend::Backend& in_;
  LoopRunner& loop_;
  LoopShare share_;
  backend::KvCacheConfig kv_;
  backend::StepBatch b_;
  std::vector<backend::KvBlockOut> out_copies_;
  std::vector<backend::KvBlockIn> in_copies_;
};

// Each sequence goes where it can run: the resident loop when it takes it, else the host executor.
class RoutingExecutor final : public backend::Executor {
 public:
  RoutingExecutor(std::unique_ptr<SharedBackend> shared, std::unique_ptr<ResidentExecutor> resident,
                  std::unique_ptr<HostExecutor> host)
      : shared_(std::move(shared)), resident_(std::move(resident)), host_(std::move(host)) {}
  ~RoutingExecutor() override {
    host_.reset();  // its last block copies still run on the loop's thread
    resident_.reset();
  }
  std::string name() const override { return "persistent (" + resident_->name() + "; the rest: " + host_->name() + ")"; }
  Status check(const SeqStart& s) const override {
    if (resident_->check(s).ok()) return {};
    return host_->check(s);
  }
  void start(SeqStart s) override {
    const bool res = resident_->check(s).ok();
    route_[s.id] = res;
    if (res) resident_->start(std::move(s));
    else host_->start(std::move(s));
  }
  void stop(SeqId id, FinishReason why) override {
    auto it = route_.find(id);
    if (it == route_.end()) return;
    if (it->second) resident_->stop(id, why);
    else host_->stop(id, why);
  }
  Status poll(std::vector<SeqEvent>& out) override {
    const size_t first = out.size();
    resident_->set_poll_wait(host_->has_work() ? std::chrono::microseconds(0) : std::chrono::microseconds(1000));
    Status st = resident_->poll(out);
    Status hs = host_->has_work() ? host_->poll(out) : Status{};
    for (size_t i = first; i < out.size(); ++i)
      if (out[i].finish != FinishReason::None) route_.erase(out[i].id);
    return st.ok() ? hs : st;
  }
  bool has_work() const override { return resident_->has_work() || host_->has_work(); }
  backend::ExecutorStats stats() const override {
    backend::ExecutorStats a = host_->stats();
    const backend::ExecutorStats r = resident_->stats();
    a.num_running += r.num_running;
    a.num_waiting += r.num_waiting;
    a.kv_blocks_total += r.kv_blocks_total;
    a.kv_blocks_used += r.kv_blocks_used;
    a.kv_usage = a.kv_blocks_total > 0 ? static_cast<double>(a.kv_blocks_used) / a.kv_blocks_total : 0.0;
    a.prompt_tokens += r.prompt_tokens;
    a.generation_tokens += r.generation_tokens;
    a.finished_requests += r.finished_requests;
    a.steps += r.steps;  // the server's watchdog: progress of either side
    a.kv_blocks_cached += r.kv_blocks_cached;
    a.prefix_queried_tokens += r.prefix_queried_tokens;
    a.prefix_hit_tokens += r.prefix_hit_tokens;
    a.prefix_hit_rate = a.prefix_queried_tokens > 0
                            ? static_cast<double>(a.prefix_hit_tokens) / static_cast<double>(a.prefix_queried_tokens)
                            : 0.0;
    return a;
  }
  Status check_invariants() const override {
    SS_TRY(resident_->check_invariants());
    return host_->check_invariants();
  }
  std::chrono::milliseconds idle_tick() const override { return host_->idle_tick(); }

 private:
  std::unique_ptr<SharedBackend> shared_;  // declared first: destroyed after both executors
  std::unique_ptr<ResidentExecutor> resident_;
  std::unique_ptr<HostExecutor> host_;
  std::unordered_map<SeqId, bool> route_;  // true: resident
};

}  // namespace

int persistent_host_seats(int max_num_seqs) { return std::max(1, max_num_seqs / 4); }
int persistent_backend_slots(int max_num_seqs) { return max_num_seqs + persistent_host_seats(max_num_seqs); }

Expected<std::unique_ptr<backend::Executor>> make_persistent_executor(backend::Backend& be, const SchedulerConfig& cfg,
                                                                      std::function<Clock::time_point()> clock,
                                                                      const KvTierConfig& tiers, double resident_share,
                                                                      bool host_loop) {
  const int n = be.kv_config().num_blocks, slots = be.max_slots();
  const int rb = std::clamp(static_cast<int>(n * resident_share), 1, n - 1);
  if (n < 2 || slots < 2) return make_error("--scheduling persistent needs at least 2 KV blocks and 2 slots");
  // The loop's seats: all of max_num_seqs when the backend was sized for them and the host reserve
  // (`serve --scheduling persistent` sizes it so); else about half the slots.
  const int rs = slots >= persistent_backend_slots(cfg.max_num_seqs)
                     ? cfg.max_num_seqs
                     : std::clamp(std::min(cfg.max_num_seqs, slots / 2), 1, slots - 1);
  const int max_len = cfg.max_model_len > 0 ? cfg.max_model_len : rb * be.kv_config().block_size;
  SS_ASSIGN(auto runner, make_loop_runner(be, rs, std::max(1, cfg.max_num_batched_tokens), max_len,
                                          LoopShare{0, rb, 0, rs}, host_loop));
  LoopRunner& loop = *runner;
  auto shared = std::make_unique<SharedBackend>(be, loop, LoopShare{rb, n - rb, rs, slots - rs});
  auto resident = std::make_unique<ResidentExecutor>(std::move(runner), clock, cfg.enable_prefix_caching);
  SchedulerConfig host_cfg = cfg;  // its share of the slots bounds its running sequences
  host_cfg.max_num_seqs = std::min(cfg.max_num_seqs, slots - rs);
  host_cfg.max_num_batched_tokens = std::max(host_cfg.max_num_batched_tokens, host_cfg.max_num_seqs);
  SS_ASSIGN(auto host, HostExecutor::create(*shared, host_cfg, clock, tiers));
  return std::unique_ptr<backend::Executor>(
      std::make_unique<RoutingExecutor>(std::move(shared), std::move(resident), std::move(host)));
}

}  // namespace ss::engine
