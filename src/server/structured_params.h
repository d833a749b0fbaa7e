// Structured-output parameters of a request (response_format, structured_outputs / guided_*,
// grammar / json_schema, tool choices) compiled (structured::compile, through the model's grammar
// cache) to the grammar its choices are kept inside.
#pragma once
#include <optional>
#include <string_view>

#include "server/api_types.h"
#include "server/json_fields.h"

namespace ss::server {

// Reads the request's structured-output fields (at most one kind), compiles the grammar (or takes it
// from m.grammar_cache) into g.grammar; tool choices too. A client mistake is the ApiError returned.
std::optional<ApiError> parse_structured(const detail::Fields& f, std::string_view body, const ModelInfo& m,
                                         GenerationRequest& g);

}  // namespace ss::server
