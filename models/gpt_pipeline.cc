#include "models/gpt_pipeline.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "models/gpt_checkpoint.h"
#include "models/pipeline.h"
#include "shardmap/collective_ops.h"
#include "shardmap/context.h"
#include "shardmap/ops.h"
#include "shardmap/sharding.h"
#include "shardmap/tape_hook.h"
#include "tensor/error.h"
#include "tensor/ops/elementwise.h"

namespace shardmap {
namespace {

absl::Status Invalid(const std::string& msg) { return absl::InvalidArgumentError(msg); }

// Which stage holds which parameters.
struct StagePlan {
  std::vector<int64_t> first_layer;        // per stage
  std::vector<std::vector<int>> owned;     // per stage: parameter indices (layout order)
  std::vector<int> owner;                  // per parameter: the first stage holding it
};

StagePlan Plan(const GptLayout& layout, const std::vector<int64_t>& sizes) {
  const int p = static_cast<int>(sizes.size());
  StagePlan plan;
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

}  // namespace

absl::StatusOr<TrainResult> TrainGptPipeline(const GptLayout& layout,
                                             const std::vector<NamedTensor>& init,
                                             const std::vector<int64_t>& tokens,
                                             const TrainOptions& options) {
  const GptConfig& c = layout.config();
  const Mesh& mesh = layout.mesh();
  const int p = layout.pp_ways();
  const int ways = layout.batch_ways();
  const int64_t m = options.microbatches;
  if (!layout.cp_axis().empty()) {
    return Invalid(absl::StrCat("mesh ", mesh.ShortString(),
                                ": the pipeline trainer does not support cp; drop cp or pp"));
  }
  if (c.moe.on()) {
    return Invalid(absl::StrCat("mesh ", mesh.ShortString(),
                                ": the pipeline trainer does not support MoE models yet (their "
                                "load-balancing loss spans stages); drop --experts or pp"));
  }
  if (!options.init_path.empty() || !options.resume_path.empty()) {
    return Invalid("pipeline training (pp) cannot load checkpoints yet (init_path / "
                   "resume_path); train from InitGpt parameters or drop pp");
  }
  if (options.trace) return Invalid("pipeline training (pp) does not record traces yet");
  if (options.types != nullptr) {
    return Invalid("pipeline training (pp) cannot print block 0's types (--print_types) yet");
  }
  if (options.comm != nullptr) {
    return Invalid("pipeline training (pp) runs on simulated in-process ranks only: "
                   "--backend=gloo with pp is not supported yet; drop pp or use in-process");
  }
  absl::StatusOr<Schedule> schedule = ParseSchedule(options.schedule);
  if (!schedule.ok()) return schedule.status();
  if (m < 1) return Invalid(absl::StrCat("--microbatches ", m, " must be >= 1"));
  if (options.batch < 1 || options.batch % (m * ways) != 0) {
    return Invalid(absl::StrCat("batch ", options.batch, " is not divisible by microbatches ", m,
                                " x the ", ways, " data-parallel ways of mesh ",
                                mesh.ShortString(), "; pick batch a multiple of ", m * ways));
  }
  const int64_t local_rows = options.batch / m / ways * c.seq;  // a microbatch, one rank
  int64_t boundary_rows = local_rows;
  if (layout.tp().sp) {
    const int tp = mesh.axis_size(mesh.AxisIndex("tp"));
    if (local_rows % tp != 0) {
      return Invalid(absl::StrCat("sequence parallelism splits each microbatch's ", local_rows,
                                  " tokens per rank over tp=", tp,
                                  ": make batch/(microbatches*dp) * seq divisible by tp"));
    }
    boundary_rows = local_rows / tp;
  }
  absl::StatusOr<std::vector<int64_t>> sizes = SplitLayers(c.layers, p, options.stage_layers);
  if (!sizes.ok()) return sizes.status();
  absl::StatusOr<Timetable> timetable = MakeTimetable(*schedule, p, static_cast<int>(m));
  if (!timetable.ok()) return timetable.status();
  if (absl::Status s = CheckTokens(c, tokens); !s.ok()) return s;
  absl::StatusOr<std::vector<Tensor>> matched = MatchInitialParams(layout, init);
  if (!matched.ok()) return matched.status();
  const std::vector<Tensor> globals = *std::move(matched);
  const StagePlan plan = Plan(layout, *sizes);
  const std::string pp = layout.pp_axis();
  const int pp_index = mesh.AxisIndex("pp");  // -1 without pp
  // A parameter's type on this mesh: its spec's, V on pp (each stage holds its own).
  auto param_type = [&](const ParamInfo& pi) {
    SpmdType t = pi.spec.InputType(mesh);
    if (pp_index >= 0) t[pp_index] = AxisType::V();
    return t;
  };
  const int64_t global_tokens = options.batch * c.seq;
  const PartitionSpec rows_spec = layout.RowSpec(false);
  const size_t np = layout.params().size();
  const int wte = layout.Find("wte.weight");
  std::vector<std::vector<Tensor>> final_locals(mesh.size());
  std::vector<double> bubbles(mesh.size());
  TrainResult result;
  absl::Mutex mu;
  absl::Status status = RunSpmd(mesh, [&](RankContext& ctx) {
    const int rank = ctx.rank();
    const int s = pp_index >= 0 ? ctx.coord(pp_index) : 0;
    const bool first = s == 0, last = s == p - 1;
    CreateAllCommunicators(ctx);
    const std::vector<int>& owned = plan.owned[s];
    std::vector<Value> params;  // owned, in `owned` order
    AdamWOptions adam = options.adamw;
    for (int k : owned) {
      const ParamInfo& pi = layout.params()[k];
      params.emplace_back(ShardOf(globals[k], mesh, pi.spec, rank), param_type(pi));
      if (!pi.decay) adam.no_decay.insert(pi.name);
    }
    AdamW opt(adam);
    // Token rows: every stage gets the batch, typed V on pp like the activations they meet.
    SpmdType row_type = rows_spec.InputType(mesh);
    if (pp_index >= 0) row_type[pp_index] = AxisType::V();
    // The boundary's type: what the embedding gives (probed once, with zeros, on every rank,
    // so the collectives inside match).
    SpmdType boundary_type;
    {
      NoGradScope no_tape;
      std::vector<Value> probe(np);
      for (const char* name : {"wte.weight", "wpe.weight"}) {
        const int k = layout.Find(name);
        const ParamInfo& pi = layout.params()[k];
        probe[k] = Value(Tensor::Zeros(ShardOf(globals[k], mesh, pi.spec, rank).shape(), c.dtype),
                         param_type(pi));
      }
      Value ids(Tensor::Zeros({local_rows}, DType::kI64), row_type);
      boundary_type = GptEmbed(layout, GptParamUse(layout, probe), ids).type;
    }
    for (int64_t step = 0; step < options.steps; ++step) {
      ctx.ClearCollectiveLog();
      Tensor ids_g, targets_g;
      BatchAt(tokens, step, options.batch, c.seq, &ids_g, &targets_g);
      std::vector<Value> ids, targets;
      for (int64_t k = 0; k < m; ++k) {
        ids.emplace_back(ShardOf(MicrobatchRows(ids_g, k, m), mesh, rows_spec, rank), row_type);
        targets.emplace_back(ShardOf(MicrobatchRows(targets_g, k, m), mesh, rows_spec, rank),
                             row_type);
      }
      PipelineStage stage;
      stage.boundary_shape = {boundary_rows, c.d_model};
      stage.boundary_dtype = c.compute_dtype();  // bf16 activations under mixed precision
      stage.boundary_type = boundary_type;
      stage.forward = [&](int mb, const Value& in, const std::vector<Value>& watched) {
        std::vector<Value> all(np);
        for (size_t i = 0; i < owned.size(); ++i) all[owned[i]] = watched[i];
        const ParamFn use = GptParamUse(layout, all);
        Value x = first ? GptEmbed(layout, use, ids[mb]) : in;
        for (int64_t l = plan.first_layer[s]; l < plan.first_layer[s] + (*sizes)[s]; ++l) {
          x = GptBlock(layout, use, l, x);
        }
        return last ? GptHead(layout, use, x, targets[mb], global_tokens) : x;
      };
      const double t0 = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
      PipelineResult run = RunPipeline(*timetable, pp.empty() ? std::string() : pp, stage, params);
      std::vector<Value>& grads = run.grads;
      // Reduce each gradient over its pending-sum axes (never pp: the stages hold different
      // parameters), as TrainGpt does.
      for (Value& g : grads) {
        std::vector<std::string> axes;
        for (int i = 0; i < mesh.num_axes(); ++i) {
          if (g.type[i].kind == AxisKind::kP) axes.push_back(mesh.axis_names()[i]);
        }
        if (!axes.empty()) g = all_reduce(g, Axes(axes));
      }
      // The tied wte: embedding (stage 0) + lm_head (last stage) gradients, on both.
      if (p > 1) {
        NoGradScope no_tape;
        const ParamInfo& pi = layout.params()[wte];
        auto at = std::find(owned.begin(), owned.end(), wte);
        const bool holds = at != owned.end();
        Value mine = holds ? grads[at - owned.begin()]
                           : Value(Tensor::Zeros(ShardOf(globals[wte], mesh, pi.spec, rank).shape(),
                                                 c.dtype),
                                   param_type(pi));
        Value other = ppermute(mine, pp, {{0, p - 1}, {p - 1, 0}});
        if (holds) grads[at - owned.begin()] = mine + other;
      }
      // The global norm: every parameter once (not the last stage's wte copy).
      double norm_sq = 0;
      {
        NoGradScope no_tape;
        Value total;
        for (size_t i = 0; i < owned.size(); ++i) {
          const bool copy = p > 1 && last && owned[i] == wte;
          Value sq = sum_partial(grads[i] * grads[i], {});
          if (copy) sq = sq * 0.0;
          std::vector<std::string> replicated;
          for (int a = 0; a < mesh.num_axes(); ++a) {
            if (sq.type[a].kind == AxisKind::kR) replicated.push_back(mesh.axis_names()[a]);
          }
          if (!replicated.empty()) sq = convert(sq, Axes(replicated), Convert::kRToP);
          if (pp_index >= 0 && sq.type[pp_index].kind == AxisKind::kV) sq = reinterpret(sq, pp);
          total = total.defined() ? total + sq : sq;
        }
        norm_sq = mesh.num_axes() == 0 ? total.item()
                                       : all_reduce(total, Axes(mesh.axis_names())).item();
      }
      const double norm = std::sqrt(norm_sq);
      // The loss: the last stage's, summed over its batch axes, then handed to every stage.
      double loss = 0;
      {
        NoGradScope no_tape;
        if (last) {
          Value l = run.loss;
          std::vector<std::string> partial;
          for (int a = 0; a < mesh.num_axes(); ++a) {
            if (a != pp_index && l.type[a].kind == AxisKind::kP) {
              partial.push_back(mesh.axis_names()[a]);
            }
          }
          if (!partial.empty()) l = all_reduce(l, Axes(partial));
          loss = l.item();
        }
        if (p > 1) {
          SpmdType t(mesh.num_axes());
          t[pp_index] = AxisType::V();
          Value share(Tensor::Scalar(last ? loss : 0.0, DType::kF64), t);
          loss = all_reduce(reinterpret(share, pp), pp).item();
        }
      }
      const double coef = options.clip > 0 ? ClipCoefficient(norm, options.clip) : 1.0;
      std::vector<NamedTensor> local, named_grads;
      for (size_t i = 0; i < owned.size(); ++i) {
        const std::string& name = layout.params()[owned[i]].name;
        local.push_back({name, params[i].tensor});
        named_grads.push_back(
            {name, coef < 1.0 ? MulScalar(grads[i].tensor, coef) : grads[i].tensor});
      }
      if (absl::Status st = opt.Step(local, named_grads); !st.ok()) throw OpError(st);
      for (size_t i = 0; i < owned.size(); ++i) params[i].tensor = local[i].tensor;
      const double t1 = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
      {
        absl::MutexLock lock(&mu);
        bubbles[rank] = 1.0 - run.busy_us / std::max(run.total_us, 1e-9);
      }
      if (rank == 0) {
        if (step == 0) {
          result.peak_activation_bytes_per_rank = run.peak_saved_bytes;
          result.activation_bytes_per_rank = run.recorded_bytes;
          result.largest_activation_bytes = run.largest_recorded_bytes;
        }
        result.losses.push_back(loss);
        result.grad_norms.push_back(norm);
        if (options.on_step) {
          options.on_step(StepInfo{step, loss, norm, (t1 - t0) * 1e-6, &ctx.collective_log()});
        }
        if (step + 1 == options.steps) {
          result.log = ctx.collective_log();
          for (size_t i = 0; i < owned.size(); ++i) {
            const std::string& name = layout.params()[owned[i]].name;
            result.param_bytes_per_rank += params[i].tensor.nbytes();
            result.optimizer_bytes_per_rank += grads[i].tensor.nbytes() +
                                               opt.exp_avg(name).nbytes() +
                                               opt.exp_avg_sq(name).nbytes();
          }
        }
      }
    }
    // Per rank: parameters, exp_avg, exp_avg_sq in layout order (undefined where not held).
    std::vector<Tensor> mine(3 * np);
    for (size_t i = 0; i < owned.size(); ++i) {
      const int k = owned[i];
      mine[k] = params[i].tensor;
      if (options.steps > 0) {
        mine[np + k] = opt.exp_avg(layout.params()[k].name);
        mine[2 * np + k] = opt.exp_avg_sq(layout.params()[k].name);
      }
    }
    absl::MutexLock lock(&mu);
    final_locals[rank] = std::move(mine);
  });
  if (!status.ok()) return status;
  // Assemble each tensor from its owner stage's ranks (pp is the major axis: stage s holds
  // ranks [s*inner, (s+1)*inner)).
  std::vector<std::string> inner_axes;
  for (const std::string& a : mesh.axis_names()) {
    if (a != "pp") inner_axes.push_back(a);
  }
  absl::StatusOr<Mesh> inner = inner_axes.empty() ? Mesh() : mesh.Submesh(inner_axes);
  if (!inner.ok()) return inner.status();
  const int inner_size = mesh.size() / p;
  for (size_t k = 0; k < 3 * np; ++k) {
    const ParamInfo& pi = layout.params()[k % np];
    const int owner = plan.owner[k % np];
    std::vector<Tensor> locals;
    for (int r = 0; r < inner_size; ++r) locals.push_back(final_locals[owner * inner_size + r][k]);
    if (!locals[0].defined()) continue;  // no moments without a step
    absl::StatusOr<Tensor> g = Assemble(*inner, pi.spec, locals, pi.spec.InputType(*inner));
    if (!g.ok()) return g.status();
    AddFinalTensor(layout, k, *g, &result);
  }
  double bubble = 0;
  for (double b : bubbles) bubble += b;
  result.pipeline_bubble = bubble / mesh.size();
  result.steps_done = options.steps;
  if (!options.save_path.empty()) {
    if (absl::Status st = SaveTrainResult(options.save_path, layout, result); !st.ok()) return st;
  }
  return result;
}

}  // namespace shardmap
