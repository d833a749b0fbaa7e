// The C++ engine driven directly (no C ABI): N greedy requests of the same prompt at once, stepped
// on this thread until all finish. The baseline for the Go SDK's decode throughput
// (go/tools/benchdecode measures the same thing through cgo; tools/bench_go.sh interleaves both;
// docs/perf/go.md has the numbers). Engine settings match ss_engine_options_init's defaults.
//   bench_engine_decode MODEL N MAX_TOKENS THREADS [cpu|cuda]
// prints one JSON line: {"impl":"cpp","n":N,"tokens":T,"decode_tok_s":X,...}
// decode_tok_s: tokens after every request's first, over the time from the last first token to
// the last token (the same definition as the Go side).
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "engine/engine.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

using namespace ss;

int main(int argc, char** argv) {
  if (argc != 5 && argc != 6) {
    std::fprintf(stderr, "usage: bench_engine_decode MODEL N MAX_TOKENS THREADS [cpu|cuda]\n");
    return 2;
  }
  const std::string path = argv[1];
  const int n = std::atoi(argv[2]), max_tokens = std::atoi(argv[3]), threads = std::atoi(argv[4]);
  auto m = model::load_model(path);
  if (!m.ok()) {
    std::fprintf(stderr, "%s\n", m.message().c_str());
    return 1;
  }
  const model::ModelConfig& mc = (*m)->config;
  backend::BackendOptions bo;
  bo.threads = threads;
  bo.kv.block_size = 16;
  bo.max_batch_tokens = 512;
  bo.max_slots = 32;
  bo.kv.num_blocks = static_cast<int>(512.0 * 1048576.0 /
                                      backend::cpu_kv_block_bytes(bo.kv, mc.n_layers, mc.n_kv_heads, mc.head_dim));
  const bool cuda = argc == 6 && std::string(argv[5]) == "cuda";
  if (cuda) bo.kv.num_blocks = 0;  // sized from the GPU's memory, as ss_engine_create does
  auto be = cuda ? backend::make_cuda_backend(**m, bo) : backend::make_cpu_backend(**m, bo);
  if (!be.ok()) {
    std::fprintf(stderr, "%s\n", be.message().c_str());
    return 1;
  }
  engine::EngineConfig ec;
  ec.scheduler.max_num_seqs = 32;
  ec.scheduler.max_num_batched_tokens = 512;
  ec.scheduler.max_model_len = std::min(mc.max_context > 0 ? mc.max_context : 4096,
                                        (*be)->kv_config().num_blocks * (*be)->kv_config().block_size);
  auto en = engine::Engine::create(**be, ec);
  if (!en.ok()) {
    std::fprintf(stderr, "%s\n", en.message().c_str());
    return 1;
  }
  engine::Engine& eng = **en;
  const tok::Tokenizer& tk = *(*m)->tokenizer;
  const std::vector<int32_t> prompt = tk.encode("The history of the printing press", tk.add_bos(), true);

  using clock = std::chrono::steady_clock;
  int64_t tokens = 0;
  int firsts = 0;
  clock::time_point all_first{}, last{};
  std::vector<int> got(n, 0);
  for (int i = 0; i < n; ++i) {
    engine::Request r;
    r.prompt = prompt;
    r.sampling.temperature = 0;
    r.max_tokens = max_tokens;
    r.on_event = [&, i](const engine::TokenEvent& e) {
      if (e.token < 0) return;
      last = clock::now();
      ++tokens;
      if (got[i]++ == 0 && ++firsts == n) all_first = last;
    };
    if (auto id = eng.add_request(std::move(r)); !id.ok()) {
      std::fprintf(stderr, "%s\n", id.message().c_str());
      return 1;
    }
  }
  while (eng.has_work())
    if (auto st = eng.step(); !st.ok()) {
      std::fprintf(stderr, "%s\n", st.message().c_str());
      return 1;
    }
  const double secs = std::chrono::duration<double>(last - all_first).count();
  const engine::EngineStats st = eng.stats();
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  std::printf("{\"impl\":\"cpp\",\"n\":%d,\"tokens\":%lld,\"decode_tok_s\":%.2f,\"decode_step_ms\":%.3f,"
              "\"ctx_switches\":%ld}\n",
              n, static_cast<long long>(tokens), secs > 0 ? (tokens - n) / secs : 0.0,
              st.decode_steps > 0 ? 1e3 * st.decode_step_seconds / st.decode_steps : 0.0, ru.ru_nvcsw + ru.ru_nivcsw);
  return 0;
}
