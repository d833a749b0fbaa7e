// Writes random-weights models (see synth.h). Data is generated and quantized by worker threads in
// chunks of rows and written with pwrite at precomputed offsets: no tensor is ever whole in memory.
#include "model/synth.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "model/gguf_writer.h"
#include "model/quantize.h"
#include "model/weights.h"

namespace ss::model {

namespace {

using nlohmann::json;

// SplitMix64's output function: a bijective mix, so (key, index) pairs never share a stream.
inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

// The sum of four 16-bit uniforms (Irwin-Hall, n = 4) is close to normal: mean 131070, std ~65536/sqrt(3).
// 2*sum - 262140 is an exact integer in float, and one multiply rounds it: the same bits everywhere.
constexpr float kScale = static_cast<float>(0.02 * 1.7320508075688772 / 65536.0 / 2.0);

inline float value_at(uint64_t key, uint64_t index) {
  const uint64_t z = mix64(key + (index + 1) * kGolden);
  const int64_t s = static_cast<int64_t>((z & 0xFFFF) + ((z >> 16) & 0xFFFF) + ((z >> 32) & 0xFFFF) + (z >> 48));
  return static_cast<float>(2 * s - 262140) * kScale;
}

const char* kChatML =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

enum class Kind { Weight, Norm, Bias, RopeFreqs };

struct PlanTensor {
  std::string gguf_name, hf_name;
  int n_dims;
  int64_t cols, rows;  // ne[0], ne[1] (rows = 1 for vectors)
  Kind kind;
  int perm_heads = 0;  // >0: GGUF llama Q/K, rows permuted over this many heads
  DType type = DType::F32;
  uint64_t key = 0;
  uint64_t offset = 0;  // absolute, in the weight file
  uint64_t nbytes = 0;
};

std::vector<PlanTensor> make_plan(const SynthShape& s, SynthFormat fmt, uint64_t seed) {
  std::vector<PlanTensor> p;
  const bool gguf_llama = fmt == SynthFormat::Gguf && s.arch == Arch::Llama;
  auto add = [&](std::string name, int64_t cols, int64_t rows, Kind kind, int perm = 0) {
    PlanTensor t;
    t.gguf_name = std::move(name);
    t.hf_name = hf_name_from_gguf(t.gguf_name);
    t.n_dims = rows > 0 ? 2 : 1;
    t.cols = cols;
    t.rows = rows > 0 ? rows : 1;
    t.kind = kind;
    t.perm_heads = perm;
    t.key = synth_tensor_key(seed, t.gguf_name);
    p.push_back(std::move(t));
  };
  const int64_t q_dim = int64_t(s.heads) * s.head_dim, kv_dim = int64_t(s.kv_heads) * s.head_dim;
  // Llama 3.1+ scaling travels in GGUF as per-frequency factors (config.json's rope_scaling in HF).
  if (fmt == SynthFormat::Gguf && s.llama3_rope_factor > 0) add("rope_freqs.weight", s.head_dim / 2, 0, Kind::RopeFreqs);
  add("token_embd.weight", s.hidden, s.vocab, Kind::Weight);
  for (int l = 0; l < s.layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    add(b + "attn_norm.weight", s.hidden, 0, Kind::Norm);
    add(b + "attn_q.weight", s.hidden, q_dim, Kind::Weight, gguf_llama ? s.heads : 0);
    add(b + "attn_k.weight", s.hidden, kv_dim, Kind::Weight, gguf_llama ? s.kv_heads : 0);
    add(b + "attn_v.weight", s.hidden, kv_dim, Kind::Weight);
    if (s.arch == Arch::Qwen2) {
      add(b + "attn_q.bias", q_dim, 0, Kind::Bias);
      add(b + "attn_k.bias", kv_dim, 0, Kind::Bias);
      add(b + "attn_v.bias", kv_dim, 0, Kind::Bias);
    }
    if (s.arch == Arch::Qwen3) {
      add(b + "attn_q_norm.weight", s.head_dim, 0, Kind::Norm);
      add(b + "attn_k_norm.weight", s.head_dim, 0, Kind::Norm);
    }
    add(b + "attn_output.weight", q_dim, s.hidden, Kind::Weight);
    add(b + "ffn_norm.weight", s.hidden, 0, Kind::Norm);
    add(b + "ffn_gate.weight", s.hidden, s.ffn, Kind::Weight);
    add(b + "ffn_up.weight", s.hidden, s.ffn, Kind::Weight);
    add(b + "ffn_down.weight", s.ffn, s.hidden, Kind::Weight);
  }
  add("output_norm.weight", s.hidden, 0, Kind::Norm);
  if (!s.tied) add("output.weight", s.hidden, s.vocab, Kind::Weight);
  if (fmt == SynthFormat::Safetensors)  // the file holds them sorted by name
    std::sort(p.begin(), p.end(), [](const PlanTensor& a, const PlanTensor& b) { return a.hf_name < b.hf_name; });
  return p;
}

// convert_hf_to_gguf.py's llama3 rope factors (low_freq_factor 1, high 4, original context 8192).
std::vector<float> llama3_rope_factors(double theta, int dim, double factor) {
  constexpr double kLow = 1, kHigh = 4, kOrig = 8192;
  std::vector<float> f;
  for (int i = 0; i < dim; i += 2) {
    const double freq = 1.0 / std::pow(theta, static_cast<double>(i) / dim);
    const double wavelen = 2 * 3.141592653589793 / freq;
    double v = factor;
    if (wavelen < kOrig / kHigh) {
      v = 1;
    } else if (wavelen <= kOrig / kLow) {
      const double smooth = (kOrig / wavelen - kLow) / (kHigh - kLow);
      v = 1 / ((1 - smooth) / factor + smooth);
    }
    f.push_back(static_cast<float>(v));
  }
  return f;
}

// llama.cpp's own fallback when a row is not a whole number of 256-blocks (llama-quant.cpp).
DType fallback_type(DType t) {
  switch (t) {
    case DType::Q4_K: return DType::Q5_0;
    case DType::Q6_K: return DType::Q8_0;
    default: return t;
  }
}

const char* ggml_file_type_name(DType t, uint32_t* id) {
  switch (t) {
    case DType::F32: *id = 0; return "F32";
    case DType::F16: *id = 1; return "F16";
    case DType::Q4_0: *id = 2; return "Q4_0";
    case DType::Q4_1: *id = 3; return "Q4_1";
    case DType::Q8_0: *id = 7; return "Q8_0";
    case DType::Q5_0: *id = 8; return "Q5_0";
    case DType::Q5_1: *id = 9; return "Q5_1";
    case DType::Q4_K: *id = 14; return "Q4_K_S";
    case DType::Q6_K: *id = 18; return "Q6_K";
    case DType::BF16: *id = 32; return "BF16";
    default: *id = 0; return "?";
  }
}

const char* arch_key(Arch a) { return a == Arch::Llama ? "llama" : a == Arch::Qwen2 ? "qwen2" : "qwen3"; }

// SentencePiece-style vocabulary (tokenizer.ggml.model "llama") that llama.cpp and selfserve load:
// specials, the 256 byte tokens, "▁" (so the space prefix decodes back to a space, not to its
// bytes), then fillers "▁t<i>" with decreasing scores.
void add_gguf_vocab(gguf::Writer& w, int vocab) {
  std::vector<std::string> toks = {"<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"};
  std::vector<int32_t> types = {2, 3, 3, 3, 3};  // UNKNOWN, CONTROL
  char buf[16];
  for (int b = 0; b < 256; ++b) {
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    toks.emplace_back(buf);
    types.push_back(6);  // BYTE
  }
  std::vector<float> scores(toks.size(), 0.0f);
  toks.emplace_back("\xE2\x96\x81");
  types.push_back(1);  // NORMAL
  scores.push_back(0.0f);
  for (int i = 0; static_cast<int>(toks.size()) < vocab; ++i) {
    std::snprintf(buf, sizeof buf, "\xE2\x96\x81t%d", i);
    toks.emplace_back(buf);
    scores.push_back(-static_cast<float>(i + 1));
    types.push_back(1);  // NORMAL
  }
  w.add_string("tokenizer.ggml.model", "llama");
  w.add_strings("tokenizer.ggml.tokens", toks);
  w.add_f32s("tokenizer.ggml.scores", scores);
  w.add_i32s("tokenizer.ggml.token_type", types);
  w.add_u32("tokenizer.ggml.bos_token_id", 1);
  w.add_u32("tokenizer.ggml.eos_token_id", 2);
  w.add_u32("tokenizer.ggml.unknown_token_id", 0);
  w.add_string("tokenizer.chat_template", kChatML);
}
constexpr int kGgufMinVocab = 5 + 256 + 1;

// GPT-2's byte -> printable code point map, as UTF-8 (the byte-level BPE alphabet).
std::string byte_level_char(int b) {
  int cp = b;
  const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
  if (!printable) {
    int n = 0;
    for (int x = 0; x < b; ++x)
      if (!((x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF))) ++n;
    cp = 256 + n;
  }
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

// A byte-level BPE tokenizer.json: the 256 byte symbols, three specials, then fillers "t<i>" (no
// merges: they are never produced by encoding, only by sampling).
constexpr int kHfMinVocab = 256 + 3;
json hf_tokenizer(int vocab) {
  char buf[16];
  json v = json::object();
  for (int b = 0; b < 256; ++b) v[byte_level_char(b)] = b;
  const char* specials[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  json added = json::array();
  for (int i = 0; i < 3; ++i) {
    v[specials[i]] = 256 + i;
    added.push_back({{"id", 256 + i}, {"content", specials[i]}, {"single_word", false}, {"lstrip", false},
                     {"rstrip", false}, {"normalized", false}, {"special", true}});
  }
  for (int i = 0, id = kHfMinVocab; id < vocab; ++i, ++id) {
    std::snprintf(buf, sizeof buf, "t%d", i);  // not "t" + to_string: GCC 12 -Wrestrict false positive
    v[buf] = id;
  }
  const json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  json model = {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr}, {"fuse_unk", false}, {"byte_fallback", false},
                {"ignore_merges", false}, {"vocab", std::move(v)}, {"merges", json::array()}};
  return {{"version", "1.0"}, {"truncation", nullptr}, {"padding", nullptr}, {"added_tokens", std::move(added)},
          {"normalizer", nullptr}, {"pre_tokenizer", byte_level}, {"post_processor", byte_level},
          {"decoder", byte_level}, {"model", std::move(model)}};
}

json hf_config(const SynthShape& s, DType dt) {
  const char* arch = s.arch == Arch::Llama ? "LlamaForCausalLM" : s.arch == Arch::Qwen2 ? "Qwen2ForCausalLM" : "Qwen3ForCausalLM";
  json c = {{"architectures", {arch}}, {"model_type", arch_key(s.arch)}, {"_name_or_path", "synth-" + s.name},
            {"vocab_size", s.vocab}, {"hidden_size", s.hidden}, {"intermediate_size", s.ffn},
            {"num_hidden_layers", s.layers}, {"num_attention_heads", s.heads}, {"num_key_value_heads", s.kv_heads},
            {"head_dim", s.head_dim}, {"max_position_embeddings", s.context}, {"rms_norm_eps", s.rms_eps},
            {"rope_theta", s.rope_theta}, {"tie_word_embeddings", s.tied}, {"hidden_act", "silu"},
            {"attention_dropout", 0.0}, {"bos_token_id", 256}, {"eos_token_id", 258},
            {"torch_dtype", dt == DType::F32 ? "float32" : dt == DType::F16 ? "float16" : "bfloat16"}};
  if (s.arch == Arch::Llama) c["attention_bias"] = false, c["mlp_bias"] = false;
  if (s.llama3_rope_factor > 0)
    c["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", s.llama3_rope_factor}, {"low_freq_factor", 1.0},
                         {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
  if (s.arch == Arch::Qwen3) c["attention_bias"] = false;
  if (s.arch != Arch::Llama) c["use_sliding_window"] = false;
  return c;
}

Status write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) return make_error(path + ": cannot open for writing: " + std::strerror(errno));
  f.write(text.data(), static_cast<std::streamsize>(text.size()));
  if (!f.flush()) return make_error(path + ": write failed");
  return {};
}

Status pwrite_all(int fd, const uint8_t* p, size_t n, uint64_t off, const std::string& path) {
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, n, static_cast<off_t>(off));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return make_error(path + ": write failed: " + std::strerror(w < 0 ? errno : ENOSPC));
    p += w, n -= static_cast<size_t>(w), off += static_cast<uint64_t>(w);
  }
  return {};
}

// Fills `path` (size bytes): `header` at 0, then every tensor's data, generated by worker threads.
Status write_file(const std::string& path, const std::vector<uint8_t>& header, uint64_t size,
                  const std::vector<PlanTensor>& plan, const SynthShape& shape, const SynthOptions& o) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return make_error(path + ": cannot open for writing: " + std::strerror(errno));
  struct Closer { int fd; ~Closer() { ::close(fd); } } closer{fd};
  struct stat st_buf;
  if (::fstat(fd, &st_buf) != 0 || !S_ISREG(st_buf.st_mode))  // e.g. /dev/null: never unlink those below
    return make_error(path + ": not a regular file");
  if (::ftruncate(fd, static_cast<off_t>(size)) != 0) {  // padding between tensors reads as zeros
    const std::string why = std::strerror(errno);
    ::unlink(path.c_str());
    return make_error(path + ": cannot size the file to " + std::to_string(size) + " bytes: " + why);
  }
  if (Status st = pwrite_all(fd, header.data(), header.size(), 0, path); !st.ok()) {
    ::unlink(path.c_str());
    return st;
  }

  struct Chunk { const PlanTensor* t; int64_t row0, rows; };
  std::vector<Chunk> chunks;
  constexpr uint64_t kChunkBytes = 4u << 20;
  for (const PlanTensor& t : plan) {
    const uint64_t rb = row_bytes(t.type, t.cols);
    const int64_t per = std::max<int64_t>(1, static_cast<int64_t>(kChunkBytes / std::max<uint64_t>(rb, 1)));
    for (int64_t r = 0; r < t.rows; r += per) chunks.push_back({&t, r, std::min(per, t.rows - r)});
  }
  uint64_t total = 0;
  for (const PlanTensor& t : plan) total += t.nbytes;

  std::atomic<size_t> next{0};
  std::atomic<uint64_t> done{0};
  std::atomic<bool> failed{false};
  std::mutex err_mu;
  std::string err;
  auto work = [&](bool reporter) {
    std::vector<float> row;
    std::vector<uint8_t> out;
    for (size_t i; !failed.load(std::memory_order_relaxed) && (i = next.fetch_add(1)) < chunks.size();) {
      const Chunk& c = chunks[i];
      const PlanTensor& t = *c.t;
      const size_t rb = row_bytes(t.type, t.cols);
      row.resize(static_cast<size_t>(t.cols));
      out.resize(rb * static_cast<size_t>(c.rows));
      for (int64_t r = 0; r < c.rows; ++r) {
        const int64_t fr = c.row0 + r;
        const int64_t hr = t.perm_heads > 0 ? synth_hf_row(fr, t.rows, t.perm_heads) : fr;
        if (t.kind == Kind::Norm) {
          std::fill(row.begin(), row.end(), 1.0f);
        } else if (t.kind == Kind::RopeFreqs) {
          row = llama3_rope_factors(shape.rope_theta, static_cast<int>(2 * t.cols), shape.llama3_rope_factor);
        } else {
          const uint64_t base = static_cast<uint64_t>(hr) * static_cast<uint64_t>(t.cols);
          for (int64_t k = 0; k < t.cols; ++k) row[k] = value_at(t.key, base + static_cast<uint64_t>(k));
        }
        quantize_row(t.type, row.data(), out.data() + rb * static_cast<size_t>(r), t.cols);
      }
      Status st = pwrite_all(fd, out.data(), out.size(), t.offset + rb * static_cast<uint64_t>(c.row0), path);
      if (!st.ok()) {
        std::lock_guard<std::mutex> lk(err_mu);
        if (!failed.exchange(true)) err = st.message();
      }
      const uint64_t d = done.fetch_add(out.size()) + out.size();
      if (reporter && o.progress) o.progress(d, total);
    }
  };
  int n_threads = o.threads > 0 ? o.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (int i = 1; i < n_threads; ++i) pool.emplace_back(work, false);
  work(true);
  for (auto& th : pool) th.join();
  if (failed) {
    ::unlink(path.c_str());  // a half-written model must not pass for a whole one
    return make_error(err);
  }
  if (o.progress) o.progress(total, total);
  return {};
}

}  // namespace

uint64_t synth_tensor_key(uint64_t seed, std::string_view name) {
  uint64_t h = 0xCBF29CE484222325ull;  // FNV-1a
  for (unsigned char c : name) h = (h ^ c) * 0x100000001B3ull;
  return mix64(mix64(seed) ^ h);
}

float synth_value(uint64_t key, uint64_t index) { return value_at(key, index); }

// llama.cpp's converter: w.reshape(n_head, 2, hd/2, in).swapaxes(1, 2) — GGUF row h*hd + 2i + j
// holds Hugging Face row h*hd + j*hd/2 + i.
int64_t synth_hf_row(int64_t r, int64_t rows, int n_head) {
  const int64_t hd = rows / n_head;
  const int64_t h = r / hd, w = r % hd;
  return h * hd + (w % 2) * (hd / 2) + w / 2;
}

const std::vector<SynthShape>& synth_shapes() {
  // name, arch, hidden, layers, heads, kv_heads, head_dim, ffn, vocab, context, tied, rope_theta, eps
  static const std::vector<SynthShape> k = {
      {"smollm2-135m", Arch::Llama, 576, 30, 9, 3, 64, 1536, 49152, 8192, true, 100000.0f, 1e-5f},
      {"llama32-1b", Arch::Llama, 2048, 16, 32, 8, 64, 8192, 128256, 131072, true, 500000.0f, 1e-5f, 32.0f},
      {"llama3-8b", Arch::Llama, 4096, 32, 32, 8, 128, 14336, 128256, 8192, false, 500000.0f, 1e-5f},
      {"qwen25-05b", Arch::Qwen2, 896, 24, 14, 2, 64, 4864, 151936, 32768, true, 1000000.0f, 1e-6f},
      {"qwen3-06b", Arch::Qwen3, 1024, 28, 16, 8, 128, 3072, 151936, 40960, true, 1000000.0f, 1e-6f},
  };
  return k;
}

std::vector<std::string> synth_shape_names() {
  std::vector<std::string> n;
  for (const auto& s : synth_shapes()) n.push_back(s.name);
  return n;
}

Expected<SynthShape> synth_shape(std::string_view name) {
  std::string names;
  for (const auto& s : synth_shapes()) {
    if (s.name == name) return s;
    names += (names.empty() ? "" : ", ") + s.name;
  }
  return make_error("unknown shape '" + std::string(name) + "' (known: " + names + ")");
}

Expected<DType> synth_dtype(std::string_view name) {
  std::string n(name);
  for (char& c : n) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  static const std::pair<const char*, DType> k[] = {
      {"f32", DType::F32}, {"f16", DType::F16}, {"bf16", DType::BF16}, {"q8_0", DType::Q8_0},
      {"q4_0", DType::Q4_0}, {"q4_1", DType::Q4_1}, {"q5_0", DType::Q5_0}, {"q5_1", DType::Q5_1},
      {"q4_k", DType::Q4_K}, {"q6_k", DType::Q6_K}};
  for (const auto& [s, t] : k)
    if (n == s) return t;
  return make_error("unknown dtype '" + std::string(name) + "' (known: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q6_k)");
}

Expected<SynthResult> write_synth_model(const SynthOptions& o) {
  SS_ASSIGN(SynthShape s, synth_shape(o.shape));
  if (o.layers < 0 || o.layers > 1000) return make_error("--layers " + std::to_string(o.layers) + " is out of range [1, 1000]");
  if (o.layers > 0) s.layers = o.layers;
  const bool gguf = o.format == SynthFormat::Gguf;
  const int min_vocab = gguf ? kGgufMinVocab : kHfMinVocab;
  if (o.vocab != 0 && (o.vocab < min_vocab || o.vocab > 1 << 20))
    return make_error("--vocab " + std::to_string(o.vocab) + " is out of range [" + std::to_string(min_vocab) +
                      ", 1048576] (the synthetic tokenizer needs " + std::to_string(min_vocab) + " tokens)");
  if (o.vocab > 0) s.vocab = o.vocab;
  if (!gguf && o.dtype != DType::F32 && o.dtype != DType::F16 && o.dtype != DType::BF16)
    return make_error("safetensors holds f32, f16 or bf16, not " + std::string(dtype_name(o.dtype)) +
                      " (use --format gguf for block types)");
  if (o.out.empty()) return make_error("--out is required");
  if (o.threads < 0) return make_error("--threads must be >= 0");

  SynthResult res;
  std::vector<PlanTensor> plan = make_plan(s, o.format, o.seed);
  std::map<std::string, int> fallbacks;
  for (PlanTensor& t : plan) {
    if (t.n_dims == 1 && gguf) {
      t.type = DType::F32;  // as llama.cpp's converter keeps vectors
      continue;
    }
    t.type = o.dtype;
    if (t.cols % info(t.type).block_size != 0) {
      t.type = fallback_type(o.dtype);
      if (t.cols % info(t.type).block_size != 0)
        return make_error(t.gguf_name + ": rows of " + std::to_string(t.cols) + " are not whole " +
                          std::string(dtype_name(o.dtype)) + " blocks");
      ++fallbacks[std::string(dtype_name(t.type))];
    }
  }
  for (const auto& [type, n] : fallbacks)
    res.notes.push_back(std::to_string(n) + " tensors with rows not a multiple of " +
                        std::to_string(info(o.dtype).block_size) + " written as " + type + " (llama.cpp's fallback)");

  std::vector<uint8_t> header;
  uint64_t size = 0;
  std::string weight_path;
  if (gguf) {
    gguf::Writer w;
    const std::string a = arch_key(s.arch), p = a + ".";
    uint32_t ftype = 0;
    ggml_file_type_name(o.dtype, &ftype);
    w.add_string("general.architecture", a);
    w.add_string("general.name", "synth-" + s.name);
    w.add_u32("general.file_type", ftype);
    w.add_u32("general.quantization_version", 2);
    w.add_u32(p + "context_length", static_cast<uint32_t>(s.context));
    w.add_u32(p + "embedding_length", static_cast<uint32_t>(s.hidden));
    w.add_u32(p + "block_count", static_cast<uint32_t>(s.layers));
    w.add_u32(p + "feed_forward_length", static_cast<uint32_t>(s.ffn));
    w.add_u32(p + "attention.head_count", static_cast<uint32_t>(s.heads));
    w.add_u32(p + "attention.head_count_kv", static_cast<uint32_t>(s.kv_heads));
    w.add_u32(p + "attention.key_length", static_cast<uint32_t>(s.head_dim));
    w.add_u32(p + "attention.value_length", static_cast<uint32_t>(s.head_dim));
    w.add_f32(p + "attention.layer_norm_rms_epsilon", s.rms_eps);
    w.add_f32(p + "rope.freq_base", s.rope_theta);
    w.add_u32(p + "rope.dimension_count", static_cast<uint32_t>(s.head_dim));
    w.add_u32(p + "vocab_size", static_cast<uint32_t>(s.vocab));
    add_gguf_vocab(w, s.vocab);
    for (const PlanTensor& t : plan) {
      const int64_t ne[2] = {t.cols, t.rows};
      w.add_tensor(t.gguf_name, t.type, t.n_dims, ne);
    }
    header = w.header();
    for (size_t i = 0; i < plan.size(); ++i) {
      plan[i].offset = w.data_offset() + w.tensor_offset(i);
      plan[i].nbytes = w.tensor_bytes(i);
    }
    size = w.file_size();
    weight_path = o.out;
  } else {
    std::error_code ec;
    std::filesystem::create_directories(o.out, ec);
    if (ec) return make_error(o.out + ": cannot create the folder: " + ec.message());
    json h = json::object();
    h["__metadata__"] = {{"format", "pt"}};
    uint64_t off = 0;
    for (PlanTensor& t : plan) {
      t.nbytes = row_bytes(t.type, t.cols) * static_cast<uint64_t>(t.rows);
      json shape = t.n_dims == 2 ? json{t.rows, t.cols} : json{t.cols};
      h[t.hf_name] = {{"dtype", std::string(dtype_name(t.type))}, {"shape", shape}, {"data_offsets", {off, off + t.nbytes}}};
      t.offset = off;
      off += t.nbytes;
    }
    std::string text = h.dump();
    text.resize((text.size() + 7) / 8 * 8, ' ');
    const uint64_t n = text.size();
    header.resize(8);
    std::memcpy(header.data(), &n, 8);
    header.insert(header.end(), text.begin(), text.end());
    for (PlanTensor& t : plan) t.offset += header.size();
    size = header.size() + off;
    weight_path = o.out + "/model.safetensors";

    SS_TRY(write_text(o.out + "/config.json", hf_config(s, o.dtype).dump(2) + "\n"));
    SS_TRY(write_text(o.out + "/tokenizer.json", hf_tokenizer(s.vocab).dump() + "\n"));
    const json tc = {{"add_bos_token", false}, {"add_eos_token", false}, {"bos_token", nullptr},
                     {"eos_token", "<|im_end|>"}, {"pad_token", "<|endoftext|>"}, {"chat_template", kChatML},
                     {"model_max_length", s.context}, {"tokenizer_class", "PreTrainedTokenizerFast"}};
    SS_TRY(write_text(o.out + "/tokenizer_config.json", tc.dump(2) + "\n"));
    res.files = {o.out + "/config.json", o.out + "/tokenizer.json", o.out + "/tokenizer_config.json"};
  }
  SS_TRY(write_file(weight_path, header, size, plan, s, o));
  res.files.push_back(weight_path);
  res.bytes = size;
  return res;
}

}  // namespace ss::model
