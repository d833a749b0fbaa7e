// Request parsing: OpenAI-compatible JSON -> GenerationRequest -> engine Requests, and the small
// JSON endpoints (/tokenize, /detokenize, /v1/models). Pure functions (no I/O, no engine): the HTTP
// layer calls them, the unit tests and the fuzzer drive them directly. Every client mistake becomes
// an ApiError with a 4xx status; nothing here throws past its boundary.
#pragma once
#include <nlohmann/json.hpp>

#include <string_view>

#include "server/api_types.h"

namespace ss::server {

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

}  // namespace ss::server
