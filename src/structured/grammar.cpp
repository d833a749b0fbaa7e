#include "structured/grammar.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "tokenizer/tokenizer.h"

namespace ss::structured {

namespace {
bool has(const Grammar::ByteSet& s, uint8_t c) { return (s[c >> 6] >> (c & 63)) & 1; }
constexpr int kMaxExpandDepth = 4096;  // refs expanded without consuming a byte (validate() rules out cycles)
}  // namespace

// ---- building -------------------------------------------------------------------------------

int Grammar::new_rule() {
  alts_.emplace_back();
  return static_cast<int>(alts_.size()) - 1;
}

void Grammar::add_alt(int rule, const Seq& seq) {
  alts_[static_cast<size_t>(rule)].push_back(static_cast<uint32_t>(elems_.size()));
  for (const Elem& e : seq)
    if (e.kind != Elem::End) elems_.push_back(e);
  elems_.push_back(Elem{Elem::End, 0});
}

Grammar::Elem Grammar::bytes(const ByteSet& set) {
  for (size_t i = 0; i < sets_.size(); ++i)
    if (sets_[i] == set) return Elem{Elem::Bytes, static_cast<uint32_t>(i)};
  sets_.push_back(set);
  return Elem{Elem::Bytes, static_cast<uint32_t>(sets_.size() - 1)};
}

Grammar::Elem Grammar::range(uint8_t lo, uint8_t hi) {
  ByteSet s{};
  for (int c = lo; c <= hi; ++c) s[c >> 6] |= uint64_t{1} << (c & 63);
  return bytes(s);
}

Grammar::Elem Grammar::byte(uint8_t c) { return range(c, c); }

Grammar::Elem Grammar::one_of(std::string_view chars) {
  ByteSet s{};
  for (char ch : chars) {
    const auto c = static_cast<uint8_t>(ch);
    s[c >> 6] |= uint64_t{1} << (c & 63);
  }
  return bytes(s);
}

Grammar::Seq Grammar::literal(std::string_view s) {
  Seq out;
  for (char c : s) out.push_back(byte(static_cast<uint8_t>(c)));
  return out;
}

int Grammar::repeat(const Seq& item, int64_t min, int64_t max) {
  auto then = [&](int rest) {
    Seq s = item;
    s.push_back(ref(rest));
    return s;
  };
  int tail = new_rule();
  if (max < 0) add_alt(tail, then(tail));
  add_alt(tail, {});
  for (int64_t k = 0; max >= 0 && k < max - min; ++k) {
    const int r = new_rule();
    add_alt(r, then(tail));
    add_alt(r, {});
    tail = r;
  }
  for (int64_t k = 0; k < min; ++k) {
    const int r = new_rule();
    add_alt(r, then(tail));
    tail = r;
  }
  return tail;
}

bool Grammar::matches(std::string_view text) const {
  State s = initial(), n;
  for (char c : text) {
    if (!advance(s, static_cast<uint8_t>(c), n)) return false;
    std::swap(s, n);
  }
  return can_end(s);
}

Status Grammar::validate() const {
  const size_t n = alts_.size();
  if (root_ < 0 || static_cast<size_t>(root_) >= n) return make_error("grammar has no root rule");
  for (size_t r = 0; r < n; ++r)
    if (alts_[r].empty()) return make_error("grammar rule " + std::to_string(r) + " has no alternative");
  for (const Elem& e : elems_)
    if (e.kind == Elem::Ref && e.arg >= n) return make_error("grammar refers to a missing rule");
  // Nullable rules (fixed point), then the graph "r may reach s before consuming a byte".
  std::vector<char> nullable(n, 0);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < n; ++r) {
      if (nullable[r]) continue;
      for (uint32_t a : alts_[r]) {
        bool all = true;
        for (uint32_t p = a; elems_[p].kind != Elem::End && all; ++p)
          all = elems_[p].kind == Elem::Ref && nullable[elems_[p].arg];
        if (all) {
          nullable[r] = 1;
          changed = true;
          break;
        }
      }
    }
  }
  std::vector<std::vector<uint32_t>> first(n);
  for (size_t r = 0; r < n; ++r)
    for (uint32_t a : alts_[r])
      for (uint32_t p = a; elems_[p].kind == Elem::Ref; ++p) {
        first[r].push_back(elems_[p].arg);
        if (!nullable[elems_[p].arg]) break;
      }
  std::vector<uint8_t> color(n, 0);  // 0 new, 1 on the path, 2 done
  for (size_t start = 0; start < n; ++start) {
    if (color[start]) continue;
    std::vector<std::pair<uint32_t, size_t>> st{{static_cast<uint32_t>(start), 0}};
    color[start] = 1;
    while (!st.empty()) {
      auto& [r, i] = st.back();
      if (i == first[r].size()) {
        color[r] = 2;
        st.pop_back();
        continue;
      }
      const uint32_t s = first[r][i++];
      if (color[s] == 1) {
        std::string msg = "grammar is left-recursive (rule ";
        if (s < names_.size() && !names_[s].empty()) msg.append("'").append(names_[s]).append("'");
        else msg.append(std::to_string(s));
        return make_error(msg.append(")"));
      }
      if (color[s] == 0) {
        color[s] = 1;
        st.push_back({s, 0});
      }
    }
  }
  return {};
}

// ---- matching -------------------------------------------------------------------------------

void Grammar::expand(Stack& stack, std::vector<Stack>& out, int depth) const {
  if (depth > kMaxExpandDepth) return;
  while (!stack.empty() && elems_[stack.back()].kind == Elem::End) stack.pop_back();
  if (stack.empty() || elems_[stack.back()].kind == Elem::Bytes) {
    out.push_back(stack);
    return;
  }
  const uint32_t pos = stack.back();  // a Ref
  const uint32_t rule = elems_[pos].arg;
  stack.pop_back();
  if (elems_[pos + 1].kind != Elem::End) stack.push_back(pos + 1);  // the rest of this sequence
  // Each alternative gets its own copy: expanding an empty one pops into what lies below.
  const std::vector<uint32_t>& alts = alts_[rule];
  for (size_t i = 0; i < alts.size(); ++i) {
    if (i + 1 == alts.size()) {  // the last may use the caller's stack
      stack.push_back(alts[i]);
      expand(stack, out, depth + 1);
    } else {
      Stack copy = stack;
      copy.push_back(alts[i]);
      expand(copy, out, depth + 1);
    }
  }
}

void Grammar::normalize(State& s) {
  std::sort(s.stacks.begin(), s.stacks.end());
  s.stacks.erase(std::unique(s.stacks.begin(), s.stacks.end()), s.stacks.end());
}

Grammar::State Grammar::initial() const {
  State s;
  if (root_ < 0) return s;
  Stack st;
  for (uint32_t a : alts_[static_cast<size_t>(root_)]) {
    st.assign(1, a);
    expand(st, s.stacks, 0);
  }
  normalize(s);
  return s;
}

bool Grammar::advance(const State& in, uint8_t c, State& out) const {
  out.stacks.clear();
  Stack st;
  for (const Stack& s : in.stacks) {
    if (s.empty()) continue;
    const Elem& e = elems_[s.back()];
    if (e.kind != Elem::Bytes || !has(sets_[e.arg], c)) continue;
    st = s;
    st.back() += 1;  // the next element of the same sequence (End pops it in expand)
    expand(st, out.stacks, 0);
  }
  normalize(out);
  return !out.dead();
}

bool Grammar::can_end(const State& s) {
  return std::any_of(s.stacks.begin(), s.stacks.end(), [](const Stack& st) { return st.empty(); });
}

bool Grammar::must_end(const State& s) {
  return !s.stacks.empty() && std::all_of(s.stacks.begin(), s.stacks.end(), [](const Stack& st) { return st.empty(); });
}

// ---- the vocabulary trie --------------------------------------------------------------------

std::shared_ptr<const TokenTrie> TokenTrie::build(const tok::Tokenizer& tok) {
  auto t = std::make_shared<TokenTrie>();
  const int32_t n = tok.vocab_size();
  t->vocab_ = n;
  t->pieces_.resize(static_cast<size_t>(n));
  // A map-based trie first, flattened breadth-first so every node's children are contiguous.
  struct Build {
    std::map<uint8_t, uint32_t> kids;
    std::vector<int32_t> toks;
  };
  std::vector<Build> b(1);
  for (int32_t id = 0; id < n; ++id) {
    if (tok.is_special(id)) continue;
    std::string p = tok.token_to_piece(id);
    if (p.empty()) continue;
    uint32_t cur = 0;
    for (char ch : p) {
      const uint8_t c = static_cast<uint8_t>(ch);
      auto it = b[cur].kids.find(c);
      if (it == b[cur].kids.end()) {
        b.emplace_back();
        it = b[cur].kids.emplace(c, static_cast<uint32_t>(b.size() - 1)).first;
      }
      cur = it->second;
    }
    b[cur].toks.push_back(id);
    t->pieces_[static_cast<size_t>(id)] = std::move(p);
  }
  std::vector<uint32_t> order{0};  // build nodes in breadth-first order
  t->nodes_.resize(b.size());
  for (size_t qi = 0; qi < order.size(); ++qi) {
    const uint32_t src = order[qi];
    Node& nd = t->nodes_[qi];
    nd.first_token = static_cast<uint32_t>(t->tokens_.size());
    nd.num_tokens = static_cast<uint32_t>(b[src].toks.size());
    t->tokens_.insert(t->tokens_.end(), b[src].toks.begin(), b[src].toks.end());
    nd.first_child = static_cast<uint32_t>(t->children_.size());
    nd.num_children = static_cast<uint32_t>(b[src].kids.size());
    for (const auto& [c, child] : b[src].kids) {
      t->nodes_[order.size()].byte = c;
      t->children_.push_back(static_cast<uint32_t>(order.size()));
      order.push_back(child);
    }
  }
  return t;
}

// ---- the fast matcher -------------------------------------------------------------------------

GrammarMatcher::GrammarMatcher(const Grammar& g) : g_(g) {
  nodes_.push_back({0, -1});  // 0: the empty stack
  next_of_.push_back(-1);
}

GrammarMatcher::StackId GrammarMatcher::intern(uint32_t elem, StackId parent) {
  const uint64_t k = (uint64_t{elem} << 32) | static_cast<uint32_t>(parent);
  auto [it, fresh] = index_.emplace(k, static_cast<StackId>(nodes_.size()));
  if (fresh) {
    nodes_.push_back({elem, parent});
    next_of_.push_back(-1);
  }
  return it->second;
}

void GrammarMatcher::expand(StackId id, State& out, int depth) {
  if (depth > kMaxExpandDepth || overflow_) return;
  if (out.size() > kMaxStacks) {
    overflow_ = true;
    return;
  }
  while (id != 0 && g_.elems_[nodes_[static_cast<size_t>(id)].elem].kind == Grammar::Elem::End)
    id = nodes_[static_cast<size_t>(id)].parent;
  if (id == 0) {
    out.push_back(0);
    return;
  }
  const Node n = nodes_[static_cast<size_t>(id)];
  const Grammar::Elem e = g_.elems_[n.elem];
  if (e.kind == Grammar::Elem::Bytes) {
    out.push_back(id);
    return;
  }
  const StackId cont = g_.elems_[n.elem + 1].kind == Grammar::Elem::End ? n.parent : intern(n.elem + 1, n.parent);
  for (uint32_t a : g_.alts_[e.arg]) expand(intern(a, cont), out, depth + 1);
}

const GrammarMatcher::State& GrammarMatcher::next(StackId id) {
  int32_t k = next_of_[static_cast<size_t>(id)];
  if (k < 0) {
    const Node n = nodes_[static_cast<size_t>(id)];
    State out;
    expand(intern(n.elem + 1, n.parent), out, 0);
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    k = static_cast<int32_t>(next_lists_.size());
    next_lists_.push_back(std::move(out));
    next_of_[static_cast<size_t>(id)] = k;
  }
  return next_lists_[static_cast<size_t>(k)];
}

GrammarMatcher::State GrammarMatcher::initial() {
  State s;
  if (g_.root_ < 0) return s;
  for (uint32_t a : g_.alts_[static_cast<size_t>(g_.root_)]) expand(intern(a, 0), s, 0);
  std::sort(s.begin(), s.end());
  s.erase(std::unique(s.begin(), s.end()), s.end());
  if (overflow_ || s.size() > kMaxStacks) {
    overflow_ = true;
    s.clear();
  }
  return s;
}

bool GrammarMatcher::advance(const State& in, uint8_t c, State& out) {
  out.clear();
  if (overflow_) return false;
  int lists = 0;
  for (StackId id : in) {
    if (id == 0) continue;
    const Grammar::Elem e = g_.elems_[nodes_[static_cast<size_t>(id)].elem];
    if (!has(g_.sets_[e.arg], c)) continue;
    const State& nx = next(id);  // may grow next_lists_: take the reference after the call
    out.insert(out.end(), nx.begin(), nx.end());
    ++lists;
  }
  if (lists > 1) {
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
  }
  if (out.size() > kMaxStacks || overflow_) {
    overflow_ = true;
    out.clear();
  }
  return !out.empty();
}

std::string GrammarMatcher::key(const State& s) const {
  std::vector<std::vector<uint32_t>> stacks;
  for (StackId id : s) {
    std::vector<uint32_t> st;
    for (StackId x = id; x != 0; x = nodes_[static_cast<size_t>(x)].parent) st.push_back(nodes_[static_cast<size_t>(x)].elem);
    stacks.push_back(std::move(st));
  }
  std::sort(stacks.begin(), stacks.end());
  std::string k;
  for (const auto& st : stacks) {
    const uint32_t n = static_cast<uint32_t>(st.size());
    k.append(reinterpret_cast<const char*>(&n), sizeof n);
    k.append(reinterpret_cast<const char*>(st.data()), st.size() * sizeof(uint32_t));
  }
  return k;
}

std::vector<uint64_t> GrammarMatcher::allowed(const State& s, const TokenTrie& t) {
  std::vector<uint64_t> bits((static_cast<size_t>(t.vocab_size()) + 63) / 64, 0);
  const auto& nodes = t.nodes();
  const auto& kids = t.children();
  const auto& toks = t.tokens();
  // Depth-first over the trie; scratch_[d] is the state after the first d bytes of the path.
  if (scratch_.empty()) scratch_.resize(1);
  scratch_[0] = s;
  struct Frame {
    uint32_t node, next_child;
  };
  std::vector<Frame> path{{0, 0}};
  while (!path.empty()) {
    Frame& f = path.back();
    const TokenTrie::Node& nd = nodes[f.node];
    if (f.next_child == nd.num_children) {
      path.pop_back();
      continue;
    }
    const uint32_t child = kids[nd.first_child + f.next_child++];
    const size_t d = path.size();
    if (scratch_.size() <= d) scratch_.resize(d + 1);
    if (!advance(scratch_[d - 1], nodes[child].byte, scratch_[d])) {
      if (overflow_) break;
      continue;
    }
    const TokenTrie::Node& cn = nodes[child];
    for (uint32_t i = 0; i < cn.num_tokens; ++i) {
      const int32_t id = toks[cn.first_token + i];
      bits[static_cast<size_t>(id) >> 6] |= uint64_t{1} << (id & 63);
    }
    if (cn.num_children) path.push_back({child, 0});
  }
  return bits;
}

// ---- compiled grammar: masks per state --------------------------------------------------------

CompiledGrammar::CompiledGrammar(Grammar g, std::shared_ptr<const TokenTrie> trie)
    : g_(std::move(g)), trie_(std::move(trie)) {}

std::shared_ptr<const std::vector<uint64_t>> CompiledGrammar::allowed(GrammarMatcher& m,
                                                                      const GrammarMatcher::State& s) const {
  const std::string k = m.key(s);
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = cache_.find(k);
    if (it != cache_.end()) {
      ++stats_.hits;
      return it->second;
    }
    ++stats_.misses;
  }
  auto bits = std::make_shared<const std::vector<uint64_t>>(m.allowed(s, *trie_));  // outside the lock
  if (m.overflowed()) return bits;  // void: the constraint reports the error
  std::lock_guard<std::mutex> lk(mu_);
  if (cache_.size() >= 4096) cache_.clear();  // bounded; states of real schemas are far fewer
  cache_.emplace(k, bits);
  return bits;
}

CompiledGrammar::CacheStats CompiledGrammar::cache_stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  return stats_;
}

// ---- one request's constraint -----------------------------------------------------------------

GrammarConstraint::GrammarConstraint(std::shared_ptr<const CompiledGrammar> g, std::vector<int32_t> end_ids)
    : g_(std::move(g)), end_ids_(std::move(end_ids)), m_(g_->grammar()), state_(m_.initial()) {}

void GrammarConstraint::mask(float* logits, int n_logits) {
  constexpr float kNo = -std::numeric_limits<float>::infinity();
  const int n = std::min(g_->trie().vocab_size(), n_logits);
  // Ids past the tokenizer's vocabulary (a padded lm_head, e.g. Qwen2.5's 151936 rows for 151665
  // tokens) have no text: never allowed.
  for (int i = n; i < n_logits; ++i) logits[i] = kNo;
  saved_.clear();
  for (int32_t id : end_ids_)
    if (id >= 0 && id < n) saved_.push_back(logits[id]);
  bool any = false;
  if (!broken_ && !state_.empty()) {
    const auto bits = g_->allowed(m_, state_);
    for (int i = 0; i < n; ++i) {
      const bool ok = (*bits)[static_cast<size_t>(i) >> 6] >> (i & 63) & 1;
      if (!ok) logits[i] = kNo;
      any |= ok;
    }
  } else {
    std::fill(logits, logits + n, kNo);
  }
  // The end ids: allowed exactly where the text is a whole match, and as the way out when nothing
  // else fits (so a request can always finish).
  const bool end_ok = broken_ || GrammarMatcher::can_end(state_) || !any;
  size_t k = 0;
  for (int32_t id : end_ids_)
    if (id >= 0 && id < n) {
      logits[id] = end_ok ? saved_[k] : kNo;
      ++k;
    }
}

bool GrammarConstraint::is_end(int32_t token) const {
  return std::find(end_ids_.begin(), end_ids_.end(), token) != end_ids_.end();
}

bool GrammarConstraint::allows(int32_t token) {
  probed_ = -1;
  if (is_end(token)) return broken_ || GrammarMatcher::can_end(state_);
  const TokenTrie& t = g_->trie();
  if (broken_ || token < 0 || token >= t.vocab_size() || t.piece(token).empty()) return false;
  const GrammarMatcher::State* cur = &state_;
  for (char c : t.piece(token)) {
    if (!m_.advance(*cur, static_cast<uint8_t>(c), next_)) return false;
    std::swap(probe_, next_);
    cur = &probe_;
  }
  probed_ = token;  // probe_ is the state after it: accept() takes it instead of walking again
  return true;
}

void GrammarConstraint::accept(int32_t token) {
  const bool probed = probed_ == token;
  probed_ = -1;
  if (broken_) return;
  if (is_end(token)) return;
  if (probed) {  // the sampler's draw was allowed: its state is already computed
    std::swap(state_, probe_);
    return;
  }
  const TokenTrie& t = g_->trie();
  if (token < 0 || token >= t.vocab_size() || t.piece(token).empty()) {
    broken_ = true;
    return;
  }
  for (char c : t.piece(token)) {
    if (!m_.advance(state_, static_cast<uint8_t>(c), next_)) {
      broken_ = true;
      return;
    }
    std::swap(state_, next_);
  }
}

bool GrammarConstraint::must_end() const { return broken_ || GrammarMatcher::must_end(state_); }

std::string GrammarConstraint::error() const {
  if (!m_.overflowed()) return {};
  return std::string(backend::kConstraintErrorPrefix) + "the schema or pattern is too ambiguous to follow (more than " +
         std::to_string(GrammarMatcher::kMaxStacks) + " alternatives alive at once)";
}

}  // namespace ss::structured
