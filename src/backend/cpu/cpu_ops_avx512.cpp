// AVX-512 build of the forward kernels (CMake adds -mavx512f ... to *_avx512.cpp).
#include "backend/cpu/cpu_ops_impl.h"

namespace ss::cpu::ops {

const OpsTable& ops_avx512() {
  static const OpsTable t = make_table("avx512");
  return t;
}

}  // namespace ss::cpu::ops
