// The trainer's step with its numbers on the device, and which runs capture it as a CUDA graph.
//
// On GPU ranks TrainGpt ends every (non-pipeline) step with DeviceOptimizerStep: the loss, the
// global gradient norm, the clipping coefficient and the non-finite decision stay on the device
// (multi-tensor sums, one all_reduce, AdamW with a device grad_scale, a device lr and a device
// skip flag), and the host reads the step's {loss, norm^2} once, after the step. With nothing read
// mid-step, a step of one GPU rank is captured once (after one eager warm-up step) and replayed:
//
//   CudaGraphDecision d = DecideCudaGraph(layout, options, devices);
//   // d.capture: warm-up step eagerly, then per step: copy the batch into fixed device buffers,
//   // write this step's lr into a device scalar, Replay, read the report.
//   // !d.capture: d.note says why ("not captured: ..."), and the steps run eagerly.
//
//   Tensor report = DeviceOptimizerStep(loss_share, grads, counted, clip, lr_dev, names,
//                                       params, opt);   // f64[2] on the device
//   std::vector<double> r = report.ToVector<double>();  // after the step (or the replay)
//   // r[0]: the loss, r[1]: the squared norm. Not finite: AdamW skipped the update on the
//   // device (parameters and moments unchanged); the caller stops the run naming the step.
//
// The same functions run on CPU ranks (the host implementations of the multi-tensor ops and of
// AdamW's control), which is how they are tested without a GPU.
#ifndef SHARDMAP_MODELS_TRAIN_CUDA_GRAPH_STEP_H_
#define SHARDMAP_MODELS_TRAIN_CUDA_GRAPH_STEP_H_

#include <string>
#include <vector>

#include "models/gpt/gpt_model.h"
#include "models/components/optimizer.h"
#include "models/train/trainer.h"
#include "shardmap/value.h"
#include "tensor/tensor.h"

namespace shardmap {

struct CudaGraphDecision {
  bool capture = false;
  std::string note;  // why not ("not captured: ..."), or "" when capture
};

// Whether TrainGpt captures its step, from the options alone (devices: where the in-process
// ranks run, one per mesh rank). Captured: GPU ranks, options.cuda_graph, one in-process rank
// (a 1-rank mesh on one GPU), no pipeline (pp = 1, microbatches = 1), no MoE, no trace, f32
// master weights, and at least two steps to run (the first is the eager warm-up). grad_accum,
// evaluation, periodic snapshots, --init/--resume and --print_types are compatible (evaluation
// and snapshots run eagerly between replays).
CudaGraphDecision DecideCudaGraph(const Model& layout, const TrainOptions& options,
                                  const std::vector<Device>& devices, int64_t first_step = 0);

// The squared global norm of typed gradients as a one-element f64 tensor on their device, the
// same on every rank (GlobalGradNormSquared's counting: sharded parts summed over their axes,
// replicated parts counted once, V parts added up, counted[k] false left out) with one
// multi-tensor sum per gradient type and one all_reduce; nothing read back.
Tensor GlobalGradNormSquaredOnDevice(const std::vector<Value>& grads,
                                     const std::vector<bool>& counted);

// A step's end with nothing read back: the loss share summed over its pending axes (f64), the
// squared global norm, clip > 0: the coefficient min(1, clip / (norm + 1e-6)) as AdamW's
// grad_scale, and AdamW over params (named `names`, updated in place on a GPU) with this step's
// lr from the one-element f64 tensor lr and skip_if_nonfinite = loss + norm^2 (a NaN or inf
// loss or norm leaves parameters and moments unchanged). Returns f64[2] {loss, norm^2} on the
// device. Throws OpError on an AdamW error.
Tensor DeviceOptimizerStep(const Value& loss_share, const std::vector<Value>& grads,
                           const std::vector<bool>& counted, double clip, const Tensor& lr,
                           const std::vector<std::string>& names, std::vector<Value>& params,
                           AdamW& opt);

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_TRAIN_CUDA_GRAPH_STEP_H_
