// Reduction kernel launchers (tensor/cuda/reduce/reduce_kernels.cu). Plain C++: raw device
// pointers, int64 sizes, a cudaStream_t as void*; each returns a cudaError_t as int.
//
//   // x: f32[4, 1000, 8] on the device; out: f32[4, 8] = sum over the middle axis.
//   LaunchReducePass(x, DType::kF32, out, DType::kF32, ReduceKind::kSum,
//                    /*outer=*/4, /*n=*/1000, /*inner=*/8, /*seg_len=*/1000, /*scale=*/1.0, s);
//
// The tensor-level driver (reduce_ops.cc) turns any set of reduced dims into passes over
// [outer, n, inner] views, and splits long axes into segments (one pass writes partial results
// per segment, the next pass folds those) so each thread folds a short sequence and the partial
// results meet in a tree: f32 sums stay accurate without f64 accumulation.
#ifndef SHARDMAP_TENSOR_CUDA_REDUCE_REDUCE_KERNELS_H_
#define SHARDMAP_TENSOR_CUDA_REDUCE_REDUCE_KERNELS_H_

#include <cstdint>

#include "tensor/dtype.h"

namespace shardmap::cuda::kernels {

enum class ReduceKind : int { kSum = 0, kMax = 1, kMin = 2 };

// One pass over x viewed as [outer, n, inner] (row-major, contiguous, n >= 1). The n axis is cut
// into nseg = ceil(n / seg_len) segments; out, viewed as [outer, nseg, inner], gets
//   out[o, s, i] = fold over k in [s*seg_len, min(n, (s+1)*seg_len)) of x[o, k, i]
// times `scale` for kSum. Max/Min propagate NaN (any NaN in the fold gives NaN), like the CPU.
// Folds run in f32 for f32/bf16/f16 inputs and in f64 for f64. Dtype pairs (in, out): equal
// floating dtypes, (bf16|f16, f32) or (f32, bf16|f16); others give cudaErrorInvalidValue.
int LaunchReducePass(const void* x, DType in_dtype, void* out, DType out_dtype, ReduceKind kind,
                     int64_t outer, int64_t n, int64_t inner, int64_t seg_len, double scale,
                     void* stream);

// out[o, i] = index k in [0, n) of the max of x[o, k, i] (floating dtype, n >= 1): the first
// index on ties, the first NaN if there is one (like NumPy and the CPU op).
int LaunchArgMax(const void* x, DType dtype, int64_t* out, int64_t outer, int64_t n,
                 int64_t inner, void* stream);

}  // namespace shardmap::cuda::kernels

#endif  // SHARDMAP_TENSOR_CUDA_REDUCE_REDUCE_KERNELS_H_
