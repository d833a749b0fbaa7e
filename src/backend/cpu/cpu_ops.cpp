// Baseline (no -m flags) build of the forward kernels, and the run-time choice among the ISAs.
#include "backend/cpu/cpu_ops_impl.h"

namespace ss::cpu::ops {

size_t attn_scratch_floats(int head_dim) {
  // Per micro-tile of at most kMultiRows rows (attention's tiles have 8 or fewer):
  // S [rows][kPassChunks * 16], O [rows][head_dim], q^T [head_dim][rows].
  static_assert(kMultiRows >= 8);
  return static_cast<size_t>(kMultiRows) * (kPassChunks * kKeyChunk + 2 * head_dim) + 64;
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
