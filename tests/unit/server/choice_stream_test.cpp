// A choice's engine-thread side: stop strings end it asynchronously (the feed asks for the stop;
// tokens an executor produced after it are dropped), stop ids never reach the text, and a matched
// stop string is the finish reason whatever else ended the sequence at that token.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "server/choice_stream.h"
#include "test_util.h"

namespace ss::server {
namespace {

struct FeedRun {
  std::string text;
  std::vector<bool> stops;  // per token event: did the feed ask to stop?
  int deltas = 0, tokens = 0;
  engine::FinishReason finish = engine::FinishReason::None;
  std::optional<std::string> stop_reason;
};

// Feeds `ids` as token events (the last one carrying `last_finish`), then, if the feed asked to stop
// and the sequence had not finished, the engine's finish event for the stop.
FeedRun run(const tok::Tokenizer& tk, const GenerationRequest& g, const std::vector<int32_t>& ids,
            engine::FinishReason last_finish, std::vector<int32_t> stop_ids = {}) {
  MetricsRegistry reg;
  RequestMetrics metrics(reg);
  ChoiceFeed feed(tk, g, std::move(stop_ids), std::chrono::steady_clock::now(), metrics);
  FeedRun r;
  bool asked = false;
  auto take = [&](const engine::TokenEvent& e) {
    bool stop = false;
    auto d = feed.on_event(e, &stop);
    r.stops.push_back(stop);
    asked |= stop;
    if (!d) return;
    ++r.deltas;
    r.tokens += d->has_token;
    r.text += d->text;
    if (d->finish != engine::FinishReason::None) {
      r.finish = d->finish;
      r.stop_reason = d->stop_reason;
    }
  };
  for (size_t i = 0; i < ids.size(); ++i) {
    engine::TokenEvent e;
    e.id = 1;
    e.token = ids[i];
    if (i + 1 == ids.size()) e.finish = last_finish;
    take(e);
  }
  if (asked && last_finish == engine::FinishReason::None) {
    engine::TokenEvent e;
    e.id = 1;
    e.finish = engine::FinishReason::Stop;
    take(e);
  }
  return r;
}

TEST(ChoiceFeed, AStopStringAsksForTheStopAndDropsWhatFollows) {
  auto tk = test_support::test_tokenizer();
  ASSERT_NE(tk, nullptr);
  GenerationRequest g;
  g.stop = {"world"};
  const std::vector<int32_t> ids = tk->encode("hello world and more text", false, false);
  const FeedRun r = run(*tk, g, ids, engine::FinishReason::None);
  EXPECT_EQ(r.text, "hello ");
  EXPECT_EQ(r.finish, engine::FinishReason::Stop);
  EXPECT_EQ(r.stop_reason, std::optional<std::string>("world"));
  // Asked exactly once, at the token completing "world"; the tokens after it are not passed on.
  int asked = 0, at = -1;
  for (size_t i = 0; i < r.stops.size(); ++i)
    if (r.stops[i]) ++asked, at = static_cast<int>(i);
  EXPECT_EQ(asked, 1);
  std::string upto;
  for (int i = 0; i <= at; ++i) upto += tk->decode({ids[static_cast<size_t>(i)]});
  EXPECT_NE(upto.find("world"), std::string::npos);
  EXPECT_EQ(upto.substr(0, upto.size() - 1).find("world"), std::string::npos) << "asked late";
  EXPECT_EQ(r.tokens, at + 1);
}

TEST(ChoiceFeed, AStopStringWinsOverLengthAtTheSameToken) {
  auto tk = test_support::test_tokenizer();
  ASSERT_NE(tk, nullptr);
  GenerationRequest g;
  g.stop = {"world"};
  std::vector<int32_t> ids = tk->encode("hello world", false, false);
  const FeedRun r = run(*tk, g, ids, engine::FinishReason::Length);
  EXPECT_EQ(r.finish, engine::FinishReason::Stop);
  EXPECT_EQ(r.text, "hello ");
}

TEST(ChoiceFeed, AStopIdEndsTheTextWithoutBeingPartOfIt) {
  auto tk = test_support::test_tokenizer();
  ASSERT_NE(tk, nullptr);
  GenerationRequest g;
  g.skip_special_tokens = false;  // special tokens would print: a stop id still must not
  const int32_t eos = tk->eos_id() >= 0 ? tk->eos_id() : tk->eog_ids().front();
  std::vector<int32_t> ids = tk->encode("hello", false, false);
  ids.push_back(eos);
  const FeedRun r = run(*tk, g, ids, engine::FinishReason::Stop, {eos});
  EXPECT_EQ(r.text, "hello");
  EXPECT_EQ(r.finish, engine::FinishReason::Stop);
  EXPECT_EQ(r.tokens, static_cast<int>(ids.size()));  // the stop token is still an output token
  // The same token when it is not a stop id is text.
  const FeedRun other = run(*tk, g, ids, engine::FinishReason::Length);
  EXPECT_NE(other.text, "hello");
}

}  // namespace
}  // namespace ss::server
