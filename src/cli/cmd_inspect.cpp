// selfserve inspect PATH: what a model file holds and whether it is valid; selfserve fetch.
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/default_model.h"

namespace ss::cli {
namespace {

struct InspectArgs {
  std::string path;
  bool check_values = false;
  std::string sha256;
};

void run_inspect(const InspectArgs& a) {
  std::string path = a.path;
  if (path.empty()) {
    auto p = ensure_default_model(false);
    if (!p.ok()) return fail(p.message());
    path = *p;
  }
  model::LoadOptions lo;
  lo.check_values = a.check_values;
  if (!a.sha256.empty()) lo.verify_sha256 = a.sha256;
  bool ok = false;
  const std::string report = model::inspect_report(path, lo, &ok);
  std::fwrite(report.data(), 1, report.size(), stdout);
  if (!ok) set_exit_code(1);
}

}  // namespace

void register_inspect(CLI::App& app) {
  auto a = std::make_shared<InspectArgs>();
  auto* c = app.add_subcommand("inspect", "Architecture, hyper-parameters, tokenizer, tensors and validation verdict");
  c->add_option("path", a->path, "GGUF file or Hugging Face folder (default: the embedded model)");
  c->add_flag("--check-values", a->check_values, "Scan every weight for NaN/Inf");
  c->add_option("--verify-sha256", a->sha256, "Expected sha256 of the file (hex)");
  c->callback([a] { run_inspect(*a); });

}

void register_fetch(CLI::App& app) {
  auto* f = app.add_subcommand("fetch", "Fetch the embedded default model into the cache and print its path");
  f->callback([] {
    auto p = ensure_default_model(false);
    if (!p.ok()) return fail(p.message());
    std::printf("%s\n", p->c_str());
  });
}

}  // namespace ss::cli
