// SeqEvent::marks: what the host executor reports of a sequence's life between its events (queued,
// scheduled, prefill chunks, preempted), checked against the engine's own counters and the
// prompt's length, not against a recorded trace.
#include <gtest/gtest.h>

#include <map>

#include "engine/engine.h"
#include "fake_backend.h"

using namespace ss;
using namespace ss::engine;
using namespace ss::engine::testing;
using Kind = backend::SeqMark::Kind;

namespace {
constexpr int kVocab = 97;

struct Life {
  std::vector<backend::SeqMark> marks;  // in delivery order
  std::vector<size_t> marks_before_token;  // marks.size() when each token event arrived
  int tokens = 0;
  FinishReason finish = FinishReason::None;
};

EventCallback recorder(std::map<RequestId, Life>& lives) {
  return [&lives](const TokenEvent& e) {
    Life& l = lives[e.id];
    l.marks.insert(l.marks.end(), e.marks.begin(), e.marks.end());
    if (e.token >= 0) {
      ++l.tokens;
      l.marks_before_token.push_back(l.marks.size());
    }
    if (e.finish != FinishReason::None) l.finish = e.finish;
  };
}
}  // namespace

// A 100-token prompt under a 32-token step budget: queued, scheduled, then chunks that tile the
// prompt exactly, all delivered with the first token; the decode steps after it carry nothing.
TEST(SeqMarks, ChunkedPrefillIsReportedWithTheFirstToken) {
  std::mt19937 g(7);
  FakeBackend be(64, 16, kVocab);
  SchedulerConfig sc;
  sc.max_num_seqs = 4;
  sc.max_num_batched_tokens = 32;
  auto e = make_engine(be, sc, kVocab);
  std::map<RequestId, Life> lives;
  Request r = make_request(spec(random_tokens(g, 100, kVocab), 6), nullptr);
  r.on_event = recorder(lives);
  const auto before = backend::Clock::now();
  const RequestId id = *e->add_request(std::move(r));
  for (int i = 0; i < 100 && e->has_work(); ++i) ASSERT_TRUE(e->step().ok());
  const auto after = backend::Clock::now();
  const Life& l = lives[id];
  ASSERT_EQ(l.tokens, 6);
  ASSERT_GE(l.marks.size(), 3u);
  EXPECT_EQ(l.marks[0].kind, Kind::Queued);
  EXPECT_EQ(l.marks[1].kind, Kind::Scheduled);
  EXPECT_EQ(l.marks[1].tokens, 0);  // nothing cached
  int next = 0;
  for (size_t i = 2; i < l.marks.size(); ++i) {
    const backend::SeqMark& m = l.marks[i];
    ASSERT_EQ(m.kind, Kind::PrefillChunk) << i;
    EXPECT_EQ(m.position, next);
    EXPECT_GT(m.tokens, 0);
    EXPECT_LE(m.tokens, 32);
    EXPECT_LE(l.marks[i - 1].at, m.at);
    EXPECT_LE(m.at, m.end);
    next += m.tokens;
  }
  EXPECT_EQ(next, 100);  // the chunks cover the prompt, once
  EXPECT_EQ(l.marks.size() - 2, 4u);  // ceil(100 / 32)
  EXPECT_LE(before, l.marks.front().at);
  EXPECT_LE(l.marks.back().end, after);
  // Everything came with the first token; the other token events carried no marks.
  ASSERT_EQ(l.marks_before_token.size(), 6u);
  for (size_t t = 0; t < 6; ++t) EXPECT_EQ(l.marks_before_token[t], l.marks.size()) << t;
}

// Under a KV cache too small for the load, every preemption the engine counts is reported to its
// sequence, each followed by a new admission whose first chunk starts where the prefix cache left
// it (the admission's cached tokens) before its next token.
TEST(SeqMarks, EveryPreemptionIsReportedAndFollowedByAResumption) {
  std::mt19937 g(4);
  FakeBackend be(10, 4, kVocab);  // 40 tokens of KV
  be.max_tokens = 16;
  be.max_seqs = 6;
  SchedulerConfig sc;
  sc.max_num_seqs = 6;
  sc.max_num_batched_tokens = 16;
  auto e = make_engine(be, sc, kVocab);
  std::map<RequestId, Life> lives;
  std::vector<RequestId> ids;
  for (int i = 0; i < 10; ++i) {
    Request r = make_request(spec(random_tokens(g, 4 + (i * 5) % 11, kVocab), 10 + (i * 7) % 12), nullptr);
    r.on_event = recorder(lives);
    ids.push_back(*e->add_request(std::move(r)));
  }
  for (int i = 0; i < 5000 && e->has_work(); ++i) ASSERT_TRUE(e->step().ok());
  ASSERT_FALSE(e->has_work());
  int64_t preempted = 0;
  for (RequestId id : ids) {
    const Life& l = lives[id];
    ASSERT_EQ(l.finish, FinishReason::Length) << id;
    int scheduled = 0, pre = 0;
    bool waiting_resume = false, expect_chunk = false;
    int cached = 0;
    for (const backend::SeqMark& m : l.marks) {
      switch (m.kind) {
        case Kind::Queued: EXPECT_EQ(scheduled, 0); break;
        case Kind::Scheduled:
          ++scheduled;
          expect_chunk = true;
          cached = m.tokens;
          waiting_resume = false;
          break;
        case Kind::KvRestore: ADD_FAILURE() << "a KV restore with no tiers configured"; break;
        case Kind::Preempted:
          ++pre;
          EXPECT_FALSE(waiting_resume);
          waiting_resume = true;
          break;
        case Kind::PrefillChunk:
          EXPECT_FALSE(waiting_resume);
          if (expect_chunk) {
            EXPECT_EQ(m.position, cached) << "an admission's first chunk starts after its cached prefix";
          }
          expect_chunk = false;
          break;
      }
    }
    EXPECT_FALSE(waiting_resume) << id;
    EXPECT_EQ(scheduled, pre + 1) << id;
    preempted += pre;
  }
  EXPECT_GT(preempted, 0);
  EXPECT_EQ(preempted, e->stats().preemptions);
}
