// The number of CUDA devices this process can see; 0 without the toolkit or a driver. GPU tests
// use it to skip with a message instead of failing on machines without a GPU.
//
//   if (internal::VisibleGpuCount() == 0) GTEST_SKIP() << "no GPU visible";
#ifndef SHARDMAP_COLLECTIVES_INTERNAL_GPU_COUNT_H_
#define SHARDMAP_COLLECTIVES_INTERNAL_GPU_COUNT_H_

#if SHARDMAP_HAS_CUDA
#include <cuda_runtime.h>
#endif

namespace shardmap::collectives::internal {

inline int VisibleGpuCount() {
#if SHARDMAP_HAS_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
#else
  return 0;
#endif
}

}  // namespace shardmap::collectives::internal

#endif  // SHARDMAP_COLLECTIVES_INTERNAL_GPU_COUNT_H_
