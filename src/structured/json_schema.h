// JSON Schema → Grammar for structured outputs (OpenAI's response_format json_schema, vLLM's
// guided_json). The grammar matches JSON texts valid under the schema, written compactly or with
// short runs of whitespace (at most 20 blanks between tokens, so a model cannot loop on newlines).
//
// Supported: type (one or a list), enum, const, properties / required / additionalProperties
// (declared properties come in the declared order, optional ones may be left out; other keys only
// when additionalProperties is true or a schema), items, minItems / maxItems, minLength /
// maxLength, integer minimum / maximum (and the exclusive forms), a number's minimum >= 0, anyOf /
// oneOf (as anyOf), allOf of one schema, $ref into the same document ($defs, definitions, "#"),
// nullable, boolean schemas, string formats date, time, date-time (RFC 3339) and uuid, string
// pattern (regex.h: JSON Schema's search semantics, JSON-escaped). Annotations
// (title, description, default, examples, other formats, ...) are ignored. Keywords that constrain in a way the grammar does not follow (patternProperties, multipleOf, not,
// if/then/else, prefixItems, uniqueItems, ...) are an error naming the keyword and its place, never
// silently dropped. Numbers have at most 16 integer and 16 fraction digits and a 2-digit exponent.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status.h"
#include "structured/grammar.h"

namespace ss::structured {

struct JsonOptions {
  // No blanks between the JSON text's tokens (vLLM's disable_any_whitespace; tool calls): a small
  // model otherwise spends tokens on newlines and indentation.
  bool compact = false;
};

// An ordered_json, so the declared order of properties survives parsing.
Expected<Grammar> json_schema_grammar(const nlohmann::ordered_json& schema, const JsonOptions& opt = {});
// The same schema's rule added to g (g's root is left alone), so one grammar can hold several schemas.
Expected<int> json_schema_rule(Grammar& g, const nlohmann::ordered_json& schema, const JsonOptions& opt = {});

// OpenAI tool calls as vLLM constrains tool_choice "required": a JSON array of
// {"name": <a tool's name>, "parameters": <that tool's parameters schema>}, at least one call
// (exactly one unless parallel calls are allowed).
struct ToolSchema {
  std::string name;
  nlohmann::ordered_json parameters;
};
Expected<Grammar> tool_calls_grammar(const std::vector<ToolSchema>& tools, bool parallel, const JsonOptions& opt = {});
Grammar json_object_grammar(const JsonOptions& opt = {});  // response_format {"type": "json_object"}: any JSON object
// vLLM's guided_choice: exactly one of the strings (non-empty list of non-empty strings).
Expected<Grammar> choice_grammar(const std::vector<std::string>& choices);

}  // namespace ss::structured
