#include "engine/generator.h"

#include <algorithm>
#include <chrono>

namespace ss::engine {

Expected<GenerateStats> generate(backend::Backend& be, int vocab_size, const std::vector<int32_t>& prompt,
                                 const SamplingParams& sp, const GenerateOptions& opts,
                                 const std::function<bool(int32_t)>& on_token) {
  if (prompt.empty()) return make_error("the prompt is empty");
  SS_TRY(sp.validate());
  const auto& kv = be.kv_config();
  const int capacity = kv.num_blocks * kv.block_size;
  if (static_cast<int>(prompt.size()) >= capacity)
    return make_error("the prompt has " + std::to_string(prompt.size()) + " tokens; the context holds " +
                      std::to_string(capacity));

  using clock = std::chrono::steady_clock;
  GenerateStats st;
  st.prompt_tokens = static_cast<int>(prompt.size());
  std::vector<int32_t> table(kv.num_blocks);
  for (int i = 0; i < kv.num_blocks; ++i) table[i] = i;

  backend::StepBatch batch;
  batch.block_tables = {table};
  std::vector<float> logits(vocab_size);
  Sampler sampler(sp, vocab_size);
  std::vector<int32_t> out;
  out.reserve(opts.max_tokens);

  const auto t0 = clock::now();
  const int chunk = std::max(1, opts.prefill_chunk);
  for (size_t b = 0; b < prompt.size(); b += chunk) {
    const size_t e = std::min(prompt.size(), b + chunk);
    batch.tokens.assign(prompt.begin() + b, prompt.begin() + e);
    batch.positions.resize(e - b);
    batch.seq_index.assign(e - b, 0);
    for (size_t i = b; i < e; ++i) batch.positions[i - b] = static_cast<int32_t>(i);
    batch.logits_rows.clear();
    if (e == prompt.size()) batch.logits_rows.push_back(static_cast<int32_t>(e - b - 1));
    SS_TRY(be.forward(batch, logits.data()));
  }
  const auto t1 = clock::now();
  st.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();

  int pos = static_cast<int>(prompt.size());
  batch.logits_rows = {0};
  batch.seq_index = {0};
  for (;;) {
    TokenConstraint* con = opts.constraint.get();
    const int32_t id = con ? sampler.sample(logits.data(), prompt, out, *con) : sampler.sample(logits.data(), prompt, out);
    if (con) con->accept(id);
    out.push_back(id);
    ++st.generated_tokens;
    const bool is_stop = opts.stop_at_eog && std::find(opts.stop_ids.begin(), opts.stop_ids.end(), id) != opts.stop_ids.end();
    if (is_stop) {
      st.finish = GenerateStats::Finish::Stop;
      break;
    }
    if (!on_token(id) || (con && con->must_end())) {
      st.finish = GenerateStats::Finish::Stop;
      break;
    }
    if (st.generated_tokens >= opts.max_tokens) break;
    if (pos >= capacity) {
      st.finish = GenerateStats::Finish::Context;
      break;
    }
    batch.tokens = {id};
    batch.positions = {pos++};
    SS_TRY(be.forward(batch, logits.data()));
  }
  st.decode_seconds = std::chrono::duration<double>(clock::now() - t1).count();
  return st;
}

}  // namespace ss::engine
