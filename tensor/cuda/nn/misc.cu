// Cast and causal-mask kernels (see kernels.h).
#include "tensor/cuda/nn/kernels.h"
#include "tensor/cuda/nn/nn_util.cuh"

namespace shardmap::cuda::nn_kernels {
namespace {

template <typename S, typename D>
__global__ void CastKernel(const S* __restrict__ src, D* __restrict__ dst, int64_t n) {
  SM_GRID_STRIDE_LOOP(i, n) { dst[i] = StoreAs<D>(ToAcc(src[i])); }
}

template <typename T>
__global__ void CausalMaskKernel(const T* __restrict__ x, T* __restrict__ y, int64_t numel,
                                 int64_t s, int64_t t, int64_t offset, Acc<T> fill_acc) {
  const T fill = StoreAs<T>(fill_acc);
  SM_GRID_STRIDE_LOOP(k, numel) {
    const int64_t row = k / t, j = k - row * t, i = row % s;
    y[k] = j > i + offset ? fill : x[k];
  }
}

}  // namespace

int LaunchCast(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n,
               void* stream) {
  if (n == 0) return cudaSuccess;
  SM_DISPATCH_FLOAT(src_dtype, S, SM_DISPATCH_FLOAT(dst_dtype, D, {
    CastKernel<S, D><<<Blocks(n), kThreads, 0, AsStream(stream)>>>(static_cast<const S*>(src),
                                                                    static_cast<D*>(dst), n);
  }));
  return cudaGetLastError();
}

int LaunchCausalMask(const void* x, void* y, DType dtype, int64_t mats, int64_t s, int64_t t,
                     int64_t offset, double fill, void* stream) {
  const int64_t numel = mats * s * t;
  if (numel == 0) return cudaSuccess;
  SM_DISPATCH_FLOAT(dtype, T, {
    // Like the CPU kernel: half types go through f32 (fill rounds to f32, then once to T).
    const Acc<T> f = static_cast<Acc<T>>(fill);
    CausalMaskKernel<T><<<Blocks(numel), kThreads, 0, AsStream(stream)>>>(
        static_cast<const T*>(x), static_cast<T*>(y), numel, s, t, offset, f);
  });
  return cudaGetLastError();
}

}  // namespace shardmap::cuda::nn_kernels
