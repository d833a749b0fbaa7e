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

#include "engine/engine.h"

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

// Every per-request latency series in one place: selfserve's own (created with the registry) and
// vLLM's names (its Grafana dashboard and autoscalers read them; they carry the model's name, so
// they appear once set_model is called): time to first token, the gaps between output tokens (both
// names vLLM has used), end-to-end latency, the mean time per output token of a finished request,
// finished requests by reason. Observed from the engine thread; the library's series are
// thread-safe.
class RequestMetrics {
 public:
  explicit RequestMetrics(MetricsRegistry& reg);
  void set_model(const std::string& model_id);
  void first_token(double since_arrival);
  void token_gap(double seconds);
  // tokens: output tokens; first_to_last: seconds between the first and the last of them.
  void finished(engine::FinishReason why, double since_arrival, int tokens, double first_to_last);
  // vLLM's per-stage histograms (seconds; a negative value: the stage did not happen): queued in
  // the engine → scheduled, scheduled → first token, first → last token, scheduled → last token.
  void stages(double queue, double prefill, double decode, double inference);

 private:
  MetricsRegistry& reg_;
  prometheus::Histogram *ttft_, *tpot_, *e2e_;
  prometheus::Histogram *v_ttft_ = nullptr, *v_itl_ = nullptr, *v_tpot_ = nullptr, *v_e2e_ = nullptr;
  prometheus::Counter *v_stop_ = nullptr, *v_length_ = nullptr, *v_abort_ = nullptr;
  prometheus::Histogram *v_queue_ = nullptr, *v_prefill_ = nullptr, *v_decode_ = nullptr, *v_inference_ = nullptr;
};

}  // namespace ss::server
