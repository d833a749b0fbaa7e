// Runs tools/plot_bench.py (matplotlib) on a JSON report: no shell, arguments passed as they are.
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include "bench/bench.h"

extern char** environ;

namespace ss::bench {
namespace {
std::string find_script() {
  namespace fs = std::filesystem;
  std::vector<fs::path> candidates;
  if (const char* env = std::getenv("SELFSERVE_PLOT_BENCH")) candidates.emplace_back(env);
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    candidates.push_back(exe.parent_path() / "../tools/plot_bench.py");
    candidates.push_back(exe.parent_path() / "../share/selfserve/plot_bench.py");
  }
  candidates.emplace_back("tools/plot_bench.py");
#ifdef SS_SOURCE_DIR
  candidates.push_back(fs::path(SS_SOURCE_DIR) / "tools/plot_bench.py");
#endif
  for (const auto& p : candidates)
    if (fs::is_regular_file(p, ec)) return p.lexically_normal().string();
  return {};
}
}  // namespace

Status plot_report(const std::string& json_path, const std::string& png_path) {
  const std::string script = find_script();
  if (script.empty()) return make_error("tools/plot_bench.py not found (set SELFSERVE_PLOT_BENCH)");
  std::vector<std::string> args = {"python3", script, json_path, "-o", png_path};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  if (int rc = posix_spawnp(&pid, "python3", nullptr, nullptr, argv.data(), environ); rc != 0)
    return make_error(std::string("cannot run python3: ") + std::strerror(rc));
  int status = 0;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) return make_error("waitpid failed");
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return make_error(script + " failed (is matplotlib installed? pip install matplotlib)");
  return {};
}

}  // namespace ss::bench
