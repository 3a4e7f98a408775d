// Softmax / log_softmax forward and backward kernels (see kernels.h).
#include "tensor/cuda/nn/kernels.h"
#include "tensor/cuda/nn/nn_util.cuh"

namespace shardmap::cuda::nn_kernels {
namespace {

// Last-dim rows: one pass for the online (max, sum of exp), one to write. kCache: the row is
// kept in shared memory between the passes (else re-read from global memory).
template <typename T, bool kWarp, bool kCache, bool kLog>
__global__ void __launch_bounds__(kWarp ? kThreads : kMaxThreads)
    SoftmaxRows(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int64_t n) {
  using A = Acc<T>;
  using G = RowGroup<kWarp>;
  A* cache = kCache ? G::template Cache<A>(n, 1) : nullptr;
  for (int64_t r = G::First(); r < rows; r += G::Stride()) {
    const T* xr = x + r * n;
    T* yr = y + r * n;
    A m = NegInf<A>(), s = 0;
    for (int64_t j = G::Lane(); j < n; j += G::Size()) {
      const A v = ToAcc(xr[j]);
      if (kCache) cache[j] = v;
      OnlineAdd(m, s, v);
    }
    GroupMaxSum<kWarp>(m, s);
    if (m == NegInf<A>()) m = 0;  // an all -inf row: avoid inf - inf (as the CPU kernel)
    if (kLog) {
      const A lse = m + Log(s);
      for (int64_t j = G::Lane(); j < n; j += G::Size()) {
        yr[j] = FromAcc<T>((kCache ? cache[j] : ToAcc(xr[j])) - lse);
      }
    } else {
      const A inv = A(1) / s;
      for (int64_t j = G::Lane(); j < n; j += G::Size()) {
        yr[j] = FromAcc<T>(Exp((kCache ? cache[j] : ToAcc(xr[j])) - m) * inv);
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
template <bool kLog, typename A>
__device__ __forceinline__ A BackTerm(A y, A dy) {
  return kLog ? dy : dy * y;
}
template <typename T, bool kLog, typename A>
__device__ __forceinline__ T BackOut(A y, A dy, A sum) {
  return kLog ? FromAcc<T>(dy - Exp(y) * sum) : FromAcc<T>(y * (dy - sum));
}

// kCache: y and dy are kept in shared memory between the two passes.
template <typename T, bool kWarp, bool kCache, bool kLog>
__global__ void __launch_bounds__(kWarp ? kThreads : kMaxThreads)
    SoftmaxBackwardRows(const T* __restrict__ y, const T* __restrict__ dy, T* __restrict__ dx,
                        int64_t rows, int64_t n) {
  using A = Acc<T>;
  using G = RowGroup<kWarp>;
  A* cy = kCache ? G::template Cache<A>(n, 2) : nullptr;
  A* cg = kCache ? cy + n : nullptr;
  for (int64_t r = G::First(); r < rows; r += G::Stride()) {
    const T* yr = y + r * n;
    const T* gr = dy + r * n;
    T* xr = dx + r * n;
    A acc = 0;
    for (int64_t j = G::Lane(); j < n; j += G::Size()) {
      const A vy = ToAcc(yr[j]), vg = ToAcc(gr[j]);
      if (kCache) {
        cy[j] = vy;
        cg[j] = vg;
      }
      acc += BackTerm<kLog>(vy, vg);
    }
    acc = GroupSum<kWarp>(acc);
    for (int64_t j = G::Lane(); j < n; j += G::Size()) {
      const A vy = kCache ? cy[j] : ToAcc(yr[j]), vg = kCache ? cg[j] : ToAcc(gr[j]);
      xr[j] = BackOut<T, kLog>(vy, vg, acc);
    }
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
    for (int64_t j = 0; j < n; ++j) {
      acc += BackTerm<kLog>(ToAcc(y[b + j * inner]), ToAcc(dy[b + j * inner]));
    }
    for (int64_t j = 0; j < n; ++j) {
      dx[b + j * inner] =
          BackOut<T, kLog>(ToAcc(y[b + j * inner]), ToAcc(dy[b + j * inner]), acc);
    }
  }
}

// Causal softmax of rows [mats * s, t]: row r sees its first n = clamp(r % s + offset + 1, 0, t)
// entries, so only those are read (about half of a square score matrix); the rest is written as
// zeros, and a row with no visible entry is all zeros (the CPU kernel's result). One kernel for
// every offset, instead of mask, softmax and mask again.
template <typename T, bool kWarp, bool kCache>
__global__ void __launch_bounds__(kWarp ? kThreads : kMaxThreads)
    CausalSoftmaxRows(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int64_t s_len,
                      int64_t t, int64_t offset) {
  using A = Acc<T>;
  using G = RowGroup<kWarp>;
  A* cache = kCache ? G::template Cache<A>(t, 1) : nullptr;
  for (int64_t r = G::First(); r < rows; r += G::Stride()) {
    const T* xr = x + r * t;
    T* yr = y + r * t;
    int64_t n = r % s_len + offset + 1;
    n = n < 0 ? 0 : (n > t ? t : n);
    A m = NegInf<A>(), sum = 0;
    for (int64_t j = G::Lane(); j < n; j += G::Size()) {
      const A v = ToAcc(xr[j]);
      if (kCache) cache[j] = v;
      OnlineAdd(m, sum, v);
    }
    GroupMaxSum<kWarp>(m, sum);
    if (m == NegInf<A>()) m = 0;  // an all -inf row: avoid inf - inf (as the CPU kernel)
    const A inv = A(1) / sum;
    for (int64_t j = G::Lane(); j < t; j += G::Size()) {
      yr[j] = j < n ? FromAcc<T>(Exp((kCache ? cache[j] : ToAcc(xr[j])) - m) * inv)
                    : FromAcc<T>(A(0));
    }
  }
}

template <typename T, bool kLog>
void Forward(const void* x, void* y, int64_t outer, int64_t n, int64_t inner, cudaStream_t s) {
  const T* px = static_cast<const T*>(x);
  T* py = static_cast<T*>(y);
  if (inner == 1) {
    const RowLaunch l = RowConfig(outer, n, 1, sizeof(Acc<T>));
    SM_ROW_CACHE_DISPATCH(l, SoftmaxRows<T, kWarp, kCache, kLog>
                          <<<l.blocks, l.threads, l.smem, s>>>(px, py, outer, n));
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
    const RowLaunch l = RowConfig(outer, n, 2, sizeof(Acc<T>));
    SM_ROW_CACHE_DISPATCH(l, SoftmaxBackwardRows<T, kWarp, kCache, kLog>
                          <<<l.blocks, l.threads, l.smem, s>>>(py, pg, px, outer, n));
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

int LaunchCausalSoftmax(const void* x, void* y, DType dtype, int64_t mats, int64_t s_len,
                        int64_t t, int64_t offset, void* stream) {
  const int64_t rows = mats * s_len;
  if (rows * t == 0) return cudaSuccess;
  const cudaStream_t s = AsStream(stream);
  SM_DISPATCH_FLOAT(dtype, T, {
    const RowLaunch l = RowConfig(rows, t, 1, sizeof(Acc<T>));
    const T* px = static_cast<const T*>(x);
    T* py = static_cast<T*>(y);
    SM_ROW_CACHE_DISPATCH(l, CausalSoftmaxRows<T, kWarp, kCache>
                          <<<l.blocks, l.threads, l.smem, s>>>(px, py, rows, s_len, t, offset));
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
