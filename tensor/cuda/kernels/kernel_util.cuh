// Shared device-side helpers for the tensor kernels (.cu files only; nvcc includes this).
//
//   SM_DISPATCH_FLOAT(dtype, T, { MyKernel<T><<<Blocks(n), kThreads, 0, s>>>(...); });
//   __device__: float v = ToAcc(x[i]);  y[i] = FromAcc<T>(v * 2);
//
// Element types on the device: float, double, __nv_bfloat16, __half, int32_t, int64_t. Half types
// compute in float and round once (round to nearest even), like the CPU kernels; f64 computes in
// double. Launchers are plain host functions taking raw pointers and a cudaStream_t as void*, and
// return cudaError_t (cudaGetLastError after the launch) so the C++ side can turn it into an
// OpError with file:line (tensor/cuda/internal/cuda_check.h).
#ifndef SHARDMAP_TENSOR_CUDA_KERNELS_KERNEL_UTIL_CUH_
#define SHARDMAP_TENSOR_CUDA_KERNELS_KERNEL_UTIL_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "tensor/dtype.h"

namespace shardmap::cuda::kernels {

constexpr int kThreads = 256;

// Grid size for a grid-stride loop over n elements (at least 1 block, capped so huge n loop).
inline unsigned Blocks(int64_t n, int threads = kThreads) {
  int64_t b = (n + threads - 1) / threads;
  if (b < 1) b = 1;
  if (b > 65535LL * 32) b = 65535LL * 32;
  return static_cast<unsigned>(b);
}

inline cudaStream_t AsStream(void* s) { return static_cast<cudaStream_t>(s); }

// Accumulator type: double for double, float for everything else.
template <typename T> struct AccOf { using type = float; };
template <> struct AccOf<double> { using type = double; };
template <typename T> using Acc = typename AccOf<T>::type;

__device__ __forceinline__ float ToAcc(float v) { return v; }
__device__ __forceinline__ double ToAcc(double v) { return v; }
__device__ __forceinline__ float ToAcc(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float ToAcc(__half v) { return __half2float(v); }

template <typename T> __device__ __forceinline__ T FromAcc(float v) { return static_cast<T>(v); }
template <typename T> __device__ __forceinline__ T FromAcc(double v) { return static_cast<T>(v); }
template <> __device__ __forceinline__ __nv_bfloat16 FromAcc<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <> __device__ __forceinline__ __half FromAcc<__half>(float v) {
  return __float2half_rn(v);
}

#define SM_GRID_STRIDE_LOOP(i, n)                                                        \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

// Runs `body` with T bound to the device type of a floating dtype; returns
// cudaErrorInvalidValue for other dtypes (the C++ side checks dtypes first, so this is a guard).
#define SM_DISPATCH_FLOAT(dtype, T, ...)                              \
  switch (dtype) {                                                    \
    case ::shardmap::DType::kF32: { using T = float; __VA_ARGS__; } break;         \
    case ::shardmap::DType::kF64: { using T = double; __VA_ARGS__; } break;        \
    case ::shardmap::DType::kBF16: { using T = __nv_bfloat16; __VA_ARGS__; } break; \
    case ::shardmap::DType::kF16: { using T = __half; __VA_ARGS__; } break;        \
    default: return cudaErrorInvalidValue;                            \
  }

// As SM_DISPATCH_FLOAT plus i32 and i64 (casts, copies, fills).
#define SM_DISPATCH_ALL(dtype, T, ...)                                \
  switch (dtype) {                                                    \
    case ::shardmap::DType::kF32: { using T = float; __VA_ARGS__; } break;         \
    case ::shardmap::DType::kF64: { using T = double; __VA_ARGS__; } break;        \
    case ::shardmap::DType::kBF16: { using T = __nv_bfloat16; __VA_ARGS__; } break; \
    case ::shardmap::DType::kF16: { using T = __half; __VA_ARGS__; } break;        \
    case ::shardmap::DType::kI32: { using T = int32_t; __VA_ARGS__; } break;       \
    case ::shardmap::DType::kI64: { using T = int64_t; __VA_ARGS__; } break;       \
    default: return cudaErrorInvalidValue;                            \
  }

}  // namespace shardmap::cuda::kernels

#endif  // SHARDMAP_TENSOR_CUDA_KERNELS_KERNEL_UTIL_CUH_
