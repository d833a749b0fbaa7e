// Structured-output parameters of a request (response_format, structured_outputs / guided_*,
// grammar / json_schema, tool choices) compiled to the grammar its choices are kept inside, and the
// cache that lets requests with the same schema share one compiled grammar.
#pragma once
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "server/api_types.h"
#include "server/json_fields.h"

namespace ss::server {

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

// Reads the request's structured-output fields (at most one kind), compiles the grammar (or takes it
// from m.grammar_cache) into g.grammar; tool choices too. A client mistake is the ApiError returned.
std::optional<ApiError> parse_structured(const detail::Fields& f, std::string_view body, const ModelInfo& m,
                                         GenerationRequest& g);

}  // namespace ss::server
