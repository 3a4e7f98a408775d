#include "models/model/model.h"

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "models/model/recompute_block.h"
#include "shardmap/collective_ops.h"
#include "shardmap/ops.h"

namespace shardmap {
namespace {

absl::Status Invalid(const std::string& msg) { return absl::InvalidArgumentError(msg); }

}  // namespace

int Model::Find(const std::string& name) const {
  const std::vector<ParamInfo>& p = params();
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

PartitionSpec Model::RowSpec(bool with_sp) const {
  std::vector<std::string> axes = batch_axes();
  if (!cp_axis().empty()) axes.push_back(cp_axis());
  const TensorParallel t = tp();
  if (with_sp && t.on() && t.sp) axes.push_back(t.axis);
  return PartitionSpec({axes});
}

ParamFn ParamUse(const Model& model, const std::vector<Value>& params) {
  // A parameter at use: FSDP shards are all_gathered (the transpose reduce-scatters the grad).
  // It holds its own copy of the parameters (a recomputed block calls it in the backward).
  auto held = std::make_shared<const std::vector<Value>>(params);
  return [&model, held](const std::string& name) {
    int i = model.Find(name);
    const ParamInfo& info = model.params()[i];
    const std::vector<Value>& params = *held;
    Value p = info.fsdp_dim >= 0 ? all_gather(params[i], info.fsdp_dim, model.fsdp_axis())
                                 : params[i];
    // Mixed precision: cast to the compute dtype at use (the cast's VJP returns the gradient in
    // the master dtype).
    const DType compute = model.shape().compute_dtype();
    return p.dtype() == compute ? p : cast(p, compute);
  };
}

ParamFn GatherTiedOnce(const Model& model, const ParamFn& gathered) {
  std::vector<std::pair<std::string, Value>> tied;
  for (const ParamInfo& p : model.params()) {
    if (p.tied_to_head) tied.emplace_back(p.name, gathered(p.name));
  }
  if (tied.empty()) return gathered;
  return [tied, gathered](const std::string& name) {  // by value: a recomputed block keeps it
    for (const auto& [n, v] : tied) {
      if (n == name) return v;
    }
    return gathered(name);
  };
}

Value ModelLoss(const Model& model, const ParamFn& gathered, const Value& ids,
                const Value& targets, int64_t global_tokens, TypeTrace* block0_types,
                MoeStats* moe_stats) {
  const ParamFn use = GatherTiedOnce(model, gathered);
  Value x = model.Embed(use, ids);
  const ModelShape& s = model.shape();
  MoeAccum moe{global_tokens / s.seq, Value(), MoeStats()};
  for (int64_t i = 0; i < s.layers; ++i) {
    x = ModelBlock(model, use, i, x, i == 0 ? block0_types : nullptr, &moe);
  }
  if (moe_stats != nullptr) {
    moe_stats->dropped += moe.stats.dropped;
    moe_stats->dropped_tokens += moe.stats.dropped_tokens;
    moe_stats->assignments += moe.stats.assignments;
  }
  Value loss = model.Head(use, x, targets, global_tokens);
  if (!moe.aux.defined()) return loss;
  const Value aux = moe.aux.dtype() == loss.dtype() ? moe.aux : cast(moe.aux, loss.dtype());
  return loss + aux * s.moe.aux_loss_coef;
}

absl::Status CheckTokens(const ModelShape& s, const std::vector<int64_t>& tokens) {
  if (static_cast<int64_t>(tokens.size()) < s.seq + 1) {
    return Invalid(absl::StrCat("the data has ", tokens.size(), " tokens; a sample needs seq+1 = ",
                                s.seq + 1));
  }
  for (int64_t t : tokens) {
    if (t < 0 || t >= s.vocab) {
      return Invalid(absl::StrCat("token id ", t, " is outside the vocabulary [0, ", s.vocab,
                                  "); raise --vocab"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Tensor>> MatchInitialParams(const Model& model,
                                                       const std::vector<NamedTensor>& init) {
  const DType dtype = model.shape().dtype;
  std::vector<Tensor> globals;
  for (const ParamInfo& p : model.params()) {
    const NamedTensor* found = nullptr;
    for (const NamedTensor& t : init) {
      if (t.name == p.name) found = &t;
    }
    if (found == nullptr) return Invalid(absl::StrCat("initial parameters lack '", p.name, "'"));
    if (found->tensor.shape() != p.global_shape || found->tensor.dtype() != dtype) {
      return Invalid(absl::StrCat("initial parameter '", p.name, "' is ",
                                  found->tensor.ShapeString(), " but the model needs ",
                                  DTypeName(dtype), ShapeToString(p.global_shape)));
    }
    globals.push_back(found->tensor);
  }
  return globals;
}

}  // namespace shardmap
