#include "models/train/stage_fsdp.h"

#include <algorithm>
#include <memory>
#include <string>
#include <utility>

#include "models/parallel/pipeline.h"
#include "models/train/fsdp_params.h"
#include "shardmap/collective_ops.h"
#include "shardmap/context.h"
#include "shardmap/ops.h"
#include "shardmap/type_rules.h"
#include "tensor/error.h"
#include "tensor/ops/shape_ops.h"

namespace shardmap {

StageFsdp::StageFsdp(const Model& layout, const RunPlan& plan, int stage,
                     const std::vector<Value>& params, Options options, GradientBuckets* buckets)
    : layout_(layout), params_(params), options_(options), buckets_(buckets) {
  if (layout.fsdp_axis().empty()) {
    OpFail("StageFsdp: the mesh ", layout.mesh().ShortString(), " has no FSDP axis (dp_shard)");
  }
  if (options.prefetch < 1) {
    OpFail("StageFsdp: the prefetch depth is ", options.prefetch,
           "; it must be at least 1 (the next unit's all-gather runs beside this one's compute)");
  }
  held_ = plan.stage_plan.owned[stage];
  if (held_.size() != params.size()) {
    OpFail("StageFsdp: stage ", stage, " holds ", held_.size(), " parameters but ",
           params.size(), " were passed");
  }
  // The stages issue different collectives from here on: every communicator made now, in one
  // order on every rank (RunPipeline's rule; a no-op once made).
  CreateAllCommunicators(RankContext::Get("StageFsdp"));
  k_of_.assign(layout.params().size(), -1);
  for (size_t k = 0; k < held_.size(); ++k) k_of_[held_[k]] = static_cast<int>(k);
  Order(plan, stage);
  MakeLeaves();
  if (!buckets_) out_.resize(params.size());
  if (!options_.overlap) return;
  for (int u = 0; u <= options_.prefetch && u < static_cast<int>(units_.size()); ++u) Start(u);
}

void StageFsdp::Order(const RunPlan& plan, int stage) {
  // The units in the first microbatch's forward order: chunk by chunk (virtual stage c * p + s),
  // the embeddings, the blocks, then the head's final LayerNorm and tied wte.
  const StagePlan& sp = plan.stage_plan;
  const int64_t layers = layout_.shape().layers;
  const int p = plan.stages, v = sp.virtual_stages, last_vs = p * v - 1;
  std::vector<int> order;
  auto add = [&](int unit) {
    if (std::find(order.begin(), order.end(), unit) == order.end()) order.push_back(unit);
  };
  for (int c = 0; c < v; ++c) {
    const int vs = c * p + stage;
    if (vs == 0) add(0);
    for (int64_t l = sp.first_layer[vs]; l < sp.first_layer[vs] + sp.layers[vs]; ++l) {
      add(static_cast<int>(1 + l));
    }
    if (vs == last_vs) {
      add(static_cast<int>(layers + 1));
      add(0);
    }
  }
  unit_of_.assign(held_.size(), -1);
  for (size_t k = 0; k < held_.size(); ++k) {
    const ParamInfo& info = layout_.params()[held_[k]];
    if (info.fsdp_dim < 0) continue;
    const int unit = info.unit.Index(layers);
    add(unit);  // a unit outside the forward's list (none in GPT) goes last
    const int pos = static_cast<int>(std::find(order.begin(), order.end(), unit) - order.begin());
    if (pos >= static_cast<int>(units_.size())) units_.resize(pos + 1);
    unit_of_[k] = pos;
    units_[pos].ks.push_back(static_cast<int>(k));
  }
  // Units of this stage only (drop positions without FSDP parameters, keeping the order).
  std::vector<int> remap(units_.size(), -1);
  std::vector<Unit> kept;
  for (size_t u = 0; u < units_.size(); ++u) {
    if (units_[u].ks.empty()) continue;
    remap[u] = static_cast<int>(kept.size());
    kept.push_back(std::move(units_[u]));
  }
  units_ = std::move(kept);
  for (int& u : unit_of_) u = u < 0 ? -1 : remap[u];
  for (Unit& u : units_) u.grads.resize(u.ks.size());
}

void StageFsdp::MakeLeaves() {
  const Mesh& mesh = layout_.mesh();
  const AxisMask mask = *mesh.Mask({layout_.fsdp_axis()});
  const int n = mesh.GroupSize(mask);
  const CollectiveRule& gather = CollectiveRuleFor(Collective::kAllGather);
  leaves_.resize(params_.size());
  for (size_t k = 0; k < params_.size(); ++k) {
    const Value& shard = params_[k];
    const int dim = layout_.params()[held_[k]].fsdp_dim;
    if (dim < 0) {
      leaves_[k] = shard;
      continue;
    }
    if (!options_.overlap) {
      // The reference: one blocking all_gather per parameter, before the first microbatch.
      leaves_[k] = all_gather(Value(shard.tensor, shard.type), dim, layout_.fsdp_axis());
      leaves_[k].tensor = TrimFsdpPad(leaves_[k].tensor, layout_.params()[held_[k]]);
      Count(static_cast<int64_t>(leaves_[k].tensor.nbytes()));
      continue;
    }
    Shape full = shard.shape();
    full[dim] = full[dim] * n - layout_.params()[held_[k]].fsdp_pad;  // the trimmed leaf
    Tensor t = Tensor::Empty(full, shard.dtype(), shard.tensor.device());
    t.ReleaseBuffer();  // refilled by the unit's gather
    leaves_[k] = Value(std::move(t), CollectiveResult(gather, shard.type, mask, dim, false));
  }
}

void StageFsdp::Start(int u) {
  Unit& unit = units_[u];
  if (unit.gathered || unit.gather.pending()) return;
  std::vector<Value> shards;
  std::vector<int> dims;
  for (int k : unit.ks) {
    shards.emplace_back(params_[k].tensor, params_[k].type);  // off the tape
    dims.push_back(layout_.params()[held_[k]].fsdp_dim);
  }
  unit.gather = all_gather_flat_start(shards, dims, layout_.fsdp_axis(),
                                      layout_.shape().compute_dtype());
}

void StageFsdp::Ensure(int u) {
  if (units_[u].gathered) {
    if (units_[u].released) {
      OpFail("StageFsdp: a parameter of unit ", u, " was used after its gradients were final "
             "and its gathered parameters freed (a forward after the chunk's last backward?)");
    }
    return;
  }
  // The units before it first (in order: every rank of the FSDP group waits the same calls).
  for (int w = 0; w <= u; ++w) {
    Unit& unit = units_[w];
    if (unit.gathered) continue;
    Start(w);
    std::vector<Value> full = unit.gather.Wait();
    for (size_t i = 0; i < unit.ks.size(); ++i) Fill(unit.ks[i], std::move(full[i].tensor));
    unit.gathered = true;
  }
  for (int w = u + 1; w <= u + options_.prefetch && w < static_cast<int>(units_.size()); ++w) {
    Start(w);
  }
}

void StageFsdp::Fill(int k, Tensor full) {
  const Tensor& leaf = leaves_[k].tensor;
  // Gathered in the compute dtype; the leaf is in the master dtype (exact: bf16 -> f32 -> bf16
  // at use gives the gathered bits back).
  if (full.dtype() != leaf.dtype()) full = Cast(full, leaf.dtype());
  leaf.RefillBuffer(TrimFsdpPad(full, layout_.params()[held_[k]]));
  Count(static_cast<int64_t>(leaf.nbytes()));
}

ParamFn StageFsdp::Use(const std::vector<Value>& all) {
  // Its own copy of the leaves (a recomputed block calls it in the backward).
  auto held = std::make_shared<const std::vector<Value>>(all);
  return [this, held](const std::string& name) {
    const int i = layout_.Find(name);
    const int k = k_of_[i];
    if (k >= 0 && unit_of_[k] >= 0 && options_.overlap) Ensure(unit_of_[k]);
    const Value& p = (*held)[i];
    const DType compute = layout_.shape().compute_dtype();
    return p.dtype() == compute ? p : cast(p, compute);
  };
}

std::function<void(int, const Value&)> StageFsdp::FinalGradHook() {
  return [this](int k, const Value& g) { OnFinal(k, g); };
}

void StageFsdp::OnFinal(int k, const Value& g) {
  const int u = unit_of_[k];
  if (u < 0) return Hand(k, g);  // not FSDP-sharded: its reduction is the buckets'
  Unit& unit = units_[u];
  const size_t pos = std::find(unit.ks.begin(), unit.ks.end(), k) - unit.ks.begin();
  unit.grads[pos] = Padded(k, g);
  if (++unit.final < static_cast<int>(unit.ks.size())) return;
  // The unit's last gradient: one flat reduce-scatter, started now; the previous unit's waited.
  std::vector<int> dims;
  std::vector<SpmdType> types;
  for (int j : unit.ks) {
    dims.push_back(layout_.params()[held_[j]].fsdp_dim);
    types.push_back(params_[j].type);
  }
  scatters_.emplace_back(u,
                         reduce_scatter_flat_start(unit.grads, dims, layout_.fsdp_axis(), types));
  unit.grads.clear();  // in the packed buffer now
  Release(u);
  WaitScatters(/*keep=*/1);
}

void StageFsdp::Release(int u) {
  Unit& unit = units_[u];
  if (unit.released) return;
  if (unit.gather.pending()) (void)unit.gather.Wait();  // prefetched, never used
  for (int k : unit.ks) {
    if (leaves_[k].tensor.buffer_released()) continue;
    Count(-static_cast<int64_t>(leaves_[k].tensor.nbytes()));
    leaves_[k].tensor.ReleaseBuffer();
  }
  unit.released = true;
}

void StageFsdp::WaitScatters(size_t keep) {
  while (scatters_.size() > keep) {
    auto [u, call] = std::move(scatters_.front());
    scatters_.pop_front();
    std::vector<Value> shards = call.Wait();
    for (size_t i = 0; i < shards.size(); ++i) Hand(units_[u].ks[i], shards[i]);
  }
}

void StageFsdp::Hand(int k, const Value& g) {
  if (buckets_ != nullptr) {
    buckets_->Add(k, g);
  } else {
    out_[k] = g;
  }
}

std::vector<Value> StageFsdp::Finish(std::vector<Value> grads) {
  NoGradScope no_tape;
  if (options_.overlap) {
    for (size_t u = 0; u < units_.size(); ++u) {
      if (units_[u].final < static_cast<int>(units_[u].ks.size())) {
        OpFail("StageFsdp: unit ", u, " got ", units_[u].final, " of its ", units_[u].ks.size(),
               " final gradients (RunPipeline's on_final_grad must be FinalGradHook())");
      }
    }
    WaitScatters(0);
  } else {
    // The reference: one blocking reduce_scatter per parameter, in held order.
    for (size_t k = 0; k < grads.size(); ++k) {
      const int dim = layout_.params()[held_[k]].fsdp_dim;
      Value g = std::move(grads[k]);
      if (dim >= 0) {
        g = reduce_scatter(Padded(static_cast<int>(k), g), dim, layout_.fsdp_axis());
        g.type = CotangentType(g.type, params_[k].type);
      }
      Hand(static_cast<int>(k), g);
    }
    for (size_t u = 0; u < units_.size(); ++u) Release(static_cast<int>(u));
  }
  return std::move(out_);
}

Value StageFsdp::Padded(int k, const Value& g) const {
  // Zeros for the padding rows: the reduce-scatter moves the stored (padded) shape.
  const ParamInfo& info = layout_.params()[held_[k]];
  return info.fsdp_pad == 0 ? g : Value(PadForFsdp(g.tensor, info), g.type);
}

void StageFsdp::Count(int64_t bytes) {
  live_bytes_ += bytes;
  peak_bytes_ = std::max(peak_bytes_, live_bytes_);
}

}  // namespace shardmap
