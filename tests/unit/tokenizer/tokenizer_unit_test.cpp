// Decoding, streaming, invalid UTF-8, NFC and loading errors (chat templates: tests/unit/chat/).
#include <gtest/gtest.h>

#include "test_util.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace ss::tok {
namespace {

using nlohmann::json;
using test::data_dir;

std::unique_ptr<Tokenizer> fixture(const std::string& name) {
  auto r = Tokenizer::from_json_text(test::read_text(data_dir() + name + ".tokenizer.json"),
                                     test::read_text(data_dir() + name + ".tokenizer_config.json"), name);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.message());
  return r.ok() ? std::move(r).value() : nullptr;
}

// The id whose piece is exactly these bytes (-1 if none).
int32_t id_of_piece(const Tokenizer& t, const std::string& piece) {
  for (int32_t id = 0; id < t.vocab_size(); ++id) {
    if (!t.is_special(id) && t.token_to_piece(id) == piece) return id;
  }
  return -1;
}

TEST(Utf8, InvalidInputEncodesAsReplacementCharacter) {
  auto t = fixture("llama3");
  ASSERT_TRUE(t);
  for (std::string bad : std::vector<std::string>{"caf\xE9", "\xFF\xFE", "a\xC3", "\xED\xA0\x80x", std::string("nul\0byte", 8)}) {
    auto ids = t->encode(bad, false, true);
    EXPECT_EQ(ids, t->encode(repair_utf8(bad), false, true));
    EXPECT_EQ(t->decode(ids), repair_utf8(bad));
  }
  EXPECT_TRUE(t->encode("", false, true).empty());
  EXPECT_EQ(t->encode("", true, true), std::vector<int32_t>{t->bos_id()});
}

TEST(Nfc, MatchesHuggingFaceOnEveryCodePoint) {
  json j = test::read_json(data_dir() + "nfc.json");
  const auto& changed = j["changed"];
  size_t checked = 0, bad = 0;
  for (const auto& range : j["ranges"]) {
    for (uint32_t c = range[0]; c < range[1].get<uint32_t>(); ++c) {
      if (c >= 0xD800 && c <= 0xDFFF) continue;
      std::string s = "a";
      append_utf8(s, c);
      s += "\u0301";
      append_utf8(s, c);
      char key[16];
      std::snprintf(key, sizeof key, "%X", c);
      std::string want = changed.contains(key) ? changed[key].get<std::string>() : s;
      ++checked;
      if (uni::nfc(s) != want && ++bad <= 5) ADD_FAILURE() << "NFC differs from HF for U+" << key;
    }
  }
  EXPECT_EQ(bad, 0u) << "of " << checked;
}

TEST(Decode, RoundTripsValidText) {
  json corpus = test::read_json(data_dir() + "corpus.json");
  for (const char* name : {"llama3", "gpt2", "spm"}) {
    auto t = fixture(name);
    ASSERT_TRUE(t);
    size_t bad = 0;
    for (const auto& j : corpus["texts"]) {
      std::string s = j.get<std::string>();
      if (t->decode(t->encode(s, false, false)) != s && ++bad <= 3) ADD_FAILURE() << name << ": \"" << s << "\"";
    }
    EXPECT_EQ(bad, 0u) << name;
  }
  auto q = fixture("qwen2");  // normalizes to NFC first
  ASSERT_TRUE(q);
  EXPECT_EQ(q->decode(q->encode("Cafe\u0301", false, false)), "Caf\u00E9");
}

TEST(Decode, SkipSpecialAndPieces) {
  auto t = fixture("llama3");
  ASSERT_TRUE(t);
  auto ids = t->encode("Hi<|eot_id|>there", true, true);
  EXPECT_EQ(ids.front(), t->bos_id());
  EXPECT_EQ(t->decode(ids), "<|begin_of_text|>Hi<|eot_id|>there");
  EXPECT_EQ(t->decode(ids, true), "Hithere");
  EXPECT_TRUE(t->is_eog(t->eos_id()));
  EXPECT_EQ(t->token_text(t->eos_id()), "<|eot_id|>");
  EXPECT_TRUE(t->is_eog(t->encode("<|end_of_text|>", false, true).at(0)));
  EXPECT_EQ(t->token_to_piece(-1), "");
  EXPECT_EQ(t->decode({-5, 1 << 30}), "");

  auto s = fixture("spm");  // SentencePiece: ▁ is a space, the prepended one is dropped on decode
  ASSERT_TRUE(s);
  EXPECT_TRUE(s->add_bos());
  auto sids = s->encode("Hello  world", true, true);
  EXPECT_EQ(sids.front(), 1);
  EXPECT_EQ(s->decode(sids, true), "Hello  world");
  EXPECT_EQ(s->decode(sids, false), "<s> Hello  world");
  auto emoji = s->encode("\xF0\x9F\xA6\x99", false, false);  // byte fallback: <0xF0> <0x9F> <0xA6> <0x99>
  ASSERT_EQ(emoji.size(), 5u);                                  // ▁ then four bytes
  EXPECT_EQ(s->token_to_piece(emoji[1]), "\xF0");
}

TEST(StreamDecoder, HoldsBackSplitCharacters) {
  auto t = fixture("gpt2");
  ASSERT_TRUE(t);
  std::string emoji = "\xF0\x9F\x98\x80";  // 😀 as four byte tokens
  std::vector<int32_t> bytes;
  for (char c : emoji) {
    bytes.push_back(id_of_piece(*t, std::string(1, c)));
    ASSERT_GE(bytes.back(), 0);
  }
  StreamDecoder sd(*t);
  EXPECT_EQ(sd.push(id_of_piece(*t, "a")), "a");
  EXPECT_EQ(sd.push(bytes[0]), "");
  EXPECT_EQ(sd.push(bytes[1]), "");
  EXPECT_EQ(sd.push(bytes[2]), "");
  EXPECT_EQ(sd.push(bytes[3]), emoji);
  // A character cut short by the next token is replaced, the rest goes on.
  EXPECT_EQ(sd.push(bytes[0]), "");
  EXPECT_EQ(sd.push(id_of_piece(*t, "b")), "\uFFFD" "b");
  // An unfinished character at the end comes out on flush as U+FFFD.
  EXPECT_EQ(sd.push(bytes[0]), "");
  EXPECT_EQ(sd.push(bytes[1]), "");
  EXPECT_EQ(sd.flush(), "\uFFFD");
  EXPECT_EQ(sd.flush(), "");
  // Special tokens are skipped by default, kept when asked.
  int32_t eot = t->encode("<|endoftext|>", false, true).at(0);
  EXPECT_EQ(sd.push(eot), "");
  StreamDecoder keep(*t, false);
  EXPECT_EQ(keep.push(eot), "<|endoftext|>");
}

TEST(StreamDecoder, EqualsWholeDecodeOnCorpus) {
  json corpus = test::read_json(data_dir() + "corpus.json");
  for (const char* name : {"llama3", "spm", "qwen2"}) {
    auto t = fixture(name);
    ASSERT_TRUE(t);
    for (const auto& j : corpus["texts"]) {
      auto ids = t->encode(j.get<std::string>(), false, false);
      StreamDecoder sd(*t, false);
      std::string out;
      for (int32_t id : ids) {
        std::string piece = sd.push(id);
        ASSERT_EQ(valid_utf8_prefix(piece), piece.size());
        out += piece;
      }
      out += sd.flush();
      std::string whole;
      for (int32_t id : ids) whole += t->token_to_piece(id);
      ASSERT_EQ(out, repair_utf8(whole)) << name;
    }
  }
}

TEST(Loading, ErrorsNameTheProblem) {
  TokenizerSpec spec;
  spec.model = "gpt2";
  spec.pre = "mystery-pre";
  spec.tokens = {"a", "b"};
  auto r = Tokenizer::from_spec(spec);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("mystery-pre"), std::string::npos) << r.message();

  spec.pre = "gpt2";
  spec.model = "bert";
  r = Tokenizer::from_spec(spec);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("bert"), std::string::npos);

  spec.model = "gpt2";
  spec.merges = {"a c"};
  r = Tokenizer::from_spec(spec);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("a c"), std::string::npos);

  spec.merges.clear();
  spec.tokens.clear();
  EXPECT_FALSE(Tokenizer::from_spec(spec).ok());

  EXPECT_FALSE(Tokenizer::from_json_text("{not json").ok());
  EXPECT_FALSE(Tokenizer::from_json_text("{}").ok());
  EXPECT_FALSE(Tokenizer::from_json_text(R"({"model": {"type": "WordPiece", "vocab": {}}})").ok());
  auto rx = Tokenizer::from_json_text(
      R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
          "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "\\w+"}, "behavior": "Isolated", "invert": false}})",
      {}, "x/tokenizer.json");
  ASSERT_FALSE(rx.ok());
  EXPECT_NE(rx.message().find("\\\\w+"), std::string::npos) << rx.message();
  EXPECT_EQ(rx.message().rfind("x/tokenizer.json", 0), 0u) << rx.message();
  EXPECT_FALSE(Tokenizer::from_json_file("/nonexistent/tokenizer.json").ok());
  // Wrong JSON types are errors, not exceptions.
  EXPECT_FALSE(Tokenizer::from_json_text(R"({"model": {"type": "BPE", "vocab": {"a": "zero"}, "merges": []}})").ok());
}

TEST(Loading, JsonFileWithConfigBeside) {
  auto r = Tokenizer::from_json_file(data_dir() + "llama3.tokenizer.json");  // no tokenizer_config.json beside
  ASSERT_TRUE(r.ok()) << r.message();
  EXPECT_TRUE((*r)->chat_template().empty());
  auto t = fixture("llama3");
  ASSERT_TRUE(t);
  EXPECT_FALSE(t->chat_template().empty()) << "read from tokenizer_config.json (its family: chat/chat_template_test.cpp)";
  EXPECT_NE(t->summary().find("llama3"), std::string::npos) << t->summary();
}

}  // namespace
}  // namespace ss::tok

namespace ss::tok {
namespace {

TEST(Robustness, RandomBytesNeverBreakEncodeOrDecode) {
  uint64_t state = 0x9E3779B97F4A7C15ull;
  auto next = [&] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  const char* pieces[] = {"<|im_start|>", "<s>", "[MASK]", " ", "\n", "\xE2\x96\x81", "'s", "1", "\xC3", "\xF0\x9F"};
  for (const char* name : {"llama3", "qwen2", "gpt2", "spm"}) {
    auto t = fixture(name);
    ASSERT_TRUE(t);
    for (int i = 0; i < 1500; ++i) {
      std::string s;
      size_t n = next() % 48;
      for (size_t k = 0; k < n; ++k) {
        if (next() % 5 == 0) s += pieces[next() % 10];
        else s.push_back(char(next() & 0xFF));
      }
      for (bool special : {true, false}) {
        auto ids = t->encode(s, special, special);
        for (int32_t id : ids) ASSERT_TRUE(id >= 0 && id < t->vocab_size());
        bool lossless = std::string(name) == "llama3" || std::string(name) == "gpt2";  // no normalizer, no ▁
        if (!special && lossless) {
          ASSERT_EQ(t->decode(ids), repair_utf8(s)) << name;
        }
        StreamDecoder sd(*t, false);
        std::string out;
        for (int32_t id : ids) out += sd.push(id);
        out += sd.flush();
        ASSERT_EQ(valid_utf8_prefix(out), out.size());
      }
    }
  }
}

}  // namespace
}  // namespace ss::tok
