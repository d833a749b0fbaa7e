// AMX-INT8 tile configuration shared by the packed AVX-512 kernels (matmul_q32_avx512.cpp: the
// 32-value block types; matmul_qk_packed_avx512.cpp: the K types). Private to backend/cpu; included
// only by files built with the AVX-512 flags.
#pragma once
#include <immintrin.h>

#include <cstdint>

namespace ss::cpu::detail::avx512 {

struct AmxConfig {
  uint8_t palette, start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};
static_assert(sizeof(AmxConfig) == 64);

#define SS_AMX __attribute__((target("amx-tile,amx-int8")))

// Tiles 0-2 and 3-5 (two blocks' products in flight while the float step of the previous ones runs):
// A (nt tokens x kb activation bytes), B (kb / 4 rows of 64 weight bytes: 16 rows x 4 values),
// C (nt tokens x 16 int32).
SS_AMX inline void amx_configure(int nt, int kb) {
  alignas(64) AmxConfig c{};
  c.palette = 1;
  for (int s = 0; s < 2; ++s) {
    c.rows[3 * s] = static_cast<uint8_t>(nt), c.colsb[3 * s] = static_cast<uint16_t>(kb);
    c.rows[3 * s + 1] = static_cast<uint8_t>(kb / 4), c.colsb[3 * s + 1] = 64;
    c.rows[3 * s + 2] = static_cast<uint8_t>(nt), c.colsb[3 * s + 2] = 64;
  }
  // GCC 12 does not see ldtilecfg read the struct and drops the stores above: make them happen.
  __asm__ __volatile__("" : : "r"(&c) : "memory");
  _tile_loadconfig(&c);
}

}  // namespace ss::cpu::detail::avx512
