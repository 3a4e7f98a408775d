// SM_CUBLASLT_CHECK: turns a cuBLASLt status into a thrown OpError with the expression, file:line
// and cuBLASLt's own status name and text. Only in CUDA builds.
//
//   SM_CUBLASLT_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
//   // throws: "gemm.cc:88: cublasLtMatmulDescCreate(...) failed: CUBLAS_STATUS_INVALID_VALUE: ..."
#ifndef SHARDMAP_TENSOR_CUDA_GEMM_INTERNAL_CUBLASLT_CHECK_H_
#define SHARDMAP_TENSOR_CUDA_GEMM_INTERNAL_CUBLASLT_CHECK_H_

#if SHARDMAP_HAS_CUDA

#include <cublasLt.h>

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tensor/error.h"

namespace shardmap::cuda::internal {

[[noreturn]] inline void ThrowCublasLtError(cublasStatus_t s, const char* expr, const char* file,
                                            int line) {
  std::string msg = absl::StrCat(file, ":", line, ": ", expr, " failed: ",
                                 cublasLtGetStatusName(s), ": ", cublasLtGetStatusString(s));
  if (s == CUBLAS_STATUS_ALLOC_FAILED) throw OpError(absl::ResourceExhaustedError(msg));
  throw OpError(absl::InternalError(msg));
}

}  // namespace shardmap::cuda::internal

#define SM_CUBLASLT_CHECK(expr)                                                             \
  do {                                                                                      \
    cublasStatus_t sm_cublaslt_s_ = (expr);                                                 \
    if (sm_cublaslt_s_ != CUBLAS_STATUS_SUCCESS) {                                          \
      ::shardmap::cuda::internal::ThrowCublasLtError(sm_cublaslt_s_, #expr, __FILE__,       \
                                                     __LINE__);                             \
    }                                                                                       \
  } while (0)

#endif  // SHARDMAP_HAS_CUDA

#endif  // SHARDMAP_TENSOR_CUDA_GEMM_INTERNAL_CUBLASLT_CHECK_H_
