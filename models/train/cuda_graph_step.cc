#include "models/train/cuda_graph_step.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "shardmap/collective_ops.h"
#include "shardmap/context.h"
#include "shardmap/ops.h"
#include "tensor/error.h"
#include "tensor/ops/elementwise.h"
#include "tensor/ops/multi_tensor.h"
#include "tensor/ops/shape_ops.h"

namespace shardmap {

CudaGraphDecision DecideCudaGraph(const Model& layout, const TrainOptions& o,
                                  const std::vector<Device>& devices, int64_t first_step) {
  const Mesh& mesh = layout.mesh();
  auto no = [](std::string why) { return CudaGraphDecision{false, std::move(why)}; };
  const bool on_gpu = o.runtime.comm != nullptr ? o.runtime.comm->memory_space().device
                                        : !devices.empty() && devices[0].is_cuda();
  if (!on_gpu) return no("CPU ranks (CUDA graphs are a GPU feature)");
  if (!o.runtime.cuda_graph) return no("off (cuda_graph = false)");
  const std::string eager = "; the steps run eagerly";
  if (o.runtime.comm != nullptr) {
    return no(absl::StrCat("not captured: a process communicator (", o.runtime.comm->name(),
                           ") runs the collectives; capturing them inside the step was never "
                           "checked on a GPU, so one-process-per-GPU runs are not captured",
                           eager));
  }
  if (mesh.size() > 1) {
    const bool shared = std::count(devices.begin(), devices.end(), devices[0]) > 1;
    return no(absl::StrCat("not captured: ", mesh.size(), " in-process ranks (",
                           shared ? "virtual ranks sharing one GPU" : "one per GPU",
                           ") whose collectives synchronise with the host inside every call",
                           eager, " (one rank per process over NCCL would not)"));
  }
  if (layout.pp_ways() > 1 || o.pipeline.microbatches > 1) {
    return no(absl::StrCat("not captured: the pipeline strategy (pp=", layout.pp_ways(),
                           ", microbatches ", o.pipeline.microbatches,
                           ") runs a host-side timetable", eager));
  }
  if (layout.shape().moe.on()) {
    return no(absl::StrCat("not captured: MoE plans the expert capacity slots on the host "
                           "(one read per layer)",
                           eager));
  }
  if (o.tracing.keep_events || o.tracing.writer != nullptr) {
    return no(absl::StrCat("not captured: tracing times every op and collective on the host",
                           eager));
  }
  if (layout.shape().dtype != DType::kF32) {
    return no(absl::StrCat("not captured: ", DTypeName(layout.shape().dtype),
                           " master weights (the fused AdamW kernel that runs in a graph is f32)",
                           eager));
  }
  if (o.steps - first_step < 2) {
    return no(absl::StrCat("not captured: one step to run (the first step runs eagerly to warm "
                           "up; replays start at the second)"));
  }
  return CudaGraphDecision{true, ""};
}

namespace {

// The type of the sum of all of a gradient's elements: P where it is sharded (sum_partial's).
SpmdType SumType(const SpmdType& g) {
  SpmdType t = g;
  for (int a = 0; a < t.num_axes(); ++a) {
    if (t[a].is_sharded()) t[a] = AxisType::P();
  }
  return t;
}

}  // namespace

Tensor GlobalGradNormSquaredOnDevice(const std::vector<Value>& grads,
                                     const std::vector<bool>& counted) {
  RankContext& ctx = RankContext::Get("GlobalGradNormSquaredOnDevice");
  const Mesh& mesh = ctx.mesh();
  NoGradScope no_tape;
  if (grads.empty()) OpFail("GlobalGradNormSquaredOnDevice: no gradients");
  // Gradients grouped by type (order of first appearance): one multi-tensor sum per group.
  std::vector<std::pair<SpmdType, std::vector<Tensor>>> groups;
  for (size_t k = 0; k < grads.size(); ++k) {
    if (!counted[k]) continue;
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const auto& g) { return g.first == grads[k].type; });
    if (it == groups.end()) {
      groups.push_back({grads[k].type, {}});
      it = groups.end() - 1;
    }
    it->second.push_back(grads[k].tensor);
  }
  Value total;
  for (const auto& [type, tensors] : groups) {
    Value s(SumOfSquares(tensors, DType::kF64), SumType(type));
    // Replicated parts count once (R -> P keeps index 0's); V parts add up (V -> P).
    std::vector<std::string> replicated = mesh.AxisNamesOf(s.type.AxesOfKind(AxisKind::kR));
    if (!replicated.empty()) s = convert(s, Axes(replicated), Convert::kRToP);
    std::vector<std::string> varying = mesh.AxisNamesOf(s.type.AxesOfKind(AxisKind::kV));
    if (!varying.empty()) s = reinterpret(s, Axes(varying));
    total = total.defined() ? total + s : s;
  }
  const Device dev = grads[0].tensor.device();
  if (!total.defined()) return Tensor::Zeros({}, DType::kF64, dev);  // nothing counted
  if (mesh.num_axes() == 0) return total.tensor;
  return all_reduce(total, Axes(mesh.axis_names())).tensor;
}

Tensor DeviceOptimizerStep(const Value& loss_share, const std::vector<Value>& grads,
                           const std::vector<bool>& counted, double clip, const Tensor& lr,
                           const std::vector<std::string>& names, std::vector<Value>& params,
                           AdamW& opt) {
  RankContext& ctx = RankContext::Get("DeviceOptimizerStep");
  const Mesh& mesh = ctx.mesh();
  NoGradScope no_tape;
  Value l = loss_share;
  std::vector<std::string> partial = mesh.AxisNamesOf(l.type.AxesOfKind(AxisKind::kP));
  if (!partial.empty()) l = all_reduce(l, Axes(partial));
  const Tensor loss = Cast(l.tensor, DType::kF64).Reshape({1});
  const Tensor sum_sq = GlobalGradNormSquaredOnDevice(grads, counted).Reshape({1});
  const Tensor coef = clip > 0 ? ClipCoefficient(sum_sq, clip) : Tensor();
  std::vector<NamedTensor> local, named_grads;
  for (size_t i = 0; i < params.size(); ++i) {
    local.push_back({names[i], params[i].tensor});
    named_grads.push_back({names[i], grads[i].tensor});
  }
  AdamWStepControl control{lr, Add(loss, sum_sq)};
  if (absl::Status s = opt.Step(local, named_grads, coef, control); !s.ok()) throw OpError(s);
  for (size_t i = 0; i < params.size(); ++i) params[i].tensor = local[i].tensor;
  return Concat({loss, sum_sq}, 0);
}

}  // namespace shardmap
