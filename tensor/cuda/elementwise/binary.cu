// Binary elementwise kernels with NumPy broadcasting. Paths, fastest first:
//   equal shapes             out[i] = f(a[i], b[i])             16-byte vector loads/stores
//   one operand a scalar     out[i] = f(a[i], s) / f(s, b[i])   vector loads/stores
//   trailing (bias) [m,n]+[n] out[i] = f(a[i], b[i % n])         vector when n allows
//   anything else            per-element index math over <= 8 collapsed dims (32-bit when
//                            the output has < 2^32 elements)
#include "tensor/cuda/elementwise/elementwise_kernels.h"
#include "tensor/cuda/elementwise/elementwise_math.cuh"
#include "tensor/cuda/kernels/kernel_util.cuh"

namespace shardmap::cuda::kernels {
namespace {

using ew::Pack;

// Equal shapes (and broadcasts whose collapsed form is 1-D with both strides 1), N-wide packs.
template <typename T, int N, typename F>
__global__ void BinarySameKernel(const T* a, const T* b, T* out, int64_t n, F f) {
  using P = Pack<T, N>;
  const int64_t nv = n / N;
  const P* av = reinterpret_cast<const P*>(a);
  const P* bv = reinterpret_cast<const P*>(b);
  P* ov = reinterpret_cast<P*>(out);
  SM_GRID_STRIDE_LOOP(i, nv) {
    const P x = av[i], y = bv[i];
    P r;
#pragma unroll
    for (int k = 0; k < N; ++k) r.v[k] = FromAcc<T>(f(ToAcc(x.v[k]), ToAcc(y.v[k])));
    ov[i] = r;
  }
  const int64_t done = nv * N;
  SM_GRID_STRIDE_LOOP(i, n - done) {
    out[done + i] = FromAcc<T>(f(ToAcc(a[done + i]), ToAcc(b[done + i])));
  }
}

// One operand is a single element: SCALAR_A ? f(s, b[i]) : f(a[i], s).
template <typename T, int N, bool SCALAR_A, typename F>
__global__ void BinaryScalarKernel(const T* a, const T* b, T* out, int64_t n, F f) {
  using P = Pack<T, N>;
  const auto s = ToAcc(SCALAR_A ? a[0] : b[0]);
  const T* full = SCALAR_A ? b : a;
  const int64_t nv = n / N;
  const P* fv = reinterpret_cast<const P*>(full);
  P* ov = reinterpret_cast<P*>(out);
  SM_GRID_STRIDE_LOOP(i, nv) {
    const P x = fv[i];
    P r;
#pragma unroll
    for (int k = 0; k < N; ++k) {
      r.v[k] = FromAcc<T>(SCALAR_A ? f(s, ToAcc(x.v[k])) : f(ToAcc(x.v[k]), s));
    }
    ov[i] = r;
  }
  const int64_t done = nv * N;
  SM_GRID_STRIDE_LOOP(i, n - done) {
    const auto x = ToAcc(full[done + i]);
    out[done + i] = FromAcc<T>(SCALAR_A ? f(s, x) : f(x, s));
  }
}

// [m, inner] op [inner] (ROW_A: the [inner] operand is a instead of b). N divides inner.
template <typename T, int N, bool ROW_A, typename F>
__global__ void BinaryRowKernel(const T* a, const T* b, T* out, int64_t n, int64_t inner, F f) {
  using P = Pack<T, N>;
  const int64_t nv = n / N, inner_v = inner / N;
  const P* av = reinterpret_cast<const P*>(a);
  const P* bv = reinterpret_cast<const P*>(b);
  P* ov = reinterpret_cast<P*>(out);
  const bool small = nv <= static_cast<int64_t>(UINT32_MAX);  // 32-bit modulo: much cheaper
  SM_GRID_STRIDE_LOOP(i, nv) {
    const int64_t j = small ? static_cast<int64_t>(static_cast<uint32_t>(i) %
                                                   static_cast<uint32_t>(inner_v))
                            : i % inner_v;
    const P x = ROW_A ? av[j] : av[i], y = ROW_A ? bv[i] : bv[j];
    P r;
#pragma unroll
    for (int k = 0; k < N; ++k) r.v[k] = FromAcc<T>(f(ToAcc(x.v[k]), ToAcc(y.v[k])));
    ov[i] = r;
  }
}

// Collapsed dims innermost first, for the general kernel.
template <typename I>
struct Dims {
  int rank;
  I sizes[kMaxBroadcastRank];
  I a_strides[kMaxBroadcastRank];
  I b_strides[kMaxBroadcastRank];
};

template <typename T, typename I, typename F>
__global__ void BinaryBroadcastKernel(const T* a, const T* b, T* out, int64_t n, Dims<I> d, F f) {
  SM_GRID_STRIDE_LOOP(i, n) {
    I rem = static_cast<I>(i), oa = 0, ob = 0;
#pragma unroll
    for (int k = 0; k < kMaxBroadcastRank; ++k) {
      if (k == d.rank) break;
      const I q = rem / d.sizes[k];
      const I idx = rem - q * d.sizes[k];
      rem = q;
      oa += idx * d.a_strides[k];
      ob += idx * d.b_strides[k];
    }
    out[i] = FromAcc<T>(f(ToAcc(a[oa]), ToAcc(b[ob])));
  }
}

template <typename I>
Dims<I> Reverse(const BroadcastDims& in) {
  Dims<I> d{};
  d.rank = in.rank;
  for (int k = 0; k < in.rank; ++k) {
    const int src = in.rank - 1 - k;
    d.sizes[k] = static_cast<I>(in.sizes[src]);
    d.a_strides[k] = static_cast<I>(in.a_strides[src]);
    d.b_strides[k] = static_cast<I>(in.b_strides[src]);
  }
  return d;
}

template <typename T, typename F>
void Same(const T* a, const T* b, T* out, int64_t n, cudaStream_t s, F f) {
  constexpr int N = ew::VecWidth<T>();
  if (ew::Aligned16(a) && ew::Aligned16(b) && ew::Aligned16(out)) {
    BinarySameKernel<T, N><<<Blocks((n + N - 1) / N), kThreads, 0, s>>>(a, b, out, n, f);
  } else {
    BinarySameKernel<T, 1><<<Blocks(n), kThreads, 0, s>>>(a, b, out, n, f);
  }
}

template <typename T, bool SCALAR_A, typename F>
void Scalar(const T* a, const T* b, T* out, int64_t n, cudaStream_t s, F f) {
  constexpr int N = ew::VecWidth<T>();
  if (ew::Aligned16(SCALAR_A ? b : a) && ew::Aligned16(out)) {
    BinaryScalarKernel<T, N, SCALAR_A><<<Blocks((n + N - 1) / N), kThreads, 0, s>>>(a, b, out,
                                                                                    n, f);
  } else {
    BinaryScalarKernel<T, 1, SCALAR_A><<<Blocks(n), kThreads, 0, s>>>(a, b, out, n, f);
  }
}

template <typename T, bool ROW_A, typename F>
void Row(const T* a, const T* b, T* out, int64_t n, int64_t inner, cudaStream_t s, F f) {
  constexpr int N = ew::VecWidth<T>();
  if (inner % N == 0 && ew::Aligned16(a) && ew::Aligned16(b) && ew::Aligned16(out)) {
    BinaryRowKernel<T, N, ROW_A><<<Blocks(n / N), kThreads, 0, s>>>(a, b, out, n, inner, f);
  } else {
    BinaryRowKernel<T, 1, ROW_A><<<Blocks(n), kThreads, 0, s>>>(a, b, out, n, inner, f);
  }
}

template <typename T, typename F>
void Run(const T* a, const T* b, T* out, int64_t n, const BroadcastDims* dims, cudaStream_t s,
         F f) {
  switch (ClassifyBroadcast(dims)) {
    case BinaryPath::kSame: Same(a, b, out, n, s, f); return;
    case BinaryPath::kScalarA: Scalar<T, true>(a, b, out, n, s, f); return;
    case BinaryPath::kScalarB: Scalar<T, false>(a, b, out, n, s, f); return;
    case BinaryPath::kRowA: Row<T, true>(a, b, out, n, dims->sizes[1], s, f); return;
    case BinaryPath::kRowB: Row<T, false>(a, b, out, n, dims->sizes[1], s, f); return;
    case BinaryPath::kGeneral: break;
  }
  const BroadcastDims& d = *dims;
  if (n <= static_cast<int64_t>(UINT32_MAX)) {
    BinaryBroadcastKernel<T, uint32_t><<<Blocks(n), kThreads, 0, s>>>(a, b, out, n,
                                                                      Reverse<uint32_t>(d), f);
  } else {
    BinaryBroadcastKernel<T, int64_t><<<Blocks(n), kThreads, 0, s>>>(a, b, out, n,
                                                                     Reverse<int64_t>(d), f);
  }
}

template <typename F>
int Dispatch(const void* a, const void* b, void* out, int64_t n, DType dtype,
             const BroadcastDims* dims, void* stream, F f) {
  SM_DISPATCH_FLOAT(dtype, T, {
    Run(static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(out), n, dims,
        AsStream(stream), f);
  });
  return cudaGetLastError();
}

// Backward ops only ever see equal shapes: no broadcast kernels for them.
template <typename F>
int DispatchSame(const void* a, const void* b, void* out, int64_t n, DType dtype,
                 const BroadcastDims* dims, void* stream, F f) {
  if (dims != nullptr) return cudaErrorInvalidValue;
  SM_DISPATCH_FLOAT(dtype, T, {
    Same(static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(out), n,
         AsStream(stream), f);
  });
  return cudaGetLastError();
}

}  // namespace

int LaunchBinary(BinaryOp op, const void* a, const void* b, void* out, int64_t n, DType dtype,
                 const BroadcastDims* dims, void* stream) {
  if (n == 0) return cudaSuccess;
  if (dims != nullptr && dims->rank > kMaxBroadcastRank) return cudaErrorInvalidValue;
  switch (op) {
    case BinaryOp::kAdd: return Dispatch(a, b, out, n, dtype, dims, stream, ew::AddF{});
    case BinaryOp::kSub: return Dispatch(a, b, out, n, dtype, dims, stream, ew::SubF{});
    case BinaryOp::kMul: return Dispatch(a, b, out, n, dtype, dims, stream, ew::MulF{});
    case BinaryOp::kDiv: return Dispatch(a, b, out, n, dtype, dims, stream, ew::DivF{});
    case BinaryOp::kReluGrad:
      return DispatchSame(a, b, out, n, dtype, dims, stream, ew::ReluGradF{});
    case BinaryOp::kGeluTanhGrad:
      return DispatchSame(a, b, out, n, dtype, dims, stream, ew::GeluTanhGradF{});
    case BinaryOp::kGeluErfGrad:
      return DispatchSame(a, b, out, n, dtype, dims, stream, ew::GeluErfGradF{});
    case BinaryOp::kSiluGrad:
      return DispatchSame(a, b, out, n, dtype, dims, stream, ew::SiluGradF{});
    case BinaryOp::kTanhGrad:
      return DispatchSame(a, b, out, n, dtype, dims, stream, ew::TanhGradF{});
  }
  return cudaErrorInvalidValue;
}

}  // namespace shardmap::cuda::kernels
