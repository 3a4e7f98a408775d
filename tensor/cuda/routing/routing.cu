// Routing kernels of mixture-of-experts layers (see kernels.h). Rows are short (experts) or
// copied element-wise, so these are simple grid-stride kernels.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "tensor/cuda/kernels/kernel_util.cuh"
#include "tensor/cuda/routing/kernels.h"

namespace shardmap::cuda::routing_kernels {
namespace {

using kernels::Acc;
using kernels::AsStream;
using kernels::Blocks;
using kernels::FromAcc;
using kernels::kThreads;
using kernels::ToAcc;

__device__ __forceinline__ void RecordBad(unsigned long long* bad, int64_t pos) {
  if (bad != nullptr) atomicMin(bad, static_cast<unsigned long long>(pos));
}

__device__ __forceinline__ int64_t IndexAt(const void* ids, bool i64, int64_t i) {
  return i64 ? static_cast<const int64_t*>(ids)[i]
             : static_cast<int64_t>(static_cast<const int32_t*>(ids)[i]);
}

// One thread per row: k selection passes, each taking the largest entry that comes after the
// previous pick in the order (value descending, index ascending). No per-row state beyond the
// previous pick, so any n works; rows are the experts of a router (short).
template <typename T>
__global__ void TopKKernel(const T* __restrict__ x, T* __restrict__ vals,
                           int64_t* __restrict__ ids, int64_t rows, int64_t n, int64_t k,
                           unsigned long long* bad) {
  using A = Acc<T>;
  SM_GRID_STRIDE_LOOP(r, rows) {
    const T* row = x + r * n;
    for (int64_t j = 0; j < n; ++j) {
      const A v = ToAcc(row[j]);
      if (v != v) {
        RecordBad(bad, r * n + j);
        break;
      }
    }
    A prev_v = A(0);
    int64_t prev_i = -1;
    for (int64_t p = 0; p < k; ++p) {
      A best_v = A(0);
      int64_t best_i = -1;
      for (int64_t j = 0; j < n; ++j) {
        const A v = ToAcc(row[j]);
        if (v != v) continue;  // reported above; the result is discarded
        if (p > 0 && !(v < prev_v || (v == prev_v && j > prev_i))) continue;
        if (best_i < 0 || v > best_v) {  // strict: equal values keep the lower index
          best_v = v;
          best_i = j;
        }
      }
      if (best_i < 0) best_i = 0;  // only with NaN (an error)
      vals[r * k + p] = row[best_i];
      ids[r * k + p] = best_i;
      prev_v = best_v;
      prev_i = best_i;
    }
  }
}

template <typename T>
__global__ void TopKBackwardKernel(const T* __restrict__ dv, const void* __restrict__ ids,
                                   bool ids_i64, int64_t rows, int64_t k, int64_t n,
                                   T* __restrict__ out, unsigned long long* bad) {
  using A = Acc<T>;
  SM_GRID_STRIDE_LOOP(r, rows) {
    for (int64_t j = 0; j < k; ++j) {
      const int64_t c = IndexAt(ids, ids_i64, r * k + j);
      if (c < 0 || c >= n) {
        RecordBad(bad, r * k + j);
        continue;
      }
      bool first = true;  // the first pick of c writes the sum of all picks of c
      for (int64_t jj = 0; jj < j && first; ++jj) first = IndexAt(ids, ids_i64, r * k + jj) != c;
      if (!first) continue;
      A s = A(0);
      for (int64_t jj = j; jj < k; ++jj) {
        if (IndexAt(ids, ids_i64, r * k + jj) == c) s += ToAcc(dv[r * k + jj]);
      }
      out[r * n + c] = FromAcc<T>(s);
    }
  }
}

// Copies in 4-byte words when rows allow it (d * elem_bytes a multiple of 4), else bytes.
template <typename W>
__global__ void GatherRowsKernel(const W* __restrict__ x, int64_t rows, int64_t words,
                                 const void* __restrict__ idx, bool idx_i64, int64_t m,
                                 W* __restrict__ out, unsigned long long* bad) {
  SM_GRID_STRIDE_LOOP(e, m * words) {
    const int64_t i = e / words, c = e - i * words;
    const int64_t r = IndexAt(idx, idx_i64, i);
    if (r >= 0 && r < rows) {
      if (out != nullptr) out[e] = x[r * words + c];  // null: an index-only pass (d == 0)
    } else if (r != -1) {
      if (c == 0) RecordBad(bad, i);
    }  // -1 (and bad) rows stay as zeroed by the launcher
  }
}

template <typename T>
__global__ void ScatterAddRowsKernel(const T* __restrict__ x, int64_t m, int64_t d,
                                     const void* __restrict__ idx, bool idx_i64, int64_t n,
                                     Acc<T>* __restrict__ acc, unsigned long long* bad) {
  SM_GRID_STRIDE_LOOP(e, m * d) {
    const int64_t i = e / d, c = e - i * d;
    const int64_t r = IndexAt(idx, idx_i64, i);
    if (r >= 0 && r < n) {
      atomicAdd(acc + r * d + c, ToAcc(x[e]));
    } else if (r != -1 && c == 0) {
      RecordBad(bad, i);
    }
  }
}

__global__ void LocalIndicesKernel(const void* __restrict__ ids, bool ids_i64, int64_t n,
                                   int64_t start, int64_t size, int64_t stride,
                                   int64_t* __restrict__ out, unsigned long long* bad) {
  SM_GRID_STRIDE_LOOP(i, n) {
    const int64_t l = IndexAt(ids, ids_i64, i) - start;
    if (l >= 0 && l < size) {
      out[i] = i * stride + l;
    } else {
      out[i] = -1;
      RecordBad(bad, i);
    }
  }
}

}  // namespace

int LaunchLocalIndices(const void* ids, bool ids_i64, int64_t n, int64_t start, int64_t size,
                       int64_t stride, int64_t* out, unsigned long long* bad, void* stream) {
  if (n == 0) return cudaSuccess;
  LocalIndicesKernel<<<Blocks(n), kThreads, 0, AsStream(stream)>>>(ids, ids_i64, n, start, size,
                                                                   stride, out, bad);
  return cudaGetLastError();
}

int LaunchTopK(const void* x, DType dtype, int64_t rows, int64_t n, int64_t k, void* vals,
               int64_t* ids, unsigned long long* bad, void* stream) {
  if (rows == 0 || k == 0) return cudaSuccess;
  SM_DISPATCH_FLOAT(dtype, T, {
    TopKKernel<T><<<Blocks(rows), kThreads, 0, AsStream(stream)>>>(
        static_cast<const T*>(x), static_cast<T*>(vals), ids, rows, n, k, bad);
  });
  return cudaGetLastError();
}

int LaunchTopKBackward(const void* dvalues, DType dtype, const void* ids, bool ids_i64,
                       int64_t rows, int64_t k, int64_t n, void* out,
                       unsigned long long* bad, void* stream) {
  const size_t bytes = static_cast<size_t>(rows * n) * DTypeSize(dtype);
  if (bytes > 0) {
    const cudaError_t e = cudaMemsetAsync(out, 0, bytes, AsStream(stream));  // +0 in every dtype
    if (e != cudaSuccess) return e;
  }
  if (rows == 0 || k == 0) return cudaSuccess;
  SM_DISPATCH_FLOAT(dtype, T, {
    TopKBackwardKernel<T><<<Blocks(rows), kThreads, 0, AsStream(stream)>>>(
        static_cast<const T*>(dvalues), ids, ids_i64, rows, k, n, static_cast<T*>(out), bad);
  });
  return cudaGetLastError();
}

int LaunchGatherRows(const void* x, int64_t rows, int64_t d, int elem_bytes, const void* idx,
                     bool idx_i64, int64_t m, void* out, unsigned long long* bad, void* stream) {
  const int64_t row_bytes = d * elem_bytes;
  if (m == 0) return cudaSuccess;
  if (row_bytes > 0) {
    const cudaError_t e =
        cudaMemsetAsync(out, 0, static_cast<size_t>(m * row_bytes), AsStream(stream));
    if (e != cudaSuccess) return e;
  }
  // With d == 0 the kernel still runs over one word per row so bad indices are seen.
  // Words when rows are whole words and both bases are word-aligned (a view may start anywhere).
  const bool aligned = reinterpret_cast<uintptr_t>(x) % 4 == 0 &&
                       reinterpret_cast<uintptr_t>(out) % 4 == 0;
  if (row_bytes % 4 == 0 && row_bytes > 0 && aligned) {
    const int64_t words = row_bytes / 4;
    GatherRowsKernel<uint32_t><<<Blocks(m * words), kThreads, 0, AsStream(stream)>>>(
        static_cast<const uint32_t*>(x), rows, words, idx, idx_i64, m,
        static_cast<uint32_t*>(out), bad);
  } else if (row_bytes > 0) {
    GatherRowsKernel<uint8_t><<<Blocks(m * row_bytes), kThreads, 0, AsStream(stream)>>>(
        static_cast<const uint8_t*>(x), rows, row_bytes, idx, idx_i64, m,
        static_cast<uint8_t*>(out), bad);
  } else {
    // Empty rows: check the indices only (writes nothing: out has no bytes).
    GatherRowsKernel<uint8_t><<<Blocks(m), kThreads, 0, AsStream(stream)>>>(
        nullptr, rows, 1, idx, idx_i64, m, nullptr, bad);
  }
  return cudaGetLastError();
}

int LaunchScatterAddRows(const void* x, DType dtype, int64_t m, int64_t d, const void* idx,
                         bool idx_i64, int64_t n, void* acc, unsigned long long* bad,
                         void* stream) {
  const size_t acc_bytes =
      static_cast<size_t>(n * d) * (dtype == DType::kF64 ? sizeof(double) : sizeof(float));
  if (acc_bytes > 0) {
    const cudaError_t e = cudaMemsetAsync(acc, 0, acc_bytes, AsStream(stream));
    if (e != cudaSuccess) return e;
  }
  if (m == 0) return cudaSuccess;
  const int64_t dd = d > 0 ? d : 1;  // d == 0: one pass per row to check its index
  SM_DISPATCH_FLOAT(dtype, T, {
    if (d > 0) {
      ScatterAddRowsKernel<T><<<Blocks(m * d), kThreads, 0, AsStream(stream)>>>(
          static_cast<const T*>(x), m, d, idx, idx_i64, n, static_cast<Acc<T>*>(acc), bad);
    } else {
      GatherRowsKernel<uint8_t><<<Blocks(m * dd), kThreads, 0, AsStream(stream)>>>(
          nullptr, n, 1, idx, idx_i64, m, nullptr, bad);
    }
  });
  return cudaGetLastError();
}

}  // namespace shardmap::cuda::routing_kernels
