// libFuzzer target: request bodies -> the OpenAI JSON parsers (completions, chat, tokenize,
// detokenize) and, for accepted requests, the engine requests and every response builder. A
// rejection must be a 4xx with a message; nothing may crash, leak or hang.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "server/openai_api.h"
#include "server/text_output.h"

namespace {

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct Env {
  std::unique_ptr<ss::tok::Tokenizer> tok;
  ss::server::ModelInfo m;
  Env() {
    // The small Qwen2-style test tokenizer (ChatML template), next to this file's repository.
    std::string root = __FILE__;
    root = root.substr(0, root.rfind('/')) + "/../tests/data/tokenizer/";
    auto t = ss::tok::Tokenizer::from_json_text(slurp(root + "qwen2.tokenizer.json"),
                                                slurp(root + "qwen2.tokenizer_config.json"), "qwen2.tokenizer.json");
    if (!t.ok()) std::abort();
    tok = std::move(t).value();
    m.id = "fuzz-model";
    m.max_model_len = 512;
    m.vocab_size = tok->vocab_size();
    m.tokenizer = tok.get();
    m.chat_template = tok->chat_template();
    m.vocab_trie = ss::structured::TokenTrie::build(*tok);
  }
};

void check(const ss::server::ApiError& e) {
  if (e.status < 400 || e.status > 499 || e.message.empty()) std::abort();
  (void)ss::server::error_body(e);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ss::server;
  static Env env;
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  for (Endpoint ep : {Endpoint::Completions, Endpoint::ChatCompletions}) {
    auto r = parse_generation_request(ep, body, env.m);
    if (!r.ok()) {
      check(r.error());
      continue;
    }
    const GenerationRequest& g = r.value();
    if (g.num_choices() < 1 || g.num_choices() > env.m.max_choices || g.max_tokens < 1) std::abort();
    std::vector<ChoiceOutput> outs;
    for (int c = 0; c < g.num_choices(); ++c) {
      ss::engine::Request er = to_engine_request(g, c, env.m, 1);
      const size_t total = er.prompt.size() + static_cast<size_t>(er.max_tokens);
      if (er.prompt.empty() || total > static_cast<size_t>(env.m.max_model_len)) std::abort();
      if (!er.sampling.validate().ok()) std::abort();
      if (er.min_tokens < 0 || er.min_tokens > er.max_tokens) std::abort();
      for (int32_t id : er.prompt)
        if (id < 0 || id >= env.m.vocab_size) std::abort();
      for (const auto& [id, v] : er.sampling.logit_bias)
        if (id < 0 || id >= env.m.vocab_size || !(v >= -100.0f && v <= 100.0f)) std::abort();
      // Structured outputs: follow the grammar for a few tokens, always taking the first token the
      // mask leaves; with end ids there is always one (the way out when the grammar is stuck).
      std::string walked;  // the text the walk generated (tool calls are parsed from it below)
      if (er.constraint) {
        std::vector<float> logits(static_cast<size_t>(env.m.vocab_size));
        for (int step = 0; step < 24 && !er.constraint->must_end(); ++step) {
          std::fill(logits.begin(), logits.end(), 0.0f);
          er.constraint->mask(logits.data(), env.m.vocab_size);
          int32_t pick = -1;
          for (int32_t id = 0; id < env.m.vocab_size && pick < 0; ++id)
            if (logits[static_cast<size_t>(id)] == 0.0f) pick = id;
          if (pick < 0) {
            if (!er.stop_ids.empty()) std::abort();
            break;
          }
          if (std::find(er.stop_ids.begin(), er.stop_ids.end(), pick) != er.stop_ids.end()) break;
          er.constraint->accept(pick);
          walked += env.tok->token_to_piece(pick);
        }
        (void)dump_json(chat_tool_chunk(g, env.m, "id", 0, c, walked, nullptr, "stop"));
        (void)dump_json(tool_answer(g, walked).calls);
      }
      // Replay the prompt as if it were generated: stop strings and the text path see real tokens.
      TextOutput text(*env.tok, g.stop, g.skip_special_tokens, g.min_tokens, g.include_stop_str_in_output);
      ChoiceOutput o;
      o.index = c;
      for (size_t i = 0; i < er.prompt.size() && i < 64; ++i) {
        const bool stopped = text.push(er.prompt[i]);
        o.text += text.take();
        o.logprobs.push_back(TokenLogprob{er.prompt[i], -1.0f, {{er.prompt[i], -1.0f}, {0, -2.0f}}});
        ++o.completion_tokens;
        if (stopped) break;
      }
      o.text += text.finish();
      o.finish_reason = text.stopped() ? "stop" : "length";
      outs.push_back(std::move(o));
    }
    (void)dump_json(g.endpoint == Endpoint::ChatCompletions ? chat_response(g, env.m, "id", 0, outs)
                                                            : completion_response(g, env.m, "id", 0, outs));
    (void)dump_json(completion_chunk(g, env.m, "id", 0, 0, outs[0].text, &outs[0].logprobs, 0, "stop"));
    (void)dump_json(chat_chunk(g, env.m, "id", 0, 0, "assistant", &outs[0].text, &outs[0].logprobs, nullptr));
    // "auto": the replayed text through the call parser, as the last chunk after a streamed part.
    if (g.tool_choice == GenerationRequest::ToolChoice::Auto)
      (void)dump_json(chat_tool_chunk(g, env.m, "id", 0, 0, outs[0].text, &outs[0].logprobs, "stop",
                                      ss::chat::tool_content_prefix(g.tool_format, outs[0].text)));
  }
  auto t = tokenize_request(body, env.m);
  if (t.ok()) (void)dump_json(t.value());
  else check(t.error());
  auto d = detokenize_request(body, env.m);
  if (d.ok()) (void)dump_json(d.value());
  else check(d.error());
  return 0;
}
