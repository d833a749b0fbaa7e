// inspect_report: what `selfserve inspect` prints. It loads like load_model and reports whatever was
// read before a failure, so a broken file still shows its tensor table next to the error.
#include <cstdio>
#include <map>
#include <sstream>

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
  o << "verdict: " << verdict << "\n";
  return o.str();
}

}  // namespace ss::model
