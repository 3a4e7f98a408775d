// CUDA implementations of the reductions in tensor/ops/reduce.h and the random fills in
// tensor/random.h, for tensors on a GPU. The public ops check their arguments (so errors read
// the same on both devices) and then call these for device tensors:
//
//   // in Sum(x, dims, keepdim), after MakePlan:
//   if (x.is_cuda()) return cuda::Reduce(cuda::ReduceOp::kSum, x, plan.reduced, plan.out_shape);
//
// Outputs are allocated on x's device and computed on the thread's current stream of that
// device (tensor/cuda/runtime.h); nothing waits for the stream. Without the CUDA toolkit every
// function throws OpError ("built without CUDA").
#ifndef SHARDMAP_TENSOR_CUDA_REDUCE_REDUCE_OPS_H_
#define SHARDMAP_TENSOR_CUDA_REDUCE_REDUCE_OPS_H_

#include <cstdint>

#include "absl/types/span.h"
#include "tensor/cuda/reduce/random_kernels.h"
#include "tensor/tensor.h"

namespace shardmap::cuda {

enum class ReduceOp { kSum, kMean, kMax, kMin };

// x: a floating tensor on a GPU. reduced[d]: whether dim d is folded (size x.rank()).
// out_shape: the result's shape (keepdim already applied; its numel is the product of the kept
// dims). Sum/Mean fold bf16/f16/f32 in f32 (in a tree of short sequential runs) and f64 in f64;
// the mean over an empty dim is NaN. Max/Min need non-empty reduced dims (the caller checks) and
// propagate NaN.
Tensor Reduce(ReduceOp op, const Tensor& x, absl::Span<const bool> reduced,
              absl::Span<const int64_t> out_shape);

// Index (i64) of the max along dim (normalised, non-empty unless the output is empty): first on
// ties, the first NaN if any.
Tensor ArgMax(const Tensor& x, int dim, absl::Span<const int64_t> out_shape);

// The block [offsets, offsets + local) of the global random tensor, on `device` (already
// checked by the caller: ranks match, the block fits, dtype is floating or i64 for kInts).
// Parameters as kernels::LaunchRandom: (a, b) = (low, high - low) or (mean, stddev); n for ints.
Tensor RandomBlock(kernels::RandomKind kind, absl::Span<const int64_t> global_shape,
                   absl::Span<const int64_t> offsets, absl::Span<const int64_t> local_shape,
                   uint64_t seed, double a, double b, int64_t n, DType dtype, Device device);

}  // namespace shardmap::cuda

#endif  // SHARDMAP_TENSOR_CUDA_REDUCE_REDUCE_OPS_H_
