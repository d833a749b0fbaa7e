#include "backend/rope.h"

#include <cmath>
#include <numbers>

namespace ss::backend {

// Inverse RoPE frequencies as Hugging Face computes them (float32 arithmetic), with scaling.
std::vector<float> rope_inv_freq(const model::ModelConfig& c, int rope_dim) {
  std::vector<float> inv(rope_dim / 2);
  const float base = c.rope_theta;
  for (int i = 0; i < rope_dim / 2; ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(rope_dim);
    inv[i] = 1.0f / std::pow(base, e);
  }
  const auto& rs = c.rope_scaling;
  if (rs.kind == model::RopeScaling::Kind::Linear && rs.factor > 0) {
    for (float& f : inv) f /= rs.factor;
  } else if (rs.kind == model::RopeScaling::Kind::Llama3) {
    const float old_ctx = static_cast<float>(rs.original_max_position);
    const float low_wavelen = old_ctx / rs.low_freq_factor;
    const float high_wavelen = old_ctx / rs.high_freq_factor;
    for (float& f : inv) {
      const float wavelen = 2.0f * std::numbers::pi_v<float> / f;
      if (wavelen > low_wavelen) {
        f = f / rs.factor;
      } else if (!(wavelen < high_wavelen)) {
        const float smooth = (old_ctx / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor);
        f = (1.0f - smooth) * f / rs.factor + smooth * f;
      }
    }
  }
  return inv;
}

void rope_table(const std::vector<float>& inv_freq, int from, int to, float* out) {
  const int half = static_cast<int>(inv_freq.size());
  for (int p = from; p < to; ++p) {
    float* cs = out + static_cast<size_t>(p - from) * 2 * half;
    for (int i = 0; i < half; ++i) {
      const float angle = static_cast<float>(p) * inv_freq[i];  // fp32 product, as HF does
      cs[i] = static_cast<float>(std::cos(static_cast<double>(angle)));
      cs[half + i] = static_cast<float>(std::sin(static_cast<double>(angle)));
    }
  }
}

}  // namespace ss::backend
