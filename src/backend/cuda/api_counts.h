// SS_CUDA_API_COUNTS=1: every CUDA call the host makes, counted by kind through CUPTI's callback API,
// so "no host launch and no host synchronisation per token" (issue 17) is measured, not assumed.
// libcupti is loaded at run time (dlopen): nothing links against it and a machine without it runs
// as before (a line on stderr says the counts are off). Private to backend/cuda.
#pragma once
#include <cstdint>
#include <string>

namespace ss::cuda {

struct ApiCounts {
  int64_t kernel_launches = 0;  // runtime: <<<>>>, cudaLaunchKernel(Ex)
  int64_t graph_launches = 0;   // runtime: cudaGraphLaunch
  int64_t copies = 0;           // runtime: cudaMemcpy*, cudaMemset*
  int64_t syncs = 0;            // runtime: stream / event / device synchronise
  int64_t queries = 0;          // runtime: cudaStreamQuery, cudaEventQuery (a host round trip, no wait)
  int64_t driver_launches = 0;  // driver: cuLaunchKernel(Ex), cuGraphLaunch (libraries such as cuBLAS too)
};

// Starts counting once per process when SS_CUDA_API_COUNTS=1 (true when counting).
bool start_api_counts();
ApiCounts api_counts();
// "cuda host calls: N kernel launches, ..." for a log line.
std::string format_api_counts(const ApiCounts& c);

}  // namespace ss::cuda
