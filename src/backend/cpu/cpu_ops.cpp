// Baseline (no -m flags) build of the forward kernels, and the run-time choice among the ISAs.
#include "backend/cpu/cpu_ops_impl.h"

namespace ss::cpu::ops {

size_t attn_scratch_floats(int head_dim) {
  // Per micro-tile of at most 12 rows (8, or attention_token's groups of up to 3 x 4 query heads):
  // S [12][kPassChunks * 16], O [12][head_dim], q^T [head_dim][12].
  return static_cast<size_t>(12) * (kPassChunks * kKeyChunk + 2 * head_dim) + 64;
}

const OpsTable& ops_scalar() {
  static const OpsTable t = make_table("scalar");
  return t;
}

const OpsTable& ops_for(Isa isa) {
  switch (isa) {
    case Isa::Avx512: return ops_avx512();
    case Isa::Avx2: return ops_avx2();
    case Isa::Scalar: break;
  }
  return ops_scalar();
}

}  // namespace ss::cpu::ops
