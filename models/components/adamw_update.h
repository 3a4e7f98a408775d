// AdamW's update of one parameter on the CPU, fused and in place: one pass over p, g, m, v that
// reads g and rewrites p, m and v element by element, with no temporary tensor (the unfused
// update allocated six of the parameter's size: a dp=2 step's peak was AdamW's, 65.6 MiB
// against 13.9 MiB up to the end of the backward). Each element goes through the same operations
// in the same dtype and order as the tensor-op form it replaces (optimizer.h's formula, every
// product and sum rounded to T), so the result is bitwise that form's; the library is built with
// -ffp-contract=off so no product and sum fuse into an FMA.
//
//   AdamWCoefficients c = {.b1 = 0.9, .b2 = 0.95, .eps = 1e-8, .step_size = lr / bc1,
//                          .inv_sqrt_bc2 = 1 / sqrt(bc2), .decay = 1 - lr * wd};
//   FusedAdamWUpdate(p, g, m, v, c);   // p, m, v: same shape and dtype (f32 or f64), contiguous
#ifndef SHARDMAP_MODELS_COMPONENTS_ADAMW_UPDATE_H_
#define SHARDMAP_MODELS_COMPONENTS_ADAMW_UPDATE_H_

#include "absl/status/status.h"
#include "tensor/tensor.h"

namespace shardmap {

struct AdamWCoefficients {
  double b1 = 0.9, b2 = 0.999, eps = 1e-8;
  double step_size = 0;     // lr / (1 - b1^t)
  double inv_sqrt_bc2 = 1;  // 1 / sqrt(1 - b2^t)
  double decay = 1;         // 1 - lr * wd; exactly 1: no decay (p is not multiplied)
  double grad_scale = 1;    // g is multiplied by it first; exactly 1: not multiplied
};

// Per element, in T (the tensors' dtype), each constant rounded to T:
//   g' = g * scale;  m = m * b1 + g' * (1 - b1);  v = v * b2 + (g' * g') * (1 - b2)
//   p = (p * decay) - (m / (sqrt(v) * inv_sqrt_bc2 + eps)) * step_size
// On meta tensors nothing is computed (shape-only runs). InvalidArgument naming the operand
// when a shape, dtype or device differs or the dtype is not f32/f64; CUDA tensors are refused
// (the fused multi-tensor kernel, tensor/cuda/reduce, serves them).
absl::Status FusedAdamWUpdate(Tensor& p, const Tensor& g, Tensor& m, Tensor& v,
                              const AdamWCoefficients& c);

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_COMPONENTS_ADAMW_UPDATE_H_
