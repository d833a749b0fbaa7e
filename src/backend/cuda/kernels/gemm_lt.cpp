// Tensor-core GEMM for token batches past the GEMV's range (prefill, large decode batches) through
// cuBLASLt: bf16 operands, fp32 accumulation and output. Row-major y[M][N] = x[M][K] W[N][K]^T is the
// column-major y^T = W^T(op T on W stored K x N) * x^T, so W is operand A transposed and x operand B.
// The algorithm of each (M, N, K) is looked up once and cached (no host work but the launch after).
#include <cublasLt.h>

#include <map>
#include <string>
#include <tuple>

#include "backend/cuda/kernels/kernels.h"

namespace ss::cuda::kern {

struct LtGemm {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  struct Plan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  std::map<std::tuple<int, int, int>, Plan> plans;
};

namespace {
Status lt_status(cublasStatus_t st, const char* what) {
  if (st == CUBLAS_STATUS_SUCCESS) return {};
  return make_error(std::string("cuBLASLt: ") + what + ": status " + std::to_string(static_cast<int>(st)));
}
#define SS_LT_TRY(expr) SS_TRY(lt_status((expr), #expr))

Expected<LtGemm::Plan*> plan_for(LtGemm* g, int M, int N, int K) {
  const auto key = std::make_tuple(M, N, K);
  if (auto it = g->plans.find(key); it != g->plans.end()) return &it->second;
  LtGemm::Plan p;
  SS_LT_TRY(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  SS_LT_TRY(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  SS_LT_TRY(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  SS_LT_TRY(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, K, N, K));
  SS_LT_TRY(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, K, M, K));
  SS_LT_TRY(cublasLtMatrixLayoutCreate(&p.c, CUDA_R_32F, N, M, N));
  cublasLtMatmulPreference_t pref = nullptr;
  SS_LT_TRY(cublasLtMatmulPreferenceCreate(&pref));
  SS_LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &g->workspace_bytes,
                                                 sizeof(g->workspace_bytes)));
  cublasLtMatmulHeuristicResult_t res{};
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(g->handle, p.op, p.a, p.b, p.c, p.c, pref, 1, &res, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  SS_LT_TRY(st);
  if (found == 0) return make_error("cuBLASLt: no algorithm for M=" + std::to_string(M) + " N=" + std::to_string(N) +
                                    " K=" + std::to_string(K));
  p.algo = res.algo;
  return &(g->plans[key] = p);
}
}  // namespace

Expected<LtGemm*> lt_create(size_t workspace_bytes) {
  auto* g = new LtGemm;
  g->workspace_bytes = workspace_bytes;
  if (auto st = lt_status(cublasLtCreate(&g->handle), "create"); !st.ok()) {
    delete g;
    return st.error();
  }
  if (workspace_bytes > 0) {
    if (auto st = cuda_status(cudaMalloc(&g->workspace, workspace_bytes), "cudaMalloc", __FILE__, __LINE__); !st.ok()) {
      lt_destroy(g);
      return st.error();
    }
  }
  return g;
}

void lt_destroy(LtGemm* g) {
  if (!g) return;
  for (auto& [k, p] : g->plans) {
    cublasLtMatrixLayoutDestroy(p.a);
    cublasLtMatrixLayoutDestroy(p.b);
    cublasLtMatrixLayoutDestroy(p.c);
    cublasLtMatmulDescDestroy(p.op);
  }
  if (g->workspace) cudaFree(g->workspace);
  if (g->handle) cublasLtDestroy(g->handle);
  delete g;
}

Status lt_gemm_bf16(LtGemm* g, const bf16_bits* W, const bf16_bits* x, float* y, int M, int N, int K, bool accumulate,
                    cudaStream_t s) {
  if (!g || M <= 0 || N <= 0 || K <= 0) return make_error("lt_gemm_bf16: bad shape or no handle");
  SS_ASSIGN(LtGemm::Plan * p, plan_for(g, M, N, K));
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  SS_LT_TRY(cublasLtMatmul(g->handle, p->op, &alpha, W, p->a, x, p->b, &beta, y, p->c, y, p->c, &p->algo, g->workspace,
                           g->workspace_bytes, s));
  return {};
}

}  // namespace ss::cuda::kern
