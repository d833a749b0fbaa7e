// A small Prometheus registry: counters, gauges and histograms, rendered in the text exposition
// format (version 0.0.4). Thread-safe: values are atomics (histograms take a short lock), and the
// registry's structure is fixed after start-up (creating a series takes the registry lock).
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace ss::server {

using Labels = std::vector<std::pair<std::string, std::string>>;

class Counter {
 public:
  void inc(double v = 1.0) { v_.fetch_add(v, std::memory_order_relaxed); }
  // For totals mirrored from another component's own counter (e.g. the engine's snapshot).
  void set_total(double v) { v_.store(v, std::memory_order_relaxed); }
  double value() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> v_{0.0};
};

class Gauge {
 public:
  void set(double v) { v_.store(v, std::memory_order_relaxed); }
  void add(double v) { v_.fetch_add(v, std::memory_order_relaxed); }
  double value() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> v_{0.0};
};

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);  // ascending; +Inf is implied
  void observe(double v);
  struct Snapshot {
    std::vector<double> bounds;
    std::vector<uint64_t> cumulative;  // per bound, then +Inf
    double sum = 0;
    uint64_t count = 0;
  };
  Snapshot snapshot() const;

 private:
  std::vector<double> bounds_;
  mutable std::mutex mu_;
  std::vector<uint64_t> counts_;  // per bucket (not cumulative), last is +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

class MetricsRegistry {
 public:
  // Returns the series for (name, labels), creating it on first use; the reference stays valid for
  // the registry's life. A name keeps the type and help it was first registered with.
  Counter& counter(const std::string& name, const std::string& help, const Labels& labels = {});
  Gauge& gauge(const std::string& name, const std::string& help, const Labels& labels = {});
  Histogram& histogram(const std::string& name, const std::string& help, const std::vector<double>& buckets,
                       const Labels& labels = {});
  std::string render() const;  // Prometheus text format

 private:
  enum class Type { Counter, Gauge, Histogram };
  struct Series {
    std::string labels;  // rendered: {a="b",c="d"} or empty
    Labels label_pairs;
    std::unique_ptr<Counter> counter;
    std::unique_ptr<Gauge> gauge;
    std::unique_ptr<Histogram> histogram;
  };
  struct Family {
    std::string name, help;
    Type type;
    std::vector<std::unique_ptr<Series>> series;
  };
  Series& find_or_add(const std::string& name, const std::string& help, Type type, const Labels& labels,
                      const std::vector<double>* buckets);

  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Family>> families_;
};

// Label values and help text escaped as the exposition format wants.
std::string escape_label_value(const std::string& v);
std::string format_metric_value(double v);

}  // namespace ss::server
