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

// The executor's marks become the choice's timeline, handed out with the finish: the first
// admission (its cached prefix), each chunk, each preemption and the admission after it, and the
// token times the feed saw; vLLM's stage histograms are observed once, from those times.
TEST(ChoiceFeed, MarksBecomeTheTimelineAndTheStageHistograms) {
  auto tk = test_support::test_tokenizer();
  ASSERT_NE(tk, nullptr);
  GenerationRequest g;
  MetricsRegistry reg;
  RequestMetrics metrics(reg);
  metrics.set_model("m");
  using Clock = std::chrono::steady_clock;
  using K = backend::SeqMark::Kind;
  const auto arrival = Clock::now() - std::chrono::milliseconds(50);
  ChoiceFeed feed(*tk, g, {}, arrival, metrics);
  const auto at = [&](int ms) { return arrival + std::chrono::milliseconds(ms); };
  const std::vector<int32_t> ids = tk->encode("a b c", false, false);
  ASSERT_GE(ids.size(), 2u);
  std::shared_ptr<telemetry::ChoiceTimeline> t;
  for (size_t i = 0; i < ids.size(); ++i) {
    engine::TokenEvent e;
    e.id = 1;
    e.token = ids[i];
    if (i == 0) {
      backend::SeqMark q{K::Queued, at(1)}, sch{K::Scheduled, at(2)}, c1{K::PrefillChunk, at(2), at(4)},
          c2{K::PrefillChunk, at(4), at(6)};
      sch.tokens = 16;
      c1.position = 16;
      c1.tokens = 8;
      c2.position = 24;
      c2.tokens = 3;
      e.marks = {q, sch, c1, c2};
    }
    if (i == 1) e.marks = {{K::Preempted, at(10)}, {K::Scheduled, at(12)}, {K::PrefillChunk, at(12), at(13)}};
    if (i + 1 == ids.size()) e.finish = engine::FinishReason::Length;
    bool stop = false;
    auto d = feed.on_event(e, &stop);
    ASSERT_TRUE(d);
    if (i + 1 < ids.size()) EXPECT_FALSE(d->timeline);
    else t = d->timeline;
  }
  ASSERT_TRUE(t);
  EXPECT_EQ(t->arrival, arrival);
  EXPECT_EQ(t->queued, at(1));
  EXPECT_EQ(t->scheduled, at(2));  // the first admission; the second is a resumption
  EXPECT_EQ(t->cached_tokens, 16);
  ASSERT_EQ(t->prefill_chunks.size(), 3u);
  EXPECT_EQ(t->prefill_chunks[1].position, 24);
  EXPECT_EQ(t->prefill_chunks[1].end, at(6));
  EXPECT_EQ(t->preemptions, std::vector<Clock::time_point>{at(10)});
  EXPECT_EQ(t->resumptions, std::vector<Clock::time_point>{at(12)});
  EXPECT_EQ(t->completion_tokens, static_cast<int>(ids.size()));
  EXPECT_EQ(t->finish_reason, "length");
  EXPECT_LE(t->first_token, t->last_token);
  EXPECT_LE(t->last_token, t->finished);
  EXPECT_GE(t->first_token, arrival + std::chrono::milliseconds(50));  // when the feed saw it
  const std::string text = reg.render();
  EXPECT_NE(text.find("vllm:request_queue_time_seconds_count{model_name=\"m\"} 1"), std::string::npos) << text;
  EXPECT_NE(text.find("vllm:request_prefill_time_seconds_count{model_name=\"m\"} 1"), std::string::npos);
  EXPECT_NE(text.find("vllm:request_decode_time_seconds_count{model_name=\"m\"} 1"), std::string::npos);
  EXPECT_NE(text.find("vllm:request_inference_time_seconds_count{model_name=\"m\"} 1"), std::string::npos);
  // queued → scheduled: 1 ms.
  EXPECT_NE(text.find("vllm:request_queue_time_seconds_sum{model_name=\"m\"} 0.001"), std::string::npos) << text;
}

}  // namespace
}  // namespace ss::server
