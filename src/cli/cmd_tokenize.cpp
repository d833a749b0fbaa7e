// selfserve tokenize: text on stdin → token ids (and pieces with --json); --decode does the reverse.
#include <nlohmann/json.hpp>

#include <cstdio>
#include <iostream>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>

#include "cli/commands.h"
#include "cli/common.h"
#include "tokenizer/tokenizer.h"

namespace ss::cli {
namespace {

struct TokenizeArgs {
  std::string model;
  bool json = false;
  bool decode = false;
  bool add_special = false;
  bool no_parse_special = false;
};

// Ids as whitespace/comma separated integers or a JSON array; anything else is an error.
Expected<std::vector<int32_t>> parse_ids(const std::string& in, int32_t vocab) {
  std::vector<int32_t> ids;
  std::string norm = in;
  for (char& c : norm)
    if (c == ',' || c == '[' || c == ']') c = ' ';
  std::istringstream ss(norm);
  std::string word;
  while (ss >> word) {
    char* end = nullptr;
    errno = 0;
    const long v = std::strtol(word.c_str(), &end, 10);
    if (errno || *end != '\0') return make_error("not a token id: '" + word + "'");
    if (v < 0 || v >= vocab)
      return make_error("token id " + word + " is out of range [0, " + std::to_string(vocab) + ")");
    ids.push_back(static_cast<int32_t>(v));
  }
  return ids;
}

void run_tokenize(const TokenizeArgs& a) {
  model::LoadOptions lo;
  auto m = open_model(a.model, lo, true);
  if (!m.ok()) return fail(m.message());
  const tok::Tokenizer& tk = *(*m)->tokenizer;
  const std::string in((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());

  if (a.decode) {
    auto ids = parse_ids(in, tk.vocab_size());
    if (!ids.ok()) return fail(ids.message());
    const std::string text = tk.decode(*ids, /*skip_special=*/false);
    if (a.json) {
      std::cout << nlohmann::json{{"text", text}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    } else {
      std::fwrite(text.data(), 1, text.size(), stdout);
    }
    return;
  }
  const auto ids = tk.encode(in, a.add_special, !a.no_parse_special);
  if (a.json) {
    nlohmann::json j;
    j["ids"] = ids;
    auto pieces = nlohmann::json::array();
    for (int32_t id : ids) pieces.push_back(tk.token_to_piece(id));
    j["pieces"] = pieces;
    // Pieces may be partial UTF-8 (a character split over tokens): replace rather than fail.
    std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  } else {
    for (size_t i = 0; i < ids.size(); ++i) std::cout << (i ? " " : "") << ids[i];
    std::cout << "\n";
  }
}

}  // namespace

void register_tokenize(CLI::App& app) {
  auto a = std::make_shared<TokenizeArgs>();
  auto* c = app.add_subcommand("tokenize", "Token ids of the text on stdin (or text of the ids with --decode)");
  c->add_option("--model,-m", a->model, "GGUF file or Hugging Face folder (default: the embedded model)");
  c->add_flag("--json", a->json, "JSON output with ids and pieces");
  c->add_flag("--decode", a->decode, "Read token ids on stdin and print their text");
  c->add_flag("--add-special", a->add_special, "Add BOS/EOS as the model wants");
  c->add_flag("--no-parse-special", a->no_parse_special, "Treat special-token text as plain text");
  c->callback([a] { run_tokenize(*a); });
}

}  // namespace ss::cli
