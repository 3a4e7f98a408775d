// SM_CUDA_CHECK: turns a CUDA runtime (or cuBLASLt) result code into a thrown OpError with the
// expression, file:line and CUDA's own name and text. Only in CUDA builds.
//
//   SM_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, stream));
//   SM_CUBLAS_CHECK(cublasLtMatmul(...));
#ifndef SHARDMAP_TENSOR_CUDA_INTERNAL_CUDA_CHECK_H_
#define SHARDMAP_TENSOR_CUDA_INTERNAL_CUDA_CHECK_H_

#if SHARDMAP_HAS_CUDA

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tensor/error.h"

namespace shardmap::cuda::internal {

[[noreturn]] inline void ThrowCudaError(cudaError_t e, const char* expr, const char* file,
                                        int line) {
  std::string msg = absl::StrCat(file, ":", line, ": ", expr, " failed: ", cudaGetErrorName(e),
                                 ": ", cudaGetErrorString(e));
  if (e == cudaErrorMemoryAllocation) throw OpError(absl::ResourceExhaustedError(msg));
  throw OpError(absl::InternalError(msg));
}

}  // namespace shardmap::cuda::internal

#define SM_CUDA_CHECK(expr)                                                          \
  do {                                                                               \
    cudaError_t sm_cuda_e_ = (expr);                                                 \
    if (sm_cuda_e_ != cudaSuccess) {                                                 \
      ::shardmap::cuda::internal::ThrowCudaError(sm_cuda_e_, #expr, __FILE__, __LINE__); \
    }                                                                                \
  } while (0)

#endif  // SHARDMAP_HAS_CUDA

#endif  // SHARDMAP_TENSOR_CUDA_INTERNAL_CUDA_CHECK_H_
