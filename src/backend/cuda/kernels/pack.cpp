// Host side of the quantized weight layouts the decode kernels read (kernels.h, DevWeights): GGUF
// rows repacked so that a lane's share of a 32-weight chunk is one aligned word and the scales are an
// array of their own. The values are GGUF's, bit for bit (quants and fp16 scales copied, reordered).
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <string>

#include "backend/cuda/kernels/kernels.h"
#include "backend/cuda/kernels/kquant.h"
#include "model/quant.h"

namespace ss::cuda::kern {

int packed_k(int K) { return (K + 255) / 256 * 256; }

// Both sizes from the bytes a row holds a 256-weight round (pack_geom), the one table of them.
size_t packed_q_bytes(WFormat f, int64_t N, int K) {
  if (f == WFormat::BF16) return static_cast<size_t>(N * K * 2);
  return static_cast<size_t>(N * (packed_k(K) / 256) * pack_geom(f).q);
}

size_t packed_scale_count(WFormat f, int64_t N, int K) {
  if (f == WFormat::BF16) return 0;
  return static_cast<size_t>(N * (packed_k(K) / 256) * pack_geom(f).d / 2);
}

namespace {

// The interleaved order of a lane's 8 nibbles in its word: weights 0, 2, 4, 6 in bits 0-15 (4
// apiece), 1, 3, 5, 7 in bits 16-31, so (word >> 4i) & 0x000F000F holds the pair (2i, 2i + 1).
uint32_t interleave(const uint8_t (&e)[8]) {
  uint32_t w = 0;
  for (int i = 0; i < 4; ++i) {
    w |= static_cast<uint32_t>(e[2 * i] & 0xF) << (4 * i);
    w |= static_cast<uint32_t>(e[2 * i + 1] & 0xF) << (16 + 4 * i);
  }
  return w;
}

// Chunk c's 32 4-bit quants (0..15, in weight order) into the 4-bit layout: lane t's word at
// (c / 4) * 64 + t * 16 + (c % 4) * 4.
void put_q4_chunk(uint8_t* q, int c, const uint8_t (&e)[32]) {
  for (int t = 0; t < 4; ++t) {
    uint8_t lane[8];
    for (int i = 0; i < 8; ++i) lane[i] = e[8 * t + i];
    const uint32_t w = interleave(lane);
    std::memcpy(q + (c / 4) * 64 + t * 16 + (c % 4) * 4, &w, 4);
  }
}
// Chunk c's 32 int8 quants into the 8-bit layout: lane t's 8 at (c / 2) * 64 + t * 16 + (c % 2) * 8.
void put_q8_chunk(uint8_t* q, int c, const int8_t (&e)[32]) {
  for (int t = 0; t < 4; ++t) std::memcpy(q + (c / 2) * 64 + t * 16 + (c % 2) * 8, e + 8 * t, 8);
}

// Q6_K's quant (0..63) of weight i (0..255) of a super-block, as ggml's dequantize_row_q6_K reads it:
// halves of 128; in a half, weight 32 qq + l (qq 0..3) takes the low (qq 0, 1) or high (qq 2, 3)
// nibble of ql[l + 32 (qq % 2)] and bits 2 qq, 2 qq + 1 of qh[l]. Its scale: scales[i / 16].
int q6k_quant(const model::block_q6_K& b, int i) {
  const int h = i / 128, w = i % 128, qq = w / 32, l = w % 32;
  const uint8_t ql = b.ql[64 * h + l + 32 * (qq % 2)];
  const int lo = qq < 2 ? (ql & 0xF) : (ql >> 4);
  const int hi = (b.qh[32 * h + l] >> (2 * qq)) & 3;
  return lo | (hi << 4);
}

}  // namespace

Status pack_row(WFormat f, const void* gguf_row, int K, uint8_t* q, uint16_t* d, uint16_t* m) {
  if (K <= 0 || K % 32 != 0) return make_error("pack_row: K must be a positive multiple of 32");
  const int chunks = K / 32, kp = packed_k(K), pchunks = kp / 32;
  switch (f) {
    case WFormat::BF16: return make_error("pack_row: bf16 rows are not packed");
    case WFormat::Q4_0:
    case WFormat::Q4_1: {
      // Chunk c's 16 bytes: lane t's word at (c / 4) * 64 + t * 16 + (c % 4) * 4.
      std::memset(q, 0, static_cast<size_t>(kp) / 2);
      for (int c = 0; c < pchunks; ++c) {
        d[c] = 0;
        if (m) m[c] = 0;
      }
      for (int c = 0; c < chunks; ++c) {
        uint8_t e[32];
        const uint8_t* qs;
        if (f == WFormat::Q4_0) {
          const auto* b = static_cast<const model::block_q4_0*>(gguf_row) + c;
          qs = b->qs, d[c] = b->d;
        } else {
          const auto* b = static_cast<const model::block_q4_1*>(gguf_row) + c;
          qs = b->qs, d[c] = b->d, m[c] = b->m;
        }
        for (int j = 0; j < 16; ++j) e[j] = qs[j] & 0xF, e[j + 16] = qs[j] >> 4;  // ggml: low nibbles first
        for (int t = 0; t < 4; ++t) {
          uint8_t lane[8];
          for (int i = 0; i < 8; ++i) lane[i] = e[8 * t + i];
          const uint32_t w = interleave(lane);
          std::memcpy(q + (c / 4) * 64 + t * 16 + (c % 4) * 4, &w, 4);
        }
      }
      return {};
    }
    case WFormat::Q5_0:
    case WFormat::Q5_1: {
      // 5-bit quants as int8 (Q5_0: q - 16), ggml's bit order: weight j < 16 the low nibble of qs[j]
      // and bit j of qh, weight j + 16 the high nibble and bit j + 16.
      std::memset(q, 0, static_cast<size_t>(kp));
      for (int c = 0; c < pchunks; ++c) {
        d[c] = 0;
        if (m) m[c] = 0;
      }
      for (int c = 0; c < chunks; ++c) {
        const uint8_t *qs, *qhb;
        if (f == WFormat::Q5_0) {
          const auto* b = static_cast<const model::block_q5_0*>(gguf_row) + c;
          qs = b->qs, qhb = b->qh, d[c] = b->d;
        } else {
          const auto* b = static_cast<const model::block_q5_1*>(gguf_row) + c;
          qs = b->qs, qhb = b->qh, d[c] = b->d, m[c] = b->m;
        }
        uint32_t qh;
        std::memcpy(&qh, qhb, 4);
        int8_t e[32];
        for (int j = 0; j < 16; ++j) {
          const int x0 = (qs[j] & 0xF) | (((qh >> j) & 1) << 4), x1 = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
          e[j] = static_cast<int8_t>(f == WFormat::Q5_0 ? x0 - 16 : x0);
          e[j + 16] = static_cast<int8_t>(f == WFormat::Q5_0 ? x1 - 16 : x1);
        }
        put_q8_chunk(q, c, e);
      }
      return {};
    }
    case WFormat::Q4_K:
    case WFormat::Q5_K:
    case WFormat::Q6_K: {
      if (K % 256 != 0) return make_error("pack_row: K-quant rows need K a multiple of 256");
      const int sb = K / 256;
      std::memset(q, 0, packed_q_bytes(f, 1, K));
      std::memset(d, 0, 2 * packed_scale_count(f, 1, K));
      for (int s = 0; s < sb; ++s) {
        if (f == WFormat::Q4_K) {
          const auto& b = static_cast<const model::block_q4_K*>(gguf_row)[s];
          std::memcpy(d + 8 * s, &b, 16);  // d, dmin, scales[12]
          for (int j = 0; j < 8; ++j) {  // sub-block j: weights 32 j .. 32 j + 31
            uint8_t e[32];
            for (int l = 0; l < 32; ++l) {
              const uint8_t byte = b.qs[32 * (j / 2) + l];
              e[l] = j % 2 == 0 ? (byte & 0xF) : (byte >> 4);
            }
            put_q4_chunk(q, 8 * s + j, e);
          }
        } else if (f == WFormat::Q5_K) {
          const auto& b = static_cast<const model::block_q5_K*>(gguf_row)[s];
          std::memcpy(d + 8 * s, &b, 16);  // d, dmin, scales[12]
          for (int j = 0; j < 8; ++j) {  // sub-block j: nibble j % 2 of qs[32 (j / 2) + l], bit j of qh[l]
            int8_t e[32];
            for (int l = 0; l < 32; ++l) {
              const uint8_t byte = b.qs[32 * (j / 2) + l];
              e[l] = static_cast<int8_t>((j % 2 == 0 ? (byte & 0xF) : (byte >> 4)) | (((b.qh[l] >> j) & 1) << 4));
            }
            put_q8_chunk(q, 8 * s + j, e);
          }
        } else {
          const auto& b = static_cast<const model::block_q6_K*>(gguf_row)[s];
          std::memcpy(d + 16 * s, b.scales, 16);
          d[16 * s + 8] = b.d;
          for (int j = 0; j < 8; ++j) {
            int8_t e[32];
            for (int l = 0; l < 32; ++l) e[l] = static_cast<int8_t>(q6k_quant(b, 32 * j + l) - 32);
            put_q8_chunk(q, 8 * s + j, e);
          }
        }
      }
      return {};
    }
    case WFormat::Q8_0: {
      // Chunk pair p's 64 bytes: lane t's 16 at p * 64 + t * 16 (chunk 2p's 8 quants, then 2p + 1's).
      std::memset(q, 0, static_cast<size_t>(kp));
      for (int c = 0; c < pchunks; ++c) d[c] = 0;
      for (int c = 0; c < chunks; ++c) {
        const auto* b = static_cast<const model::block_q8_0*>(gguf_row) + c;
        d[c] = b->d;
        for (int t = 0; t < 4; ++t) std::memcpy(q + (c / 2) * 64 + t * 16 + (c % 2) * 8, b->qs + 8 * t, 8);
      }
      return {};
    }
  }
  return make_error("pack_row: unknown format");
}

void unpack_row(WFormat f, const uint8_t* q, const uint16_t* d, const uint16_t* m, int K, float (*h2f)(uint16_t),
                float* out) {
  if (is_k_format(f)) {
    for (int c = 0; c < K / 32; ++c) {
      const int s = c / 8, j = c % 8;
      for (int t = 0; t < 4; ++t)
        for (int i = 0; i < 8; ++i) {
          const int l = 8 * t + i;  // weight l of the chunk
          float v;
          if (f == WFormat::Q4_K || f == WFormat::Q5_K) {
            uint8_t hdr[16];
            std::memcpy(hdr, d + 8 * s, 16);
            uint16_t dd, dm;
            std::memcpy(&dd, hdr, 2);
            std::memcpy(&dm, hdr + 2, 2);
            int sc, mn;
            k4_scale_min(j, hdr + 4, &sc, &mn);
            float e;
            if (f == WFormat::Q4_K) {
              uint32_t w;
              std::memcpy(&w, q + (c / 4) * 64 + t * 16 + (c % 4) * 4, 4);
              e = static_cast<float>((w >> ((i % 2) * 16 + 4 * (i / 2))) & 0xF);
            } else {
              e = static_cast<float>(static_cast<int8_t>(q[(c / 2) * 64 + t * 16 + (c % 2) * 8 + i]));
            }
            const float d1 = h2f(dd) * static_cast<float>(sc), m1 = h2f(dm) * static_cast<float>(mn);
            v = d1 * e - m1;
          } else {
            int8_t sc;
            std::memcpy(&sc, reinterpret_cast<const uint8_t*>(d + 16 * s) + 2 * j + l / 16, 1);
            const float d1 = h2f(d[16 * s + 8]) * static_cast<float>(sc);
            v = d1 * static_cast<float>(static_cast<int8_t>(q[(c / 2) * 64 + t * 16 + (c % 2) * 8 + i]));
          }
          out[32 * c + l] = v;
        }
    }
    return;
  }
  for (int c = 0; c < K / 32; ++c) {
    const float dc = h2f(d[c]), mc = has_min_array(f) ? h2f(m[c]) : 0.0f;
    for (int t = 0; t < 4; ++t)
      for (int i = 0; i < 8; ++i) {
        float v;
        if (f == WFormat::Q8_0 || f == WFormat::Q5_0) {
          v = dc * static_cast<float>(static_cast<int8_t>(q[(c / 2) * 64 + t * 16 + (c % 2) * 8 + i]));
        } else if (f == WFormat::Q5_1) {
          v = static_cast<float>(static_cast<int8_t>(q[(c / 2) * 64 + t * 16 + (c % 2) * 8 + i])) * dc + mc;
        } else {
          uint32_t w;
          std::memcpy(&w, q + (c / 4) * 64 + t * 16 + (c % 4) * 4, 4);
          const uint32_t e = (w >> ((i % 2) * 16 + 4 * (i / 2))) & 0xF;
          v = f == WFormat::Q4_0 ? dc * (static_cast<float>(e) - 8.0f) : dc * static_cast<float>(e) + mc;
        }
        out[32 * c + 8 * t + i] = v;
      }
  }
}

size_t packed_bytes(WFormat f, int64_t N, int K) {
  const PackGeom g = pack_geom(f);
  return static_cast<size_t>((N + 7) / 8 * 8 * (packed_k(K) / 256)) * static_cast<size_t>(g.q + g.d + g.m);
}

void to_groups(WFormat f, int64_t N, int K, const uint8_t* q, const uint16_t* d, const uint16_t* m, uint8_t* out) {
  const PackGeom g = pack_geom(f);
  const int64_t rounds = packed_k(K) / 256;
  std::memset(out, 0, packed_bytes(f, N, K));
  // From pack_row's rows (the rows layout) to the groups layout, part by part, where packed_at says.
  const PackedAt from = packed_at(DevWeights{f, q, d, m, false}, K), to = packed_at(DevWeights{f, out, nullptr, nullptr, true}, K);
  auto move = [&](const PartAt& src, const PartAt& dst, int bytes, int64_t r, int64_t R) {
    const ptrdiff_t at = part_at(dst, r, R) - out;  // where packed_at puts it, in the writable buffer
    std::memcpy(out + at, part_at(src, r, R), static_cast<size_t>(bytes));
  };
  for (int64_t r = 0; r < N; ++r)
    for (int64_t R = 0; R < rounds; ++R) {
      move(from.q, to.q, g.q, r, R);
      move(from.d, to.d, g.d, r, R);
      if (g.m > 0) move(from.m, to.m, g.m, r, R);
    }
}

bool groups_layout() {
  static const bool on = [] {
    const char* e = std::getenv("SS_CUDA_QLAYOUT");
    return e == nullptr || std::string(e) != "rows";
  }();
  return on;
}

PackedAt packed_at(const DevWeights& W, int K) {
  const PackGeom g = pack_geom(W.format);
  const int64_t rounds = packed_k(K) / 256;
  const uint8_t* q = static_cast<const uint8_t*>(W.q);
  PackedAt a;
  if (W.groups) {
    const int64_t blk = 8 * (g.q + g.d + g.m);
    a.q = PartAt{q, rounds * blk, g.q, blk};
    a.d = PartAt{q + 8 * g.q, rounds * blk, g.d, blk};
    a.m = PartAt{g.m > 0 ? q + 8 * (g.q + g.d) : nullptr, rounds * blk, g.m, blk};
    return a;
  }
  auto rows = [&](const void* base, int per) {
    return PartAt{static_cast<const uint8_t*>(base), 8 * rounds * per, rounds * per, per};
  };
  a.q = rows(q, g.q), a.d = rows(W.d, g.d), a.m = rows(g.m > 0 ? W.m : nullptr, g.m);
  return a;
}

}  // namespace ss::cuda::kern
