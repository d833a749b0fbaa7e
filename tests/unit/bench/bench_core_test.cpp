// Pure parts of the load generator: percentiles, SSE parsing, the request mix, summaries, URLs.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "bench/bench.h"

namespace ss::bench {
namespace {

TEST(Percentile, LinearInterpolationLikeNumpy) {
  const std::vector<double> v{5, 1, 4, 2, 3};  // unsorted on purpose
  EXPECT_DOUBLE_EQ(percentile(v, 0), 1.0);
  EXPECT_DOUBLE_EQ(percentile(v, 50), 3.0);
  EXPECT_DOUBLE_EQ(percentile(v, 90), 4.6);
  EXPECT_DOUBLE_EQ(percentile(v, 99), 4.96);
  EXPECT_DOUBLE_EQ(percentile(v, 100), 5.0);
  EXPECT_DOUBLE_EQ(percentile({}, 50), 0.0);
  EXPECT_DOUBLE_EQ(percentile({7}, 99), 7.0);
  std::vector<double> h;
  for (int i = 1; i <= 100; ++i) h.push_back(i);
  EXPECT_NEAR(percentile(h, 99), 99.01, 1e-9);
  EXPECT_NEAR(percentile(h, 50), 50.5, 1e-9);
}

std::vector<std::string> parse_in_pieces(const std::string& s, size_t piece) {
  std::vector<std::string> out;
  SseParser p([&](std::string_view d) { out.emplace_back(d); });
  for (size_t i = 0; i < s.size(); i += piece) p.feed(std::string_view(s).substr(i, piece));
  p.finish();
  return out;
}

TEST(Sse, EventsSurviveAnySplit) {
  const std::string stream =
      ": keep-alive\r\n\r\n"
      "data: {\"choices\":[{\"text\":\"Hel\"}]}\r\n\r\n"
      "data:{\"choices\":[{\"text\":\"lo\"}]}\n\n"
      "event: x\ndata: line1\ndata: line2\r\r"
      "data: [DONE]\n\n";
  const std::vector<std::string> want{"{\"choices\":[{\"text\":\"Hel\"}]}", "{\"choices\":[{\"text\":\"lo\"}]}",
                                      "line1\nline2", "[DONE]"};
  for (size_t piece = 1; piece <= stream.size(); ++piece) EXPECT_EQ(parse_in_pieces(stream, piece), want) << piece;
  // Every two-way split, including between "\r" and "\n".
  for (size_t cut = 0; cut <= stream.size(); ++cut) {
    std::vector<std::string> out;
    SseParser p([&](std::string_view d) { out.emplace_back(d); });
    p.feed(std::string_view(stream).substr(0, cut));
    p.feed(std::string_view(stream).substr(cut));
    p.finish();
    EXPECT_EQ(out, want) << cut;
  }
}

TEST(Sse, LastEventWithoutBlankLineIsDispatchedAtFinish) {
  EXPECT_EQ(parse_in_pieces("data: a\n\ndata: [DONE]", 3), (std::vector<std::string>{"a", "[DONE]"}));
  EXPECT_TRUE(parse_in_pieces("\n\n: only comments\n\n", 1).empty());
}

TEST(Chunk, CompletionChatUsageErrorDone) {
  EXPECT_TRUE(parse_chunk("[DONE]").done);
  auto c = parse_chunk(R"({"choices":[{"index":0,"text":" world","finish_reason":null}]})");
  EXPECT_EQ(c.text, " world");
  EXPECT_FALSE(c.error);
  c = parse_chunk(R"({"choices":[{"delta":{"content":"hi"}}]})");
  EXPECT_EQ(c.text, "hi");
  c = parse_chunk(R"({"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":34,"total_tokens":46}})");
  EXPECT_TRUE(c.text.empty());
  ASSERT_TRUE(c.completion_tokens);
  EXPECT_EQ(*c.completion_tokens, 34);
  EXPECT_EQ(*c.prompt_tokens, 12);
  c = parse_chunk(R"({"choices":[{"text":""}],"usage":null})");
  EXPECT_FALSE(c.completion_tokens);
  c = parse_chunk(R"({"error":{"message":"boom","type":"server_error"}})");
  ASSERT_TRUE(c.error);
  EXPECT_EQ(*c.error, "boom");
  EXPECT_TRUE(parse_chunk("{not json").error);
  EXPECT_TRUE(parse_chunk("[1,2]").error);
}

TEST(Mix, ProportionsAndBounds) {
  MixConfig cfg;  // 30/50/20, ctx 8192, output 16..256
  MixSampler s(cfg, 42);
  int counts[3] = {0, 0, 0};
  const int n = 4000;
  for (int i = 0; i < n; ++i) {
    const RequestSpec r = s.next();
    ++counts[static_cast<int>(r.klass)];
    EXPECT_GE(r.max_tokens, 16);
    EXPECT_LE(r.max_tokens, 256);
    EXPECT_LE(r.prompt_tokens + r.max_tokens, cfg.max_context);
    switch (r.klass) {
      case PromptClass::kShort: EXPECT_LE(r.prompt_tokens, 128); break;
      case PromptClass::kMedium: EXPECT_GT(r.prompt_tokens, 128); EXPECT_LE(r.prompt_tokens, 2048); break;
      case PromptClass::kLong: EXPECT_GT(r.prompt_tokens, 2048); break;
    }
    if (i < 200) {  // the prompt has about prompt_tokens / tokens_per_word words
      const int words = 1 + static_cast<int>(std::count(r.prompt.begin(), r.prompt.end(), ' '));
      EXPECT_NEAR(words * cfg.tokens_per_word, r.prompt_tokens, cfg.tokens_per_word);
    }
  }
  EXPECT_NEAR(counts[0] / double(n), 0.3, 0.03);
  EXPECT_NEAR(counts[1] / double(n), 0.5, 0.03);
  EXPECT_NEAR(counts[2] / double(n), 0.2, 0.03);
}

TEST(Mix, SameSeedSameRequestsAndCustomFractions) {
  MixConfig cfg;
  cfg.short_frac = 1, cfg.medium_frac = 0, cfg.long_frac = 0;
  cfg.out_min = cfg.out_max = 7;
  MixSampler a(cfg, 7), b(cfg, 7), c(cfg, 8);
  bool differs = false;
  for (int i = 0; i < 50; ++i) {
    auto ra = a.next(), rb = b.next(), rc = c.next();
    EXPECT_EQ(ra.prompt, rb.prompt);
    EXPECT_EQ(ra.klass, PromptClass::kShort);
    EXPECT_EQ(ra.max_tokens, 7);
    differs |= ra.prompt != rc.prompt;
  }
  EXPECT_TRUE(differs);
  // A small context squeezes long prompts into what fits.
  MixConfig small;
  small.short_frac = 0, small.medium_frac = 0, small.long_frac = 1, small.max_context = 1024;
  MixSampler d(small, 1);
  for (int i = 0; i < 100; ++i) {
    auto r = d.next();
    EXPECT_LE(r.prompt_tokens + r.max_tokens, 1024);
  }
}

TEST(Summary, TpotThroughputAndErrors) {
  std::vector<RequestResult> rs(4);
  for (int i = 0; i < 3; ++i) {
    rs[i].ok = true;
    rs[i].ttft_s = 0.1 * (i + 1);
    rs[i].output_tokens = 11;
    rs[i].e2e_s = rs[i].ttft_s + 10 * 0.02;  // 10 gaps of 20 ms
    rs[i].prompt_tokens = 100;
  }
  rs[3].error = "http 429";
  const LevelReport r = summarize({4, 0, 10, 60, 0}, rs, 2.0);
  EXPECT_EQ(r.ok, 3);
  EXPECT_EQ(r.errors, 1);
  EXPECT_EQ(r.error_kinds.at("http 429"), 1);
  EXPECT_NEAR(r.tpot.p50, 0.02, 1e-12);
  EXPECT_NEAR(r.tpot.p99, 0.02, 1e-12);
  EXPECT_NEAR(r.ttft.p50, 0.2, 1e-12);
  EXPECT_NEAR(r.ttft.mean, 0.2, 1e-12);
  EXPECT_DOUBLE_EQ(r.req_per_s, 1.5);
  EXPECT_DOUBLE_EQ(r.out_tok_per_s, 33.0 / 2.0);
  EXPECT_DOUBLE_EQ(r.in_tok_per_s, 150.0);
  const auto j = to_json(r, true);
  EXPECT_EQ(j["requests"].size(), 4u);
  EXPECT_NE(table_row(r).find("c=4"), std::string::npos);
}

TEST(Url, Parse) {
  auto u = parse_url("http://127.0.0.1:8000");
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->host, "127.0.0.1");
  EXPECT_EQ(u->port, "8000");
  EXPECT_EQ(u->base_path, "");
  u = parse_url("http://localhost/api/v1/");
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->port, "80");
  EXPECT_EQ(u->base_path, "/api");
  u = parse_url("http://[::1]:9000/v1");
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->host, "::1");
  EXPECT_EQ(u->port, "9000");
  EXPECT_FALSE(parse_url("https://example.com").ok());
  EXPECT_FALSE(parse_url("http://host:abc").ok());
}

}  // namespace
}  // namespace ss::bench
