// The structured folder's public header: structured outputs, a request's text kept inside a grammar.
// compile() is the one entry: the server (response_format, structured_outputs / guided_*, llama.cpp's
// grammar / json_schema, tool choices) and `selfserve generate` (--json-schema, --grammar, --regex)
// both name a Kind and give its spec as text. The result is shared by every request with the same
// spec (through a GrammarCache) and each request follows it with its own GrammarConstraint, the
// token mask the engine applies. Brings grammar.h (Grammar, TokenTrie, CompiledGrammar,
// GrammarConstraint) along; regex.h, gbnf.h and json_schema.h are private to the folder.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>

#include "common/status.h"
#include "structured/grammar.h"
#include "tokenizer/tokenizer.h"

namespace ss::structured {

enum class Kind {
  JsonObject,  // any JSON object (response_format json_object); the spec is ignored
  JsonSchema,  // a JSON Schema as JSON text; its key order is the order properties are generated in
  ToolCalls,   // a JSON array of {"name": ..., "parameters": <schema>}: a JSON array of calls to them,
               // as vLLM constrains tool_choice "required"
  Choice,      // a JSON array of strings: exactly one of them (vLLM's guided_choice)
  Regex,       // a regular expression (ECMAScript) the whole text matches
  Gbnf,        // a GBNF grammar (llama.cpp's format), starting at `root`
};
const char* kind_name(Kind k);

struct Options {
  // JSON kinds: no blanks between the JSON text's tokens (vLLM's disable_any_whitespace; tool
  // arguments): a small model otherwise spends tokens on newlines and indentation.
  bool compact = false;
  bool parallel_calls = true;  // ToolCalls: more than one call may come
};

// The grammar of a spec, without a vocabulary. A bad spec is an error that names what is wrong
// (the caller prefixes the parameter or flag it came from).
Expected<Grammar> build_grammar(Kind kind, std::string_view spec, const Options& opt = {});

// Compiled structured-output grammars by spec (least recently used out beyond `capacity`), so
// requests with the same spec share one grammar and its cached masks. Thread-safe.
class GrammarCache {
 public:
  explicit GrammarCache(size_t capacity = 64) : capacity_(capacity) {}
  std::shared_ptr<const CompiledGrammar> find(const std::string& key);
  void insert(const std::string& key, std::shared_ptr<const CompiledGrammar> g);
  size_t size() const;

 private:
  size_t capacity_;
  mutable std::mutex mu_;
  uint64_t clock_ = 0;
  std::map<std::string, std::pair<uint64_t, std::shared_ptr<const CompiledGrammar>>> items_;
};

// The vocabulary a grammar's token masks are over: its byte trie, given (the server builds it once
// at start-up) or built from the tokenizer when a grammar is compiled.
struct Vocab {
  const tok::Tokenizer* tokenizer = nullptr;
  std::shared_ptr<const TokenTrie> trie = nullptr;
};

// The spec's grammar over the vocabulary, from `cache` when it holds the same kind, options and spec
// (and put there on a miss; specs over 64 KiB are not kept). Each request then follows it with its
// own GrammarConstraint(compiled, end_ids).
Expected<std::shared_ptr<const CompiledGrammar>> compile(Kind kind, std::string_view spec, const Options& opt,
                                                         const Vocab& vocab, GrammarCache* cache = nullptr);

}  // namespace ss::structured
