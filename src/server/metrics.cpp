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

RequestMetrics::RequestMetrics(MetricsRegistry& reg) : reg_(reg) {
  ttft_ = &reg.histogram("selfserve_time_to_first_token_seconds", "Time from arrival to the first token",
                         {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20,
                          40, 80, 160});
  tpot_ = &reg.histogram("selfserve_time_per_output_token_seconds",
                         "Mean time between output tokens of a finished request",
                         {0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5});
  e2e_ = &reg.histogram("selfserve_e2e_request_latency_seconds", "Time from arrival to the last event",
                        {0.05, 0.1, 0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960});
}

void RequestMetrics::set_model(const std::string& model_id) {
  const Labels l = {{"model_name", model_id}};
  const std::vector<double> ttft_b = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
                                      1,     2.5,   5,    7.5,  10,   20,   40,   80,  160, 640, 2560};
  const std::vector<double> itl_b = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
                                     1,    2.5,   5,    7.5,   10,  20,   40,  80};
  const std::vector<double> e2e_b = {0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960, 1920, 7680};
  v_ttft_ = &reg_.histogram("vllm:time_to_first_token_seconds", "Time to first token (vLLM-compatible name)", ttft_b, l);
  v_itl_ = &reg_.histogram("vllm:inter_token_latency_seconds", "Time between output tokens (vLLM-compatible name)",
                           itl_b, l);
  v_tpot_ = &reg_.histogram("vllm:time_per_output_token_seconds", "Time between output tokens (older vLLM name)", itl_b,
                            l);
  v_e2e_ = &reg_.histogram("vllm:e2e_request_latency_seconds", "End-to-end request latency (vLLM-compatible name)",
                           e2e_b, l);
  v_queue_ = &reg_.histogram("vllm:request_queue_time_seconds",
                             "Time in the engine's waiting queue before first scheduled (vLLM-compatible name)",
                             e2e_b, l);
  v_prefill_ = &reg_.histogram("vllm:request_prefill_time_seconds",
                               "Time from first scheduled to the first token (vLLM-compatible name)", e2e_b, l);
  v_decode_ = &reg_.histogram("vllm:request_decode_time_seconds",
                              "Time from the first to the last token (vLLM-compatible name)", e2e_b, l);
  v_inference_ = &reg_.histogram("vllm:request_inference_time_seconds",
                                 "Time from first scheduled to the last token (vLLM-compatible name)", e2e_b, l);
  const char* fin_help = "Finished requests by reason (vLLM-compatible name)";
  v_stop_ = &reg_.counter("vllm:request_success_total", fin_help, {{"finished_reason", "stop"}, *l.begin()});
  v_length_ = &reg_.counter("vllm:request_success_total", fin_help, {{"finished_reason", "length"}, *l.begin()});
  v_abort_ = &reg_.counter("vllm:request_success_total", fin_help, {{"finished_reason", "abort"}, *l.begin()});
}

void RequestMetrics::first_token(double since_arrival) {
  ttft_->Observe(since_arrival);
  if (v_ttft_) v_ttft_->Observe(since_arrival);
}

void RequestMetrics::token_gap(double seconds) {
  if (v_itl_) v_itl_->Observe(seconds);
  if (v_tpot_) v_tpot_->Observe(seconds);
}

void RequestMetrics::stages(double queue, double prefill, double decode, double inference) {
  if (!v_queue_) return;  // no model yet
  if (queue >= 0) v_queue_->Observe(queue);
  if (prefill >= 0) v_prefill_->Observe(prefill);
  if (decode >= 0) v_decode_->Observe(decode);
  if (inference >= 0) v_inference_->Observe(inference);
}

void RequestMetrics::finished(engine::FinishReason why, double since_arrival, int tokens, double first_to_last) {
  e2e_->Observe(since_arrival);
  if (v_e2e_) v_e2e_->Observe(since_arrival);
  switch (why) {  // vLLM's reasons; a deadline ends a request as "length" (as the API says)
    case engine::FinishReason::Stop:
      if (v_stop_) v_stop_->Increment();
      break;
    case engine::FinishReason::Length:
    case engine::FinishReason::Timeout:
      if (v_length_) v_length_->Increment();
      break;
    case engine::FinishReason::Abort:
      if (v_abort_) v_abort_->Increment();
      break;
    default: break;
  }
  if (tokens >= 2) tpot_->Observe(first_to_last / (tokens - 1));
  reg_.counter("selfserve_requests_finished_total", "Finished requests (choices), by finish reason",
               {{"finish_reason", engine::to_string(why)}})
      .Increment();
}

}  // namespace ss::server
