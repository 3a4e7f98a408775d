// Register-resident softmax / log_softmax over the last dim, forward and backward, for f32 /
// bf16 / f16 rows of up to 8192 elements (the norm kernels' plan, norm_plan.h): the row is read
// once with 16-byte loads, its max and sum of exponentials come from registers, the output is
// written with 16-byte stores.
#include "tensor/cuda/nn/kernels.h"
#include "tensor/cuda/nn/nn_util.cuh"
#include "tensor/cuda/nn/norm_plan.h"
#include "tensor/cuda/nn/vec_row.cuh"

namespace shardmap::cuda::nn_kernels {
namespace {

// As SoftmaxRows (softmax.cu): m = the row's max (0 for an all -inf row), s = sum exp(x - m);
// a NaN or +inf entry makes s (and so the row) NaN, like the CPU kernel.
template <typename T, bool kLog, int kTpr, int kVecs>
__global__ void __launch_bounds__(kTpr > 128 ? kTpr : 128)
    SoftmaxForwardVec(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int n) {
  constexpr int V = VecWidth<T>();
  constexpr int kRowsPerBlock = (kTpr > 128 ? kTpr : 128) / kTpr;
  const int lane = static_cast<int>(threadIdx.x) % kTpr;
  const int slot = static_cast<int>(threadIdx.x) / kTpr;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + slot; r < rows;
       r += static_cast<int64_t>(gridDim.x) * kRowsPerBlock) {
    float v[kVecs][V];
    float m = -INFINITY;
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
      const int j = (i * kTpr + lane) * V;
      if (j < n) {
        LoadVec(x + r * n + j, v[i]);
#pragma unroll
        for (int e = 0; e < V; ++e) m = v[i][e] > m ? v[i][e] : m;
      }
    }
    m = RowMax<kTpr>(m);
    if (m == -INFINITY) m = 0;  // an all -inf row: avoid inf - inf (as the CPU kernel)
    float s = 0;
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
      if ((i * kTpr + lane) * V < n) {
#pragma unroll
        for (int e = 0; e < V; ++e) s += expf(v[i][e] - m);
      }
    }
    s = RowSum<kTpr>(s);
    const float lse = m + logf(s), inv = 1.0f / s;
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
      const int j = (i * kTpr + lane) * V;
      if (j < n) {
        float o[V];
#pragma unroll
        for (int e = 0; e < V; ++e) o[e] = kLog ? v[i][e] - lse : expf(v[i][e] - m) * inv;
        StoreVec(y + r * n + j, o);
      }
    }
  }
}

// dx = y * (dy - sum(dy * y)); log: dx = dy - exp(y) * sum(dy).
template <typename T, bool kLog, int kTpr, int kVecs>
__global__ void __launch_bounds__(kTpr > 128 ? kTpr : 128)
    SoftmaxBackwardVec(const T* __restrict__ y, const T* __restrict__ dy, T* __restrict__ dx,
                       int64_t rows, int n) {
  constexpr int V = VecWidth<T>();
  constexpr int kRowsPerBlock = (kTpr > 128 ? kTpr : 128) / kTpr;
  const int lane = static_cast<int>(threadIdx.x) % kTpr;
  const int slot = static_cast<int>(threadIdx.x) / kTpr;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + slot; r < rows;
       r += static_cast<int64_t>(gridDim.x) * kRowsPerBlock) {
    float yv[kVecs][V], gv[kVecs][V];
    float acc = 0;
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
      const int j = (i * kTpr + lane) * V;
      if (j < n) {
        LoadVec(y + r * n + j, yv[i]);
        LoadVec(dy + r * n + j, gv[i]);
#pragma unroll
        for (int e = 0; e < V; ++e) acc += kLog ? gv[i][e] : gv[i][e] * yv[i][e];
      }
    }
    acc = RowSum<kTpr>(acc);
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
      const int j = (i * kTpr + lane) * V;
      if (j < n) {
        float o[V];
#pragma unroll
        for (int e = 0; e < V; ++e) {
          o[e] = kLog ? gv[i][e] - expf(yv[i][e]) * acc : yv[i][e] * (gv[i][e] - acc);
        }
        StoreVec(dx + r * n + j, o);
      }
    }
  }
}

}  // namespace

int LaunchSoftmaxVec(const void* x, void* y, DType dtype, int64_t rows, int64_t n, bool log,
                     void* stream) {
  if (rows == 0) return cudaSuccess;
  const VecNormPlan p = PlanVecNorm(n, static_cast<int>(DTypeSize(dtype)));
  if (!p.ok) return cudaErrorInvalidValue;
  const cudaStream_t s = AsStream(stream);
  const unsigned blocks = static_cast<unsigned>(VecNormBlocks(p, rows));
  const int ni = static_cast<int>(n);
  SM_VEC_NORM_TYPES(dtype, T, {
    constexpr int V = VecWidth<T>();
    const T* px = static_cast<const T*>(x);
    T* py = static_cast<T*>(y);
    SM_VEC_NORM_DISPATCH(p, V, {
      if (log) {
        SoftmaxForwardVec<T, true, kTpr, kVecs><<<blocks, p.threads, 0, s>>>(px, py, rows, ni);
      } else {
        SoftmaxForwardVec<T, false, kTpr, kVecs><<<blocks, p.threads, 0, s>>>(px, py, rows, ni);
      }
    });
  });
  return cudaGetLastError();
}

int LaunchSoftmaxBackwardVec(const void* y, const void* dy, void* dx, DType dtype, int64_t rows,
                             int64_t n, bool log, void* stream) {
  if (rows == 0) return cudaSuccess;
  const VecNormPlan p = PlanVecNorm(n, static_cast<int>(DTypeSize(dtype)));
  if (!p.ok) return cudaErrorInvalidValue;
  const cudaStream_t s = AsStream(stream);
  const unsigned blocks = static_cast<unsigned>(VecNormBlocks(p, rows));
  const int ni = static_cast<int>(n);
  SM_VEC_NORM_TYPES(dtype, T, {
    constexpr int V = VecWidth<T>();
    const T* py = static_cast<const T*>(y);
    const T* pg = static_cast<const T*>(dy);
    T* px = static_cast<T*>(dx);
    SM_VEC_NORM_DISPATCH(p, V, {
      if (log) {
        SoftmaxBackwardVec<T, true, kTpr, kVecs>
            <<<blocks, p.threads, 0, s>>>(py, pg, px, rows, ni);
      } else {
        SoftmaxBackwardVec<T, false, kTpr, kVecs>
            <<<blocks, p.threads, 0, s>>>(py, pg, px, rows, ni);
      }
    });
  });
  return cudaGetLastError();
}

}  // namespace shardmap::cuda::nn_kernels
