// /metrics on prometheus-cpp (Debian's prometheus-cpp-dev, the core library only: the server
// already speaks HTTP, so the library's own exposer is not used). MetricsRegistry is a thin
// convenience over prometheus::Registry: one call returns the series for (name, labels),
// creating the family and the series on first use (thread-safe, references stay valid for the
// registry's life), and render() serializes the registry plus any collectables, the library's
// way of exporting values another component owns (read at scrape time, never stale).
#pragma once
#include <prometheus/collectable.h>
#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/labels.h>
#include <prometheus/metric_family.h>
#include <prometheus/registry.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace ss::server {

using Labels = prometheus::Labels;  // std::map<std::string, std::string>

class MetricsRegistry {
 public:
  MetricsRegistry();
  // The family (name, help) is created on first use; a name registered with another type throws
  // std::invalid_argument (a programming error, as in the library).
  prometheus::Counter& counter(const std::string& name, const std::string& help, const Labels& labels = {});
  prometheus::Gauge& gauge(const std::string& name, const std::string& help, const Labels& labels = {});
  prometheus::Histogram& histogram(const std::string& name, const std::string& help,
                                   const std::vector<double>& buckets, const Labels& labels = {});
  // Families produced at scrape time by `c` (held weakly: a collectable that is gone is skipped).
  void add_collectable(const std::shared_ptr<prometheus::Collectable>& c);
  std::string render() const;  // Prometheus text exposition format 0.0.4

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  mutable std::mutex mu_;
  std::vector<std::weak_ptr<prometheus::Collectable>> collectables_;
};

// Helpers for collectables: one family holding one unlabelled-or-labelled sample.
prometheus::MetricFamily gauge_family(const std::string& name, const std::string& help, double value,
                                      const Labels& labels = {});
prometheus::MetricFamily counter_family(const std::string& name, const std::string& help, double value,
                                        const Labels& labels = {});

}  // namespace ss::server
