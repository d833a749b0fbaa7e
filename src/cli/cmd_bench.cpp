// selfserve bench offline: prefill and decode speed of one sequence, per thread count.
// selfserve bench decode: the backend's decode step with 1, 2, ..., N sequences at a given context,
// with its per-stage profile: what aggregate decode throughput batching buys, without HTTP, prompts
// or sampling in the way.
// Prompt tokens are drawn from a fixed seed, as llama-bench does, so runs are comparable.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "cli/bench_serve.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "engine/engine.h"

namespace ss::cli {
namespace {

struct BenchArgs {
  std::string model;
  std::vector<int> threads{1, 2};
  int prompt_tokens = 512;
  int gen_tokens = 128;
  int reps = 3;
  std::string json_path;
  std::string scheduling = "host";
  DeviceArgs device;
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
    const bool persistent = a.scheduling == "persistent";
    if (persistent) bo.kv.num_blocks = 2 * bo.kv.num_blocks + 2;  // the resident loop's share (3/4) holds the sequence
    std::string device;
    auto be = make_backend(model, bo, a.device, &device);
    if (!be.ok()) return fail(be.message());
    if (t == a.threads.front()) std::printf("device: %s\n", device.c_str());
    std::printf("backend: %s\n", (*be)->name().c_str());  // which kernels ran (ISA, packed matrices)
    // Greedy, no stop ids: exactly gen_tokens tokens each run.
    auto request = [&](size_t prompt_len, int max_tokens) {
      engine::Request r;
      r.prompt = prompt;
      r.prompt.resize(prompt_len);  // (an iterator-range assign trips GCC 13's -Warray-bounds)
      r.sampling.temperature = 0.0f;
      r.max_tokens = max_tokens;
      return r;
    };
    // Warm-up: page the weights in and touch every buffer once.
    std::string executor;
    if (auto w = run_one_request(**be, request(16, 2), 512, {}, persistent, &executor); !w.ok()) return fail(w.message());
    if (t == a.threads.front()) std::printf("scheduling: %s\n", executor.c_str());
    std::vector<double> pp, tg;
    for (int r = 0; r < a.reps; ++r) {
      auto st = run_one_request(**be, request(prompt.size(), a.gen_tokens), 512, {}, persistent);
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

struct DecodeArgs {
  std::string model;
  std::vector<int> batch{1, 16};
  int threads = 0;
  int context = 130;
  int steps = 64;
  int reps = 3;
  float temperature = 0.0f;
  float top_p = 1.0f;
  std::string json_path;
  backend::KvCacheConfig::DType kv_dtype = backend::KvCacheConfig::DType::F16;
  DeviceArgs device;
};

void run_decode(const DecodeArgs& a) {
  if (a.batch.empty() || *std::min_element(a.batch.begin(), a.batch.end()) < 1)
    return fail("--batch: sequence counts must be >= 1");
  auto m = open_model(a.model, {}, false);
  if (!m.ok()) return fail(m.message());
  const model::Model& model = **m;
  const int vocab = model.config.vocab_size;
  // The last step's position must be one the model has: a GPU backend sizes its block tables by it.
  if (model.config.max_context > 0 && a.context + a.steps > model.config.max_context)
    return fail("--context " + std::to_string(a.context) + " + --steps " + std::to_string(a.steps) +
                " passes the model's context of " + std::to_string(model.config.max_context) + " tokens");
  const int max_batch = *std::max_element(a.batch.begin(), a.batch.end());
  // Blocks for positions [0, context + steps): one more would pass a GPU backend's table at the model's context.
  const int bs = 16, per_seq = (a.context + a.steps + bs - 1) / bs;
  backend::BackendOptions bo;
  bo.threads = a.threads;
  bo.kv.block_size = bs;
  bo.kv.dtype = a.kv_dtype;
  bo.kv.num_blocks = per_seq * max_batch;
  bo.max_batch_tokens = std::max(max_batch, a.context);
  bo.max_slots = max_batch;
  auto be = make_backend(model, bo, a.device, nullptr);
  if (!be.ok()) return fail(be.message());
  backend::Backend& cpu = **be;
  std::mt19937 rng(1234);
  // Every sequence gets its own blocks and a prompt of `context` random tokens, prefilled once.
  std::vector<std::vector<int32_t>> tables(max_batch);
  for (int s = 0; s < max_batch; ++s)
    for (int b = 0; b < per_seq; ++b) tables[s].push_back(s * per_seq + b);
  // On the CPU, raw logits rows, as the forward pass alone produces them: no sampling in the
  // measurement. On a GPU, greedy rows: the step a server runs, sampled on the device (graph-replayed),
  // instead of copying every row's logits back.
  // With --temperature, every row is sampled (seeded per sequence), on any device: the step a server
  // runs for the API's default requests.
  const bool sampled = a.temperature > 0.0f;
  const bool device_rows = sampled || cpu.name().rfind("cuda", 0) == 0;
  backend::SamplingParams greedy;
  greedy.temperature = 0.0f;
  std::vector<backend::SamplingParams> warm(static_cast<size_t>(max_batch));
  for (int s = 0; s < max_batch; ++s) {
    warm[static_cast<size_t>(s)].temperature = a.temperature;
    warm[static_cast<size_t>(s)].top_p = a.top_p;
    warm[static_cast<size_t>(s)].seed = static_cast<uint64_t>(s) + 1;
  }
  backend::StepOutput out;
  for (int s = 0; s < max_batch; ++s) {
    backend::StepBatch pb;
    for (int i = 0; i < a.context; ++i) {
      pb.tokens.push_back(static_cast<int32_t>(rng() % vocab));
      pb.positions.push_back(i);
      pb.seq_index.push_back(0);
    }
    pb.seq_slot = {s};
    pb.edit_table(s, 0, tables[s]);
    pb.logits_rows = {a.context - 1};
    if (auto st = cpu.step(pb, out); !st.ok()) return fail(st.message());
  }
  char sampled_buf[96] = "";
  if (sampled) std::snprintf(sampled_buf, sizeof sampled_buf, ", rows sampled at temperature %g, top-p %g", a.temperature, a.top_p);
  const std::string sampled_note = sampled_buf;
  std::printf("model: %s, %s, context %d, %s KV cache, %d decode steps per rep (median of %d)%s\n",
              model.path.c_str(), cpu.name().c_str(), a.context, backend::kv_dtype_name(a.kv_dtype), a.steps, a.reps,
              sampled_note.c_str());
  std::printf("%6s %10s %12s %9s | %8s %8s %8s %8s %8s  (ms per step)\n", "batch", "step ms", "tok/s", "x first",
              "matmul", "lm_head", "attn", "rope_kv", "other");
  nlohmann::json results = nlohmann::json::array();
  double base = 0;
  for (int n : a.batch) {
    std::vector<double> step_ms;
    std::vector<backend::StepProfile> profs;
    for (int r = 0; r < a.reps; ++r) {
      // Decode positions context .. context + steps - 1 (rewritten each rep: the cache slots are reused).
      cpu.reset_profile();
      cpu.set_profiling(true);
      const auto t0 = std::chrono::steady_clock::now();
      for (int k = 0; k < a.steps; ++k) {
        backend::StepBatch b;
        for (int s = 0; s < n; ++s) {
          b.tokens.push_back(static_cast<int32_t>(rng() % vocab));
          b.positions.push_back(a.context + k);
          b.seq_index.push_back(s);
          b.seq_slot.push_back(s);
          if (device_rows) {
            backend::SampleRow row;
            row.token = s;
            row.params = sampled ? &warm[static_cast<size_t>(s)] : &greedy;
            row.n = static_cast<uint64_t>(k);
            b.sample_rows.push_back(row);
          } else {
            b.logits_rows.push_back(s);
          }
        }
        if (auto st = cpu.step(b, out); !st.ok()) return fail(st.message());
      }
      const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      cpu.set_profiling(false);
      step_ms.push_back(dt * 1e3 / a.steps);
      profs.push_back(cpu.profile());
    }
    const double ms = median(step_ms), tps = n * 1e3 / ms;
    const backend::StepProfile& prof = profs[std::find(step_ms.begin(), step_ms.end(), ms) - step_ms.begin()];
    if (base == 0) base = tps;  // the first batch size is the baseline
    const double per = 1e3 / std::max<int64_t>(prof.forwards, 1);
    std::printf("%6d %10.3f %12.1f %8.2fx | %8.3f %8.3f %8.3f %8.3f %8.3f\n", n, ms, tps, tps / base, prof.matmul_s * per,
                prof.lm_head_s * per, prof.attention_s * per, prof.rope_kv_s * per, prof.other_s * per);
    std::fflush(stdout);
    results.push_back({{"batch", n}, {"step_ms", ms}, {"tok_s", tps}, {"speedup", tps / base}, {"step_ms_all", step_ms},
                       {"profile_ms", {{"matmul", prof.matmul_s * per}, {"lm_head", prof.lm_head_s * per},
                                       {"attention", prof.attention_s * per}, {"rope_kv", prof.rope_kv_s * per},
                                       {"other", prof.other_s * per}}}});
  }
  if (!a.json_path.empty()) {
    std::ofstream f(a.json_path);
    f << nlohmann::json{{"model", model.path},
                        {"threads", a.threads > 0 ? a.threads : static_cast<int>(std::thread::hardware_concurrency())},
                        {"backend", cpu.name()},
                        {"context", a.context},
                        {"kv_cache_dtype", backend::kv_dtype_name(a.kv_dtype)},
                        {"steps", a.steps},
                        {"results", results}}
             .dump(2)
      << "\n";
    if (!f) return fail(a.json_path + ": cannot write");
  }
}

}  // namespace

void register_bench(CLI::App& app) {
  auto* b = app.add_subcommand("bench", "Benchmarks");
  b->require_subcommand(1);
  auto a = std::make_shared<BenchArgs>();
  auto* o = b->add_subcommand("offline", "Prefill and decode speed of one sequence (--device: cpu or cuda)");
  o->add_option("--model,-m", a->model, "GGUF file or Hugging Face folder (default: the embedded model)");
  o->add_option("--threads", a->threads, "Thread counts to measure")->delimiter(',');
  o->add_option("--prompt-tokens", a->prompt_tokens, "Prompt length")->check(CLI::Range(1, 1 << 16));
  o->add_option("--gen-tokens", a->gen_tokens, "Tokens to decode")->check(CLI::Range(2, 1 << 16));
  o->add_option("--reps", a->reps, "Repetitions (median reported)")->check(CLI::Range(1, 100));
  o->add_option("--json", a->json_path, "Also write results as JSON to this file");
  o->add_option("--scheduling", a->scheduling,
                "host: the host executor plans every step; persistent: the resident loop (on CUDA the GPU "
                "schedules itself: no host launch or sync per token)")
      ->check(CLI::IsMember({"host", "persistent"}))
      ->capture_default_str();
  add_device_options(o, &a->device);
  o->callback([a] { run_offline(*a); });
  auto d = std::make_shared<DecodeArgs>();
  auto* dc = b->add_subcommand("decode", "Batched decode steps on the backend: step time and profile per batch size");
  dc->add_option("--model,-m", d->model, "GGUF file or Hugging Face folder (default: the embedded model)");
  dc->add_option("--batch", d->batch, "Sequences per step to measure (the first one is the baseline)")->delimiter(',');
  dc->add_option("--threads", d->threads, "Backend threads (0: all cores)")->check(CLI::Range(0, 1024));
  dc->add_option("--context", d->context, "Tokens already in each sequence's cache")->check(CLI::Range(1, 1 << 16));
  dc->add_option("--steps", d->steps, "Decode steps per repetition")->check(CLI::Range(1, 1 << 16));
  dc->add_option("--reps", d->reps, "Repetitions (median reported)")->check(CLI::Range(1, 100));
  dc->add_option("--json", d->json_path, "Also write results as JSON to this file");
  dc->add_option("--temperature", d->temperature,
                 "Sample every row at this temperature (0: greedy rows on a GPU, raw logits rows on the CPU)")
      ->check(CLI::Range(0.0f, 100.0f));
  dc->add_option("--top-p", d->top_p, "With --temperature: nucleus sampling")->check(CLI::Range(0.0f, 1.0f));
  add_kv_dtype_option(dc, &d->kv_dtype);
  add_device_options(dc, &d->device);
  dc->callback([d] { run_decode(*d); });
  register_bench_serve(*b);
}

}  // namespace ss::cli
