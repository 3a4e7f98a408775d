// Embedding gather and its scatter-add backward (see kernels.h).
#include "tensor/cuda/nn/kernels.h"
#include "tensor/cuda/nn/nn_util.cuh"

#include <algorithm>
#include <climits>
#include <cstdint>

#include <cub/device/device_radix_sort.cuh>

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

// The deterministic backward: ids sorted (stably, so equal ids keep their token order) as keys
// with token positions as values, then one block per table row sums its tokens' dy rows in that
// order. Bad ids become key num_rows (sorted last, summed into no row) and are recorded.
__global__ void MakeSortKeys(const void* __restrict__ ids, bool i64, int64_t n, int64_t num_rows,
                             uint32_t* __restrict__ keys, int32_t* __restrict__ tokens,
                             unsigned long long* bad) {
  SM_GRID_STRIDE_LOOP(i, n) {
    const int64_t id = IndexAt(ids, i64, i);
    const bool ok = id >= 0 && id < num_rows;
    if (!ok) RecordBad(bad, i);
    keys[i] = static_cast<uint32_t>(ok ? id : num_rows);
    tokens[i] = static_cast<int32_t>(i);
  }
}

// The first position j in sorted keys[0, n) with keys[j] >= r.
__device__ __forceinline__ int64_t LowerBound(const uint32_t* keys, int64_t n, int64_t r) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (static_cast<int64_t>(keys[mid]) < r) lo = mid + 1; else hi = mid;
  }
  return lo;
}

template <typename T>
__global__ void SumSortedRows(const uint32_t* __restrict__ keys,
                              const int32_t* __restrict__ tokens,
                              int64_t n, const T* __restrict__ dy, int64_t h, int64_t num_rows,
                              Acc<T>* __restrict__ acc) {
  for (int64_t r = blockIdx.x; r < num_rows; r += gridDim.x) {
    __shared__ int64_t range[2];
    if (threadIdx.x == 0) {
      range[0] = LowerBound(keys, n, r);
      range[1] = LowerBound(keys, n, r + 1);
    }
    __syncthreads();
    const int64_t lo = range[0], hi = range[1];
    for (int64_t c = threadIdx.x; c < h; c += blockDim.x) {
      Acc<T> s = 0;
      for (int64_t j = lo; j < hi; ++j) s += ToAcc(dy[static_cast<int64_t>(tokens[j]) * h + c]);
      acc[r * h + c] = s;
    }
    __syncthreads();  // range is rewritten for the next row
  }
}

int SortEndBit(int64_t num_rows) {  // bits that hold 0..num_rows (num_rows: the bad-id key)
  int bits = 1;
  while (bits < 31 && (int64_t{1} << bits) <= num_rows) ++bits;
  return bits;
}

struct SortScratch {
  uint32_t *keys_in, *keys_out;
  int32_t *tokens_in, *tokens_out;
  void* temp;
  size_t temp_bytes;
};

size_t Align256(size_t b) { return (b + 255) / 256 * 256; }

// Lays scratch out as four int32 arrays of n and CUB's temporary storage; with scratch null,
// only measures (the returned total).
size_t LayoutScratch(int64_t n, int64_t num_rows, void* scratch, SortScratch* out) {
  const size_t arr = Align256(static_cast<size_t>(n) * sizeof(int32_t));
  size_t temp_bytes = 0;
  cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, static_cast<const uint32_t*>(nullptr),
                                  static_cast<uint32_t*>(nullptr),
                                  static_cast<const int32_t*>(nullptr),
                                  static_cast<int32_t*>(nullptr), static_cast<int>(n), 0,
                                  SortEndBit(num_rows));
  if (out != nullptr) {
    char* p = static_cast<char*>(scratch);
    out->keys_in = reinterpret_cast<uint32_t*>(p);
    out->keys_out = reinterpret_cast<uint32_t*>(p + arr);
    out->tokens_in = reinterpret_cast<int32_t*>(p + 2 * arr);
    out->tokens_out = reinterpret_cast<int32_t*>(p + 3 * arr);
    out->temp = p + 4 * arr;
    out->temp_bytes = temp_bytes;
  }
  return 4 * arr + Align256(temp_bytes) + 256;
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

size_t EmbeddingBackwardScratchBytes(int64_t n, int64_t num_rows) {
  if (n == 0) return 0;
  return LayoutScratch(n, num_rows, nullptr, nullptr);
}

int LaunchEmbeddingBackward(const void* ids, bool ids_i64, int64_t n, const void* dy, DType dtype,
                            int64_t h, int64_t num_rows, void* acc, unsigned long long* bad,
                            void* scratch, void* stream) {
  const cudaStream_t s = AsStream(stream);
  const size_t acc_size = dtype == DType::kF64 ? sizeof(double) : sizeof(float);
  const size_t acc_bytes = static_cast<size_t>(num_rows) * static_cast<size_t>(h) * acc_size;
  // Nothing to sum: no ids, empty rows, or a table of no rows (every id is then out of range:
  // only the check runs, so the op reports the first id instead of launching an empty grid).
  if (n == 0 || h == 0 || num_rows == 0) {
    if (acc_bytes > 0) {
      const cudaError_t e = cudaMemsetAsync(acc, 0, acc_bytes, s);
      if (e != cudaSuccess) return e;
    }
    if (n > 0) CheckIds<<<Blocks(n), kThreads, 0, s>>>(ids, ids_i64, n, num_rows, bad);
    return cudaGetLastError();
  }
  if (n > INT32_MAX || num_rows >= INT32_MAX) return cudaErrorInvalidValue;
  SortScratch sc{};
  LayoutScratch(n, num_rows, scratch, &sc);
  MakeSortKeys<<<Blocks(n), kThreads, 0, s>>>(ids, ids_i64, n, num_rows, sc.keys_in, sc.tokens_in,
                                              bad);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  e = cub::DeviceRadixSort::SortPairs(sc.temp, sc.temp_bytes, sc.keys_in, sc.keys_out,
                                      sc.tokens_in, sc.tokens_out, static_cast<int>(n), 0,
                                      SortEndBit(num_rows), s);
  if (e != cudaSuccess) return e;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(num_rows, int64_t{1} << 20));
  const int threads = h >= 256 ? 256 : (h >= 128 ? 128 : 64);
  SM_DISPATCH_FLOAT(dtype, T, {
    SumSortedRows<T><<<blocks, threads, 0, s>>>(sc.keys_out, sc.tokens_out, n,
                                                 static_cast<const T*>(dy), h, num_rows,
                                                 static_cast<Acc<T>*>(acc));
  });
  return cudaGetLastError();
}

}  // namespace shardmap::cuda::nn_kernels
