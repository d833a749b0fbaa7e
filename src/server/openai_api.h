// OpenAI-compatible JSON <-> engine Request, as pure functions (no I/O, no engine): the HTTP layer
// calls them, the unit tests and the fuzzer drive them directly. Every client mistake becomes an
// ApiError with a 4xx status and an OpenAI-style body; nothing here throws past its boundary.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/grammar.h"
#include "engine/request.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tool_calls.h"

namespace ss::server {

struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // empty: null
  std::string code;   // empty: null
};
// {"error": {"message", "type", "param", "code"}}
std::string error_body(const ApiError& e);

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

// Compiled structured-output grammars by schema (least recently used out beyond `capacity`), so
// requests with the same schema share one grammar and its cached masks. Thread-safe.
class GrammarCache {
 public:
  explicit GrammarCache(size_t capacity = 64) : capacity_(capacity) {}
  std::shared_ptr<const engine::CompiledGrammar> find(const std::string& key);
  void insert(const std::string& key, std::shared_ptr<const engine::CompiledGrammar> g);
  size_t size() const;

 private:
  size_t capacity_;
  mutable std::mutex mu_;
  uint64_t clock_ = 0;
  std::map<std::string, std::pair<uint64_t, std::shared_ptr<const engine::CompiledGrammar>>> items_;
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
  std::shared_ptr<const engine::TokenTrie> vocab_trie;
  std::shared_ptr<GrammarCache> grammar_cache;  // optional
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
  int logprobs = -1;  // < 0: none; k: each token's logprob plus the top k
  bool echo = false;  // completions: prepend the prompt text
  std::optional<double> timeout_s;
  std::string cache_salt;  // vLLM's: prefix-cache isolation (non-empty when given)
  // Structured outputs (response_format, vLLM's structured_outputs / guided_*, llama.cpp's grammar /
  // json_schema, tool choices): every choice's text is kept inside this grammar. Null: free text.
  std::shared_ptr<const engine::CompiledGrammar> grammar;
  // OpenAI tools (chat): with tool_choice "required" or a named function the grammar holds the
  // calls, and the answer's text becomes message.tool_calls.
  // With "auto" the model writes calls in its own format (tool_format, from its chat template) or
  // answers in text; the calls are parsed out afterwards, as vLLM's tool-call parsers do.
  enum class ToolChoice { None, Named, Required, Auto } tool_choice = ToolChoice::None;
  std::string tool_name;  // Named: the function
  tok::ToolFormat tool_format = tok::ToolFormat::None;  // Auto
  std::string tools_json;  // the tools (declared key order) for the chat template; empty: none
  bool parallel_tool_calls = true;  // false: at most one call ("auto" keeps the first it parses)

  int num_choices() const { return static_cast<int>(prompts.size()) * n; }
  int prompt_index(int choice) const { return choice / n; }
};

// Parses and validates a /v1/completions or /v1/chat/completions body, tokenizes the prompt(s) and
// checks them against the context. Unknown fields are ignored; a known field of the wrong type or
// out of range is a 400 naming it; an unknown model is a 404.
ApiResult<GenerationRequest> parse_generation_request(Endpoint ep, std::string_view body, const ModelInfo& m);

// The engine request for choice `choice` (prompt choice / n, sample choice % n): seed + sample
// index (default_seed when the client gave none), stop ids = the client's plus the model's
// end-of-generation ids unless ignore_eos. Callbacks, deadline and cancel token are the caller's.
engine::Request to_engine_request(const GenerationRequest& g, int choice, const ModelInfo& m, uint64_t default_seed);

// POST /tokenize ({"prompt": str, "add_special_tokens"?} or {"messages": [...],
// "add_generation_prompt"?}; "return_token_strs"?) and POST /detokenize ({"tokens": [ids]}):
// vLLM's bodies. Return the response JSON.
ApiResult<nlohmann::json> tokenize_request(std::string_view body, const ModelInfo& m);
ApiResult<nlohmann::json> detokenize_request(std::string_view body, const ModelInfo& m);

nlohmann::json models_response(const ModelInfo& m);

// --- responses -------------------------------------------------------------------------------

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

// The engine's prompt logprobs (tokens 1 .. n-1 of `ids`) as TokenLogprobs.
std::vector<TokenLogprob> prompt_token_logprobs(const std::vector<int32_t>& ids,
                                                const std::vector<engine::PromptLogprob>& lps);

struct Usage {
  int prompt_tokens = 0;
  int completion_tokens = 0;
};
Usage usage_of(const GenerationRequest& g, const std::vector<ChoiceOutput>& choices);
nlohmann::ordered_json usage_json(const Usage& u);  // {"prompt_tokens", "completion_tokens", "total_tokens"}

nlohmann::ordered_json completion_response(const GenerationRequest& g, const ModelInfo& m, const std::string& id,
                                           int64_t created, const std::vector<ChoiceOutput>& choices);
nlohmann::ordered_json chat_response(const GenerationRequest& g, const ModelInfo& m, const std::string& id,
                                     int64_t created, const std::vector<ChoiceOutput>& choices);

// One streamed chunk for choice `index`. text_offset: where this text starts in the choice's full
// text (completions logprobs). role: chat's first chunk. finish_reason: null while running.
nlohmann::ordered_json completion_chunk(const GenerationRequest& g, const ModelInfo& m, const std::string& id,
                                        int64_t created, int index, const std::string& text,
                                        const std::vector<TokenLogprob>* logprobs, size_t text_offset,
                                        const char* finish_reason);
// The echoed prompt of choice `index` as the first streamed chunk; with logprobs, prompt_lps are
// prompt tokens 1 .. n-1 (null logprobs where missing).
nlohmann::ordered_json completion_echo_chunk(const GenerationRequest& g, const ModelInfo& m, const std::string& id,
                                             int64_t created, int index, const std::vector<TokenLogprob>* prompt_lps);
// A chat choice's text as OpenAI tool calls ([{id, type, function: {name, arguments}}]) and the
// content beside them. called is false when the text holds no whole call (cut by max_tokens, or
// "auto" answered in text): then content is the whole text.
struct ToolAnswer {
  bool called = false;
  nlohmann::ordered_json calls = nlohmann::ordered_json::array();
  std::string content;  // "auto": the text before the calls (may be empty)
};
ToolAnswer tool_answer(const GenerationRequest& g, const std::string& text);
// finish_reason "stop" becomes "tool_calls" when "required" or "auto" called (a named function keeps
// "stop", as OpenAI and vLLM do).
std::string tool_finish_reason(const GenerationRequest& g, const ToolAnswer& a, const std::string& finish_reason);
// Streaming a tool-choice choice: its calls (or, when not whole, its text) in one chunk at the end;
// `streamed` bytes of the text already went out as content ("auto" streams text until a call may begin).
nlohmann::ordered_json chat_tool_chunk(const GenerationRequest& g, const ModelInfo& m, const std::string& id,
                                       int64_t created, int index, const std::string& text,
                                       const std::vector<TokenLogprob>* logprobs, const char* finish_reason,
                                       size_t streamed = 0);
nlohmann::ordered_json chat_chunk(const GenerationRequest& g, const ModelInfo& m, const std::string& id,
                                  int64_t created, int index, const char* role, const std::string* content,
                                  const std::vector<TokenLogprob>* logprobs, const char* finish_reason);
// The final usage chunk (stream_options.include_usage): empty choices.
nlohmann::ordered_json usage_chunk(const GenerationRequest& g, const ModelInfo& m, const std::string& id,
                                   int64_t created, const Usage& u);

// Serializes; invalid UTF-8 (partial tokens) becomes U+FFFD instead of failing.
std::string dump_json(const nlohmann::json& j);
std::string dump_json(const nlohmann::ordered_json& j);
// "data: <payload>\n\n"
std::string sse_event(const std::string& payload);

}  // namespace ss::server
