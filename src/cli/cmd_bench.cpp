// selfserve bench offline: prefill and decode speed of one sequence, per thread count.
// Prompt tokens are drawn from a fixed seed, as llama-bench does, so runs are comparable.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "cli/bench_serve.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "engine/generator.h"

namespace ss::cli {
namespace {

struct BenchArgs {
  std::string model;
  std::vector<int> threads{1, 2};
  int prompt_tokens = 512;
  int gen_tokens = 128;
  int reps = 3;
  std::string json_path;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

void run_offline(const BenchArgs& a) {
  auto m = open_model(a.model, {}, false);
  if (!m.ok()) return fail(m.message());
  const model::Model& model = **m;
  const int vocab = model.config.vocab_size;

  std::mt19937 rng(1234);
  std::vector<int32_t> prompt(a.prompt_tokens);
  for (auto& t : prompt) t = static_cast<int32_t>(rng() % vocab);

  nlohmann::json results = nlohmann::json::array();
  std::printf("model: %s\n", model.path.c_str());
  std::printf("%8s %14s %14s %14s %14s\n", "threads", "prefill tok/s", "(pp tokens)", "decode tok/s", "(tg tokens)");
  for (int t : a.threads) {
    backend::BackendOptions bo;
    bo.threads = t;
    bo.kv.block_size = 16;
    bo.kv.num_blocks = (a.prompt_tokens + a.gen_tokens + 16) / 16 + 1;
    auto be = backend::make_cpu_backend(model, bo);
    if (!be.ok()) return fail(be.message());
    engine::SamplingParams sp;
    sp.temperature = 0.0f;
    engine::GenerateOptions go;
    go.stop_at_eog = false;
    // Warm-up: page the weights in and touch every buffer once.
    go.max_tokens = 2;
    if (auto w = engine::generate(**be, vocab, std::vector<int32_t>(prompt.begin(), prompt.begin() + 16), sp, go,
                                  [](int32_t) { return true; });
        !w.ok())
      return fail(w.message());
    go.max_tokens = a.gen_tokens;
    std::vector<double> pp, tg;
    for (int r = 0; r < a.reps; ++r) {
      auto st = engine::generate(**be, vocab, prompt, sp, go, [](int32_t) { return true; });
      if (!st.ok()) return fail(st.message());
      pp.push_back(st->prompt_tokens / st->prefill_seconds);
      if (st->generated_tokens > 1) tg.push_back((st->generated_tokens - 1) / st->decode_seconds);
    }
    const double ppm = median(pp), tgm = median(tg);
    std::printf("%8d %14.1f %14d %14.1f %14d\n", t, ppm, a.prompt_tokens, tgm, a.gen_tokens);
    std::fflush(stdout);
    results.push_back({{"threads", t}, {"prefill_tok_s", ppm}, {"prompt_tokens", a.prompt_tokens},
                       {"decode_tok_s", tgm}, {"gen_tokens", a.gen_tokens}, {"reps", a.reps},
                       {"prefill_all", pp}, {"decode_all", tg}});
  }
  std::printf("peak RSS: %.1f MiB\n", peak_rss_bytes() / 1048576.0);
  if (!a.json_path.empty()) {
    std::ofstream f(a.json_path);
    f << nlohmann::json{{"model", model.path}, {"results", results}}.dump(2) << "\n";
    if (!f) return fail(a.json_path + ": cannot write");
  }
}

}  // namespace

void register_bench(CLI::App& app) {
  auto* b = app.add_subcommand("bench", "Benchmarks");
  b->require_subcommand(1);
  auto a = std::make_shared<BenchArgs>();
  auto* o = b->add_subcommand("offline", "Prefill and decode speed of one sequence on the CPU backend");
  o->add_option("--model,-m", a->model, "GGUF file or Hugging Face folder (default: the embedded model)");
  o->add_option("--threads", a->threads, "Thread counts to measure")->delimiter(',');
  o->add_option("--prompt-tokens", a->prompt_tokens, "Prompt length")->check(CLI::Range(1, 1 << 16));
  o->add_option("--gen-tokens", a->gen_tokens, "Tokens to decode")->check(CLI::Range(2, 1 << 16));
  o->add_option("--reps", a->reps, "Repetitions (median reported)")->check(CLI::Range(1, 100));
  o->add_option("--json", a->json_path, "Also write results as JSON to this file");
  o->callback([a] { run_offline(*a); });
  register_bench_serve(*b);
}

}  // namespace ss::cli
