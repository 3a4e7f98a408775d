// Launchers of the CUDA routing kernels (routing.cu), called by routing_ops.cc.
//
//   int e = routing_kernels::LaunchTopK(x, DType::kF32, rows, n, k, vals, ids, bad, stream);
//
// Plain C++: raw device pointers, int64 sizes, a cudaStream_t as void*; each returns a
// cudaError_t as int. `bad` (nullable) is a device uint64 the caller sets to ~0 first; a kernel
// that meets bad input (a NaN in top-k, an index out of range) atomically lowers it to the flat
// position (see each launcher) and skips that element.
#ifndef SHARDMAP_TENSOR_CUDA_ROUTING_KERNELS_H_
#define SHARDMAP_TENSOR_CUDA_ROUTING_KERNELS_H_

#include <cstdint>

#include "tensor/dtype.h"

namespace shardmap::cuda::routing_kernels {

// vals [rows, k] (dtype) and ids [rows, k] (i64): the k largest of each row of x [rows, n],
// descending, ties to the lower index. Bad position: r * n + j of the first NaN.
int LaunchTopK(const void* x, DType dtype, int64_t rows, int64_t n, int64_t k, void* vals,
               int64_t* ids, unsigned long long* bad, void* stream);

// out [rows, n] (dtype) = 0, then out[r, ids[r, j]] = sum of dvalues[r, j'] over the j' with
// that index (in A, rounded once). Bad position: r * k + j of an index outside [0, n).
int LaunchTopKBackward(const void* dvalues, DType dtype, const void* ids, bool ids_i64,
                       int64_t rows, int64_t k, int64_t n, void* out,
                       unsigned long long* bad, void* stream);

// out [m, d] of any dtype (elem_bytes wide) = x[idx[i], :], zero rows for idx[i] == -1.
// Bad position: i of an idx outside [-1, rows).
int LaunchGatherRows(const void* x, int64_t rows, int64_t d, int elem_bytes, const void* idx,
                     bool idx_i64, int64_t m, void* out, unsigned long long* bad, void* stream);

// acc [n, d] in A (f32, or f64 for f64 x) = 0, then acc[idx[i], :] += x[i, :] with atomics
// (summation order, hence the low bits of rows hit twice, may vary between runs); idx[i] == -1
// skipped. Bad position: i of an idx outside [-1, n).
int LaunchScatterAddRows(const void* x, DType dtype, int64_t m, int64_t d, const void* idx,
                         bool idx_i64, int64_t n, void* acc, unsigned long long* bad,
                         void* stream);

// out[i] (i64) = i * stride + (ids[i] - start) where start <= ids[i] < start + size, else -1.
// Bad position (only when bad is non-null): i of the first id outside the range.
int LaunchLocalIndices(const void* ids, bool ids_i64, int64_t n, int64_t start, int64_t size,
                       int64_t stride, int64_t* out, unsigned long long* bad, void* stream);

}  // namespace shardmap::cuda::routing_kernels

#endif  // SHARDMAP_TENSOR_CUDA_ROUTING_KERNELS_H_
