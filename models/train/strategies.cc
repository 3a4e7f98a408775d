#include "models/train/strategies.h"

#include "models/model/recompute_block.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_format.h"
#include "autograd/value_and_grad.h"
#include "shardmap/collective_ops.h"
#include "shardmap/ops.h"
#include "tensor/error.h"

namespace shardmap {

Shape LocalShape(const ParamInfo& p, const Mesh& mesh) {
  Shape s = StoredShape(p);  // FSDP's padding included
  for (int d = 0; d < p.spec.size(); ++d) s[d] /= std::max(1, p.spec.NumBlocks(mesh, d));
  return s;
}

std::vector<std::string> AxesOfKind(const Mesh& mesh, const SpmdType& type, AxisKind kind,
                                    int skip) {
  const uint32_t skipped = skip >= 0 ? 1u << skip : 0u;
  return mesh.AxisNamesOf(type.AxesOfKind(kind) & ~skipped);
}

Backprop OneProgramBackprop(const Model& layout, const std::vector<Value>& params,
                            const std::vector<Value>& ids, const std::vector<Value>& targets,
                            int64_t global_tokens, TypeTrace* types, Tape& tape,
                            TracingRecorder& rec, GradientBuckets* buckets,
                            const FsdpSchedule* fsdp) {
  Backprop out;
  for (size_t j = 0; j < ids.size(); ++j) {
    const bool last = j + 1 == ids.size();
    std::vector<Value> watched;
    for (const Value& p : params) watched.push_back(tape.Watch(p));
    std::optional<FsdpParams> gatherer;  // lives until the backward is over
    if (fsdp != nullptr && !layout.fsdp_axis().empty()) gatherer.emplace(layout, watched, *fsdp, tape, &rec);
    Value loss;
    {
      ScopedRecorder scope(&rec);
      loss = ModelLoss(layout, gatherer ? gatherer->Use() : ParamUse(layout, watched), ids[j],
                         targets[j], global_tokens, j == 0 ? types : nullptr, &out.moe);
    }
    if (j == 0) out.forward_end_us = TraceNowUs();
    Tape::GradReadyFn on_ready;
    if (buckets != nullptr && last) {
      // The microsteps' sum, as below (the same op in the same order), handed over when final.
      on_ready = [&](int k, const Value& g) {
        buckets->Add(k, j == 0 ? g : out.grads[k] + g);
      };
    }
    std::vector<Value> grads = tape.Backward(loss, LossSeed(loss), watched, on_ready);
    out.peak_saved_bytes = std::max(out.peak_saved_bytes, tape.peak_saved_bytes());
    if (gatherer) out.peak_gathered_bytes = std::max(out.peak_gathered_bytes, gatherer->peak_gathered_bytes());
    tape.Clear();  // drop the saved activations now
    loss.node = -1;
    NoGradScope no_tape;
    if (on_ready) {
      out.grads.clear();  // in the buckets
    } else if (j == 0) {
      out.grads = std::move(grads);
    } else {
      for (size_t i = 0; i < grads.size(); ++i) out.grads[i] = out.grads[i] + grads[i];
    }
    out.loss = j == 0 ? loss : out.loss + loss;
  }
  out.activation_bytes = rec.activation_bytes() / static_cast<int64_t>(ids.size());
  out.largest_activation_bytes = rec.largest_activation();
  return out;
}

Backprop PipelineBackprop(const Model& layout, const RunPlan& plan, int stage,
                          const std::vector<Value>& params, const std::vector<Value>& ids,
                          const std::vector<Value>& targets, const SpmdType& boundary_type,
                          TypeTrace* types, BackwardObserver* observer,
                          GradientBuckets* buckets, const FsdpSchedule* fsdp) {
  const ModelShape& c = layout.shape();
  const StagePlan& sp = plan.stage_plan;
  const std::vector<int>& owned = sp.owned[stage];
  const std::vector<int>& owned_chunk = sp.owned_chunk[stage];
  const int last_vs = plan.stages * sp.virtual_stages - 1;
  const size_t np = layout.params().size();
  // FSDP: the stage's units gathered once per step and reduce-scattered once (stage_fsdp.h).
  std::optional<StageFsdp> gatherer;
  if (!layout.fsdp_axis().empty()) {
    gatherer.emplace(layout, plan, stage, params,
                     StageFsdp::Options{fsdp != nullptr, fsdp != nullptr ? fsdp->prefetch : 1},
                     buckets);
  }
  PipelineStage ps;
  ps.boundary_shape = {plan.boundary_rows, c.d_model};
  ps.boundary_dtype = c.compute_dtype();  // bf16 activations under mixed precision
  ps.boundary_type = boundary_type;
  ps.backward_observer = observer;
  if (gatherer && gatherer->overlapped()) {
    ps.on_final_grad = gatherer->FinalGradHook();
  } else if (buckets != nullptr && !gatherer) {
    ps.on_final_grad = [buckets](int k, const Value& g) { buckets->Add(k, g); };
  }
  ps.param_chunks = owned_chunk;
  // Chunk c of this stage: virtual stage c * p + stage (the stage itself without interleaving).
  ps.forward = [&](int mb, int chunk, const Value& in, const std::vector<Value>& watched) {
    std::vector<Value> all(np);
    for (size_t i = 0, j = 0; i < owned.size(); ++i) {
      if (owned_chunk[i] == chunk) all[owned[i]] = watched[j++];
    }
    const ParamFn use = gatherer ? gatherer->Use(all) : ParamUse(layout, all);
    const int vs = chunk * plan.stages + stage;
    Value x = vs == 0 ? layout.Embed(use, ids[mb]) : in;
    const int64_t l0 = sp.first_layer[vs];
    for (int64_t l = l0; l < l0 + sp.layers[vs]; ++l) {
      x = ModelBlock(layout, use, l, x, l == 0 && mb == 0 ? types : nullptr);
    }
    return vs == last_vs ? layout.Head(use, x, targets[mb], plan.global_tokens) : x;
  };
  PipelineResult run = RunPipeline(*plan.timetable, layout.pp_axis(), ps,
                                   gatherer ? gatherer->params() : params);
  Backprop out;
  out.grads = gatherer ? gatherer->Finish(std::move(run.grads)) : std::move(run.grads);
  if (gatherer) out.peak_gathered_bytes = gatherer->peak_gathered_bytes();
  out.loss = run.loss;
  out.peak_saved_bytes = run.peak_saved_bytes;
  out.activation_bytes = run.recorded_bytes;
  out.largest_activation_bytes = run.largest_recorded_bytes;
  out.busy_us = run.busy_us;
  out.total_us = run.total_us;
  out.spans = std::move(run.spans);
  return out;
}

SpmdType PipelineBoundaryType(const Model& layout, const RunPlan& plan, const Device& dev) {
  NoGradScope no_tape;
  const ModelShape& c = layout.shape();
  const Mesh& mesh = layout.mesh();
  std::vector<Value> probe(layout.params().size());
  for (size_t k = 0; k < layout.params().size(); ++k) {  // the embedding unit's parameters
    const ParamInfo& pi = layout.params()[k];
    if (pi.unit.kind != ModelUnit::kEmbed) continue;
    probe[k] = Value(Tensor::Zeros(LocalShape(pi, mesh), c.dtype, dev), plan.ParamType(mesh, pi));
  }
  Value ids(Tensor::Zeros({plan.local_rows}, DType::kI64, dev), plan.RowType(layout));
  return layout.Embed(ParamUse(layout, probe), ids).type;
}

void ReduceGradients(const Mesh& mesh, std::vector<Value>& grads) {
  for (Value& g : grads) {
    std::vector<std::string> axes = AxesOfKind(mesh, g.type, AxisKind::kP);
    if (!axes.empty()) g = all_reduce(g, Axes(axes));
  }
}

std::unique_ptr<GradientBuckets> NewGradientBuckets(const Model& layout,
                                                   const OverlapOptions& overlap,
                                                   const RankState& state) {
  if (!overlap.on) return nullptr;
  return std::make_unique<GradientBuckets>(layout.mesh(), static_cast<int>(state.params.size()),
                                           overlap.bucket_bytes);
}

void FinishGradients(const Model& layout, GradientBuckets* buckets, std::vector<Value>& grads) {
  if (buckets == nullptr) {
    ReduceGradients(layout.mesh(), grads);
  } else {
    NoGradScope no_tape;
    grads = buckets->Finish();
  }
}

void ExchangeTiedEmbeddingGrad(const Model& layout, const RunPlan& plan, int stage,
                               const std::vector<int>& held, const Device& dev,
                               std::vector<Value>& grads, std::vector<bool>& counted) {
  const int p = plan.stages;
  if (p <= 1) return;
  NoGradScope no_tape;
  const Mesh& mesh = layout.mesh();
  for (int tied = 0; tied < static_cast<int>(layout.params().size()); ++tied) {
    const ParamInfo& pi = layout.params()[tied];
    if (!pi.tied_to_head) continue;
    auto at = std::find(held.begin(), held.end(), tied);
    const bool holds = at != held.end();
    Value mine = holds ? grads[at - held.begin()]
                       : Value(Tensor::Zeros(LocalShape(pi, mesh), layout.shape().dtype, dev),
                               plan.ParamType(mesh, pi));
    Value other = ppermute(mine, layout.pp_axis(), {{0, p - 1}, {p - 1, 0}});
    if (holds) grads[at - held.begin()] = mine + other;
    if (holds && stage == p - 1) counted[at - held.begin()] = false;  // the norm counts it once
  }
}

double ShareLoss(const Model& layout, const RunPlan& plan, int stage, const Value& loss,
                 const Device& dev) {
  NoGradScope no_tape;
  const Mesh& mesh = layout.mesh();
  double value = 0;
  if (loss.defined()) {
    Value l = loss;
    std::vector<std::string> partial = AxesOfKind(mesh, l.type, AxisKind::kP, plan.pp_index);
    if (!partial.empty()) l = all_reduce(l, Axes(partial));
    value = l.item();
  }
  if (plan.stages > 1) {
    SpmdType t(mesh.num_axes());
    t[plan.pp_index] = AxisType::V();
    Value share(Tensor::Scalar(stage == plan.stages - 1 ? value : 0.0, DType::kF64).To(dev), t);
    value = all_reduce(reinterpret(share, layout.pp_axis()), layout.pp_axis()).item();
  }
  return value;
}

double ForwardLoss(const Model& layout, const std::vector<Value>& params,
                   const std::vector<Value>& ids, const std::vector<Value>& targets,
                   int64_t global_tokens) {
  NoGradScope no_tape;
  const Mesh& mesh = layout.mesh();
  Value total;
  for (size_t j = 0; j < ids.size(); ++j) {
    MoeStats ignored;
    Value l = ModelLoss(layout, ParamUse(layout, params), ids[j], targets[j], global_tokens,
                        nullptr, &ignored);
    total = total.defined() ? total + l : l;
  }
  std::vector<std::string> partial = AxesOfKind(mesh, total.type, AxisKind::kP);
  if (!partial.empty()) total = all_reduce(total, Axes(partial));
  return total.item();
}

double PipelineForwardLoss(const Model& layout, const RunPlan& plan, int stage,
                           const std::vector<int>& held, const std::vector<Value>& params,
                           const std::vector<Value>& ids, const std::vector<Value>& targets,
                           const SpmdType& boundary_type, const Device& dev) {
  NoGradScope no_tape;
  const ModelShape& c = layout.shape();
  const int p = plan.stages, nvs = p * plan.stage_plan.virtual_stages;
  std::vector<Value> all(layout.params().size());
  for (size_t i = 0; i < held.size(); ++i) all[held[i]] = params[i];
  const ParamFn use = ParamUse(layout, all);
  Value loss;
  for (size_t k = 0; k < ids.size(); ++k) {
    Value x = stage == 0 ? layout.Embed(use, ids[k])
                         : Value(Tensor::Zeros({plan.boundary_rows, c.d_model},
                                               c.compute_dtype(), dev),
                                 boundary_type);
    x.type = boundary_type;
    // Virtual stage vs runs on stage vs mod p (its chunk vs / p) and hands on round the ring.
    for (int vs = 0; vs < nvs; ++vs) {
      const int t = vs % p;
      if (stage == t) {
        const int64_t l0 = plan.stage_plan.first_layer[vs];
        for (int64_t l = l0; l < l0 + plan.stage_plan.layers[vs]; ++l) {
          x = ModelBlock(layout, use, l, x);
        }
        x.type = boundary_type;
        if (vs == nvs - 1) {
          Value l = layout.Head(use, x, targets[k], plan.global_tokens);
          loss = loss.defined() ? loss + l : l;
        }
      }
      if (vs + 1 < nvs && p > 1) x = ppermute(x, layout.pp_axis(), {{t, (t + 1) % p}});
    }
  }
  return ShareLoss(layout, plan, stage, loss, dev);
}

void NonFiniteStop(int64_t step, double loss, double norm) {
  throw OpError(absl::FailedPreconditionError(absl::StrFormat(
      "step %d: the loss is %g and the gradient norm %g (not finite); stopping before "
      "the optimizer step. The parameters (an --init file with NaN/inf?) or the inputs "
      "hold non-finite values, or training diverged (lower the learning rate)",
      step, loss, norm)));
}

}  // namespace shardmap
