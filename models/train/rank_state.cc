#include "models/train/rank_state.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "models/gpt/gpt_checkpoint.h"
#include "models/train/strategies.h"
#include "shardmap/collective_ops.h"
#include "shardmap/ops.h"
#include "shardmap/sharding.h"
#include "tensor/error.h"

namespace shardmap {
namespace {

// AdamW's options with the layout's no-decay parameters of this stage named.
AdamWOptions StageAdamW(const Model& layout, const std::vector<int>& held,
                        AdamWOptions adamw) {
  for (int k : held) {
    const ParamInfo& pi = layout.params()[k];
    if (!pi.decay) adamw.no_decay.insert(pi.name);
  }
  return adamw;
}

}  // namespace

absl::StatusOr<StateSource> OpenStateSource(const Model& layout,
                                            const std::vector<NamedTensor>& init,
                                            const TrainOptions& options) {
  StateSource source;
  source.resume = !options.checkpoint.resume_path.empty();
  const std::string& path = source.resume ? options.checkpoint.resume_path : options.checkpoint.init_path;
  if (path.empty()) {
    absl::StatusOr<std::vector<Tensor>> matched = MatchInitialParams(layout, init);
    if (!matched.ok()) return matched.status();
    source.globals = *std::move(matched);
    return source;
  }
  std::shared_ptr<SafetensorsFile> f = options.checkpoint.opened;
  if (f == nullptr || f->path() != path) {
    absl::StatusOr<SafetensorsFile> opened = OpenGptCheckpoint(path);
    if (!opened.ok()) return opened.status();
    f = std::make_shared<SafetensorsFile>(*std::move(opened));
  }
  if (absl::Status s = CheckGptCheckpoint(*f, layout, source.resume); !s.ok()) return s;
  if (source.resume) {
    absl::StatusOr<int64_t> step = CheckpointStep(*f);
    if (!step.ok()) return step.status();
    source.first_step = *step;
    if (source.first_step >= options.steps) {
      return absl::InvalidArgumentError(absl::StrCat(
          "checkpoint '", path, "' is at step ", source.first_step, " but the run's total is ",
          options.steps, " steps: nothing to train; raise --steps (the total count)"));
    }
  }
  source.file = std::move(f);
  return source;
}

RankState::RankState(const Model& layout, const RunPlan& plan, const StateSource& source,
                     const AdamWOptions& adamw, int rank, int stage, Device dev)
    : held(plan.stage_plan.owned[stage]),
      opt(StageAdamW(layout, plan.stage_plan.owned[stage], adamw)),
      layout_(layout),
      plan_(plan),
      resume_(source.resume),
      stage_(stage),
      dev_(dev) {
  const Mesh& mesh = layout.mesh();
  auto read = [&](const std::string& tensor, const ParamInfo& pi) {
    absl::StatusOr<Tensor> t =
        ReadGptShard(*source.file, tensor, pi, mesh, rank, layout.shape().dtype);
    if (!t.ok()) throw OpError(t.status());
    return *t;
  };
  for (int k : held) {
    const ParamInfo& pi = layout.params()[k];
    Tensor local = source.file != nullptr ? read(layout.CheckpointName(pi), pi)
                                          : ParamShard(source.globals[k], pi, mesh, rank);
    local = local.To(dev);
    // AdamW updates in place: never the caller's tensor (an unsharded shard may be it).
    if (source.file == nullptr && local.SharesStorageWith(source.globals[k])) local = local.Clone();
    params.emplace_back(local, plan.ParamType(mesh, pi));
    held_names.push_back(pi.name);
  }
  if (!source.resume) {
    // The moments exist from the start, as the parameters do (AdamW would make them zero at
    // its first step): state held across steps, not the first step's memory peak.
    for (size_t i = 0; i < held.size(); ++i) {
      const Tensor& p = params[i].tensor;
      opt.SetState(held_names[i], Tensor::Zeros(p.shape(), p.dtype(), p.device()),
                   Tensor::Zeros(p.shape(), p.dtype(), p.device()));
    }
  }
  if (source.resume) {
    for (int k : held) {
      const ParamInfo& pi = layout.params()[k];
      const std::string saved = layout.CheckpointName(pi);
      opt.SetState(pi.name, read("optimizer.exp_avg." + saved, pi).To(dev),
                   read("optimizer.exp_avg_sq." + saved, pi).To(dev));
    }
    opt.set_steps(source.first_step);
  }
}

std::vector<Tensor> RankState::GatherGlobals() const {
  NoGradScope no_tape;
  const Mesh& mesh = layout_.mesh();
  const size_t np = layout_.params().size();
  std::vector<Tensor> out(3 * np);
  const bool moments = opt.steps() > 0 || resume_;
  for (size_t k = 0; k < 3 * np; ++k) {
    if (k >= np && !moments) break;
    const int i = static_cast<int>(k % np);
    const ParamInfo& pi = layout_.params()[i];
    auto at = std::find(held.begin(), held.end(), i);
    const bool mine = at != held.end() && plan_.stage_plan.owner[i] == stage_;
    Tensor local;
    if (mine) {
      const std::string& name = pi.name;
      local = k < np       ? params[at - held.begin()].tensor
              : k < 2 * np ? opt.exp_avg(name)
                           : opt.exp_avg_sq(name);
    } else {
      local = Tensor::Zeros(LocalShape(pi, mesh), layout_.shape().dtype, dev_);
    }
    Value v(local, plan_.ParamType(mesh, pi));
    for (int d = 0; d < pi.spec.size(); ++d) {
      if (!pi.spec.dim_axes(d).empty()) v = all_gather(v, d, Axes(pi.spec.dim_axes(d)));
    }
    if (plan_.stages > 1) v = all_reduce(reinterpret(v, layout_.pp_axis()), layout_.pp_axis());
    out[k] = v.tensor.To(Device::Cpu());
    // An unsharded CPU tensor comes back as itself; AdamW updates it in place, so a snapshot
    // gets its own copy.
    if (out[k].SharesStorageWith(local)) out[k] = out[k].Clone();
  }
  return out;
}

std::vector<Tensor> RankState::LocalTensors() const {
  const size_t np = layout_.params().size();
  std::vector<Tensor> mine(3 * np);
  for (size_t i = 0; i < held.size(); ++i) {
    const int k = held[i];
    mine[k] = params[i].tensor;
    mine[np + k] = opt.exp_avg(layout_.params()[k].name);
    mine[2 * np + k] = opt.exp_avg_sq(layout_.params()[k].name);
  }
  return mine;
}

int64_t RankState::ParamBytes() const {
  int64_t bytes = 0;
  for (const Value& p : params) bytes += p.tensor.nbytes();
  return bytes;
}

int64_t RankState::OptimizerBytes(const std::vector<Value>& grads) const {
  int64_t bytes = 0;
  for (size_t i = 0; i < held.size(); ++i) {
    bytes += grads[i].tensor.nbytes() + opt.exp_avg(held_names[i]).nbytes() +
             opt.exp_avg_sq(held_names[i]).nbytes();
  }
  return bytes;
}

}  // namespace shardmap
