// Run-time ISA selection and the public entry points.
#include "backend/cpu/kernels.h"

#include <cpuid.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include <sys/syscall.h>
#include <unistd.h>

#include "backend/cpu/kernels_internal.h"

namespace ss::cpu {

namespace {

// CPUID.1:ECX.F16C directly: clang's __builtin_cpu_supports has no "f16c" (GCC's has).
bool has_f16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}

Isa detect() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vnni"))
    return Isa::Avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c()) return Isa::Avx2;
  return Isa::Scalar;
}

std::atomic<int> g_forced{-1};

// SS_CPU_ISA=scalar|avx2|avx512 lowers the default (never above what the CPU has): CI runs the AVX2
// kernels on an AVX-512 machine this way. Anything else is reported once and ignored.
Isa default_isa() {
  static const Isa isa = [] {
    const Isa d = detected_isa();
    const char* e = std::getenv("SS_CPU_ISA");
    if (!e || !*e) return d;
    Isa want;
    if (!parse_isa(e, &want)) {
      std::fprintf(stderr, "SS_CPU_ISA=%s: not one of scalar, avx2, avx512; using %s\n", e, isa_name(d));
      return d;
    }
    return static_cast<int>(want) <= static_cast<int>(d) ? want : d;
  }();
  return isa;
}

// AMX-INT8 needs the CPU bits (CPUID.(7,0):EDX AMX-TILE 24, AMX-INT8 25) and, on Linux, the
// process's request for the tile data state (arch_prctl ARCH_REQ_XCOMP_PERM), granted once for all
// its threads. Where either fails, AMX is simply not used.
bool detect_amx() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 24)) || !(d & (1u << 25))) return false;
#if defined(__linux__) && defined(SYS_arch_prctl)
  constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}

// An optional instruction path where the CPU has it: forced on or off by tests and benchmarks, else
// on unless its environment variable is "0" (read on first use).
class PathSwitch {
 public:
  explicit PathSwitch(const char* env) : env_(env) {}
  bool on() const {
    const int f = forced_.load(std::memory_order_relaxed);
    if (f >= 0) return f == 1;
    std::call_once(once_, [this] {
      const char* e = std::getenv(env_);
      by_env_ = !(e && std::strcmp(e, "0") == 0);
    });
    return by_env_;
  }
  void force(bool on) { forced_.store(on ? 1 : 0, std::memory_order_relaxed); }
  void clear() { forced_.store(-1, std::memory_order_relaxed); }

 private:
  const char* env_;
  std::atomic<int> forced_{-1};  // -1: the environment decides; 0 / 1: forced
  mutable std::once_flag once_;
  mutable bool by_env_ = true;
};

PathSwitch g_amx("SS_CPU_AMX"), g_gfni("SS_CPU_GFNI");

}  // namespace

bool amx_available() {
  static const bool ok = detect_amx();
  return ok;
}

bool amx_active() {
  if (active_isa() != Isa::Avx512 || !amx_available()) return false;
  return g_amx.on();
}

void force_amx(bool on) { g_amx.force(on); }

void clear_forced_amx() { g_amx.clear(); }

bool gfni_available() {
  static const bool ok = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (c & (1u << 8)) != 0;  // CPUID.7.0:ECX.GFNI
  }();
  return ok;
}

bool gfni_active() { return gfni_available() && g_gfni.on(); }

void force_gfni(bool on) { g_gfni.force(on); }

void clear_forced_gfni() { g_gfni.clear(); }

bool parse_isa(std::string_view s, Isa* out) {
  for (Isa i : {Isa::Scalar, Isa::Avx2, Isa::Avx512})
    if (s == isa_name(i)) {
      *out = i;
      return true;
    }
  return false;
}

Isa detected_isa() {
  static const Isa isa = detect();
  return isa;
}

Isa active_isa() {
  const int f = g_forced.load(std::memory_order_relaxed);
  return f < 0 ? default_isa() : static_cast<Isa>(f);
}

void force_isa(Isa isa) {
  // Never run code the CPU cannot execute: clamp to what was detected.
  const Isa d = detected_isa();
  g_forced.store(static_cast<int>(static_cast<int>(isa) <= static_cast<int>(d) ? isa : d),
                 std::memory_order_relaxed);
}

void clear_forced_isa() { g_forced.store(-1, std::memory_order_relaxed); }

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Scalar: return "scalar";
    case Isa::Avx2: return "avx2";
    case Isa::Avx512: return "avx512";
  }
  return "?";
}

size_t matmul_scratch_bytes(model::DType wtype, int64_t cols, int n_tok) {
  if (detail::is_float_type(wtype) || n_tok <= 0) return 0;
  return detail::qacts_bytes(cols, n_tok);
}

namespace {

const detail::KernelSet* kernel_set(Isa isa) {
  static const detail::KernelSet avx512{detail::avx512::act_group, detail::avx512::quantize,
                                        detail::avx512::rows_q32, detail::avx512::rows_qk,
                                        detail::avx512::rows_f};
  static const detail::KernelSet avx2{detail::avx2::act_group, detail::avx2::quantize, detail::avx2::rows_q32,
                                      detail::avx2::rows_qk, detail::avx2::rows_f};
  switch (isa) {
    case Isa::Avx512: return &avx512;
    case Isa::Avx2: return &avx2;
    default: return nullptr;
  }
}

// Rows per work unit: a multiple of every kernel's row tile (at most 16), so threads never share a tile.
constexpr int64_t kRowGrain = 16;
// Below this many activation values one thread quantizes; waking the pool costs more.
constexpr int64_t kParallelQuantize = 1 << 15;

// A caller bug: fail loudly, never overrun.
void check_scratch(const char* fn, const model::Tensor& W, MatmulScratch scratch, int n_tok) {
  const size_t need = matmul_scratch_bytes(W.type, W.cols(), n_tok);
  if (scratch.bytes >= need) return;
  std::fprintf(stderr, "ss::cpu::%s(%s): scratch %zu bytes < matmul_scratch_bytes() = %zu\n", fn, W.name.c_str(),
               scratch.bytes, need);
  std::abort();
}

int64_t packed_groups(int64_t rows) { return (rows + detail::kPackRows - 1) / detail::kPackRows; }

}  // namespace

void matmul(const model::Tensor& W, const float* x, int n_tok, int64_t ldx, float* y, int64_t ldy,
            MatmulScratch scratch, ThreadPool& pool) {
  if (n_tok <= 0 || W.rows() <= 0) return;
  const detail::KernelSet* ks = kernel_set(active_isa());
  if (!ks) return detail::matmul_scalar(W, x, n_tok, ldx, y, ldy, scratch, pool);
  const model::DType wt = W.type;
  const int64_t rows = W.rows();
  if (detail::is_float_type(wt)) {
    pool.parallel_for(rows, kRowGrain,
                      [&](int64_t r0, int64_t r1, int) { ks->rows_f(W, x, ldx, n_tok, y, ldy, r0, r1); });
    return;
  }
  check_scratch("matmul", W, scratch, n_tok);
  const bool k = detail::is_k_type(wt);
  const detail::QActs a = detail::carve_qacts(scratch.buf, W.cols(), n_tok, ks->act_group(wt, n_tok),
                                              detail::is_k_type(wt) ? model::QK_K : 32);
  if (n_tok * W.cols() < kParallelQuantize) {
    ks->quantize(wt, x, ldx, 0, a.n_pad(), a);
  } else {
    pool.parallel_for(a.n_pad(), a.group, [&](int64_t t0, int64_t t1, int) {
      ks->quantize(wt, x, ldx, static_cast<int>(t0), static_cast<int>(t1), a);
    });
  }
  const auto rows_fn = k ? ks->rows_qk : ks->rows_q32;
  pool.parallel_for(rows, kRowGrain, [&](int64_t r0, int64_t r1, int) { rows_fn(W, a, y, ldy, r0, r1); });
}

size_t packed_bytes(const model::Tensor& W) {
  const detail::PackedFormat f = detail::packed_format(W.type);
  if (!detail::has_packed_kernel(W.type, active_isa()) || W.rows() <= 0 || W.cols() % f.values != 0) return 0;
  return (static_cast<size_t>(packed_groups(W.rows())) * (W.cols() / f.values) * f.block_bytes + 63) / 64 * 64;
}

namespace {

// One row's super-block `blk` of a K type into the packed block at dst, lane r (kernels_internal.h).
void pack_k_row(model::DType t, const uint8_t* blk, int r, uint8_t* dst) {
  uint8_t q[256];
  if (t == model::DType::Q4_K || t == model::DType::Q5_K) {
    // Q5_K is Q4_K's super-block with 32 bytes of 5th bits (qh) before the nibbles.
    const bool five = t == model::DType::Q5_K;
    const uint8_t* qs = blk + (five ? 48 : 16);
    std::memcpy(dst + 2 * r, blk, 2);
    std::memcpy(dst + 32 + 2 * r, blk + 2, 2);
    const uint8_t* s = blk + 4;
    for (int j = 0; j < 8; ++j) {  // ggml get_scale_min_k4
      const int sc = j < 4 ? s[j] & 63 : (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
      const int mn = j < 4 ? s[j + 4] & 63 : (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
      dst[64 + 16 * j + r] = static_cast<uint8_t>(sc);
      dst[192 + 32 * (j / 2) + 2 * r + j % 2] = static_cast<uint8_t>(mn);
      for (int l = 0; l < 32; ++l) {
        const uint8_t b = qs[32 * (j / 2) + l];
        q[32 * j + l] = static_cast<uint8_t>((j % 2 ? b >> 4 : b & 15) | (five ? ((blk[16 + l] >> j) & 1) << 4 : 0));
      }
    }
    for (int j = 0; j < 8; ++j)
      for (int i = 0; i < 4; ++i) {
        int bits = 0;  // bit v: 5th bit of value 32j + 4v + i; bit 4 + v: of value 32j + 16 + 4v + i
        for (int v = 0; v < 4; ++v) {
          const int lo = q[32 * j + 4 * v + i], hi = q[32 * j + 16 + 4 * v + i];
          dst[320 + 256 * j + 64 * v + 4 * r + i] = static_cast<uint8_t>((lo & 15) | (hi & 15) << 4);
          bits |= (lo >> 4) << v | (hi >> 4) << (4 + v);
        }
        if (five) dst[2368 + 64 * j + 4 * r + i] = static_cast<uint8_t>(bits);
      }
  } else if (t == model::DType::Q2_K || t == model::DType::Q3_K) {
    // Value 128n + 32j + l: bits 2j..2j+1 of qs[32n + l] (ggml dequantize_row_q2_K / q3_K); Q3_K adds
    // bit 4n + j of hmask[l] as 4 (u = q + 4h, in 0..7).
    const bool three = t == model::DType::Q3_K;
    const uint8_t* qs = blk + (three ? 32 : 16);
    for (int e = 0; e < 256; ++e) {
      const int n = e / 128, j = (e % 128) / 32, l = e % 32;
      q[e] = static_cast<uint8_t>(((qs[32 * n + l] >> (2 * j)) & 3) | (three ? ((blk[l] >> (4 * n + j)) & 1) << 2 : 0));
    }
    const int lo_off = three ? 224 : 320;
    for (int s = 0; s < 16; ++s)
      for (int i = 0; i < 4; ++i) {
        int b = 0;
        for (int k = 0; k < 4; ++k) b |= (q[16 * s + 4 * k + i] & 3) << (2 * k);
        dst[lo_off + 64 * s + 4 * r + i] = static_cast<uint8_t>(b);
      }
    if (three) {
      std::memcpy(dst + 2 * r, blk + 108, 2);
      for (int k = 0; k < 3; ++k) std::memcpy(dst + 32 + 64 * k + 4 * r, blk + 96 + 4 * k, 4);
      for (int m = 0; m < 8; ++m)
        for (int i = 0; i < 4; ++i) {
          int b = 0;
          for (int v = 0; v < 8; ++v) b |= (q[32 * m + 4 * v + i] >> 2) << v;
          dst[1248 + 64 * m + 4 * r + i] = static_cast<uint8_t>(b);
        }
    } else {
      std::memcpy(dst + 2 * r, blk + 80, 2);
      std::memcpy(dst + 32 + 2 * r, blk + 82, 2);
      for (int j = 0; j < 16; ++j) dst[64 + 32 * (j / 2) + 2 * r + j % 2] = blk[j];
    }
  } else if (t == model::DType::IQ4_XS) {
    std::memcpy(dst + 2 * r, blk, 2);
    const int sh = blk[2] | blk[3] << 8;
    for (int j = 0; j < 8; ++j) {
      const int ls = ((blk[4 + j / 2] >> 4 * (j % 2)) & 15) | (((sh >> 2 * j) & 3) << 4);
      dst[32 + 32 * (j / 2) + 2 * r + j % 2] = static_cast<uint8_t>(static_cast<int8_t>(ls - 32));
      for (int l = 0; l < 32; ++l) {
        const uint8_t b = blk[8 + 16 * j + l % 16];
        q[32 * j + l] = l < 16 ? b & 15 : b >> 4;
      }
    }
    for (int j = 0; j < 8; ++j)
      for (int v = 0; v < 4; ++v)
        for (int i = 0; i < 4; ++i)
          dst[160 + 256 * j + 64 * v + 4 * r + i] =
              static_cast<uint8_t>(q[32 * j + 4 * v + i] | (q[32 * j + 16 + 4 * v + i] << 4));
  } else {  // Q6_K
    std::memcpy(dst + 2 * r, blk + 208, 2);
    for (int j = 0; j < 16; ++j) dst[32 + 32 * (j / 2) + 2 * r + j % 2] = blk[192 + j];
    for (int e = 0; e < 256; ++e) {  // element e: half h, quarter c, lane l (ggml dequantize_row_q6_K)
      const int h = e / 128, c = (e % 128) / 32, l = e % 32;
      const uint8_t lo = blk[64 * h + 32 * (c & 1) + l];
      q[e] = static_cast<uint8_t>((c < 2 ? lo & 15 : lo >> 4) | (((blk[128 + 32 * h + l] >> (2 * c)) & 3) << 4));
    }
    for (int m = 0; m < 32; ++m)
      for (int i = 0; i < 4; ++i)
        dst[288 + 64 * m + 4 * r + i] = static_cast<uint8_t>((q[4 * m + i] & 15) | ((q[4 * (m + 32) + i] & 15) << 4));
    for (int m = 0; m < 16; ++m)
      for (int i = 0; i < 4; ++i) {
        int b = 0;
        for (int k = 0; k < 4; ++k) b |= (q[4 * (m + 16 * k) + i] >> 4) << (2 * k);
        dst[2336 + 64 * m + 4 * r + i] = static_cast<uint8_t>(b);
      }
  }
}

}  // namespace

PackedMatrix pack_weights(const model::Tensor& W, uint8_t* dst0, ThreadPool& pool) {
  PackedMatrix P;
  if (packed_bytes(W) == 0 || dst0 == nullptr) return P;
  const detail::PackedFormat f = detail::packed_format(W.type);
  const int64_t nb = W.cols() / f.values, ng = packed_groups(W.rows());
  P.type = W.type;
  P.rows = W.rows();
  P.cols = W.cols();
  P.group_bytes = static_cast<size_t>(nb) * f.block_bytes;
  P.data = dst0;
  if (f.values == model::QK_K) {
    const size_t src_bytes = model::info(W.type).block_bytes;
    pool.parallel_for(ng, 1, [&](int64_t g0, int64_t g1, int) {
      for (int64_t g = g0; g < g1; ++g)
        for (int64_t b = 0; b < nb; ++b)
          for (int r = 0; r < detail::kPackRows && g * detail::kPackRows + r < W.rows(); ++r)
            pack_k_row(W.type, W.row(g * detail::kPackRows + r) + b * src_bytes, r,
                       dst0 + g * P.group_bytes + b * f.block_bytes);
    });
    return P;
  }
  using model::DType;
  const bool q8 = W.type == DType::Q8_0, has_m = W.type == DType::Q4_1 || W.type == DType::Q5_1;
  const bool five = W.type == DType::Q5_0 || W.type == DType::Q5_1;
  const int qh_off = has_m ? 4 : 2, qs_off = qh_off + (five ? 4 : 0);  // after d (and m) (and qh)
  const int nib_vectors = five ? 4 : f.vectors;
  const size_t src_bytes = model::info(W.type).block_bytes;
  pool.parallel_for(ng, 1, [&](int64_t g0, int64_t g1, int) {
    for (int64_t g = g0; g < g1; ++g)
      for (int64_t b = 0; b < nb; ++b) {
        uint8_t* dst = dst0 + g * P.group_bytes + b * f.block_bytes;  // zero-filled: padding rows stay 0
        for (int r = 0; r < detail::kPackRows; ++r) {
          const int64_t row = g * detail::kPackRows + r;
          if (row >= W.rows()) break;
          const uint8_t* blk = W.row(row) + b * src_bytes;
          std::memcpy(dst + 2 * r, blk, 2);                   // d
          if (has_m) std::memcpy(dst + 32 + 2 * r, blk + 2, 2);  // m
          const uint8_t* qs = blk + qs_off;
          uint8_t* v = dst + f.header + 4 * r;
          for (int j = 0; j < nib_vectors; ++j)
            for (int i = 0; i < 4; ++i) v[64 * j + i] = q8 ? static_cast<uint8_t>(qs[4 * j + i] ^ 0x80) : qs[4 * j + i];
          if (five) {  // byte i, bit j: 5th bit of value 4j + i; bit 4 + j: of value 16 + 4j + i
            uint32_t qh;
            std::memcpy(&qh, blk + qh_off, 4);
            for (int i = 0; i < 4; ++i) {
              int bits = 0;
              for (int j = 0; j < 4; ++j)
                bits |= static_cast<int>(((qh >> (4 * j + i)) & 1) << j | ((qh >> (16 + 4 * j + i)) & 1) << (4 + j));
              v[256 + i] = static_cast<uint8_t>(bits);
            }
          }
        }
      }
  });
  return P;
}

void matmul(const model::Tensor& W, const PackedMatrix& P, const float* x, int n_tok, int64_t ldx, float* y,
            int64_t ldy, MatmulScratch scratch, ThreadPool& pool, bool prequantized) {
  if (P.empty() || !detail::has_packed_kernel(P.type, active_isa()) || P.type != W.type || P.rows != W.rows() ||
      P.cols != W.cols())
    return matmul(W, x, n_tok, ldx, y, ldy, scratch, pool);
  const MatmulJob job{&W, &P, y, ldy};
  matmul_multi(&job, 1, x, n_tok, ldx, scratch, pool, prequantized);  // the packed path (one job: always fused)
}

namespace {
constexpr int kMaxJobs = 8;
}  // namespace

namespace {

int act_zero_point(model::DType t) {
  return active_isa() == Isa::Avx512 ? detail::avx512::act_zero_point(t) : detail::avx2::act_zero_point(t);
}

// Whether a job of type t can share activations quantized for type t0: same quantization (32-value
// blocks, or the same K type) and a corr = C * sum(q) that follows exactly from t0's (at most one
// other C among the jobs: its corr goes to the spare array, see matmul_multi). E.g. Q4_K_M's Q and K
// (Q5_0, C = 16) with V (Q8_0, C = 128 on AVX-512, 0 on AVX2).
bool shares_acts(model::DType t0, model::DType t) {
  if (t == t0) return true;
  if (detail::is_k_type(t0) || detail::is_k_type(t)) return false;
  const int c0 = act_zero_point(t0), c = act_zero_point(t);
  return c == c0 || c0 != 0;
}

}  // namespace

bool packed_path(const MatmulJob* jobs, int n_jobs) {
  bool fused = n_jobs > 0 && n_jobs <= kMaxJobs && !jobs[0].P->empty() &&
               detail::has_packed_kernel(jobs[0].P->type, active_isa());
  const model::DType t0 = fused ? jobs[0].P->type : model::DType::F32;
  int other_c = -1;  // the one C other than t0's, if any
  for (int j = 0; j < n_jobs && fused; ++j) {
    const MatmulJob& b = jobs[j];
    fused = !b.P->empty() && detail::has_packed_kernel(b.P->type, active_isa()) && shares_acts(t0, b.P->type) &&
            b.P->cols == jobs[0].P->cols && b.P->type == b.W->type && b.P->rows == b.W->rows() &&
            b.P->cols == b.W->cols();
    const int c = fused ? act_zero_point(b.P->type) : 0;
    if (fused && c != act_zero_point(t0)) {
      fused = other_c < 0 || other_c == c;
      other_c = c;
    }
  }
  return fused;
}

void quantize_for_packed(model::DType type, int64_t cols, const float* x, int64_t ldx, int n_tok, int t0, int t1,
                         MatmulScratch scratch) {
  // Caller bugs (only valid where packed_path() is true): fail loudly, never run code the CPU lacks.
  const Isa isa = active_isa();
  if (!detail::has_packed_kernel(type, isa) ||
      scratch.bytes < matmul_scratch_bytes(type, cols, n_tok)) {
    std::fprintf(stderr,
                 "ss::cpu::quantize_for_packed: no packed path here (isa %s, type %d) or scratch %zu < %zu bytes\n",
                 isa_name(active_isa()), static_cast<int>(type), scratch.bytes,
                 matmul_scratch_bytes(type, cols, n_tok));
    std::abort();
  }
  const detail::QActs a = detail::carve_qacts(scratch.buf, cols, n_tok, 1, detail::packed_format(type).values);
  (isa == Isa::Avx512 ? detail::avx512::quantize : detail::avx2::quantize)(type, x, ldx, t0, t1, a);
}

void matmul_multi(const MatmulJob* jobs, int n_jobs, const float* x, int n_tok, int64_t ldx, MatmulScratch scratch,
                  ThreadPool& pool, bool prequantized) {
  if (n_tok <= 0 || n_jobs <= 0) return;
  const bool fused = packed_path(jobs, n_jobs);
  if (!fused) {
    for (int j = 0; j < n_jobs; ++j) matmul(*jobs[j].W, *jobs[j].P, x, n_tok, ldx, jobs[j].y, jobs[j].ldy, scratch, pool);
    return;
  }
  const model::Tensor& W0 = *jobs[0].W;
  check_scratch("matmul_multi", W0, scratch, n_tok);
  const detail::QActs a = detail::carve_qacts(scratch.buf, W0.cols(), n_tok, 1, detail::packed_format(W0.type).values);
  const bool wide = active_isa() == Isa::Avx512;  // else AVX2 (packed_path checked the type)
  const auto quantize = wide ? detail::avx512::quantize : detail::avx2::quantize;
  const auto rows_packed = wide ? detail::avx512::rows_packed : detail::avx2::rows_packed;
  // Jobs whose type has another C than W0's (packed_path allows one other): their own corr = C * sum(q),
  // exactly corr0 / C0 * C, in the spare array of the scratch (bsum: 32-value types leave it unused and
  // it holds one int32 per block and token), so they read the same qs, d and s as W0's jobs.
  const int c0 = act_zero_point(W0.type);
  int c1 = c0;
  for (int j = 0; j < n_jobs; ++j)
    if (act_zero_point(jobs[j].P->type) != c0) c1 = act_zero_point(jobs[j].P->type);
  detail::QActs a1 = a;
  if (c1 != c0) a1.corr = reinterpret_cast<int32_t*>(a.bsum);
  auto derive_corr = [&](int t0, int t1) {  // tokens [t0, t1) once quantized
    if (c1 == c0) return;
    const int64_t nb = a.nb();
    for (int64_t i = t0 * nb, e = t1 * nb; i < e; ++i) a1.corr[i] = a.corr[i] / c0 * c1;
  };
  // Row groups of all jobs as one range [0, total): job j owns [first[j], first[j + 1]).
  int64_t first[kMaxJobs + 1] = {0};
  for (int j = 0; j < n_jobs; ++j) first[j + 1] = first[j] + packed_groups(jobs[j].P->rows);
  const int nt = pool.size();
  const int64_t total = first[n_jobs];
  auto products = [&](int t) {
    const int64_t g0 = total * t / nt, g1 = total * (t + 1) / nt;
    detail::QActs at = a, at1 = a1;
    at.side = at1.side = scratch.side ? scratch.side + t : nullptr;
    for (int j = 0; j < n_jobs; ++j) {
      const int64_t b = std::max(g0, first[j]), e = std::min(g1, first[j + 1]);
      if (b < e)
        rows_packed(*jobs[j].P, act_zero_point(jobs[j].P->type) == c0 ? at : at1, jobs[j].y, jobs[j].ldy,
                    b - first[j], e - first[j]);
    }
  };
  if (prequantized || n_tok * W0.cols() < kParallelQuantize) {  // a few tokens: the caller quantizes, no barrier
    if (!prequantized) quantize(W0.type, x, ldx, 0, n_tok, a);
    derive_corr(0, n_tok);
    pool.run(products);
    return;
  }
  // Many tokens: quantize inside the same dispatch (each thread its share of tokens), then all meet
  // at a barrier before the products: one pool wake-up instead of two.
  std::atomic<int> arrived{0};
  pool.run([&](int t) {
    const int t0 = static_cast<int>(static_cast<int64_t>(n_tok) * t / nt);
    const int t1 = static_cast<int>(static_cast<int64_t>(n_tok) * (t + 1) / nt);
    if (t0 < t1) quantize(W0.type, x, ldx, t0, t1, a);
    derive_corr(t0, t1);
    arrived.fetch_add(1, std::memory_order_acq_rel);
    // Yield now and then: on a busy machine the thread we wait for may need this core.
    for (int i = 1; arrived.load(std::memory_order_acquire) < nt; ++i)
      if (i % 64 == 0) std::this_thread::yield();
      else __builtin_ia32_pause();
    products(t);
  });
}

void get_row(const model::Tensor& W, int64_t row, float* out) {
  model::dequantize_row(W.type, W.row(row), out, W.cols());
}

}  // namespace ss::cpu
