// RelaxedCaptureMode: for its scope, lets this thread make CUDA calls that are "potentially
// unsafe" during a stream capture (cudaMalloc, cudaFree, library set-up such as cublasLtCreate)
// without invalidating a capture in global or thread-local mode. Only for calls that record no
// work into the captured stream. Only in CUDA builds.
//
//   { RelaxedCaptureMode relaxed; SM_CUDA_CHECK(cudaMalloc(&p, n)); }
#ifndef SHARDMAP_TENSOR_CUDA_INTERNAL_CAPTURE_MODE_H_
#define SHARDMAP_TENSOR_CUDA_INTERNAL_CAPTURE_MODE_H_

#if SHARDMAP_HAS_CUDA

#include <cuda_runtime.h>

namespace shardmap::cuda::internal {

class RelaxedCaptureMode {
 public:
  RelaxedCaptureMode() { cudaThreadExchangeStreamCaptureMode(&mode_); }
  ~RelaxedCaptureMode() { cudaThreadExchangeStreamCaptureMode(&mode_); }
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
};

}  // namespace shardmap::cuda::internal

#endif  // SHARDMAP_HAS_CUDA

#endif  // SHARDMAP_TENSOR_CUDA_INTERNAL_CAPTURE_MODE_H_
