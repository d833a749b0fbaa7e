// selfserve synth: writes a random-weights model of a named real shape, the same bytes on every
// machine for the same arguments (weights are generated where they are needed, never copied).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "cli/common.h"
#include "model/synth.h"

namespace ss::cli {
namespace {

struct SynthArgs {
  std::string shape, format = "gguf", dtype = "f16", out;
  uint64_t seed = 0;
  int layers = 0, vocab = 0, threads = 0;
  bool quiet = false;
};

void run_synth(const SynthArgs& a) {
  model::SynthOptions o;
  o.shape = a.shape;
  o.layers = a.layers;
  o.vocab = a.vocab;
  o.seed = a.seed;
  o.out = a.out;
  o.threads = a.threads;
  if (a.format == "gguf") o.format = model::SynthFormat::Gguf;
  else if (a.format == "safetensors") o.format = model::SynthFormat::Safetensors;
  else return fail("--format must be gguf or safetensors, not '" + a.format + "'");
  auto dt = model::synth_dtype(a.dtype);
  if (!dt.ok()) return fail(dt.message());
  o.dtype = *dt;
  Progress progress(!a.quiet && isatty(STDERR_FILENO));
  o.progress = [&](uint64_t done, uint64_t total) { progress("writing", done, total); };
  const auto t0 = std::chrono::steady_clock::now();
  auto r = model::write_synth_model(o);
  progress.finish();
  if (!r.ok()) return fail(r.message());
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (const auto& n : r->notes) std::fprintf(stderr, "note: %s\n", n.c_str());
  std::printf("wrote %s (%llu bytes, %.1f s)\n", r->files.back().c_str(), static_cast<unsigned long long>(r->bytes), s);
}

}  // namespace

void register_synth(CLI::App& app) {
  auto a = std::make_shared<SynthArgs>();
  std::string shapes;
  for (const auto& n : model::synth_shape_names()) shapes += (shapes.empty() ? "" : "|") + n;
  auto* c = app.add_subcommand("synth", "Write a random-weights model of a real shape (deterministic from --seed)");
  c->add_option("--shape", a->shape, shapes)->required();
  c->add_option("--format", a->format, "gguf (a file) or safetensors (a Hugging Face folder)")->capture_default_str();
  c->add_option("--dtype", a->dtype, "f32|f16|bf16|q8_0|q4_0|q4_1|q5_0|q5_1|q4_k|q6_k (safetensors: float types)")
      ->capture_default_str();
  c->add_option("--seed", a->seed, "Seed of the weights")->capture_default_str();
  c->add_option("--out", a->out, "GGUF file or safetensors folder to write")->required();
  c->add_option("--layers", a->layers, "Number of layers (default: the shape's)");
  c->add_option("--vocab", a->vocab, "Vocabulary size (default: the shape's; smaller for quick tests)");
  c->add_option("--threads", a->threads, "Worker threads (default: all cores)");
  c->add_flag("--quiet", a->quiet, "No progress line");
  c->callback([a] { run_synth(*a); });
}

}  // namespace ss::cli
