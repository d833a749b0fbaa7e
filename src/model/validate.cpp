#include "model/validate.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <mutex>
#include <set>
#include <system_error>
#include <thread>

namespace ss::model {

namespace {

struct Chunk {
  size_t item;
  int64_t row_begin, row_end;
};

constexpr int64_t kChunkElems = 1 << 18;  // small enough to balance two threads, big enough to be cheap

}  // namespace

std::vector<CheckItem> check_items(const Weights& w, const TensorMap& tensors) {
  std::set<const void*> used;
  auto add = [&](const Tensor& t) {
    if (t.valid()) used.insert(t.data);
  };
  add(w.token_embd);
  add(w.output_norm);
  add(w.output);
  for (const auto& l : w.layers)
    for (const Tensor* t : {&l.attn_norm, &l.wq, &l.wk, &l.wv, &l.wo, &l.bq, &l.bk, &l.bv, &l.q_norm, &l.k_norm,
                            &l.ffn_norm, &l.w_gate, &l.w_up, &l.w_down})
      add(*t);
  std::vector<CheckItem> out;
  for (const auto& [name, st] : tensors)
    if (used.count(st.tensor.data)) {
      out.push_back({&st.tensor, st.file});
      used.erase(st.tensor.data);
    }
  return out;
}

Status check_values(const std::vector<CheckItem>& items, const std::function<void(uint64_t, uint64_t)>& progress) {
  std::vector<Chunk> chunks;
  uint64_t total = 0;
  int64_t max_cols = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const Tensor& t = *items[i].tensor;
    if (t.numel() == 0) continue;
    max_cols = std::max(max_cols, t.cols());
    const int64_t rows_per = std::max<int64_t>(1, kChunkElems / t.cols());
    for (int64_t r = 0; r < t.rows(); r += rows_per) chunks.push_back({i, r, std::min(t.rows(), r + rows_per)});
    total += t.nbytes;
  }

  std::atomic<size_t> next{0};
  std::atomic<uint64_t> done{0};
  std::mutex mu;
  size_t bad_chunk = std::numeric_limits<size_t>::max();  // earliest failing chunk wins: deterministic
  std::string bad_msg;

  auto work = [&](bool report) {
    std::vector<float> row(static_cast<size_t>(max_cols));
    for (size_t c; (c = next.fetch_add(1)) < chunks.size();) {
      {
        std::lock_guard<std::mutex> lock(mu);
        if (c > bad_chunk) return;
      }
      const Chunk& ch = chunks[c];
      const Tensor& t = *items[ch.item].tensor;
      for (int64_t r = ch.row_begin; r < ch.row_end; ++r) {
        dequantize_row(t.type, t.row(r), row.data(), t.cols());
        for (int64_t k = 0; k < t.cols(); ++k) {
          const float v = row[static_cast<size_t>(k)];
          if (std::isfinite(v)) continue;
          std::lock_guard<std::mutex> lock(mu);
          if (c < bad_chunk) {
            bad_chunk = c;
            bad_msg = *items[ch.item].file + ": tensor " + t.name + ": " + (std::isnan(v) ? "NaN" : "Inf") +
                      " at row " + std::to_string(r) + ", column " + std::to_string(k);
          }
          return;
        }
      }
      const uint64_t bytes = static_cast<uint64_t>(ch.row_end - ch.row_begin) * t.row_stride();
      const uint64_t d = done.fetch_add(bytes) + bytes;
      if (report && progress) progress(d, total);
    }
  };

  const bool two = std::thread::hardware_concurrency() > 1 && chunks.size() > 1;
  std::thread helper;
  try {
    if (two) helper = std::thread(work, false);
  } catch (const std::system_error&) {
    // no second thread: the caller does all the work
  }
  work(true);
  if (helper.joinable()) helper.join();
  if (!bad_msg.empty()) return make_error(bad_msg);
  if (progress) progress(total, total);
  return {};
}

}  // namespace ss::model
