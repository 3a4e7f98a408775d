#include "tensor/cuda/kernels/kernel_util.cuh"
#include "tensor/cuda/reduce/reduce_kernels.h"

namespace shardmap::cuda::kernels {
namespace {

constexpr unsigned kFull = 0xffffffffu;
// Path choice: ChooseReducePath / ChooseArgMaxPath in reduce_kernels.h.

template <ReduceKind K, typename A>
__device__ __forceinline__ A Identity() {
  if constexpr (K == ReduceKind::kSum) return A(0);
  else if constexpr (K == ReduceKind::kMax) return A(-INFINITY);
  else return A(INFINITY);
}

// The CPU's fold: max keeps a NaN once seen (v > NaN is false), and takes any NaN it meets.
template <ReduceKind K, typename A>
__device__ __forceinline__ A Combine(A a, A b) {
  if constexpr (K == ReduceKind::kSum) return a + b;
  else if constexpr (K == ReduceKind::kMax) return (b > a || b != b) ? b : a;
  else return (b < a || b != b) ? b : a;
}

template <ReduceKind K, typename A>
__device__ __forceinline__ A WarpReduce(A v) {
  for (int o = 16; o > 0; o >>= 1) v = Combine<K>(v, __shfl_xor_sync(kFull, v, o));
  return v;
}

// Every thread of the block must call it; every thread gets the result. scratch: 32 values.
template <ReduceKind K, typename A>
__device__ __forceinline__ A BlockReduce(A v, A* scratch) {
  v = WarpReduce<K>(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x + 31) >> 5;
  v = lane < warps ? scratch[lane] : Identity<K, A>();
  v = WarpReduce<K>(v);
  __syncthreads();  // scratch may be reused right after
  return v;
}

template <ReduceKind K, typename A, typename Out>
__device__ __forceinline__ Out Finish(A v, A scale) {
  if constexpr (K == ReduceKind::kSum) return FromAcc<Out>(v * scale);
  else return FromAcc<Out>(v);
}

// inner == 1, short segments: warp w folds segment r = w of the [outer*nseg] segments.
template <ReduceKind K, typename In, typename Out>
__global__ void RowWarpKernel(const In* __restrict__ x, Out* __restrict__ out, int64_t rows,
                              int64_t nseg, int64_t n, int64_t seg_len, Acc<In> scale) {
  using A = Acc<In>;
  const int lane = threadIdx.x & 31;
  const int64_t first = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) >> 5;
  const int64_t step = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5;
  for (int64_t r = first; r < rows; r += step) {  // uniform across the warp
    const int64_t o = r / nseg, s = r - o * nseg;
    const int64_t begin = s * seg_len, end = begin + seg_len < n ? begin + seg_len : n;
    const In* p = x + o * n;
    A v = Identity<K, A>();
    for (int64_t k = begin + lane; k < end; k += 32) v = Combine<K>(v, ToAcc(p[k]));
    v = WarpReduce<K>(v);
    if (lane == 0) out[r] = Finish<K, A, Out>(v, scale);
  }
}

// inner == 1, long segments: block b folds segment r = b.
template <ReduceKind K, typename In, typename Out>
__global__ void RowBlockKernel(const In* __restrict__ x, Out* __restrict__ out, int64_t rows,
                               int64_t nseg, int64_t n, int64_t seg_len, Acc<In> scale) {
  using A = Acc<In>;
  __shared__ A scratch[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t o = r / nseg, s = r - o * nseg;
    const int64_t begin = s * seg_len, end = begin + seg_len < n ? begin + seg_len : n;
    const In* p = x + o * n;
    A v = Identity<K, A>();
    for (int64_t k = begin + threadIdx.x; k < end; k += blockDim.x) {
      v = Combine<K>(v, ToAcc(p[k]));
    }
    v = BlockReduce<K>(v, scratch);
    if (threadIdx.x == 0) out[r] = Finish<K, A, Out>(v, scale);
  }
}

// inner > 1 (or very short rows): a thread per output (o, s, i) folds its segment down the
// column; neighbouring threads read neighbouring i, so loads coalesce.
template <ReduceKind K, typename In, typename Out>
__global__ void ColumnKernel(const In* __restrict__ x, Out* __restrict__ out, int64_t total,
                             int64_t nseg, int64_t n, int64_t inner, int64_t seg_len,
                             Acc<In> scale) {
  using A = Acc<In>;
  SM_GRID_STRIDE_LOOP(t, total) {
    const int64_t rs = t / inner, i = t - rs * inner;
    const int64_t o = rs / nseg, s = rs - o * nseg;
    const int64_t begin = s * seg_len, end = begin + seg_len < n ? begin + seg_len : n;
    const In* p = x + o * n * inner + i;
    A v = Identity<K, A>();
    for (int64_t k = begin; k < end; ++k) v = Combine<K>(v, ToAcc(p[k * inner]));
    out[t] = Finish<K, A, Out>(v, scale);
  }
}

template <ReduceKind K, typename In, typename Out>
int LaunchKind(const void* xv, void* outv, int64_t outer, int64_t n, int64_t inner,
               int64_t seg_len, double scale, cudaStream_t s) {
  const In* x = static_cast<const In*>(xv);
  Out* out = static_cast<Out*>(outv);
  const int64_t nseg = (n + seg_len - 1) / seg_len;
  const Acc<In> sc = static_cast<Acc<In>>(scale);
  const ReducePath path = ChooseReducePath(inner, seg_len);
  if (path != ReducePath::kColumn) {
    const int64_t rows = outer * nseg;
    if (path == ReducePath::kRowWarp) {
      RowWarpKernel<K, In, Out><<<Blocks(rows * 32), kThreads, 0, s>>>(x, out, rows, nseg, n,
                                                                       seg_len, sc);
    } else {
      const int64_t blocks = rows < (1LL << 30) ? rows : (1LL << 30);
      RowBlockKernel<K, In, Out><<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(
          x, out, rows, nseg, n, seg_len, sc);
    }
  } else {
    const int64_t total = outer * nseg * inner;
    ColumnKernel<K, In, Out><<<Blocks(total), kThreads, 0, s>>>(x, out, total, nseg, n, inner,
                                                                seg_len, sc);
  }
  return cudaGetLastError();
}

template <typename In, typename Out>
int LaunchTyped(const void* x, void* out, ReduceKind kind, int64_t outer, int64_t n,
                int64_t inner, int64_t seg_len, double scale, cudaStream_t s) {
  switch (kind) {
    case ReduceKind::kSum:
      return LaunchKind<ReduceKind::kSum, In, Out>(x, out, outer, n, inner, seg_len, scale, s);
    case ReduceKind::kMax:
      return LaunchKind<ReduceKind::kMax, In, Out>(x, out, outer, n, inner, seg_len, scale, s);
    case ReduceKind::kMin:
      return LaunchKind<ReduceKind::kMin, In, Out>(x, out, outer, n, inner, seg_len, scale, s);
  }
  return cudaErrorInvalidValue;
}

// ---- ArgMax ----

// Is (vb, ib) a better argmax than (va, ia)? NaN beats numbers; among NaNs or equal values the
// lower index wins.
template <typename A>
__device__ __forceinline__ bool Better(A va, int64_t ia, A vb, int64_t ib) {
  const bool an = va != va, bn = vb != vb;
  if (an || bn) return bn && (!an || ib < ia);
  return vb > va || (vb == va && ib < ia);
}

template <typename A>
__device__ __forceinline__ void WarpArgMax(A& v, int64_t& i) {
  for (int o = 16; o > 0; o >>= 1) {
    const A ov = __shfl_xor_sync(kFull, v, o);
    const int64_t oi = __shfl_xor_sync(kFull, i, o);
    if (Better(v, i, ov, oi)) {
      v = ov;
      i = oi;
    }
  }
}

constexpr int64_t kNoIndex = INT64_MAX;  // loses every tie against a real index

template <typename T>
__global__ void ArgMaxRowWarpKernel(const T* __restrict__ x, int64_t* __restrict__ out,
                                    int64_t rows, int64_t n) {
  using A = Acc<T>;
  const int lane = threadIdx.x & 31;
  const int64_t first = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) >> 5;
  const int64_t step = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5;
  for (int64_t r = first; r < rows; r += step) {
    const T* p = x + r * n;
    A v = A(-INFINITY);
    int64_t best = kNoIndex;
    for (int64_t k = lane; k < n; k += 32) {
      const A w = ToAcc(p[k]);
      if (Better(v, best, w, k)) {
        v = w;
        best = k;
      }
    }
    WarpArgMax(v, best);
    if (lane == 0) out[r] = best;
  }
}

template <typename T>
__global__ void ArgMaxRowBlockKernel(const T* __restrict__ x, int64_t* __restrict__ out,
                                     int64_t rows, int64_t n) {
  using A = Acc<T>;
  __shared__ A sv[32];
  __shared__ int64_t si[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int warps = (blockDim.x + 31) >> 5;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* p = x + r * n;
    A v = A(-INFINITY);
    int64_t best = kNoIndex;
    for (int64_t k = threadIdx.x; k < n; k += blockDim.x) {
      const A w = ToAcc(p[k]);
      if (Better(v, best, w, k)) {
        v = w;
        best = k;
      }
    }
    WarpArgMax(v, best);
    if (lane == 0) {
      sv[warp] = v;
      si[warp] = best;
    }
    __syncthreads();
    if (warp == 0) {
      v = lane < warps ? sv[lane] : A(-INFINITY);
      best = lane < warps ? si[lane] : kNoIndex;
      WarpArgMax(v, best);
      if (lane == 0) out[r] = best;
    }
    __syncthreads();
  }
}

template <typename T>
__global__ void ArgMaxColumnKernel(const T* __restrict__ x, int64_t* __restrict__ out,
                                   int64_t total, int64_t n, int64_t inner) {
  using A = Acc<T>;
  SM_GRID_STRIDE_LOOP(t, total) {
    const int64_t o = t / inner, i = t - o * inner;
    const T* p = x + o * n * inner + i;
    A v = ToAcc(p[0]);
    int64_t best = 0;
    for (int64_t k = 1; k < n && v == v; ++k) {  // the first NaN wins
      const A w = ToAcc(p[k * inner]);
      if (w > v || w != w) {
        v = w;
        best = k;
      }
    }
    out[t] = best;
  }
}

}  // namespace

int LaunchReducePass(const void* x, DType in_dtype, void* out, DType out_dtype, ReduceKind kind,
                     int64_t outer, int64_t n, int64_t inner, int64_t seg_len, double scale,
                     void* stream) {
  if (outer <= 0 || inner <= 0) return cudaSuccess;
  if (n <= 0 || seg_len <= 0) return cudaErrorInvalidValue;
  const cudaStream_t s = AsStream(stream);
  if (in_dtype == out_dtype) {
    SM_DISPATCH_FLOAT(in_dtype, T, {
      return LaunchTyped<T, T>(x, out, kind, outer, n, inner, seg_len, scale, s);
    });
  }
  if (out_dtype == DType::kF32) {
    if (in_dtype == DType::kBF16) {
      return LaunchTyped<__nv_bfloat16, float>(x, out, kind, outer, n, inner, seg_len, scale, s);
    }
    if (in_dtype == DType::kF16) {
      return LaunchTyped<__half, float>(x, out, kind, outer, n, inner, seg_len, scale, s);
    }
  }
  if (in_dtype == DType::kF32) {
    if (out_dtype == DType::kBF16) {
      return LaunchTyped<float, __nv_bfloat16>(x, out, kind, outer, n, inner, seg_len, scale, s);
    }
    if (out_dtype == DType::kF16) {
      return LaunchTyped<float, __half>(x, out, kind, outer, n, inner, seg_len, scale, s);
    }
  }
  return cudaErrorInvalidValue;
}

int LaunchArgMax(const void* xv, DType dtype, int64_t* out, int64_t outer, int64_t n,
                 int64_t inner, void* stream) {
  if (outer <= 0 || inner <= 0) return cudaSuccess;
  if (n <= 0) return cudaErrorInvalidValue;
  const cudaStream_t s = AsStream(stream);
  SM_DISPATCH_FLOAT(dtype, T, {
    const T* x = static_cast<const T*>(xv);
    const ReducePath path = ChooseArgMaxPath(inner, n);
    if (path == ReducePath::kColumn) {
      const int64_t total = outer * inner;
      ArgMaxColumnKernel<T><<<Blocks(total), kThreads, 0, s>>>(x, out, total, n, inner);
    } else if (path == ReducePath::kRowWarp) {
      ArgMaxRowWarpKernel<T><<<Blocks(outer * 32), kThreads, 0, s>>>(x, out, outer, n);
    } else {
      const int64_t blocks = outer < (1LL << 30) ? outer : (1LL << 30);
      ArgMaxRowBlockKernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(x, out,
                                                                                 outer, n);
    }
  });
  return cudaGetLastError();
}

}  // namespace shardmap::cuda::kernels
