#include "cli/common.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>

#include "cli/default_model.h"

namespace ss::cli {

void Progress::operator()(const char* stage, uint64_t done, uint64_t total) {
  if (!enabled_ || total == 0) return;
  const int pct = static_cast<int>(done * 100 / total);
  if (pct == last_pct_ && last_stage_ == stage) return;
  last_pct_ = pct;
  last_stage_ = stage;
  std::fprintf(stderr, "\r%-12s %3d%%", stage, pct);
  std::fflush(stderr);
}

void Progress::finish() {
  if (enabled_ && last_pct_ >= 0) std::fprintf(stderr, "\r%-20s\r", "");
  last_pct_ = -1;
}

Expected<std::unique_ptr<model::Model>> open_model(const std::string& path_or_empty, model::LoadOptions opts,
                                                   bool quiet) {
  std::string path = path_or_empty;
  if (path.empty()) {
    SS_ASSIGN(path, ensure_default_model(quiet));
  }
  Progress progress(!quiet && isatty(STDERR_FILENO));
  if (!opts.progress) opts.progress = [&](const char* s, uint64_t d, uint64_t t) { progress(s, d, t); };
  auto m = model::load_model(path, opts);
  progress.finish();
  return m;
}

uint64_t peak_rss_bytes() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<uint64_t>(ru.ru_maxrss) * 1024;  // Linux reports KiB
}

}  // namespace ss::cli
