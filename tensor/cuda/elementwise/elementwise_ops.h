// CUDA implementations of the elementwise ops (tensor/ops/elementwise.h) on device tensors. The
// public ops check their arguments (dtypes, shapes, one device) and then call these, so errors
// read the same on both devices:
//
//   // in tensor/ops/elementwise.cc, after the checks:
//   if (a.is_cuda()) return cuda::Binary("add", cuda::BinaryOp::kAdd, a, b, out_shape);
//   if (x.is_cuda()) return cuda::Unary("gelu", cuda::UnaryOp::kGeluTanh, x);
//
// Work runs on the calling thread's current stream of the tensors' device (cuda/runtime.h);
// results are allocated on that device. Launch failures throw OpError with CUDA's error text.
// In builds without the CUDA toolkit every function throws OpError.
#ifndef SHARDMAP_TENSOR_CUDA_ELEMENTWISE_ELEMENTWISE_OPS_H_
#define SHARDMAP_TENSOR_CUDA_ELEMENTWISE_ELEMENTWISE_OPS_H_

#include "absl/types/span.h"
#include "tensor/cuda/elementwise/elementwise_kernels.h"
#include "tensor/tensor.h"

namespace shardmap::cuda {

using kernels::BinaryOp;
using kernels::UnaryOp;

// out = op(a, b) with NumPy broadcasting to out_shape. Preconditions: a and b floating, of one
// dtype, on one CUDA device; out_shape their broadcast shape. `name` is the op's name for
// errors (a broadcast that needs more than 8 dims after merging is one).
Tensor Binary(const char* name, BinaryOp op, const Tensor& a, const Tensor& b,
              absl::Span<const int64_t> out_shape);

// op(x) (scalar: the operand of kAddScalar / kMulScalar). Precondition: x floating, on CUDA.
Tensor Unary(const char* name, UnaryOp op, const Tensor& x, double scalar = 0);

// acc += x. Preconditions: same shape, dtype and CUDA device. acc and x may be the same tensor;
// an x that partially overlaps acc (views of one storage) is read as it was before the call.
void AddInPlace(Tensor& acc, const Tensor& x);

}  // namespace shardmap::cuda

#endif  // SHARDMAP_TENSOR_CUDA_ELEMENTWISE_ELEMENTWISE_OPS_H_
