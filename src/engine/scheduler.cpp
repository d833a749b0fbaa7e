#include "engine/scheduler.h"

#include "engine/kv_tiers.h"

#include <algorithm>
#include <cassert>
#include <climits>

namespace ss::engine {

Status SchedulerConfig::validate() const {
  if (max_num_seqs < 1) return make_error("max_num_seqs must be >= 1, got " + std::to_string(max_num_seqs));
  if (max_num_batched_tokens < max_num_seqs)
    return make_error("max_num_batched_tokens (" + std::to_string(max_num_batched_tokens) +
                      ") must be >= max_num_seqs (" + std::to_string(max_num_seqs) +
                      ") so every running sequence can decode each step");
  if (max_prefill_tokens_with_decodes < 0)
    return make_error("max_prefill_tokens_with_decodes must be >= 0 (0: no cap), got " +
                      std::to_string(max_prefill_tokens_with_decodes));
  if (long_prompt_threshold < 1)
    return make_error("long_prompt_threshold must be >= 1, got " + std::to_string(long_prompt_threshold));
  if (max_long_prefill_tokens < 0)
    return make_error("max_long_prefill_tokens must be >= 0, got " + std::to_string(max_long_prefill_tokens));
  if (max_wait_steps < 1) return make_error("max_wait_steps must be >= 1, got " + std::to_string(max_wait_steps));
  if (max_wait_time.count() < 0) return make_error("max_wait_time must be >= 0");
  if (max_model_len < 0) return make_error("max_model_len must be >= 0, got " + std::to_string(max_model_len));
  if (max_restore_bytes_per_step < 1)
    return make_error("max_restore_bytes_per_step must be >= 1, got " + std::to_string(max_restore_bytes_per_step));
  if (!(restore_ms_per_step >= 0))
    return make_error("restore_ms_per_step must be >= 0 (0: off), got " + std::to_string(restore_ms_per_step));
  if (pressure.enabled) SS_TRY(pressure.validate());
  return {};
}

Sequence::Sequence(SeqStart r) : req(std::move(r)) {
  tokens = std::move(req.prompt);
  req.prompt.clear();
  num_prompt = static_cast<int>(tokens.size());
  kv.root = salted_root(req.cache_salt);
  if (req.prompt_logprobs >= 0) prompt_lp.resize(static_cast<size_t>(std::max(0, num_prompt - 1)));
  tokens.reserve(static_cast<size_t>(num_prompt) + std::max(0, req.max_tokens));
}

void StepPlan::clear() {
  batch.clear();
  seqs.clear();
  num_decode_tokens = num_prefill_tokens = num_preempted = 0;
}

Scheduler::Scheduler(const SchedulerConfig& cfg, int num_blocks, int block_size, int vocab_size)
    : cfg_(cfg), vocab_(vocab_size), kv_(num_blocks, block_size, cfg.enable_prefix_caching) {
  const int capacity = num_blocks * block_size;
  max_len_ = cfg.max_model_len > 0 ? std::min(cfg.max_model_len, capacity) : capacity;
  long_cap_ = cfg.max_long_prefill_tokens > 0 ? cfg.max_long_prefill_tokens
                                              : std::max(1, cfg.max_num_batched_tokens / 2);
  running_.reserve(cfg.max_num_seqs);
  decisions_.reserve(cfg.max_num_seqs);
  // Slot i for the i-th concurrent sequence; the lowest free one is taken first.
  for (int i = cfg.max_num_seqs - 1; i >= 0; --i) free_slots_.push_back(i);
}

Status Scheduler::check(const SeqStart& r) const {
  if (r.prompt.empty()) return make_error("the prompt is empty");
  for (size_t i = 0; i < r.prompt.size(); ++i)
    if (r.prompt[i] < 0 || r.prompt[i] >= vocab_)
      return make_error("prompt token " + std::to_string(r.prompt[i]) + " at position " + std::to_string(i) +
                        " is outside the vocabulary [0, " + std::to_string(vocab_) + ")");
  SS_TRY(r.sampling.validate());
  for (int32_t id : r.stop_ids)
    if (id < 0 || id >= vocab_)
      return make_error("stop id " + std::to_string(id) + " is outside the vocabulary [0, " + std::to_string(vocab_) + ")");
  for (const auto& [id, v] : r.sampling.logit_bias)
    if (id >= vocab_)
      return make_error("logit_bias token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                        std::to_string(vocab_) + ")");
  if (r.max_tokens < 1) return make_error("max_tokens must be >= 1, got " + std::to_string(r.max_tokens));
  if (r.min_tokens < 0 || r.min_tokens > r.max_tokens)
    return make_error("min_tokens must be between 0 and max_tokens (" + std::to_string(r.max_tokens) + "), got " +
                      std::to_string(r.min_tokens));
  const int64_t total = static_cast<int64_t>(r.prompt.size()) + r.max_tokens;
  if (total > max_len_) {
    std::string why = "the prompt (" + std::to_string(r.prompt.size()) + " tokens) plus max_tokens (" +
                      std::to_string(r.max_tokens) + ") needs " + std::to_string(total) + " tokens of context; ";
    if (cfg_.max_model_len > 0 && cfg_.max_model_len <= kv_.num_blocks() * kv_.block_size())
      why += "the engine allows " + std::to_string(max_len_);
    else
      why += "the whole KV cache holds " + std::to_string(max_len_) + " (" + std::to_string(kv_.num_blocks()) +
             " blocks of " + std::to_string(kv_.block_size()) + ")";
    return make_error(why);
  }
  return {};
}

void Scheduler::add(SeqStart r) {
  const SeqId id = r.id;
  auto seq = std::make_unique<Sequence>(std::move(r));
  Sequence* s = seq.get();
  s->lane = s->num_prompt >= cfg_.long_prompt_threshold ? Lane::Long : Lane::Short;
  s->arrival_order = next_arrival_++;
  s->arrival_step = counters_.steps;
  s->marks.reserve(4);  // queued, scheduled, a chunk or two: no growth on the usual path
  s->marks.push_back({backend::SeqMark::Kind::Queued, Clock::now()});
  s->queue = s->lane == Lane::Long ? Sequence::Queue::Long : Sequence::Queue::Short;
  (s->lane == Lane::Long ? long_ : short_).push_back(s);
  seqs_.emplace(id, std::move(seq));
}

void Scheduler::abort(SeqId id, FinishReason why, std::vector<Emission>& out) {
  auto it = seqs_.find(id);
  if (it == seqs_.end() || it->second->state == Sequence::State::Finished) return;
  finish(it->second.get(), why, -1, out);
}

void Scheduler::remove_running(Sequence* s) {
  auto it = std::find(running_.begin(), running_.end(), s);
  assert(it != running_.end());
  running_.erase(it);
  free_slots_.push_back(s->slot);
  s->slot = -1;
}

void Scheduler::pop_waiting(Sequence* s) {
  std::deque<Sequence*>* q = nullptr;
  switch (s->queue) {
    case Sequence::Queue::Resumed: q = &resumed_; break;
    case Sequence::Queue::Short: q = &short_; break;
    case Sequence::Queue::Long: q = &long_; break;
    case Sequence::Queue::None: return;
  }
  if (!q->empty() && q->front() == s) {
    q->pop_front();
  } else {
    auto it = std::find(q->begin(), q->end(), s);
    assert(it != q->end());
    q->erase(it);
  }
  s->queue = Sequence::Queue::None;
}

void Scheduler::finish(Sequence* s, FinishReason why, int32_t token, std::vector<Emission>& out, std::string error) {
  kv_.free(s->kv);  // a restore in flight is cancelled
  if (s->state == Sequence::State::Running) remove_running(s);
  else if (s->state == Sequence::State::Waiting) pop_waiting(s);
  else if (s->state == Sequence::State::Restoring) std::erase(restoring_, s);
  s->state = Sequence::State::Finished;
  s->finish = why;
  SeqEvent ev;
  ev.id = s->req.id;
  ev.token = token;
  ev.finish = why;
  ev.error = std::move(error);
  ev.marks = std::move(s->marks);
  s->marks.clear();
  out.push_back(Emission{s, std::move(ev)});
  finished_.push_back(s);
  ++counters_.finished;
}

void Scheduler::reap(Clock::time_point now, std::vector<Emission>& out) {
  auto due = [&](const Sequence* s) -> FinishReason {
    if (s->req.deadline && now >= *s->req.deadline) return FinishReason::Timeout;
    return FinishReason::None;
  };
  // Collect first: finish() edits the containers being walked.
  auto sweep = [&](auto& container) {
    for (size_t i = 0; i < container.size();) {
      Sequence* s = container[i];
      const FinishReason why = due(s);
      if (why == FinishReason::None) {
        ++i;
        continue;
      }
      finish(s, why, -1, out);  // removes container[i]
    }
  };
  sweep(running_);
  sweep(restoring_);
  sweep(resumed_);
  sweep(short_);
  sweep(long_);
}

void Scheduler::preempt(Sequence* victim) {
  kv_.free(victim->kv);
  victim->num_computed = 0;
  remove_running(victim);
  for (size_t i = 0; i < decisions_.size(); ++i) {
    if (decisions_[i].seq != victim) continue;
    budget_ += decisions_[i].num_tokens;
    if (decisions_[i].long_charged) long_left_ += decisions_[i].num_tokens;
    plp_left_ += decisions_[i].prompt_rows;
    decisions_.erase(decisions_.begin() + static_cast<std::ptrdiff_t>(i));
    break;
  }
  victim->state = Sequence::State::Waiting;
  victim->queue = Sequence::Queue::Resumed;
  resumed_.push_front(victim);  // the older ones, preempted later, end up first
  ++victim->num_preemptions;
  victim->marks.push_back({backend::SeqMark::Kind::Preempted, Clock::now()});
  ++counters_.preemptions;
  preempted_this_step_ = true;
}

int Scheduler::reserve(Sequence* s, int want, bool is_decode) {
  for (;;) {
    const int fit = kv_.fit_tokens(s->kv, s->num_computed, {});
    const int n = std::min(want, fit);  // a prefill chunk shrinks to the memory there is
    if (n > 0) {
      const bool ok = kv_.allocate(s->kv, {}, s->num_computed + n);
      assert(ok);
      (void)ok;
      return n;
    }
    // Out of blocks: the newest running sequence gives its blocks back, unless that is s.
    Sequence* victim = running_.back();
    if (victim != s) {
      preempt(victim);
      continue;
    }
    if (is_decode) preempt(s);  // frees its blocks for the older ones; recomputed later
    return 0;
  }
}

int Scheduler::cap_prompt_rows(const Sequence* s, int c, int want) const {
  if (s->prompt_rows(c, want) <= plp_left_) return want;
  return std::max(0, plp_left_);  // every position up to the cap is a prompt row (c < num_prompt - 1)
}

bool Scheduler::waited_too_long(const Sequence* s, Clock::time_point now) const {
  if (counters_.steps - s->arrival_step >= cfg_.max_wait_steps) return true;
  return cfg_.max_wait_time.count() > 0 && now - s->req.arrival >= cfg_.max_wait_time;
}

Sequence* Scheduler::peek_waiting(Clock::time_point now, bool allow_long) const {
  if (!resumed_.empty() && (allow_long || resumed_.front()->lane == Lane::Short)) return resumed_.front();
  Sequence* sh = short_.empty() ? nullptr : short_.front();
  Sequence* lg = (!allow_long || long_.empty()) ? nullptr : long_.front();
  Sequence* promoted = nullptr;
  for (Sequence* c : {sh, lg})
    if (c && waited_too_long(c, now) && (!promoted || c->arrival_order < promoted->arrival_order)) promoted = c;
  if (promoted) return promoted;
  return sh ? sh : lg;
}

// Prefill tokens the short lane could take this step: running short prompts' remaining tokens, and
// the waiting short ones (preempted first) that have a seat, whole (their cached prefix is not
// looked up here, so this errs towards the short lane).
int64_t Scheduler::short_demand(int max_seqs) const {
  int64_t need = 0;
  for (const Sequence* s : running_) {
    const int remaining = s->num_tokens() - s->num_computed;
    if (s->lane == Lane::Short && remaining > 1) need += remaining;
  }
  int seats = max_seqs - static_cast<int>(running_.size());
  for (const auto* q : {&resumed_, &short_})
    for (const Sequence* s : *q) {
      if (seats <= 0) break;
      if (s->lane != Lane::Short) continue;
      need += s->num_tokens();
      --seats;
    }
  return need;
}

void Scheduler::schedule(Clock::time_point now, StepPlan& plan, std::vector<Emission>& out) {
  plan.clear();
  decisions_.clear();
  ++counters_.steps;
  preempted_this_step_ = false;
  step_began_ = Clock::now();
  update_pressure(now);
  const int level = level_;
  const int max_demote = running_.empty() ? INT_MAX : kMaxIdleDemotionsPerStep;
  const int demoted = kv_.expire_idle(now, max_demote);
  // Level 1: blocks idle past the shortened TTL leave the pool too (counted apart from the usual ones).
  if (level >= 1 && kv_.tiers() && kv_.tiers()->config().ttl_ms > 0 && demoted < max_demote) {
    const auto ttl = std::max<int64_t>(1, static_cast<int64_t>(double(kv_.tiers()->config().ttl_ms) *
                                                                cfg_.pressure.ttl_factor));
    pressure_.demoted_early += kv_.expire_idle(now, max_demote - demoted, ttl);
  }
  reap(now, out);
  // Loaded blocks into the pool, one batched copy, bounded (time at the copy rate, bytes) while
  // streams run.
  kv_.apply_restores(running_.empty() ? INT_MAX : max_restore_blocks_per_step());
  finish_restores();

  // Level 2: fewer running sequences; the rest of the work waits (running ones are never preempted
  // for it: they finish, and seats free up below the cap).
  const int max_seqs = level >= 2 ? std::max(1, static_cast<int>(cfg_.max_num_seqs * cfg_.pressure.seat_factor))
                                  : cfg_.max_num_seqs;
  budget_ = cfg_.max_num_batched_tokens;
  long_left_ = INT_MAX;  // set below, once the decodes have taken their part of the budget
  plp_left_ = kMaxPromptLogprobRows;

  // (1) Decodes (one token to go), oldest first. A sequence preempted below is always newer than
  // the one asking, so indices before i stay put.
  for (size_t i = 0; i < running_.size() && budget_ > 0; ++i) {
    Sequence* s = running_[i];
    if (s->num_tokens() - s->num_computed != 1) continue;
    if (reserve(s, 1, /*is_decode=*/true) == 0) continue;
    decisions_.push_back({s, 1, false});
    budget_ -= 1;
  }
  // With decodes in this step, prefill work is capped so the step stays short (their TPOT).
  if (!decisions_.empty() && cfg_.max_prefill_tokens_with_decodes > 0)
    budget_ = std::min(budget_, cfg_.max_prefill_tokens_with_decodes);
  // Level 1: smaller prefill chunks (less KV claimed per step, shorter steps for the decodes).
  bool prefill_cut = false;
  if (level >= 1) {
    const int cap = std::max(kv_.block_size(), static_cast<int>(cfg_.max_num_batched_tokens * cfg_.pressure.prefill_factor));
    if (budget_ > cap) {
      budget_ = cap;
      prefill_cut = true;
    }
  }
  // Cap long prefills only while short prompts are pending: waiting with a seat free, or admitted
  // and still prefilling (else the older long prompt would take the budget first in (2)); and then
  // only as far as the short work can use the budget, so a step is never left short by the cap.
  const int64_t short_need = short_demand(max_seqs);
  if (short_need > 0)
    long_left_ = static_cast<int>(std::max<int64_t>(long_cap_, static_cast<int64_t>(budget_) - short_need));
  // (2) Running prefills (chunked), oldest first, with the budget left.
  for (size_t i = 0; i < running_.size() && budget_ > 0; ++i) {
    Sequence* s = running_[i];
    const int remaining = s->num_tokens() - s->num_computed;
    if (remaining <= 1) continue;
    const bool charged = s->lane == Lane::Long && long_left_ != INT_MAX;
    const int want = cap_prompt_rows(s, s->num_computed, std::min({remaining, budget_, charged ? long_left_ : INT_MAX}));
    if (want <= 0) continue;
    const int n = reserve(s, want, /*is_decode=*/false);
    if (n == 0) continue;
    const int rows = s->prompt_rows(s->num_computed, n);
    decisions_.push_back({s, n, charged, rows});
    budget_ -= n;
    plp_left_ -= rows;
    if (charged) long_left_ -= n;
  }
  // (3) Admissions. Not after a preemption: memory is short, and the preempted go first next step.
  // A restoring sequence keeps its seat: it is admitted as soon as its blocks are in.
  while (!preempted_this_step_ && static_cast<int>(running_.size() + restoring_.size()) < max_seqs && budget_ > 0) {
    Sequence* s = peek_waiting(now, long_left_ > 0);
    if (!s) break;
    // A request that wants its prompt's logprobs computes every position (no cached prefix).
    int cached = 0;
    hits_.clear();
    if (!s->kv.table.empty()) {  // its restore just ended: it holds its prefix
      cached = static_cast<int>(s->kv.table.size()) * kv_.block_size();
    } else if (!s->wants_prompt_lp()) {
      cached = kv_.match_prefix(s->tokens, s->kv, hits_);
      if (kv_.start_restore(s->tokens, s->kv, hits_) > 0) {  // waits for it outside the queues
        s->return_queue = s->queue;
        pop_waiting(s);
        s->state = Sequence::State::Restoring;
        restoring_.push_back(s);
        continue;
      }
    }
    const bool charged = s->lane == Lane::Long && long_left_ != INT_MAX;
    const int want = cap_prompt_rows(s, cached, std::min({s->num_tokens() - cached, budget_, charged ? long_left_ : INT_MAX}));
    const int n = std::min(want, kv_.fit_tokens(s->kv, cached, hits_));
    if (n <= 0) break;  // head of line waits for memory; skipping it could starve it
    pop_waiting(s);
    const bool ok = kv_.allocate(s->kv, hits_, cached + n);
    assert(ok);
    (void)ok;
    s->num_computed = cached;
    s->state = Sequence::State::Running;
    assert(!free_slots_.empty());  // running_ < max_num_seqs slots
    s->slot = free_slots_.back();
    free_slots_.pop_back();
    s->blocks_sent = 0;
    s->admit_order = ++next_admit_;
    {
      backend::SeqMark m{backend::SeqMark::Kind::Scheduled, step_began_};
      m.tokens = cached;
      s->marks.push_back(m);
    }
    if (!s->prefix_counted) {
      s->prefix_counted = true;
      kv_.count_query(s->num_tokens(), cached);
      counters_.prompt_tokens += s->num_prompt;
    }
    running_.push_back(s);
    const int rows = s->prompt_rows(cached, n);
    decisions_.push_back({s, n, charged, rows});
    budget_ -= n;
    plp_left_ -= rows;
    if (charged) long_left_ -= n;
  }
  // Restored but not admitted this step (no budget or memory left, or another came first): the
  // blocks stay cached, unheld, and are found in the pool at its admission.
  for (Sequence* s : restored_)
    if (s->state == Sequence::State::Waiting) kv_.release(s->kv);
  restored_.clear();
  build_batch(plan);
  if (prefill_cut && plan.num_prefill_tokens > 0) ++pressure_.prefill_shrunk;
  if (level >= 2 && num_waiting() > 0 && static_cast<int>(running_.size()) >= max_seqs &&
      max_seqs < cfg_.max_num_seqs)
    ++pressure_.admissions_capped;
  if (level >= 3 && !cfg_.pressure.has_lower_backend) ++pressure_.no_lower_tier;
}

int Scheduler::max_restore_blocks_per_step() const {
  const int64_t bb = kv_.tiers() ? kv_.tiers()->block_bytes() : 0;
  if (bb <= 0) return INT_MAX;
  int64_t bytes = cfg_.max_restore_bytes_per_step;
  if (cfg_.restore_ms_per_step > 0) {
    constexpr int64_t kUntimed = int64_t(8) << 20;  // until a batch has been timed
    const double rate = kv_.tiers()->copy_bytes_per_s();
    const double in_budget = rate > 0 ? rate * cfg_.restore_ms_per_step / 1000.0 : double(kUntimed);
    bytes = std::min<int64_t>(bytes, static_cast<int64_t>(std::min(in_budget, double(INT64_MAX / 2))));
  }
  return static_cast<int>(std::clamp<int64_t>(bytes / bb, 1, INT_MAX));
}

void Scheduler::finish_restores() {
  for (size_t i = 0; i < restoring_.size();) {
    Sequence* s = restoring_[i];
    if (s->kv.restoring()) {
      ++i;
      continue;
    }
    restoring_.erase(restoring_.begin() + static_cast<std::ptrdiff_t>(i));
    const RestoreState& r = s->kv.restore;
    if (r.blocks > 0) {
      const int bs = kv_.block_size();
      backend::SeqMark m{backend::SeqMark::Kind::KvRestore, r.begin, r.end, r.first_block * bs, r.blocks * bs};
      m.from_disk = r.from_disk * bs;
      s->marks.push_back(m);
    }
    s->state = Sequence::State::Waiting;
    s->queue = s->return_queue;
    (s->queue == Sequence::Queue::Resumed ? resumed_ : s->queue == Sequence::Queue::Long ? long_ : short_).push_front(s);
    if (s->kv.table.empty()) continue;  // nothing came back: an ordinary waiting request
    restored_.push_back(s);
  }
}

void Scheduler::update_pressure(Clock::time_point now) {
  if (!cfg_.pressure.enabled) {
    level_ = 0;
    ++pressure_.steps_at_level[0];
    return;
  }
  // /proc/meminfo costs ~20 us to read: sample it 4 times a second, not every step (an injected
  // probe is asked every step).
  if (cfg_.pressure.host_memory || host_sampled_ == Clock::time_point{} ||
      now - host_sampled_ >= std::chrono::milliseconds(250) || now < host_sampled_) {
    host_sampled_ = now;
    int64_t avail = 0, total = 0;
    const bool ok = cfg_.pressure.host_memory ? cfg_.pressure.host_memory(&avail, &total) : read_host_memory(&avail, &total);
    host_available_ = ok && total > 0 ? std::clamp(double(avail) / double(total), 0.0, 1.0) : 1.0;
  }
  PressureInputs in;
  in.kv_use = kv_.usage();
  in.host_available = host_available_;
  in.waiting = num_waiting();
  in.max_num_seqs = cfg_.max_num_seqs;
  level_ = next_pressure_level(in, cfg_.pressure.watermarks, level_);
  ++pressure_.steps_at_level[static_cast<size_t>(level_)];
}

void Scheduler::build_batch(StepPlan& plan) {
  auto& b = plan.batch;
  for (size_t i = 0; i < decisions_.size(); ++i) {
    Sequence* s = decisions_[i].seq;
    const int c = s->num_computed, n = decisions_[i].num_tokens;
    for (int p = c; p < c + n; ++p) {
      b.tokens.push_back(s->tokens[p]);
      b.positions.push_back(p);
      b.seq_index.push_back(static_cast<int32_t>(i));
    }
    // The backend keeps the table per slot: send what it lacks (all of it for a new occupant).
    b.seq_slot.push_back(s->slot);
    const int have = static_cast<int>(s->kv.table.size());
    if (have > s->blocks_sent || s->blocks_sent == 0) {
      b.edit_table(s->slot, s->blocks_sent, std::span<const int32_t>(s->kv.table).subspan(s->blocks_sent));
      s->blocks_sent = have;
    }
    ScheduledSeq ss{s, n, -1};
    if (decisions_[i].prompt_rows > 0) {
      ss.prompt_row0 = static_cast<int>(b.score_rows.size());
      ss.num_prompt_rows = decisions_[i].prompt_rows;
      const size_t t0 = b.tokens.size() - static_cast<size_t>(n);
      for (int r = 0; r < ss.num_prompt_rows; ++r)
        b.score_rows.push_back({static_cast<int32_t>(t0 + r), s->tokens[static_cast<size_t>(c + r + 1)],
                                s->req.prompt_logprobs});
    }
    if (c + n == s->num_tokens()) {
      ss.sample_row = static_cast<int>(b.sample_rows.size());
      backend::SampleRow row;
      row.token = static_cast<int32_t>(b.tokens.size() - 1);
      row.params = &s->req.sampling;
      row.n = static_cast<uint64_t>(s->num_output());
      row.prompt = s->prompt();
      row.output = s->output();
      if (s->num_output() < s->req.min_tokens) row.banned = s->req.stop_ids;  // too early to stop
      row.mask = s->req.constraint.get();
      row.logprobs = s->req.logprobs;
      b.sample_rows.push_back(row);
    }
    if (n == 1 && c >= s->num_prompt) ++plan.num_decode_tokens;
    else plan.num_prefill_tokens += n;
    plan.seqs.push_back(ss);
  }
  plan.num_preempted = preempted_this_step_ ? 1 : 0;
}

void Scheduler::update(const StepPlan& plan, const backend::StepOutput& res, std::vector<Emission>& out) {
  const Clock::time_point step_end = plan.num_prefill_tokens > 0 ? Clock::now() : Clock::time_point{};
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const ScheduledSeq& d = plan.seqs[i];
    Sequence* s = d.seq;
    if (d.num_tokens > 1 || s->num_computed < s->num_prompt) {  // a prefill chunk (or a recomputation's)
      backend::SeqMark m{backend::SeqMark::Kind::PrefillChunk, step_began_, step_end};
      m.position = s->num_computed;
      m.tokens = d.num_tokens;
      s->marks.push_back(m);
    }
    s->num_computed += d.num_tokens;
    counters_.computed_tokens += d.num_tokens;
    kv_.publish(s->kv, s->tokens, s->num_computed);
    if (d.sample_row < 0) continue;
    const int32_t tok = res.tokens[static_cast<size_t>(d.sample_row)];
    s->tokens.push_back(tok);
    ++counters_.generation_tokens;
    FinishReason why = FinishReason::None;
    if (s->req.constraint) {
      s->req.constraint->accept(tok);
      if (std::string err = s->req.constraint->error(); !err.empty()) {
        finish(s, FinishReason::Error, -1, out, std::move(err));
        continue;
      }
    }
    if (std::find(s->req.stop_ids.begin(), s->req.stop_ids.end(), tok) != s->req.stop_ids.end())
      why = FinishReason::Stop;
    else if (s->req.constraint && s->req.constraint->must_end())  // structured output complete
      why = FinishReason::Stop;
    else if (s->num_output() >= s->req.max_tokens || s->num_tokens() >= max_len_)
      why = FinishReason::Length;
    const int32_t filled = static_cast<int32_t>(s->num_computed / kv_.block_size());
    if (why != FinishReason::None) {
      finish(s, why, tok, out);
    } else {
      SeqEvent ev;
      ev.id = s->req.id;
      ev.token = tok;
      out.push_back(Emission{s, std::move(ev)});
    }
    SeqEvent& ev = out.back().event;
    ev.kv_blocks_filled = filled;
    if (!s->marks.empty()) {
      ev.marks = std::move(s->marks);
      s->marks.clear();
    }
    if (s->wants_prompt_lp()) {
      ev.prompt_logprobs = std::move(s->prompt_lp);
      s->prompt_lp_sent = true;
    }
    if (s->req.logprobs >= 0) {
      const backend::RowLogprobs& lp = res.logprobs[static_cast<size_t>(d.sample_row)];
      ev.has_logprob = true;
      ev.logprob = lp.chosen;
      ev.top_logprobs = lp.top;
    }
  }
}

void Scheduler::fail(const StepPlan& plan, const std::string& error, std::vector<Emission>& out) {
  for (const ScheduledSeq& d : plan.seqs)
    if (d.seq->state != Sequence::State::Finished) finish(d.seq, FinishReason::Error, -1, out, error);
}

void Scheduler::release_finished(std::vector<SeqId>& released) {
  for (Sequence* s : finished_) {
    released.push_back(s->req.id);
    seqs_.erase(s->req.id);
  }
  finished_.clear();
}

Status Scheduler::check_invariants() const {
  SS_TRY(kv_.pool().check());
  const int bs = kv_.block_size();
  std::vector<int> refs(kv_.num_blocks(), 0);
  size_t running = 0, waiting = 0;
  for (const auto& [id, sp] : seqs_) {
    const Sequence& s = *sp;
    const std::string who = "request " + std::to_string(id) + ": ";
    for (BlockId b : s.kv.table) {
      if (b < 0 || b >= kv_.num_blocks()) return make_error(who + "bad block id " + std::to_string(b));
      ++refs[b];
    }
    switch (s.state) {
      case Sequence::State::Running:
        ++running;
        if (static_cast<int>(s.kv.table.size()) != (s.num_computed + bs - 1) / bs)
          return make_error(who + "has " + std::to_string(s.kv.table.size()) + " blocks for " +
                            std::to_string(s.num_computed) + " computed tokens");
        if (s.num_computed >= s.num_tokens()) return make_error(who + "has no token left to compute");
        if (std::find(running_.begin(), running_.end(), &s) == running_.end())
          return make_error(who + "running but not in the running list");
        break;
      case Sequence::State::Restoring:
        if (s.num_computed != 0) return make_error(who + "restoring but has computed tokens");
        if (!s.kv.restoring()) return make_error(who + "restoring without a restore in flight");
        if (std::find(restoring_.begin(), restoring_.end(), &s) == restoring_.end())
          return make_error(who + "restoring but not in the restoring list");
        break;
      case Sequence::State::Waiting: {
        ++waiting;
        if (!s.kv.table.empty() || s.num_computed != 0) return make_error(who + "waiting but holds KV");
        const auto& q = s.queue == Sequence::Queue::Resumed ? resumed_ : s.queue == Sequence::Queue::Short ? short_ : long_;
        if (s.queue == Sequence::Queue::None || std::find(q.begin(), q.end(), &s) == q.end())
          return make_error(who + "waiting but in no queue");
        break;
      }
      case Sequence::State::Finished:
        if (!s.kv.table.empty()) return make_error(who + "finished but holds KV");
        break;
    }
  }
  if (kv_.num_restoring() != num_restoring()) return make_error("restores in flight do not match restoring sequences");
  if (running != running_.size() || waiting != static_cast<size_t>(num_waiting()))
    return make_error("queue sizes do not match sequence states");
  // Each running sequence holds its own block-table slot; the rest are free.
  std::vector<int> slot_users(static_cast<size_t>(cfg_.max_num_seqs), 0);
  for (const Sequence* s : running_) {
    if (s->slot < 0 || s->slot >= cfg_.max_num_seqs) return make_error("a running sequence without a slot");
    if (s->blocks_sent > static_cast<int>(s->kv.table.size())) return make_error("more blocks sent than held");
    ++slot_users[static_cast<size_t>(s->slot)];
  }
  for (int f : free_slots_) {
    if (f < 0 || f >= cfg_.max_num_seqs) return make_error("a free slot out of range");
    ++slot_users[static_cast<size_t>(f)];
  }
  for (int n : slot_users)
    if (n != 1) return make_error("a block-table slot is held twice or lost");
  for (size_t i = 1; i < running_.size(); ++i)
    if (running_[i - 1]->admit_order >= running_[i]->admit_order) return make_error("running list out of admission order");
  for (int b = 0; b < kv_.num_blocks(); ++b)
    if (refs[b] != kv_.pool().ref_count(b))
      return make_error("block " + std::to_string(b) + " has ref count " + std::to_string(kv_.pool().ref_count(b)) +
                        " but " + std::to_string(refs[b]) + " tables hold it");
  return {};
}

std::pair<int64_t, int64_t> Scheduler::kv_slots() const {
  int64_t held = 0, filled = 0;
  for (const Sequence* s : running_) {
    held += static_cast<int64_t>(s->kv.table.size()) * kv_.block_size();
    filled += s->num_computed;
  }
  return {held, filled};
}

}  // namespace ss::engine
