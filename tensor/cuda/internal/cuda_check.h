// SM_CUDA_CHECK: turns a CUDA runtime (or cuBLASLt) result code into a thrown OpError with the
// expression, file:line and CUDA's own name and text. Only in CUDA builds.
//
//   SM_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, stream));
//   SM_CUBLAS_CHECK(cublasLtMatmul(...));
//   NoteCudaError(cudaFree(p), "cudaFree (caching allocator, cuda:0)");  // where none may throw
//
// A call that may not throw (a destructor, a tensor's deleter) passes its result to
// NoteCudaError: a failure is printed to stderr and the first one is remembered, and every later
// thrown CUDA error names it ("first CUDA failure in this process: ..."), since CUDA's sticky
// errors (an illegal address, say) surface at whichever call comes next.
#ifndef SHARDMAP_TENSOR_CUDA_INTERNAL_CUDA_CHECK_H_
#define SHARDMAP_TENSOR_CUDA_INTERNAL_CUDA_CHECK_H_

#if SHARDMAP_HAS_CUDA

#include <cuda_runtime.h>

#include <cstdio>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tensor/error.h"

namespace shardmap::cuda::internal {

struct FirstCudaFailure {
  std::mutex mu;
  std::string what;  // empty until the first failure
};
inline FirstCudaFailure& FirstFailure() {
  static FirstCudaFailure* f = new FirstCudaFailure();  // never destroyed: used at exit too
  return *f;
}

// The first CUDA failure recorded by NoteCudaError or thrown by SM_CUDA_CHECK ("" if none).
inline std::string FirstCudaFailureText() {
  FirstCudaFailure& f = FirstFailure();
  std::lock_guard<std::mutex> lock(f.mu);
  return f.what;
}

// Remembers `what` as the process's first CUDA failure unless one is already known; returns
// what was known before ("" if nothing).
inline std::string RecordCudaFailure(const std::string& what) {
  FirstCudaFailure& f = FirstFailure();
  std::lock_guard<std::mutex> lock(f.mu);
  std::string before = f.what;
  if (f.what.empty()) f.what = what;
  return before;
}

// For calls that must not throw: a failure is printed and remembered (see above); returns
// whether `e` is cudaSuccess.
inline bool NoteCudaError(cudaError_t e, const char* op) {
  if (e == cudaSuccess) return true;
  const std::string what =
      absl::StrCat(op, " failed: ", cudaGetErrorName(e), ": ", cudaGetErrorString(e));
  RecordCudaFailure(what);
  std::fprintf(stderr, "shardmap: %s\n", what.c_str());
  return false;
}

[[noreturn]] inline void ThrowCudaError(cudaError_t e, const char* expr, const char* file,
                                        int line) {
  std::string msg = absl::StrCat(file, ":", line, ": ", expr, " failed: ", cudaGetErrorName(e),
                                 ": ", cudaGetErrorString(e));
  const std::string first = RecordCudaFailure(msg);
  if (!first.empty() && first != msg) {
    absl::StrAppend(&msg, " (first CUDA failure in this process: ", first, ")");
  }
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
