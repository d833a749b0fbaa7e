#include "server/metrics.h"

#include <prometheus/text_serializer.h>

namespace ss::server {

MetricsRegistry::MetricsRegistry() : registry_(std::make_shared<prometheus::Registry>()) {}

prometheus::Counter& MetricsRegistry::counter(const std::string& name, const std::string& help, const Labels& labels) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(*registry_).Add(labels);
}

prometheus::Gauge& MetricsRegistry::gauge(const std::string& name, const std::string& help, const Labels& labels) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(*registry_).Add(labels);
}

prometheus::Histogram& MetricsRegistry::histogram(const std::string& name, const std::string& help,
                                                  const std::vector<double>& buckets, const Labels& labels) {
  return prometheus::BuildHistogram().Name(name).Help(help).Register(*registry_).Add(
      labels, prometheus::Histogram::BucketBoundaries(buckets.begin(), buckets.end()));
}

void MetricsRegistry::add_collectable(const std::shared_ptr<prometheus::Collectable>& c) {
  std::lock_guard<std::mutex> lk(mu_);
  collectables_.push_back(c);
}

std::string MetricsRegistry::render() const {
  std::vector<prometheus::MetricFamily> families = registry_->Collect();
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (const auto& w : collectables_)
      if (auto c = w.lock()) {
        auto more = c->Collect();
        families.insert(families.end(), std::make_move_iterator(more.begin()), std::make_move_iterator(more.end()));
      }
  }
  return prometheus::TextSerializer().Serialize(families);
}

static prometheus::MetricFamily one_sample(const std::string& name, const std::string& help,
                                           prometheus::MetricType type, double value, const Labels& labels) {
  prometheus::MetricFamily f;
  f.name = name;
  f.help = help;
  f.type = type;
  prometheus::ClientMetric m;
  for (const auto& [k, v] : labels) m.label.push_back({k, v});
  if (type == prometheus::MetricType::Counter) m.counter.value = value;
  else m.gauge.value = value;
  f.metric.push_back(std::move(m));
  return f;
}

prometheus::MetricFamily gauge_family(const std::string& name, const std::string& help, double value,
                                      const Labels& labels) {
  return one_sample(name, help, prometheus::MetricType::Gauge, value, labels);
}

prometheus::MetricFamily counter_family(const std::string& name, const std::string& help, double value,
                                        const Labels& labels) {
  return one_sample(name, help, prometheus::MetricType::Counter, value, labels);
}

}  // namespace ss::server
