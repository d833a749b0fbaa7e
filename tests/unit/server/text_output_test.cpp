// Incremental detokenization with stop strings: the text before the stop string is released
// exactly once, nothing after it, and held-back text is never lost.
#include "server/text_output.h"

#include <gtest/gtest.h>

#include "test_util.h"

using namespace ss;
using namespace ss::server;

namespace {

struct Fixture {
  std::unique_ptr<tok::Tokenizer> tok = test_support::test_tokenizer();
};

// Feeds ids one at a time; returns (all text taken, index of the token that stopped or -1).
std::pair<std::string, int> run(const tok::Tokenizer& tk, const std::vector<int32_t>& ids, std::vector<std::string> stops,
                                int min_tokens = 0, bool include_stop = false) {
  TextOutput out(tk, std::move(stops), true, min_tokens, include_stop);
  std::string text;
  int stopped_at = -1;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (out.push(ids[i])) {
      stopped_at = static_cast<int>(i);
      break;
    }
    text += out.take();
  }
  text += out.finish();
  return {text, stopped_at};
}

TEST(TextOutput, NoStopStringsReproducesDecode) {
  Fixture f;
  ASSERT_TRUE(f.tok);
  const std::string s = "Hello, world! How are you today? 1234 héllo ☃ end.";
  const auto ids = f.tok->encode(s, false, false);
  auto [text, at] = run(*f.tok, ids, {});
  EXPECT_EQ(text, s);
  EXPECT_EQ(at, -1);
}

TEST(TextOutput, CutsAtTheStopStringAcrossTokens) {
  Fixture f;
  const std::string s = "The answer is 42. Then more text follows here.";
  const auto ids = f.tok->encode(s, false, false);
  for (const std::string& stop : {std::string(". Then"), std::string("42"), std::string("here."), std::string("e")}) {
    auto [text, at] = run(*f.tok, ids, {stop});
    EXPECT_EQ(text, s.substr(0, s.find(stop))) << "stop '" << stop << "'";
    EXPECT_GE(at, 0) << stop;
  }
  // include_stop_str_in_output: the text ends with the stop string itself.
  for (const std::string& stop : {std::string(". Then"), std::string("42"), std::string("e")})
    EXPECT_EQ(run(*f.tok, ids, {stop}, 0, true).first, s.substr(0, s.find(stop) + stop.size())) << stop;
  // Several stop strings: the earliest match in the text wins.
  auto [text, at] = run(*f.tok, ids, {"follows", "is 4", "zzz"});
  EXPECT_EQ(text, "The answer ");
  // A stop string that never occurs: everything, including a held-back partial match at the end.
  auto [all, none] = run(*f.tok, ids, {"here.!"});
  EXPECT_EQ(all, s);
  EXPECT_EQ(none, -1);
}

// vLLM's min_tokens: a stop string is looked for only in the text of the min_tokens-th token on, so
// an early occurrence passes through and the first one after it stops the text.
TEST(TextOutput, MinTokensDelaysStopStrings) {
  Fixture f;
  const std::string s = "one. two. three. four.";
  const auto ids = f.tok->encode(s, false, false);
  // Tokens up to and including the first ". " occurrence, then the rest.
  size_t first_dot = 0;
  std::string prefix;
  while (first_dot < ids.size() && prefix.find('.') == std::string::npos)
    prefix += f.tok->decode({ids[first_dot++]}, false);
  ASSERT_LT(first_dot + 2, ids.size());
  const int min_tokens = static_cast<int>(first_dot) + 1;  // past the first '.'
  auto [text, stopped_at] = run(*f.tok, ids, {"."}, min_tokens);
  EXPECT_EQ(text, "one. two") << "min_tokens " << min_tokens;
  EXPECT_GE(stopped_at, min_tokens - 1);
  for (int m : {0, 1}) EXPECT_EQ(run(*f.tok, ids, {"."}, m).first, "one") << "min_tokens " << m << " is the plain rule";
}

TEST(TextOutput, HoldsBackOnlyPossibleStopPrefixes) {
  Fixture f;
  const auto ids = f.tok->encode("abc abd abe", false, false);
  TextOutput out(*f.tok, {"ab!"});
  std::string released;
  for (size_t i = 0; i < ids.size(); ++i) {
    ASSERT_FALSE(out.push(ids[i]));
    released += out.take();
    // Whatever is not yet released must be a prefix of the stop string.
    const std::string full = f.tok->decode(std::vector<int32_t>(ids.begin(), ids.begin() + i + 1));
    ASSERT_EQ(full.compare(0, released.size(), released), 0);
    EXPECT_LE(full.size() - released.size(), 2u);
  }
  released += out.finish();
  EXPECT_EQ(released, "abc abd abe");
}

TEST(TextOutput, EmptyStopStringsAreIgnoredAndPushAfterStopIsNoop) {
  Fixture f;
  const auto ids = f.tok->encode("one two three", false, false);
  auto [text, at] = run(*f.tok, ids, {"", "two"});
  EXPECT_EQ(text, "one ");
  TextOutput out(*f.tok, {"one"});
  bool stopped = false;
  for (int32_t id : ids) stopped = out.push(id) || stopped;
  EXPECT_TRUE(stopped);
  EXPECT_TRUE(out.stopped());
  EXPECT_EQ(out.matched_stop(), "one");
  EXPECT_EQ(out.finish(), "");
}

}  // namespace
