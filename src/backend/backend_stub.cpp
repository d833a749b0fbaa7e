// Placeholder so the tree links while the CPU backend is being written; removed when it lands.
#include "backend/backend.h"
