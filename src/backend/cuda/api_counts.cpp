#include "backend/cuda/api_counts.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>

#if defined(SS_HAVE_CUPTI_H)
#include <cupti.h>
#include <dlfcn.h>
#endif

namespace ss::cuda {
namespace {

std::atomic<int64_t> g_launch{0}, g_graph{0}, g_copy{0}, g_sync{0}, g_query{0}, g_drv{0};

#if defined(SS_HAVE_CUPTI_H)

void CUPTIAPI on_call(void*, CUpti_CallbackDomain domain, CUpti_CallbackId cbid, const void* data) {
  const auto* info = static_cast<const CUpti_CallbackData*>(data);
  if (info->callbackSite != CUPTI_API_ENTER) return;
  if (domain == CUPTI_CB_DOMAIN_DRIVER_API) {
    switch (cbid) {
      case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel:
      case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz:
      case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx:
      case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz:
      case CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch:
      case CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch_ptsz: g_drv.fetch_add(1, std::memory_order_relaxed); break;
      default: break;
    }
    return;
  }
  switch (cbid) {
    case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000:
    case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_ptsz_v7000:
    case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_v11060:
    case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_ptsz_v11060: g_launch.fetch_add(1, std::memory_order_relaxed); break;
    case CUPTI_RUNTIME_TRACE_CBID_cudaGraphLaunch_v10000:
    case CUPTI_RUNTIME_TRACE_CBID_cudaGraphLaunch_ptsz_v10000: g_graph.fetch_add(1, std::memory_order_relaxed); break;
    case CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy_v3020:
    case CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyAsync_v3020:
    case CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyAsync_ptsz_v7000:
    case CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy2DAsync_v3020:
    case CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy2DAsync_ptsz_v7000:
    case CUPTI_RUNTIME_TRACE_CBID_cudaMemsetAsync_v3020:
    case CUPTI_RUNTIME_TRACE_CBID_cudaMemset_v3020: g_copy.fetch_add(1, std::memory_order_relaxed); break;
    case CUPTI_RUNTIME_TRACE_CBID_cudaStreamSynchronize_v3020:
    case CUPTI_RUNTIME_TRACE_CBID_cudaStreamSynchronize_ptsz_v7000:
    case CUPTI_RUNTIME_TRACE_CBID_cudaEventSynchronize_v3020:
    case CUPTI_RUNTIME_TRACE_CBID_cudaDeviceSynchronize_v3020: g_sync.fetch_add(1, std::memory_order_relaxed); break;
    case CUPTI_RUNTIME_TRACE_CBID_cudaStreamQuery_v3020:
    case CUPTI_RUNTIME_TRACE_CBID_cudaStreamQuery_ptsz_v7000:
    case CUPTI_RUNTIME_TRACE_CBID_cudaEventQuery_v3020: g_query.fetch_add(1, std::memory_order_relaxed); break;
    default: break;
  }
}

bool start_once() {
  const char* e = std::getenv("SS_CUDA_API_COUNTS");
  if (!e || std::string(e) != "1") return false;
  void* lib = dlopen("libcupti.so", RTLD_NOW | RTLD_LOCAL);
  if (!lib) lib = dlopen("libcupti.so.13", RTLD_NOW | RTLD_LOCAL);
  if (!lib) lib = dlopen("libcupti.so.12", RTLD_NOW | RTLD_LOCAL);
  using Subscribe = CUptiResult (*)(CUpti_SubscriberHandle*, CUpti_CallbackFunc, void*);
  using EnableDomain = CUptiResult (*)(uint32_t, CUpti_SubscriberHandle, CUpti_CallbackDomain);
  auto* sub = lib ? reinterpret_cast<Subscribe>(dlsym(lib, "cuptiSubscribe")) : nullptr;
  auto* enable = lib ? reinterpret_cast<EnableDomain>(dlsym(lib, "cuptiEnableDomain")) : nullptr;
  CUpti_SubscriberHandle h = nullptr;
  if (!sub || !enable || sub(&h, on_call, nullptr) != CUPTI_SUCCESS ||
      enable(1, h, CUPTI_CB_DOMAIN_RUNTIME_API) != CUPTI_SUCCESS || enable(1, h, CUPTI_CB_DOMAIN_DRIVER_API) != CUPTI_SUCCESS) {
    std::fprintf(stderr, "SS_CUDA_API_COUNTS=1: CUPTI could not be loaded or subscribed (%s); the counts are off\n",
                 lib ? "a CUPTI call failed" : dlerror());
    return false;
  }
  std::fprintf(stderr, "SS_CUDA_API_COUNTS=1: counting the host's CUDA calls (CUPTI callbacks)\n");
  return true;  // the subscription lives as long as the process
}
#else
bool start_once() {
  const char* e = std::getenv("SS_CUDA_API_COUNTS");
  if (e && std::string(e) == "1") std::fprintf(stderr, "SS_CUDA_API_COUNTS=1: built without cupti.h; the counts are off\n");
  return false;
}
#endif

}  // namespace

bool start_api_counts() {
  static const bool on = start_once();
  return on;
}

ApiCounts api_counts() {
  ApiCounts c;
  c.kernel_launches = g_launch.load(), c.graph_launches = g_graph.load(), c.copies = g_copy.load();
  c.syncs = g_sync.load(), c.queries = g_query.load(), c.driver_launches = g_drv.load();
  return c;
}

std::string format_api_counts(const ApiCounts& c) {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "cuda host calls: %lld kernel launches, %lld graph launches, %lld copies/sets, %lld synchronisations, "
                "%lld queries; driver launches %lld",
                static_cast<long long>(c.kernel_launches), static_cast<long long>(c.graph_launches),
                static_cast<long long>(c.copies), static_cast<long long>(c.syncs), static_cast<long long>(c.queries),
                static_cast<long long>(c.driver_launches));
  return buf;
}

}  // namespace ss::cuda
