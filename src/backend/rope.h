// Rotary position embedding tables, as Hugging Face computes them (float32 arithmetic, with the
// model's scaling), shared by every backend so their positions rotate alike. Private to backend/.
#pragma once
#include <vector>

#include "model/model.h"

namespace ss::backend {

// Inverse frequencies of the rope_dim / 2 rotary pairs.
std::vector<float> rope_inv_freq(const model::ModelConfig& c, int rope_dim);
// Rows for positions [from, to): each [rope_dim / 2 cos][rope_dim / 2 sin], written to out.
void rope_table(const std::vector<float>& inv_freq, int from, int to, float* out);

}  // namespace ss::backend
