// Private to cpu/: activations quantized per token to 8-bit blocks, laid out in the caller's scratch.
//
// One block of `qblock` (32, or 256 for the K types) values x gets d = amax/127 and
// q = round-to-nearest-even(x * (1/d)), so |x - q d| <= d/2. Every ISA uses exactly these float ops,
// so all paths see bit-identical activations.
//
// Layout: tokens are interleaved in groups of `group` (1 = row-major) at a granularity of 4 bytes, so a
// tiled kernel loads "4 consecutive values of `group` tokens" as one vector: the byte for token t,
// element k lives at ((t/group) * cols/4 + k/4) * group*4 + (t%group)*4 + k%4. Per-block scalars
// live at ((t/group) * nb + b) * group + t%group. Tokens padding the last group are all zero.
#pragma once
#include <cstddef>
#include <cstdint>

#include "backend/cpu/side_prefetch.h"

namespace ss::cpu::detail {

struct QActs {
  int group = 1;
  int n_tok = 0;
  int64_t cols = 0;
  int qblock = 32;
  int8_t* qs = nullptr;
  float* d = nullptr;       // block scale
  float* s = nullptr;       // d * sum(q): the min term of Q4_1/Q5_1
  int32_t* corr = nullptr;  // C * sum(q): undoes a weight encoding stored as w + C (unsigned for VNNI)
  int16_t* bsum = nullptr;  // sum(q) per 16 values (K types; group 1 only)
  // Not about the activations: the lines this call's thread prefetches for a later operation as it
  // goes (side_prefetch.h; the packed VNNI, AVX2 and AMX kernels; null: none).
  SideCursor* side = nullptr;

  int64_t nb() const { return cols / qblock; }
  int n_pad() const { return (n_tok + group - 1) / group * group; }
  int64_t qidx(int t, int64_t k) const {
    return ((t / group) * (cols / 4) + k / 4) * group * 4 + (t % group) * 4 + k % 4;
  }
  int64_t sidx(int t, int64_t b) const { return ((t / group) * nb() + b) * group + t % group; }
};

constexpr int kMaxGroup = 16;
constexpr size_t kAlign = 64;

inline size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// Bytes for any group <= kMaxGroup and qblock >= 32, including alignment and a 64-byte tail after qs
// (kernels may load one vector past a row's last block and discard it).
inline size_t qacts_bytes(int64_t cols, int n_tok) {
  const size_t np = static_cast<size_t>((n_tok + kMaxGroup - 1) / kMaxGroup * kMaxGroup);
  const size_t nb = static_cast<size_t>(cols / 32), c = static_cast<size_t>(cols);
  return kAlign + align_up(np * c + 64) + 3 * align_up(np * nb * 4) + align_up(np * (c / 16) * 2);
}

inline QActs carve_qacts(void* buf, int64_t cols, int n_tok, int group, int qblock) {
  QActs a;
  a.group = group;
  a.n_tok = n_tok;
  a.cols = cols;
  a.qblock = qblock;
  const size_t np = static_cast<size_t>(a.n_pad()), nb = static_cast<size_t>(a.nb());
  auto p = (reinterpret_cast<uintptr_t>(buf) + kAlign - 1) / kAlign * kAlign;
  a.qs = reinterpret_cast<int8_t*>(p);
  p += align_up(np * static_cast<size_t>(cols) + 64);
  a.d = reinterpret_cast<float*>(p);
  p += align_up(np * nb * 4);
  a.s = reinterpret_cast<float*>(p);
  p += align_up(np * nb * 4);
  a.corr = reinterpret_cast<int32_t*>(p);
  p += align_up(np * nb * 4);
  a.bsum = reinterpret_cast<int16_t*>(p);
  return a;
}

}  // namespace ss::cpu::detail

namespace ss::cpu::detail {
// The one scale rule (see the top of this file); returns d and sets *id = 1/d (0 for an all-zero block).
inline float act_scale(float amax, float* id) {
  const float d = amax / 127.0f;
  *id = d != 0.0f ? 1.0f / d : 0.0f;
  return d;
}
}  // namespace ss::cpu::detail
