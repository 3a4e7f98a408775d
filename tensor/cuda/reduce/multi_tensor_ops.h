// CUDA implementations of the multi-tensor ops of tensor/ops/multi_tensor.h: one launch over a
// list of tensors on one GPU (a table of pointers and sizes in device memory), nothing waits for
// the stream, and nothing is read back to the host, so they run inside a CUDA graph capture.
// The public ops check their arguments; these assume: every tensor floating, contiguous, on
// `device` (AdamW: f32, the four lists of equal length and shapes).
//
//   Tensor ss = cuda::SumOfSquares(grads, DType::kF32, device);   // f32[] on the device
//
// Without the CUDA toolkit every function throws OpError ("built without CUDA").
#ifndef SHARDMAP_TENSOR_CUDA_REDUCE_MULTI_TENSOR_OPS_H_
#define SHARDMAP_TENSOR_CUDA_REDUCE_MULTI_TENSOR_OPS_H_

#include <cstdint>

#include "absl/types/span.h"
#include "tensor/tensor.h"

namespace shardmap::cuda {

// A scalar tensor of out_dtype (f32 or f64) on device: the sum of all squared elements.
Tensor SumOfSquares(absl::Span<const Tensor> tensors, DType out_dtype, Device device);

// Each tensor times the one-element f32/f64 tensor scale, in place.
void ScaleInPlace(absl::Span<const Tensor> tensors, const Tensor& scale);

// min(1, max_norm / (sqrt(sum_sq) + 1e-6)) as a scalar of sum_sq's dtype (f32/f64).
Tensor ClipCoefficient(const Tensor& sum_sq, double max_norm);

struct AdamWHyper {
  double lr, beta1, beta2, eps, weight_decay;
};

// One AdamW step over all tensors (see kernels::LaunchAdamW), in place. scalars: i64[4] on the
// device holding kernels::AdamWScalars (the device's step count); set_step >= 0 restarts the
// count at set_step before this step's increment. grad_scale: undefined or a one-element
// f32/f64 tensor on the device multiplying every gradient. lr: undefined (hyper.lr) or a
// one-element f64 tensor on the device read when the step runs. skip_if_nonfinite: undefined or
// a one-element f32/f64 tensor on the device; when its value is not finite the step changes
// nothing (parameters, moments and the device's step count; see kernels::LaunchAdamWPrepare).
void AdamWStep(absl::Span<const Tensor> params, absl::Span<const Tensor> grads,
               absl::Span<const Tensor> exp_avg, absl::Span<const Tensor> exp_avg_sq,
               absl::Span<const bool> decay, const AdamWHyper& hyper, const Tensor& scalars,
               int64_t set_step, const Tensor& grad_scale, const Tensor& lr = Tensor(),
               const Tensor& skip_if_nonfinite = Tensor());

}  // namespace shardmap::cuda

#endif  // SHARDMAP_TENSOR_CUDA_REDUCE_MULTI_TENSOR_OPS_H_
