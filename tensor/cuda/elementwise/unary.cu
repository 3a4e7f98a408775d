// Unary elementwise kernels: y[i] = f(x[i], scalar), 16-byte vector loads/stores when aligned.
#include "tensor/cuda/elementwise/elementwise_kernels.h"
#include "tensor/cuda/elementwise/elementwise_math.cuh"
#include "tensor/cuda/kernels/kernel_util.cuh"

namespace shardmap::cuda::kernels {
namespace {

using ew::Pack;

template <typename T, int N, typename F>
__global__ void UnaryKernel(const T* x, T* y, int64_t n, Acc<T> s, F f) {
  using P = Pack<T, N>;
  const int64_t nv = n / N;
  const P* xv = reinterpret_cast<const P*>(x);
  P* yv = reinterpret_cast<P*>(y);
  SM_GRID_STRIDE_LOOP(i, nv) {
    const P v = xv[i];
    P r;
#pragma unroll
    for (int k = 0; k < N; ++k) r.v[k] = FromAcc<T>(f(ToAcc(v.v[k]), s));
    yv[i] = r;
  }
  const int64_t done = nv * N;
  SM_GRID_STRIDE_LOOP(i, n - done) { y[done + i] = FromAcc<T>(f(ToAcc(x[done + i]), s)); }
}

template <typename F>
int Dispatch(const void* xp, void* yp, int64_t n, DType dtype, double scalar, void* stream,
             F f) {
  SM_DISPATCH_FLOAT(dtype, T, {
    const T* x = static_cast<const T*>(xp);
    T* y = static_cast<T*>(yp);
    const Acc<T> s = static_cast<Acc<T>>(scalar);
    constexpr int N = ew::VecWidth<T>();
    if (ew::Aligned16(x) && ew::Aligned16(y)) {
      UnaryKernel<T, N><<<Blocks((n + N - 1) / N), kThreads, 0, AsStream(stream)>>>(x, y, n, s,
                                                                                    f);
    } else {
      UnaryKernel<T, 1><<<Blocks(n), kThreads, 0, AsStream(stream)>>>(x, y, n, s, f);
    }
  });
  return cudaGetLastError();
}

}  // namespace

int LaunchUnary(UnaryOp op, const void* x, void* y, int64_t n, DType dtype, double scalar,
                void* stream) {
  if (n == 0) return cudaSuccess;
  switch (op) {
    case UnaryOp::kAddScalar: return Dispatch(x, y, n, dtype, scalar, stream, ew::AddScalarF{});
    case UnaryOp::kMulScalar: return Dispatch(x, y, n, dtype, scalar, stream, ew::MulScalarF{});
    case UnaryOp::kNeg: return Dispatch(x, y, n, dtype, scalar, stream, ew::NegF{});
    case UnaryOp::kExp: return Dispatch(x, y, n, dtype, scalar, stream, ew::ExpF{});
    case UnaryOp::kLog: return Dispatch(x, y, n, dtype, scalar, stream, ew::LogF{});
    case UnaryOp::kTanh: return Dispatch(x, y, n, dtype, scalar, stream, ew::TanhF{});
    case UnaryOp::kRelu: return Dispatch(x, y, n, dtype, scalar, stream, ew::ReluF{});
    case UnaryOp::kSqrt: return Dispatch(x, y, n, dtype, scalar, stream, ew::SqrtF{});
    case UnaryOp::kGeluTanh: return Dispatch(x, y, n, dtype, scalar, stream, ew::GeluTanhF{});
    case UnaryOp::kGeluErf: return Dispatch(x, y, n, dtype, scalar, stream, ew::GeluErfF{});
    case UnaryOp::kSilu: return Dispatch(x, y, n, dtype, scalar, stream, ew::SiluF{});
  }
  return cudaErrorInvalidValue;
}

}  // namespace shardmap::cuda::kernels
