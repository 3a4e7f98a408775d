// Softmax / log_softmax forward and backward kernels (see kernels.h).
#include "tensor/cuda/nn/kernels.h"
#include "tensor/cuda/nn/nn_util.cuh"

namespace shardmap::cuda::nn_kernels {
namespace {

// Last-dim rows: one pass for the online (max, sum of exp), one to write.
template <typename T, bool kWarp, bool kLog>
__global__ void __launch_bounds__(kWarp ? kThreads : kMaxThreads)
    SoftmaxRows(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int64_t n) {
  using A = Acc<T>;
  using G = RowGroup<kWarp>;
  for (int64_t r = G::First(); r < rows; r += G::Stride()) {
    const T* xr = x + r * n;
    T* yr = y + r * n;
    A m = NegInf<A>(), s = 0;
    for (int64_t j = G::Lane(); j < n; j += G::Size()) OnlineAdd(m, s, ToAcc(xr[j]));
    GroupMaxSum<kWarp>(m, s);
    if (m == NegInf<A>()) m = 0;  // an all -inf row: avoid inf - inf (as the CPU kernel)
    if (kLog) {
      const A lse = m + Log(s);
      for (int64_t j = G::Lane(); j < n; j += G::Size()) yr[j] = FromAcc<T>(ToAcc(xr[j]) - lse);
    } else {
      const A inv = A(1) / s;
      for (int64_t j = G::Lane(); j < n; j += G::Size()) {
        yr[j] = FromAcc<T>(Exp(ToAcc(xr[j]) - m) * inv);
      }
    }
  }
}

// Inner dims > 1: a thread per lane (consecutive threads read consecutive inner positions).
template <typename T, bool kLog>
__global__ void SoftmaxLanes(const T* __restrict__ x, T* __restrict__ y, int64_t outer, int64_t n,
                             int64_t inner) {
  using A = Acc<T>;
  SM_GRID_STRIDE_LOOP(lane, outer * inner) {
    const int64_t o = lane / inner, i = lane - o * inner;
    const T* xl = x + o * n * inner + i;
    T* yl = y + o * n * inner + i;
    A m = NegInf<A>(), s = 0;
    for (int64_t j = 0; j < n; ++j) OnlineAdd(m, s, ToAcc(xl[j * inner]));
    if (m == NegInf<A>()) m = 0;
    if (kLog) {
      const A lse = m + Log(s);
      for (int64_t j = 0; j < n; ++j) yl[j * inner] = FromAcc<T>(ToAcc(xl[j * inner]) - lse);
    } else {
      const A inv = A(1) / s;
      for (int64_t j = 0; j < n; ++j) {
        yl[j * inner] = FromAcc<T>(Exp(ToAcc(xl[j * inner]) - m) * inv);
      }
    }
  }
}

// dx = y * (dy - sum(dy * y)); log: dx = dy - exp(y) * sum(dy).
template <typename T, bool kLog>
__device__ __forceinline__ Acc<T> BackTerm(T y, T dy) {
  return kLog ? ToAcc(dy) : ToAcc(dy) * ToAcc(y);
}
template <typename T, bool kLog>
__device__ __forceinline__ T BackOut(T y, T dy, Acc<T> sum) {
  return kLog ? FromAcc<T>(ToAcc(dy) - Exp(ToAcc(y)) * sum)
              : FromAcc<T>(ToAcc(y) * (ToAcc(dy) - sum));
}

template <typename T, bool kWarp, bool kLog>
__global__ void __launch_bounds__(kWarp ? kThreads : kMaxThreads)
    SoftmaxBackwardRows(const T* __restrict__ y, const T* __restrict__ dy, T* __restrict__ dx,
                        int64_t rows, int64_t n) {
  using A = Acc<T>;
  using G = RowGroup<kWarp>;
  for (int64_t r = G::First(); r < rows; r += G::Stride()) {
    const T* yr = y + r * n;
    const T* gr = dy + r * n;
    T* xr = dx + r * n;
    A acc = 0;
    for (int64_t j = G::Lane(); j < n; j += G::Size()) acc += BackTerm<T, kLog>(yr[j], gr[j]);
    acc = GroupSum<kWarp>(acc);
    for (int64_t j = G::Lane(); j < n; j += G::Size()) xr[j] = BackOut<T, kLog>(yr[j], gr[j], acc);
  }
}

template <typename T, bool kLog>
__global__ void SoftmaxBackwardLanes(const T* __restrict__ y, const T* __restrict__ dy,
                                     T* __restrict__ dx, int64_t outer, int64_t n,
                                     int64_t inner) {
  using A = Acc<T>;
  SM_GRID_STRIDE_LOOP(lane, outer * inner) {
    const int64_t o = lane / inner, i = lane - o * inner, b = o * n * inner + i;
    A acc = 0;
    for (int64_t j = 0; j < n; ++j) acc += BackTerm<T, kLog>(y[b + j * inner], dy[b + j * inner]);
    for (int64_t j = 0; j < n; ++j) {
      dx[b + j * inner] = BackOut<T, kLog>(y[b + j * inner], dy[b + j * inner], acc);
    }
  }
}

template <typename T, bool kLog>
void Forward(const void* x, void* y, int64_t outer, int64_t n, int64_t inner, cudaStream_t s) {
  const T* px = static_cast<const T*>(x);
  T* py = static_cast<T*>(y);
  if (inner == 1) {
    const RowLaunch l = RowConfig(outer, n);
    SM_ROW_DISPATCH(l, SoftmaxRows<T, kWarp, kLog><<<l.blocks, l.threads, 0, s>>>(px, py, outer, n));
  } else {
    SoftmaxLanes<T, kLog><<<Blocks(outer * inner), kThreads, 0, s>>>(px, py, outer, n, inner);
  }
}

template <typename T, bool kLog>
void Backward(const void* y, const void* dy, void* dx, int64_t outer, int64_t n, int64_t inner,
              cudaStream_t s) {
  const T* py = static_cast<const T*>(y);
  const T* pg = static_cast<const T*>(dy);
  T* px = static_cast<T*>(dx);
  if (inner == 1) {
    const RowLaunch l = RowConfig(outer, n);
    SM_ROW_DISPATCH(l, SoftmaxBackwardRows<T, kWarp, kLog>
                    <<<l.blocks, l.threads, 0, s>>>(py, pg, px, outer, n));
  } else {
    SoftmaxBackwardLanes<T, kLog>
        <<<Blocks(outer * inner), kThreads, 0, s>>>(py, pg, px, outer, n, inner);
  }
}

}  // namespace

int LaunchSoftmax(const void* x, void* y, DType dtype, int64_t outer, int64_t n, int64_t inner,
                  bool log, void* stream) {
  if (outer * n * inner == 0) return cudaSuccess;
  const cudaStream_t s = AsStream(stream);
  SM_DISPATCH_FLOAT(dtype, T, {
    if (log) {
      Forward<T, true>(x, y, outer, n, inner, s);
    } else {
      Forward<T, false>(x, y, outer, n, inner, s);
    }
  });
  return cudaGetLastError();
}

int LaunchSoftmaxBackward(const void* y, const void* dy, void* dx, DType dtype, int64_t outer,
                          int64_t n, int64_t inner, bool log, void* stream) {
  if (outer * n * inner == 0) return cudaSuccess;
  const cudaStream_t s = AsStream(stream);
  SM_DISPATCH_FLOAT(dtype, T, {
    if (log) {
      Backward<T, true>(y, dy, dx, outer, n, inner, s);
    } else {
      Backward<T, false>(y, dy, dx, outer, n, inner, s);
    }
  });
  return cudaGetLastError();
}

}  // namespace shardmap::cuda::nn_kernels
