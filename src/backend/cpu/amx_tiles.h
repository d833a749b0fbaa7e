// AMX-INT8 tile configuration shared by the packed AVX-512 kernels (matmul_q32_avx512.cpp: the
// 32-value block types; matmul_qk_packed_avx512.cpp: the K types). Private to backend/cpu; included
// only by files built with the AVX-512 flags.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "backend/cpu/kernels_internal.h"

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

// The walk both kernels share: packed row groups [g0, g1), each in passes of up to `per_pass`
// tokens (tiles configured for the pass's token count), the first pass of a group fetching the next
// group ahead; pass(gp, o0, keep, t0, nt, pf) runs one pass (gp: the group's bytes, o0: its first
// output row, keep: its rows' lanes, pf: the next group's bytes to prefetch, or null).
template <class Pass>
SS_AMX inline void amx_walk_groups(const PackedMatrix& P, int n_tok, int per_pass, int kb, int64_t g0, int64_t g1,
                                   Pass&& pass) {
  int configured = 0;
  for (int64_t g = g0; g < g1; ++g) {
    const uint8_t* gp = P.data + g * P.group_bytes;
    const int64_t o0 = g * kPackRows;
    const int nr = static_cast<int>(std::min<int64_t>(kPackRows, P.rows - o0));
    const __mmask16 keep = static_cast<__mmask16>((1u << nr) - 1);
    for (int t = 0; t < n_tok; t += per_pass) {
      const int nt = std::min(per_pass, n_tok - t);
      if (nt != configured) amx_configure(configured = nt, kb);
      pass(gp, o0, keep, t, nt, t == 0 && g + 1 < g1 ? gp + P.group_bytes : nullptr);
    }
  }
  if (configured) _tile_release();
}

}  // namespace ss::cpu::detail::avx512
