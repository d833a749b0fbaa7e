#include "engine/engine.h"

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/kernels.h"

#include <pthread.h>

#include <chrono>

#include <algorithm>
#include <cmath>
#include <limits>

namespace ss::engine {

namespace {
constexpr int kMaxLogprobs = 64;

// Log-softmax of one row (post-penalty, pre-temperature): the chosen token's value and the k most
// likely tokens (ties by lower id, the same order argmax uses). The exponentials are the sampler's
// vectorized ones (same bits on every ISA), summed per block in double: a scalar double exp per
// vocabulary entry made scoring a prompt (echo + logprobs, one row per position) 1.7x slower than
// its prefill.
void row_logprobs(const float* logits, int vocab, int32_t chosen, int k, float& chosen_lp,
                  std::vector<std::pair<int32_t, float>>& top) {
  const auto& ops = cpu::ops::ops_for(cpu::active_isa());
  thread_local std::vector<float> w;
  thread_local std::vector<double> block_sums;
  w.resize(static_cast<size_t>(vocab));
  block_sums.resize(static_cast<size_t>((vocab + cpu::ops::kSampleBlock - 1) / cpu::ops::kSampleBlock));
  const float mx = ops.max_value(logits, vocab);
  ops.exp_weights(logits, vocab, 1.0f, mx, w.data(), block_sums.data());
  double z = 0;
  for (double b : block_sums) z += b;
  const double lse = static_cast<double>(mx) + std::log(z);
  chosen_lp = static_cast<float>(logits[chosen] - lse);
  top.clear();
  k = std::min(k, vocab);
  if (k <= 0) return;
  // Insertion into a short sorted list: one pass, O(vocab) when k is small.
  auto before = [](float a, int32_t ia, float b, int32_t ib) { return a > b || (a == b && ia < ib); };
  for (int i = 0; i < vocab; ++i) {
    const float v = logits[i];
    if (static_cast<int>(top.size()) == k && !before(v, i, top.back().second, top.back().first)) continue;
    if (static_cast<int>(top.size()) == k) top.pop_back();
    auto it = top.end();
    while (it != top.begin() && before(v, i, (it - 1)->second, (it - 1)->first)) --it;
    top.insert(it, {i, v});
  }
  for (auto& [id, v] : top) v = static_cast<float>(v - lse);
}
}  // namespace

Expected<std::unique_ptr<Engine>> Engine::create(backend::Backend& be, const EngineConfig& cfg) {
  SS_TRY(cfg.scheduler.validate());
  if (cfg.vocab_size < 1) return make_error("vocab_size must be >= 1, got " + std::to_string(cfg.vocab_size));
  const auto& kv = be.kv_config();
  if (kv.num_blocks < 1 || kv.block_size < 1)
    return make_error("backend " + be.name() + " has an empty KV cache (" + std::to_string(kv.num_blocks) +
                      " blocks of " + std::to_string(kv.block_size) + " tokens)");
  return std::unique_ptr<Engine>(new Engine(be, cfg, kv.num_blocks, kv.block_size));
}

Engine::Engine(backend::Backend& be, const EngineConfig& cfg, int num_blocks, int block_size)
    : be_(be), cfg_(cfg), sched_(cfg.scheduler, num_blocks, block_size, cfg.vocab_size) {
  if (!cfg_.clock) cfg_.clock = [] { return Clock::now(); };
  // Pooled up front: at most one logits row per scheduled sequence.
  logits_.resize(static_cast<size_t>(cfg.scheduler.max_num_seqs) * cfg.vocab_size);
  sampled_.resize(cfg.scheduler.max_num_seqs);
  logprobs_.resize(cfg.scheduler.max_num_seqs);
  refresh_stats();
}

Engine::~Engine() { stop(); }

Expected<RequestId> Engine::add_request(Request req) {
  SS_TRY(sched_.check(req));  // reads only immutable config
  if (req.logprobs > kMaxLogprobs)
    return make_error("logprobs must be <= " + std::to_string(kMaxLogprobs) + ", got " + std::to_string(req.logprobs));
  if (req.prompt_logprobs > kMaxLogprobs)
    return make_error("prompt_logprobs must be <= " + std::to_string(kMaxLogprobs) + ", got " +
                      std::to_string(req.prompt_logprobs));
  std::lock_guard<std::mutex> lk(mu_);
  if (req.id == 0) {
    while (next_id_ == 0 || live_.count(next_id_)) ++next_id_;
    req.id = next_id_++;
  } else if (live_.count(req.id)) {
    return make_error("request id " + std::to_string(req.id) + " is already in use");
  }
  const RequestId id = req.id;
  live_.insert(id);
  inbox_.push_back(std::move(req));
  cv_.notify_one();
  return id;
}

void Engine::abort(RequestId id) {
  std::lock_guard<std::mutex> lk(mu_);
  aborts_.push_back(id);
  cv_.notify_one();
}

bool Engine::has_work() const {
  std::lock_guard<std::mutex> lk(mu_);
  return !live_.empty();
}

Status Engine::step() {
  const auto t_begin = std::chrono::steady_clock::now();
  double forward_s = 0;
  if (in_step_.exchange(true)) return make_error("step() is already running on another thread");
  struct Clear {
    std::atomic<bool>& f;
    ~Clear() { f = false; }
  } clear{in_step_};

  {
    std::lock_guard<std::mutex> lk(mu_);
    taken_.swap(inbox_);
    taken_aborts_.swap(aborts_);
  }
  emissions_.clear();
  for (Request& r : taken_) sched_.add(std::move(r));
  taken_.clear();
  for (RequestId id : taken_aborts_) sched_.abort(id, FinishReason::Abort, emissions_);
  taken_aborts_.clear();

  sched_.schedule(cfg_.clock(), plan_, emissions_);
  Status result;
  if (!plan_.seqs.empty()) {
    // At most max_num_seqs sampling rows plus Scheduler::kMaxPromptLogprobRows prompt rows.
    const size_t rows = plan_.batch.logits_rows.size();
    if (logits_.size() < rows * static_cast<size_t>(cfg_.vocab_size)) logits_.resize(rows * cfg_.vocab_size);
    const auto t_fwd = std::chrono::steady_clock::now();
    Status st = be_.forward(plan_.batch, logits_.data());
    forward_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_fwd).count();
    if (!st.ok()) {
      result = make_error("backend " + be_.name() + ": " + st.message());
      sched_.fail(plan_, result.message(), emissions_);
    } else {
      // Each row uses its own request's sampler: batch composition never changes what is drawn.
      // Rows are independent (one sampler and one logits row each), so they run on the backend's
      // threads.
      struct Ctx {
        Engine* self;
        size_t vocab;
      } ctx{this, static_cast<size_t>(cfg_.vocab_size)};
      be_.parallel_for(static_cast<int>(plan_.seqs.size()), [](void* p, int i) {
        auto& c = *static_cast<Ctx*>(p);
        Engine& e = *c.self;
        const ScheduledSeq& d = e.plan_.seqs[i];
        if (d.logits_row < 0) return;
        Sequence* s = d.seq;
        float* row = e.logits_.data() + d.logits_row * c.vocab;
        TokenConstraint* con = s->req.constraint.get();
        // With logprobs the row is masked first, so the reported distribution is the one drawn from.
        if (con && s->req.logprobs >= 0) con->mask(row, e.cfg_.vocab_size);
        if (s->num_output() < s->req.min_tokens)  // too early to stop: the stop ids are out
          for (int32_t id : s->req.stop_ids) row[id] = -std::numeric_limits<float>::infinity();
        e.sampled_[i] = con && s->req.logprobs < 0 ? s->sampler.sample(row, s->prompt(), s->output(), *con)
                                                   : s->sampler.sample(row, s->prompt(), s->output());
        if (con) con->accept(e.sampled_[i]);
        if (s->req.logprobs >= 0)  // the sampler left the biased, penalized logits in row
          row_logprobs(row, e.cfg_.vocab_size, e.sampled_[i], s->req.logprobs, e.logprobs_[i].chosen,
                       e.logprobs_[i].top);
      }, &ctx);
      // Prompt logprobs: the raw logits at each scored position, before anything edits them.
      prompt_rows_.clear();
      for (const ScheduledSeq& d : plan_.seqs)
        for (int r = 0; r < d.num_prompt_rows; ++r)
          prompt_rows_.push_back({d.seq, d.prompt_row0 + r, d.seq->num_computed + r});
      if (!prompt_rows_.empty()) {
        be_.parallel_for(static_cast<int>(prompt_rows_.size()), [](void* p, int i) {
          Engine& e = *static_cast<Engine*>(p);
          const PromptRow& pr = e.prompt_rows_[i];
          Sequence* s = pr.seq;
          PromptLogprob& out = s->prompt_lp[static_cast<size_t>(pr.pos)];
          row_logprobs(e.logits_.data() + static_cast<size_t>(pr.row) * e.cfg_.vocab_size, e.cfg_.vocab_size,
                       s->tokens[static_cast<size_t>(pr.pos) + 1], s->req.prompt_logprobs, out.logprob, out.top);
        }, this);
      }
      bool any_logprobs = false;
      for (const ScheduledSeq& d : plan_.seqs)
        any_logprobs |= d.logits_row >= 0 && (d.seq->req.logprobs >= 0 || d.seq->wants_prompt_lp());
      const size_t first = emissions_.size();
      sched_.update(plan_, sampled_, emissions_);
      if (any_logprobs) {
        // update() emits one event per sampled row, in plan order; match them by sequence.
        size_t e = first;
        for (size_t i = 0; i < plan_.seqs.size() && e < emissions_.size(); ++i) {
          const ScheduledSeq& d = plan_.seqs[i];
          if (d.logits_row < 0) continue;
          while (e < emissions_.size() && emissions_[e].seq != d.seq) ++e;
          if (e == emissions_.size()) break;
          TokenEvent& ev = emissions_[e++].event;
          if (ev.token < 0) continue;
          if (d.seq->wants_prompt_lp()) {
            ev.prompt_logprobs = std::move(d.seq->prompt_lp);
            d.seq->prompt_lp_sent = true;
          }
          if (d.seq->req.logprobs < 0) continue;
          ev.has_logprob = true;
          ev.logprob = logprobs_[i].chosen;
          ev.top_logprobs = logprobs_[i].top;
        }
      }
    }
  }
  for (const Emission& e : emissions_)
    if (e.seq->req.on_event) e.seq->req.on_event(e.event);
  emissions_.clear();
  released_.clear();
  sched_.release_finished(released_);
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (RequestId id : released_) live_.erase(id);
    if (!result.ok()) stats_.last_error = result.message();
    if (!plan_.seqs.empty()) {
      const double step_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_begin).count();
      stats_.step_seconds += step_s;
      stats_.forward_seconds += forward_s;
      if (result.ok() && plan_.num_prefill_tokens == 0 && plan_.num_decode_tokens > 0) {
        ++stats_.decode_steps;
        stats_.decode_step_seconds += step_s;
        stats_.decode_step_tokens += plan_.num_decode_tokens;
      }
    }
  }
  refresh_stats();
  return result;
}

void Engine::refresh_stats() {
  const auto& kv = sched_.kv();
  const auto& c = sched_.counters();
  std::lock_guard<std::mutex> lk(mu_);
  EngineStats& s = stats_;
  s.num_running = sched_.num_running();
  s.num_waiting = sched_.num_waiting() + static_cast<int>(inbox_.size());
  s.kv_blocks_total = kv.num_blocks();
  s.kv_blocks_used = kv.pool().num_used();
  s.kv_blocks_cached = kv.pool().num_cached();
  s.kv_usage = kv.usage();
  s.prefix_queried_tokens = kv.prefix_stats().queried_tokens;
  s.prefix_hit_tokens = kv.prefix_stats().hit_tokens;
  s.prefix_hit_rate = kv.prefix_stats().hit_rate();
  s.preemptions = c.preemptions;
  s.prompt_tokens = c.prompt_tokens;
  s.generation_tokens = c.generation_tokens;
  s.computed_tokens = c.computed_tokens;
  s.finished_requests = c.finished;
  s.steps = c.steps;
  const auto slots = sched_.kv_slots();
  s.kv_slots_held = slots.first;
  s.kv_slots_filled = slots.second;
  s.kv_paging_waste = slots.first > 0 ? 1.0 - double(slots.second) / double(slots.first) : 0.0;
  s.kv_slots_held_sum += slots.first;
  s.kv_slots_filled_sum += slots.second;
}

EngineStats Engine::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  return stats_;
}

Status Engine::check_invariants() {
  if (looping_) return make_error("check_invariants() needs the run loop stopped");
  return sched_.check_invariants();
}

Status Engine::start() {
  if (looping_.exchange(true)) return make_error("the engine loop is already running");
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_requested_ = false;
  }
  thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "ss-engine");
    loop();
  });
  return {};
}

void Engine::stop() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_requested_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  looping_ = false;
}

void Engine::loop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(mu_);
      // live_ covers queued, running, and aborted-but-not-yet-reaped requests.
      cv_.wait(lk, [&] { return stop_requested_ || !live_.empty(); });
      if (stop_requested_) return;
    }
    // A backend error has already failed that step's requests (and is in stats); keep serving.
    (void)step();
  }
}

}  // namespace ss::engine
