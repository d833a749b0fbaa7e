// Helpers for the tokenizer tests: fixture paths, JSON files, the SmolLM2 GGUF's tokenizer metadata.
#pragma once
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"

namespace ss::tok::test {

inline std::string data_dir() { return std::string(SS_SOURCE_DIR) + "/tests/data/tokenizer/"; }

inline std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline nlohmann::json read_json(const std::string& path) { return nlohmann::json::parse(read_text(path)); }

inline std::string from_hex(const std::string& h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2) out.push_back(char(std::stoi(h.substr(i, 2), nullptr, 16)));
  return out;
}

// The model the project uses by default; tests that need it skip when it is absent.
inline std::string smollm2_gguf() {
  if (const char* p = std::getenv("SS_SMOLLM2_GGUF")) return p;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "") + "/.cache/selfserve/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

// Reads the tokenizer.ggml.* metadata of a GGUF file into a spec (just enough GGUF for the test;
// the real loader is src/model/gguf.cpp). Returns false when the file cannot be read.
inline bool read_gguf_spec(const std::string& path, TokenizerSpec& spec) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  auto rd = [&](void* p, size_t n) { f.read(static_cast<char*>(p), std::streamsize(n)); return bool(f); };
  auto u32 = [&] { uint32_t v = 0; rd(&v, 4); return v; };
  auto u64 = [&] { uint64_t v = 0; rd(&v, 8); return v; };
  auto str = [&] { uint64_t n = u64(); std::string s(n, '\0'); rd(s.data(), n); return s; };
  char magic[4];
  if (!rd(magic, 4) || std::string(magic, 4) != "GGUF") return false;
  u32();
  u64();
  uint64_t n_kv = u64();
  const size_t size_of[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
  for (uint64_t k = 0; k < n_kv && f; ++k) {
    std::string key = str();
    uint32_t type = u32();
    auto scalar_i64 = [&](uint32_t t) -> int64_t {
      int64_t v = 0;
      rd(&v, size_of[t]);
      if (t == 5 && (v & 0x80000000)) v |= ~int64_t(0xFFFFFFFF);
      return v;
    };
    if (type == 8) {
      std::string v = str();
      if (key == "tokenizer.ggml.model") spec.model = v;
      if (key == "tokenizer.ggml.pre") spec.pre = v;
      if (key == "tokenizer.chat_template") spec.chat_template = v;
    } else if (type == 9) {
      uint32_t et = u32();
      uint64_t n = u64();
      for (uint64_t i = 0; i < n; ++i) {
        if (et == 8) {
          std::string s = str();
          if (key == "tokenizer.ggml.tokens") spec.tokens.push_back(std::move(s));
          if (key == "tokenizer.ggml.merges") spec.merges.push_back(std::move(s));
        } else if (et == 6) {
          float v;
          rd(&v, 4);
          if (key == "tokenizer.ggml.scores") spec.scores.push_back(v);
        } else if (et < 13 && size_of[et]) {
          int64_t v = scalar_i64(et);
          if (key == "tokenizer.ggml.token_type") spec.token_types.push_back(int32_t(v));
        } else {
          return false;
        }
      }
    } else if (type < 13 && size_of[type]) {
      int64_t v = scalar_i64(type);
      if (key == "tokenizer.ggml.bos_token_id") spec.bos_id = int32_t(v);
      if (key == "tokenizer.ggml.eos_token_id") spec.eos_id = int32_t(v);
      if (key == "tokenizer.ggml.unknown_token_id") spec.unk_id = int32_t(v);
      if (key == "tokenizer.ggml.padding_token_id") spec.pad_id = int32_t(v);
      if (key == "tokenizer.ggml.eot_token_id") spec.eot_id = int32_t(v);
      if (key == "tokenizer.ggml.add_bos_token") spec.add_bos = v != 0;
      if (key == "tokenizer.ggml.add_eos_token") spec.add_eos = v != 0;
      if (key == "tokenizer.ggml.add_space_prefix") spec.add_space_prefix = v != 0;
    } else {
      return false;
    }
  }
  return bool(f);
}

// A GGUF-style spec from one of the synthetic tokenizer.json fixtures (as a converter would write it).
inline TokenizerSpec spec_from_tokenizer_json(const nlohmann::json& j, const std::string& pre) {
  TokenizerSpec s;
  s.model = "gpt2";
  s.pre = pre;
  size_t n = j["model"]["vocab"].size();
  for (const auto& a : j["added_tokens"]) n = std::max<size_t>(n, a["id"].get<size_t>() + 1);
  s.tokens.resize(n);
  s.token_types.assign(n, int32_t(TokenType::Normal));
  for (auto it = j["model"]["vocab"].begin(); it != j["model"]["vocab"].end(); ++it) s.tokens[it.value().get<size_t>()] = it.key();
  for (const auto& a : j["added_tokens"]) {
    size_t id = a["id"].get<size_t>();
    s.tokens[id] = a["content"].get<std::string>();
    s.token_types[id] = int32_t(a["special"].get<bool>() ? TokenType::Control : TokenType::UserDefined);
  }
  for (const auto& m : j["model"]["merges"]) {
    s.merges.push_back(m.is_string() ? m.get<std::string>() : m[0].get<std::string>() + " " + m[1].get<std::string>());
  }
  s.add_space_prefix = false;
  return s;
}

}  // namespace ss::tok::test
