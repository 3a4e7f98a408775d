// Device-side math of the elementwise kernels (binary.cu, unary.cu): the same formulas, in the
// same order of operations, as the CPU loops in tensor/ops/elementwise.cc. A is the compute type
// (float for f32/bf16/f16, double for f64).
#ifndef SHARDMAP_TENSOR_CUDA_ELEMENTWISE_ELEMENTWISE_MATH_CUH_
#define SHARDMAP_TENSOR_CUDA_ELEMENTWISE_ELEMENTWISE_MATH_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "tensor/cuda/kernels/kernel_util.cuh"

namespace shardmap::cuda::kernels::ew {

__device__ __forceinline__ float Exp(float x) { return expf(x); }
__device__ __forceinline__ double Exp(double x) { return exp(x); }
__device__ __forceinline__ float Log(float x) { return logf(x); }
__device__ __forceinline__ double Log(double x) { return log(x); }
__device__ __forceinline__ float Tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double Tanh(double x) { return tanh(x); }
__device__ __forceinline__ float Erf(float x) { return erff(x); }
__device__ __forceinline__ double Erf(double x) { return erf(x); }
__device__ __forceinline__ float Sqrt(float x) { return sqrtf(x); }  // IEEE (no fast math)
__device__ __forceinline__ double Sqrt(double x) { return sqrt(x); }

constexpr double kSqrt2OverPi = 0.79788456080286535588;  // sqrt(2/pi)
constexpr double kInvSqrt2 = 0.70710678118654752440;
constexpr double kInvSqrt2Pi = 0.39894228040143267794;  // 1/sqrt(2 pi)
constexpr double kGeluC = 0.044715;

template <typename A>
__device__ __forceinline__ A GeluTanhFwd(A x) {
  const A u = A(kSqrt2OverPi) * (x + A(kGeluC) * x * x * x);
  return A(0.5) * x * (A(1) + Tanh(u));
}
template <typename A>
__device__ __forceinline__ A GeluTanhDer(A x) {
  const A u = A(kSqrt2OverPi) * (x + A(kGeluC) * x * x * x);
  const A t = Tanh(u);
  const A du = A(kSqrt2OverPi) * (A(1) + A(3 * kGeluC) * x * x);
  return A(0.5) * (A(1) + t) + A(0.5) * x * (A(1) - t * t) * du;
}
template <typename A>
__device__ __forceinline__ A GeluErfFwd(A x) {
  return A(0.5) * x * (A(1) + Erf(x * A(kInvSqrt2)));
}
template <typename A>
__device__ __forceinline__ A GeluErfDer(A x) {
  return A(0.5) * (A(1) + Erf(x * A(kInvSqrt2))) + x * A(kInvSqrt2Pi) * Exp(A(-0.5) * x * x);
}
template <typename A>
__device__ __forceinline__ A Sigmoid(A x) {
  return A(1) / (A(1) + Exp(-x));
}

// Binary functors: (a, b) -> result, in the compute type.
struct AddF {
  template <typename A> __device__ A operator()(A x, A y) const { return x + y; }
};
struct SubF {
  template <typename A> __device__ A operator()(A x, A y) const { return x - y; }
};
struct MulF {
  template <typename A> __device__ A operator()(A x, A y) const { return x * y; }
};
struct DivF {
  template <typename A> __device__ A operator()(A x, A y) const { return x / y; }
};
struct ReluGradF {
  template <typename A> __device__ A operator()(A v, A g) const { return v > A(0) ? g : A(0); }
};
struct GeluTanhGradF {
  template <typename A> __device__ A operator()(A v, A g) const { return g * GeluTanhDer(v); }
};
struct GeluErfGradF {
  template <typename A> __device__ A operator()(A v, A g) const { return g * GeluErfDer(v); }
};
struct SiluGradF {
  template <typename A> __device__ A operator()(A v, A g) const {
    const A s = Sigmoid(v);
    return g * s * (A(1) + v * (A(1) - s));
  }
};
struct TanhGradF {
  template <typename A> __device__ A operator()(A v, A g) const { return g * (A(1) - v * v); }
};

// Unary functors: (x, scalar) -> result.
struct AddScalarF {
  template <typename A> __device__ A operator()(A x, A s) const { return x + s; }
};
struct MulScalarF {
  template <typename A> __device__ A operator()(A x, A s) const { return x * s; }
};
struct NegF {
  template <typename A> __device__ A operator()(A x, A) const { return -x; }
};
struct ExpF {
  template <typename A> __device__ A operator()(A x, A) const { return Exp(x); }
};
struct LogF {
  template <typename A> __device__ A operator()(A x, A) const { return Log(x); }
};
struct TanhF {
  template <typename A> __device__ A operator()(A x, A) const { return Tanh(x); }
};
struct ReluF {  // NaN propagates (x != x), like the CPU
  template <typename A> __device__ A operator()(A x, A) const {
    return x > A(0) || x != x ? x : A(0);
  }
};
struct SqrtF {
  template <typename A> __device__ A operator()(A x, A) const { return Sqrt(x); }
};
struct GeluTanhF {
  template <typename A> __device__ A operator()(A x, A) const { return GeluTanhFwd(x); }
};
struct GeluErfF {
  template <typename A> __device__ A operator()(A x, A) const { return GeluErfFwd(x); }
};
struct SiluF {
  template <typename A> __device__ A operator()(A x, A) const { return x * Sigmoid(x); }
};

// N elements of T loaded and stored as one aligned vector (16 bytes for N = 16 / sizeof(T)).
template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

template <typename T>
constexpr int VecWidth() {
  return 16 / static_cast<int>(sizeof(T));
}

inline bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace shardmap::cuda::kernels::ew

#endif  // SHARDMAP_TENSOR_CUDA_ELEMENTWISE_ELEMENTWISE_MATH_CUH_
