// Mixed precision for per-device code: low-precision compute (bf16 or f16) with f32 master
// weights, an f32 loss and f32 gradient reductions, plus loss scaling for f16.
//
//   PrecisionPolicy pol = PrecisionPolicy::Bf16Mixed();
//   // per device, inside shard_map / RunSpmd; w1, w2 are the f32 master weights (typed Values):
//   Value x  = ToCompute(x_in, pol);                          // f32 -> bf16 (no grad needed)
//   Value h  = gelu(x.matmul(ToCompute(w1, pol)));            // bf16[4,8]{dp:S0,tp:S1}
//   Value y  = ReduceActivation(h.matmul(ToCompute(w2, pol)), "tp", pol);  // bf16, P -> R on tp
//   Value d  = ToLoss(y, pol) - target;                       // f32 from here on
//   Value loss = sum_partial(d * d, {}) / n;                  // f32, its sums in f32
//   ValueAndGrad g = value_and_grad(..., {w1, w2});           // g.grads: f32 (the cast's VJP)
//   std::vector<Value> r = ReduceGradients(g.grads, {w1, w2}, pol);  // f32 all_reduce over dp
//
// What is in which dtype (the Megatron-LM / PyTorch-AMP recipe):
//   * param: master weights, their gradients, optimizer state (models/components/optimizer.h): f32.
//   * compute: matmuls, elementwise activations, the activations saved for backward: bf16/f16
//     (on CPU the kernels compute in f32 and round once per op; cuBLASLt accumulates in f32).
//     Weights are cast at use through the typed `cast` (shardmap/ops.h), whose VJP casts the
//     cotangent back, so the master gradient arrives in f32 with no hand-written code.
//   * activation_reduce: the tensor-parallel all-reduce of activation partial sums (forward) and
//     its transpose (backward). Default: the compute dtype, as Megatron-LM does; it halves the
//     bytes on the wire. The in-process backend (and our reduce kernel) sums bf16/f16 in f32 and
//     rounds once, so on it a bf16 all-reduce is bitwise equal to "upcast, all-reduce in f32,
//     round": the choice only changes bytes there. NCCL's ring rounds to bf16 at every hop
//     (error growing with the tp degree); set activation_reduce = f32 to avoid that at 2x bytes.
//   * reduce: gradient reductions over data (and other replicated) axes: f32, as Megatron's
//     main_grads / PyTorch DDP with f32 grads. Small per-rank contributions summed over many ranks
//     would lose bits in bf16.
//   * loss: logits/outputs are upcast before the loss, so the loss, its sums and means, and the
//     backward seed are f32.
//
// Loss scaling (f16 only needs it: bf16 has f32's exponent range): multiply the loss by
// scaler.scale() inside the step, then scaler.UnscaleAndCheck(grads) divides the f32 master
// gradients by the scale and returns false (skip this step) when any is inf/NaN; the dynamic
// scaler then halves the scale, and doubles it after growth_interval good steps in a row.
#ifndef SHARDMAP_MODELS_PARALLEL_MIXED_PRECISION_H_
#define SHARDMAP_MODELS_PARALLEL_MIXED_PRECISION_H_

#include <cstdint>
#include <string>
#include <vector>

#include "models/components/optimizer.h"
#include "shardmap/collective_ops.h"
#include "shardmap/value.h"
#include "tensor/dtype.h"

namespace shardmap {

struct PrecisionPolicy {
  DType param = DType::kF32;
  DType compute = DType::kBF16;
  DType reduce = DType::kF32;
  DType loss = DType::kF32;
  DType activation_reduce = DType::kBF16;

  static PrecisionPolicy Fp32() {
    return {DType::kF32, DType::kF32, DType::kF32, DType::kF32, DType::kF32};
  }
  static PrecisionPolicy Bf16Mixed() { return {}; }
  static PrecisionPolicy Fp16Mixed() {
    return {DType::kF32, DType::kF16, DType::kF32, DType::kF32, DType::kF16};
  }
  // A policy by name: "f32"/"fp32", "bf16", "f16"/"fp16"; returns false for other names.
  static bool FromName(const std::string& name, PrecisionPolicy* out);

  // "param f32, compute bf16, activation reduce bf16, grad reduce f32, loss f32"
  std::string ToString() const;
};

// cast(x, dtype), or x itself (no tape node) when it already has that dtype. Types per axis are
// unchanged (R/I/V/P); the VJP casts the cotangent back to x's dtype.
Value CastTo(const Value& x, DType dtype);
// A master weight (or an input) at its use in the compute dtype.
inline Value ToCompute(const Value& x, const PrecisionPolicy& p) { return CastTo(x, p.compute); }
// Logits/outputs upcast to the loss dtype before the loss and its reductions.
inline Value ToLoss(const Value& x, const PrecisionPolicy& p) { return CastTo(x, p.loss); }

// all_reduce (P -> R) of an activation's partial sums over `axes`, sent in
// policy.activation_reduce; the result is in x's dtype. Backward: the cotangent's all_reduce, in
// the same dtype.
Value ReduceActivation(const Value& x, const Axes& axes, const PrecisionPolicy& p);
// reduce_scatter (P -> S(dim)) of an activation, likewise (sequence parallelism).
Value ReduceScatterActivation(const Value& x, int dim, const Axes& axes, const PrecisionPolicy& p);

// The gradient of a parameter typed param_type, its pending sums resolved in policy.reduce: one
// all_reduce (in mesh order) over every axis on which the parameter is R (there its gradient is
// P, docs/design.md 4.2), then cast to policy.param; the result is typed like the parameter.
// A parameter with no R axis needs no reduction: its gradient is only cast. The axes come from
// the parameter's type, not the gradient's, because with TypeCheck::kErased a value only carries
// a kind summary that does not tell P from V.
Value ReduceGradient(const Value& g, const SpmdType& param_type, const PrecisionPolicy& p);
// ReduceGradient of grads[k] for params[k] (value_and_grad's inputs and outputs).
std::vector<Value> ReduceGradients(const std::vector<Value>& grads,
                                   const std::vector<Value>& params, const PrecisionPolicy& p);
// reduce_scatter of a gradient over `axes` along `dim` in policy.reduce (ZeRO/FSDP style: each
// rank keeps the slice of the gradient its optimizer shard owns).
Value ReduceScatterGradient(const Value& g, int dim, const Axes& axes, const PrecisionPolicy& p);

// Whether every element is finite (no inf, no NaN). One host read per tensor: a sum of x * 0,
// which is 0 for finite tensors and NaN otherwise, so it works on any device.
bool AllFinite(const Tensor& x);
bool AllFinite(const std::vector<NamedTensor>& xs);

struct LossScalerOptions {
  double init_scale = 65536.0;   // 2^16, as PyTorch's GradScaler
  bool dynamic = true;           // false: a static scale (skips non-finite steps, never changes)
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int growth_interval = 2000;    // good steps in a row before the scale grows
  double min_scale = 1.0;
  double max_scale = 16777216.0;  // 2^24
};

// Typical step:
//   Value loss = ...; value_and_grad(... loss * scaler.scale() ...)
//   if (scaler.UnscaleAndCheck(grads)) opt.Step(params, grads);   // else: skipped
class LossScaler {
 public:
  explicit LossScaler(LossScalerOptions options = {});
  static LossScaler Static(double scale);

  double scale() const { return scale_; }
  // Divides every gradient by scale() (in its own dtype, f32 for master gradients) and checks
  // them. Returns true when all are finite (take the step). Otherwise returns false and, when
  // dynamic, multiplies the scale by backoff_factor (not below min_scale). After growth_interval
  // consecutive good steps the scale is multiplied by growth_factor (not above max_scale).
  bool UnscaleAndCheck(std::vector<NamedTensor>& grads);
  // The bookkeeping alone, given whether the unscaled gradients were finite (e.g. a flag already
  // all-reduced over every rank): returns found_finite.
  bool Update(bool found_finite);

  int64_t good_steps() const { return good_; }      // since the last change of scale
  int64_t skipped_steps() const { return skipped_; }  // in total
  const LossScalerOptions& options() const { return opt_; }

 private:
  LossScalerOptions opt_;
  double scale_;
  int64_t good_ = 0;
  int64_t skipped_ = 0;
};

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_PARALLEL_MIXED_PRECISION_H_
