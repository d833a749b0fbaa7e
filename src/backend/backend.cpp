// What every backend shares: sampling parameters' validation, the default bitmask of a TokenMask,
// the step batch's block-table edits, and the batch checks a backend runs before touching memory.
#include "backend/backend.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace ss::backend {

namespace {
std::string num(float v) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", static_cast<double>(v));
  return b;
}
}  // namespace

Status SamplingParams::validate() const {
  if (!std::isfinite(temperature) || temperature < 0.0f) return make_error("temperature must be >= 0, got " + num(temperature));
  if (top_k < 0) return make_error("top_k must be >= 0 (0 disables it), got " + std::to_string(top_k));
  if (!(top_p > 0.0f && top_p <= 1.0f)) return make_error("top_p must be in (0, 1], got " + num(top_p));
  if (!(min_p >= 0.0f && min_p <= 1.0f)) return make_error("min_p must be in [0, 1], got " + num(min_p));
  if (!(repetition_penalty > 0.0f) || !std::isfinite(repetition_penalty))
    return make_error("repetition_penalty must be > 0, got " + num(repetition_penalty));
  if (!(presence_penalty >= -2.0f && presence_penalty <= 2.0f))
    return make_error("presence_penalty must be in [-2, 2], got " + num(presence_penalty));
  if (!(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f))
    return make_error("frequency_penalty must be in [-2, 2], got " + num(frequency_penalty));
  for (const auto& [id, v] : logit_bias) {
    if (id < 0) return make_error("logit_bias token id must be >= 0, got " + std::to_string(id));
    if (!(v >= -100.0f && v <= 100.0f))
      return make_error("logit_bias values must be in [-100, 100], got " + num(v) + " for token " + std::to_string(id));
  }
  return {};
}

void TokenMask::fill_bitmask(uint32_t* words, int n) {
  thread_local std::vector<float> row;
  row.assign(static_cast<size_t>(n), 0.0f);
  mask(row.data(), n);
  std::fill(words, words + (n + 31) / 32, 0u);
  for (int t = 0; t < n; ++t)
    if (row[static_cast<size_t>(t)] != -std::numeric_limits<float>::infinity()) words[t / 32] |= 1u << (t % 32);
}

void StepBatch::clear() {
  tokens.clear();
  positions.clear();
  seq_index.clear();
  seq_slot.clear();
  table_edits.clear();
  edit_blocks.clear();
  sample_rows.clear();
  score_rows.clear();
  logits_rows.clear();
}

void StepBatch::edit_table(int32_t slot, int32_t first, std::span<const int32_t> blocks) {
  table_edits.push_back(TableEdit{slot, first, static_cast<int32_t>(blocks.size()),
                                  static_cast<int32_t>(edit_blocks.size())});
  edit_blocks.insert(edit_blocks.end(), blocks.begin(), blocks.end());
}

Status BlockTables::apply(const StepBatch& b, int num_blocks) {
  // Checked whole before any edit lands: a bad batch changes no table.
  for (const TableEdit& e : b.table_edits) {
    if (e.slot < 0 || e.slot >= size())
      return make_error("StepBatch: table edit for slot " + std::to_string(e.slot) + ", the backend has " +
                        std::to_string(size()) + " slots");
    if (e.first < 0 || e.count < 0 || e.offset < 0 ||
        static_cast<size_t>(e.offset) + static_cast<size_t>(e.count) > b.edit_blocks.size())
      return make_error("StepBatch: table edit of slot " + std::to_string(e.slot) + " is out of range");
    if (static_cast<size_t>(e.first) > tables_[static_cast<size_t>(e.slot)].size())
      return make_error("StepBatch: table edit of slot " + std::to_string(e.slot) + " starts at entry " +
                        std::to_string(e.first) + " past its end (" +
                        std::to_string(tables_[static_cast<size_t>(e.slot)].size()) + ")");
    for (int32_t i = 0; i < e.count; ++i) {
      const int32_t blk = b.edit_blocks[static_cast<size_t>(e.offset + i)];
      if (blk < 0 || blk >= num_blocks)
        return make_error("StepBatch: block table of slot " + std::to_string(e.slot) + ", entry " +
                          std::to_string(e.first + i) + ": block " + std::to_string(blk) +
                          " is outside the KV cache [0, " + std::to_string(num_blocks) + ")");
    }
  }
  for (const TableEdit& e : b.table_edits) {
    auto& t = tables_[static_cast<size_t>(e.slot)];
    t.resize(static_cast<size_t>(e.first));
    t.insert(t.end(), b.edit_blocks.begin() + e.offset, b.edit_blocks.begin() + e.offset + e.count);
  }
  return {};
}

Status validate_batch(const StepBatch& b, const BlockTables& tables, int num_blocks, int block_size, int vocab) {
  const size_t T = b.tokens.size();
  if (b.positions.size() != T || b.seq_index.size() != T)
    return make_error("StepBatch: " + std::to_string(T) + " tokens but " + std::to_string(b.positions.size()) +
                      " positions and " + std::to_string(b.seq_index.size()) + " sequence indices");
  const int S = static_cast<int>(b.seq_slot.size());
  for (int s = 0; s < S; ++s)
    if (b.seq_slot[s] < 0 || b.seq_slot[s] >= tables.size())
      return make_error("StepBatch: sequence " + std::to_string(s) + " has slot " + std::to_string(b.seq_slot[s]) +
                        ", the backend has " + std::to_string(tables.size()));
  // Messages are built only on failure: the happy path allocates nothing.
  auto row = [](size_t i) { return "StepBatch row " + std::to_string(i); };
  for (size_t i = 0; i < T; ++i) {
    if (b.tokens[i] < 0 || b.tokens[i] >= vocab)
      return make_error(row(i) + ": token id " + std::to_string(b.tokens[i]) + " is outside the vocabulary [0, " +
                        std::to_string(vocab) + ")");
    const int s = b.seq_index[i];
    if (s < 0 || s >= S)
      return make_error(row(i) + ": sequence index " + std::to_string(s) + " but the batch has " + std::to_string(S) +
                        " sequences");
    const int p = b.positions[i];
    if (p < 0) return make_error(row(i) + ": negative position " + std::to_string(p));
    const auto tab = tables.of(b.seq_slot[s]);
    if (p / block_size >= static_cast<int>(tab.size()))
      return make_error(row(i) + ": position " + std::to_string(p) + " needs block " + std::to_string(p / block_size) +
                        " of sequence " + std::to_string(s) + ", whose block table has " + std::to_string(tab.size()) +
                        " entries");
    (void)num_blocks;  // table entries were range-checked when the edits were applied
  }
  auto check_rows = [&](const char* what, size_t n, auto get) -> Status {
    for (size_t r = 0; r < n; ++r) {
      const int32_t t = get(r);
      if (t < 0 || static_cast<size_t>(t) >= T)
        return make_error(std::string("StepBatch: ") + what + "[" + std::to_string(r) + "] = " + std::to_string(t) +
                          " is not a row of the " + std::to_string(T) + "-token batch");
    }
    return {};
  };
  SS_TRY(check_rows("sample_rows", b.sample_rows.size(), [&](size_t r) { return b.sample_rows[r].token; }));
  SS_TRY(check_rows("score_rows", b.score_rows.size(), [&](size_t r) { return b.score_rows[r].token; }));
  SS_TRY(check_rows("logits_rows", b.logits_rows.size(), [&](size_t r) { return b.logits_rows[r]; }));
  for (size_t r = 0; r < b.sample_rows.size(); ++r) {
    const SampleRow& sr = b.sample_rows[r];
    if (!sr.params) return make_error("StepBatch: sample_rows[" + std::to_string(r) + "] has no sampling parameters");
    for (int32_t id : sr.banned)
      if (id < 0 || id >= vocab) return make_error("StepBatch: sample_rows[" + std::to_string(r) + "] bans id " + std::to_string(id));
  }
  for (size_t r = 0; r < b.score_rows.size(); ++r)
    if (b.score_rows[r].target < 0 || b.score_rows[r].target >= vocab)
      return make_error("StepBatch: score_rows[" + std::to_string(r) + "] scores id " +
                        std::to_string(b.score_rows[r].target) + ", outside the vocabulary");
  return {};
}


namespace {
template <class Copy>
Status check_copies(std::span<const Copy> blocks, int num_blocks, int64_t block_bytes, const std::string& who) {
  for (size_t i = 0; i < blocks.size(); ++i) {
    const Copy& c = blocks[i];
    if (c.block < 0 || c.block >= num_blocks || static_cast<int64_t>(c.bytes.size()) != block_bytes || !c.bytes.data())
      return make_error(who + ": KV block copy " + std::to_string(i) + " of " + std::to_string(blocks.size()) +
                        " (block " + std::to_string(c.block) + ", " + std::to_string(c.bytes.size()) +
                        " bytes): want a block in [0, " + std::to_string(num_blocks) + ") and " +
                        std::to_string(block_bytes) + " bytes; nothing copied");
  }
  return {};
}
}  // namespace

Status check_kv_block_copies(std::span<const KvBlockOut> blocks, int num_blocks, int64_t block_bytes, const std::string& who) {
  return check_copies(blocks, num_blocks, block_bytes, who);
}
Status check_kv_block_copies(std::span<const KvBlockIn> blocks, int num_blocks, int64_t block_bytes, const std::string& who) {
  return check_copies(blocks, num_blocks, block_bytes, who);
}

Status Backend::read_kv_blocks(std::span<const KvBlockOut> blocks) {
  SS_TRY(check_kv_block_copies(blocks, kv_config().num_blocks, kv_block_bytes(), name()));
  for (const KvBlockOut& b : blocks) SS_TRY(read_kv_block(b.block, b.bytes));
  return {};
}

Status Backend::write_kv_blocks(std::span<const KvBlockIn> blocks) {
  SS_TRY(check_kv_block_copies(blocks, kv_config().num_blocks, kv_block_bytes(), name()));
  for (const KvBlockIn& b : blocks) SS_TRY(write_kv_block(b.block, b.bytes));
  return {};
}

}  // namespace ss::backend
