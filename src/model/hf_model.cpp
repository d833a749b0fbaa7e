// A Model from a Hugging Face folder: config.json, safetensors shard(s), tokenizer.json and the chat
// template from tokenizer_config.json (or chat_template.jinja).
#include <filesystem>
#include <nlohmann/json.hpp>

#include "model/loader.h"
#include "model/mapped_file.h"
#include "model/model_config.h"
#include "model/validate.h"
#include "model/weights.h"

namespace ss::model {

namespace {

// The file name inside the folder, to compare with the index's weight_map.
std::string base_name(const std::string& path) { return std::filesystem::path(path).filename().string(); }

Expected<std::string> read_chat_template(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const std::string cfg = dir + "/tokenizer_config.json";
  if (fs::exists(cfg, ec)) {
    SS_ASSIGN(std::string text, read_text_file(cfg));
    auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) return make_error(cfg + ": not a JSON object");
    auto it = j.find("chat_template");
    if (it != j.end() && it->is_string()) return it->get<std::string>();
    if (it != j.end() && it->is_array()) {  // [{name, template}, ...]: take "default"
      for (const auto& e : *it) {
        if (!e.is_object()) continue;
        auto name = e.find("name"), tmpl = e.find("template");
        if (name != e.end() && *name == "default" && tmpl != e.end() && tmpl->is_string())
          return tmpl->get<std::string>();
      }
    }
  }
  const std::string jinja = dir + "/chat_template.jinja";  // where newer transformers save it
  if (fs::exists(jinja, ec)) return read_text_file(jinja);
  return std::string();
}

}  // namespace

Status build_from_safetensors(Model& m, const std::vector<ShardView>& shards,
                              const std::map<std::string, std::string>& weight_map, const LoadOptions& opts) {
  m.format = FileFormat::Safetensors;
  TensorMap tensors;
  std::map<std::string, std::string> found;  // tensor -> shard file name
  for (const ShardView& s : shards) {
    const std::string shard = base_name(s.file->name);
    for (const auto& ti : s.file->tensors) {
      Tensor t;
      t.name = ti.name;
      t.type = ti.type;
      t.n_dims = ti.n_dims;
      for (int d = 0; d < 4; ++d) t.ne[d] = ti.ne[d];
      t.data = s.base + ti.offset;
      t.nbytes = static_cast<size_t>(ti.nbytes);
      m.tensor_table.push_back({t.name, t.type, t.n_dims, {t.ne[0], t.ne[1], t.ne[2], t.ne[3]}, t.nbytes});
      if (auto [it, fresh] = found.emplace(ti.name, shard); !fresh)
        return make_error(s.file->name + ": tensor " + ti.name + " is also in " + it->second);
      if (auto it = weight_map.find(ti.name); it != weight_map.end() && it->second != shard)
        return make_error(s.file->name + ": tensor " + ti.name + " is listed in the index under " + it->second);
      if (ignorable_tensor(ti.name)) continue;
      auto gguf_name = gguf_name_from_hf(ti.name);
      if (!gguf_name) return make_error(s.file->name + ": unexpected tensor " + ti.name);
      tensors.emplace(*gguf_name, SourceTensor{std::move(t), &s.file->name});
    }
  }
  for (const auto& [name, shard] : weight_map)
    if (!found.count(name)) return make_error(m.path + ": tensor " + name + " is listed in the index but not in " + shard);

  ModelConfig c = m.config;
  c.tie_embeddings = c.tie_embeddings || tensors.count("output.weight") == 0;
  m.config = c;
  SS_TRY(check_config(c, m.path));
  SS_TRY(bind_weights(c, tensors, FileFormat::Safetensors, m.path, &m.weights));
  if (opts.check_values) {
    std::function<void(uint64_t, uint64_t)> progress;
    if (opts.progress) progress = [&](uint64_t d, uint64_t t) { opts.progress("check_values", d, t); };
    SS_TRY(check_values(check_items(m.weights, tensors), progress));
  }
  return {};
}

Status load_hf_folder(Model& m, const std::string& dir, const LoadOptions& opts) {
  m.format = FileFormat::Safetensors;
  const std::string cfg_path = dir + "/config.json";
  SS_ASSIGN(std::string cfg_text, read_text_file(cfg_path));
  SS_ASSIGN(m.config, config_from_hf_json(cfg_text, cfg_path));
  SS_ASSIGN(st::Shards shards, st::find_shards(dir));
  if (opts.verify_sha256) {
    if (shards.files.size() != 1)
      return make_error(dir + ": verify_sha256 needs a single-file model, this one has " +
                        std::to_string(shards.files.size()) + " shards");
    SS_TRY(verify_sha256(dir + "/" + shards.files[0], *opts.verify_sha256, opts));
  }

  if (opts.progress) opts.progress("parse", 0, shards.files.size());
  std::vector<st::File> parsed;
  parsed.reserve(shards.files.size());  // views below point into it
  std::vector<ShardView> views;
  for (const auto& name : shards.files) {
    SS_ASSIGN(auto f, MappedFile::open(dir + "/" + name));
    SS_ASSIGN(st::File p, st::parse(f->data(), f->size(), f->path()));
    m.file_bytes += f->size();
    parsed.push_back(std::move(p));
    views.push_back({&parsed.back(), f->data()});
    m.files.push_back(std::move(f));
    if (opts.progress) opts.progress("parse", parsed.size(), shards.files.size());
  }
  SS_TRY(build_from_safetensors(m, views, shards.weight_map, opts));
  SS_ASSIGN(m.chat_template, read_chat_template(dir));

  if (opts.load_tokenizer) {
    if (opts.progress) opts.progress("tokenizer", 0, 1);
    auto tk = tok::Tokenizer::from_json_file(dir + "/tokenizer.json");
    if (!tk) return tk.error();
    if (tk.value()->vocab_size() > m.config.vocab_size)
      return make_error(dir + ": tokenizer has " + std::to_string(tk.value()->vocab_size()) +
                        " tokens, the embedding only " + std::to_string(m.config.vocab_size));
    m.tokenizer = std::move(tk.value());
    if (m.chat_template.empty()) m.chat_template = m.tokenizer->chat_template();
    if (opts.progress) opts.progress("tokenizer", 1, 1);
  }
  return {};
}

}  // namespace ss::model
