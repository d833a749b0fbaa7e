// The Prometheus registry renders the text exposition format.
#include "server/metrics.h"

#include <gtest/gtest.h>

#include <thread>

using namespace ss::server;

TEST(Metrics, RendersCountersGaugesHistograms) {
  MetricsRegistry r;
  r.counter("req_total", "Requests", {{"reason", "a\"b"}}).inc(2);
  r.counter("req_total", "Requests", {{"reason", "x"}}).inc();
  r.gauge("vllm:num_requests_running", "Running", {{"model_name", "m"}}).set(3);
  Histogram& h = r.histogram("lat_seconds", "Latency", {0.1, 1.0});
  h.observe(0.05);
  h.observe(0.1);
  h.observe(5);
  const std::string t = r.render();
  EXPECT_NE(t.find("# HELP req_total Requests\n# TYPE req_total counter\n"), std::string::npos) << t;
  EXPECT_NE(t.find("req_total{reason=\"a\\\"b\"} 2\n"), std::string::npos) << t;
  EXPECT_NE(t.find("req_total{reason=\"x\"} 1\n"), std::string::npos) << t;
  EXPECT_NE(t.find("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"m\"} 3\n"),
            std::string::npos)
      << t;
  EXPECT_NE(t.find("lat_seconds_bucket{le=\"0.1\"} 2\n"), std::string::npos) << t;
  EXPECT_NE(t.find("lat_seconds_bucket{le=\"1\"} 2\n"), std::string::npos) << t;
  EXPECT_NE(t.find("lat_seconds_bucket{le=\"+Inf\"} 3\n"), std::string::npos) << t;
  EXPECT_NE(t.find("lat_seconds_sum 5.15\n"), std::string::npos) << t;
  EXPECT_NE(t.find("lat_seconds_count 3\n"), std::string::npos) << t;
  EXPECT_EQ(&r.counter("req_total", "Requests", {{"reason", "x"}}), &r.counter("req_total", "", {{"reason", "x"}}));
}

TEST(Metrics, ConcurrentUpdates) {
  MetricsRegistry r;
  Counter& c = r.counter("c_total", "c");
  Histogram& h = r.histogram("h", "h", {1});
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) {
        c.inc();
        h.observe(0.5);
      }
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(c.value(), 40000);
  EXPECT_EQ(h.snapshot().count, 40000u);
}

TEST(Metrics, ValueFormatting) {
  EXPECT_EQ(format_metric_value(1), "1");
  EXPECT_EQ(format_metric_value(0.25), "0.25");
  EXPECT_EQ(format_metric_value(1.0 / 0.0), "+Inf");
  EXPECT_EQ(escape_label_value("a\\b\n"), "a\\\\b\\n");
}
