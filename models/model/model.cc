#include "models/model/model.h"

#include <memory>
#include <string_view>
#include <utility>

#include <cmath>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "shardmap/attention_ops.h"
#include "tensor/error.h"
#include "models/model/recompute_block.h"
#include "shardmap/collective_ops.h"
#include "shardmap/ops.h"
#include "shardmap/sharding.h"
#include "tensor/error.h"
#include "tensor/ops/shape_ops.h"

namespace shardmap {
namespace {

absl::Status Invalid(const std::string& msg) { return absl::InvalidArgumentError(msg); }

}  // namespace

absl::Status Model::KvCacheSupport() const {
  return absl::UnimplementedError(absl::StrCat(
      "model ", name(), " implements no DecodeEmbed/DecodeBlock/DecodeLogits (models/model/"
      "model.h), so generation recomputes the whole window for every token"));
}

Value Model::DecodeEmbed(const ParamFn&, const Value&, int64_t) const {
  OpFail("model ", name(), " has no KV-cache decoding (DecodeEmbed); check KvCacheSupport()");
}

Value Model::DecodeBlock(const ParamFn&, int64_t, const Value&, KvCache&) const {
  OpFail("model ", name(), " has no KV-cache decoding (DecodeBlock); check KvCacheSupport()");
}

Value Model::DecodeLogits(const ParamFn&, const Value&) const {
  OpFail("model ", name(), " has no KV-cache decoding (DecodeLogits); check KvCacheSupport()");
}

Value DecodeStep(const Model& model, const ParamFn& use, const Value& ids, KvCache& cache) {
  const int64_t n = ids.dim(0);
  Value x = model.DecodeEmbed(use, ids, cache.length());
  for (int64_t i = 0; i < model.shape().layers; ++i) x = model.DecodeBlock(use, i, x, cache);
  cache.Advance(n);
  // Only the last position's logits are needed (the prompt's others would be vocab-wide work).
  return model.DecodeLogits(use, n == 1 ? x : slice(x, 0, n - 1, 1));
}

// A reshape keeps the size-1 dims before a shard in its block, so one row ([1, X] S1 ->
// [1, h, hd]) keeps the shard on the heads (shardmap/rules/type_rules_layout.h).
Value DecodeSplitHeads(const Value& x, int64_t head_dim) {
  return x.reshape({x.dim(0), x.dim(1) / head_dim, head_dim});
}

// One row at one head per device is [1, 1, hd] (S1), which the local shapes cannot tell from a
// dropped size-1 dim before a size-1 shard (that reshape gives S0), so with one row the heads
// dim is moved first, where no size-1 dim precedes it.
Value DecodeMergeHeads(const Value& x) {
  const int64_t n = x.dim(0), width = x.dim(1) * x.dim(2);
  if (n > 1) return x.reshape({n, width});
  return permute(x, {1, 2, 0}).reshape({width, 1}).T();  // [h, hd, 1] S0 -> [1, h * hd] S1
}

namespace {

// [t, h, hd] (h S1 on tp) -> [1, t, h, hd] (h S2), for any t. At t = 1 a plain reshape
// [1, h, hd] -> [1, 1, h, hd] would keep one size-1 dim before the shard, the t dim (the local
// shapes cannot tell the new leading dim from the old one), so the heads dim goes first there.
Value WithBatchDim(const Value& x) {
  const int64_t t = x.dim(0), h = x.dim(1), hd = x.dim(2);
  if (t > 1) return x.reshape({1, t, h, hd});
  return permute(permute(x, {1, 0, 2}).reshape({h, 1, t, hd}), {1, 2, 0, 3});
}

}  // namespace

Value CachedAttention(const Value& q, const Value& k, const Value& v) {
  const int64_t n = q.dim(0), heads = q.dim(1), hd = q.dim(2), len = k.dim(0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  Value o = causal_attention(WithBatchDim(q), WithBatchDim(k), WithBatchDim(v), scale,
                             /*q_offset=*/len - n);  // [1, n, heads, hd]
  return DecodeMergeHeads(o.reshape({n, heads, hd}));
}

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

Shape StoredShape(const ParamInfo& p) {
  Shape s = p.global_shape;
  if (p.fsdp_dim >= 0) s[p.fsdp_dim] += p.fsdp_pad;
  return s;
}

void ChooseFsdpDim(const std::vector<bool>& free, int shard, ParamInfo* p) {
  p->fsdp_dim = -1;
  p->fsdp_pad = 0;
  const Shape& s = p->global_shape;
  const int64_t numel = NumElements(s);
  int64_t least = -1;  // padded elements of the best dim so far
  for (int d = 0; d < static_cast<int>(s.size()); ++d) {
    if (!free[d]) continue;
    const int64_t pad = (s[d] + shard - 1) / shard * shard - s[d];
    // Padding dim d adds pad slices of numel / s[d] elements (a size-0 dim: none).
    const int64_t extra = s[d] == 0 ? 0 : pad * (numel / s[d]);
    if (least >= 0 && extra >= least) continue;
    least = extra;
    p->fsdp_dim = d;
    p->fsdp_pad = pad;
    if (pad == 0) return;  // the first dim shard divides, as without padding
  }
}

namespace {

// Only fsdp_dim is checked: the tensor may be split on others (tp's shard of a gathered
// parameter, or of its gradient).
void CheckFsdpDim(const char* what, const Tensor& t, const ParamInfo& p, int64_t want) {
  if (t.rank() != static_cast<int>(p.global_shape.size()) || t.shape()[p.fsdp_dim] != want) {
    OpFail(what, ": '", p.name, "' is ", t.ShapeString(), " but its dim ", p.fsdp_dim,
           " must be ", want, " (global ", ShapeToString(p.global_shape), ", padded ",
           ShapeToString(StoredShape(p)), ")");
  }
}

}  // namespace

Tensor PadForFsdp(const Tensor& global, const ParamInfo& p) {
  if (p.fsdp_pad == 0) return global;
  const int64_t rows = p.global_shape[p.fsdp_dim];
  CheckFsdpDim("PadForFsdp", global, p, rows);
  Shape padded = global.shape();
  padded[p.fsdp_dim] += p.fsdp_pad;
  Tensor out = Tensor::Zeros(padded, global.dtype(), global.device());
  if (!global.is_meta() && rows > 0) SliceAssign(out, p.fsdp_dim, 0, global);
  return out;
}

Tensor TrimFsdpPad(const Tensor& stored, const ParamInfo& p) {
  if (p.fsdp_pad == 0) return stored;
  CheckFsdpDim("TrimFsdpPad", stored, p, p.global_shape[p.fsdp_dim] + p.fsdp_pad);
  return Slice(stored, p.fsdp_dim, 0, p.global_shape[p.fsdp_dim]);
}

Value TrimFsdpPad(const Value& gathered, const ParamInfo& p) {
  if (p.fsdp_pad == 0) return gathered;
  return slice(gathered, p.fsdp_dim, 0, p.global_shape[p.fsdp_dim]);
}

Tensor ParamShard(const Tensor& global, const ParamInfo& p, const Mesh& mesh, int rank) {
  return ShardOf(PadForFsdp(global, p), mesh, p.spec, rank);
}

ParamFn ParamUse(const Model& model, const std::vector<Value>& params) {
  // A parameter at use: FSDP shards are all_gathered (the transpose reduce-scatters the grad).
  // It holds its own copy of the parameters (a recomputed block calls it in the backward).
  auto held = std::make_shared<const std::vector<Value>>(params);
  return [&model, held](const std::string& name) {
    int i = model.Find(name);
    const ParamInfo& info = model.params()[i];
    const std::vector<Value>& params = *held;
    // Padded FSDP parameters are trimmed after the gather (StoredShape -> global_shape).
    Value p = info.fsdp_dim >= 0
                  ? TrimFsdpPad(all_gather(params[i], info.fsdp_dim, model.fsdp_axis()), info)
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
  // By name, the last of equal names winning (as a scan of `init` per parameter would): one
  // pass, not parameters x init string compares (the planner matches ~600 names per profile).
  absl::flat_hash_map<std::string_view, const NamedTensor*> by_name;
  by_name.reserve(init.size());
  for (const NamedTensor& t : init) by_name[t.name] = &t;
  std::vector<Tensor> globals;
  globals.reserve(model.params().size());
  for (const ParamInfo& p : model.params()) {
    const auto it = by_name.find(p.name);
    const NamedTensor* found = it == by_name.end() ? nullptr : it->second;
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
