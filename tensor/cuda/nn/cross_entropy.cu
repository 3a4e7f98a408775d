// Cross-entropy forward and backward kernels (see kernels.h). Rows are long (a vocabulary), so
// statistics are online: one read for (max, sum of exp), one more in the backward to write.
#include "tensor/cuda/nn/kernels.h"
#include "tensor/cuda/nn/nn_util.cuh"
#include "tensor/cuda/nn/vec_row.cuh"

namespace shardmap::cuda::nn_kernels {
namespace {

// The target of row r, or -1 (with the position recorded) when out of range; `ignored` is set
// for ignore_index. Every thread of the group reads the same value.
__device__ __forceinline__ int64_t RowTarget(const void* targets, bool i64, int64_t r, int64_t v,
                                             int64_t ignore_index, bool& ignored, bool lane0,
                                             unsigned long long* bad) {
  const int64_t t = IndexAt(targets, i64, r);
  ignored = t == ignore_index;
  if (ignored) return -1;
  if (t < 0 || t >= v) {
    if (lane0) RecordBad(bad, r);
    return -1;
  }
  return t;
}

// The group's online (max, sum of exp) of a row of v. kVec (f32/bf16/f16 rows that are 16-byte
// multiples at 16-byte aligned addresses): 16-byte loads.
template <typename T, bool kWarp, bool kVec>
__device__ __forceinline__ void RowStats(const T* __restrict__ row, int64_t v, Acc<T>& m,
                                         Acc<T>& s) {
  using G = RowGroup<kWarp>;
  if constexpr (kVec) {
    constexpr int V = VecWidth<T>();
    for (int64_t q = G::Lane(); q < v / V; q += G::Size()) {
      float e[V];
      LoadVec(row + q * V, e);
#pragma unroll
      for (int k = 0; k < V; ++k) OnlineAdd(m, s, e[k]);
    }
  } else {
    for (int64_t j = G::Lane(); j < v; j += G::Size()) OnlineAdd(m, s, ToAcc(row[j]));
  }
}

template <typename T, bool kWarp, bool kVec>
__global__ void __launch_bounds__(kWarp ? kThreads : kMaxThreads)
    CrossEntropyRows(const T* __restrict__ logits, const void* __restrict__ targets, bool i64,
                     Acc<T>* __restrict__ loss, int64_t rows, int64_t v, int64_t ignore_index,
                     unsigned long long* bad) {
  using A = Acc<T>;
  using G = RowGroup<kWarp>;
  for (int64_t r = G::First(); r < rows; r += G::Stride()) {
    bool ignored;
    const int64_t t = RowTarget(targets, i64, r, v, ignore_index, ignored, G::Lane() == 0, bad);
    if (t < 0) {  // uniform over the group
      if (G::Lane() == 0) loss[r] = 0;
      continue;
    }
    const T* row = logits + r * v;
    A m = NegInf<A>(), s = 0;
    RowStats<T, kWarp, kVec>(row, v, m, s);
    GroupMaxSum<kWarp>(m, s);
    // An all -inf row gives NaN, as on the CPU (-inf + log(0) - -inf).
    if (G::Lane() == 0) loss[r] = m + Log(s) - ToAcc(row[t]);
  }
}

template <typename T, bool kWarp, bool kVec>
__global__ void __launch_bounds__(kWarp ? kThreads : kMaxThreads)
    CrossEntropyBackwardRows(const T* __restrict__ logits, const void* __restrict__ targets,
                             bool i64, const Acc<T>* __restrict__ dloss, T* __restrict__ dx,
                             int64_t rows, int64_t v, int64_t ignore_index,
                             unsigned long long* bad) {
  using A = Acc<T>;
  using G = RowGroup<kWarp>;
  for (int64_t r = G::First(); r < rows; r += G::Stride()) {
    bool ignored;
    const int64_t t = RowTarget(targets, i64, r, v, ignore_index, ignored, G::Lane() == 0, bad);
    T* out = dx + r * v;
    if (t < 0) {
      for (int64_t j = G::Lane(); j < v; j += G::Size()) out[j] = FromAcc<T>(A(0));
      continue;
    }
    const T* row = logits + r * v;
    A m = NegInf<A>(), s = 0;
    RowStats<T, kWarp, kVec>(row, v, m, s);
    GroupMaxSum<kWarp>(m, s);
    const A dl = dloss[r], scale = dl / s;
    if constexpr (kVec) {
      constexpr int V = VecWidth<T>();
      for (int64_t q = G::Lane(); q < v / V; q += G::Size()) {
        float e[V];
        LoadVec(row + q * V, e);
#pragma unroll
        for (int k = 0; k < V; ++k) {
          const float p = Exp(e[k] - m) * scale;
          e[k] = q * V + k == t ? p - dl : p;
        }
        StoreVec(out + q * V, e);
      }
    } else {
      for (int64_t j = G::Lane(); j < v; j += G::Size()) {
        const A p = Exp(ToAcc(row[j]) - m) * scale;
        out[j] = FromAcc<T>(j == t ? p - dl : p);
      }
    }
  }
}

// Rows of v elements of elem_size bytes starting at 16-byte aligned a and b (b nullable) keep
// every row aligned when v * elem_size is a multiple of 16.
bool VecRows(const void* a, const void* b, int64_t v, size_t elem_size) {
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return (v * static_cast<int64_t>(elem_size)) % 16 == 0 && aligned(a) && aligned(b);
}

template <typename T>
int ForwardImpl(const T* pl, const void* targets, bool targets_i64, Acc<T>* ploss, int64_t rows,
                int64_t v, int64_t ignore_index, unsigned long long* bad, cudaStream_t s) {
  const RowLaunch l = RowConfig(rows, v);
  if constexpr (sizeof(T) != 8) {
    if (VecRows(pl, nullptr, v, sizeof(T))) {
      SM_ROW_DISPATCH(l, CrossEntropyRows<T, kWarp, true><<<l.blocks, l.threads, 0, s>>>(
                             pl, targets, targets_i64, ploss, rows, v, ignore_index, bad));
      return cudaGetLastError();
    }
  }
  SM_ROW_DISPATCH(l, CrossEntropyRows<T, kWarp, false><<<l.blocks, l.threads, 0, s>>>(
                         pl, targets, targets_i64, ploss, rows, v, ignore_index, bad));
  return cudaGetLastError();
}

template <typename T>
int BackwardImpl(const T* pl, const void* targets, bool targets_i64, const Acc<T>* pd, T* px,
                 int64_t rows, int64_t v, int64_t ignore_index, unsigned long long* bad,
                 cudaStream_t s) {
  const RowLaunch l = RowConfig(rows, v);
  if constexpr (sizeof(T) != 8) {
    if (VecRows(pl, px, v, sizeof(T))) {
      SM_ROW_DISPATCH(l, CrossEntropyBackwardRows<T, kWarp, true><<<l.blocks, l.threads, 0, s>>>(
                             pl, targets, targets_i64, pd, px, rows, v, ignore_index, bad));
      return cudaGetLastError();
    }
  }
  SM_ROW_DISPATCH(l, CrossEntropyBackwardRows<T, kWarp, false><<<l.blocks, l.threads, 0, s>>>(
                         pl, targets, targets_i64, pd, px, rows, v, ignore_index, bad));
  return cudaGetLastError();
}

}  // namespace

int LaunchCrossEntropy(const void* logits, DType dtype, const void* targets, bool targets_i64,
                       void* loss, int64_t rows, int64_t v, int64_t ignore_index,
                       unsigned long long* bad, void* stream) {
  if (rows == 0) return cudaSuccess;
  const cudaStream_t s = AsStream(stream);
  SM_DISPATCH_FLOAT(dtype, T, {
    return ForwardImpl<T>(static_cast<const T*>(logits), targets, targets_i64,
                          static_cast<Acc<T>*>(loss), rows, v, ignore_index, bad, s);
  });
  return cudaGetLastError();
}

int LaunchCrossEntropyBackward(const void* logits, DType dtype, const void* targets,
                               bool targets_i64, const void* dloss, void* dx, int64_t rows,
                               int64_t v, int64_t ignore_index, unsigned long long* bad,
                               void* stream) {
  if (rows == 0) return cudaSuccess;
  const cudaStream_t s = AsStream(stream);
  SM_DISPATCH_FLOAT(dtype, T, {
    return BackwardImpl<T>(static_cast<const T*>(logits), targets, targets_i64,
                           static_cast<const Acc<T>*>(dloss), static_cast<T*>(dx), rows, v,
                           ignore_index, bad, s);
  });
  return cudaGetLastError();
}

}  // namespace shardmap::cuda::nn_kernels
