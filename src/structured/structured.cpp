// compile(): one place that turns a structured-output spec into a grammar, for the server and the CLI.
#include "structured/structured.h"

#include <nlohmann/json.hpp>
#include <vector>

#include "common/json_depth.h"
#include "structured/gbnf.h"
#include "structured/json_schema.h"
#include "structured/regex.h"

namespace ss::structured {
namespace {

using ojson = nlohmann::ordered_json;

constexpr size_t kMaxCachedSpecBytes = 64 * 1024;  // the cache holds its keys

// A JSON spec parsed with its key order; refused past kMaxJsonDepth before the parser (which
// recurses per level) runs.
Expected<ojson> parse_json(std::string_view text, const char* what) {
  if (json_max_depth(text) > kMaxJsonDepth)
    return make_error(std::string(what) + " nests deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  ojson v = ojson::parse(text, nullptr, /*allow_exceptions=*/false);
  if (v.is_discarded()) return make_error(std::string(what) + " is not JSON");
  return v;
}

}  // namespace

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::JsonObject: return "json_object";
    case Kind::JsonSchema: return "json_schema";
    case Kind::ToolCalls: return "tool_calls";
    case Kind::Choice: return "choice";
    case Kind::Regex: return "regex";
    case Kind::Gbnf: return "gbnf";
  }
  return "?";
}

Expected<Grammar> build_grammar(Kind kind, std::string_view spec, const Options& opt) {
  const JsonOptions jo{.compact = opt.compact};
  switch (kind) {
    case Kind::JsonObject: return json_object_grammar(jo);
    case Kind::JsonSchema: {
      auto schema = parse_json(spec, "the schema");
      if (!schema.ok()) return schema.error();
      return json_schema_grammar(*schema, jo);
    }
    case Kind::ToolCalls: {
      auto tools = parse_json(spec, "the tools");
      if (!tools.ok()) return tools.error();
      if (!tools->is_array()) return make_error("the tools must be a JSON array");
      std::vector<ToolSchema> specs;
      for (const ojson& t : *tools) {
        if (!t.is_object() || !t.contains("name") || !t["name"].is_string() || !t.contains("parameters"))
          return make_error("each tool must be {\"name\": <string>, \"parameters\": <schema>}");
        specs.push_back({t["name"].get<std::string>(), t["parameters"]});
      }
      return tool_calls_grammar(specs, opt.parallel_calls, jo);
    }
    case Kind::Choice: {
      auto list = parse_json(spec, "the choices");
      if (!list.ok()) return list.error();
      std::vector<std::string> choices;
      if (list->is_array())
        for (const ojson& c : *list)
          if (c.is_string()) choices.push_back(c.get<std::string>());
      if (!list->is_array() || choices.size() != list->size()) return make_error("the choices must be a JSON array of strings");
      return choice_grammar(choices);
    }
    case Kind::Regex: return regex_grammar(spec);
    case Kind::Gbnf: return gbnf_grammar(spec);
  }
  return make_error("unknown structured-output kind");
}

Expected<std::shared_ptr<const CompiledGrammar>> compile(Kind kind, std::string_view spec, const Options& opt,
                                                         const Vocab& vocab, GrammarCache* cache) {
  // The key is everything the grammar depends on, so the same schema shares one grammar whichever
  // request field it came from.
  std::string key;
  if (cache && spec.size() <= kMaxCachedSpecBytes) {
    key = kind_name(kind);
    if (opt.compact) key += " compact";
    if (kind == Kind::ToolCalls) key += opt.parallel_calls ? " parallel" : " single";
    key += '\n';
    key += spec;
    if (auto hit = cache->find(key)) return hit;
  }
  Expected<Grammar> g = build_grammar(kind, spec, opt);
  if (!g.ok()) return g.error();
  if (!vocab.trie && !vocab.tokenizer) return make_error("structured outputs: no vocabulary to compile against");
  auto trie = vocab.trie ? vocab.trie : TokenTrie::build(*vocab.tokenizer);
  auto compiled = std::make_shared<const CompiledGrammar>(std::move(g).value(), std::move(trie));
  if (!key.empty()) cache->insert(key, compiled);
  return std::shared_ptr<const CompiledGrammar>(std::move(compiled));
}

std::shared_ptr<const CompiledGrammar> GrammarCache::find(const std::string& key) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = items_.find(key);
  if (it == items_.end()) return nullptr;
  it->second.first = ++clock_;
  return it->second.second;
}

void GrammarCache::insert(const std::string& key, std::shared_ptr<const CompiledGrammar> g) {
  std::lock_guard<std::mutex> lk(mu_);
  items_[key] = {++clock_, std::move(g)};
  while (items_.size() > capacity_) {
    auto oldest = items_.begin();
    for (auto it = items_.begin(); it != items_.end(); ++it)
      if (it->second.first < oldest->second.first) oldest = it;
    items_.erase(oldest);
  }
}

size_t GrammarCache::size() const {
  std::lock_guard<std::mutex> lk(mu_);
  return items_.size();
}

}  // namespace ss::structured
