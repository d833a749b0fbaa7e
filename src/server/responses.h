// Response and chunk building: OpenAI's completion / chat bodies, streamed chunks, usage, tool-call
// answers, and their serialization (SSE framing, invalid UTF-8 replaced).
#pragma once
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "server/api_types.h"

namespace ss::server {

// {"error": {"message", "type", "param", "code"}}
std::string error_body(const ApiError& e);

// The engine's prompt logprobs (tokens 1 .. n-1 of `ids`) as TokenLogprobs.
std::vector<TokenLogprob> prompt_token_logprobs(const std::vector<int32_t>& ids,
                                                const std::vector<engine::PromptLogprob>& lps);

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
// A chat choice's text as OpenAI tool calls and the content beside them (api_types.h's ToolAnswer).
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
