#include "models/trainer.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <mutex>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "autograd/tape.h"
#include "autograd/value_and_grad.h"
#include "nlohmann/json.hpp"
#include "models/pipeline.h"
#include "models/ring_attention.h"
#include "shardmap/collective_ops.h"
#include "shardmap/ops.h"
#include "shardmap/sharding.h"
#include "shardmap/spmd_runner.h"
#include "shardmap/tape_hook.h"
#include "tensor/cuda/device_memory.h"
#include "tensor/cuda/runtime.h"
#include "tensor/error.h"
#include "tensor/ops/elementwise.h"

namespace shardmap {
namespace {

absl::Status Invalid(const std::string& msg) { return absl::InvalidArgumentError(msg); }

// Which stage holds which parameters (without a pipeline: one stage holding all of them).
struct StagePlan {
  std::vector<int64_t> first_layer, layers;  // per stage
  std::vector<std::vector<int>> owned;       // per stage: parameter indices (layout order)
  std::vector<int> owner;                    // per parameter: the first stage holding it
};

StagePlan PlanStages(const GptLayout& layout, const std::vector<int64_t>& sizes) {
  const int p = static_cast<int>(sizes.size());
  StagePlan plan;
  plan.layers = sizes;
  plan.owned.resize(p);
  int64_t first = 0;
  std::vector<int> stage_of_layer;
  for (int s = 0; s < p; ++s) {
    plan.first_layer.push_back(first);
    for (int64_t i = 0; i < sizes[s]; ++i) stage_of_layer.push_back(s);
    first += sizes[s];
  }
  const std::vector<ParamInfo>& params = layout.params();
  plan.owner.assign(params.size(), -1);
  for (size_t k = 0; k < params.size(); ++k) {
    const std::string& name = params[k].name;
    std::vector<int> stages;
    if (name == "wte.weight") {
      stages = {0};
      if (p > 1) stages.push_back(p - 1);  // the lm_head's copy
    } else if (name == "wpe.weight") {
      stages = {0};
    } else if (name.rfind("h.", 0) == 0) {
      stages = {stage_of_layer[std::stoi(name.substr(2))]};
    } else {
      stages = {p - 1};  // ln_f
    }
    plan.owner[k] = stages[0];
    for (int s : stages) plan.owned[s].push_back(static_cast<int>(k));
  }
  return plan;
}

// Rows [k*B/M, (k+1)*B/M) of a [B, T] batch, flattened.
Tensor MicrobatchRows(const Tensor& batch, int64_t k, int64_t m) {
  const int64_t per = batch.dim(0) / m, seq = batch.dim(1);
  std::vector<int64_t> v(per * seq);
  for (int64_t i = 0; i < per * seq; ++i) {
    v[i] = static_cast<int64_t>(batch.at(k * per * seq + i));
  }
  return Tensor::FromVector<int64_t>({per * seq}, v);
}

// The local shape of parameter p on any rank (specs split dims evenly).
Shape LocalShape(const ParamInfo& p, const Mesh& mesh) {
  Shape s = p.global_shape;
  for (int d = 0; d < p.spec.size(); ++d) s[d] /= std::max(1, p.spec.NumBlocks(mesh, d));
  return s;
}

// The names of the axes of `type` whose kind is `kind` (SpmdType::AxesOfKind), less `skip` (an
// axis index, or -1: the pipeline axis, whose sums the pipeline makes itself).
std::vector<std::string> AxesOfKind(const Mesh& mesh, const SpmdType& type, AxisKind kind,
                                    int skip = -1) {
  const uint32_t skipped = skip >= 0 ? 1u << skip : 0u;
  return mesh.AxisNamesOf(type.AxesOfKind(kind) & ~skipped);
}

// What one step's forward and backward hand to the rest of the step.
struct Backprop {
  std::vector<Value> grads;  // per held parameter (the tape's dual types: pending sums P)
  Value loss;                // the loss's local share; undefined on pipeline stages but the last
  MoeStats moe;
  int64_t peak_saved_bytes = 0, activation_bytes = 0, largest_activation_bytes = 0;
  double forward_end_us = 0;         // one program: when the forward ended (the trace)
  double busy_us = 0, total_us = 0;  // pipeline: time in forwards/backwards, whole timetable
  std::vector<PipelineSpan> spans;   // pipeline: this rank's forwards and backwards
};

// What is fixed before the first step.
struct RunPlan {
  bool pipelined = false;
  int stages = 1;
  int64_t microbatches = 1;
  std::unique_ptr<Timetable> timetable;  // pipelined
  StagePlan stage_plan;
  int64_t local_rows = 0;     // tokens of one microbatch on one rank
  int64_t boundary_rows = 0;  // rows of the residual stream crossing stages
  int64_t first_step = 0;
};

// The strategy "one program": GptLoss on a tape, one backward pass.
// With several microsteps (gradient accumulation) each runs its forward and backward in turn;
// every loss share is over the whole batch's tokens, so the losses and gradients add up.
Backprop OneProgramBackprop(const GptLayout& layout, const std::vector<Value>& params,
                            const std::vector<Value>& ids, const std::vector<Value>& targets,
                            int64_t global_tokens, TypeTrace* types, Tape& tape,
                            TracingRecorder& rec) {
  Backprop out;
  for (size_t j = 0; j < ids.size(); ++j) {
    std::vector<Value> watched;
    for (const Value& p : params) watched.push_back(tape.Watch(p));
    Value loss;
    {
      ScopedRecorder scope(&rec);
      loss = GptLoss(layout, watched, ids[j], targets[j], global_tokens,
                     j == 0 ? types : nullptr, &out.moe);
    }
    if (j == 0) out.forward_end_us = TraceNowUs();
    std::vector<Value> grads = tape.Backward(loss, LossSeed(loss), watched);
    out.peak_saved_bytes = std::max(out.peak_saved_bytes, tape.peak_saved_bytes());
    tape.Clear();  // drop the saved activations now
    loss.node = -1;
    NoGradScope no_tape;
    if (j == 0) {
      out.grads = std::move(grads);
      out.loss = loss;
    } else {
      for (size_t i = 0; i < grads.size(); ++i) out.grads[i] = out.grads[i] + grads[i];
      out.loss = out.loss + loss;
    }
  }
  out.activation_bytes = rec.activation_bytes() / static_cast<int64_t>(ids.size());
  out.largest_activation_bytes = rec.largest_activation();
  return out;
}

// The forward-only loss of `ids` on every rank (its pending sums added up): evaluation.
double ForwardLoss(const GptLayout& layout, const std::vector<Value>& params,
                   const std::vector<Value>& ids, const std::vector<Value>& targets,
                   int64_t global_tokens) {
  NoGradScope no_tape;
  const Mesh& mesh = layout.mesh();
  Value total;
  for (size_t j = 0; j < ids.size(); ++j) {
    MoeStats ignored;
    Value l = GptLoss(layout, params, ids[j], targets[j], global_tokens, nullptr, &ignored);
    total = total.defined() ? total + l : l;
  }
  std::vector<std::string> partial = AxesOfKind(mesh, total.type, AxisKind::kP);
  if (!partial.empty()) total = all_reduce(total, Axes(partial));
  return total.item();
}

// The strategy "pipeline": this stage's part of the lockstep timetable over the microbatches.
Backprop PipelineBackprop(const GptLayout& layout, const RunPlan& plan, int stage,
                          const std::vector<Value>& params, const std::vector<Value>& ids,
                          const std::vector<Value>& targets, int64_t global_tokens,
                          const SpmdType& boundary_type, TypeTrace* types,
                          BackwardObserver* observer) {
  const GptConfig& c = layout.config();
  const std::vector<int>& owned = plan.stage_plan.owned[stage];
  const bool first = stage == 0, last = stage == plan.stages - 1;
  const size_t np = layout.params().size();
  PipelineStage ps;
  ps.boundary_shape = {plan.boundary_rows, c.d_model};
  ps.boundary_dtype = c.compute_dtype();  // bf16 activations under mixed precision
  ps.boundary_type = boundary_type;
  ps.backward_observer = observer;
  ps.forward = [&](int mb, const Value& in, const std::vector<Value>& watched) {
    std::vector<Value> all(np);
    for (size_t i = 0; i < owned.size(); ++i) all[owned[i]] = watched[i];
    const ParamFn use = GptParamUse(layout, all);
    Value x = first ? GptEmbed(layout, use, ids[mb]) : in;
    const int64_t l0 = plan.stage_plan.first_layer[stage];
    for (int64_t l = l0; l < l0 + plan.stage_plan.layers[stage]; ++l) {
      x = GptBlock(layout, use, l, x, l == 0 && mb == 0 ? types : nullptr);
    }
    return last ? GptHead(layout, use, x, targets[mb], global_tokens) : x;
  };
  PipelineResult run = RunPipeline(*plan.timetable, layout.pp_axis(), ps, params);
  Backprop out;
  out.grads = std::move(run.grads);
  out.loss = run.loss;
  out.peak_saved_bytes = run.peak_saved_bytes;
  out.activation_bytes = run.recorded_bytes;
  out.largest_activation_bytes = run.largest_recorded_bytes;
  out.busy_us = run.busy_us;
  out.total_us = run.total_us;
  out.spans = std::move(run.spans);
  return out;
}

bool Finite(double x) { return std::isfinite(x); }

// A failed trace write stops the run (the trace file is what the user asked for).
void TraceError(const absl::Status& s) {
  if (!s.ok()) throw OpError(s);
}

}  // namespace

absl::Status CheckTrainOptions(const GptLayout& layout, const TrainOptions& o) {
  const Mesh& mesh = layout.mesh();
  const AdamWOptions& a = o.adamw;
  if (o.steps < 1) {
    return Invalid(absl::StrCat("steps (--steps) ", o.steps,
                                " must be >= 1 (the total number of optimizer steps)"));
  }
  if (!Finite(a.lr) || a.lr < 0) {
    return Invalid(absl::StrCat("learning rate (--lr) ", a.lr, " must be finite and >= 0 (e.g. 1e-3)"));
  }
  if (!Finite(a.beta1) || a.beta1 < 0 || a.beta1 >= 1 || !Finite(a.beta2) || a.beta2 < 0 ||
      a.beta2 >= 1) {
    return Invalid(absl::StrCat("AdamW betas (--beta1, --beta2) = (", a.beta1, ", ", a.beta2,
                                ") must lie in [0, 1) (e.g. 0.9 and 0.95)"));
  }
  if (!Finite(a.eps) || a.eps <= 0) {
    return Invalid(absl::StrCat("AdamW eps (--eps) ", a.eps, " must be finite and > 0 (e.g. 1e-8)"));
  }
  if (!Finite(a.weight_decay) || a.weight_decay < 0) {
    return Invalid(absl::StrCat("weight decay (--weight_decay) ", a.weight_decay,
                                " must be finite and >= 0 (e.g. 0.1)"));
  }
  if (std::isnan(o.clip) || std::isinf(o.clip)) {
    return Invalid(absl::StrCat("clip (--clip) ", o.clip, " must be finite (<= 0 turns clipping off)"));
  }
  if (!o.init_path.empty() && !o.resume_path.empty()) {
    return Invalid(absl::StrCat("both --init ('", o.init_path, "') and --resume ('", o.resume_path,
                                "') are given: --resume continues a run (parameters, moments, "
                                "step), --init starts one from weights; give one"));
  }
  if (o.microbatches < 1) {
    return Invalid(absl::StrCat("--microbatches ", o.microbatches, " must be >= 1"));
  }
  if (o.grad_accum < 1) {
    return Invalid(absl::StrCat("--grad_accum ", o.grad_accum, " must be >= 1"));
  }
  if (o.eval_every < 0 || o.eval_steps < 1) {
    return Invalid(absl::StrCat("--eval_every ", o.eval_every, " must be >= 0 and --eval_steps ",
                                o.eval_steps, " >= 1"));
  }
  if (o.eval_every > 0) {
    if (absl::Status s = CheckTokens(layout.config(), o.val_tokens); !s.ok()) {
      return Invalid(absl::StrCat("evaluation data (--eval_every ", o.eval_every,
                                  "): ", s.message(),
                                  "; give --val_fraction or --val_data with enough tokens"));
    }
  }
  if (o.save_every < 0 || (o.save_every > 0 && !o.on_save)) {
    return Invalid(absl::StrCat("--save_every ", o.save_every,
                                " must be >= 0 and needs a place to save (on_save)"));
  }
  if (o.only_rank != -1 && (!o.spmd_runner || o.only_rank < 0 || o.only_rank >= mesh.size())) {
    return Invalid(absl::StrCat("only_rank ", o.only_rank, " needs an spmd_runner and a rank of "
                                "mesh ", mesh.ShortString(), " (0 to ", mesh.size() - 1,
                                "), or -1 for every rank"));
  }
  if (o.spmd_runner && o.comm != nullptr) {
    return Invalid("an spmd_runner and a process communicator (comm) are two ways of running "
                   "the ranks; give one");
  }
  if (!o.placement.is_cpu()) {
    if (o.comm != nullptr) {
      return Invalid(absl::StrCat("placement ", o.placement.ToString(),
                                  " with a process communicator: the ranks run where the "
                                  "communicator's memory is (--backend=nccl: its GPU); leave "
                                  "the placement at cpu"));
    }
    absl::StatusOr<std::vector<Device>> devices = ResolvePlacement(o.placement, mesh.size());
    if (!devices.ok()) return devices.status();
  }
  const bool pipelined = layout.pp_ways() > 1 || o.microbatches > 1;
  if (!pipelined) return absl::OkStatus();
  // What the pipeline strategy cannot do, refused here and nowhere else.
  if (!layout.cp_axis().empty()) {
    return Invalid(absl::StrCat(
        "mesh ", mesh.ShortString(), " with ",
        layout.pp_ways() > 1 ? absl::StrCat("pp=", layout.pp_ways())
                             : absl::StrCat(o.microbatches, " microbatches"),
        ": the pipeline strategy does not support cp (pipeline (pp) with context parallelism "
        "(cp) is not supported); drop cp, or pp and --microbatches"));
  }
  if (layout.config().moe.on()) {
    return Invalid(absl::StrCat("mesh ", mesh.ShortString(),
                                ": the pipeline strategy does not support MoE models yet (their "
                                "load-balancing loss spans stages); drop --experts or pp"));
  }
  return absl::OkStatus();
}

absl::StatusOr<TrainResult> TrainGpt(const GptLayout& layout, const std::vector<NamedTensor>& init,
                                     const std::vector<int64_t>& tokens,
                                     const TrainOptions& options) {
  const GptConfig& c = layout.config();
  const Mesh& mesh = layout.mesh();
  const int ways = layout.batch_ways();
  if (absl::Status s = CheckTrainOptions(layout, options); !s.ok()) return s;
  RunPlan plan;
  plan.pipelined = layout.pp_ways() > 1 || options.microbatches > 1;
  plan.stages = plan.pipelined ? layout.pp_ways() : 1;
  // Under a pipeline grad_accum multiplies the microbatches; else it is the one program's
  // microsteps.
  plan.microbatches = options.microbatches * (plan.pipelined ? options.grad_accum : 1);
  const int64_t m = plan.microbatches;
  const int64_t accum = plan.pipelined ? 1 : options.grad_accum;
  if (options.batch < 1 || options.batch % (m * accum * ways) != 0) {
    return Invalid(absl::StrCat(
        "batch ", options.batch, " is not divisible by ",
        m > 1 ? absl::StrCat("microbatches ", m, " x the ")
        : accum > 1 ? absl::StrCat("grad_accum ", accum, " x the ")
                    : std::string("the "),
        ways, " data-parallel ways of mesh ", mesh.ShortString(), "; pick batch a multiple of ",
        m * accum * ways));
  }
  plan.local_rows = options.batch / m / accum / ways * c.seq / layout.cp_ways();
  plan.boundary_rows = plan.local_rows;
  if (layout.tp().sp) {
    const int tp = layout.dims().tp_ways();
    if (plan.local_rows % tp != 0) {
      return Invalid(absl::StrCat("sequence parallelism splits each rank's ", plan.local_rows,
                                  " tokens", m > 1 ? " of a microbatch" : "", " over tp=", tp,
                                  ": make ", m > 1 ? "batch/(microbatches*dp)" : "batch/dp",
                                  " * seq/cp divisible by tp"));
    }
    plan.boundary_rows = plan.local_rows / tp;
  }
  absl::StatusOr<std::vector<int64_t>> sizes =
      plan.pipelined ? SplitLayers(c.layers, plan.stages, options.stage_layers)
                     : absl::StatusOr<std::vector<int64_t>>(std::vector<int64_t>{c.layers});
  if (!sizes.ok()) return sizes.status();
  if (plan.pipelined) {
    absl::StatusOr<Schedule> schedule = ParseSchedule(options.schedule);
    if (!schedule.ok()) return schedule.status();
    absl::StatusOr<Timetable> tt = MakeTimetable(*schedule, plan.stages, static_cast<int>(m));
    if (!tt.ok()) return tt.status();
    plan.timetable = std::make_unique<Timetable>(*std::move(tt));
  } else if (!options.stage_layers.empty()) {
    return Invalid("stage_layers is a pipeline (pp > 1) setting; drop it or add pp");
  }
  plan.stage_plan = PlanStages(layout, *sizes);
  if (absl::Status s = CheckTokens(c, tokens); !s.ok()) return s;
  if (!options.save_path.empty()) {
    if (absl::Status s = CheckSavePath(options.save_path); !s.ok()) return s;
  }
  // Checkpoint files are checked before the first step; ranks read their blocks later.
  const bool resume = !options.resume_path.empty();
  const std::string& file_path = resume ? options.resume_path : options.init_path;
  std::unique_ptr<SafetensorsFile> file;
  if (!file_path.empty()) {
    absl::StatusOr<SafetensorsFile> f = OpenGptCheckpoint(file_path);
    if (!f.ok()) return f.status();
    if (absl::Status s = CheckGptCheckpoint(*f, layout, resume); !s.ok()) return s;
    if (resume) {
      absl::StatusOr<int64_t> step = CheckpointStep(*f);
      if (!step.ok()) return step.status();
      plan.first_step = *step;
      if (plan.first_step >= options.steps) {
        return Invalid(absl::StrCat("checkpoint '", file_path, "' is at step ", plan.first_step,
                                    " but the run's total is ", options.steps,
                                    " steps: nothing to train; raise --steps (the total count)"));
      }
    }
    file = std::make_unique<SafetensorsFile>(*std::move(f));
  }
  std::vector<Tensor> globals;
  if (file == nullptr) {
    absl::StatusOr<std::vector<Tensor>> matched = MatchInitialParams(layout, init);
    if (!matched.ok()) return matched.status();
    globals = *std::move(matched);
  }

  const int64_t global_tokens = options.batch * c.seq;
  const int64_t first_step = plan.first_step;
  const PartitionSpec rows_spec = layout.RowSpec(false);
  const size_t np = layout.params().size();
  const int p = plan.stages;
  const int pp_index = plan.pipelined ? mesh.AxisIndex(axis::kPp) : -1;  // -1 without pp
  const int wte = layout.Find("wte.weight");
  // A parameter's type: its spec's, V on pp under a pipeline (each stage holds its own).
  auto param_type = [&](const ParamInfo& pi) {
    SpmdType t = pi.spec.InputType(mesh);
    if (pp_index >= 0) t[pp_index] = AxisType::V();
    return t;
  };
  SpmdType row_type = rows_spec.InputType(mesh);
  if (pp_index >= 0) row_type[pp_index] = AxisType::V();  // like the activations they meet
  // Per rank: parameters, then exp_avg, then exp_avg_sq (layout order each; undefined where a
  // pipeline stage does not hold the parameter).
  std::vector<std::vector<Tensor>> final_locals(mesh.size());
  std::vector<double> bubbles(mesh.size());
  TrainResult result;
  std::mutex mu;  // std::mutex: ThreadSanitizer sees it (Debian's absl is not instrumented)
  // The rank that reports (losses, bytes, log, on_step): rank 0, or this process's rank.
  const int reporter = options.only_rank >= 0     ? options.only_rank
                       : options.comm != nullptr ? options.comm->rank()
                                                 : 0;
  auto phase = [&](const char* name) {
    if (options.on_phase) options.on_phase(name);
  };
  auto body = [&](RankContext& ctx) {
    const int rank = ctx.rank();
    const int stage = pp_index >= 0 ? ctx.coord(pp_index) : 0;
    const bool last = stage == p - 1;
    if (plan.pipelined) CreateAllCommunicators(ctx);  // stages issue different collectives
    const std::vector<int>& held = plan.stage_plan.owned[stage];
    // The rank's device: parameters, moments, batches and activations live there; checkpoint
    // blocks are read to the host and moved, results are moved back.
    const Device dev = ctx.device();
    auto read = [&](const std::string& tensor, const ParamInfo& pi) {
      absl::StatusOr<Tensor> t = ReadGptShard(*file, tensor, pi, mesh, rank, c.dtype);
      if (!t.ok()) throw OpError(t.status());
      return *t;
    };
    std::vector<Value> params;  // held, in `held` order
    AdamWOptions adam = options.adamw;
    for (int k : held) {
      const ParamInfo& pi = layout.params()[k];
      Tensor local = file != nullptr ? read(pi.name, pi) : ShardOf(globals[k], mesh, pi.spec, rank);
      params.emplace_back(local.To(dev), param_type(pi));
      if (!pi.decay) adam.no_decay.insert(pi.name);
    }
    AdamW opt(adam);
    if (resume) {
      for (int k : held) {
        const ParamInfo& pi = layout.params()[k];
        opt.SetState(pi.name, read("optimizer.exp_avg." + pi.name, pi).To(dev),
                     read("optimizer.exp_avg_sq." + pi.name, pi).To(dev));
      }
      opt.set_steps(first_step);
    }
    // The pipeline boundary's type: what the embedding gives (probed once, with zeros, on every
    // rank, so the collectives inside match).
    SpmdType boundary_type;
    if (plan.pipelined) {
      NoGradScope no_tape;
      std::vector<Value> probe(np);
      for (const char* name : {"wte.weight", "wpe.weight"}) {
        const ParamInfo& pi = layout.params()[layout.Find(name)];
        probe[layout.Find(name)] = Value(Tensor::Zeros(LocalShape(pi, mesh), c.dtype, dev),
                                         param_type(pi));
      }
      Value ids(Tensor::Zeros({plan.local_rows}, DType::kI64, dev), row_type);
      boundary_type = GptEmbed(layout, GptParamUse(layout, probe), ids).type;
    }
    Tape tape;
    std::vector<TraceEvent> events;
    BackwardTracer backward_tracer(&events);  // a span per VJP and per backward collective
    if (options.trace_writer != nullptr) {
      TraceError(options.trace_writer->ThreadName(rank, RankDescription(mesh, rank)));
    }
    // Under cp the rows are reordered so that each cp block holds its load-balanced chunks.
    auto rows_of = [&](const Tensor& t) {
      return layout.cp_axis().empty() ? t.Reshape({NumElements(t.shape())})
                                      : LoadBalancedRows(t, ways, layout.cp_ways());
    };
    // Every parameter and AdamW moment as a global host tensor on every rank (index k as
    // AddFinalTensor's; moments undefined before the first step): all_gathers over each sharded
    // dim, then under a pipeline the owner stage's copy summed over pp (the others add zeros).
    auto GatherGlobals = [&](const std::vector<Value>& params, const AdamW& opt, int stage,
                             const std::vector<int>& held) {
      NoGradScope no_tape;
      std::vector<Tensor> out(3 * np);
      const bool moments = opt.steps() > 0 || resume;
      for (size_t k = 0; k < 3 * np; ++k) {
        if (k >= np && !moments) break;
        const int i = static_cast<int>(k % np);
        const ParamInfo& pi = layout.params()[i];
        auto at = std::find(held.begin(), held.end(), i);
        const bool mine = at != held.end() && plan.stage_plan.owner[i] == stage;
        Tensor local;
        if (mine) {
          const std::string& name = pi.name;
          local = k < np ? params[at - held.begin()].tensor
                  : k < 2 * np ? opt.exp_avg(name)
                               : opt.exp_avg_sq(name);
        } else {
          local = Tensor::Zeros(LocalShape(pi, mesh), c.dtype, dev);
        }
        Value v(local, param_type(pi));
        for (int d = 0; d < pi.spec.size(); ++d) {
          if (!pi.spec.dim_axes(d).empty()) v = all_gather(v, d, Axes(pi.spec.dim_axes(d)));
        }
        if (p > 1) v = all_reduce(reinterpret(v, layout.pp_axis()), layout.pp_axis());
        out[k] = v.tensor.To(Device::Cpu());
      }
      return out;
    };
    // Under a pipeline, the forward-only loss of a [batch, seq] batch: per microbatch, stage t
    // runs its blocks on what stage t-1 sent and one ppermute over pp hands the residual on
    // (every rank calls each transfer; only stage t's output travels); the last stage's loss is
    // summed over its pending axes, then handed to every stage.
    auto PipelineForwardLoss = [&](const Tensor& ids_g, const Tensor& targets_g) {
      NoGradScope no_tape;
      std::vector<Value> all(np);
      for (size_t i = 0; i < held.size(); ++i) all[held[i]] = params[i];
      const ParamFn use = GptParamUse(layout, all);
      Value loss;
      for (int64_t k = 0; k < m; ++k) {
        Value ids(ShardOf(MicrobatchRows(ids_g, k, m), mesh, rows_spec, rank).To(dev), row_type);
        Value targets(ShardOf(MicrobatchRows(targets_g, k, m), mesh, rows_spec, rank).To(dev),
                      row_type);
        Value x = stage == 0 ? GptEmbed(layout, use, ids)
                             : Value(Tensor::Zeros({plan.boundary_rows, c.d_model},
                                                   c.compute_dtype(), dev),
                                     boundary_type);
        x.type = boundary_type;
        for (int t = 0; t < p; ++t) {
          if (stage == t) {
            const int64_t l0 = plan.stage_plan.first_layer[t];
            for (int64_t l = l0; l < l0 + plan.stage_plan.layers[t]; ++l) {
              x = GptBlock(layout, use, l, x);
            }
            x.type = boundary_type;
            if (t == p - 1) {
              Value l = GptHead(layout, use, x, targets, global_tokens);
              loss = loss.defined() ? loss + l : l;
            }
          }
          if (t + 1 < p) x = ppermute(x, layout.pp_axis(), {{t, t + 1}});
        }
      }
      double value = 0;
      if (loss.defined()) {
        std::vector<std::string> partial = AxesOfKind(mesh, loss.type, AxisKind::kP, pp_index);
        if (!partial.empty()) loss = all_reduce(loss, Axes(partial));
        value = loss.item();
      }
      if (p > 1) {
        SpmdType t(mesh.num_axes());
        t[pp_index] = AxisType::V();
        Value share(Tensor::Scalar(stage == p - 1 ? value : 0.0, DType::kF64).To(dev), t);
        value = all_reduce(reinterpret(share, layout.pp_axis()), layout.pp_axis()).item();
      }
      return value;
    };
    // A [batch, seq] batch as this rank's rows of each microstep (grad_accum consecutive groups
    // of sequences), on its device.
    auto MicrostepRows = [&](const Tensor& ids_g, const Tensor& targets_g,
                             std::vector<Value>* ids, std::vector<Value>* targets) {
      for (int64_t j = 0; j < accum; ++j) {
        const Tensor i = accum > 1 ? MicrobatchRows(ids_g, j, accum).Reshape(
                                         {options.batch / accum, c.seq})
                                   : ids_g;
        const Tensor t = accum > 1 ? MicrobatchRows(targets_g, j, accum).Reshape(
                                         {options.batch / accum, c.seq})
                                   : targets_g;
        ids->emplace_back(ShardOf(rows_of(i), mesh, rows_spec, rank).To(dev), row_type);
        targets->emplace_back(ShardOf(rows_of(t), mesh, rows_spec, rank).To(dev), row_type);
      }
    };
    for (int64_t step = first_step; step < options.steps; ++step) {
      ctx.ClearCollectiveLog();
      Tensor ids_g, targets_g;
      BatchAt(tokens, step, options.batch, c.seq, &ids_g, &targets_g);
      TypeTrace* types = step == first_step ? options.types : nullptr;
      const bool tracing =
          options.trace || (options.trace_writer != nullptr &&
                            (!options.trace_step || options.trace_step(step)));
      tape.set_backward_observer(tracing ? &backward_tracer : nullptr);
      phase("step");
      const double t0 = TraceNowUs();
      TracingRecorder rec(&tape, tracing ? &events : nullptr, rank, t0);
      Backprop bp;
      if (plan.pipelined) {
        std::vector<Value> ids, targets;
        for (int64_t k = 0; k < m; ++k) {
          ids.emplace_back(ShardOf(MicrobatchRows(ids_g, k, m), mesh, rows_spec, rank).To(dev),
                           row_type);
          targets.emplace_back(
              ShardOf(MicrobatchRows(targets_g, k, m), mesh, rows_spec, rank).To(dev), row_type);
        }
        bp = PipelineBackprop(layout, plan, stage, params, ids, targets, global_tokens,
                              boundary_type, types, tracing ? &backward_tracer : nullptr);
      } else {
        std::vector<Value> ids, targets;
        MicrostepRows(ids_g, targets_g, &ids, &targets);
        bp = OneProgramBackprop(layout, params, ids, targets, global_tokens, types, tape, rec);
      }
      const size_t backprop_logged = ctx.collective_log().size();
      phase("optimizer");
      const double t2 = TraceNowUs();
      std::vector<Value>& grads = bp.grads;
      // One all_reduce per gradient over the axes where it is a pending sum (P): dp for
      // replicated parameters, dp_replicate under HSDP, tp for tp-replicated ones; never pp
      // (the stages hold different parameters).
      for (Value& g : grads) {
        std::vector<std::string> axes = AxesOfKind(mesh, g.type, AxisKind::kP);
        if (!axes.empty()) g = all_reduce(g, Axes(axes));
      }
      // The tied wte under a pipeline: embedding (stage 0) + lm_head (last stage) gradients,
      // summed on both so that the two copies take identical AdamW steps.
      std::vector<bool> counted(held.size(), true);
      if (p > 1) {
        NoGradScope no_tape;
        const ParamInfo& pi = layout.params()[wte];
        auto at = std::find(held.begin(), held.end(), wte);
        const bool holds = at != held.end();
        Value mine = holds ? grads[at - held.begin()]
                           : Value(Tensor::Zeros(LocalShape(pi, mesh), c.dtype, dev),
                                   param_type(pi));
        Value other = ppermute(mine, layout.pp_axis(), {{0, p - 1}, {p - 1, 0}});
        if (holds) grads[at - held.begin()] = mine + other;
        if (holds && last) counted[at - held.begin()] = false;  // the norm counts wte once
      }
      // The loss for printing: its pending sums added up (pp aside), then, under a pipeline,
      // the last stage's handed to every stage.
      double loss = 0;
      {
        NoGradScope no_tape;
        if (bp.loss.defined()) {
          Value l = bp.loss;
          std::vector<std::string> partial = AxesOfKind(mesh, l.type, AxisKind::kP, pp_index);
          if (!partial.empty()) l = all_reduce(l, Axes(partial));
          loss = l.item();
        }
        if (p > 1) {
          SpmdType t(mesh.num_axes());
          t[pp_index] = AxisType::V();
          Value share(Tensor::Scalar(last ? loss : 0.0, DType::kF64).To(dev), t);
          loss = all_reduce(reinterpret(share, layout.pp_axis()), layout.pp_axis()).item();
        }
      }
      // MoE drops: each rank's counts summed over the batch axes (tp ranks route the same tokens).
      int64_t moe_dropped = -1, moe_assignments = -1, moe_dropped_tokens = -1;
      if (c.moe.on()) {
        moe_dropped = bp.moe.dropped;
        moe_assignments = bp.moe.assignments;
        moe_dropped_tokens = bp.moe.dropped_tokens;
        if (!layout.batch_axes().empty()) {
          const Axes batch(layout.batch_axes());
          SpmdType vt(mesh.num_axes());
          for (const std::string& a : layout.batch_axes()) vt[mesh.AxisIndex(a)] = AxisType::V();
          Value counts(Tensor::FromVector<double>({3}, {static_cast<double>(bp.moe.dropped),
                                                        static_cast<double>(bp.moe.assignments),
                                                        static_cast<double>(bp.moe.dropped_tokens)})
                           .To(dev),
                       vt);
          std::vector<double> sum = all_reduce(reinterpret(counts, batch), batch)
                                        .tensor.ToVector<double>();
          moe_dropped = static_cast<int64_t>(sum[0]);
          moe_assignments = static_cast<int64_t>(sum[1]);
          moe_dropped_tokens = static_cast<int64_t>(sum[2]);
        }
      }
      const double norm = std::sqrt(GlobalGradNormSquared(grads, counted));
      // Every rank sees the same loss and norm, so every rank stops here together.
      if (!Finite(loss) || !Finite(norm)) {
        throw OpError(absl::FailedPreconditionError(absl::StrFormat(
            "step %d: the loss is %g and the gradient norm %g (not finite); stopping before "
            "the optimizer step. The parameters (an --init file with NaN/inf?) or the inputs "
            "hold non-finite values, or training diverged (lower the learning rate)",
            step, loss, norm)));
      }
      const double coef = options.clip > 0 ? ClipCoefficient(norm, options.clip) : 1.0;
      std::vector<NamedTensor> local, named_grads;
      for (size_t i = 0; i < held.size(); ++i) {
        const std::string& name = layout.params()[held[i]].name;
        local.push_back({name, params[i].tensor});
        named_grads.push_back(
            {name, coef < 1.0 ? MulScalar(grads[i].tensor, coef) : grads[i].tensor});
      }
      const double lr = options.lr_at ? options.lr_at(step) : options.adamw.lr;
      if (!Finite(lr) || lr < 0) {
        throw OpError(Invalid(absl::StrCat("step ", step, ": the learning-rate schedule gives ",
                                           lr, "; it must be finite and >= 0")));
      }
      opt.set_lr(lr);
      const double t3 = TraceNowUs();
      if (absl::Status s = opt.Step(local, named_grads); !s.ok()) throw OpError(s);
      for (size_t i = 0; i < held.size(); ++i) params[i].tensor = local[i].tensor;
      if (dev.is_cuda()) cuda::Synchronize(dev.index);  // the step's time includes its kernels
      const double t4 = TraceNowUs();
      phase("end");
      if (plan.pipelined) {
        std::lock_guard<std::mutex> lock(mu);
        bubbles[rank] = 1.0 - bp.busy_us / std::max(bp.total_us, 1e-9);
      }
      if (tracing) {
        std::vector<std::pair<std::string, double>> phases;  // name, start; each ends at the next
        if (plan.pipelined) {
          // One span per forward / backward of a microbatch ("F3", "B3"; the bubble is the gaps).
          for (const PipelineSpan& sp : bp.spans) {
            events.push_back({absl::StrCat(sp.action.kind == PipeAction::kForward ? "F" : "B",
                                           sp.action.microbatch),
                              "pipeline", rank, sp.start_us, sp.duration_us, -1});
          }
          phases = {{"pipeline (forwards + backwards)", t0}};
        } else if (accum > 1) {
          phases = {{absl::StrCat("forward + backward (", accum, " microsteps)"), t0}};
        } else {
          phases = {{"forward", t0}, {"backward", bp.forward_end_us}};
        }
        phases.push_back({"grad reduce + clip", t2});
        phases.push_back({"optimizer", t3});
        phases.push_back({"", t4});
        for (size_t k = 0; k + 1 < phases.size(); ++k) {
          events.push_back({phases[k].first, "phase", rank, phases[k].second,
                            phases[k + 1].second - phases[k].second, -1});
        }
        // Collectives after the backward pass (gradient and norm reductions); the backward
        // ones are spans of backward_tracer.
        for (size_t k = backprop_logged; k < ctx.collective_log().size(); ++k) {
          const CollectiveRecord& r = ctx.collective_log()[k];
          events.push_back({absl::StrCat(r.op, "(", mesh.MaskToString(r.axes), ")"),
                            "collective", rank, t2, 0, r.bytes});
        }
        if (options.trace_writer != nullptr) {  // streamed: written now, not kept
          for (const TraceEvent& e : events) {
            nlohmann::json args = e.bytes >= 0 ? nlohmann::json{{"bytes", e.bytes}} : nullptr;
            TraceError(e.duration_us > 0 || e.category != "collective"
                           ? options.trace_writer->Span(e.name, e.category, rank, e.start_us,
                                                        e.duration_us, args)
                           : options.trace_writer->Instant(e.name, e.category, rank, e.start_us,
                                                           args));
          }
          if (!options.trace) events.clear();
          TraceError(options.trace_writer->Flush());
        }
      }
      // The step's own collectives (evaluation and snapshot gathers below are not the step's).
      const size_t step_logged = ctx.collective_log().size();
      // Evaluation: the mean loss of eval_steps validation batches, forward only.
      double val_loss = std::numeric_limits<double>::quiet_NaN();
      if (options.eval_every > 0 &&
          ((step + 1) % options.eval_every == 0 || step + 1 == options.steps)) {
        double sum = 0;
        for (int64_t e = 0; e < options.eval_steps; ++e) {
          Tensor vi, vt;
          BatchAt(options.val_tokens, e, options.batch, c.seq, &vi, &vt);
          std::vector<Value> ids, targets;
          if (plan.pipelined) {
            sum += PipelineForwardLoss(vi, vt);
          } else {
            MicrostepRows(vi, vt, &ids, &targets);
            sum += ForwardLoss(layout, params, ids, targets, global_tokens);
          }
        }
        val_loss = sum / static_cast<double>(options.eval_steps);
      }
      // Periodic checkpoint: every rank helps gather the global tensors; the reporter saves.
      if (options.save_every > 0 && (step + 1) % options.save_every == 0) {
        std::vector<Tensor> globals = GatherGlobals(params, opt, stage, held);
        if (rank == reporter) {
          TrainResult snapshot;
          for (size_t k = 0; k < globals.size(); ++k) {
            if (globals[k].defined()) AddFinalTensor(layout, k, globals[k], &snapshot);
          }
          snapshot.steps_done = step + 1;
          snapshot.losses = result.losses;
          snapshot.losses.push_back(loss);
          if (absl::Status s = options.on_save(snapshot); !s.ok()) {
            throw OpError(absl::Status(s.code(), absl::StrCat("saving the checkpoint of step ",
                                                              step + 1, ": ", s.message())));
          }
        }
      }
      if (rank == reporter) {
        if (step == first_step) {
          result.activation_bytes_per_rank = bp.activation_bytes;
          result.peak_activation_bytes_per_rank = bp.peak_saved_bytes;
          result.largest_activation_bytes = bp.largest_activation_bytes;
        }
        result.losses.push_back(loss);
        result.grad_norms.push_back(norm);
        if (c.moe.on()) result.moe_dropped.push_back(moe_dropped);
        if (options.on_step) {
          const int64_t peak = dev.is_cuda()
                                   ? cuda::DeviceAllocator(dev.index).stats().peak_allocated_bytes
                                   : -1;
          result.peak_device_bytes_per_rank = peak;
          const std::vector<CollectiveRecord> step_log(
              ctx.collective_log().begin(), ctx.collective_log().begin() + step_logged);
          options.on_step(StepInfo{step, loss, norm, (t4 - t0) * 1e-6, &step_log,
                                   moe_dropped, moe_assignments, moe_dropped_tokens, peak,
                                   options.steps, lr, global_tokens * (step + 1), val_loss});
        }
        if (step + 1 == options.steps) {
          result.log.assign(ctx.collective_log().begin(),
                            ctx.collective_log().begin() + step_logged);
          for (size_t i = 0; i < held.size(); ++i) {
            const std::string& name = layout.params()[held[i]].name;
            result.param_bytes_per_rank += params[i].tensor.nbytes();
            result.optimizer_bytes_per_rank += grads[i].tensor.nbytes() +
                                               opt.exp_avg(name).nbytes() +
                                               opt.exp_avg_sq(name).nbytes();
          }
        }
      }
    }
    std::vector<Tensor> mine(3 * np);
    for (size_t i = 0; i < held.size(); ++i) {
      const int k = held[i];
      mine[k] = params[i].tensor;
      mine[np + k] = opt.exp_avg(layout.params()[k].name);
      mine[2 * np + k] = opt.exp_avg_sq(layout.params()[k].name);
    }
    if (options.trace) {
      std::lock_guard<std::mutex> lock(mu);
      result.trace.insert(result.trace.end(), events.begin(), events.end());
    }
    if (options.comm != nullptr) {
      // One process per rank: the global tensors come from collectives (all_gathers over each
      // sharded dim; under pp the owner stage's copy summed over pp), on every rank.
      mine = GatherGlobals(params, opt, stage, held);
    }
    if (options.only_rank >= 0) mine.clear();  // one rank: nothing is assembled
    for (Tensor& t : mine) {
      if (t.defined()) t = t.To(Device::Cpu());  // results are host tensors
    }
    if (rank == reporter) {
      result.device = dev.ToString();
      if (dev.is_cuda()) {
        result.peak_device_bytes_per_rank =
            cuda::DeviceAllocator(dev.index).stats().peak_allocated_bytes;
      }
    }
    std::lock_guard<std::mutex> lock(mu);
    final_locals[rank] = std::move(mine);
  };
  // GPU ranks: each GPU's peak memory is measured from here; CUDA graph capture is refused with
  // its reason (the step reads the loss and norm on the host mid-step).
  std::vector<Device> devices(mesh.size(), Device::Cpu());
  if (!options.placement.is_cpu()) devices = *ResolvePlacement(options.placement, mesh.size());
  if (options.comm != nullptr && options.comm->memory_space().device) {
    devices.assign(mesh.size(), Device::Cuda(options.comm->memory_space().device_index));
  }
  const bool on_gpu = devices[0].is_cuda();
  for (const Device& d : devices) {
    if (d.is_cuda()) cuda::DeviceAllocator(d.index).ResetPeakStats();
  }
  result.ranks_per_device = static_cast<int>(
      std::count(devices.begin(), devices.end(), devices[options.comm ? 0 : reporter]));
  if (options.comm != nullptr) result.ranks_per_device = 1;
  result.cuda_graph_note =
      !on_gpu ? "CPU ranks (CUDA graphs are a GPU feature)"
      : !options.cuda_graph
          ? "off (cuda_graph = false)"
          : "not captured: the step reads the loss and the global gradient norm on the host "
            "between the backward and the optimizer (the clipping coefficient and the non-finite "
            "stop), a synchronisation a CUDA graph cannot contain; it runs eagerly";
  SpmdOptions spmd;
  spmd.placement = options.placement;
  absl::Status status = options.spmd_runner     ? options.spmd_runner(mesh, body)
                        : options.comm != nullptr ? RunOnCommunicator(*options.comm, mesh, body)
                                                  : RunSpmd(mesh, body, spmd);
  if (!status.ok()) return status;
  if (options.only_rank >= 0) {  // one rank ran: its report, no global tensors
    result.steps_done = options.steps;
    return result;
  }
  if (options.comm != nullptr) {
    std::vector<Tensor>& g = final_locals[reporter];  // already global
    for (size_t k = 0; k < g.size(); ++k) {
      if (g[k].defined()) AddFinalTensor(layout, k, g[k], &result);
    }
  } else {
    // Each tensor from its owner stage's ranks (pp is the major axis: stage s holds ranks
    // [s*inner, (s+1)*inner)).
    std::vector<std::string> inner_axes;
    for (const std::string& a : mesh.axis_names()) {
      if (pp_index < 0 || a != axis::kPp) inner_axes.push_back(a);
    }
    absl::StatusOr<Mesh> inner =
        pp_index < 0 ? absl::StatusOr<Mesh>(mesh)
                     : (inner_axes.empty() ? absl::StatusOr<Mesh>(Mesh()) : mesh.Submesh(inner_axes));
    if (!inner.ok()) return inner.status();
    const int inner_size = mesh.size() / p;
    for (size_t k = 0; k < 3 * np; ++k) {
      const ParamInfo& pi = layout.params()[k % np];
      const int owner = plan.stage_plan.owner[k % np];
      std::vector<Tensor> locals;
      for (int r = 0; r < inner_size; ++r) {
        locals.push_back(final_locals[owner * inner_size + r][k]);
      }
      if (!locals[0].defined()) continue;  // no moments without a step
      absl::StatusOr<Tensor> g = Assemble(*inner, pi.spec, locals, pi.spec.InputType(*inner));
      if (!g.ok()) return g.status();
      AddFinalTensor(layout, k, *g, &result);
    }
  }
  if (plan.pipelined) {
    double bubble = 0;
    for (double b : bubbles) bubble += b;
    result.pipeline_bubble = bubble / mesh.size();
  }
  result.steps_done = options.steps;
  if (!options.save_path.empty() && reporter == 0) {
    if (absl::Status s = SaveTrainResult(options.save_path, layout, result); !s.ok()) return s;
  }
  return result;
}

void AddFinalTensor(const GptLayout& layout, size_t k, Tensor global, TrainResult* result) {
  const size_t np = layout.params().size();
  std::vector<NamedTensor>& dst = k < np       ? result->params
                                  : k < 2 * np ? result->adam_state.exp_avg
                                               : result->adam_state.exp_avg_sq;
  dst.push_back({layout.params()[k % np].name, std::move(global)});
}

absl::Status SaveTrainResult(const std::string& path, const GptLayout& layout,
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
