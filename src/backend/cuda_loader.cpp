// Finds the CUDA backend at run time: a GPU is only looked for where an NVIDIA driver is installed
// (libcuda.so.1 loads and reports a device), and only then is the plugin libselfserve_cuda.so (with
// cuBLAS behind it) loaded — from beside the executable, or SELFSERVE_CUDA_PLUGIN. CPU-only runs
// never map the CUDA libraries.
#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <string>

#include "backend/backend.h"

namespace ss::backend {

namespace {

using SummaryFn = void (*)(std::string*);
using MakeFn = Backend* (*)(const model::Model*, const BackendOptions*, std::string*);

struct Plugin {
  SummaryFn summary = nullptr;
  MakeFn make = nullptr;
  std::string error;  // why it is not there
};

// Whether the driver sees a device (through the driver API, loaded on its own: cheap).
bool driver_has_device() {
  static const bool has = [] {
    void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) return false;
    auto init = reinterpret_cast<int (*)(unsigned)>(dlsym(h, "cuInit"));
    auto count = reinterpret_cast<int (*)(int*)>(dlsym(h, "cuDeviceGetCount"));
    int n = 0;
    return init && count && init(0) == 0 && count(&n) == 0 && n > 0;
  }();
  return has;
}

const Plugin& plugin() {
  static const Plugin p = [] {
    Plugin r;
#ifndef SELFSERVE_HAVE_CUDA
    r.error = "this selfserve was built without CUDA (no nvcc at configure time)";
    return r;
#else
    std::string path;
    if (const char* env = std::getenv("SELFSERVE_CUDA_PLUGIN"); env && *env) {
      path = env;
    } else {
      std::error_code ec;
      const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
      path = (ec ? std::filesystem::path(".") : exe.parent_path()) / "libselfserve_cuda.so";
    }
    void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      const char* why = dlerror();
      r.error = "cannot load the CUDA backend " + path + ": " + (why ? why : "unknown error");
      return r;
    }
    r.summary = reinterpret_cast<SummaryFn>(dlsym(h, "ss_cuda_device_summary"));
    r.make = reinterpret_cast<MakeFn>(dlsym(h, "ss_cuda_make_backend"));
    if (!r.summary || !r.make) r.error = path + " is not a selfserve CUDA backend (entry points missing)";
    return r;
#endif
  }();
  return p;
}

}  // namespace

std::string cuda_device_summary() {
  if (!driver_has_device()) return {};
  const Plugin& p = plugin();
  if (!p.summary) return {};
  std::string s;
  p.summary(&s);
  return s;
}

Expected<std::unique_ptr<Backend>> make_cuda_backend(const model::Model& model, const BackendOptions& opts) {
  const Plugin& p = plugin();
  if (!p.make) return make_error(p.error);
  if (!driver_has_device()) return make_error("no usable CUDA device (no NVIDIA driver, or it reports no GPU)");
  std::string error;
  Backend* be = p.make(&model, &opts, &error);
  if (!be) return make_error(error);
  return std::unique_ptr<Backend>(be);
}

}  // namespace ss::backend
