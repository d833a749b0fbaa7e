// The server's plain data: what a parsed OpenAI request is (GenerationRequest), what the parsers
// need to know about the model (ModelInfo), what a choice produced (ChoiceOutput), and the error a
// client mistake becomes (ApiError). No behaviour here.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "chat/chat.h"
#include "engine/engine.h"
#include "structured/structured.h"
#include "tokenizer/tokenizer.h"

namespace ss::server {

struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // empty: null
  std::string code;   // empty: null
};

template <class T>
class ApiResult {
 public:
  ApiResult(T v) : v_(std::move(v)) {}          // NOLINT: implicit by design
  ApiResult(ApiError e) : e_(std::move(e)) {}   // NOLINT
  bool ok() const { return v_.has_value(); }
  T& value() { return *v_; }
  const T& value() const { return *v_; }
  const ApiError& error() const { return e_; }

 private:
  std::optional<T> v_;
  ApiError e_;
};

// What the parser needs to know about the served model.
struct ModelInfo {
  std::string id;                          // the name clients pass as "model"
  int max_model_len = 0;                   // prompt + max_tokens must fit
  int vocab_size = 0;                      // valid token ids: [0, vocab_size)
  const tok::Tokenizer* tokenizer = nullptr;
  std::string chat_template;               // may be empty (render_chat's fallback applies)
  int64_t created = 0;                     // unix time, for /v1/models
  int max_choices = 64;                    // prompts x n per request
  int max_logprobs = 20;
  int max_stop = 16;                       // stop strings per request
  size_t max_stop_bytes = 256;             // per stop string
  // The vocabulary's byte trie for structured outputs (built once at start-up; built on demand
  // from `tokenizer` when missing).
  std::shared_ptr<const structured::TokenTrie> vocab_trie;
  std::shared_ptr<structured::GrammarCache> grammar_cache;  // optional
};

enum class Endpoint { Completions, ChatCompletions };

struct PromptInput {
  std::vector<int32_t> ids;
  std::string text;  // for echo: the prompt as given (token prompts: decoded)
};

struct GenerationRequest {
  Endpoint endpoint = Endpoint::Completions;
  std::vector<PromptInput> prompts;  // chat: exactly one (the rendered conversation)
  int n = 1;                         // choices per prompt
  int max_tokens = 16;
  engine::SamplingParams sampling;   // seed filled per choice by to_engine_request
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;  // the client's; the model's end-of-generation ids are added
  int min_tokens = 0;                   // vLLM's: no stop (id or string) before this many tokens
  bool include_stop_str_in_output = false;  // vLLM's: keep the matched stop string in the text
  bool ignore_eos = false;
  bool return_tokens_as_token_ids = false;  // vLLM's: logprobs name tokens "token_id:<id>"
  bool skip_special_tokens = true;
  bool stream = false;
  bool include_usage = false;
  bool continuous_usage_stats = false;  // vLLM's stream_options: usage in every chunk (with include_usage)
  // selfserve's: usage.timeline, each choice's arrival, queueing, scheduling, first token,
  // preemptions and finish (docs/observability.md); streamed, it needs include_usage.
  bool include_timeline = false;
  int logprobs = -1;  // < 0: none; k: each token's logprob plus the top k
  bool echo = false;  // completions: prepend the prompt text
  std::optional<double> timeout_s;
  std::string cache_salt;  // vLLM's: prefix-cache isolation (non-empty when given)
  // Structured outputs (response_format, vLLM's structured_outputs / guided_*, llama.cpp's grammar /
  // json_schema, tool choices): every choice's text is kept inside this grammar. Null: free text.
  std::shared_ptr<const structured::CompiledGrammar> grammar;
  // OpenAI tools (chat): with tool_choice "required" or a named function the grammar holds the
  // calls, and the answer's text becomes message.tool_calls.
  // With "auto" the model writes calls in its own format (tool_format, from its chat template) or
  // answers in text; the calls are parsed out afterwards, as vLLM's tool-call parsers do.
  enum class ToolChoice { None, Named, Required, Auto } tool_choice = ToolChoice::None;
  std::string tool_name;  // Named: the function
  chat::ToolFormat tool_format = chat::ToolFormat::None;  // Auto
  std::string tools_json;  // the tools (declared key order) for the chat template; empty: none
  bool parallel_tool_calls = true;  // false: at most one call ("auto" keeps the first it parses)

  int num_choices() const { return static_cast<int>(prompts.size()) * n; }
  int prompt_index(int choice) const { return choice / n; }
};

struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top;
};

struct ChoiceOutput {
  int index = 0;
  std::string text;           // generated text (without the echoed prompt)
  std::string finish_reason;  // "stop", "length", "abort"
  std::optional<std::string> stop_reason;  // the matched stop string, if any
  std::vector<TokenLogprob> logprobs;
  // echo + logprobs (completions): prompt tokens 1 .. n-1, from the engine's first token event;
  // empty when none came (e.g. aborted first), and then the prompt's logprobs are null.
  std::vector<TokenLogprob> prompt_logprobs;
  int completion_tokens = 0;
};

struct Usage {
  int prompt_tokens = 0;
  int completion_tokens = 0;
};

// A chat choice's text as OpenAI tool calls ([{id, type, function: {name, arguments}}]) and the
// content beside them. called is false when the text holds no whole call (cut by max_tokens, or
// "auto" answered in text): then content is the whole text.
struct ToolAnswer {
  bool called = false;
  nlohmann::ordered_json calls = nlohmann::ordered_json::array();
  std::string content;  // "auto": the text before the calls (may be empty)
};

}  // namespace ss::server
