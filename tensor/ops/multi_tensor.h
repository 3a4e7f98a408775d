// Ops over a list of tensors at once (a model's gradients or parameters), for global-norm
// clipping and the fused AdamW update. On a GPU each is one launch over the whole list (a
// pointer/size table in device memory) with the result left on the device: no host sync per
// tensor, nothing read back, so a training step using them can be captured as a CUDA graph. On
// the CPU they are plain loops (f64 accumulation).
//
//   Tensor ss = SumOfSquares(grads);                 // f32[] on the grads' device
//   // (sharded grads: all_reduce ss over the shard axes here)
//   Tensor coef = ClipCoefficient(ss, /*max_norm=*/1.0);  // min(1, 1 / (sqrt(ss) + 1e-6))
//   ScaleInPlace(grads, coef);                       // or hand coef to AdamW::Step as grad_scale
//   Tensor norm = Sqrt(ss);                          // for logging (reading it syncs)
//
// Every tensor of a list must be floating and on the same device; errors name the op, the
// position in the list and the fix.
#ifndef SHARDMAP_TENSOR_OPS_MULTI_TENSOR_H_
#define SHARDMAP_TENSOR_OPS_MULTI_TENSOR_H_

#include <cstdint>

#include "absl/types/span.h"
#include "tensor/tensor.h"

namespace shardmap {

// The sum of the squares of every element of every tensor, as a rank-0 tensor on their device:
// f64 when any tensor is f64, else f32 (accumulated in f64 on both devices, in a fixed order, so
// the result is deterministic). An empty list (or only empty tensors) gives 0 (on the CPU for an
// empty list).
Tensor SumOfSquares(absl::Span<const Tensor> tensors);
// The same sum as a rank-0 tensor of out_dtype (f32 or f64; e.g. f64 for a norm that later adds
// other f64 values on the device). InvalidArgument-style OpError for another dtype.
Tensor SumOfSquares(absl::Span<const Tensor> tensors, DType out_dtype);

// min(1, max_norm / (sqrt(sum_sq) + 1e-6)), PyTorch's clip_grad_norm_ coefficient, on
// sum_sq's device and in its dtype (sum_sq: a one-element f32/f64 tensor; max_norm > 0). A NaN
// sum gives NaN.
Tensor ClipCoefficient(const Tensor& sum_sq, double max_norm);

// Multiplies every tensor by the one-element f32/f64 tensor `scale` (on their device), in place:
// the tensors' storage is written, so every view of it sees the new values.
void ScaleInPlace(absl::Span<const Tensor> tensors, const Tensor& scale);

}  // namespace shardmap

#endif  // SHARDMAP_TENSOR_OPS_MULTI_TENSOR_H_
