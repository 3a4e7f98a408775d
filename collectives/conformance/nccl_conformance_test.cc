// The backend conformance suite on NCCL: rank r a thread on GPU r with its own store client, so
// world sizes stop at the visible GPU count (NCCL refuses two ranks on one GPU); the cases skip
// with "no GPU visible" where there is none. Reductions follow NCCL's ring and tree orders, so
// floating-point results are compared within a tolerance. Bundled for GPU machines by
// tools/gpu_bundle.sh.
#include <vector>

#include "collectives/conformance/backend_conformance.h"
#include "collectives/internal/gpu_count.h"

#if SHARDMAP_HAS_CUDA
#include <cuda_runtime.h>
#endif

namespace shardmap::collectives::conformance {
namespace {

DeviceMemory CudaMemory() {
  DeviceMemory m;
#if SHARDMAP_HAS_CUDA
  m.alloc = [](int device, size_t bytes) -> void* {
    void* p = nullptr;
    if (cudaSetDevice(device) != cudaSuccess || cudaMalloc(&p, bytes) != cudaSuccess) {
      return nullptr;
    }
    return p;
  };
  m.free = [](int device, void* p) {
    cudaSetDevice(device);
    cudaFree(p);
  };
  // cudaMemcpy on the legacy stream, then a device sync: the communicator's own stream does not
  // wait for the legacy one, and a pageable copy may return before its DMA lands.
  m.to_device = [](int device, void* dst, const void* src, size_t bytes) {
    cudaSetDevice(device);
    EXPECT_EQ(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  };
  m.to_host = [](int device, void* dst, const void* src, size_t bytes) {
    cudaSetDevice(device);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  };
#endif
  return m;
}

std::vector<int> SizesUpToTheGpus() {
  std::vector<int> sizes;
  for (int n : {1, 2, 3, 5}) {
    if (n <= internal::VisibleGpuCount()) sizes.push_back(n);
  }
  if (sizes.empty()) sizes.push_back(1);  // the cases skip: no GPU visible
  return sizes;
}

INSTANTIATE_TEST_SUITE_P(Backend, BackendConformanceTest,
                         ::testing::Values(ConformanceTarget{.backend = "nccl",
                                                             .world_sizes = SizesUpToTheGpus(),
                                                             .bitwise_reductions = false,
                                                             .device = CudaMemory()}),
                         ConformanceTargetName);

}  // namespace
}  // namespace shardmap::collectives::conformance
