// Device helpers shared by the nn kernels (.cu files of tensor/cuda/nn only).
//
//   for (int64_t r = G::First(); r < rows; r += G::Stride()) {       // G = RowGroup<kWarp>
//     A s = 0;
//     for (int64_t j = G::Lane(); j < n; j += G::Size()) s += ToAcc(x[r * n + j]);
//     s = GroupSum<kWarp>(s);                                          // the row's sum, everywhere
//   }
//
// A "group" is the set of threads that owns one row: a warp (kWarp, rows <= 1024 elements) or
// the whole block. Loops over rows are grid-stride and uniform within a group, so the block-wide
// reductions (which __syncthreads) are reached by every thread of the block.
#ifndef SHARDMAP_TENSOR_CUDA_NN_NN_UTIL_CUH_
#define SHARDMAP_TENSOR_CUDA_NN_NN_UTIL_CUH_

#include <cstdint>

#include "tensor/cuda/kernels/kernel_util.cuh"

namespace shardmap::cuda::nn_kernels {

using kernels::Acc;
using kernels::AsStream;
using kernels::Blocks;
using kernels::FromAcc;
using kernels::kThreads;
using kernels::ToAcc;

constexpr int kMaxThreads = 1024;
constexpr int64_t kWarpRowMax = 1024;  // rows up to this length get a warp each

__device__ __forceinline__ float Exp(float v) { return expf(v); }
__device__ __forceinline__ double Exp(double v) { return exp(v); }
__device__ __forceinline__ float Log(float v) { return logf(v); }
__device__ __forceinline__ double Log(double v) { return log(v); }

template <typename A> __device__ __forceinline__ A NegInf() { return A(-INFINITY); }

// d rounded to float with round-to-odd, so a later RNE rounding to bf16/f16 is one correct
// rounding of d (the CPU Cast's DoubleToFloatRoundToOdd, tensor/ops/shape_ops.cc).
__device__ __forceinline__ float RoundToOdd(double d) {
  const float f = __double2float_rz(d);
  if (d != d || static_cast<double>(f) == d) return f;
  return __uint_as_float(__float_as_uint(f) | 1u);
}

// Converts an accumulator value to any element type, rounding once like the CPU Cast (half
// types from a double accumulator, e.g. an f64 LayerNorm's bf16 dgamma, go through
// round-to-odd: double -> float -> bf16 with RNE twice can differ in the last bit).
template <typename O, typename A>
__device__ __forceinline__ O StoreAs(A v) {
  if constexpr (sizeof(A) == 8 && sizeof(O) == 2) {
    return FromAcc<O>(RoundToOdd(v));
  } else {
    return FromAcc<O>(static_cast<Acc<O>>(v));
  }
}

template <bool kWarp>
struct RowGroup {
  __device__ static int64_t First() {
    return kWarp ? static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5)
                 : static_cast<int64_t>(blockIdx.x);
  }
  __device__ static int64_t Stride() {
    return kWarp ? static_cast<int64_t>(gridDim.x) * (blockDim.x >> 5)
                 : static_cast<int64_t>(gridDim.x);
  }
  __device__ static int Lane() { return kWarp ? static_cast<int>(threadIdx.x & 31) : threadIdx.x; }
  __device__ static int Size() { return kWarp ? 32 : static_cast<int>(blockDim.x); }
  // This group's slice of the dynamic shared memory: `arrays` rows of n values of A. A thread
  // only reads back the indices it wrote itself (the same j loop every pass), so no sync is
  // needed between the passes or between rows.
  template <typename A>
  __device__ static A* Cache(int64_t n, int arrays) {
    extern __shared__ __align__(16) unsigned char nn_shared[];
    const int64_t group = kWarp ? static_cast<int64_t>(threadIdx.x >> 5) : 0;
    return reinterpret_cast<A*>(nn_shared) + group * n * arrays;
  }
};

template <typename A>
__device__ __forceinline__ A WarpSum(A v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over the group; every thread of the group gets it.
template <bool kWarp, typename A>
__device__ __forceinline__ A GroupSum(A v) {
  v = WarpSum(v);
  if constexpr (!kWarp) {
    __shared__ A scratch[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    const int warps = (blockDim.x + 31) >> 5;
    v = WarpSum(lane < warps ? scratch[lane] : A(0));
    __syncthreads();
  }
  return v;
}

// Online softmax statistics: m = running max, s = sum of exp(x - m). An empty state is
// (-inf, 0); -inf inputs contribute nothing.
template <typename A>
__device__ __forceinline__ void OnlineAdd(A& m, A& s, A x) {
  if (x > m) {
    // x's own term is exp(x - x): 1, but NaN for x = +inf, like the CPU's exp(x - max) once
    // max is +inf (softmax and cross-entropy of a row holding +inf are then all NaN).
    s = s * Exp(m - x) + (x - x + A(1));
    m = x;
  } else if (m != NegInf<A>() || x != x) {
    // NaN x propagates through s (m never becomes NaN: NaN > m is false), also as the first
    // element of a lane, like the CPU's sum of exp(x - max) with a NaN x.
    s += Exp(x - m);
  }
}

template <typename A>
__device__ __forceinline__ void Combine(A& m, A& s, A m2, A s2) {
  // A side with m == -inf has s == 0 or s == NaN (a NaN input): s * 0 keeps that NaN.
  const A mn = fmax(m, m2);
  if (mn == NegInf<A>()) {
    s = s + s2;
    return;
  }
  s = (m == NegInf<A>() ? s * A(0) : s * Exp(m - mn)) +
      (m2 == NegInf<A>() ? s2 * A(0) : s2 * Exp(m2 - mn));
  m = mn;
}

template <typename A>
__device__ __forceinline__ void WarpMaxSum(A& m, A& s) {
  for (int o = 16; o > 0; o >>= 1) {
    const A m2 = __shfl_xor_sync(0xffffffffu, m, o);
    const A s2 = __shfl_xor_sync(0xffffffffu, s, o);
    Combine(m, s, m2, s2);
  }
}

// Combines the (m, s) of every thread of the group; every thread gets the result.
template <bool kWarp, typename A>
__device__ __forceinline__ void GroupMaxSum(A& m, A& s) {
  WarpMaxSum(m, s);
  if constexpr (!kWarp) {
    __shared__ A sm[32];
    __shared__ A ss[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) {
      sm[warp] = m;
      ss[warp] = s;
    }
    __syncthreads();
    const int warps = (blockDim.x + 31) >> 5;
    m = lane < warps ? sm[lane] : NegInf<A>();
    s = lane < warps ? ss[lane] : A(0);
    WarpMaxSum(m, s);
    __syncthreads();
  }
}

// Launch shape of a row kernel: a warp per row for short rows, else a block per row. With
// cache_arrays > 0 the kernel may keep that many copies of its row in shared memory (in A, of
// acc_size bytes) when they fit in kMaxCacheBytes: `cache` and `smem` say whether and how much.
struct RowLaunch {
  bool warp;
  bool cache;
  unsigned blocks;
  int threads;
  size_t smem;
};
// Below 48 KiB: the default dynamic limit is 48 KiB minus the kernel's static shared memory
// (GroupSum / GroupMaxSum scratch, <= 768 bytes), and a launch over it fails.
constexpr int64_t kMaxCacheBytes = 47 * 1024;
inline RowLaunch RowConfig(int64_t rows, int64_t n, int cache_arrays = 0, size_t acc_size = 4) {
  constexpr int64_t kMaxBlocks = int64_t{1} << 20;  // grid-stride beyond this
  RowLaunch l;
  l.warp = n <= kWarpRowMax;
  int64_t blocks;
  if (l.warp) {
    l.threads = kThreads;
    blocks = (rows + kThreads / 32 - 1) / (kThreads / 32);
  } else {
    l.threads = n >= 65536 ? kMaxThreads : 512;
    blocks = rows;
  }
  if (blocks < 1) blocks = 1;
  if (blocks > kMaxBlocks) blocks = kMaxBlocks;
  l.blocks = static_cast<unsigned>(blocks);
  const int64_t bytes = (l.warp ? l.threads / 32 : 1) * n * cache_arrays *
                        static_cast<int64_t>(acc_size);
  l.cache = bytes > 0 && bytes <= kMaxCacheBytes;
  l.smem = l.cache ? static_cast<size_t>(bytes) : 0;
  return l;
}

// Runs body with `constexpr bool kWarp` set from l.warp.
#define SM_ROW_DISPATCH(l, ...)                                \
  if ((l).warp) {                                              \
    constexpr bool kWarp = true;                               \
    __VA_ARGS__;                                               \
  } else {                                                     \
    constexpr bool kWarp = false;                              \
    __VA_ARGS__;                                               \
  }

// As SM_ROW_DISPATCH, also setting `constexpr bool kCache` from l.cache.
#define SM_ROW_CACHE_DISPATCH(l, ...)                          \
  if ((l).cache) {                                             \
    constexpr bool kCache = true;                              \
    SM_ROW_DISPATCH(l, __VA_ARGS__);                           \
  } else {                                                     \
    constexpr bool kCache = false;                             \
    SM_ROW_DISPATCH(l, __VA_ARGS__);                           \
  }

// Reads element i of an i32 or i64 index array.
__device__ __forceinline__ int64_t IndexAt(const void* ids, bool i64, int64_t i) {
  return i64 ? static_cast<const int64_t*>(ids)[i]
             : static_cast<int64_t>(static_cast<const int32_t*>(ids)[i]);
}

__device__ __forceinline__ void RecordBad(unsigned long long* bad, int64_t pos) {
  if (bad != nullptr) atomicMin(bad, static_cast<unsigned long long>(pos));
}

}  // namespace shardmap::cuda::nn_kernels

#endif  // SHARDMAP_TENSOR_CUDA_NN_NN_UTIL_CUH_
