// Optimizers over named master weights: SGD (optional momentum) and AdamW. Master weights, their
// gradients and the optimizer state are f32 (f64 is accepted too, for exact reference checks),
// whatever dtype the model computes in: mixed-precision code casts the master weights to the
// compute dtype at use (models/parallel/mixed_precision.h), and the cast's VJP brings the gradients back
// in f32, so the update below never sees bf16/f16.
//
//   std::vector<NamedTensor> params = {{"w1", w1}, {"b1", b1}};     // f32 master weights
//   AdamW opt({.lr = 1e-3, .weight_decay = 0.01});
//   for (...) {
//     std::vector<NamedTensor> grads = ...;                          // f32, same names/shapes
//     absl::Status s = opt.Step(params, grads);                       // params updated in place
//   }
//
// Updates are written with tensor ops (tensor/ops/elementwise.h), so they run wherever the
// tensors live (CPU here; the same calls dispatch to the CUDA kernels for device tensors).
// Gradients are matched to parameters by name (not position); every parameter needs a gradient.
// Weight decay is decoupled (Loshchilov & Hutter): p <- p * (1 - lr * wd) before the update, for
// SGD as for AdamW, and it never enters the momentum or Adam moments.
#ifndef SHARDMAP_MODELS_COMPONENTS_OPTIMIZER_H_
#define SHARDMAP_MODELS_COMPONENTS_OPTIMIZER_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "tensor/tensor.h"

namespace shardmap {

struct NamedTensor {
  std::string name;
  Tensor tensor;
};

// Checks the pairing of params and grads: unique names, a gradient for every parameter with the
// same shape and dtype, dtype f32 (or f64). Errors name the parameter and the fix.
absl::Status CheckParamsAndGrads(const std::vector<NamedTensor>& params,
                                 const std::vector<NamedTensor>& grads);

struct SgdOptions {
  double lr = 0.01;
  double momentum = 0;      // 0: plain SGD; else buf = momentum * buf + g (buf = g on step 1)
  bool nesterov = false;    // update with g + momentum * buf instead of buf
  double weight_decay = 0;  // decoupled
};

// p <- p * (1 - lr * wd) - lr * u,  u = g (no momentum), buf, or g + momentum * buf (nesterov).
class Sgd {
 public:
  explicit Sgd(SgdOptions options = {}) : opt_(options) {}
  absl::Status Step(std::vector<NamedTensor>& params, const std::vector<NamedTensor>& grads);
  int64_t steps() const { return steps_; }
  const SgdOptions& options() const { return opt_; }
  // The momentum buffer of a parameter (undefined before its first step or without momentum).
  Tensor momentum_buffer(const std::string& name) const;

 private:
  SgdOptions opt_;
  int64_t steps_ = 0;
  std::map<std::string, Tensor> buf_;
};

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;  // decoupled
  // Parameters exempt from weight decay (nanoGPT: biases, LayerNorms - those with < 2 dims).
  std::set<std::string> no_decay = {};
};

// PyTorch's AdamW, step t = 1, 2, ...:
//   p <- p * (1 - lr * wd)          (unless the name is in no_decay)
//   m <- b1 m + (1 - b1) g;   v <- b2 v + (1 - b2) g^2
//   p <- p - (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
//
// On a GPU (every parameter an f32 CUDA tensor on one device) a step is one fused multi-tensor
// kernel over all parameters (tensor/cuda/reduce/multi_tensor_kernels.h) that updates the
// parameters and moments in place: p.tensor keeps its storage, whose values change (views of it
// see them). The step count and bias corrections then live on the device too, so the step can
// be captured into a CUDA graph: each replay advances the device's count (steps() counts host
// calls only), with the lr and betas of the captured call. Elsewhere (CPU, meta, f64) each
// parameter is updated in place too, by one fused pass over p, g, m, v with no temporary
// (models/components/adamw_update.h), bitwise equal to the formula above written as tensor ops
// (each product and sum rounded to the dtype): the step's memory peak is the backward's, not
// the optimizer's. Whoever holds p.tensor or a moment (exp_avg) sees the new values; clone what
// must outlive a step.
//
// grad_scale (optional): a one-element f32/f64 tensor on the parameters' device multiplying
// every gradient before the update, e.g. ClipCoefficient(SumOfSquares(grads), max_norm) from
// tensor/ops/multi_tensor.h: global-norm clipping fused into the step, with no host sync.
//
// control (optional), for a step whose numbers stay on the device (a CUDA-graph step,
// models/train/cuda_graph_step.h): lr, a one-element f64 tensor on the parameters' device, is this
// step's learning rate, read when the step runs instead of options().lr (a schedule writes it
// before each replay); skip_if_nonfinite, a one-element f32/f64 tensor on that device: when its
// value is NaN or inf (e.g. loss + squared gradient norm) the step changes nothing: parameters,
// moments and the step count stay as they were. On the GPU both are read by the device (no host
// sync; steps() still counts the call, so a caller that goes on after a skipped step calls
// set_steps); elsewhere they are read on the host.
//
// grad_multiplier (host value): every gradient is multiplied by it (rounded to the dtype) before
// the update, e.g. the clipping coefficient, without a scaled copy of the gradients on the CPU.
struct AdamWStepControl {
  Tensor lr;
  Tensor skip_if_nonfinite;
  double grad_multiplier = 1;
};

class AdamW {
 public:
  explicit AdamW(AdamWOptions options = {}) : opt_(options) {}
  absl::Status Step(std::vector<NamedTensor>& params, const std::vector<NamedTensor>& grads,
                    const Tensor& grad_scale = Tensor()) {
    return Step(params, grads, grad_scale, AdamWStepControl{});
  }
  absl::Status Step(std::vector<NamedTensor>& params, const std::vector<NamedTensor>& grads,
                    const Tensor& grad_scale, const AdamWStepControl& control);
  int64_t steps() const { return steps_; }
  const AdamWOptions& options() const { return opt_; }
  // The moments of a parameter (undefined before its first step); same dtype as the parameter.
  Tensor exp_avg(const std::string& name) const;
  Tensor exp_avg_sq(const std::string& name) const;
  // Restores a checkpointed state (moments of `name`, the step count t).
  void SetState(const std::string& name, Tensor exp_avg, Tensor exp_avg_sq);
  void set_steps(int64_t steps) {
    steps_ = steps;
    device_step_stale_ = true;
  }
  // The learning rate of the next steps (a schedule sets it before each step).
  void set_lr(double lr) { opt_.lr = lr; }

 private:
  struct State {
    Tensor m, v;
  };
  absl::Status FusedCudaStep(std::vector<NamedTensor>& params,
                             const std::vector<NamedTensor>& grads, const Tensor& grad_scale,
                             const AdamWStepControl& control);
  AdamWOptions opt_;
  int64_t steps_ = 0;
  std::map<std::string, State> state_;
  Tensor device_scalars_;           // the CUDA path's step count and coefficients (i64[4])
  bool device_step_stale_ = true;   // steps_ was set on the host since the device last counted
};

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_COMPONENTS_OPTIMIZER_H_
