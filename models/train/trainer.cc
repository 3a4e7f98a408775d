#include "models/train/trainer.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "autograd/tape.h"
#include "models/train/batch_rows.h"
#include "models/train/cuda_graph_step.h"
#include "models/train/device_step.h"
#include "models/train/rank_state.h"
#include "models/train/run_plan.h"
#include "models/train/step_report.h"
#include "models/train/strategies.h"
#include "shardmap/collective_ops.h"
#include "shardmap/ops.h"
#include "shardmap/spmd_runner.h"
#include "shardmap/tape_hook.h"
#include "tensor/cuda/device_memory.h"
#include "tensor/cuda/runtime.h"
#include "tensor/error.h"
#include "tensor/memory_tracker.h"
#include "tensor/ops/elementwise.h"

namespace shardmap {
namespace {

// Step `step`'s global batch. A meta rank keeps only the shapes of the rows it uploads (nothing
// reads a token on it), so its batch is meta: the same tensors allocated in the same order as
// BatchOf's (a random order's draw included), which memory trackers count alike, without
// copying [batch, seq] token ids twice a step (~5% of a shape-only profile).
void StepBatch(const std::vector<int64_t>& tokens, int64_t step, int64_t batch, int64_t seq,
               const BatchOrder& order, Device dev, Tensor* ids, Tensor* targets) {
  if (!dev.is_meta()) {
    BatchOf(tokens, step, batch, seq, order, ids, targets);
    return;
  }
  if (order.random) {
    RandomBatchStarts(static_cast<int64_t>(tokens.size()), step, batch, seq, order.seed);
  }
  *ids = Tensor::Empty({batch, seq}, DType::kI64, dev);
  *targets = Tensor::Empty({batch, seq}, DType::kI64, dev);
}

// What every rank's trainer shares with TrainGpt: the run's inputs and the result being filled.
// The reporting rank writes the per-step fields of `result`; everything else is under `mu`.
struct SharedRun {
  const Model& layout;
  const TrainOptions& options;
  const std::vector<int64_t>& tokens;
  const RunPlan& plan;
  const StateSource& source;
  int reporter = 0;      // rank 0, or this process's rank (comm), or only_rank
  bool capture = false;  // capture the device step as a CUDA graph (DecideCudaGraph)
  std::mutex mu;  // std::mutex: ThreadSanitizer sees it (Debian's absl is not instrumented)
  TrainResult result;
  std::vector<std::vector<Tensor>> final_locals;  // per rank, index k as AddFinalTensor's
  std::vector<double> bubbles;                    // per rank, pipeline runs
  int64_t graph_replays = 0;
};

// One step's numbers, whichever way it ran.
struct StepOutcome {
  Backprop bp;
  double loss = 0, norm = 0;
  StepTimes times;
  size_t backprop_logged = 0;  // collectives the forward and backward logged
  MoeCounts moe;
};

// A failed trace write stops the run (the trace file is what the user asked for).
void TraceError(const absl::Status& s) {
  if (!s.ok()) throw OpError(s);
}

// One rank's whole run: its state, every step (host or device), evaluation, snapshots and the
// reporting rank's result.
class RankTrainer {
 public:
  RankTrainer(SharedRun& run, RankContext& ctx);
  void Run();

 private:
  StepOutcome HostStep(int64_t step, double lr, const Tensor& ids_g, const Tensor& targets_g,
                       TypeTrace* types, TracingRecorder& rec, bool tracing);
  StepOutcome OnDevice(int64_t step, double lr, const Tensor& ids_g, const Tensor& targets_g,
                       TypeTrace* types, TracingRecorder& rec);
  void Trace(const StepOutcome& out);
  double MaybeEvaluate(int64_t step);
  void MaybeSnapshot(int64_t step, double loss);
  void Report(int64_t step, double lr, const StepOutcome& out, double val_loss,
              const std::vector<CollectiveRecord>& log);
  void Finish();
  void Phase(const char* name) const {
    if (options_.hooks.on_phase) options_.hooks.on_phase(name);
  }

  SharedRun& run_;
  const Model& layout_;
  const TrainOptions& options_;
  const RunPlan& plan_;
  RankContext& ctx_;
  const int rank_, stage_;
  const Device dev_;
  RankState state_;
  RankBatches batches_;
  SpmdType boundary_type_;  // the pipeline boundary's
  Tape tape_;
  MemoryTracker* step_mem_ = nullptr;  // the first step's tracker (reporting rank), while it runs
  std::vector<TraceEvent> events_;
  BackwardTracer backward_tracer_;  // a span per VJP and per backward collective
  std::unique_ptr<DeviceStep> device_;  // GPU ranks outside a pipeline
};

RankTrainer::RankTrainer(SharedRun& run, RankContext& ctx)
    : run_(run),
      layout_(run.layout),
      options_(run.options),
      plan_(run.plan),
      ctx_(ctx),
      rank_(ctx.rank()),
      stage_(run.plan.pp_index >= 0 ? ctx.coord(run.plan.pp_index) : 0),
      dev_(ctx.device()),
      state_(run.layout, run.plan, run.source, run.options.optimizer.adamw, ctx.rank(), stage_,
             ctx.device()),
      batches_(run.layout, run.plan, run.options.batch, ctx.rank(), ctx.device()),
      backward_tracer_(&events_) {
  if (plan_.pipelined) {
    CreateAllCommunicators(ctx);  // stages issue different collectives
    boundary_type_ = PipelineBoundaryType(layout_, plan_, dev_);
  }
  if (options_.tracing.writer != nullptr) {
    TraceError(options_.tracing.writer->ThreadName(rank_, RankDescription(layout_.mesh(), rank_)));
    TraceError(options_.tracing.writer->ThreadName(
        kCollectiveTrackBase + rank_,
        absl::StrCat(RankDescription(layout_.mesh(), rank_), " collectives")));
  }
  if (dev_.is_cuda() && !plan_.pipelined) {
    device_ = std::make_unique<DeviceStep>(layout_, plan_, options_.optimizer.clip, run.capture,
                                           options_.overlap, state_, batches_, ctx);
  }
}

void RankTrainer::Run() {
  const ModelShape& c = layout_.shape();
  const int64_t first_step = run_.source.first_step;
  for (int64_t step = first_step; step < options_.steps; ++step) {
    ctx_.ClearCollectiveLog();
    Tensor ids_g, targets_g;
    StepBatch(run_.tokens, step, options_.batch, c.seq, options_.batch_order, dev_, &ids_g,
              &targets_g);
    TypeTrace* types = step == first_step ? options_.tracing.types : nullptr;
    const bool tracing = options_.tracing.keep_events || (options_.tracing.writer != nullptr &&
                                            (!options_.tracing.step_filter || options_.tracing.step_filter(step)));
    tape_.set_backward_observer(tracing ? &backward_tracer_ : nullptr);
    Phase("step");
    const double lr = options_.optimizer.lr_at ? options_.optimizer.lr_at(step) : options_.optimizer.adamw.lr;
    if (!std::isfinite(lr) || lr < 0) {
      throw OpError(absl::InvalidArgumentError(absl::StrCat(
          "step ", step, ": the learning-rate schedule gives ", lr,
          "; it must be finite and >= 0")));
    }
    const double t0 = TraceNowUs();
    TracingRecorder rec(&tape_, tracing ? &events_ : nullptr, rank_, t0);
    // The first step's peak of step tensors on the reporting rank (CPU and meta ranks; a GPU
    // rank reports its allocator's peak instead).
    std::optional<MemoryTracker> mem;
    if (step == run_.source.first_step && rank_ == run_.reporter && !dev_.is_cuda()) {
      step_mem_ = &mem.emplace();
    }
    StepOutcome out = device_ != nullptr
                          ? OnDevice(step, lr, ids_g, targets_g, types, rec)
                          : HostStep(step, lr, ids_g, targets_g, types, rec, tracing);
    if (mem) run_.result.peak_step_bytes_per_rank = mem->peak_bytes();
    step_mem_ = nullptr;
    out.times.start = t0;
    out.times.backward = out.bp.forward_end_us;
    if (dev_.is_cuda()) cuda::Synchronize(dev_.index);  // the step's time includes its kernels
    out.times.end = TraceNowUs();
    Phase("end");
    if (plan_.pipelined) {
      std::lock_guard<std::mutex> lock(run_.mu);
      run_.bubbles[rank_] = 1.0 - out.bp.busy_us / std::max(out.bp.total_us, 1e-9);
    }
    if (tracing) Trace(out);
    // The step's own collectives (evaluation and snapshot gathers below are not the step's; a
    // replayed step's are the captured step's).
    const std::vector<CollectiveRecord> log =
        device_ != nullptr && device_->replayed()
            ? device_->graph_log()
            : std::vector<CollectiveRecord>(ctx_.collective_log().begin(),
                                            ctx_.collective_log().end());
    const double val_loss = MaybeEvaluate(step);
    MaybeSnapshot(step, out.loss);
    if (rank_ == run_.reporter) Report(step, lr, out, val_loss, log);
  }
  Finish();
}

StepOutcome RankTrainer::HostStep(int64_t step, double lr, const Tensor& ids_g,
                                  const Tensor& targets_g, TypeTrace* types,
                                  TracingRecorder& rec, bool tracing) {
  StepOutcome out;
  std::vector<Value> ids, targets;
  std::unique_ptr<GradientBuckets> buckets = NewGradientBuckets(layout_, options_.overlap, state_);
  const FsdpSchedule fsdp{options_.overlap.fsdp_prefetch, options_.overlap.reshard_after_forward};
  if (plan_.pipelined) {
    batches_.Microbatches(ids_g, targets_g, &ids, &targets);
    out.bp = PipelineBackprop(layout_, plan_, stage_, state_.params, ids, targets, boundary_type_,
                              types, tracing ? &backward_tracer_ : nullptr, buckets.get(),
                              options_.overlap.on ? &fsdp : nullptr);
  } else {
    batches_.Microsteps(ids_g, targets_g, &ids, &targets);
    out.bp = OneProgramBackprop(layout_, state_.params, ids, targets, plan_.global_tokens, types,
                                tape_, rec, buckets.get(), options_.overlap.on ? &fsdp : nullptr);
  }
  out.backprop_logged = ctx_.collective_log().size();
  if (step_mem_ != nullptr) run_.result.peak_backprop_bytes_per_rank = step_mem_->peak_bytes();
  Phase("optimizer");
  out.times.reduce = TraceNowUs();
  std::vector<Value>& grads = out.bp.grads;
  FinishGradients(layout_, buckets.get(), grads);
  std::vector<bool> counted(state_.held.size(), true);
  ExchangeTiedEmbeddingGrad(layout_, plan_, stage_, state_.held, dev_, grads, counted);
  out.loss = ShareLoss(layout_, plan_, stage_, out.bp.loss, dev_);
  out.moe = ReduceMoeCounts(layout_, out.bp.moe, dev_);
  out.norm = std::sqrt(GlobalGradNormSquared(grads, counted));
  // The loss and norm reads are this step's sync point: NCCL's stream-ordered collectives
  // report a failure their watchdog found here (what was read after it is garbage).
  if (absl::Status s = ctx_.world().AsyncError(); !s.ok()) throw OpError(s);
  // Every rank sees the same loss and norm, so every rank stops here together.
  if (!std::isfinite(out.loss) || !std::isfinite(out.norm)) {
    NonFiniteStop(step, out.loss, out.norm);
  }
  const double coef = options_.optimizer.clip > 0 ? ClipCoefficient(out.norm, options_.optimizer.clip) : 1.0;
  std::vector<NamedTensor> local, named_grads;
  for (size_t i = 0; i < state_.held.size(); ++i) {
    const std::string& name = state_.held_names[i];
    local.push_back({name, state_.params[i].tensor});
    named_grads.push_back({name, grads[i].tensor});
  }
  state_.opt.set_lr(lr);
  out.times.optimizer = TraceNowUs();
  // Clipping folded into AdamW's fused pass: no scaled copy of the gradients.
  const AdamWStepControl clip{.grad_multiplier = coef < 1.0 ? coef : 1.0};
  if (absl::Status s = state_.opt.Step(local, named_grads, Tensor(), clip); !s.ok()) {
    throw OpError(s);
  }
  for (size_t i = 0; i < state_.held.size(); ++i) state_.params[i].tensor = local[i].tensor;
  return out;
}

StepOutcome RankTrainer::OnDevice(int64_t step, double lr, const Tensor& ids_g,
                                  const Tensor& targets_g, TypeTrace* types,
                                  TracingRecorder& rec) {
  DeviceStep::Outcome d = device_->Run(step, run_.source.first_step, lr, ids_g, targets_g, types,
                                       tape_, rec, [this](const char* p) { Phase(p); });
  StepOutcome out;
  out.bp = std::move(d.bp);
  out.loss = d.loss;
  out.norm = d.norm;
  out.times.reduce = d.reduce_us;
  out.times.optimizer = d.optimizer_us;
  out.backprop_logged = d.backprop_logged;
  out.moe = ReduceMoeCounts(layout_, out.bp.moe, dev_);
  return out;
}

void RankTrainer::Trace(const StepOutcome& out) {
  AppendStepEvents(layout_.mesh(), rank_, plan_, out.times, out.bp.spans, ctx_.collective_log(),
                   out.backprop_logged, &events_);
  AppendCollectiveSpans(layout_.mesh(), rank_, ctx_.collective_log(), &events_);
  if (options_.tracing.writer != nullptr) {  // streamed: written now, not kept
    TraceError(WriteStepEvents(*options_.tracing.writer, events_));
    if (!options_.tracing.keep_events) events_.clear();
  }
}

double RankTrainer::MaybeEvaluate(int64_t step) {
  if (options_.eval.every <= 0 ||
      ((step + 1) % options_.eval.every != 0 && step + 1 != options_.steps)) {
    return std::numeric_limits<double>::quiet_NaN();
  }
  // The mean loss of eval_steps validation batches, forward only.
  double sum = 0;
  for (int64_t e = 0; e < options_.eval.steps; ++e) {
    Tensor vi, vt;
    BatchAt(options_.eval.tokens, e, options_.batch, layout_.shape().seq, &vi, &vt);
    std::vector<Value> ids, targets;
    if (plan_.pipelined) {
      batches_.Microbatches(vi, vt, &ids, &targets);
      sum += PipelineForwardLoss(layout_, plan_, stage_, state_.held, state_.params, ids, targets,
                                 boundary_type_, dev_);
    } else {
      batches_.Microsteps(vi, vt, &ids, &targets);
      sum += ForwardLoss(layout_, state_.params, ids, targets, plan_.global_tokens);
    }
  }
  return sum / static_cast<double>(options_.eval.steps);
}

void RankTrainer::MaybeSnapshot(int64_t step, double loss) {
  if (options_.checkpoint.save_every <= 0 || (step + 1) % options_.checkpoint.save_every != 0) return;
  // Every rank helps gather the global tensors; the reporter saves.
  std::vector<Tensor> globals = state_.GatherGlobals();
  if (rank_ != run_.reporter) return;
  TrainResult snapshot;
  for (size_t k = 0; k < globals.size(); ++k) {
    if (globals[k].defined()) AddFinalTensor(layout_, k, globals[k], &snapshot);
  }
  snapshot.steps_done = step + 1;
  snapshot.losses = run_.result.losses;
  snapshot.losses.push_back(loss);
  if (absl::Status s = options_.checkpoint.on_save(snapshot); !s.ok()) {
    throw OpError(absl::Status(
        s.code(), absl::StrCat("saving the checkpoint of step ", step + 1, ": ", s.message())));
  }
}

void RankTrainer::Report(int64_t step, double lr, const StepOutcome& out, double val_loss,
                         const std::vector<CollectiveRecord>& log) {
  TrainResult& result = run_.result;
  if (step == run_.source.first_step) {
    result.activation_bytes_per_rank = out.bp.activation_bytes;
    result.peak_activation_bytes_per_rank = out.bp.peak_saved_bytes;
    result.largest_activation_bytes = out.bp.largest_activation_bytes;
    result.peak_gathered_bytes_per_rank = out.bp.peak_gathered_bytes;
  }
  result.losses.push_back(out.loss);
  result.grad_norms.push_back(out.norm);
  if (layout_.shape().moe.on()) result.moe_dropped.push_back(out.moe.dropped);
  if (options_.hooks.on_step) {
    const int64_t peak =
        dev_.is_cuda() ? cuda::DeviceAllocator(dev_.index).stats().peak_allocated_bytes : -1;
    result.peak_device_bytes_per_rank = peak;
    const int64_t global_tokens = plan_.global_tokens;
    options_.hooks.on_step(StepInfo{step, out.loss, out.norm, (out.times.end - out.times.start) * 1e-6,
                              &log, out.moe.dropped, out.moe.assignments,
                              out.moe.dropped_tokens, peak, options_.steps, lr,
                              global_tokens * (step + 1), val_loss});
  }
  if (step + 1 == options_.steps) {
    result.log = log;
    result.param_bytes_per_rank += state_.ParamBytes();
    result.optimizer_bytes_per_rank += state_.OptimizerBytes(out.bp.grads);
    for (const Value& g : out.bp.grads) result.gradient_bytes_per_rank += g.tensor.nbytes();
  }
}

void RankTrainer::Finish() {
  std::vector<Tensor> mine = state_.LocalTensors();
  if (options_.tracing.keep_events) {
    std::lock_guard<std::mutex> lock(run_.mu);
    run_.result.trace.insert(run_.result.trace.end(), events_.begin(), events_.end());
  }
  if (options_.runtime.comm != nullptr) {
    // One process per rank: the global tensors come from collectives, on every rank.
    mine = state_.GatherGlobals();
  }
  if (options_.hooks.only_rank >= 0) mine.clear();  // one rank: nothing is assembled
  for (Tensor& t : mine) {
    if (t.defined()) t = t.To(Device::Cpu());  // results are host tensors
  }
  std::lock_guard<std::mutex> lock(run_.mu);
  if (rank_ == run_.reporter) {
    run_.result.device = dev_.ToString();
    if (dev_.is_cuda()) {
      run_.result.peak_device_bytes_per_rank =
          cuda::DeviceAllocator(dev_.index).stats().peak_allocated_bytes;
    }
  }
  if (device_ != nullptr) {
    run_.graph_replays += device_->replays();
    if (!device_->capture_failure().empty()) {
      run_.result.cuda_graph_note = device_->capture_failure();
    }
  }
  run_.final_locals[rank_] = std::move(mine);
}

// Where the ranks run: their devices (each GPU's peak memory is measured from here).
std::vector<Device> RunDevices(const Mesh& mesh, const TrainOptions& options) {
  std::vector<Device> devices(mesh.size(), Device::Cpu());
  if (!options.runtime.placement.is_cpu()) devices = *ResolvePlacement(options.runtime.placement, mesh.size());
  if (options.runtime.comm != nullptr && options.runtime.comm->memory_space().device) {
    devices.assign(mesh.size(), Device::Cuda(options.runtime.comm->memory_space().device_index));
  }
  for (const Device& d : devices) {
    if (d.is_cuda()) cuda::DeviceAllocator(d.index).ResetPeakStats();
  }
  return devices;
}

}  // namespace

absl::StatusOr<TrainResult> TrainGpt(const Model& given, const std::vector<NamedTensor>& init,
                                     const std::vector<int64_t>& tokens,
                                     const TrainOptions& options) {
  // The run's model: options.recompute, when set, in place of the model's own.
  const std::unique_ptr<Model> recomputed =
      options.recompute ? given.WithRecompute(*options.recompute) : nullptr;
  const Model& layout = recomputed ? *recomputed : given;
  const Mesh& mesh = layout.mesh();
  absl::StatusOr<RunPlan> plan = PlanRun(layout, options);
  if (!plan.ok()) return plan.status();
  if (absl::Status s = CheckTokens(layout.shape(), tokens); !s.ok()) return s;
  absl::StatusOr<StateSource> source = OpenStateSource(layout, init, options);
  if (!source.ok()) return source.status();
  SharedRun run{layout, options, tokens, *plan, *source};
  run.final_locals.resize(mesh.size());
  run.bubbles.resize(mesh.size());
  run.reporter = options.hooks.only_rank >= 0     ? options.hooks.only_rank
                 : options.runtime.comm != nullptr ? options.runtime.comm->rank()
                                           : 0;
  TrainResult& result = run.result;
  result.recompute = RecomputeModeName(layout.shape().recompute);
  const std::vector<Device> devices = RunDevices(mesh, options);
  result.ranks_per_device =
      options.runtime.comm != nullptr
          ? 1
          : static_cast<int>(std::count(devices.begin(), devices.end(), devices[run.reporter]));
  const CudaGraphDecision graph_plan = DecideCudaGraph(layout, options, devices, source->first_step);
  result.cuda_graph_note = graph_plan.note;
  run.capture = graph_plan.capture;
  auto body = [&run](RankContext& ctx) {
    // A GPU step's index checks are read with its loss, not one host sync per op (a bad id
    // still stops the run, naming the op; RunRank's last wait runs the rest).
    cuda::DeferredIndexChecksScope defer(true);
    RankTrainer(run, ctx).Run();
  };
  SpmdOptions spmd;
  spmd.placement = options.runtime.placement;
  absl::Status status = options.hooks.spmd_runner     ? options.hooks.spmd_runner(mesh, body)
                        : options.runtime.comm != nullptr ? RunOnCommunicator(*options.runtime.comm, mesh, body)
                                                  : RunSpmd(mesh, body, spmd);
  if (!status.ok()) return status;
  result.steps_done = options.steps;
  if (options.hooks.only_rank >= 0) return std::move(result);  // one rank: its report, no tensors
  result.cuda_graph_replays = run.graph_replays;
  result.cuda_graph_used = run.graph_replays > 0;
  if (result.cuda_graph_used) {
    result.cuda_graph_note = absl::StrCat("captured at step ", source->first_step + 1, " after ",
                                          "one eager warm-up step (", run.graph_replays,
                                          " replays)");
  }
  if (options.runtime.comm != nullptr) {
    std::vector<Tensor>& g = run.final_locals[run.reporter];  // already global
    for (size_t k = 0; k < g.size(); ++k) {
      if (g[k].defined()) AddFinalTensor(layout, k, g[k], &result);
    }
  } else if (absl::Status s = AssembleFinalTensors(layout, *plan, run.final_locals, &result);
             !s.ok()) {
    return s;
  }
  if (plan->pipelined) {
    double bubble = 0;
    for (double b : run.bubbles) bubble += b;
    result.pipeline_bubble = bubble / mesh.size();
  }
  if (!options.checkpoint.save_path.empty() && run.reporter == 0) {
    if (absl::Status s = SaveTrainResult(options.checkpoint.save_path, layout, result); !s.ok()) return s;
  }
  return std::move(result);
}

void AddFinalTensor(const Model& layout, size_t k, Tensor global, TrainResult* result) {
  const size_t np = layout.params().size();
  std::vector<NamedTensor>& dst = k < np       ? result->params
                                  : k < 2 * np ? result->adam_state.exp_avg
                                               : result->adam_state.exp_avg_sq;
  // Gathered or assembled FSDP tensors carry the padding; results and checkpoints do not.
  const ParamInfo& pi = layout.params()[k % np];
  dst.push_back({pi.name, TrimFsdpPad(global, pi)});
}

absl::Status SaveTrainResult(const std::string& path, const Model& layout,
                             const TrainResult& result) {
  const bool has_moments = result.adam_state.exp_avg.size() == layout.params().size();
  return SaveGpt(path, layout, result.params, has_moments ? &result.adam_state : nullptr,
                 result.steps_done);
}

double ClipCoefficient(double norm, double max_norm) {
  return std::min(1.0, max_norm / (norm + 1e-6));
}

double GlobalGradNormSquared(const std::vector<Value>& grads) {
  return GlobalGradNormSquared(grads, std::vector<bool>(grads.size(), true));
}

double GlobalGradNormSquared(const std::vector<Value>& grads, const std::vector<bool>& counted) {
  RankContext& ctx = RankContext::Get("GlobalGradNormSquared");
  const Mesh& mesh = ctx.mesh();
  NoGradScope no_tape;
  Value total;
  for (size_t k = 0; k < grads.size(); ++k) {
    const Value& g = grads[k];
    Value s = sum_partial(g * g, {});  // P where g is sharded
    if (!counted[k]) s = s * 0.0;
    // Replicated parts count once: keep the value on index 0 of those axes (R -> P).
    std::vector<std::string> replicated = AxesOfKind(mesh, s.type, AxisKind::kR);
    if (!replicated.empty()) s = convert(s, Axes(replicated), Convert::kRToP);
    // Parts that differ per device (a pipeline stage's own parameters) add up (V -> P).
    std::vector<std::string> varying = AxesOfKind(mesh, s.type, AxisKind::kV);
    if (!varying.empty()) s = reinterpret(s, Axes(varying));
    total = total.defined() ? total + s : s;
  }
  if (mesh.num_axes() == 0) return total.item();
  return all_reduce(total, Axes(mesh.axis_names())).item();
}

}  // namespace shardmap
