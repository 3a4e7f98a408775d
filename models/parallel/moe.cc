#include "models/parallel/moe.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "shardmap/collective_ops.h"
#include "shardmap/context.h"
#include "shardmap/einsum.h"
#include "shardmap/nn_ops.h"
#include "shardmap/ops.h"
#include "shardmap/routing_ops.h"
#include "shardmap/type_rules.h"
#include "tensor/error.h"
#include "tensor/ops/shape_ops.h"

namespace shardmap {

absl::Status ValidateMoeConfig(const MoeConfig& c, int64_t expert_ways) {
  auto bad = [](auto... a) { return absl::InvalidArgumentError(absl::StrCat(a...)); };
  if (c.experts < 0) return bad("MoE: experts = ", c.experts, "; expected >= 0 (0: dense MLP)");
  if (c.experts == 0) return absl::OkStatus();
  if (c.topk < 1 || c.topk > c.experts) {
    return bad("MoE: topk = ", c.topk, " with ", c.experts,
               " experts; each token picks 1 <= topk <= experts experts");
  }
  if (!(c.capacity_factor > 0) || !std::isfinite(c.capacity_factor)) {
    return bad("MoE: capacity factor ", c.capacity_factor,
               " must be a finite number > 0 (capacity = ceil(factor * tokens * k / experts))");
  }
  if (!(c.aux_loss_coef >= 0) || !std::isfinite(c.aux_loss_coef)) {
    return bad("MoE: aux loss coefficient ", c.aux_loss_coef, " must be finite and >= 0");
  }
  if (expert_ways < 1 || c.experts % expert_ways != 0) {
    return bad("MoE: ", c.experts, " experts are not divisible by the ", expert_ways,
               " expert-parallel ways (expert axes ", absl::StrJoin(c.expert_axes, "x"),
               "); pick experts a multiple of ", expert_ways, " or fewer expert ways");
  }
  return absl::OkStatus();
}

int64_t MoeCapacity(double capacity_factor, int64_t group_tokens, int64_t k, int64_t experts) {
  const double c = std::ceil(capacity_factor * static_cast<double>(group_tokens * k) /
                             static_cast<double>(experts));
  return std::max<int64_t>(1, static_cast<int64_t>(c));
}

RoutingPlan PlanRouting(const std::vector<int64_t>& experts, int64_t tokens, int64_t k,
                        int64_t num_experts, int64_t group_tokens, int64_t capacity) {
  if (group_tokens < 1 || tokens % group_tokens != 0) {
    OpFail("moe: this device's ", tokens, " tokens are not whole routing groups of ",
           group_tokens, " tokens");
  }
  RoutingPlan p;
  p.groups = tokens / group_tokens;
  p.capacity = capacity;
  const int64_t slots = num_experts * p.groups * capacity;
  p.slot_token.assign(slots, -1);
  p.slot_pair.assign(slots, -1);
  p.counts.assign(p.groups * num_experts, 0);
  std::vector<int64_t> used(p.groups * num_experts, 0);
  std::vector<int64_t> lost(tokens, 0);  // dropped assignments per token
  for (int64_t g = 0; g < p.groups; ++g) {
    for (int64_t j = 0; j < k; ++j) {  // all first choices, then all second choices, ...
      for (int64_t t = g * group_tokens; t < (g + 1) * group_tokens; ++t) {
        const int64_t e = experts[t * k + j];
        ++p.counts[g * num_experts + e];
        int64_t& n = used[g * num_experts + e];
        if (n >= capacity) {
          ++p.dropped;
          if (++lost[t] == k) ++p.dropped_tokens;
          continue;
        }
        const int64_t slot = (e * p.groups + g) * capacity + n++;
        p.slot_token[slot] = t;
        p.slot_pair[slot] = t * k + j;
      }
    }
  }
  return p;
}

MoeOutput MoeMlp::operator()(const Value& x) const {
  const int64_t n = x.dim(0), d = x.dim(1), e = cfg.experts, k = cfg.topk;
  if (router.dim(1) != e) {
    OpFail("moe: router ", router.ToString(), " has ", router.dim(1), " experts; config says ", e);
  }
  const Mesh& mesh = RankContext::Get("moe").mesh();
  int64_t ways = 1;
  for (const std::string& a : cfg.expert_axes) {
    const int i = mesh.AxisIndex(a);
    if (i < 0) OpFail("moe: expert axis '", a, "' is not an axis of mesh ", mesh.ShortString());
    ways *= mesh.axis_size(i);
  }
  if (absl::Status s = ValidateMoeConfig(cfg, ways); !s.ok()) throw OpError(s);
  if (fc_weight.dim(0) * ways != e) {
    OpFail("moe: fc_weight ", fc_weight.ToString(), " holds ", fc_weight.dim(0),
           " experts on this device; ", e, " experts over ", ways,
           " expert ways need ", e / ways, " (shard the expert dim over the expert axes)");
  }
  Value probs = softmax(x.matmul(router), -1);  // [N, E]
  TopKValues pick = top_k(probs, k);
  // The plan (capacity slots in token order, drop counts) is host bookkeeping: the picks come to
  // the host (one sync per layer on a GPU) and the slot tables go back to x's device.
  const Device device = x.tensor.device();
  const RoutingPlan plan =
      PlanRouting(pick.indices.tensor.ToVector<int64_t>(), n, k, e, group_tokens,
                  MoeCapacity(cfg.capacity_factor, group_tokens, k, e));
  // Integer rows are per-device data: V wherever x varies, x's kind elsewhere.
  const SpmdType row_type = ErasedUnary(x.type);
  const int64_t slots = static_cast<int64_t>(plan.slot_token.size());
  Value slot_token(Tensor::FromVector<int64_t>({slots}, plan.slot_token).To(device), row_type);
  Value slot_pair(Tensor::FromVector<int64_t>({slots}, plan.slot_pair).To(device), row_type);
  const int64_t gc = plan.groups * plan.capacity;

  Value buf = gather_rows(x, slot_token).reshape({e, gc, d});
  NoteType(types, "moe: dispatch buffer [E, G*C, d]", buf);
  const bool ep = !cfg.expert_axes.empty();
  const Axes axes(cfg.expert_axes);
  if (ep) buf = all_to_all(buf, /*split_dim=*/0, /*concat_dim=*/1, axes);
  NoteType(types, "moe: at the experts [E/ep, ep*G*C, d]", buf);
  // The hidden activations as [E, 4d, G*C], so c_fc's bias [E, 4d] (4d split over tp) becomes
  // [E, 4d, 1] by a size-1 dim *after* its sharded dim (reshape keeps S on the major dim of a
  // block, so [E, 1, 4d] would move the tp shard onto the size-1 dim).
  Value h = gelu(einsum("emd,edh->ehm", buf, fc_weight) +
                     fc_bias.reshape({fc_bias.dim(0), fc_bias.dim(1), 1}),
                 GeluApprox::kTanh);
  Value bias = proj_bias.reshape({proj_bias.dim(0), 1, d});
  if (tp.on()) bias = convert(bias, tp.axis, Convert::kRToP);  // added once to the tp sum
  Value out = einsum("ehm,ehd->emd", h, proj_weight) + bias;
  NoteType(types, "moe: expert outputs", out);
  if (ep) out = all_to_all(out, /*split_dim=*/1, /*concat_dim=*/0, axes);
  Value gate = gather_rows(pick.values.reshape({n * k, 1}), slot_pair).reshape({e, gc, 1});
  Value y = scatter_add_rows(out * gate, slot_token, n);
  if (tp.on()) y = LeaveTensorParallel(y, tp);
  NoteType(types, "moe: y (combined)", y);

  // Switch load balancing: sum_t sum_e probs[t,e] * E * f_{g(t),e} / (group_tokens * groups).
  std::vector<double> w(n * e);
  const double scale = static_cast<double>(e) /
                       (static_cast<double>(group_tokens) * static_cast<double>(total_groups) *
                        static_cast<double>(group_tokens * k));
  for (int64_t t = 0; t < n; ++t) {
    const int64_t g = t / group_tokens;
    for (int64_t j = 0; j < e; ++j) w[t * e + j] = scale * plan.counts[g * e + j];
  }
  Tensor wt = Tensor::FromVector<double>({n, e}, w);
  if (probs.dtype() != DType::kF64) wt = Cast(wt, probs.dtype());
  wt = wt.To(device);
  MoeOutput o;
  o.aux = sum_partial(probs * Value(wt, ErasedUnary(probs.type)), {});
  o.y = std::move(y);
  o.dropped = plan.dropped;
  o.dropped_tokens = plan.dropped_tokens;
  o.assignments = n * k;
  return o;
}

}  // namespace shardmap
