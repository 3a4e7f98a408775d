#include "tensor/cuda/kernels/fill.h"
#include "tensor/cuda/kernels/kernel_util.cuh"

namespace shardmap::cuda::kernels {
namespace {

template <typename T>
__global__ void FillKernel(T* dst, int64_t n, T value) {
  SM_GRID_STRIDE_LOOP(i, n) { dst[i] = value; }
}

template <typename T> T Convert(double v) { return static_cast<T>(v); }
template <> __nv_bfloat16 Convert<__nv_bfloat16>(double v) {
  return __float2bfloat16_rn(static_cast<float>(v));
}
template <> __half Convert<__half>(double v) { return __float2half_rn(static_cast<float>(v)); }

}  // namespace

int LaunchFill(void* dst, DType dtype, int64_t n, double value, void* stream) {
  if (n == 0) return cudaSuccess;
  SM_DISPATCH_ALL(dtype, T, {
    FillKernel<T><<<Blocks(n), kThreads, 0, AsStream(stream)>>>(static_cast<T*>(dst), n,
                                                                 Convert<T>(value));
  });
  return cudaGetLastError();
}

}  // namespace shardmap::cuda::kernels
