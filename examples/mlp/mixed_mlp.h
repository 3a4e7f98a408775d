// The 2-D (dp x tp) Megatron MLP of examples/mlp/parallel_mlp.h in mixed precision: f32 master weights,
// bf16 (or f16) compute, an f32 loss, gradients reduced over dp in f32 (models/parallel/mixed_precision.h).
//
//   Mesh mesh = *Mesh::Create({{"dp", 2}, {"tp", 3}});
//   MlpParams p = InitMlp(cfg);                       // f32 master weights (global)
//   absl::StatusOr<MixedStep> s = MixedTrainStep(mesh, p, batch, PrecisionPolicy::Bf16Mixed());
//   // s->loss: f32 loss; s->grads: f32 gradients, one per master weight; s->log: rank 0's
//   // collectives: fwd all_reduce(tp) in bf16 | bwd all_reduce(tp) in bf16, then the gradient
//   // reductions in f32: all_reduce(dp) for w1, b1, w2 and all_reduce(dp,tp) for b2.
//
//   AdamW opt({.lr = 1e-2});
//   absl::StatusOr<TrainLog> t = TrainMixedMlp(mesh, p, batch, policy, opt, /*steps=*/20);
//
// Per device (rank with dp index i, tp index j):
//   x, target: f32 rows of dp shard i            -> x cast to bf16
//   w1 f32[d, h/tp]{tp:S1} -> cast bf16; b1 likewise; w2 f32[h/tp, d]{tp:S0} -> cast bf16
//   h  = x@w1 + b1            bf16{dp:S0,tp:S1}
//   a  = gelu(h)              bf16{dp:S0,tp:S1}
//   yp = a@w2                 bf16{dp:S0,tp:P}
//   y  = all_reduce(yp, tp) + b2     (sent in policy.activation_reduce)  bf16{dp:S0,tp:R}
//   loss = sum_partial((f32(y) - target)^2) / n   f32{dp:P,tp:R}
// value_and_grad of the rank's loss gives f32 gradients of the f32 masters (each cast's VJP
// upcasts the bf16 cotangent), P on dp (and P on tp for b2, whose use is replicated on tp: the
// loss is R there, seeded on tp index 0); ReduceGradients resolves them with all_reduces in f32
// over each parameter's R axes, so the step also runs with TypeCheck::kErased (bitwise equal).
// These gradient reductions are logged as backward collectives (they belong to the backward
// pass, where data-parallel frameworks overlap them).
#ifndef SHARDMAP_EXAMPLES_MLP_MIXED_MLP_H_
#define SHARDMAP_EXAMPLES_MLP_MIXED_MLP_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "models/parallel/mixed_precision.h"
#include "models/components/optimizer.h"
#include "examples/mlp/parallel_mlp.h"
#include "shardmap/context.h"
#include "shardmap/mesh.h"
#include "shardmap/value.h"

namespace shardmap {

// The block in policy.compute with f32 (master) weights cast at use; y in the compute dtype.
// tp_axis empty: unsharded (no collective).
Value MixedMegatronMlp(const Value& x, const Value& w1, const Value& b1, const Value& w2,
                       const Value& b2, const std::string& tp_axis, const PrecisionPolicy& policy,
                       MlpTrace* trace = nullptr);
// sum((y - target)^2) / total_count in policy.loss (y upcast first): P on dp.
Value MixedMseLossShare(const Value& y, const Value& target, int64_t total_count,
                        const PrecisionPolicy& policy, MlpTrace* trace = nullptr);

struct MixedStepOptions {
  double loss_scale = 1.0;  // the loss is multiplied by this before backward (f16 loss scaling)
  TypeCheck check = TypeCheck::kOn;
  MlpTrace* trace = nullptr;  // rank 0's SPMD types, when non-null
};

struct MixedStep {
  double loss = 0;  // unscaled
  MlpParams grads;  // policy.param (f32), d(loss * loss_scale)/d(master weight), fully reduced
  std::vector<CollectiveRecord> log;  // rank 0's, forward then backward (incl. grad reductions)
};

// One forward + backward on a mesh with axes "dp" and "tp" (RunSpmd, in-process ranks).
// p must be in policy.param (f32).
absl::StatusOr<MixedStep> MixedTrainStep(const Mesh& mesh, const MlpParams& p,
                                         const MlpBatch& batch, const PrecisionPolicy& policy,
                                         const MixedStepOptions& options = {});

// {"w1", w1}, {"b1", b1}, {"w2", w2}, {"b2", b2} and back.
std::vector<NamedTensor> MlpNamed(const MlpParams& p);
MlpParams MlpFromNamed(const std::vector<NamedTensor>& named);

struct TrainLog {
  std::vector<double> losses;   // per step, unscaled (also for skipped steps)
  std::vector<bool> skipped;    // the loss scaler skipped this step (non-finite gradients)
  std::vector<double> scales;   // loss scale used at each step (1 without a scaler)
};

// `steps` steps of MixedTrainStep + optimizer (AdamW or Sgd) on p (updated in place). With a
// scaler: the loss is scaled, gradients unscaled and checked, non-finite steps skipped.
template <typename Optimizer>
absl::StatusOr<TrainLog> TrainMixedMlp(const Mesh& mesh, MlpParams& p, const MlpBatch& batch,
                                       const PrecisionPolicy& policy, Optimizer& opt, int steps,
                                       LossScaler* scaler = nullptr) {
  TrainLog log;
  for (int i = 0; i < steps; ++i) {
    MixedStepOptions o;
    o.loss_scale = scaler ? scaler->scale() : 1.0;
    absl::StatusOr<MixedStep> s = MixedTrainStep(mesh, p, batch, policy, o);
    if (!s.ok()) return s.status();
    log.losses.push_back(s->loss);
    log.scales.push_back(o.loss_scale);
    std::vector<NamedTensor> grads = MlpNamed(s->grads);
    bool take = scaler ? scaler->UnscaleAndCheck(grads) : true;
    log.skipped.push_back(!take);
    if (!take) continue;
    std::vector<NamedTensor> named = MlpNamed(p);
    if (absl::Status st = opt.Step(named, grads); !st.ok()) return st;
    p = MlpFromNamed(named);
  }
  return log;
}

// SummarizeCollectives with the bytes this rank contributed per (op, axes) group:
// "fwd: all_reduce(tp) x1 128B | bwd: all_reduce(tp) x1 128B, all_reduce(dp) x3 2560B, ...".
// The log has no element types; the bytes show them (bf16 activations take half of f32's).
std::string SummarizeCollectiveBytes(const Mesh& mesh, const std::vector<CollectiveRecord>& log);

}  // namespace shardmap

#endif  // SHARDMAP_EXAMPLES_MLP_MIXED_MLP_H_
