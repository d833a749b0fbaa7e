// selfserve generate: stream a completion (or a chat reply) to stdout; stats on stderr.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>
#include <string>

#include "backend/backend.h"
#include "chat/chat.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "engine/engine.h"
#include "structured/structured.h"
#include "tokenizer/tokenizer.h"

namespace ss::cli {
namespace {

struct GenerateArgs {
  std::string model;
  std::string prompt;
  std::string system;
  bool chat = false;
  int max_tokens = 256;
  float temperature = 0.8f;
  float top_p = 0.95f;
  int top_k = 40;
  float min_p = 0.05f;
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  int64_t seed = -1;
  int threads = 0;
  int ctx = 0;
  bool quiet = false;
  std::string json_schema, json_schema_file, grammar, grammar_file, regex;
  backend::KvCacheConfig::DType kv_dtype = backend::KvCacheConfig::DType::F16;
  DeviceArgs device;
};

void run_generate(const GenerateArgs& a) {
  auto m = open_model(a.model, {}, a.quiet);
  if (!m.ok()) return fail(m.message());
  model::Model& model = **m;
  const tok::Tokenizer& tk = *model.tokenizer;

  std::string text = a.prompt;
  if (a.chat) {
    std::vector<chat::ChatMessage> msgs;
    if (!a.system.empty()) msgs.push_back({"system", a.system});
    msgs.push_back({"user", a.prompt});
    auto rendered = chat::render_chat(model.chat_template, msgs, true, &tk);
    if (!rendered.ok()) return fail(rendered.message());
    text = *rendered;
  }
  // A template that already begins with the BOS text must not get a second BOS.
  bool add_special = tk.add_bos();
  if (a.chat && tk.bos_id() >= 0 && text.rfind(std::string(tk.token_text(tk.bos_id())), 0) == 0) add_special = false;
  const std::vector<int32_t> ids = tk.encode(text, add_special, /*parse_special=*/true);
  if (ids.empty()) return fail("the prompt is empty");

  const int max_ctx = model.config.max_context > 0 ? model.config.max_context : 4096;
  int ctx = a.ctx > 0 ? a.ctx : std::min<int>(max_ctx, static_cast<int>(ids.size()) + a.max_tokens);
  if (static_cast<int>(ids.size()) >= ctx)
    return fail("the prompt has " + std::to_string(ids.size()) + " tokens; the context holds " + std::to_string(ctx) +
                " (raise --ctx, at most " + std::to_string(max_ctx) + ")");
  backend::BackendOptions bo;
  bo.threads = a.threads;
  bo.kv.block_size = 16;
  bo.kv.num_blocks = (ctx + bo.kv.block_size - 1) / bo.kv.block_size;
  bo.kv.dtype = a.kv_dtype;
  std::string device;
  auto be = make_backend(model, bo, a.device, &device);
  if (!be.ok()) return fail(be.message());
  if (!a.quiet) std::fprintf(stderr, "selfserve: device %s\n", device.c_str());

  engine::SamplingParams sp;
  sp.temperature = a.temperature;
  sp.top_p = a.top_p;
  sp.top_k = a.top_k;
  sp.min_p = a.min_p;
  sp.repetition_penalty = a.repetition_penalty;
  sp.presence_penalty = a.presence_penalty;
  sp.frequency_penalty = a.frequency_penalty;
  sp.seed = a.seed >= 0 ? static_cast<uint64_t>(a.seed) : std::random_device{}();
  if (auto st = sp.validate(); !st.ok()) return fail(st.message());

  engine::Request req;
  req.prompt = ids;
  req.sampling = sp;
  // Generation ends when the context is full, whatever --max-tokens asks.
  req.max_tokens = std::min(a.max_tokens, ctx - static_cast<int>(ids.size()));
  req.stop_ids = tk.eog_ids();
  // llama.cpp's -j / --json-schema-file / --grammar / --grammar-file, and a regex: at most one.
  const int n_constraints = !(a.json_schema.empty() && a.json_schema_file.empty()) +
                            !(a.grammar.empty() && a.grammar_file.empty()) + !a.regex.empty();
  if (n_constraints > 1) return fail("give one of --json-schema(-file), --grammar(-file) and --regex");
  if (n_constraints == 1) {
    auto read = [&](const std::string& inline_text, const std::string& path, std::string& out) {
      out = inline_text;
      if (path.empty()) return true;
      std::ifstream f(path, std::ios::binary);
      if (!f) return false;
      out.assign(std::istreambuf_iterator<char>(f), {});
      return true;
    };
    std::string text = a.regex, flag = "--regex";
    structured::Kind kind = structured::Kind::Regex;
    if (!a.grammar.empty() || !a.grammar_file.empty()) {
      if (!read(a.grammar, a.grammar_file, text)) return fail(a.grammar_file + ": cannot read");
      kind = structured::Kind::Gbnf;
      flag = "--grammar";
    } else if (a.regex.empty()) {
      if (!read(a.json_schema, a.json_schema_file, text)) return fail(a.json_schema_file + ": cannot read");
      kind = structured::Kind::JsonSchema;
      flag = "--json-schema";
    }
    auto compiled = structured::compile(kind, text, {}, {.tokenizer = &tk});
    if (!compiled.ok()) return fail(flag + ": " + compiled.message());
    req.constraint = std::make_shared<structured::GrammarConstraint>(*compiled, req.stop_ids);
  }
  tok::StreamDecoder dec(tk);
  auto st = run_one_request(**be, std::move(req), 512, [&](int32_t id) {
    const std::string piece = dec.push(id);
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
  });
  const std::string tail = dec.flush();
  std::fwrite(tail.data(), 1, tail.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
  if (!st.ok()) return fail(st.message());
  const auto& s = *st;
  const double decode_tps = s.generated_tokens > 1 ? (s.generated_tokens - 1) / s.decode_seconds : 0.0;
  std::fprintf(stderr,
               "prompt: %d tokens, prefill %.1f tok/s | generated: %d tokens, decode %.1f tok/s | peak RSS %.1f MiB\n",
               s.prompt_tokens, s.prompt_tokens / s.prefill_seconds, s.generated_tokens, decode_tps,
               peak_rss_bytes() / 1048576.0);
}

}  // namespace

void register_generate(CLI::App& app) {
  auto a = std::make_shared<GenerateArgs>();
  auto* c = app.add_subcommand("generate", "Generate text from a prompt, streamed to stdout");
  c->add_option("--model,-m", a->model, "GGUF file or Hugging Face folder (default: the embedded SmolLM2-135M)");
  c->add_option("--prompt,-p", a->prompt, "Prompt text")->required();
  c->add_flag("--chat", a->chat, "Wrap the prompt in the model's chat template as a user message");
  c->add_option("--system", a->system, "System message (with --chat)");
  c->add_option("--max-tokens,-n", a->max_tokens, "Tokens to generate at most")->check(CLI::Range(1, 1 << 20));
  c->add_option("--temperature,-t", a->temperature, "Sampling temperature (0: greedy)");
  c->add_option("--top-p", a->top_p, "Nucleus sampling mass (1: off)");
  c->add_option("--top-k", a->top_k, "Keep the k most likely tokens (0: off)");
  c->add_option("--min-p", a->min_p, "Drop tokens below min-p times the top probability (0: off)");
  c->add_option("--repetition-penalty", a->repetition_penalty, "CTRL-style repetition penalty (1: off)");
  c->add_option("--presence-penalty", a->presence_penalty, "OpenAI presence penalty");
  c->add_option("--frequency-penalty", a->frequency_penalty, "OpenAI frequency penalty");
  c->add_option("--seed,-s", a->seed, "Random seed (same seed, same text); default random");
  c->add_option("--threads", a->threads, "CPU threads (default: all cores)");
  c->add_option("--ctx", a->ctx, "Context size in tokens (default: prompt + max-tokens)");
  add_kv_dtype_option(c, &a->kv_dtype);
  add_device_options(c, &a->device);
  c->add_flag("--quiet,-q", a->quiet, "No progress output");
  c->add_option("--json-schema,-j", a->json_schema,
                "Keep the output inside this JSON Schema (e.g. '{}' for any JSON value, '{\"type\": \"object\"}')");
  c->add_option("--json-schema-file", a->json_schema_file, "The same, read from a file");
  c->add_option("--grammar", a->grammar, "Keep the output inside this GBNF grammar (llama.cpp's format; starts at 'root')");
  c->add_option("--grammar-file", a->grammar_file, "The same, read from a file");
  c->add_option("--regex", a->regex, "Keep the output a whole match of this regular expression (ECMAScript syntax)");
  c->callback([a] { run_generate(*a); });
}

}  // namespace ss::cli
