// inspect_report: what `selfserve inspect` prints. It loads like load_model and reports whatever was
// read before a failure, so a broken file still shows its tensor table next to the error.
#include <algorithm>
#include <cstdio>
#include <iterator>
#include <map>
#include <sstream>
#include <vector>

#include "model/loader.h"
#include "model/weights.h"

namespace ss::model {

namespace {

std::string fmt_bytes(uint64_t b) {
  char buf[64];
  if (b >= (uint64_t{1} << 30)) std::snprintf(buf, sizeof buf, "%.2f GiB", b / double(uint64_t{1} << 30));
  else if (b >= (uint64_t{1} << 20)) std::snprintf(buf, sizeof buf, "%.1f MiB", b / double(uint64_t{1} << 20));
  else if (b >= 1024) std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024.0);
  else std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(b));
  return buf;
}

std::string fmt_float(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

void write_config(std::ostringstream& o, const ModelConfig& c) {
  o << "architecture: " << arch_name(c.arch) << (c.name.empty() ? "" : " (" + c.name + ")") << "\n"
    << "  layers " << c.n_layers << ", hidden " << c.hidden_size << ", heads " << c.n_heads << " (kv "
    << c.n_kv_heads << "), head_dim " << c.head_dim << ", ffn " << c.intermediate_size << ", vocab "
    << c.vocab_size << ", context " << c.max_context << "\n"
    << "  rms_norm_eps " << fmt_float(c.rms_norm_eps) << ", rope theta " << fmt_float(c.rope_theta) << " dim "
    << c.rope_dim << " " << (c.rope_style == RopeStyle::Interleaved ? "interleaved" : "half-split") << ", scaling ";
  switch (c.rope_scaling.kind) {
    case RopeScaling::Kind::None: o << "none"; break;
    case RopeScaling::Kind::Linear: o << "linear x" << fmt_float(c.rope_scaling.factor); break;
    case RopeScaling::Kind::Llama3:
      o << "llama3 x" << fmt_float(c.rope_scaling.factor) << " (low " << fmt_float(c.rope_scaling.low_freq_factor)
        << ", high " << fmt_float(c.rope_scaling.high_freq_factor) << ", original "
        << c.rope_scaling.original_max_position << ")";
      break;
  }
  o << "\n  tied embeddings " << (c.tie_embeddings ? "yes" : "no") << ", qkv bias " << (c.qkv_bias ? "yes" : "no")
    << ", qk norm " << (c.qk_norm ? "yes" : "no") << "\n";
}

void write_tensors(std::ostringstream& o, const Model& m) {
  size_t name_w = 4;
  for (const auto& t : m.tensor_table) name_w = std::max(name_w, t.name.size());
  std::map<std::string, int> by_type;
  uint64_t total = 0;
  o << "tensors: " << m.tensor_table.size() << "\n";
  for (const auto& t : m.tensor_table) {
    const std::string type(dtype_name(t.type));
    char line[512];
    std::snprintf(line, sizeof line, "  %-*s  %-5s  %-20s  %12llu\n", static_cast<int>(name_w), t.name.c_str(),
                  type.c_str(), shape_string(t.n_dims, t.ne, m.format).c_str(),
                  static_cast<unsigned long long>(t.nbytes));
    o << line;
    by_type[type]++;
    total += t.nbytes;
  }
  o << "tensor bytes: " << total << " (" << fmt_bytes(total) << ");";
  for (const auto& [type, n] : by_type) o << " " << type << " x" << n;
  o << "\n";
}

// llama.cpp's llama_ftype names (general.file_type); 1024 marks a type guessed by the converter.
const char* ftype_name(int64_t ft) {
  static const char* const kNames[] = {"F32",     "F16",    "Q4_0",    "Q4_1",   nullptr,  nullptr,  nullptr,
                                       "Q8_0",    "Q5_0",   "Q5_1",    "Q2_K",   "Q3_K_S", "Q3_K_M", "Q3_K_L",
                                       "Q4_K_S",  "Q4_K_M", "Q5_K_S",  "Q5_K_M", "Q6_K",   "IQ2_XXS", "IQ2_XS",
                                       "Q2_K_S",  "IQ3_XS", "IQ3_XXS", "IQ1_S",  "IQ4_NL", "IQ3_S",  "IQ3_M",
                                       "IQ2_S",   "IQ2_M",  "IQ4_XS",  "IQ1_M",  "BF16"};
  ft &= ~int64_t{1024};
  return ft >= 0 && ft < static_cast<int64_t>(std::size(kNames)) ? kNames[ft] : nullptr;
}

// "quant mix: Q4_K_M: Q4_K 70%, Q6_K 30%": the share of each type in the bytes of the 2-D tensors
// (the matrices a quantization mix is about; norms stay F32).
void write_mix(std::ostringstream& o, const Model& m) {
  std::map<std::string, uint64_t> bytes;
  uint64_t total = 0;
  for (const auto& t : m.tensor_table)
    if (t.n_dims >= 2) bytes[std::string(dtype_name(t.type))] += t.nbytes, total += t.nbytes;
  if (total == 0) return;
  std::vector<std::pair<uint64_t, std::string>> order;
  for (const auto& [type, b] : bytes) order.push_back({b, type});
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  o << "quant mix: ";
  if (const char* n = ftype_name(m.file_type)) o << n << ": ";
  for (size_t i = 0; i < order.size(); ++i) {
    char pct[16];
    std::snprintf(pct, sizeof pct, "%.0f%%", 100.0 * static_cast<double>(order[i].first) / static_cast<double>(total));
    o << (i ? ", " : "") << order[i].second << " " << pct;
  }
  o << " (of matrix bytes)\n";
}

}  // namespace

std::string inspect_report(const std::string& path, const LoadOptions& opts, bool* ok) {
  Model m;
  std::string verdict;
  bool good = false;
  try {
    Status s = load_into(m, path, opts);
    good = s.ok();
    verdict = good ? "OK" : one_line(s.message());
  } catch (const std::exception& e) {
    verdict = one_line(path + ": " + e.what());
  }
  if (ok) *ok = good;
  std::ostringstream o;
  o << "file: " << path << "\n"
    << "format: " << (m.format == FileFormat::Gguf ? "GGUF" : "safetensors") << ", " << m.files.size() << " file(s), "
    << m.file_bytes << " bytes (" << fmt_bytes(m.file_bytes) << ")\n";
  if (m.config.n_layers > 0) write_config(o, m.config);
  o << "tokenizer: " << (m.tokenizer ? m.tokenizer->summary() : std::string("not loaded")) << "\n";
  o << "chat template: " << (m.chat_template.empty() ? "none" : std::to_string(m.chat_template.size()) + " chars")
    << "\n";
  if (!m.tensor_table.empty()) write_tensors(o, m);
  if (!m.tensor_table.empty()) write_mix(o, m);
  o << "verdict: " << verdict << "\n";
  return o.str();
}

}  // namespace ss::model
