// CUDA's error messages become stable ss_status codes, with the origin the message carries. With
// the CUDA toolkit at hand the messages are the runtime's own (cudaGetErrorString), written as the
// CUDA backend writes them; without it, the same strings as the runtime documents them.
#include <gtest/gtest.h>

#include <string>
#include <thread>

#include "capi/errors.h"

#ifdef SS_TEST_WITH_CUDART
#include <cuda_runtime_api.h>
#endif

namespace {

// As src/backend/cuda/cuda_backend.cpp's cuda_status writes a failure.
std::string cuda_message(const char* what, const char* error_string) {
  return std::string("CUDA: ") + what + ": " + error_string + " (/build/src/backend/cuda/cuda_backend.cpp:58)";
}

struct Case {
  int cuda_error;           // the cudaError_t value
  const char* documented;   // cudaGetErrorString's text for it
  int32_t code;
};

const Case kCases[] = {
    {2, "out of memory", SS_ERR_OUT_OF_MEMORY},                                        // cudaErrorMemoryAllocation
    {719, "unspecified launch failure", SS_ERR_LAUNCH_FAILURE},                        // cudaErrorLaunchFailure
    {700, "an illegal memory access was encountered", SS_ERR_LAUNCH_FAILURE},          // cudaErrorIllegalAddress
    {702, "the launch timed out and was terminated", SS_ERR_LAUNCH_FAILURE},           // cudaErrorLaunchTimeout
    {214, "uncorrectable ECC error encountered", SS_ERR_DEVICE_LOST},                  // cudaErrorECCUncorrectable
    {46, "CUDA-capable device(s) is/are busy or unavailable", SS_ERR_DEVICE_LOST},     // cudaErrorDevicesUnavailable
    {1, "invalid argument", SS_ERR_DEVICE},                                            // cudaErrorInvalidValue
};

TEST(CapiErrors, CudaErrorsBecomeStableCodesWithTheirOrigin) {
  for (const Case& c : kCases) {
    std::string text = c.documented;
#ifdef SS_TEST_WITH_CUDART
    text = cudaGetErrorString(static_cast<cudaError_t>(c.cuda_error));
#endif
    const std::string m = cuda_message("cudaMalloc(&base_, bytes)", text.c_str());
    EXPECT_EQ(ss::capi::classify(m, SS_ERR_INTERNAL), c.code) << m;
    EXPECT_EQ(ss::capi::fail_from(m, SS_ERR_INTERNAL, "src/capi/capi.cpp", 1), c.code);
    const ss_error* e = ss::capi::last_error();
    EXPECT_STREQ(e->message, m.c_str());
    EXPECT_STREQ(e->file, "src/backend/cuda/cuda_backend.cpp");  // from the message, not the caller
    EXPECT_EQ(e->line, 58);
  }
}

TEST(CapiErrors, CublasStatusAndPlainMessages) {
  EXPECT_EQ(ss::capi::classify("cuBLAS: cublasLtMatmul(...): status 3 (a.cpp:1)", SS_ERR_INTERNAL), SS_ERR_OUT_OF_MEMORY);
  EXPECT_EQ(ss::capi::classify("cuBLAS: cublasLtMatmul(...): status 13 (a.cpp:1)", SS_ERR_INTERNAL), SS_ERR_DEVICE);
  EXPECT_EQ(ss::capi::classify("no usable CUDA device (no NVIDIA driver, or it reports no GPU)", SS_ERR_INTERNAL),
            SS_ERR_UNAVAILABLE);
  // A message without an origin keeps the caller's, and a C++ layer's message its fallback code.
  const std::string m = "model.gguf: tensor blk.3.ffn_up: data ends at 91234816, file is 90000000 bytes";
  EXPECT_EQ(ss::capi::fail_from(m, SS_ERR_INVALID_MODEL, "/x/src/capi/capi.cpp", 42), SS_ERR_INVALID_MODEL);
  EXPECT_STREQ(ss::capi::last_error()->file, "src/capi/capi.cpp");
  EXPECT_EQ(ss::capi::last_error()->line, 42);
  // "(text)" that is not file:line is not an origin.
  EXPECT_EQ(ss::capi::fail_from("bad value (must be positive)", SS_ERR_INVALID_ARGUMENT, "src/capi/capi.cpp", 7),
            SS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(ss::capi::last_error()->line, 7);
}

TEST(CapiErrors, TheErrorIsPerThread) {
  ss::capi::fail(SS_ERR_NOT_FOUND, "here", "src/capi/capi.cpp", 1);
  std::thread([] {
    EXPECT_EQ(ss::capi::last_error()->code, SS_OK);
    EXPECT_STREQ(ss::capi::last_error()->message, "");
    ss::capi::fail(SS_ERR_INTERNAL, "there", "src/capi/capi.cpp", 2);
  }).join();
  EXPECT_EQ(ss::capi::last_error()->code, SS_ERR_NOT_FOUND);
  EXPECT_STREQ(ss::capi::last_error()->message, "here");
}

}  // namespace
