#include "server/metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>

namespace ss::server {

std::string escape_label_value(const std::string& v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

static std::string escape_help(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

std::string format_metric_value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);  // shortest round-trip form
  if (ec != std::errc()) return "0";
  return std::string(buf, end);
}

Histogram::Histogram(std::vector<double> upper_bounds) : bounds_(std::move(upper_bounds)) {
  std::sort(bounds_.begin(), bounds_.end());
  counts_.assign(bounds_.size() + 1, 0);
}

void Histogram::observe(double v) {
  if (std::isnan(v)) return;
  const size_t b = std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin();  // le semantics
  std::lock_guard<std::mutex> lk(mu_);
  ++counts_[b];
  sum_ += v;
  ++count_;
}

Histogram::Snapshot Histogram::snapshot() const {
  Snapshot s;
  s.bounds = bounds_;
  std::lock_guard<std::mutex> lk(mu_);
  uint64_t acc = 0;
  for (uint64_t c : counts_) {
    acc += c;
    s.cumulative.push_back(acc);
  }
  s.sum = sum_;
  s.count = count_;
  return s;
}

static std::string render_labels(const Labels& labels) {
  if (labels.empty()) return {};
  std::string s = "{";
  for (size_t i = 0; i < labels.size(); ++i) {
    if (i) s += ',';
    s += labels[i].first + "=\"" + escape_label_value(labels[i].second) + "\"";
  }
  return s + "}";
}

MetricsRegistry::Series& MetricsRegistry::find_or_add(const std::string& name, const std::string& help, Type type,
                                                      const Labels& labels, const std::vector<double>* buckets) {
  const std::string key = render_labels(labels);
  std::lock_guard<std::mutex> lk(mu_);
  Family* fam = nullptr;
  for (auto& f : families_)
    if (f->name == name) fam = f.get();
  if (!fam) {
    families_.push_back(std::make_unique<Family>(Family{name, help, type, {}}));
    fam = families_.back().get();
  }
  for (auto& s : fam->series)
    if (s->labels == key) return *s;
  auto s = std::make_unique<Series>();
  s->labels = key;
  s->label_pairs = labels;
  // A family keeps its first type; a mismatched request still gets a working (unrendered) object.
  s->counter = std::make_unique<Counter>();
  s->gauge = std::make_unique<Gauge>();
  if (buckets) s->histogram = std::make_unique<Histogram>(*buckets);
  else s->histogram = std::make_unique<Histogram>(std::vector<double>{});
  fam->series.push_back(std::move(s));
  return *fam->series.back();
}

Counter& MetricsRegistry::counter(const std::string& name, const std::string& help, const Labels& labels) {
  return *find_or_add(name, help, Type::Counter, labels, nullptr).counter;
}

Gauge& MetricsRegistry::gauge(const std::string& name, const std::string& help, const Labels& labels) {
  return *find_or_add(name, help, Type::Gauge, labels, nullptr).gauge;
}

Histogram& MetricsRegistry::histogram(const std::string& name, const std::string& help,
                                      const std::vector<double>& buckets, const Labels& labels) {
  return *find_or_add(name, help, Type::Histogram, labels, &buckets).histogram;
}

std::string MetricsRegistry::render() const {
  std::string out;
  std::lock_guard<std::mutex> lk(mu_);
  for (const auto& f : families_) {
    const char* type = f->type == Type::Counter ? "counter" : f->type == Type::Gauge ? "gauge" : "histogram";
    out += "# HELP " + f->name + " " + escape_help(f->help) + "\n";
    out += "# TYPE " + f->name + " " + type + "\n";
    for (const auto& s : f->series) {
      switch (f->type) {
        case Type::Counter: out += f->name + s->labels + " " + format_metric_value(s->counter->value()) + "\n"; break;
        case Type::Gauge: out += f->name + s->labels + " " + format_metric_value(s->gauge->value()) + "\n"; break;
        case Type::Histogram: {
          const Histogram::Snapshot h = s->histogram->snapshot();
          for (size_t i = 0; i <= h.bounds.size(); ++i) {
            Labels l = s->label_pairs;
            l.emplace_back("le", i < h.bounds.size() ? format_metric_value(h.bounds[i]) : "+Inf");
            out += f->name + "_bucket" + render_labels(l) + " " + std::to_string(h.cumulative[i]) + "\n";
          }
          out += f->name + "_sum" + s->labels + " " + format_metric_value(h.sum) + "\n";
          out += f->name + "_count" + s->labels + " " + std::to_string(h.count) + "\n";
          break;
        }
      }
    }
  }
  return out;
}

}  // namespace ss::server
