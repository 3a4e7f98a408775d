// The GPU step outside a pipeline, ended on the device (models/train/cuda_graph_step.h): the
// forward, backward, gradient reduction and DeviceOptimizerStep run with nothing read back, and
// the loss and the norm are read once after the step; the lr is a device scalar written before
// it. With capture on, the step after the first eager one is recorded once as a CUDA graph
// and every later step replays it with its batch copied into the graph's fixed inputs.
//
//   DeviceStep device(layout, plan, options.clip, decision.capture, state, batches, ctx);
//   DeviceStep::Outcome out = device.Run(step, first_step, lr, ids_g, targets_g, types, tape,
//                                        rec, phase);
//   out.loss; out.norm;    // after the step (the one host read)
#ifndef SHARDMAP_MODELS_TRAIN_DEVICE_STEP_H_
#define SHARDMAP_MODELS_TRAIN_DEVICE_STEP_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "autograd/tape.h"
#include "models/gpt/gpt_trace.h"
#include "models/train/batch_rows.h"
#include "models/train/rank_state.h"
#include "models/train/run_plan.h"
#include "models/train/strategies.h"
#include "shardmap/context.h"
#include "shardmap/rank_context.h"
#include "tensor/cuda/graph.h"

namespace shardmap {

class DeviceStep {
 public:
  DeviceStep(const Model& layout, const RunPlan& plan, double clip, bool capture,
             const OverlapOptions& overlap, RankState& state, const RankBatches& batches,
             RankContext& ctx);

  struct Outcome {
    Backprop bp;
    double loss = 0, norm = 0;
    double reduce_us = 0, optimizer_us = 0;  // when the reduction and the optimizer began
    size_t backprop_logged = 0;              // collectives the forward and backward logged
  };
  // Runs `step` eagerly, captured (once: the first step after first_step), or replayed. The
  // host's AdamW step count follows. phase("optimizer") is called before the reduction of an
  // eagerly run (or captured) step. Throws OpError on a non-finite loss or norm.
  Outcome Run(int64_t step, int64_t first_step, double lr, const Tensor& ids_g,
              const Tensor& targets_g, TypeTrace* types, Tape& tape, TracingRecorder& rec,
              const std::function<void(const char*)>& phase);

  bool replayed() const { return graph_ != nullptr; }
  int64_t replays() const { return replays_; }
  // The captured step's collectives (a replayed step's are these).
  const std::vector<CollectiveRecord>& graph_log() const { return graph_log_; }
  // Why capture failed ("not captured: ..."), empty if it did not fail.
  const std::string& capture_failure() const { return capture_failure_; }

 private:
  // Forward, backward, reduction and DeviceOptimizerStep on ids/targets: report and out filled.
  void Enqueue(const std::vector<Value>& ids, const std::vector<Value>& targets,
               TypeTrace* types, Tape& tape, TracingRecorder& rec,
               const std::function<void(const char*)>& phase, Outcome& out);
  void Capture(int64_t step, const Tensor& ids_g, const Tensor& targets_g, TypeTrace* types,
               Tape& tape, TracingRecorder& rec, const std::function<void(const char*)>& phase,
               Outcome& out);

  const Model& layout_;
  const RunPlan& plan_;
  double clip_;
  bool capture_;
  OverlapOptions overlap_;
  RankState& state_;
  const RankBatches& batches_;
  RankContext& ctx_;
  Device dev_;
  Tensor lr_device_;
  Tensor report_;                                // f64[2] {loss, norm^2} of the last Enqueue
  std::unique_ptr<cuda::CudaGraph> graph_;       // the captured step
  bool capture_tried_ = false;
  std::vector<Value> graph_ids_, graph_targets_;  // its inputs, at fixed addresses
  Tensor graph_report_;                           // its output
  std::vector<Value> graph_grads_;                // its gradients (for the byte counts)
  std::vector<CollectiveRecord> graph_log_;       // the collectives it records
  int64_t replays_ = 0;
  std::string capture_failure_;
};

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_TRAIN_DEVICE_STEP_H_
