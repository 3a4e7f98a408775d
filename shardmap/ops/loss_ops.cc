#include "shardmap/ops/loss_ops.h"

#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "shardmap/ops/collective_ops.h"
#include "shardmap/runtime/context.h"
#include "shardmap/internal/typing.h"
#include "shardmap/ops/nn_ops.h"
#include "shardmap/ops/ops.h"
#include "shardmap/runtime/tape_hook.h"
#include "tensor/cuda/device_memory.h"
#include "tensor/cuda/graph.h"
#include "tensor/error.h"
#include "tensor/ops/reduce.h"
#include "tensor/ops/routing.h"
#include "tensor/ops/shape_ops.h"

namespace shardmap {
namespace {

// Shape and dtype checks shared by both losses: targets are integer ids with logits' leading
// dims.
void CheckTargets(const char* op, const Value& logits, const Value& targets) {
  internal::CheckMesh(op, logits, "logits");
  internal::CheckMesh(op, targets, "targets");
  if (logits.rank() < 1) OpFail(op, ": logits ", logits.ToString(), " need a class dim");
  if (IsFloating(targets.dtype())) {
    OpFail(op, ": targets ", targets.ToString(),
           " are floating point; class ids are i32 or i64. Fix: cast(targets, DType::kI64) "
           "(or load them as integers)");
  }
  bool match = targets.rank() == logits.rank() - 1;
  for (int d = 0; match && d < targets.rank(); ++d) match = targets.dim(d) == logits.dim(d);
  if (!match) {
    OpFail(op, ": targets ", targets.ToString(), " must have the leading dims of logits ",
           logits.ToString(), " (one class id per row)");
  }
}

// The ids on the host, or nullopt when they are not read: shape-only (meta) tensors; GPU tensors
// while a CUDA graph is captured (a host read would break the capture) or when the thread defers
// its index checks (the trainer's rank threads: a read here would be a host sync per step, and
// the trainer checks every token id on the host before its first step, CheckTokens).
std::optional<std::vector<int64_t>> HostIds(const Tensor& ids) {
  if (ids.is_meta()) return std::nullopt;
  if (ids.is_cuda()) {
    if (cuda::IsCapturing(ids.device().index) || cuda::DeferredIndexChecks()) return std::nullopt;
    return ids.To(Device::Cpu()).ToVector<int64_t>();
  }
  return ids.ToVector<int64_t>();
}

// 1 where 0 <= id < v, else 0 (ignored rows), [numel] in dtype, computed where the ids are (a
// shard-index lookup and a row gather of ones: no host read).
Tensor InRangeMask(const Tensor& ids, int64_t v, DType dtype) {
  const Tensor flat = ids.Reshape({ids.numel()});
  if (ids.is_meta()) return Tensor::Zeros({ids.numel()}, dtype, ids.device());
  Tensor rows = LocalIndices(flat, 0, v, /*stride=*/0);
  return GatherRows(Tensor::Ones({v, 1}, dtype, ids.device()), rows).Reshape({ids.numel()});
}

// The axis's index in the running mesh; an OpError naming the mesh's axes when it has none.
int AxisOf(const char* op, const std::string& axis) {
  const Mesh& mesh = RankContext::Get(op).mesh();
  const int a = mesh.AxisIndex(axis);
  if (a < 0) {
    OpFail(op, ": the mesh ", mesh.ShortString(), " has no axis '", axis,
           "'. Fix: pass the axis that shards the logits' classes");
  }
  return a;
}

// Checked mode: the classes (last dim) of logits must be sharded over `a`.
void CheckVocabSharded(const char* op, const Value& logits, const Value& targets, int a) {
  if (!internal::Checked()) return;
  const AxisType t = logits.type[a];
  if (t.is_sharded() && t.dim == logits.rank() - 1) return;
  std::string rule, fix;
  if (t.kind == AxisKind::kP) {
    rule = "logits are a pending sum (P): the loss is nonlinear in them";
    fix = "all_reduce the logits first (or make the head column-parallel, S(last))";
  } else {
    rule = absl::StrCat("the classes (dim ", logits.rank() - 1,
                        ") of logits are not sharded over this axis (", t.ToString(), ")");
    fix = "use cross_entropy(logits, targets): its classes are whole here; the vocab-parallel "
          "loss is for logits from a column-parallel head (S(last))";
  }
  internal::TypeFail(op, a, rule, fix, {{"logits", &logits}, {"targets", &targets}});
}

// Every id is ignore_index or in [0, v); *any_ignored says whether some row is ignored.
void CheckIds(const char* op, const std::vector<int64_t>& ids, int64_t v, int64_t ignore_index,
              const std::string& where, bool* any_ignored) {
  *any_ignored = false;
  for (size_t r = 0; r < ids.size(); ++r) {
    if (ids[r] == ignore_index) {
      *any_ignored = true;
    } else if (ids[r] < 0 || ids[r] >= v) {
      OpFail(op, ": target ", ids[r], " at row ", r, " is outside the vocabulary [0, ", v, ")",
             where, " and is not ignore_index (", ignore_index,
             "). Fix: check the tokenizer's vocabulary size against the model's, or mark the row "
             "with ignore_index");
    }
  }
}

}  // namespace

Value cross_entropy_mean(const Value& logits, const Value& targets, int64_t ignore_index) {
  const char* op = "cross_entropy_mean";
  CheckTargets(op, logits, targets);
  Value per_row = cross_entropy(logits, targets, ignore_index);  // checks ids and types
  if (internal::Checked()) {
    for (int a = 0; a < per_row.type.num_axes(); ++a) {
      if (per_row.type[a].kind != AxisKind::kV) continue;
      internal::TypeFail(op, a,
                         "the rows of logits vary over this axis: a mean needs the global count "
                         "of rows",
                         "sum_partial(cross_entropy(logits, targets), {}) divided by the global "
                         "number of rows, then all_reduce it over this axis",
                         {{"logits", &logits}, {"targets", &targets}});
    }
  }
  Value total = sum(per_row, {});
  // max(count of non-ignored rows, 1): all rows ignored gives 0 / 1, not NaN.
  Tensor count = Sum(InRangeMask(targets.tensor, logits.dim(-1), logits.dtype()), {0}, false);
  Tensor one = Tensor::Ones({1}, logits.dtype(), count.device());
  Tensor denom = Max(Concat({count.Reshape({1}), one}, 0), {0}, false);
  return total / Value(denom, total.type);
}

Value vocab_parallel_cross_entropy(const Value& logits, const Value& targets,
                                   const std::string& axis, int64_t ignore_index) {
  const char* op = "vocab_parallel_cross_entropy";
  CheckTargets(op, logits, targets);
  const int a = AxisOf(op, axis);
  CheckVocabSharded(op, logits, targets, a);
  const int last = logits.rank() - 1;
  const int n = RankContext::Get(op).mesh().axis_size(a);
  const int64_t vocab = logits.dim(-1) * n;  // even shards (the specs divide the classes)
  std::optional<std::vector<int64_t>> ids = HostIds(targets.tensor);
  bool any_ignored = !ids.has_value() && !targets.tensor.is_meta();  // unread: mask anyway
  if (ids) {
    CheckIds(op, *ids, vocab, ignore_index,
             absl::StrCat(" (", logits.dim(-1), " classes of logits ", logits.ToString(),
                          " on each of the ", n, " devices of '", axis, "')"),
             &any_ignored);
  }
  Value m;
  {
    NoGradScope constant;  // the shift cancels in the loss: no gradient, no backward collective
    m = all_reduce(local_max(logits, {last}, true), axis, To::kR, ReduceKind::kMax);
  }
  Value z = logits - Value(m.tensor, m.type);
  Value sum_exp = all_reduce(sum_partial(exp(z), {last}, true), axis);
  Value picked = all_reduce(take_along_last(z, targets), axis);
  Value loss = log(sum_exp).reshape(targets.shape()) - picked;
  if (!any_ignored) return loss;
  // Ignored rows picked 0 (no shard holds their id): zero their loss and gradient.
  Tensor mask = InRangeMask(targets.tensor, vocab, loss.dtype()).Reshape(targets.shape());
  return loss * Value(mask, loss.type);
}

}  // namespace shardmap
