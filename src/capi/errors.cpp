#include "capi/errors.h"

#include <cctype>
#include <cstring>

namespace ss::capi {
namespace {

struct Slot {
  ss_error pub{SS_OK, "", "", 0};
  std::string message, file;
};
thread_local Slot tl_slot;

bool has(const std::string& s, const char* needle) { return s.find(needle) != std::string::npos; }

// Paths as the build saw them are absolute; from src/ on they name the file in the repository.
std::string short_path(const std::string& f) {
  const size_t at = f.rfind("/src/");
  return at == std::string::npos ? f : f.substr(at + 1);
}

// The last "(some/file.ext:123)" in a message, as the CUDA backend's checks write it.
bool origin_in(const std::string& m, std::string* file, int* line) {
  size_t close = m.rfind(')');
  while (close != std::string::npos) {
    const size_t open = m.rfind('(', close);
    if (open == std::string::npos) return false;
    const std::string inner = m.substr(open + 1, close - open - 1);
    const size_t colon = inner.rfind(':');
    if (colon != std::string::npos && colon + 1 < inner.size() && inner.find('.') < colon) {
      bool digits = true;
      for (size_t i = colon + 1; i < inner.size(); ++i) digits = digits && std::isdigit(static_cast<unsigned char>(inner[i]));
      if (digits && inner.find(' ') == std::string::npos) {
        *file = short_path(inner.substr(0, colon));
        *line = std::atoi(inner.c_str() + colon + 1);
        return true;
      }
    }
    if (open == 0) return false;
    close = m.rfind(')', open - 1);
  }
  return false;
}

}  // namespace

ss_status fail(int32_t code, const std::string& message, const char* file, int line) {
  Slot& s = tl_slot;
  s.message = message;
  s.file = short_path(file ? file : "");
  s.pub.code = code;
  s.pub.message = s.message.c_str();
  s.pub.file = s.file.c_str();
  s.pub.line = line;
  return static_cast<ss_status>(code);
}

int32_t classify(const std::string& m, int32_t fallback) {
  // cudaGetErrorString's wording (and the runtime's enum names, should a message carry them).
  if (has(m, "out of memory") || has(m, "cudaErrorMemoryAllocation")) return SS_ERR_OUT_OF_MEMORY;
  if (has(m, "ECC error") || has(m, "busy or unavailable") || has(m, "fallen off the bus") ||
      has(m, "device has been lost") || has(m, "cudaErrorDevicesUnavailable") || has(m, "cudaErrorECCUncorrectable"))
    return SS_ERR_DEVICE_LOST;
  if (has(m, "launch failure") || has(m, "illegal memory access") || has(m, "illegal instruction") ||
      has(m, "misaligned address") || has(m, "launch timed out") || has(m, "too many resources requested for launch") ||
      has(m, "cudaErrorLaunchFailure") || has(m, "cudaErrorIllegalAddress"))
    return SS_ERR_LAUNCH_FAILURE;
  if (has(m, "no usable CUDA device") || has(m, "built without CUDA") || has(m, "cannot load the CUDA backend"))
    return SS_ERR_UNAVAILABLE;
  // cuBLAS failures read "cuBLAS: <call>: status N (file:line)"; 3 is CUBLAS_STATUS_ALLOC_FAILED.
  if (m.rfind("cuBLAS: ", 0) == 0) return has(m, ": status 3 (") ? SS_ERR_OUT_OF_MEMORY : SS_ERR_DEVICE;
  if (m.rfind("CUDA: ", 0) == 0) return SS_ERR_DEVICE;
  if (has(m, "No such file") || has(m, "no such file")) return SS_ERR_NOT_FOUND;
  return fallback;
}

ss_status fail_from(const std::string& message, int32_t fallback, const char* file, int line) {
  std::string f;
  int l = 0;
  if (origin_in(message, &f, &l)) {
    fail(classify(message, fallback), message, "", 0);
    tl_slot.file = f;
    tl_slot.pub.file = tl_slot.file.c_str();
    tl_slot.pub.line = l;
    return static_cast<ss_status>(tl_slot.pub.code);
  }
  return fail(classify(message, fallback), message, file, line);
}

ss_status last_status() { return static_cast<ss_status>(tl_slot.pub.code); }
const ss_error* last_error() { return &tl_slot.pub; }

}  // namespace ss::capi
