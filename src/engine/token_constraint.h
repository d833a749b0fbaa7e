// Structured outputs reach the engine as the backend's token mask (backend/sampling.h).
#pragma once
#include "backend/backend.h"

namespace ss::engine {
using TokenConstraint = backend::TokenMask;
using backend::kConstraintErrorPrefix;
}  // namespace ss::engine
