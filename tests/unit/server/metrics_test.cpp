// The registry over prometheus-cpp: series created once per (name, labels), collectables rendered
// next to the registry's own families, safe under concurrent updates. The exposition text itself is
// checked by an independent parser (prometheus_client) in tests/e2e/test_server.py.
#include "server/metrics.h"

#include <gtest/gtest.h>

#include <thread>

using namespace ss::server;

namespace {
class FixedCollectable final : public prometheus::Collectable {
 public:
  explicit FixedCollectable(double v) : v_(v) {}
  std::vector<prometheus::MetricFamily> Collect() const override {
    return {gauge_family("engine_running", "Running", v_, {{"model_name", "m"}}),
            counter_family("engine_tokens_total", "Tokens", 2 * v_)};
  }

 private:
  double v_;
};
}  // namespace

TEST(Metrics, RendersCountersGaugesHistogramsAndCollectables) {
  MetricsRegistry r;
  r.counter("req_total", "Requests", {{"reason", "a\"b"}}).Increment(2);
  r.counter("req_total", "Requests", {{"reason", "x"}}).Increment();
  r.gauge("vllm:num_requests_running", "Running", {{"model_name", "m"}}).Set(3);
  prometheus::Histogram& h = r.histogram("lat_seconds", "Latency", {0.1, 1.0});
  h.Observe(0.05);
  h.Observe(0.1);
  h.Observe(5);
  auto c = std::make_shared<FixedCollectable>(7);
  r.add_collectable(c);
  const std::string t = r.render();
  EXPECT_NE(t.find("# HELP req_total Requests\n# TYPE req_total counter\n"), std::string::npos) << t;
  EXPECT_NE(t.find("req_total{reason=\"a\\\"b\"} 2\n"), std::string::npos) << t;
  EXPECT_NE(t.find("req_total{reason=\"x\"} 1\n"), std::string::npos) << t;
  EXPECT_NE(t.find("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"m\"} 3\n"),
            std::string::npos)
      << t;
  EXPECT_NE(t.find("lat_seconds_bucket{le=\"0.1\"} 2\n"), std::string::npos) << t;  // le is inclusive
  EXPECT_NE(t.find("lat_seconds_bucket{le=\"1\"} 2\n"), std::string::npos) << t;
  EXPECT_NE(t.find("lat_seconds_bucket{le=\"+Inf\"} 3\n"), std::string::npos) << t;
  EXPECT_NE(t.find("lat_seconds_sum 5.15\n"), std::string::npos) << t;
  EXPECT_NE(t.find("lat_seconds_count 3\n"), std::string::npos) << t;
  EXPECT_NE(t.find("# TYPE engine_running gauge\nengine_running{model_name=\"m\"} 7\n"), std::string::npos) << t;
  EXPECT_NE(t.find("# TYPE engine_tokens_total counter\nengine_tokens_total 14\n"), std::string::npos) << t;
  // The same (name, labels) is the same series.
  EXPECT_EQ(&r.counter("req_total", "Requests", {{"reason", "x"}}), &r.counter("req_total", "Requests", {{"reason", "x"}}));
  // A collectable that is gone is skipped, not dereferenced.
  c.reset();
  EXPECT_EQ(r.render().find("engine_running"), std::string::npos);
}

TEST(Metrics, ANameKeepsItsType) {
  MetricsRegistry r;
  r.counter("thing_total", "A counter");
  EXPECT_THROW(r.gauge("thing_total", "Now a gauge"), std::invalid_argument);
}

TEST(Metrics, ConcurrentUpdatesAndScrapes) {
  MetricsRegistry r;
  prometheus::Counter& c = r.counter("c_total", "c");
  prometheus::Histogram& h = r.histogram("h", "h", {1});
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&, t] {
      for (int i = 0; i < 10000; ++i) {
        c.Increment();
        h.Observe(0.5);
        // Series created while others update and scrape (finish reasons appear this way).
        if (i % 1000 == 0) r.counter("done_total", "d", {{"reason", std::to_string(t)}}).Increment();
        if (t == 0 && i % 500 == 0) (void)r.render();
      }
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(c.Value(), 40000);
  const std::string text = r.render();
  EXPECT_NE(text.find("h_count 40000\n"), std::string::npos) << text;
  for (int t = 0; t < 4; ++t)
    EXPECT_NE(text.find("done_total{reason=\"" + std::to_string(t) + "\"} 10\n"), std::string::npos) << text;
}
