// Device helpers of the register-resident row kernels (norm_vec.cu, softmax_vec.cu; plan in
// norm_plan.h): 16-byte vector loads and stores of f32/bf16/f16, row sums and maxima over the
// kTpr threads of a row, and the dispatch of the plan's (tpr, vecs) to template arguments.
//
//   float v[8];  LoadVec(x + j, v);      // 8 bf16 (or 4 f32) elements, converted to float
//   s = RowSum<128>(s);                  // over the 128 threads of the row (a block)
#ifndef SHARDMAP_TENSOR_CUDA_NN_VEC_ROW_CUH_
#define SHARDMAP_TENSOR_CUDA_NN_VEC_ROW_CUH_

#include "tensor/cuda/nn/nn_util.cuh"

namespace shardmap::cuda::nn_kernels {

template <typename T>
__host__ __device__ constexpr int VecWidth() {
  return 16 / static_cast<int>(sizeof(T));
}

template <typename T>
__device__ __forceinline__ void LoadVec(const T* __restrict__ p, float* out) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int i = 0; i < VecWidth<T>(); ++i) out[i] = ToAcc(e[i]);
}

template <typename T>
__device__ __forceinline__ void StoreVec(T* __restrict__ p, const float* v) {
  uint4 raw;
  T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
  for (int i = 0; i < VecWidth<T>(); ++i) e[i] = FromAcc<T>(v[i]);
  *reinterpret_cast<uint4*>(p) = raw;
}

// n floats (a multiple of 4) from a 16-byte aligned address.
template <int n>
__device__ __forceinline__ void LoadFloats(const float* __restrict__ p, float* out) {
#pragma unroll
  for (int i = 0; i < n; i += 4) {
    const float4 v = *reinterpret_cast<const float4*>(p + i);
    out[i] = v.x;
    out[i + 1] = v.y;
    out[i + 2] = v.z;
    out[i + 3] = v.w;
  }
}

template <int n>
__device__ __forceinline__ void StoreFloats(float* __restrict__ p, const float* v) {
#pragma unroll
  for (int i = 0; i < n; i += 4) {
    *reinterpret_cast<float4*>(p + i) = make_float4(v[i], v[i + 1], v[i + 2], v[i + 3]);
  }
}

template <typename A>
__device__ __forceinline__ A WarpMax(A v) {
  for (int o = 16; o > 0; o >>= 1) {
    const A w = __shfl_xor_sync(0xffffffffu, v, o);
    v = w > v ? w : v;
  }
  return v;
}

// Max over the kTpr threads of a row (NaN never wins; the callers' sums carry it); every thread
// of the row gets it.
template <int kTpr>
__device__ __forceinline__ float RowMax(float v) {
  v = WarpMax(v);
  if constexpr (kTpr > 32) {
    __shared__ float scratch[kTpr / 32];
    __syncthreads();
    if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
    __syncthreads();
    float t = scratch[0];
#pragma unroll
    for (int w = 1; w < kTpr / 32; ++w) t = scratch[w] > t ? scratch[w] : t;
    v = t;
  }
  return v;
}

// Sum over the kTpr threads of a row (a warp, or the whole block when kTpr > 32); every thread
// of the row gets it, in a fixed order.
template <int kTpr>
__device__ __forceinline__ float RowSum(float v) {
  v = WarpSum(v);
  if constexpr (kTpr > 32) {
    __shared__ float scratch[kTpr / 32];
    __syncthreads();  // the previous RowSum's readers are done with scratch
    if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
    __syncthreads();
    float t = 0;
#pragma unroll
    for (int w = 0; w < kTpr / 32; ++w) t += scratch[w];
    v = t;
  }
  return v;
}


// Runs body with constexpr kTpr and kVecs bound to the plan's values (kVecs * V <= 32, <= 16
// with 512 threads; combinations the plan never makes map to a smaller instantiation, so they
// are not compiled).
#define SM_VEC_NORM_DISPATCH(plan, V, ...)                                     \
  switch ((plan).tpr * 16 + (plan).vecs) {                                     \
    case 32 * 16 + 1: { constexpr int kTpr = 32, kVecs = 1; __VA_ARGS__; } break;   \
    case 32 * 16 + 2: { constexpr int kTpr = 32, kVecs = 2; __VA_ARGS__; } break;   \
    case 32 * 16 + 4: { constexpr int kTpr = 32, kVecs = 4; __VA_ARGS__; } break;   \
    case 32 * 16 + 8: { constexpr int kTpr = 32, kVecs = (V) == 4 ? 8 : 4; __VA_ARGS__; } break; \
    case 128 * 16 + 1: { constexpr int kTpr = 128, kVecs = 1; __VA_ARGS__; } break; \
    case 128 * 16 + 2: { constexpr int kTpr = 128, kVecs = 2; __VA_ARGS__; } break; \
    case 128 * 16 + 4: { constexpr int kTpr = 128, kVecs = 4; __VA_ARGS__; } break; \
    case 128 * 16 + 8: { constexpr int kTpr = 128, kVecs = (V) == 4 ? 8 : 4; __VA_ARGS__; } break; \
    case 512 * 16 + 1: { constexpr int kTpr = 512, kVecs = 1; __VA_ARGS__; } break; \
    case 512 * 16 + 2: { constexpr int kTpr = 512, kVecs = 2; __VA_ARGS__; } break; \
    case 512 * 16 + 4: { constexpr int kTpr = 512, kVecs = (V) == 4 ? 4 : 2; __VA_ARGS__; } break; \
    default: return cudaErrorInvalidValue;                                     \
  }

// Runs body with T bound to the device type of f32 / bf16 / f16.
#define SM_VEC_NORM_TYPES(dtype, T, ...)                                                  \
  switch (dtype) {                                                                        \
    case ::shardmap::DType::kF32: { using T = float; __VA_ARGS__; } break;                \
    case ::shardmap::DType::kBF16: { using T = __nv_bfloat16; __VA_ARGS__; } break;       \
    case ::shardmap::DType::kF16: { using T = __half; __VA_ARGS__; } break;               \
    default: return cudaErrorInvalidValue;                                                \
  }


}  // namespace shardmap::cuda::nn_kernels

#endif  // SHARDMAP_TENSOR_CUDA_NN_VEC_ROW_CUH_
