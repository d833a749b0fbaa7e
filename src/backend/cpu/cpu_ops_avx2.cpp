// AVX2+FMA build of the forward kernels (CMake adds -mavx2 -mfma -mf16c to *_avx2.cpp).
#include "backend/cpu/cpu_ops_impl.h"

namespace ss::cpu::ops {

const OpsTable& ops_avx2() {
  static const OpsTable t = make_table("avx2");
  return t;
}

}  // namespace ss::cpu::ops
