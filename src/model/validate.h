// Value checks over mapped weights (LoadOptions::check_values): every element must be finite.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/model.h"
#include "model/weights.h"

namespace ss::model {

struct CheckItem {
  const Tensor* tensor;
  const std::string* file;  // for messages
};

// Dequantizes every row and reports the first NaN/Inf as "<file>: tensor X: NaN at row r, column c".
// Runs on the calling thread plus one helper; progress(done_bytes, total_bytes) is called from the
// calling thread only.
Status check_values(const std::vector<CheckItem>& items, const std::function<void(uint64_t, uint64_t)>& progress);

// The tensors of `tensors` that `w` uses (a tied output once), in file-name order.
std::vector<CheckItem> check_items(const Weights& w, const TensorMap& tensors);

}  // namespace ss::model
