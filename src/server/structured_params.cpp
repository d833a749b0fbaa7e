#include "server/structured_params.h"

#include <algorithm>
#include <cctype>
#include <functional>
#include <set>


namespace ss::server {

using namespace detail;

// Structured outputs: OpenAI's response_format (text, json_object, json_schema), vLLM's
// structured_outputs (json, regex, choice, grammar, json_object) or older guided_json /
// guided_regex / guided_choice / guided_grammar, llama.cpp's grammar / json_schema; at most one. Schemas are read again from the body as
// ordered_json so their properties keep the declared order (the generation order).
std::optional<ApiError> parse_structured(const Fields& f, std::string_view body, const ModelInfo& m,
                                         GenerationRequest& g) {
  // What was asked for: the parameter and what structured::compile makes of it.
  std::string param, spec;
  std::optional<structured::Kind> kind;
  structured::Options opt;
  // The schema again, from the text, with its key order (the request was parsed into std::map objects).
  std::optional<ApiError> order_error;
  auto ordered = [&](std::string_view text, std::vector<std::string> path, const char* name) -> ojson {
    OrderedSubtree sax(std::move(path));
    const bool parsed = ojson::sax_parse(text, &sax);
    if (!parsed || !sax.result || sax.too_many_keys || sax.too_deep) {
      order_error = bad(std::string("'") + name + "': " +
                            (sax.too_deep ? "it nests deeper than " + std::to_string(kMaxJsonDepth) + " levels"
                             : sax.too_many_keys ? "an object in the schema has more than " + std::to_string(kMaxSchemaKeys) + " keys"
                                               : std::string("the schema is not valid JSON")),
                        name);
      return ojson::object();
    }
    return std::move(*sax.result);
  };
  auto take = [&](const char* name, structured::Kind k, std::string sp, structured::Options o = {}) -> std::optional<ApiError> {
    if (kind)
      return bad(std::string("'") + name + "' cannot be combined with '" + param + "': give one structured-output constraint",
                 name);
    param = name;
    kind = k;
    spec = std::move(sp);
    opt = o;
    return std::nullopt;
  };
  // OpenAI tools (chat): tool_choice "required" or a named function is kept inside a grammar, as vLLM
  // does without a tool-call parser; "none" ignores the tools. "auto" (the default with tools) lets the
  // model choose between text and calls in its own format, which needs a parser per model family:
  // not here yet, so it is a 400 (as vLLM's without --enable-auto-tool-choice), never ignored.
  if (g.endpoint == Endpoint::ChatCompletions) {
    const json* tools = f.get("tools");
    bool parallel = true;
    if (const json* p = f.get("parallel_tool_calls")) {
      if (!p->is_boolean()) return bad("'parallel_tool_calls' must be a boolean", "parallel_tool_calls");
      parallel = p->get<bool>();
    }
    g.parallel_tool_calls = parallel;
    std::string mode = tools ? "auto" : "none", named;
    if (const json* tc = f.get("tool_choice")) {
      if (tc->is_string() && (*tc == "none" || *tc == "auto" || *tc == "required")) {
        mode = tc->get<std::string>();
      } else if (tc->is_object() && tc->value("type", json()) == "function" && tc->contains("function") &&
                 (*tc)["function"].is_object() && (*tc)["function"].value("name", json()).is_string()) {
        mode = "named";
        named = (*tc)["function"]["name"].get<std::string>();
      } else {
        return bad("'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": "
                   "{\"name\": ...}}",
                   "tool_choice");
      }
    }
    if (!tools && mode != "none") return bad("'tool_choice' needs 'tools'", "tool_choice");
    if (tools) {
      if (!tools->is_array() || tools->empty()) return bad("'tools' must be a non-empty array of tools", "tools");
      std::set<std::string> names;
      for (size_t i = 0; i < tools->size(); ++i) {
        const json& t = (*tools)[i];
        const std::string where = "tools[" + std::to_string(i) + "]";
        if (!t.is_object() || t.value("type", json()) != "function" || !t.contains("function") || !t["function"].is_object())
          return bad(where + " must be {\"type\": \"function\", \"function\": {...}}", "tools");
        const json& fn = t["function"];
        const json name = fn.value("name", json());
        const bool name_ok = name.is_string() && !name.get_ref<const std::string&>().empty() &&
                             name.get_ref<const std::string&>().size() <= 64 &&
                             std::all_of(name.get_ref<const std::string&>().begin(), name.get_ref<const std::string&>().end(),
                                         [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-'; });
        if (!name_ok) return bad(where + ".function.name must be 1-64 letters, digits, '_' or '-'", "tools");
        if (!names.insert(name.get<std::string>()).second)
          return bad(where + ".function.name '" + name.get<std::string>() + "' is given twice", "tools");
        if (fn.contains("parameters") && !fn["parameters"].is_null() && !fn["parameters"].is_object())
          return bad(where + ".function.parameters must be a JSON Schema object", "tools");
      }
      if (mode == "auto") {
        // The model chooses between text and calls in its own format; the calls are parsed afterwards.
        g.tool_format = chat::tool_format(m.chat_template);
        if (g.tool_format == chat::ToolFormat::None)
          return bad("tool_choice \"auto\" needs a chat template with a tool-call format (Qwen2.5's <tool_call>, "
                     "Llama 3.1+'s JSON calls); this model's has none: use \"required\", a named function, or \"none\"",
                     "tool_choice", "unsupported_parameter");
        g.tool_choice = GenerationRequest::ToolChoice::Auto;
      }
      if (mode != "none") {
        // The tools again with their key order (parameters are generated in the declared order, and
        // the chat template writes them as given).
        const ojson tools_o = ordered(body, {"tools"}, "tools");
        if (order_error) return order_error;
        g.tools_json = tools_o.dump();
        ojson specs = ojson::array();  // [{"name", "parameters"}]: structured::Kind::ToolCalls' spec
        for (const ojson& t : tools_o) {  // the same tools as validated above, read a second time
          const ojson fn = t.is_object() ? t.value("function", ojson()) : ojson();
          if (!fn.is_object() || !fn.value("name", ojson()).is_string()) return bad("'tools' changed on a second read", "tools");
          auto p = fn.find("parameters");
          specs.push_back({{"name", fn["name"]},
                           {"parameters", p != fn.end() && !p->is_null() ? *p : ojson{{"type", "object"}, {"properties", ojson::object()},
                                                                                      {"additionalProperties", false}}}});
        }
        if (mode == "auto") {
          // no grammar: text or calls, as the model likes
        } else if (mode == "named") {
          auto it = std::find_if(specs.begin(), specs.end(), [&](const ojson& t) { return t["name"] == named; });
          if (it == specs.end()) return bad("tool_choice names '" + named + "', which is not in 'tools'", "tool_choice");
          g.tool_choice = GenerationRequest::ToolChoice::Named;
          g.tool_name = named;
          // Compact: arguments are data, and a small model otherwise pads them with newlines.
          if (auto e = take("tool_choice", structured::Kind::JsonSchema, (*it)["parameters"].dump(), {.compact = true}))
            return e;
        } else {
          g.tool_choice = GenerationRequest::ToolChoice::Required;
          if (auto e = take("tool_choice", structured::Kind::ToolCalls, specs.dump(),
                            {.compact = true, .parallel_calls = parallel}))
            return e;
        }
      }
    }
  }
  if (const json* rf = f.get("response_format")) {
    auto t = rf->is_object() ? rf->find("type") : rf->end();
    if (!rf->is_object() || t == rf->end() || !t->is_string())
      return bad("'response_format' must be an object with a 'type'", "response_format");
    const std::string& type = t->get_ref<const std::string&>();
    if (type == "json_object") {
      if (auto e = take("response_format", structured::Kind::JsonObject, "")) return e;
    } else if (type == "json_schema") {
      auto js = rf->find("json_schema");
      if (js == rf->end() || !js->is_object())
        return bad("response_format 'json_schema' needs a 'json_schema' object with a 'schema'", "response_format");
      auto sc = js->find("schema");
      if (sc == js->end() || !(sc->is_object() || sc->is_boolean()))
        return bad("'response_format.json_schema.schema' must be a JSON Schema object", "response_format");
      ojson sc_o = ordered(body, {"response_format", "json_schema", "schema"}, "response_format");
      if (order_error) return order_error;
      if (auto e = take("response_format", structured::Kind::JsonSchema, sc_o.dump())) return e;
    } else if (type != "text") {
      return bad("response_format '" + type + "' is not supported (text, json_object, json_schema)", "response_format",
                 "unsupported_parameter");
    }
  }
  // A JSON Schema given as an object (read again with its key order from `path` in the body) or as a
  // string (vLLM accepts both).
  auto json_value = [&](const json& v, std::vector<std::string> path, const char* name,
                        bool compact = false) -> std::optional<ApiError> {
    if (!(v.is_string() || v.is_object() || v.is_boolean()))
      return bad(std::string("'") + name + "' must be a JSON Schema (object or string), got " + type_name(v), name);
    ojson sc_o = v.is_string() ? ordered(v.get_ref<const std::string&>(), {}, name) : ordered(body, std::move(path), name);
    if (order_error) return order_error;
    return take(name, structured::Kind::JsonSchema, sc_o.dump(), {.compact = compact});
  };
  auto choice = [&](const json& v, const char* name) -> std::optional<ApiError> {
    std::vector<std::string> choices;
    if (v.is_array())
      for (const json& c : v)
        if (c.is_string()) choices.push_back(c.get<std::string>());
    if (!v.is_array() || choices.size() != v.size() || choices.empty())
      return bad(std::string("'") + name + "' must be a non-empty array of strings", name);
    return take(name, structured::Kind::Choice, json(choices).dump());
  };
  auto regex = [&](const json& v, const char* name) -> std::optional<ApiError> {
    if (!v.is_string()) return bad(std::string("'") + name + "' must be a string (a regular expression)", name);
    return take(name, structured::Kind::Regex, v.get<std::string>());
  };
  auto grammar = [&](const json& v, const char* name) -> std::optional<ApiError> {
    if (!v.is_string()) return bad(std::string("'") + name + "' must be a string (a GBNF grammar)", name);
    return take(name, structured::Kind::Gbnf, v.get<std::string>());
  };
  // llama.cpp's server fields: a GBNF grammar, a JSON Schema.
  if (const json* v = f.get("grammar"); v && !(v->is_string() && v->get_ref<const std::string&>().empty()))
    if (auto e = grammar(*v, "grammar")) return e;  // "" is no grammar, as llama.cpp reads it
  if (const json* v = f.get("json_schema"))
    if (auto e = json_value(*v, {"json_schema"}, "json_schema")) return e;
  // vLLM's guided_* fields (before v0.12) and its structured_outputs object (since).
  if (const json* v = f.get("guided_json"))
    if (auto e = json_value(*v, {"guided_json"}, "guided_json")) return e;
  if (const json* v = f.get("guided_choice"))
    if (auto e = choice(*v, "guided_choice")) return e;
  if (const json* v = f.get("guided_regex"))
    if (auto e = regex(*v, "guided_regex")) return e;
  if (const json* v = f.get("guided_grammar"))
    if (auto e = grammar(*v, "guided_grammar")) return e;
  if (const json* so = f.get("structured_outputs")) {
    if (!so->is_object()) return bad("'structured_outputs' must be an object", "structured_outputs");
    // vLLM's disable_any_whitespace: JSON without blanks between tokens.
    bool compact = false;
    if (auto d = so->find("disable_any_whitespace"); d != so->end() && !d->is_null()) {
      if (!d->is_boolean())
        return bad("'structured_outputs.disable_any_whitespace' must be a boolean", "structured_outputs.disable_any_whitespace");
      compact = d->get<bool>();
    }
    for (const auto& [k, v] : so->items()) {
      if (v.is_null()) continue;
      std::optional<ApiError> e;
      if (k == "disable_any_whitespace") continue;  // read above
      if (k == "json") e = json_value(v, {"structured_outputs", "json"}, "structured_outputs.json", compact);
      else if (k == "regex") e = regex(v, "structured_outputs.regex");
      else if (k == "choice") e = choice(v, "structured_outputs.choice");
      else if (k == "grammar") e = grammar(v, "structured_outputs.grammar");
      else if (k == "json_object") {
        if (!v.is_boolean()) e = bad("'structured_outputs.json_object' must be a boolean", "structured_outputs.json_object");
        else if (v.get<bool>())
          e = take("structured_outputs.json_object", structured::Kind::JsonObject, "", {.compact = compact});
      } else if (k == "disable_fallback" || k == "disable_additional_properties") {
        // No fallback backend to disable; undeclared properties are already refused unless the
        // schema's additionalProperties asks for them.
        if (!v.is_boolean()) e = bad("'structured_outputs." + k + "' must be a boolean", "structured_outputs." + k);
      } else {
        e = bad("'structured_outputs." + k + "' is not supported (json, regex, choice, grammar and json_object are)",
                "structured_outputs." + k, "unsupported_parameter");
      }
      if (e) return e;
    }
    if (!kind)
      return bad("'structured_outputs' names no constraint (json, regex, choice, grammar or json_object)", "structured_outputs");
  }
  if (!kind) return std::nullopt;
  // Requests with the same spec share one compiled grammar and its per-state masks.
  auto compiled = structured::compile(*kind, spec, opt, {.tokenizer = m.tokenizer, .trie = m.vocab_trie}, m.grammar_cache.get());
  if (!compiled.ok()) return bad(param + ": " + compiled.message(), param);
  g.grammar = std::move(compiled).value();
  return std::nullopt;
}

}  // namespace ss::server
