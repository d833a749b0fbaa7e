// The C ABI's error side: the thread-local ss_error, and how a C++ error message becomes a stable
// status code (CUDA's messages name the failing call's error and its file:line).
#pragma once
#include <string>

#include "selfserve.h"

namespace ss::capi {

// Records the error for ss_last_error() on this thread and returns its code.
ss_status fail(int32_t code, const std::string& message, const char* file, int line);
// The same for a message from the C++ layers: its code by classify(message, fallback), its origin
// the "(file:line)" a CUDA error carries, else file:line here.
ss_status fail_from(const std::string& message, int32_t fallback, const char* file, int line);
// SS_ERR_OUT_OF_MEMORY, _DEVICE_LOST, _LAUNCH_FAILURE, _DEVICE or _NOT_FOUND when the message says
// so, else fallback.
int32_t classify(const std::string& message, int32_t fallback);
// The code of this thread's last error.
ss_status last_status();
const ss_error* last_error();

}  // namespace ss::capi
