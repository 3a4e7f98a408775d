// Embedding gather and its scatter-add backward (see kernels.h).
#include "tensor/cuda/nn/kernels.h"
#include "tensor/cuda/nn/nn_util.cuh"

namespace shardmap::cuda::nn_kernels {
namespace {

// Copies rows in units of U (the widest of 16/8/4/2/1 bytes that divides the row and aligns
// both pointers). Bad ids give zero rows.
template <typename U>
__global__ void GatherRows(const U* __restrict__ table, int64_t v, int64_t units,
                           const void* __restrict__ ids, bool i64, int64_t n, U* __restrict__ out,
                           unsigned long long* bad) {
  SM_GRID_STRIDE_LOOP(k, n * units) {
    const int64_t i = k / units, c = k - i * units;
    const int64_t id = IndexAt(ids, i64, i);
    if (id < 0 || id >= v) {
      if (c == 0) RecordBad(bad, i);
      out[k] = U{};
    } else {
      out[k] = table[id * units + c];
    }
  }
}

// Only checks ids (rows of zero features, where the copy kernels have no elements).
__global__ void CheckIds(const void* __restrict__ ids, bool i64, int64_t n, int64_t v,
                         unsigned long long* bad) {
  SM_GRID_STRIDE_LOOP(i, n) {
    const int64_t id = IndexAt(ids, i64, i);
    if (id < 0 || id >= v) RecordBad(bad, i);
  }
}

template <typename T>
__global__ void ScatterAddRows(const void* __restrict__ ids, bool i64, int64_t n,
                               const T* __restrict__ dy, int64_t h, int64_t num_rows,
                               Acc<T>* __restrict__ acc, unsigned long long* bad) {
  SM_GRID_STRIDE_LOOP(k, n * h) {
    const int64_t i = k / h, c = k - i * h;
    const int64_t id = IndexAt(ids, i64, i);
    if (id < 0 || id >= num_rows) {
      if (c == 0) RecordBad(bad, i);
    } else {
      atomicAdd(acc + id * h + c, ToAcc(dy[k]));
    }
  }
}

template <typename U>
void Gather(const void* table, int64_t v, int64_t row_bytes, const void* ids, bool i64, int64_t n,
            void* out, unsigned long long* bad, cudaStream_t s) {
  const int64_t units = row_bytes / static_cast<int64_t>(sizeof(U));
  GatherRows<U><<<Blocks(n * units), kThreads, 0, s>>>(static_cast<const U*>(table), v, units, ids,
                                                       i64, n, static_cast<U*>(out), bad);
}

bool Fits(int64_t row_bytes, const void* a, const void* b, int64_t unit) {
  return row_bytes % unit == 0 && reinterpret_cast<uintptr_t>(a) % unit == 0 &&
         reinterpret_cast<uintptr_t>(b) % unit == 0;
}

}  // namespace

int LaunchEmbedding(const void* table, int64_t v, int64_t row_bytes, const void* ids,
                    bool ids_i64, int64_t n, void* out, unsigned long long* bad, void* stream) {
  if (n == 0) return cudaSuccess;
  const cudaStream_t s = AsStream(stream);
  if (row_bytes == 0) {
    CheckIds<<<Blocks(n), kThreads, 0, s>>>(ids, ids_i64, n, v, bad);
  } else if (Fits(row_bytes, table, out, 16)) {
    Gather<uint4>(table, v, row_bytes, ids, ids_i64, n, out, bad, s);
  } else if (Fits(row_bytes, table, out, 8)) {
    Gather<uint2>(table, v, row_bytes, ids, ids_i64, n, out, bad, s);
  } else if (Fits(row_bytes, table, out, 4)) {
    Gather<uint32_t>(table, v, row_bytes, ids, ids_i64, n, out, bad, s);
  } else if (Fits(row_bytes, table, out, 2)) {
    Gather<uint16_t>(table, v, row_bytes, ids, ids_i64, n, out, bad, s);
  } else {
    Gather<uint8_t>(table, v, row_bytes, ids, ids_i64, n, out, bad, s);
  }
  return cudaGetLastError();
}

int LaunchEmbeddingBackward(const void* ids, bool ids_i64, int64_t n, const void* dy, DType dtype,
                            int64_t h, int64_t num_rows, void* acc, unsigned long long* bad,
                            void* stream) {
  const cudaStream_t s = AsStream(stream);
  const size_t acc_size = dtype == DType::kF64 ? sizeof(double) : sizeof(float);
  const size_t acc_bytes = static_cast<size_t>(num_rows) * static_cast<size_t>(h) * acc_size;
  if (acc_bytes > 0) {
    const cudaError_t e = cudaMemsetAsync(acc, 0, acc_bytes, s);
    if (e != cudaSuccess) return e;
  }
  if (n == 0) return cudaGetLastError();
  if (h == 0) {
    CheckIds<<<Blocks(n), kThreads, 0, s>>>(ids, ids_i64, n, num_rows, bad);
    return cudaGetLastError();
  }
  SM_DISPATCH_FLOAT(dtype, T, {
    ScatterAddRows<T><<<Blocks(n * h), kThreads, 0, s>>>(ids, ids_i64, n,
                                                         static_cast<const T*>(dy), h, num_rows,
                                                         static_cast<Acc<T>*>(acc), bad);
  });
  return cudaGetLastError();
}

}  // namespace shardmap::cuda::nn_kernels
