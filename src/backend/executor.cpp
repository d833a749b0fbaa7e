#include "backend/executor.h"

namespace ss::backend {

const char* to_string(FinishReason r) {
  switch (r) {
    case FinishReason::None: return "none";
    case FinishReason::Length: return "length";
    case FinishReason::Stop: return "stop";
    case FinishReason::Abort: return "abort";
    case FinishReason::Timeout: return "timeout";
    case FinishReason::Error: return "error";
  }
  return "?";
}

}  // namespace ss::backend
