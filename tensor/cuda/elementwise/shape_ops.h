// CUDA implementations of the layout ops (tensor/ops/shape_ops.h) on device tensors. The public
// ops validate and normalise their arguments, then call these:
//
//   // in tensor/ops/shape_ops.cc, after the checks (perm validated, not the identity):
//   if (x.is_cuda()) return cuda::Permute(x, perm);
//   if (x.is_cuda()) return cuda::Slice(x, /*dim=*/1, /*start=*/2, /*length=*/5);
//
// Results are new contiguous tensors on x's device, written on the calling thread's current
// stream. Layout ops move bits, so they work for every dtype; Cast converts exactly like the
// CPU Cast. In builds without the CUDA toolkit every function throws OpError.
#ifndef SHARDMAP_TENSOR_CUDA_ELEMENTWISE_SHAPE_OPS_H_
#define SHARDMAP_TENSOR_CUDA_ELEMENTWISE_SHAPE_OPS_H_

#include <cstdint>

#include "absl/types/span.h"
#include "tensor/tensor.h"

namespace shardmap::cuda {

// out dim k = x dim perm[k]; perm is a valid permutation of 0..rank-1 (normalised).
Tensor Permute(const Tensor& x, absl::Span<const int> perm);

// [start, start+length) of dim (normalised, in range).
Tensor Slice(const Tensor& x, int dim, int64_t start, int64_t length);

// Writes part into whole at `start` along dim (validated: one dtype and device, part fits).
// part may share storage with whole (it is then copied first).
void SliceAssign(Tensor& whole, int dim, int64_t start, const Tensor& part);

// x converted to dtype (a new tensor, also when dtype == x.dtype()).
Tensor Cast(const Tensor& x, DType dtype);

}  // namespace shardmap::cuda

#endif  // SHARDMAP_TENSOR_CUDA_ELEMENTWISE_SHAPE_OPS_H_
