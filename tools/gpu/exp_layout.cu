// Which weight layout the packed decode kernels can stream at DRAM speed (docs/perf/gpu.md,
// 2026-12-07). Under ncu (H100, 8B Q4_0, batch 1) the fused Q4_0 gate/up kernel reads 54-58% of
// DRAM peak where the bf16 one, the same loop over the same tiles, reads 81%; three CTAs a SM
// instead of two (more warps, more loads in flight) changed nothing. What differs is the access
// pattern: a warp's round of a Q4_0 tile reads 16 rows x 128 bytes of nibbles, 2,304 bytes apart,
// plus 16 rows x 16 bytes of scales from a second array, where bf16 reads 16 rows x 512 bytes.
//
// This experiment times the loads alone (no arithmetic: every word is folded into an XOR), with
// dec_k's grid (two CTAs of 8 warps a SM), tiles (16 rows), split (S warps a tile over K) and
// rounds (8 chunks of 32 weights), over a gate/up-sized matrix (28,672 x 4,096), four copies
// rotated so that no rep finds its weights in L2:
//   q4-rows       dec_k's Q4_0 layout today: row-major nibbles, scales in their own row-major array
//   q4-rows-nosc  the same without the scale loads
//   q4-tiles      each (tile, round) block contiguous: 16 rows x 128 bytes of nibbles, then their
//                 16 x 16 bytes of scales (2,304 bytes), a tile's rounds one after another
//   q4-tiles-2r   q4-tiles with both of a warp's rounds requested before either is consumed
//   q4-groups8    each (8-row group, round) block contiguous (1,152 bytes), a group's rounds one
//                 after another: a tile reads two such blocks a round, a group's length apart (a
//                 layout that needs no op's tile map: gate/up's and QKV's tiles are two groups)
//   bf16-rows     dec_k's bf16 layout (16 rows x 512 bytes a round), for calibration
// and a plain copy-sized streaming read (every thread 16-byte vectors, grid-stride) as the peak.
// Prints GB/s and the share of that streaming read for each.
//
// usage: exp_layout [reps] (default 50)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "exp_util.cuh"

namespace {

constexpr int kWarps = 8, kThreads = 256;
constexpr int kRows = 28672, kK = 4096, kChunks = kK / 32, kRoundChunks = 8;
constexpr int kRounds = kChunks / kRoundChunks;  // 16 a row
constexpr int kTiles = kRows / 16;
constexpr int64_t kNibRow = kK / 2, kScRow = kChunks * 2;  // bytes a row: 2,048 and 256
constexpr int64_t kQ4Bytes = static_cast<int64_t>(kRows) * (kNibRow + kScRow);
constexpr int64_t kBfBytes = static_cast<int64_t>(kRows) * kK * 2;
constexpr int kBlock = 16 * 128 + 16 * 16;  // a (tile, round) block of q4-tiles


enum class Mode { RowsSc, RowsNoSc, Tiles, Tiles2, Groups8, Bf16 };

// dec_k's walk: warp slot (cta, tw) takes tiles tb + tw, tb + tw + tstride, ...; warp sub of the
// tile's S takes rounds [sub R / S, (sub + 1) R / S).
template <Mode M>
__global__ void __launch_bounds__(kThreads, 2) walk(const uint8_t* base, int S, uint32_t* sink) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int TPC = kWarps / S, sub = warp % S, tw = warp / S;
  const int rpw = kRounds / S;
  uint32_t acc = 0;
  // One round in flight a warp, consumed before the next is requested, as in dec_k (unroll 1: the
  // compiler would otherwise hoist later rounds' loads).
#pragma unroll 1
  for (int tile = blockIdx.x * TPC + tw; tile < kTiles; tile += gridDim.x * TPC) {
    const int r0 = tile * 16 + g, r1 = r0 + 8;
    if constexpr (M == Mode::Bf16) {
      const uint4* pa = reinterpret_cast<const uint4*>(base + static_cast<int64_t>(r0) * kK * 2) + t;
      const uint4* pb = reinterpret_cast<const uint4*>(base + static_cast<int64_t>(r1) * kK * 2) + t;
#pragma unroll 1
      for (int rd = sub * rpw; rd < (sub + 1) * rpw; ++rd) {
        uint4 a[8], b[8];
#pragma unroll
        for (int u = 0; u < 8; ++u) {
          const int c = rd * 8 + u;
          a[u] = ld_stream(pa + 4 * c), b[u] = ld_stream(pb + 4 * c);
        }
#pragma unroll
        for (int u = 0; u < 8; ++u) acc ^= fold(a[u]) ^ fold(b[u]);
      }
    } else if constexpr (M == Mode::Groups8) {
      constexpr int kG = 8 * 128 + 8 * 16;
      const uint8_t* ga = base + static_cast<int64_t>(2 * tile) * kRounds * kG;
      const uint8_t* gb = ga + static_cast<int64_t>(kRounds) * kG;
#pragma unroll 1
      for (int rd = sub * rpw; rd < (sub + 1) * rpw; ++rd) {
        const uint8_t* ba = ga + static_cast<int64_t>(rd) * kG;
        const uint8_t* bb = gb + static_cast<int64_t>(rd) * kG;
        uint4 v[6];
#pragma unroll
        for (int h = 0; h < 2; ++h) v[2 * h] = ld_stream(ba + g * 128 + (h * 4 + t) * 16), v[2 * h + 1] = ld_stream(bb + g * 128 + (h * 4 + t) * 16);
        v[4] = ld_stream(ba + 1024 + g * 16), v[5] = ld_stream(bb + 1024 + g * 16);
#pragma unroll
        for (int i = 0; i < 6; ++i) acc ^= fold(v[i]);
      }
    } else if constexpr (M == Mode::Tiles || M == Mode::Tiles2) {
      const uint8_t* tb = base + static_cast<int64_t>(tile) * kRounds * kBlock;
      auto load = [&](int rd, uint4 (&v)[6]) {
        const uint8_t* blk = tb + static_cast<int64_t>(rd) * kBlock;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          v[2 * h] = ld_stream(blk + g * 128 + (h * 4 + t) * 16);
          v[2 * h + 1] = ld_stream(blk + (g + 8) * 128 + (h * 4 + t) * 16);
        }
        v[4] = ld_stream(blk + 2048 + g * 16), v[5] = ld_stream(blk + 2048 + (g + 8) * 16);
      };
      int rd = sub * rpw;
      const int end = (sub + 1) * rpw;
      if constexpr (M == Mode::Tiles2) {
#pragma unroll 1
        for (; rd + 1 < end; rd += 2) {
          uint4 v[6], w[6];
          load(rd, v), load(rd + 1, w);
#pragma unroll
          for (int i = 0; i < 6; ++i) acc ^= fold(v[i]) ^ fold(w[i]);
        }
      }
#pragma unroll 1
      for (; rd < end; ++rd) {
        uint4 v[6];
        load(rd, v);
#pragma unroll
        for (int i = 0; i < 6; ++i) acc ^= fold(v[i]);
      }
    } else {
      const uint8_t* nib = base;
      const uint8_t* sc = base + static_cast<int64_t>(kRows) * kNibRow;
      const uint4* pa = reinterpret_cast<const uint4*>(nib + static_cast<int64_t>(r0) * kNibRow) + t;
      const uint4* pb = reinterpret_cast<const uint4*>(nib + static_cast<int64_t>(r1) * kNibRow) + t;
      const uint4* da = reinterpret_cast<const uint4*>(sc + static_cast<int64_t>(r0) * kScRow);
      const uint4* db = reinterpret_cast<const uint4*>(sc + static_cast<int64_t>(r1) * kScRow);
#pragma unroll 1
      for (int rd = sub * rpw; rd < (sub + 1) * rpw; ++rd) {
        const int c0 = rd * 8;
        uint4 v[6];
#pragma unroll
        for (int h = 0; h < 2; ++h) v[2 * h] = ld_stream(pa + 4 * (c0 / 4 + h)), v[2 * h + 1] = ld_stream(pb + 4 * (c0 / 4 + h));
        if constexpr (M == Mode::RowsSc) {
          v[4] = ld_stream(da + c0 / 8), v[5] = ld_stream(db + c0 / 8);
        } else {
          v[4] = v[5] = make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int i = 0; i < 6; ++i) acc ^= fold(v[i]);
      }
    }
  }
  if (acc == 0x9e3779b9u) sink[blockIdx.x * kThreads + threadIdx.x] = acc;  // keeps the loads
}

// The peak: every thread reads 16-byte vectors, grid-stride, 4 in flight.
__global__ void __launch_bounds__(kThreads) stream_read(const uint4* p, int64_t n, uint32_t* sink) {
  uint32_t acc = 0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    const uint4 a = ld_stream(p + i), b = ld_stream(p + i + stride), c = ld_stream(p + i + 2 * stride),
                d = ld_stream(p + i + 3 * stride);
    acc ^= fold(a) ^ fold(b) ^ fold(c) ^ fold(d);
  }
  for (; i < n; i += stride) acc ^= fold(ld_stream(p + i));
  if (acc == 0x9e3779b9u) sink[blockIdx.x * kThreads + threadIdx.x] = acc;
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::max(1, std::atoi(argv[1])) : 50;
  int dev = 0, sms = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, dev));
  constexpr int kCopies = 4;
  const int64_t bytes = std::max(kQ4Bytes, kBfBytes);
  uint8_t* buf = nullptr;
  uint32_t* sink = nullptr;
  CK(cudaMalloc(&buf, bytes * kCopies));
  CK(cudaMalloc(&sink, static_cast<size_t>(sms) * 8 * kThreads * sizeof(uint32_t)));
  CK(cudaMemset(buf, 0x5a, bytes * kCopies));
  const int grid = 2 * sms;
  // Median of reps timed launches, each on the next copy (warm-up first).
  auto time_us = [&](auto&& launch) {
    return median_us(nullptr, 4, reps, [&](int i) { launch(buf + (i % kCopies) * bytes); });
  };
  std::printf("exp_layout: %s, %d SMs, %d reps, matrix %d x %d (Q4_0 %.1f MB, bf16 %.1f MB), grid %d x %d\n",
              prop.name, sms, reps, kRows, kK, kQ4Bytes / 1e6, kBfBytes / 1e6, grid, kThreads);
  const float peak_us = time_us([&](const uint8_t* p) {
    stream_read<<<sms * 8, kThreads>>>(reinterpret_cast<const uint4*>(p), kQ4Bytes / 16, sink);
  });
  CK(cudaGetLastError());
  const double peak = kQ4Bytes / (peak_us * 1e-6) / 1e9;
  std::printf("%-14s %2s %9s %9s %8s\n", "layout", "S", "us", "GB/s", "of peak");
  std::printf("%-14s %2s %9.2f %9.1f %7.1f%%\n", "stream-read", "-", peak_us, peak, 100.0);
  auto row = [&](const char* name, int S, int64_t nbytes, auto kern) {
    const float us = time_us([&](const uint8_t* p) { kern<<<grid, kThreads>>>(p, S, sink); });
    CK(cudaGetLastError());
    const double gbs = nbytes / (us * 1e-6) / 1e9;
    std::printf("%-14s %2d %9.2f %9.1f %7.1f%%\n", name, S, us, gbs, 100.0 * gbs / peak);
  };
  for (int S : {8, 4}) {
    row("q4-rows", S, kQ4Bytes, walk<Mode::RowsSc>);
    row("q4-rows-nosc", S, static_cast<int64_t>(kRows) * kNibRow, walk<Mode::RowsNoSc>);
    row("q4-tiles", S, kQ4Bytes, walk<Mode::Tiles>);
    row("q4-tiles-2r", S, kQ4Bytes, walk<Mode::Tiles2>);
    row("q4-groups8", S, kQ4Bytes, walk<Mode::Groups8>);
    row("bf16-rows", S, kBfBytes, walk<Mode::Bf16>);
  }
  CK(cudaFree(buf));
  CK(cudaFree(sink));
  return 0;
}
