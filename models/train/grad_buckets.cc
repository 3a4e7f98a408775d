#include "models/train/grad_buckets.h"

#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "shardmap/collective_ops.h"
#include "shardmap/type_rules.h"
#include "tensor/error.h"
#include "tensor/ops/shape_ops.h"

namespace shardmap {
namespace {

// The bucket a gradient belongs to: its kinds with S(d) as V (a flat buffer has no dims).
SpmdType BucketKinds(const SpmdType& t) {
  SpmdType k = t;
  for (int i = 0; i < k.num_axes(); ++i) {
    if (k[i].kind == AxisKind::kV) k[i] = AxisType::V();
  }
  return k;
}

// A gradient's type after the bucket's all_reduce over `reduced`: all_reduce(sum)'s rule, the
// one the blocking all_reduce applies (P -> R on those axes, the rest unchanged).
SpmdType ReducedType(const Mesh& mesh, const SpmdType& t, AxisMask reduced) {
  const CollectiveRule& rule = CollectiveRuleFor(Collective::kAllReduceSum);
  if (std::optional<Rejection> no = CheckCollective(rule, t, reduced, /*dim=*/-1)) {
    OpFail("GradientBuckets: a gradient of type ", t.ToString(mesh.axis_names()), " on axis '",
           mesh.axis_names()[no->axis], "': ", no->rule, ". Fix: ", no->fix);
  }
  return CollectiveResult(rule, t, reduced, /*dim=*/-1, /*invariant=*/false);
}

}  // namespace

GradientBuckets::GradientBuckets(const Mesh& mesh, int count, int64_t bucket_bytes)
    : mesh_(mesh), bucket_bytes_(bucket_bytes), grads_(count), added_(count, false) {
  if (bucket_bytes <= 0) {
    OpFail("GradientBuckets: the bucket size is ", bucket_bytes, " bytes; it must be positive");
  }
}

void GradientBuckets::Add(int k, const Value& grad) {
  if (k < 0 || k >= static_cast<int>(grads_.size()) || added_[k]) {
    OpFail("GradientBuckets::Add: gradient ", k, " is out of range [0, ", grads_.size(),
           ") or was already added");
  }
  added_[k] = true;
  grads_[k] = grad;
  if (grad.type.AxesOfKind(AxisKind::kP) == 0) return;  // nothing to reduce
  const SpmdType kinds = BucketKinds(grad.type);
  const Device device = grad.tensor.device();
  Open* open = nullptr;
  for (Open& o : open_) {
    if (o.kinds == kinds && o.dtype == grad.dtype() && o.device == device) open = &o;
  }
  if (open == nullptr) open = &open_.emplace_back(Open{kinds, grad.dtype(), device, {}, 0});
  open->members.push_back(k);
  open->bytes += static_cast<int64_t>(grad.tensor.nbytes());
  if (open->bytes >= bucket_bytes_) Start(*open);
}

void GradientBuckets::Start(Open& open) {
  if (open.members.empty()) return;
  std::vector<Tensor> parts;
  parts.reserve(open.members.size());
  for (int k : open.members) parts.push_back(grads_[k].tensor.Reshape({-1}));
  Value flat(parts.size() == 1 ? parts[0] : Concat(parts, 0), open.kinds);
  parts.clear();
  // The gradients become views of the bucket (the same values), so their own buffers are freed
  // now rather than when Finish replaces them: the step's peak holds the bucket and its
  // reduction, not the gradients a third time.
  int64_t at = 0;
  for (int k : open.members) {
    const int64_t n = grads_[k].numel();
    grads_[k] = Value(flat.tensor.SliceRows(at, n).Reshape(grads_[k].shape()), grads_[k].type);
    at += n;
  }
  const AxisMask reduced = open.kinds.AxesOfKind(AxisKind::kP);
  pending_.push_back(Started{std::move(open.members), reduced,
                             all_reduce_start(flat, Axes(mesh_.AxisNamesOf(reduced)))});
  open.members.clear();
  open.bytes = 0;
}

std::vector<Value> GradientBuckets::Finish() {
  for (size_t k = 0; k < added_.size(); ++k) {
    if (!added_[k]) OpFail("GradientBuckets::Finish: gradient ", k, " was never added");
  }
  for (Open& o : open_) Start(o);
  for (Started& s : pending_) {
    const Tensor flat = s.call.Wait().tensor;
    int64_t at = 0;
    for (int k : s.members) {
      Value& g = grads_[k];
      const int64_t n = g.numel();
      g = Value(flat.SliceRows(at, n).Reshape(g.shape()), ReducedType(mesh_, g.type, s.reduced));
      at += n;
    }
  }
  pending_.clear();
  open_.clear();
  return std::move(grads_);
}

}  // namespace shardmap
