// Placeholder; the sampler lands here.
#include "backend/backend.h"
