#include "models/train/device_step.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "models/train/cuda_graph_step.h"
#include "tensor/cuda/device_memory.h"
#include "tensor/cuda/runtime.h"
#include "tensor/error.h"

namespace shardmap {

DeviceStep::DeviceStep(const Model& layout, const RunPlan& plan, double clip, bool capture,
                       const OverlapOptions& overlap, RankState& state,
                       const RankBatches& batches, RankContext& ctx)
    : layout_(layout),
      plan_(plan),
      clip_(clip),
      capture_(capture),
      overlap_(overlap),
      state_(state),
      batches_(batches),
      ctx_(ctx),
      dev_(ctx.device()),
      lr_device_(Tensor::Zeros({}, DType::kF64, ctx.device())) {}

void DeviceStep::Enqueue(const std::vector<Value>& ids, const std::vector<Value>& targets,
                         TypeTrace* types, Tape& tape, TracingRecorder& rec,
                         const std::function<void(const char*)>& phase, Outcome& out) {
  std::unique_ptr<GradientBuckets> buckets = NewGradientBuckets(layout_, overlap_, state_);
  const FsdpSchedule fsdp{overlap_.fsdp_prefetch, overlap_.reshard_after_forward};
  out.bp = OneProgramBackprop(layout_, state_.params, ids, targets, plan_.global_tokens, types,
                              tape, rec, buckets.get(), overlap_.on ? &fsdp : nullptr);
  out.backprop_logged = ctx_.collective_log().size();
  phase("optimizer");
  out.reduce_us = TraceNowUs();
  FinishGradients(layout_, buckets.get(), out.bp.grads);
  out.optimizer_us = TraceNowUs();
  const std::vector<bool> counted(state_.held.size(), true);
  report_ = DeviceOptimizerStep(out.bp.loss, out.bp.grads, counted, clip_, lr_device_,
                                state_.held_names, state_.params, state_.opt);
}

void DeviceStep::Capture(int64_t step, const Tensor& ids_g, const Tensor& targets_g,
                         TypeTrace* types, Tape& tape, TracingRecorder& rec,
                         const std::function<void(const char*)>& phase, Outcome& out) {
  capture_tried_ = true;
  // The graph's activations come from a private pool: hand the eager step's cached blocks back
  // first so the GPU does not hold both (cudaFree waits for the device).
  cuda::DeviceAllocator(dev_.index).EmptyCache();
  std::vector<Tensor> host_ids, host_targets;
  batches_.HostMicrosteps(ids_g, targets_g, &host_ids, &host_targets);
  for (size_t j = 0; j < host_ids.size(); ++j) {
    graph_ids_.emplace_back(host_ids[j].To(dev_), batches_.row_type());
    graph_targets_.emplace_back(host_targets[j].To(dev_), batches_.row_type());
  }
  graph_ = std::make_unique<cuda::CudaGraph>(dev_.index);
  absl::Status s = graph_->Capture(
      [&] { Enqueue(graph_ids_, graph_targets_, types, tape, rec, phase, out); });
  if (s.ok()) s = graph_->Replay();
  if (s.ok()) {
    graph_report_ = report_;
    graph_grads_ = out.bp.grads;
    graph_log_ = ctx_.collective_log();
    ++replays_;
    state_.opt.set_steps(step + 1);
    return;
  }
  // Nothing captured ran: undo the host-side effects of the recording and run the step eagerly,
  // as every later one.
  graph_.reset();
  graph_ids_.clear();
  graph_targets_.clear();
  tape.Clear();
  state_.opt.set_steps(step);
  ctx_.ClearCollectiveLog();
  capture_failure_ = absl::StrCat("not captured: ", s.message(), "; the steps run eagerly");
  std::vector<Value> ids, targets;
  batches_.Microsteps(ids_g, targets_g, &ids, &targets);
  Enqueue(ids, targets, types, tape, rec, phase, out);
}

DeviceStep::Outcome DeviceStep::Run(int64_t step, int64_t first_step, double lr,
                                    const Tensor& ids_g, const Tensor& targets_g,
                                    TypeTrace* types, Tape& tape, TracingRecorder& rec,
                                    const std::function<void(const char*)>& phase) {
  Outcome out;
  // The lr for this step, ordered before the step's kernels on this rank's stream.
  cuda::CopyInto(Tensor::Scalar(lr, DType::kF64), lr_device_);
  if (graph_ != nullptr) {  // replay: this step's batch into the captured inputs
    std::vector<Tensor> host_ids, host_targets;
    batches_.HostMicrosteps(ids_g, targets_g, &host_ids, &host_targets);
    for (size_t j = 0; j < host_ids.size(); ++j) {
      cuda::CopyInto(host_ids[j], graph_ids_[j].tensor);
      cuda::CopyInto(host_targets[j], graph_targets_[j].tensor);
    }
    out.reduce_us = out.optimizer_us = TraceNowUs();
    if (absl::Status s = graph_->Replay(); !s.ok()) throw OpError(s);
    report_ = graph_report_;
    out.bp.grads = graph_grads_;
    ++replays_;
    state_.opt.set_steps(step + 1);  // the host's count (the graph advances the device's)
  } else if (capture_ && !capture_tried_ && step > first_step) {
    Capture(step, ids_g, targets_g, types, tape, rec, phase, out);
  } else {
    std::vector<Value> ids, targets;
    batches_.Microsteps(ids_g, targets_g, &ids, &targets);
    Enqueue(ids, targets, types, tape, rec, phase, out);
  }
  const std::vector<double> r = report_.ToVector<double>();  // waits for the step
  // The step's one sync point: NCCL's stream-ordered collectives report a failure their
  // watchdog found here (what was read after it is garbage).
  if (absl::Status s = ctx_.world().AsyncError(); !s.ok()) throw OpError(s);
  out.loss = r[0];
  out.norm = std::sqrt(r[1]);
  // A non-finite loss or norm skipped the update on the device; every rank stops here.
  if (!std::isfinite(out.loss) || !std::isfinite(out.norm)) {
    NonFiniteStop(step, out.loss, out.norm);
  }
  return out;
}

}  // namespace shardmap
