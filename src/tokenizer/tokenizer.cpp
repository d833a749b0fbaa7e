// The tokenizer: loading (GGUF spec or HF tokenizer.json), added-token splitting, normalization,
// pre-tokenization and BPE (byte-level or SentencePiece-style), decoding and streaming.
#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <array>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "tokenizer/bpe.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/unicode.h"

namespace ss::tok {
namespace {

using json = nlohmann::json;

constexpr std::string_view kMetaspace = "\xE2\x96\x81";  // U+2581 ▁

struct AddedToken {
  std::string content;
  int32_t id;
  bool special, lstrip, rstrip, single_word, normalized;
};

struct NormOp {
  enum Kind { Nfc, Prepend, Replace } kind;
  std::string a, b;
};

enum class PrependScheme { Always, First, Never };

std::string replace_all(std::string_view s, std::string_view from, std::string_view to) {
  std::string out;
  if (from.empty()) return std::string(s);
  out.reserve(s.size() + s.size() / 4);
  size_t i = 0;
  while (true) {
    size_t j = s.find(from, i);
    if (j == std::string_view::npos) break;
    out.append(s.substr(i, j - i)).append(to);
    i = j + from.size();
  }
  out.append(s.substr(i));
  return out;
}

uint32_t cp_before(std::string_view s, size_t pos, size_t* len) {
  size_t i = pos;
  while (i > 0 && (static_cast<unsigned char>(s[i - 1]) & 0xC0) == 0x80 && pos - i < 3) --i;
  if (i > 0) --i;
  std::vector<uint32_t> cps, offs;
  decode_utf8(s.substr(i, pos - i), cps, offs);
  *len = pos - i;
  return cps.empty() ? 0 : cps.back();
}
uint32_t cp_at(std::string_view s, size_t pos, size_t* len) {
  size_t n = std::min<size_t>(utf8_len(static_cast<unsigned char>(s[pos])), s.size() - pos);
  std::vector<uint32_t> cps, offs;
  decode_utf8(s.substr(pos, n), cps, offs);
  *len = n;
  return cps.empty() ? 0 : cps[0];
}
bool is_word_cp(uint32_t cp) { return cp == '_' || (uni::flags(cp) & (uni::kLetter | uni::kNumber | uni::kNumeric)); }

class BpeTokenizer final : public Tokenizer {
 public:
  // ---- configuration, filled by the loaders -----------------------------------------------------
  std::string kind_name_, pre_name_;
  std::vector<std::string> tokens_;  // id → text as stored
  std::vector<uint8_t> special_;     // id → control / special added token
  VocabMap vocab_;                   // the BPE model's vocabulary
  BpeModel model_;
  std::vector<NormOp> norm_;
  bool metaspace_ = false;  // Metaspace pre-tokenizer: spaces → ▁, prepend ▁ (then MetaspaceCut if it splits)
  PrependScheme metaspace_prepend_ = PrependScheme::Always;
  bool byte_level_prefix_space_ = false;
  std::vector<SplitKind> steps_;
  std::vector<AddedToken> added_;
  std::vector<int32_t> prefix_ids_, suffix_ids_;
  int32_t bos_ = -1, eos_ = -1;
  std::vector<int32_t> eog_;
  std::string chat_template_;
  // decoding
  bool dec_byte_level_ = false, dec_metaspace_ = false, dec_byte_fallback_ = false;
  int dec_strip_ = 0;

  // ---- built by finish() --------------------------------------------------------------------------
  std::vector<std::string> pieces_;
  std::array<std::vector<int32_t>, 256> raw_index_, norm_index_;  // first byte → added_ indices, longest first

  int32_t id_of(std::string_view text) const {
    for (const auto& a : added_) {
      if (a.content == text) return a.id;
    }
    auto it = vocab_.find(text);
    return it == vocab_.end() ? -1 : it->second;
  }

  Status finish() {
    if (tokens_.empty()) return make_error("empty vocabulary");
    special_.resize(tokens_.size(), 0);
    for (const auto& a : added_) {
      if (a.id < 0 || a.id >= int32_t(tokens_.size())) return make_error("added token id out of range");
      if (a.special) special_[a.id] = 1;
      if (a.content.empty()) continue;
      auto& idx = (a.normalized && !norm_.empty()) ? norm_index_ : raw_index_;
      idx[static_cast<unsigned char>(a.content[0])].push_back(int32_t(&a - added_.data()));
    }
    for (auto* index : {&raw_index_, &norm_index_}) {
      for (auto& v : *index) {
        std::stable_sort(v.begin(), v.end(),
                         [&](int32_t x, int32_t y) { return added_[x].content.size() > added_[y].content.size(); });
      }
    }
    model_.vocab = &vocab_;
    model_.finish();
    pieces_.resize(tokens_.size());
    for (size_t id = 0; id < tokens_.size(); ++id) pieces_[id] = make_piece(tokens_[id]);
    // End-of-generation: eos, eot and the usual end markers present in the vocabulary.
    auto add_eog = [&](int32_t id) {
      if (id >= 0 && id < int32_t(tokens_.size()) && std::find(eog_.begin(), eog_.end(), id) == eog_.end())
        eog_.push_back(id);
    };
    add_eog(eos_);
    for (const char* t : {"<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|endoftext|>", "</s>", "<|end|>",
                          "<|end_of_text|>"}) {
      add_eog(id_of(t));
    }
    return {};
  }

  std::string make_piece(const std::string& t) const {
    if (dec_byte_level_) {
      std::string out;
      std::vector<uint32_t> cps, offs;
      decode_utf8(repair_utf8(t), cps, offs);
      for (uint32_t cp : cps) {
        int b = uni::byte_from_cp(cp);
        if (b < 0) return t;  // HF: a token with a char outside the alphabet decodes as its text
        out.push_back(char(b));
      }
      return out;
    }
    std::string out = dec_metaspace_ ? replace_all(t, kMetaspace, " ") : t;
    if (dec_byte_fallback_ && out.size() == 6 && out.compare(0, 3, "<0x") == 0 && out[5] == '>') {
      auto hex = [](char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1; };
      int hi = hex(out[3]), lo = hex(out[4]);
      if (hi >= 0 && lo >= 0) return std::string(1, char(hi * 16 + lo));
    }
    return out;
  }

  // ---- encoding ------------------------------------------------------------------------------------
  template <class OnToken, class OnText>
  void split_added(std::string_view s, const std::array<std::vector<int32_t>, 256>& index, bool parse_special,
                   size_t base, OnToken on_token, OnText on_text) const {
    size_t seg = 0, pos = 0;
    while (pos < s.size()) {
      const auto& cands = index[static_cast<unsigned char>(s[pos])];
      const AddedToken* hit = nullptr;
      for (int32_t ci : cands) {
        const AddedToken& a = added_[ci];
        if (a.special && !parse_special) continue;
        if (s.compare(pos, a.content.size(), a.content) != 0) continue;
        if (a.single_word) {
          size_t l;
          if (pos > 0 && is_word_cp(cp_before(s, pos, &l))) continue;
          size_t e = pos + a.content.size();
          if (e < s.size() && is_word_cp(cp_at(s, e, &l))) continue;
        }
        hit = &a;
        break;
      }
      if (!hit) {
        ++pos;
        continue;
      }
      size_t start = pos, stop = pos + hit->content.size();
      if (hit->lstrip) {
        while (start > seg) {
          size_t l;
          uint32_t cp = cp_before(s, start, &l);
          if (!(uni::flags(cp) & uni::kWhitespace)) break;
          start -= l;
        }
      }
      if (hit->rstrip) {
        while (stop < s.size()) {
          size_t l;
          uint32_t cp = cp_at(s, stop, &l);
          if (!(uni::flags(cp) & uni::kWhitespace)) break;
          stop += l;
        }
      }
      if (start > seg) on_text(s.substr(seg, start - seg), base + seg);
      on_token(hit->id);
      seg = pos = stop;
    }
    if (seg < s.size()) on_text(s.substr(seg), base + seg);
  }

  std::string normalize(std::string_view s) const {
    std::string t(s);
    for (const NormOp& op : norm_) {
      switch (op.kind) {
        case NormOp::Nfc: t = uni::nfc(t); break;
        case NormOp::Prepend:
          if (!t.empty()) t.insert(0, op.a);
          break;
        case NormOp::Replace: t = replace_all(t, op.a, op.b); break;
      }
    }
    return t;
  }

  void encode_text(std::string_view s, bool at_start, std::vector<int32_t>& out) const {
    std::string t;
    if (metaspace_) {
      t = replace_all(s, " ", kMetaspace);
      bool prepend = metaspace_prepend_ == PrependScheme::Always ||
                     (metaspace_prepend_ == PrependScheme::First && at_start);
      if (prepend && t.compare(0, kMetaspace.size(), kMetaspace) != 0) t.insert(0, kMetaspace);
    } else if (byte_level_prefix_space_ && (s.empty() || s[0] != ' ')) {
      t = " ";
      t.append(s);
    } else {
      t.assign(s);
    }
    const std::vector<SplitKind>& steps = steps_;
    if (steps.empty()) {
      model_.encode_word(t, out);
      return;
    }
    thread_local CpText text;
    thread_local std::vector<Span> a, b;
    text.assign(t);
    a.assign(1, Span{0, uint32_t(text.cps.size())});
    for (SplitKind k : steps) {
      b.clear();
      split_spans(k, text, a, b);
      a.swap(b);
    }
    for (const Span& sp : a) {
      uint32_t from = text.offsets[sp.begin], to = text.offsets[sp.end];
      model_.encode_word(std::string_view(t).substr(from, to - from), out);
    }
  }

  std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special) const override {
    std::vector<int32_t> out;
    if (add_special) out = prefix_ids_;
    std::string s = repair_utf8(text);
    auto push = [&](int32_t id) { out.push_back(id); };
    split_added(s, raw_index_, parse_special, 0, push, [&](std::string_view seg, size_t off) {
      if (norm_.empty()) {
        encode_text(seg, off == 0, out);
        return;
      }
      std::string n = normalize(seg);
      split_added(n, norm_index_, parse_special, off, push,
                  [&](std::string_view sub, size_t sub_off) { encode_text(sub, sub_off == 0, out); });
    });
    if (add_special) out.insert(out.end(), suffix_ids_.begin(), suffix_ids_.end());
    return out;
  }

  // ---- decoding and queries -------------------------------------------------------------------------
  std::string decode(const std::vector<int32_t>& ids, bool skip_special) const override {
    std::string out;
    for (int32_t id : ids) {
      if (id < 0 || id >= int32_t(pieces_.size())) continue;
      if (skip_special && special_[id]) continue;
      out += pieces_[id];
    }
    for (int k = 0; k < dec_strip_ && !out.empty() && out[0] == ' '; ++k) out.erase(0, 1);
    return out;
  }
  std::string token_to_piece(int32_t id) const override {
    return id >= 0 && id < int32_t(pieces_.size()) ? pieces_[id] : std::string();
  }
  int32_t vocab_size() const override { return int32_t(tokens_.size()); }
  int32_t bos_id() const override { return bos_; }
  int32_t eos_id() const override { return eos_; }
  bool add_bos() const override { return bos_ >= 0 && !prefix_ids_.empty() && prefix_ids_[0] == bos_; }
  std::string_view token_text(int32_t id) const override {
    return id >= 0 && id < int32_t(tokens_.size()) ? std::string_view(tokens_[id]) : std::string_view();
  }
  bool is_special(int32_t id) const override { return id >= 0 && id < int32_t(special_.size()) && special_[id]; }
  const std::vector<int32_t>& eog_ids() const override { return eog_; }
  const std::string& chat_template() const override { return chat_template_; }
  std::string summary() const override {
    std::ostringstream o;
    auto name = [&](int32_t id) { return id >= 0 ? std::string(token_text(id)) + "(" + std::to_string(id) + ")" : std::string("none"); };
    o << kind_name_ << ", pre=" << pre_name_ << ", vocab=" << tokens_.size() << ", bos=" << name(bos_)
      << ", eos=" << name(eos_) << ", add_bos=" << (add_bos() ? "yes" : "no") << ", eog=[";
    for (size_t i = 0; i < eog_.size(); ++i) o << (i ? " " : "") << name(eog_[i]);
    size_t n_special = std::count(special_.begin(), special_.end(), uint8_t(1));
    o << "], special=" << n_special << ", added=" << added_.size();
    return o.str();
  }
};

// ---- GGUF spec ------------------------------------------------------------------------------------

Expected<std::unique_ptr<Tokenizer>> load_spec(const TokenizerSpec& spec) {
  auto t = std::make_unique<BpeTokenizer>();
  const size_t n = spec.tokens.size();
  if (n == 0) return make_error("tokenizer: the vocabulary (tokenizer.ggml.tokens) is empty");
  if (!spec.token_types.empty() && spec.token_types.size() != n)
    return make_error("tokenizer: token_type has " + std::to_string(spec.token_types.size()) + " entries for " +
                      std::to_string(n) + " tokens");
  t->tokens_ = spec.tokens;
  for (size_t i = 0; i < n; ++i) t->vocab_.try_emplace(spec.tokens[i], int32_t(i));
  auto type = [&](size_t i) { return spec.token_types.empty() ? TokenType::Normal : TokenType(spec.token_types[i]); };
  for (size_t i = 0; i < n; ++i) {
    TokenType ty = type(i);
    if (ty == TokenType::Control || ty == TokenType::Unknown || ty == TokenType::UserDefined) {
      bool special = ty != TokenType::UserDefined;
      t->added_.push_back({spec.tokens[i], int32_t(i), special, false, false, false, false});
    }
  }
  if (spec.token_types.empty()) {
    for (int32_t id : {spec.bos_id, spec.eos_id, spec.eot_id, spec.unk_id, spec.pad_id}) {
      if (id >= 0 && size_t(id) < n) t->added_.push_back({spec.tokens[id], id, true, false, false, false, false});
    }
  }
  auto check_id = [&](int32_t id, const char* what) -> Status {
    if (id >= int32_t(n)) return make_error(std::string("tokenizer: ") + what + " id " + std::to_string(id) +
                                            " is outside the vocabulary of " + std::to_string(n));
    return {};
  };
  SS_TRY(check_id(spec.bos_id, "bos"));
  SS_TRY(check_id(spec.eos_id, "eos"));
  SS_TRY(check_id(spec.unk_id, "unk"));
  SS_TRY(check_id(spec.eot_id, "eot"));
  t->bos_ = spec.bos_id;
  t->eos_ = spec.eos_id;
  t->chat_template_ = spec.chat_template;

  if (spec.model == "gpt2") {
    t->kind_name_ = "byte-level BPE";
    t->model_.byte_level = true;
    t->model_.vocab = &t->vocab_;
    t->dec_byte_level_ = true;
    const std::string& pre = spec.pre;
    t->pre_name_ = pre.empty() ? "default" : pre;
    if (pre == "llama-bpe" || pre == "llama3" || pre == "llama-v3") {
      t->steps_ = {SplitKind::Llama3};
      t->model_.ignore_merges = true;
    } else if (pre == "qwen2") {
      t->steps_ = {SplitKind::Qwen2};
      t->norm_.push_back({NormOp::Nfc, "", ""});  // Qwen2's tokenizer.json normalizes to NFC
    } else if (pre == "smollm") {
      t->steps_ = {SplitKind::DigitsEach, SplitKind::Gpt2};
    } else if (pre == "default" || pre == "gpt2" || pre.empty()) {
      t->steps_ = {SplitKind::Gpt2};
    } else {
      return make_error("tokenizer: pre-tokenizer '" + pre +
                        "' is not supported (supported: llama-bpe, qwen2, smollm, gpt2, default)");
    }
    for (size_t r = 0; r < spec.merges.size(); ++r) {
      const std::string& m = spec.merges[r];
      size_t sp = m.find(' ', 1);
      if (sp == std::string::npos) return make_error("tokenizer: merge " + std::to_string(r) + " '" + m + "' has no space");
      SS_TRY(t->model_.add_merge(std::string_view(m).substr(0, sp), std::string_view(m).substr(sp + 1), int32_t(r)));
    }
  } else if (spec.model == "llama") {
    t->kind_name_ = "SentencePiece BPE";
    t->pre_name_ = "none";
    if (spec.scores.size() != n)
      return make_error("tokenizer: SentencePiece model needs one score per token (tokenizer.ggml.scores has " +
                        std::to_string(spec.scores.size()) + " for " + std::to_string(n) + ")");
    t->model_.byte_level = false;
    t->model_.byte_fallback = true;
    t->model_.fuse_unk = true;
    t->model_.unk_id = spec.unk_id;
    t->model_.vocab = &t->vocab_;
    std::vector<bool> mergeable(n);
    for (size_t i = 0; i < n; ++i) mergeable[i] = type(i) == TokenType::Normal || type(i) == TokenType::Undefined;
    t->model_.add_merges_from_scores(spec.tokens, spec.scores, mergeable);
    if (spec.add_space_prefix) t->norm_.push_back({NormOp::Prepend, std::string(kMetaspace), ""});
    t->norm_.push_back({NormOp::Replace, " ", std::string(kMetaspace)});
    t->dec_metaspace_ = true;
    t->dec_byte_fallback_ = true;
    t->dec_strip_ = spec.add_space_prefix ? 1 : 0;
  } else {
    return make_error("tokenizer: model '" + spec.model + "' is not supported (supported: gpt2, llama)");
  }
  if (spec.add_bos && spec.bos_id >= 0) t->prefix_ids_.push_back(spec.bos_id);
  if (spec.add_eos && spec.eos_id >= 0) t->suffix_ids_.push_back(spec.eos_id);
  if (spec.eot_id >= 0) t->eog_.push_back(spec.eot_id);
  SS_TRY(t->finish());
  return std::unique_ptr<Tokenizer>(std::move(t));
}

// ---- Hugging Face tokenizer.json --------------------------------------------------------------------

std::string dump_short(const json& j) {
  std::string s = j.dump();
  return s.size() > 200 ? s.substr(0, 200) + "..." : s;
}
bool jbool(const json& j, const char* k, bool def) {
  auto it = j.find(k);
  return it != j.end() && it->is_boolean() ? it->get<bool>() : def;
}
std::string jstr(const json& j, const char* k) {
  auto it = j.find(k);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}
// A token named in tokenizer_config.json: a string or {"content": ...}.
std::string token_name(const json& cfg, const char* k) {
  auto it = cfg.find(k);
  if (it == cfg.end()) return {};
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) return jstr(*it, "content");
  return {};
}
PrependScheme prepend_scheme(const json& j) {
  std::string p = jstr(j, "prepend_scheme");
  if (p == "first") return PrependScheme::First;
  if (p == "never") return PrependScheme::Never;
  if (p.empty() && !jbool(j, "add_prefix_space", true)) return PrependScheme::Never;
  return PrependScheme::Always;
}

Status parse_normalizer(const json& j, BpeTokenizer& t) {
  if (j.is_null()) return {};
  std::string type = jstr(j, "type");
  if (type == "Sequence") {
    for (const json& x : j.at("normalizers")) SS_TRY(parse_normalizer(x, t));
  } else if (type == "NFC") {
    t.norm_.push_back({NormOp::Nfc, "", ""});
  } else if (type == "Prepend") {
    t.norm_.push_back({NormOp::Prepend, jstr(j, "prepend"), ""});
  } else if (type == "Replace" && j.at("pattern").contains("String")) {
    t.norm_.push_back({NormOp::Replace, j.at("pattern").at("String").get<std::string>(), jstr(j, "content")});
  } else {
    return make_error("normalizer " + dump_short(j) + " is not supported (supported: NFC, Prepend, Replace of a string)");
  }
  return {};
}

Status parse_pre(const json& j, BpeTokenizer& t, bool& byte_level) {
  if (j.is_null()) return {};
  std::string type = jstr(j, "type");
  if (type == "Sequence") {
    for (const json& x : j.at("pretokenizers")) SS_TRY(parse_pre(x, t, byte_level));
  } else if (type == "ByteLevel") {
    byte_level = true;
    if (jbool(j, "add_prefix_space", false)) {
      if (!t.steps_.empty()) return make_error("ByteLevel add_prefix_space after another pre-tokenizer is not supported");
      t.byte_level_prefix_space_ = true;
    }
    if (jbool(j, "use_regex", true)) {
      t.steps_.push_back(SplitKind::Gpt2);
      if (t.pre_name_.empty()) t.pre_name_ = "gpt2";
    }
  } else if (type == "Split") {
    const json& pat = j.at("pattern");
    std::string rx = pat.contains("Regex") ? pat.at("Regex").get<std::string>() : std::string();
    if (jstr(j, "behavior") != "Isolated" || jbool(j, "invert", false))
      return make_error("Split pre-tokenizer " + dump_short(j) + ": only behavior Isolated without invert is supported");
    if (rx == kLlama3Pattern) {
      t.steps_.push_back(SplitKind::Llama3);
      t.pre_name_ = "llama3";
    } else if (rx == kQwen2Pattern) {
      t.steps_.push_back(SplitKind::Qwen2);
      t.pre_name_ = "qwen2";
    } else if (rx == kGpt2Pattern) {
      t.steps_.push_back(SplitKind::Gpt2);
      t.pre_name_ = "gpt2";
    } else {
      return make_error("Split pre-tokenizer regex " + dump_short(pat) +
                        " is not one of the known ones (Llama-3, Qwen2, GPT-2)");
    }
  } else if (type == "Digits") {
    t.steps_.push_back(jbool(j, "individual_digits", false) ? SplitKind::DigitsEach : SplitKind::DigitsRun);
    if (t.pre_name_.empty()) t.pre_name_ = "digits+gpt2";
  } else if (type == "Metaspace") {
    if (!t.steps_.empty()) return make_error("Metaspace after another pre-tokenizer is not supported");
    std::string rep = jstr(j, "replacement");
    if (!rep.empty() && rep != kMetaspace) return make_error("Metaspace replacement '" + rep + "' is not supported");
    t.metaspace_ = true;
    if (jbool(j, "split", true)) t.steps_.push_back(SplitKind::MetaspaceCut);
    t.metaspace_prepend_ = prepend_scheme(j);
    t.pre_name_ = "metaspace";
  } else {
    return make_error("pre-tokenizer " + dump_short(j) +
                      " is not supported (supported: ByteLevel, Split with the Llama-3/Qwen2/GPT-2 regex, Digits, Metaspace)");
  }
  return {};
}

Status parse_decoder(const json& j, BpeTokenizer& t) {
  if (j.is_null()) return {};
  std::string type = jstr(j, "type");
  if (type == "Sequence") {
    for (const json& x : j.at("decoders")) SS_TRY(parse_decoder(x, t));
  } else if (type == "ByteLevel") {
    t.dec_byte_level_ = true;
  } else if (type == "Replace") {
    if (!j.at("pattern").contains("String") || j.at("pattern").at("String") != std::string(kMetaspace) ||
        jstr(j, "content") != " ")
      return make_error("decoder " + dump_short(j) + " is not supported (only Replace of U+2581 by a space)");
    t.dec_metaspace_ = true;
  } else if (type == "ByteFallback") {
    t.dec_byte_fallback_ = true;
  } else if (type == "Fuse") {
  } else if (type == "Strip") {
    if (jstr(j, "content") != " " || j.value("stop", 0) != 0)
      return make_error("decoder " + dump_short(j) + " is not supported (only stripping leading spaces)");
    t.dec_strip_ = j.value("start", 0);
  } else if (type == "Metaspace") {
    t.dec_metaspace_ = true;
    t.dec_strip_ = prepend_scheme(j) == PrependScheme::Never ? 0 : 1;
  } else {
    return make_error("decoder " + dump_short(j) + " is not supported");
  }
  return {};
}

Status parse_post(const json& j, BpeTokenizer& t) {
  if (j.is_null()) return {};
  std::string type = jstr(j, "type");
  if (type == "Sequence") {
    for (const json& x : j.at("processors")) SS_TRY(parse_post(x, t));
  } else if (type == "ByteLevel") {
  } else if (type == "TemplateProcessing") {
    bool seen_a = false;
    for (const json& item : j.at("single")) {
      if (item.contains("Sequence")) {
        seen_a = true;
      } else if (item.contains("SpecialToken")) {
        std::string name = item.at("SpecialToken").at("id").get<std::string>();
        const json& st = j.at("special_tokens").at(name);
        for (const json& id : st.at("ids")) (seen_a ? t.suffix_ids_ : t.prefix_ids_).push_back(id.get<int32_t>());
      }
    }
  } else if (type == "RobertaProcessing" || type == "BertProcessing") {
    t.prefix_ids_.push_back(j.at("cls").at(1).get<int32_t>());
    t.suffix_ids_.push_back(j.at("sep").at(1).get<int32_t>());
  } else {
    return make_error("post-processor " + dump_short(j) + " is not supported");
  }
  return {};
}

Expected<std::unique_ptr<Tokenizer>> load_json(std::string_view text, std::string_view config_text) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return make_error("not valid JSON");
  json cfg = json::object();
  if (!config_text.empty()) {
    cfg = json::parse(config_text, nullptr, false);
    if (cfg.is_discarded() || !cfg.is_object()) return make_error("tokenizer_config.json is not valid JSON");
  }
  auto t = std::make_unique<BpeTokenizer>();
  const json& model = j.at("model");
  if (jstr(model, "type") != "BPE")
    return make_error("model type '" + jstr(model, "type") + "' is not supported (only BPE)");
  if (!jstr(model, "continuing_subword_prefix").empty() || !jstr(model, "end_of_word_suffix").empty())
    return make_error("BPE continuing_subword_prefix / end_of_word_suffix are not supported");
  const json& vocab = model.at("vocab");
  int32_t max_id = -1;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    int32_t id = it.value().get<int32_t>();
    if (id < 0) return make_error("negative token id for '" + it.key() + "'");
    t->vocab_.try_emplace(it.key(), id);
    max_id = std::max(max_id, id);
  }
  std::vector<AddedToken> added;
  if (j.contains("added_tokens") && j.at("added_tokens").is_array()) {
    for (const json& a : j.at("added_tokens")) {
      AddedToken tok{a.at("content").get<std::string>(), a.at("id").get<int32_t>(), jbool(a, "special", false),
                     jbool(a, "lstrip", false),  jbool(a, "rstrip", false),       jbool(a, "single_word", false),
                     jbool(a, "normalized", !jbool(a, "special", false))};
      if (tok.id < 0) return make_error("negative added token id for '" + tok.content + "'");
      max_id = std::max(max_id, tok.id);
      added.push_back(std::move(tok));
    }
  }
  t->tokens_.assign(size_t(max_id + 1), std::string());
  for (const auto& [k, id] : t->vocab_) t->tokens_[id] = k;
  for (const auto& a : added) t->tokens_[a.id] = a.content;
  t->added_ = std::move(added);

  SS_TRY(parse_normalizer(j.value("normalizer", json()), *t));
  bool byte_level = false;
  SS_TRY(parse_pre(j.value("pre_tokenizer", json()), *t, byte_level));
  SS_TRY(parse_decoder(j.value("decoder", json()), *t));
  SS_TRY(parse_post(j.value("post_processor", json()), *t));
  if (t->pre_name_.empty()) t->pre_name_ = "none";
  t->kind_name_ = byte_level ? "byte-level BPE" : "BPE";
  t->model_.byte_level = byte_level;
  t->model_.byte_fallback = jbool(model, "byte_fallback", false);
  t->model_.fuse_unk = jbool(model, "fuse_unk", false);
  t->model_.ignore_merges = jbool(model, "ignore_merges", false);
  if (model.contains("dropout") && model.at("dropout").is_number() && model.at("dropout").get<double>() > 0)
    return make_error("BPE dropout is not supported");
  std::string unk = jstr(model, "unk_token");
  if (!unk.empty()) {
    auto it = t->vocab_.find(unk);
    if (it == t->vocab_.end()) return make_error("unk_token '" + unk + "' is not in the vocabulary");
    t->model_.unk_id = it->second;
  }
  t->model_.vocab = &t->vocab_;
  const json& merges = model.at("merges");
  int32_t rank = 0;
  for (const json& m : merges) {
    if (m.is_string()) {
      const std::string& s = m.get_ref<const std::string&>();
      size_t sp = s.find(' ', 1);
      if (sp == std::string::npos) return make_error("merge " + std::to_string(rank) + " '" + s + "' has no space");
      SS_TRY(t->model_.add_merge(std::string_view(s).substr(0, sp), std::string_view(s).substr(sp + 1), rank));
    } else if (m.is_array() && m.size() == 2) {
      SS_TRY(t->model_.add_merge(m[0].get<std::string>(), m[1].get<std::string>(), rank));
    } else {
      return make_error("merge " + std::to_string(rank) + " is neither \"a b\" nor [a, b]");
    }
    ++rank;
  }

  // Special tokens and the template from tokenizer_config.json.
  std::string bos = token_name(cfg, "bos_token"), eos = token_name(cfg, "eos_token");
  t->bos_ = bos.empty() ? -1 : t->id_of(bos);
  t->eos_ = eos.empty() ? -1 : t->id_of(eos);
  if (t->bos_ < 0 && !t->prefix_ids_.empty()) t->bos_ = t->prefix_ids_[0];
  if (t->bos_ < 0) t->bos_ = t->id_of("<s>");
  if (t->eos_ < 0) {
    for (const char* name : {"</s>", "<|endoftext|>", "<|end_of_text|>"}) {
      if ((t->eos_ = t->id_of(name)) >= 0) break;
    }
  }
  if (cfg.contains("add_bos_token") && cfg.at("add_bos_token").is_boolean() && t->bos_ >= 0) {
    auto& p = t->prefix_ids_;
    p.erase(std::remove(p.begin(), p.end(), t->bos_), p.end());
    if (cfg.at("add_bos_token").get<bool>()) p.insert(p.begin(), t->bos_);
  }
  if (cfg.contains("add_eos_token") && cfg.at("add_eos_token").is_boolean() && t->eos_ >= 0) {
    auto& s = t->suffix_ids_;
    s.erase(std::remove(s.begin(), s.end(), t->eos_), s.end());
    if (cfg.at("add_eos_token").get<bool>()) s.push_back(t->eos_);
  }
  if (cfg.contains("chat_template")) {
    const json& ct = cfg.at("chat_template");
    if (ct.is_string()) {
      t->chat_template_ = ct.get<std::string>();
    } else if (ct.is_array()) {
      for (const json& e : ct) {
        if (jstr(e, "name") == "default") t->chat_template_ = jstr(e, "template");
      }
    }
  }
  for (int32_t id : t->prefix_ids_)
    if (id < 0 || id >= int32_t(t->tokens_.size())) return make_error("post-processor token id out of range");
  for (int32_t id : t->suffix_ids_)
    if (id < 0 || id >= int32_t(t->tokens_.size())) return make_error("post-processor token id out of range");
  SS_TRY(t->finish());
  return std::unique_ptr<Tokenizer>(std::move(t));
}

Expected<std::string> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return make_error(path + ": cannot open");
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) return make_error(path + ": read error");
  return ss.str();
}

}  // namespace

Expected<std::unique_ptr<Tokenizer>> Tokenizer::from_spec(const TokenizerSpec& spec) {
  try {
    return load_spec(spec);
  } catch (const std::exception& e) {
    return make_error(std::string("tokenizer: ") + e.what());
  }
}

Expected<std::unique_ptr<Tokenizer>> Tokenizer::from_json_text(std::string_view tokenizer_json,
                                                               std::string_view tokenizer_config_json,
                                                               const std::string& origin) {
  try {
    auto r = load_json(tokenizer_json, tokenizer_config_json);
    if (!r.ok()) return make_error(origin + ": " + r.message());
    return r;
  } catch (const std::exception& e) {
    return make_error(origin + ": malformed tokenizer.json (" + e.what() + ")");
  }
}

Expected<std::unique_ptr<Tokenizer>> Tokenizer::from_json_file(const std::string& path) {
  SS_ASSIGN(std::string text, read_file(path));
  std::string config;
  size_t slash = path.find_last_of('/');
  std::string cfg_path = (slash == std::string::npos ? std::string() : path.substr(0, slash + 1)) + "tokenizer_config.json";
  if (std::ifstream(cfg_path).good()) {
    SS_ASSIGN(config, read_file(cfg_path));
  }
  return from_json_text(text, config, path);
}

bool Tokenizer::is_eog(int32_t id) const {
  const auto& e = eog_ids();
  return std::find(e.begin(), e.end(), id) != e.end();
}

std::string StreamDecoder::push(int32_t id) {
  if (!(skip_special_ && tok_.is_special(id))) pending_ += tok_.token_to_piece(id);
  size_t keep = incomplete_utf8_tail(pending_);
  std::string out = repair_utf8(std::string_view(pending_).substr(0, pending_.size() - keep));
  pending_.erase(0, pending_.size() - keep);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out = repair_utf8(pending_);
  pending_.clear();
  return out;
}

}  // namespace ss::tok
