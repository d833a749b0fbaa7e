// Structured outputs: a context-free grammar over bytes, a matcher that follows generated text
// through it, and the per-step token mask (which vocabulary tokens keep the text inside the
// grammar). The shape is llama.cpp's GBNF engine: rules of alternatives, each alternative a
// sequence of byte sets and rule references, matched by a set of pushdown stacks; no left
// recursion. json_schema.h compiles JSON Schema into such a grammar. Private to src/structured/:
// others include structured/structured.h, which brings this header along.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "backend/backend.h"  // backend::TokenMask, the interface a constraint implements

namespace ss::tok {
class Tokenizer;
}

namespace ss::structured {

class Grammar {
 public:
  using ByteSet = std::array<uint64_t, 4>;
  struct Elem {
    enum Kind : uint8_t { End, Bytes, Ref } kind = End;
    uint32_t arg = 0;  // Bytes: index of the byte set; Ref: rule id
  };
  using Seq = std::vector<Elem>;

  // Building. A rule matches any of its alternatives; an empty alternative matches "".
  int new_rule();
  void add_alt(int rule, const Seq& seq);
  Elem bytes(const ByteSet& set);  // interned
  Elem byte(uint8_t c);
  Elem one_of(std::string_view chars);  // any of these bytes
  Elem range(uint8_t lo, uint8_t hi);
  static Elem ref(int rule) { return Elem{Elem::Ref, static_cast<uint32_t>(rule)}; }
  Seq literal(std::string_view s);
  // item{min,max} (max < 0: unbounded) as right-recursive rules; returns the rule. `item` must not
  // match "" when max < 0 (that would be left recursion, which validate() refuses).
  int repeat(const Seq& item, int64_t min, int64_t max);
  void set_root(int rule) { root_ = rule; }
  void set_name(int rule, std::string name) {  // for validate()'s messages
    if (names_.size() <= static_cast<size_t>(rule)) names_.resize(static_cast<size_t>(rule) + 1);
    names_[static_cast<size_t>(rule)] = std::move(name);
  }
  // Every referenced rule exists and has an alternative, and no rule can reach itself without
  // consuming a byte (left recursion would never finish expanding).
  Status validate() const;
  int num_rules() const { return static_cast<int>(alts_.size()); }

  // Matching. A state is the set of stacks still alive; each stack holds element positions, the
  // next one to match on top, and is either empty (the text so far is a whole match) or has a
  // Bytes element on top.
  using Stack = std::vector<uint32_t>;
  struct State {
    std::vector<Stack> stacks;
    bool dead() const { return stacks.empty(); }
  };
  State initial() const;
  // Consumes one byte; false (and out.dead()) when no stack accepts it. `out` is overwritten.
  bool advance(const State& in, uint8_t c, State& out) const;
  static bool can_end(const State& s);   // some stack is complete
  bool matches(std::string_view text) const;  // the whole text is in the language (reference matcher)
  static bool must_end(const State& s);  // every stack is complete: nothing may follow

 private:
  friend class GrammarMatcher;
  void expand(Stack& stack, std::vector<Stack>& out, int depth) const;
  static void normalize(State& s);

  std::vector<Elem> elems_;                  // alternatives back to back, each ended by End
  std::vector<std::vector<uint32_t>> alts_;  // per rule: where each alternative starts
  std::vector<ByteSet> sets_;
  std::vector<std::string> names_;  // optional, per rule
  int root_ = -1;
};

// The vocabulary as a byte trie, for walking every token through a grammar state at once. Special
// tokens and tokens without bytes are left out (a grammar never allows them; the constraint allows
// the end-of-generation ids separately).
class TokenTrie {
 public:
  static std::shared_ptr<const TokenTrie> build(const tok::Tokenizer& tok);
  int vocab_size() const { return vocab_; }
  const std::string& piece(int32_t id) const { return pieces_[static_cast<size_t>(id)]; }

  struct Node {
    uint32_t first_child = 0, num_children = 0;  // into children_, sorted by byte
    uint32_t first_token = 0, num_tokens = 0;    // into tokens_: tokens spelled by this path
    uint8_t byte = 0;
  };
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<uint32_t>& children() const { return children_; }
  const std::vector<int32_t>& tokens() const { return tokens_; }

 private:
  int vocab_ = 0;
  std::vector<std::string> pieces_;  // per id ("" for left-out tokens)
  std::vector<Node> nodes_;          // 0 is the root
  std::vector<uint32_t> children_;
  std::vector<int32_t> tokens_;
};

// The fast matcher the constraints use (Grammar's own advance() is the plain reference it is tested
// against). A stack is a node id in a tree of interned (element, parent) pairs, so a state is a short
// sorted list of ints, and what follows a stack once its top byte is consumed is computed once and
// remembered. Not thread-safe: one per request.
class GrammarMatcher {
 public:
  using StackId = int32_t;               // 0 is the empty stack: the text so far is a whole match
  using State = std::vector<StackId>;    // sorted, unique; empty: dead
  // Live alternatives one state may hold. Real schemas stay in the tens (a string inside 128
  // ambiguous anyOf branches is ~1,300); beyond this the matcher stops (overflowed()) instead of
  // letting one request's mask walk run for minutes on the engine's threads.
  static constexpr size_t kMaxStacks = 2048;
  explicit GrammarMatcher(const Grammar& g);
  State initial();
  bool advance(const State& in, uint8_t c, State& out);  // false (and out empty) when no stack takes c
  static bool can_end(const State& s) { return !s.empty() && s.front() == 0; }
  static bool must_end(const State& s) { return s.size() == 1 && s.front() == 0; }
  std::string key(const State& s) const;  // canonical: the same for equal states of any matcher
  // Bit i set: token i keeps the text inside the grammar from `s` (a depth-first walk of the trie).
  std::vector<uint64_t> allowed(const State& s, const TokenTrie& trie);
  bool overflowed() const { return overflow_; }  // a state outgrew kMaxStacks; results since are void

 private:
  struct Node {
    uint32_t elem;
    StackId parent;
  };
  StackId intern(uint32_t elem, StackId parent);
  void expand(StackId id, State& out, int depth);
  const State& next(StackId id);  // the stacks after the top byte of `id` is consumed

  const Grammar& g_;
  std::vector<Node> nodes_;
  std::unordered_map<uint64_t, StackId> index_;
  std::vector<int32_t> next_of_;  // per node: index into next_lists_, -1 not computed yet
  std::vector<State> next_lists_;
  std::vector<State> scratch_;    // per trie depth, reused
  bool overflow_ = false;
};

// A compiled grammar with the token masks of the states seen so far (shared by every request that
// uses the same grammar; thread-safe).
class CompiledGrammar {
 public:
  CompiledGrammar(Grammar g, std::shared_ptr<const TokenTrie> trie);
  const Grammar& grammar() const { return g_; }
  const TokenTrie& trie() const { return *trie_; }
  // Bit i set: token i keeps the text inside the grammar from `s` (s belongs to `m`).
  std::shared_ptr<const std::vector<uint64_t>> allowed(GrammarMatcher& m, const GrammarMatcher::State& s) const;

  struct CacheStats {
    uint64_t hits = 0, misses = 0;
  };
  CacheStats cache_stats() const;

 private:
  Grammar g_;
  std::shared_ptr<const TokenTrie> trie_;
  mutable std::mutex mu_;
  mutable std::unordered_map<std::string, std::shared_ptr<const std::vector<uint64_t>>> cache_;
  mutable CacheStats stats_;
};

// One request's constraint: the grammar's state after the text generated so far. The end ids
// (end-of-generation and the client's stop ids) are allowed exactly when the text is a whole match.
class GrammarConstraint final : public backend::TokenMask {
 public:
  GrammarConstraint(std::shared_ptr<const CompiledGrammar> g, std::vector<int32_t> end_ids);
  bool allows(int32_t token) override;
  void mask(float* logits, int n) override;
  void accept(int32_t token) override;
  bool must_end() const override;
  std::string error() const override;

 private:
  bool is_end(int32_t token) const;
  std::shared_ptr<const CompiledGrammar> g_;
  std::vector<int32_t> end_ids_;
  GrammarMatcher m_;
  GrammarMatcher::State state_, next_, probe_;
  int32_t probed_ = -1;  // the token probe_ was computed for by the last allows()
  std::vector<float> saved_;
  bool broken_ = false;  // a token outside the grammar was accepted (never happens when masked)
};

}  // namespace ss::structured
