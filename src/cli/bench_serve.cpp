// selfserve bench serve: load-test any OpenAI-compatible server (streaming /v1/completions) over a
// concurrency sweep or Poisson arrival rates; table on stdout, JSON and a PNG plot on request.
#include "cli/bench_serve.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench.h"
#include "cli/commands.h"

namespace ss::cli {
namespace {

struct ServeBenchArgs {
  std::string url = "http://127.0.0.1:8000";
  std::string model, api_key;
  std::vector<int> concurrency{1, 2, 4, 8, 16, 32, 64};
  std::vector<double> rates;
  int num_requests = 100;
  double duration_s = 120;
  uint64_t seed = 0;
  std::vector<double> mix{0.3, 0.5, 0.2};
  int max_context = 0;  // 0: 8192, or the server's max_model_len when smaller
  std::vector<int> output_tokens{16, 256};
  double timeout_s = 300;
  int warmup = 1;
  bool no_ignore_eos = false, no_calibrate = false;
  double tokens_per_word = 0;  // > 0: given, so two servers get the very same text (no /tokenize probe)
  std::string json_path, plot_path;
  std::string extra_body;
  bool multi_turn = false;
  int conversations = 6, history_tokens = 4000, message_tokens = 16;
  double idle_s = 3;
};

// A counter from GET /metrics (0 when absent or unreadable).
double scrape(const bench::ClientConfig& c, const std::string& name) {
  auto r = bench::http_get(c, "/metrics");
  if (!r.ok() || r->status != 200) return 0;
  const std::string& b = r->body;
  for (size_t at = b.find(name + " "); at != std::string::npos; at = b.find(name + " ", at + 1))
    if (at == 0 || b[at - 1] == '\n') return std::strtod(b.c_str() + at + name.size() + 1, nullptr);
  return 0;
}

// --multi-turn: the TTFT of a returning conversation turn, history reused vs recomputed.
void run_multi_turn_bench(const ServeBenchArgs& a, const bench::ClientConfig& c, double tokens_per_word) {
  bench::MultiTurnConfig m;
  m.conversations = a.conversations;
  m.history_tokens = a.history_tokens;
  m.message_tokens = a.message_tokens;
  m.idle_s = a.idle_s;
  m.seed = a.seed;
  m.tokens_per_word = tokens_per_word;
  const char* counters[] = {"selfserve_kv_restored_host_blocks_total", "selfserve_kv_restored_disk_blocks_total",
                            "selfserve_prefix_cache_hits_total"};
  double before[3];
  for (int i = 0; i < 3; ++i) before[i] = scrape(c, counters[i]);
  std::printf("multi-turn: %d conversations, ~%d-token history, ~%d-token new message, %.1f s idle before the "
              "returning turn (sent twice: same cache_salt = reused, fresh salt = recomputed; order alternates)\n",
              m.conversations, m.history_tokens, m.message_tokens, m.idle_s);
  const auto rep = bench::run_multi_turn(c, m, [](const std::string& l) {
    std::printf("  %s\n", l.c_str());
    std::fflush(stdout);
  });
  for (const auto& [e, n] : rep.errors) std::printf("  %d x %s\n", n, e.c_str());
  if (rep.warm_ttft_s.empty()) return fail("no conversation completed");
  const double w50 = bench::percentile(rep.warm_ttft_s, 50), c50 = bench::percentile(rep.cold_ttft_s, 50);
  std::printf("returning-turn TTFT p50: reused %.3f s, recomputed %.3f s, ratio %.1fx (min reused %.3f, max %.3f)\n",
              w50, c50, w50 > 0 ? c50 / w50 : 0.0, *std::min_element(rep.warm_ttft_s.begin(), rep.warm_ttft_s.end()),
              *std::max_element(rep.warm_ttft_s.begin(), rep.warm_ttft_s.end()));
  std::printf("server counters during the run: %.0f blocks restored from host, %.0f from disk, %.0f prefix-hit tokens\n",
              scrape(c, counters[0]) - before[0], scrape(c, counters[1]) - before[1], scrape(c, counters[2]) - before[2]);
  if (!a.json_path.empty()) {
    const nlohmann::json doc = {{"tool", "selfserve bench serve --multi-turn"},
                                {"url", a.url},
                                {"model", c.model},
                                {"history_tokens", m.history_tokens},
                                {"message_tokens", m.message_tokens},
                                {"idle_s", m.idle_s},
                                {"prompt_tokens", rep.prompt_tokens},
                                {"ttft_reused_s", rep.warm_ttft_s},
                                {"ttft_recomputed_s", rep.cold_ttft_s}};
    std::ofstream f(a.json_path);
    f << doc.dump(2) << "\n";
    if (!f) return fail(a.json_path + ": cannot write");
  }
}

void run_serve_bench(const ServeBenchArgs& a) {
  bench::ClientConfig c;
  auto url = bench::parse_url(a.url);
  if (!url.ok()) return fail(url.message());
  c.url = *url;
  c.api_key = a.api_key;
  if (c.api_key.empty())
    if (const char* k = std::getenv("OPENAI_API_KEY")) c.api_key = k;
  c.timeout_s = a.timeout_s;
  c.ignore_eos = !a.no_ignore_eos;
  if (!a.extra_body.empty()) {
    c.extra_body = nlohmann::json::parse(a.extra_body, nullptr, false);
    if (c.extra_body.is_discarded() || !c.extra_body.is_object())
      return fail("--extra-body wants a JSON object, e.g. '{\"response_format\": {\"type\": \"json_object\"}}'");
  }
  c.model = a.model;
  if (c.model.empty()) {
    auto m = bench::default_model(c);
    if (!m.ok()) return fail(m.message());
    c.model = *m;
  }
  if (a.mix.size() != 3 || a.mix[0] < 0 || a.mix[1] < 0 || a.mix[2] < 0 || a.mix[0] + a.mix[1] + a.mix[2] <= 0)
    return fail("--mix wants three non-negative fractions short,medium,long (e.g. 0.3,0.5,0.2)");
  if (a.output_tokens.size() != 2 || a.output_tokens[0] < 1 || a.output_tokens[1] < a.output_tokens[0])
    return fail("--output-tokens wants MIN,MAX with 1 <= MIN <= MAX");

  bench::MixConfig mix;
  mix.short_frac = a.mix[0];
  mix.medium_frac = a.mix[1];
  mix.long_frac = a.mix[2];
  mix.out_min = a.output_tokens[0];
  mix.out_max = a.output_tokens[1];
  mix.max_context = a.max_context > 0 ? a.max_context : 8192;
  std::string tpw_source = "estimate";
  if (a.tokens_per_word > 0) {
    mix.tokens_per_word = a.tokens_per_word;
    tpw_source = "given";
  } else if (!a.no_calibrate) {
    if (auto p = bench::probe_tokenize(c, a.seed)) {
      mix.tokens_per_word = p->tokens_per_word;
      tpw_source = "measured by /tokenize";
      if (a.max_context <= 0 && p->max_model_len > 0 && p->max_model_len < mix.max_context)
        mix.max_context = static_cast<int>(p->max_model_len);
    }
  }
  if (a.multi_turn) return run_multi_turn_bench(a, c, mix.tokens_per_word);
  if (mix.max_context <= mix.out_max + 16)
    return fail("--max-context " + std::to_string(mix.max_context) + " leaves no room for prompts with up to " +
                std::to_string(mix.out_max) + " output tokens");

  std::vector<bench::LevelConfig> levels;
  for (double r : a.rates) levels.push_back({0, r, a.num_requests, a.duration_s, a.seed});
  if (a.rates.empty())
    for (int n : a.concurrency) levels.push_back({n, 0, a.num_requests, a.duration_s, a.seed});

  std::printf("server: %s  model: %s\n", a.url.c_str(), c.model.c_str());
  std::printf("mix: %.0f%% short (<=%d tok), %.0f%% medium (<=%d), %.0f%% long (<=%d ctx); output %d-%d tokens; "
              "%.2f tokens/word (%s); seed %llu\n",
              100 * mix.short_frac / (a.mix[0] + a.mix[1] + a.mix[2]), mix.short_max,
              100 * mix.medium_frac / (a.mix[0] + a.mix[1] + a.mix[2]), mix.medium_max,
              100 * mix.long_frac / (a.mix[0] + a.mix[1] + a.mix[2]), mix.max_context, mix.out_min, mix.out_max,
              mix.tokens_per_word, tpw_source.c_str(), static_cast<unsigned long long>(a.seed));
  std::printf("per level: at most %d requests, none started after %.0f s; timeout %.0f s each\n\n",
              a.num_requests, a.duration_s, a.timeout_s);
  std::fputs(bench::table_header().c_str(), stdout);
  std::fflush(stdout);

  nlohmann::json jlevels = nlohmann::json::array();
  int total_ok = 0;
  if (a.warmup > 0) {  // page weights in, warm caches: short requests, results dropped
    bench::MixConfig wm = mix;
    wm.short_frac = 1, wm.medium_frac = 0, wm.long_frac = 0;
    wm.out_min = wm.out_max = std::min(mix.out_min, 16);
    bench::MixSampler ws(wm, a.seed ^ 0x5741524d55ull);
    const auto w = bench::run_level(c, {1, 0, a.warmup, a.duration_s, 0}, ws);
    if (w.ok == 0 && !w.error_kinds.empty())
      std::printf("warm-up failed: %s\n", w.error_kinds.begin()->first.c_str());
  }
  for (size_t li = 0; li < levels.size(); ++li) {
    const auto& lv = levels[li];
    // Level i draws from seed+i: the same requests on every server and run, but no level reuses an
    // earlier level's prompts (a prefix cache would flatter the later levels).
    bench::MixSampler sampler(mix, a.seed + li);
    const auto rep = bench::run_level(c, lv, sampler);
    total_ok += rep.ok;
    std::fputs(bench::table_row(rep).c_str(), stdout);
    for (const auto& [kind, n] : rep.error_kinds) std::printf("         %d x %s\n", n, kind.c_str());
    std::fflush(stdout);
    jlevels.push_back(bench::to_json(rep, /*with_requests=*/true));
  }

  const nlohmann::json doc = {
      {"tool", "selfserve bench serve"},
      {"url", a.url},
      {"model", c.model},
      {"mode", a.rates.empty() ? "concurrency" : "rate"},
      {"seed", a.seed},
      {"mix",
       {{"short", mix.short_frac}, {"medium", mix.medium_frac}, {"long", mix.long_frac},
        {"max_context", mix.max_context}, {"output_tokens", {mix.out_min, mix.out_max}},
        {"tokens_per_word", mix.tokens_per_word}, {"tokens_per_word_source", tpw_source}}},
      {"ignore_eos", c.ignore_eos},
      {"extra_body", c.extra_body},
      {"levels", jlevels}};
  std::string json_path = a.json_path;
  if (json_path.empty() && !a.plot_path.empty())
    json_path = (std::filesystem::temp_directory_path() / ("selfserve-bench-" + std::to_string(getpid()) + ".json"))
                    .string();
  if (!json_path.empty()) {
    std::ofstream f(json_path);
    f << doc.dump(2) << "\n";
    if (!f) return fail(json_path + ": cannot write");
  }
  if (!a.plot_path.empty()) {
    auto st = bench::plot_report(json_path, a.plot_path);
    if (a.json_path.empty()) std::filesystem::remove(json_path);
    if (!st.ok()) return fail(st.message());
    std::printf("plot: %s\n", a.plot_path.c_str());
  }
  if (total_ok == 0) return fail("no request succeeded (see the error counts above)");
}

}  // namespace

void register_bench_serve(CLI::App& bench) {
  auto a = std::make_shared<ServeBenchArgs>();
  auto* s = bench.add_subcommand("serve", "Load-test an OpenAI-compatible server: throughput, TTFT, TPOT under load");
  s->add_option("--url", a->url, "Server base URL (http only)")->capture_default_str();
  s->add_option("--model", a->model, "Model name sent in requests (default: first of GET /v1/models)");
  s->add_option("--api-key", a->api_key, "Bearer token (default: $OPENAI_API_KEY)");
  auto* conc = s->add_option("--concurrency", a->concurrency, "Concurrent clients per level (closed loop sweep)")
                   ->delimiter(',')
                   ->check(CLI::Range(1, 4096))
                   ->capture_default_str();
  auto* rate = s->add_option("--rate", a->rates, "Poisson arrival rates in req/s (open loop sweep)")
                   ->delimiter(',')
                   ->check(CLI::PositiveNumber);
  conc->excludes(rate);
  s->add_option("--num-requests", a->num_requests, "At most this many requests per level")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  s->add_option("--duration", a->duration_s, "Start no request after this many seconds per level")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  s->add_option("--seed", a->seed, "Seed of prompts, lengths and arrivals")->capture_default_str();
  s->add_option("--mix", a->mix, "Fractions of short (<=128), medium (<=2048), long prompts")
      ->delimiter(',')
      ->expected(3)
      ->capture_default_str();
  s->add_option("--max-context", a->max_context,
                "Prompt + output limit (default 8192, or the server's max_model_len when smaller)")
      ->check(CLI::Range(64, 1 << 24));
  s->add_option("--output-tokens", a->output_tokens, "MIN,MAX output tokens (uniform)")
      ->delimiter(',')
      ->expected(2)
      ->capture_default_str();
  s->add_option("--timeout", a->timeout_s, "Seconds per request, connect to last byte")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  s->add_option("--warmup", a->warmup, "Short requests sent (and not counted) before the first level")
      ->check(CLI::Range(0, 1000))
      ->capture_default_str();
  s->add_flag("--no-ignore-eos", a->no_ignore_eos, "Do not send ignore_eos (outputs may end early)");
  s->add_flag("--no-calibrate", a->no_calibrate, "Do not measure tokens per word with POST /tokenize");
  s->add_option("--tokens-per-word", a->tokens_per_word,
                "Size prompts with this many tokens a word instead of measuring it (the JSON report's "
                "tokens_per_word of an earlier run sends the same text to another server)")
      ->check(CLI::Range(0.05, 100.0));
  s->add_option("--extra-body", a->extra_body,
                "JSON object merged into every request body (e.g. a response_format, sampling fields)");
  s->add_option("--json", a->json_path, "Write the report (with every request) as JSON");
  s->add_option("--plot", a->plot_path, "Write a PNG of latency and throughput against load (matplotlib)");
  s->add_flag("--multi-turn", a->multi_turn,
              "Conversations returning after an idle gap: TTFT of the returning turn, history reused vs recomputed");
  s->add_option("--conversations", a->conversations, "--multi-turn: conversations")
      ->check(CLI::Range(1, 10000))->capture_default_str();
  s->add_option("--history-tokens", a->history_tokens, "--multi-turn: history length (estimated tokens)")
      ->check(CLI::Range(16, 1 << 20))->capture_default_str();
  s->add_option("--message-tokens", a->message_tokens, "--multi-turn: the returning turn's new message")
      ->check(CLI::Range(1, 1 << 16))->capture_default_str();
  s->add_option("--idle", a->idle_s, "--multi-turn: seconds before the returning turn (more than the server's TTL)")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  s->callback([a] { run_serve_bench(*a); });
}

}  // namespace ss::cli
