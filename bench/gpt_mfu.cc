#include "bench/gpt_mfu.h"

#if SHARDMAP_HAS_CUDA
#include <cuda_runtime.h>
#endif

namespace shardmap::bench {

int64_t GptFlopParams(const GptConfig& cfg) {
  int64_t n = 0;
  for (const NamedTensor& p : InitGpt(cfg, 1)) {
    if (p.name != "wpe.weight") n += NumElements(p.tensor.shape());
  }
  return n;
}

double GptStepFlops(const GptConfig& cfg, int64_t tokens) {
  const double per_token = 6.0 * static_cast<double>(GptFlopParams(cfg)) +
                           12.0 * static_cast<double>(cfg.layers * cfg.d_model * cfg.seq);
  return per_token * static_cast<double>(tokens);
}

double DenseBf16PeakFlops(const std::string& name) {
  auto has = [&](const char* s) { return name.find(s) != std::string::npos; };
  if (has("H200")) return 989.4e12;
  if (has("H100")) return has("PCIe") ? 756.0e12 : 989.4e12;
  if (has("A100")) return 312.0e12;
  if (has("L4")) return 121.0e12;
  return 0;
}

std::string CudaDeviceName(int device) {
#if !SHARDMAP_HAS_CUDA
  (void)device;
  return "";  // built without the CUDA toolkit: no card to name
#else
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error state
    return "";
  }
  return prop.name;
#endif
}

}  // namespace shardmap::bench
