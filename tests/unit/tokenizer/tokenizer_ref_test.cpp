// Token ids identical to Hugging Face tokenizers on the corpus of tools/gen_tokenizer_ref.py, for
// tokenizers loaded from tokenizer.json and from GGUF-style specs (and the real SmolLM2 GGUF).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>

#include "test_util.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace ss::tok {
namespace {

using nlohmann::json;
using test::data_dir;

struct Corpus {
  std::vector<std::string> texts;  // valid UTF-8, then invalid byte strings
  size_t n_valid = 0;
};

const Corpus& corpus() {
  static const Corpus c = [] {
    Corpus c;
    json j = test::read_json(data_dir() + "corpus.json");
    for (const auto& t : j["texts"]) c.texts.push_back(t.get<std::string>());
    c.n_valid = c.texts.size();
    for (const auto& h : j["invalid_hex"]) c.texts.push_back(test::from_hex(h.get<std::string>()));
    return c;
  }();
  return c;
}

std::string show(const std::vector<int32_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s.push_back(' ');
    s.append(std::to_string(v[i]));
  }
  s.push_back(']');
  return s;
}

std::string escaped(const std::string& s) {
  std::string o;
  for (unsigned char c : s) {
    if (c == '\n') o += "\\n";
    else if (c == '\t') o += "\\t";
    else if (c == '\r') o += "\\r";
    else if (c < 0x20 || c == 0x7F) { char b[8]; std::snprintf(b, sizeof b, "\\x%02x", c); o += b; }
    else o.push_back(char(c));
  }
  return o;
}

struct Skip {
  std::vector<std::string> if_contains;
  bool operator()(const std::string& t) const {
    for (const auto& s : if_contains) if (t.find(s) != std::string::npos) return true;
    return false;
  }
};

// Compares encode (both parse_special modes) and decode with the HF reference for every corpus string.
void check_reference(const Tokenizer& tok, const std::string& expected_file, const Skip& skip = {}) {
  json exp = test::read_json(data_dir() + expected_file);
  const auto& cases = exp["cases"];
  const Corpus& c = corpus();
  ASSERT_EQ(cases.size(), c.texts.size()) << expected_file << " does not match corpus.json; rerun the generator";
  size_t compared = 0, bad_ids = 0, bad_plain = 0, bad_decode = 0;
  for (size_t i = 0; i < c.texts.size(); ++i) {
    const std::string& text = c.texts[i];
    if (skip(text)) continue;
    ++compared;
    auto want = cases[i]["ids"].get<std::vector<int32_t>>();
    auto got = tok.encode(text, false, true);
    if (got != want && ++bad_ids <= 5) {
      ADD_FAILURE() << expected_file << " case " << i << " \"" << escaped(text) << "\"\n  want " << show(want)
                    << "\n  got  " << show(got);
    }
    auto want_plain = cases[i].contains("ids_plain") ? cases[i]["ids_plain"].get<std::vector<int32_t>>() : want;
    auto got_plain = tok.encode(text, false, false);
    if (got_plain != want_plain && ++bad_plain <= 5) {
      ADD_FAILURE() << expected_file << " case " << i << " (special tokens not parsed) \"" << escaped(text)
                    << "\"\n  want " << show(want_plain) << "\n  got  " << show(got_plain);
    }
    if (i < c.n_valid) {
      std::string want_text = cases[i].contains("decoded") ? cases[i]["decoded"].get<std::string>() : text;
      std::string got_text = repair_utf8(tok.decode(want, false));
      if (got_text != want_text && ++bad_decode <= 5) {
        ADD_FAILURE() << expected_file << " case " << i << " decode\n  want \"" << escaped(want_text)
                      << "\"\n  got  \"" << escaped(got_text) << "\"";
      }
    }
  }
  EXPECT_EQ(bad_ids, 0u) << "of " << compared;
  EXPECT_EQ(bad_plain, 0u) << "of " << compared;
  EXPECT_EQ(bad_decode, 0u) << "of " << compared;
  std::printf("[ref] %s: %zu strings compared, %zu/%zu/%zu mismatches (ids/ids without specials/decode)\n",
              expected_file.c_str(), compared, bad_ids, bad_plain, bad_decode);
  EXPECT_EQ(tok.encode("Hello world", true, true), exp["with_bos"].get<std::vector<int32_t>>());
}

std::unique_ptr<Tokenizer> load_fixture(const std::string& name) {
  auto r = Tokenizer::from_json_text(test::read_text(data_dir() + name + ".tokenizer.json"),
                                     test::read_text(data_dir() + name + ".tokenizer_config.json"), name);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.message());
  return r.ok() ? std::move(r).value() : nullptr;
}

std::unique_ptr<Tokenizer> load_spec(const TokenizerSpec& spec) {
  auto r = Tokenizer::from_spec(spec);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.message());
  return r.ok() ? std::move(r).value() : nullptr;
}

TEST(TokenizerJson, Llama3MatchesHF) {
  auto t = load_fixture("llama3");
  ASSERT_TRUE(t);
  check_reference(*t, "llama3.expected.json");
}
TEST(TokenizerJson, Qwen2MatchesHF) {
  auto t = load_fixture("qwen2");
  ASSERT_TRUE(t);
  check_reference(*t, "qwen2.expected.json");
}
TEST(TokenizerJson, Gpt2MatchesHF) {
  auto t = load_fixture("gpt2");
  ASSERT_TRUE(t);
  check_reference(*t, "gpt2.expected.json");
}
TEST(TokenizerJson, SentencePieceMatchesHF) {
  auto t = load_fixture("spm");
  ASSERT_TRUE(t);
  check_reference(*t, "spm.expected.json");
}

TEST(TokenizerSpec, Llama3MatchesHF) {
  auto spec = test::spec_from_tokenizer_json(test::read_json(data_dir() + "llama3.tokenizer.json"), "llama-bpe");
  spec.bos_id = 0;
  spec.add_bos = true;
  auto t = load_spec(spec);
  ASSERT_TRUE(t);
  check_reference(*t, "llama3.expected.json");
}
TEST(TokenizerSpec, Qwen2MatchesHF) {
  auto spec = test::spec_from_tokenizer_json(test::read_json(data_dir() + "qwen2.tokenizer.json"), "qwen2");
  auto t = load_spec(spec);
  ASSERT_TRUE(t);
  check_reference(*t, "qwen2.expected.json");
}
TEST(TokenizerSpec, Gpt2MatchesHF) {
  // GGUF has no lstrip/rstrip flags: leave out the strings with the tokens that use them.
  auto spec = test::spec_from_tokenizer_json(test::read_json(data_dir() + "gpt2.tokenizer.json"), "gpt2");
  auto t = load_spec(spec);
  ASSERT_TRUE(t);
  check_reference(*t, "gpt2.expected.json", Skip{{"[MASK]", "<|x|>"}});
}
TEST(TokenizerSpec, SentencePieceScoresMatchHF) {
  json j = test::read_json(data_dir() + "spm.spec.json");
  TokenizerSpec spec;
  spec.model = j["model"];
  spec.pre = j["pre"];
  spec.tokens = j["tokens"].get<std::vector<std::string>>();
  spec.scores = j["scores"].get<std::vector<float>>();
  spec.token_types = j["token_types"].get<std::vector<int32_t>>();
  spec.bos_id = j["bos_id"];
  spec.eos_id = j["eos_id"];
  spec.unk_id = j["unk_id"];
  spec.add_bos = j["add_bos"];
  spec.add_space_prefix = j["add_space_prefix"];
  auto t = load_spec(spec);
  ASSERT_TRUE(t);
  check_reference(*t, "spm.expected.json");
}

TEST(TokenizerGguf, SmolLM2MatchesHF) {
  TokenizerSpec spec;
  if (!test::read_gguf_spec(test::smollm2_gguf(), spec)) GTEST_SKIP() << "no model at " << test::smollm2_gguf();
  EXPECT_EQ(spec.pre, "smollm");
  auto t = load_spec(spec);
  ASSERT_TRUE(t);
  EXPECT_EQ(t->vocab_size(), 49152);
  EXPECT_EQ(t->bos_id(), 1);
  EXPECT_EQ(t->eos_id(), 2);
  EXPECT_FALSE(t->add_bos());
  EXPECT_TRUE(t->is_eog(2));  // <|im_end|>
  EXPECT_TRUE(t->is_eog(0));  // <|endoftext|>
  EXPECT_TRUE(t->is_special(1));
  EXPECT_FALSE(t->chat_template().empty());
  std::printf("[ref] %s\n", t->summary().c_str());
  check_reference(*t, "smollm2.expected.json");
  // A chat prompt through the model's own template: tests/unit/chat/chat_template_test.cpp.
}

TEST(TokenizerGguf, EncodeSpeed) {
  TokenizerSpec spec;
  std::unique_ptr<Tokenizer> t;
  if (test::read_gguf_spec(test::smollm2_gguf(), spec)) {
    t = load_spec(spec);
  } else {
    t = load_fixture("llama3");
  }
  ASSERT_TRUE(t);
  const Corpus& c = corpus();
  std::string prompt;
  for (size_t i = 150; prompt.size() < 2200; ++i) prompt += c.texts[i] + "\n";
  size_t n_tokens = t->encode(prompt, false, true).size();
  const int iters = 200;
  auto t0 = std::chrono::steady_clock::now();
  size_t sink = 0;
  for (int i = 0; i < iters; ++i) sink += t->encode(prompt, false, true).size();
  double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / iters;
  EXPECT_EQ(sink, n_tokens * iters);
  std::printf("[perf] encode of a %zu-token prompt (%zu bytes): %.1f us\n", n_tokens, prompt.size(), us);
  EXPECT_LT(us, 20000.0);  // sanity only: timing belongs to benchmarks
}

}  // namespace
}  // namespace ss::tok
