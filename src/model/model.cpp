// load_model: detect the format, verify, parse, validate, and hand over only a complete model.
#include "model/model.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <filesystem>

#include "common/sha256.h"
#include "model/loader.h"
#include "model/mapped_file.h"
#include "tokenizer/tokenizer.h"

namespace ss::model {

const char* arch_name(Arch a) {
  switch (a) {
    case Arch::Llama: return "llama";
    case Arch::Qwen2: return "qwen2";
    case Arch::Qwen3: return "qwen3";
  }
  return "?";
}

Model::Model() = default;
Model::~Model() = default;

void Model::release_pages(const Tensor& t) const {
  if (!t.valid()) return;
  for (const auto& f : files) {
    const auto* p = static_cast<const uint8_t*>(t.data);
    if (f->data() && p >= f->data() && p + t.nbytes <= f->data() + f->size()) return f->release(p, t.nbytes);
  }
}

Status verify_sha256(const std::string& file, const std::string& want, const LoadOptions& opts) {
  std::function<void(uint64_t, uint64_t)> progress;
  if (opts.progress) progress = [&](uint64_t d, uint64_t t) { opts.progress("sha256", d, t); };
  SS_ASSIGN(std::string got, sha256_file(file, progress));
  std::string w = want;
  std::transform(w.begin(), w.end(), w.begin(), [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  if (w != got) return make_error(file + ": sha256 mismatch: expected " + want + ", got " + got);
  return {};
}

std::string one_line(std::string message) {
  for (char& ch : message)
    if (static_cast<unsigned char>(ch) < 0x20 || ch == 0x7F) ch = '?';
  return message;
}

Status load_into(Model& m, const std::string& path, const LoadOptions& opts) {
  m.path = path;
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::exists(status)) return make_error(path + ": no such file or directory");
  if (std::filesystem::is_directory(status)) return load_hf_folder(m, path, opts);

  SS_ASSIGN(auto f, MappedFile::open(path));
  m.file_bytes = f->size();
  uint32_t magic = 0;
  if (f->size() >= 4) std::memcpy(&magic, f->data(), 4);
  if (magic != gguf::kMagic)
    return make_error(path + ": not a GGUF file (bad magic); for safetensors pass the model's folder");
  if (opts.verify_sha256) SS_TRY(verify_sha256(path, *opts.verify_sha256, opts));
  if (opts.progress) opts.progress("parse", 0, 1);
  SS_ASSIGN(gguf::File g, gguf::parse(f->data(), f->size(), path));
  if (opts.progress) opts.progress("parse", 1, 1);
  const uint8_t* base = f->data();
  m.files.push_back(std::move(f));
  return build_from_gguf(m, g, base, opts);
}

Expected<std::unique_ptr<Model>> load_model(const std::string& path, const LoadOptions& opts) {
  try {  // a bad_alloc or a library's exception becomes an error, never an escape
    auto m = std::make_unique<Model>();
    Status s = load_into(*m, path, opts);
    if (!s) return make_error(one_line(s.message()));
    return m;
  } catch (const std::exception& e) {
    return make_error(one_line(path + ": " + e.what()));
  }
}

}  // namespace ss::model
