// Dtype casts, bit-for-bit the CPU Cast (tensor/ops/shape_ops.cc) except NaN payloads.
#include <climits>
#include <cstdint>

#include "tensor/cuda/elementwise/layout_kernels.h"
#include "tensor/cuda/kernels/kernel_util.cuh"

namespace shardmap::cuda::kernels {
namespace {

__device__ __forceinline__ double ToDouble(float v) { return v; }
__device__ __forceinline__ double ToDouble(double v) { return v; }
__device__ __forceinline__ double ToDouble(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ double ToDouble(__half v) { return __half2float(v); }
__device__ __forceinline__ double ToDouble(int32_t v) { return v; }
__device__ __forceinline__ double ToDouble(int64_t v) { return __ll2double_rn(v); }

// d rounded to float with round-to-odd, so a later RNE rounding to bf16/f16 equals one correct
// rounding of d (the CPU's DoubleToFloatRoundToOdd).
__device__ __forceinline__ float RoundToOdd(double d) {
  const float f = __double2float_rz(d);
  if (isnan(d) || static_cast<double>(f) == d) return f;
  return __uint_as_float(__float_as_uint(f) | 1u);
}

template <typename T> __device__ __forceinline__ T FromDouble(double v);
template <> __device__ __forceinline__ float FromDouble<float>(double v) {
  return __double2float_rn(v);
}
template <> __device__ __forceinline__ double FromDouble<double>(double v) { return v; }
// Truncation; NaN and out-of-range give INT_MIN, like x86's cvttsd2si (the CPU build's cast).
template <> __device__ __forceinline__ int32_t FromDouble<int32_t>(double v) {
  return v > -2147483649.0 && v < 2147483648.0 ? static_cast<int32_t>(v) : INT_MIN;
}
template <> __device__ __forceinline__ int64_t FromDouble<int64_t>(double v) {
  return v >= -9223372036854775808.0 && v < 9223372036854775808.0 ? static_cast<int64_t>(v)
                                                                   : LLONG_MIN;
}
template <> __device__ __forceinline__ __nv_bfloat16 FromDouble<__nv_bfloat16>(double v) {
  return __float2bfloat16_rn(RoundToOdd(v));
}
template <> __device__ __forceinline__ __half FromDouble<__half>(double v) {
  return __float2half_rn(RoundToOdd(v));
}

template <typename From, typename To>
struct Convert {
  __device__ __forceinline__ To operator()(From v) const { return FromDouble<To>(ToDouble(v)); }
};
// The hot pairs, directly (same results as through double).
template <> struct Convert<float, __nv_bfloat16> {
  __device__ __forceinline__ __nv_bfloat16 operator()(float v) const {
    return __float2bfloat16_rn(v);
  }
};
template <> struct Convert<float, __half> {
  __device__ __forceinline__ __half operator()(float v) const { return __float2half_rn(v); }
};
template <> struct Convert<__nv_bfloat16, float> {
  __device__ __forceinline__ float operator()(__nv_bfloat16 v) const {
    return __bfloat162float(v);
  }
};
template <> struct Convert<__half, float> {
  __device__ __forceinline__ float operator()(__half v) const { return __half2float(v); }
};

template <typename From, typename To>
__global__ void CastKernel(const From* __restrict__ in, To* __restrict__ out, int64_t n) {
  const Convert<From, To> c;
  SM_GRID_STRIDE_LOOP(i, n) { out[i] = c(in[i]); }
}

template <typename T, int N>
struct alignas(sizeof(T) * N) CastPack {
  T v[N];
};

// N elements per thread: a 16-byte load or store on the wider side (f32 -> bf16: 4 floats in,
// 8 bytes out). Both pointers 16-byte aligned; the tail (n % N) one element per thread.
template <typename From, typename To, int N>
__global__ void CastKernelVec(const From* __restrict__ in, To* __restrict__ out, int64_t n) {
  const Convert<From, To> c;
  const int64_t nv = n / N;
  const CastPack<From, N>* iv = reinterpret_cast<const CastPack<From, N>*>(in);
  CastPack<To, N>* ov = reinterpret_cast<CastPack<To, N>*>(out);
  SM_GRID_STRIDE_LOOP(i, nv) {
    const CastPack<From, N> a = iv[i];
    CastPack<To, N> b;
#pragma unroll
    for (int k = 0; k < N; ++k) b.v[k] = c(a.v[k]);
    ov[i] = b;
  }
  const int64_t done = nv * N;
  SM_GRID_STRIDE_LOOP(i, n - done) { out[done + i] = c(in[done + i]); }
}

template <typename From>
int CastFrom(const From* in, void* out, DType to, int64_t n, cudaStream_t s) {
  const bool aligned = reinterpret_cast<uintptr_t>(in) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(out) % 16 == 0;
  SM_DISPATCH_ALL(to, To, {
    constexpr int N = 16 / (sizeof(From) > sizeof(To) ? sizeof(From) : sizeof(To));
    if (aligned && N > 1) {
      CastKernelVec<From, To, N><<<Blocks((n + N - 1) / N), kThreads, 0, s>>>(
          in, static_cast<To*>(out), n);
    } else {
      CastKernel<From, To><<<Blocks(n), kThreads, 0, s>>>(in, static_cast<To*>(out), n);
    }
  });
  return cudaSuccess;
}

}  // namespace

int LaunchCast(const void* in, DType from, void* out, DType to, int64_t n, void* stream) {
  if (n == 0) return cudaSuccess;
  if (from == to) {  // a plain copy
    return LaunchCopyRows(out, 0, in, 0, 1, n * static_cast<int64_t>(DTypeSize(from)), stream);
  }
  int rc = cudaSuccess;
  SM_DISPATCH_ALL(from, From, {
    rc = CastFrom(static_cast<const From*>(in), out, to, n, AsStream(stream));
  });
  if (rc != cudaSuccess) return rc;
  return cudaGetLastError();
}

}  // namespace shardmap::cuda::kernels
