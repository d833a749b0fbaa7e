// The parts of the load generator that need no network: percentiles, SSE parsing, the request mix,
// summaries and the report formats.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "bench/bench.h"

namespace ss::bench {

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const double rank = std::clamp(p, 0.0, 100.0) / 100.0 * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  const double frac = rank - static_cast<double>(lo);
  return v[lo] + (v[hi] - v[lo]) * frac;
}

// ---- SSE (https://html.spec.whatwg.org/multipage/server-sent-events.html, the parts we need) ----
void SseParser::feed(std::string_view bytes) {
  for (char ch : bytes) {
    if (skip_lf_) {
      skip_lf_ = false;
      if (ch == '\n') continue;
    }
    if (ch == '\r' || ch == '\n') {
      skip_lf_ = ch == '\r';
      line(buf_);
      buf_.clear();
    } else {
      buf_ += ch;
    }
  }
}

void SseParser::finish() {
  if (!buf_.empty()) {
    line(buf_);
    buf_.clear();
  }
  line("");
}

void SseParser::line(std::string_view l) {
  if (l.empty()) {  // blank line: dispatch the event
    if (have_data_) on_data_(data_);
    data_.clear();
    have_data_ = false;
    return;
  }
  if (l.front() == ':') return;  // comment (keep-alive pings)
  const size_t colon = l.find(':');
  std::string_view field = l.substr(0, colon), value;
  if (colon != std::string_view::npos) {
    value = l.substr(colon + 1);
    if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  }
  if (field != "data") return;  // event, id, retry: not used by OpenAI streams
  if (have_data_) data_ += '\n';
  data_.append(value);
  have_data_ = true;
}

ChunkInfo parse_chunk(std::string_view data) {
  ChunkInfo c;
  if (data == "[DONE]") {
    c.done = true;
    return c;
  }
  const nlohmann::json j = nlohmann::json::parse(data, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    c.error = "unparseable stream chunk";
    return c;
  }
  if (auto e = j.find("error"); e != j.end()) {
    if (e->is_object() && e->contains("message") && (*e)["message"].is_string())
      c.error = (*e)["message"].get<std::string>();
    else
      c.error = e->dump();
    return c;
  }
  if (auto ch = j.find("choices"); ch != j.end() && ch->is_array() && !ch->empty()) {
    const auto& c0 = (*ch)[0];
    if (c0.is_object()) {
      if (auto t = c0.find("text"); t != c0.end() && t->is_string()) c.text = t->get<std::string>();
      if (auto d = c0.find("delta"); d != c0.end() && d->is_object())
        if (auto t = d->find("content"); t != d->end() && t->is_string()) c.text = t->get<std::string>();
    }
  }
  if (auto u = j.find("usage"); u != j.end() && u->is_object()) {
    if (auto n = u->find("completion_tokens"); n != u->end() && n->is_number_integer())
      c.completion_tokens = n->get<int64_t>();
    if (auto n = u->find("prompt_tokens"); n != u->end() && n->is_number_integer())
      c.prompt_tokens = n->get<int64_t>();
  }
  return c;
}

// ---- request mix -------------------------------------------------------------------------------
namespace {
// Common English words, so the text tokenizes like prose (mostly one token per word plus a space).
constexpr const char* kWords[] = {
    "the",    "of",     "and",    "to",      "in",     "is",     "that",   "for",    "it",     "as",
    "was",    "with",   "be",     "by",      "on",     "not",    "he",     "this",   "are",    "or",
    "his",    "from",   "at",     "which",   "but",    "have",   "an",     "had",    "they",   "you",
    "were",   "their",  "one",    "all",     "we",     "can",    "her",    "has",    "there",  "been",
    "if",     "more",   "when",   "will",    "would",  "who",    "so",     "no",     "time",   "people",
    "water",  "river",  "city",   "house",   "music",  "light",  "paper",  "garden", "market", "window",
    "system", "number", "world",  "school",  "family", "story",  "answer", "simple", "across", "during",
    "before", "after",  "under",  "around",  "between","without","always", "never",  "often",  "later",
    "small",  "large",  "early",  "young",   "strong", "quiet",  "bright", "green",  "cold",   "warm",
    "build",  "write",  "carry",  "follow",  "remember","explain","open",  "change", "begin",  "travel",
    "mountain","forest","ocean",  "winter",  "summer", "morning","evening","letter", "engine", "bridge",
    "teacher","doctor", "friend", "student", "animal", "table",  "chair",  "street", "road",   "station"};
constexpr size_t kNumWords = sizeof(kWords) / sizeof(kWords[0]);

int uniform_int(std::mt19937_64& rng, int lo, int hi) {
  if (hi < lo) hi = lo;
  return std::uniform_int_distribution<int>(lo, hi)(rng);
}
}  // namespace

const char* class_name(PromptClass c) {
  switch (c) {
    case PromptClass::kShort: return "short";
    case PromptClass::kMedium: return "medium";
    case PromptClass::kLong: return "long";
  }
  return "?";
}

MixSampler::MixSampler(MixConfig cfg, uint64_t seed) : cfg_(cfg), rng_(seed) {}

std::string MixSampler::words(std::mt19937_64& rng, int n) {
  std::string s;
  s.reserve(static_cast<size_t>(n) * 7);
  for (int i = 0; i < n; ++i) {
    if (i) s += ' ';
    s += kWords[rng() % kNumWords];
  }
  return s;
}

RequestSpec MixSampler::next() {
  RequestSpec r;
  const double total = std::max(1e-12, cfg_.short_frac + cfg_.medium_frac + cfg_.long_frac);
  const double u = std::uniform_real_distribution<double>(0.0, total)(rng_);
  r.klass = u < cfg_.short_frac                    ? PromptClass::kShort
            : u < cfg_.short_frac + cfg_.medium_frac ? PromptClass::kMedium
                                                     : PromptClass::kLong;
  r.max_tokens = uniform_int(rng_, std::max(1, cfg_.out_min), std::max(1, cfg_.out_max));
  // The prompt estimate is approximate, so keep 5% of the room free: a prompt over the context
  // is the server's 400, not a measurement.
  const int room = std::max(8, (cfg_.max_context - r.max_tokens) * 19 / 20);
  int lo = 8, hi = cfg_.short_max;
  if (r.klass == PromptClass::kMedium) lo = cfg_.short_max + 1, hi = cfg_.medium_max;
  if (r.klass == PromptClass::kLong) lo = cfg_.medium_max + 1, hi = room;
  hi = std::min(hi, room);
  lo = std::min(lo, hi);
  r.prompt_tokens = uniform_int(rng_, lo, hi);
  const int n_words = std::max(1, static_cast<int>(std::lround(r.prompt_tokens / std::max(0.1, cfg_.tokens_per_word))));
  r.prompt = words(rng_, n_words);
  return r;
}

// ---- summaries ---------------------------------------------------------------------------------
double RequestResult::tpot_s() const {
  return output_tokens > 1 ? (e2e_s - ttft_s) / static_cast<double>(output_tokens - 1) : 0.0;
}

namespace {
LevelReport::Pct pct(const std::vector<double>& v) {
  LevelReport::Pct p;
  p.p50 = percentile(v, 50);
  p.p90 = percentile(v, 90);
  p.p99 = percentile(v, 99);
  double s = 0;
  for (double x : v) s += x;
  p.mean = v.empty() ? 0.0 : s / static_cast<double>(v.size());
  return p;
}
nlohmann::json pct_json(const LevelReport::Pct& p) {
  return {{"p50", p.p50}, {"p90", p.p90}, {"p99", p.p99}, {"mean", p.mean}};
}
}  // namespace

LevelReport summarize(const LevelConfig& level, std::vector<RequestResult> results, double wall_s) {
  LevelReport r;
  r.level = level;
  r.wall_s = wall_s;
  std::vector<double> ttft, tpot, e2e;
  for (const auto& q : results) {
    if (!q.ok) {
      ++r.errors;
      ++r.error_kinds[q.error.empty() ? "error" : q.error];
      continue;
    }
    ++r.ok;
    r.output_tokens += q.output_tokens;
    r.prompt_tokens += q.prompt_tokens;
    ttft.push_back(q.ttft_s);
    e2e.push_back(q.e2e_s);
    if (q.output_tokens > 1) tpot.push_back(q.tpot_s());
  }
  if (wall_s > 0) {
    r.req_per_s = r.ok / wall_s;
    r.out_tok_per_s = static_cast<double>(r.output_tokens) / wall_s;
    r.in_tok_per_s = static_cast<double>(r.prompt_tokens) / wall_s;
  }
  r.ttft = pct(ttft);
  r.tpot = pct(tpot);
  r.e2e = pct(e2e);
  r.requests = std::move(results);
  return r;
}

nlohmann::json to_json(const LevelReport& r, bool with_requests) {
  nlohmann::json j = {{"concurrency", r.level.concurrency},
                      {"rate", r.level.rate},
                      {"num_requests", r.level.num_requests},
                      {"duration_s", r.level.duration_s},
                      {"wall_s", r.wall_s},
                      {"ok", r.ok},
                      {"errors", r.errors},
                      {"error_kinds", r.error_kinds},
                      {"req_per_s", r.req_per_s},
                      {"output_tok_per_s", r.out_tok_per_s},
                      {"prompt_tok_per_s", r.in_tok_per_s},
                      {"output_tokens", r.output_tokens},
                      {"prompt_tokens", r.prompt_tokens},
                      {"ttft_s", pct_json(r.ttft)},
                      {"tpot_s", pct_json(r.tpot)},
                      {"e2e_s", pct_json(r.e2e)}};
  if (with_requests) {
    nlohmann::json a = nlohmann::json::array();
    for (const auto& q : r.requests)
      a.push_back({{"ok", q.ok}, {"status", q.http_status}, {"error", q.error}, {"start_s", q.start_s},
                   {"ttft_s", q.ttft_s}, {"e2e_s", q.e2e_s}, {"tpot_s", q.tpot_s()},
                   {"output_tokens", q.output_tokens}, {"prompt_tokens", q.prompt_tokens},
                   {"usage_reported", q.usage_reported}});
    j["requests"] = std::move(a);
  }
  return j;
}

std::string table_header() {
  char b[512];
  std::snprintf(b, sizeof b, "%-8s %5s %4s %7s %9s | %-23s | %-23s | %-20s\n", "load", "ok", "err", "req/s",
                "out tok/s", "TTFT ms p50/p90/p99", "TPOT ms p50/p90/p99", "e2e s p50/p90/p99");
  return b;
}

std::string table_row(const LevelReport& r) {
  char load[32], b[512];
  if (r.level.rate > 0)
    std::snprintf(load, sizeof load, "r=%.3g", r.level.rate);
  else
    std::snprintf(load, sizeof load, "c=%d", r.level.concurrency);
  std::snprintf(b, sizeof b, "%-8s %5d %4d %7.2f %9.1f | %7.1f %7.1f %7.1f | %7.1f %7.1f %7.1f | %6.2f %6.2f %6.2f\n",
                load, r.ok, r.errors, r.req_per_s, r.out_tok_per_s, r.ttft.p50 * 1e3, r.ttft.p90 * 1e3,
                r.ttft.p99 * 1e3, r.tpot.p50 * 1e3, r.tpot.p90 * 1e3, r.tpot.p99 * 1e3, r.e2e.p50, r.e2e.p90,
                r.e2e.p99);
  return b;
}

}  // namespace ss::bench
