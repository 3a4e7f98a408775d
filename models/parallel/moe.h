// A mixture-of-experts MLP (Switch Transformer / GShard) as per-device code, with the experts
// split over an expert-parallel axis (or several mesh axes folded into one expert group).
//
//   MoeConfig cfg{.experts = 4, .topk = 2, .capacity_factor = 1.25, .aux_loss_coef = 0.01,
//                 .expert_axes = {"ep"}};
//   MoeMlp moe{router, fc_w, fc_b, proj_w, proj_b, cfg, /*group_tokens=*/seq,
//              /*total_groups=*/batch};
//   MoeOutput o = moe(x);        // x [tokens, d] S0 over the token axes (ep among them)
//   // o.y [tokens, d] like x; o.aux: the load-balancing loss (P over the token axes);
//   // o.dropped: this device's (token, expert) assignments over capacity.
//
// Per device, for x [N, d] holding N / group_tokens routing groups:
//   probs = softmax(x @ router)                      [N, E]
//   (gates, experts) = top_k(probs, k)               [N, k]
//   capacity C = ceil(capacity_factor * group_tokens * k / E) slots per expert and group; the
//   first choices of all tokens of a group are placed first (in token order), then the second
//   choices, ...; an assignment finding its expert's C slots full is dropped (the token keeps
//   its other assignments; with none it contributes 0 and the residual carries it).
//   buf  = gather_rows(x, slot_token)                [E, G*C, d]   (empty slots are 0)
//   buf  = all_to_all(buf, 0, 1, expert_axes)        [E/ep, ep*G*C, d]: each device now holds
//                                                    its experts' slots from every device
//   out  = c_proj(gelu(c_fc(buf)))                   batched over the local experts
//   out  = all_to_all(out, 1, 0, expert_axes)        [E, G*C, d] back at the tokens' devices
//   y    = scatter_add_rows(out * gate_of_slot, slot_token, N)
// The backward all_to_alls are the autograd's transposes of the forward ones.
//
// Load-balancing loss (Switch Transformer eq. 4, per group, averaged over all groups):
//   aux = mean over groups g of  E * sum_e f_ge * p_ge,
//   f_ge = (assignments of group g to e, before capacity) / (group_tokens * k)   (no gradient)
//   p_ge = mean over g's tokens of probs[:, e].
// Each device returns its groups' share (sum / total_groups), P over the token axes like the
// mean cross-entropy, so the losses add.
//
// Tensor parallelism (tp.on(); x R on tp, all_gathered by the caller under SP): the experts' hidden dim is split over tp
// (c_fc column-parallel, c_proj row-parallel), the combined output is a pending sum over tp
// until LeaveTensorParallel (all_reduce, or reduce_scatter under SP). Without expert axes (or on
// one device) every expert is local and the all_to_alls are absent: the unsharded reference.
#ifndef SHARDMAP_MODELS_PARALLEL_MOE_H_
#define SHARDMAP_MODELS_PARALLEL_MOE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "models/parallel/layers.h"
#include "shardmap/value.h"

namespace shardmap {

struct MoeConfig {
  int64_t experts = 0;  // 0: no MoE (the dense MLP)
  int64_t topk = 1;
  double capacity_factor = 1.25;
  double aux_loss_coef = 0.01;
  // Mesh axes the experts are split over (one expert group, row-major in mesh order); tokens must
  // be split over them too. Empty: every device holds every expert.
  std::vector<std::string> expert_axes;
  bool on() const { return experts > 0; }
};

// The config's own checks (experts >= 0; with experts: 1 <= topk <= experts, capacity_factor
// > 0, aux_loss_coef >= 0), and experts divisible by `expert_ways` (the product of the expert
// axes' sizes). Errors name the quantity and the fix.
absl::Status ValidateMoeConfig(const MoeConfig& cfg, int64_t expert_ways);

// ceil(capacity_factor * group_tokens * k / experts), at least 1.
int64_t MoeCapacity(double capacity_factor, int64_t group_tokens, int64_t k, int64_t experts);

// Where each (token, choice) goes. Slots are laid out [E, G, C] (expert-major, so the dim split
// over the expert axes is the expert dim).
struct RoutingPlan {
  int64_t groups = 0, capacity = 0;
  std::vector<int64_t> slot_token;  // [E*G*C]: the token row in the slot, -1 when empty
  std::vector<int64_t> slot_pair;   // [E*G*C]: token * k + choice, -1 when empty
  std::vector<int64_t> counts;      // [G*E]: assignments per group and expert before capacity
  int64_t dropped = 0;              // assignments over capacity
  int64_t dropped_tokens = 0;       // tokens all of whose k assignments were dropped
};
// experts: [N*k] row-major (token, choice) expert ids; N must be a multiple of group_tokens.
RoutingPlan PlanRouting(const std::vector<int64_t>& experts, int64_t tokens, int64_t k,
                        int64_t num_experts, int64_t group_tokens, int64_t capacity);

struct MoeOutput {
  Value y;    // [N, d]
  Value aux;  // scalar load-balancing loss share (without aux_loss_coef)
  int64_t dropped = 0;         // this device's assignments over capacity
  int64_t dropped_tokens = 0;  // this device's tokens with every assignment dropped (y row 0)
  int64_t assignments = 0;     // this device's assignments (N * k)
};

struct MoeMlp {
  Value router;                   // [d, E], replicated
  Value fc_weight, fc_bias;       // [E, d, h], [E, h]: E split over the expert axes, h over tp
  Value proj_weight, proj_bias;   // [E, h, d], [E, d]
  MoeConfig cfg;
  int64_t group_tokens = 0;       // tokens per routing group (rows hold whole groups)
  int64_t total_groups = 0;       // groups over all devices (normalises aux)
  TensorParallel tp;              // optional: the experts' hidden dim over tp; x must be R on tp
                                  // (under SP the caller all_gathers it; y is then reduce-scattered)
  TypeTrace* types = nullptr;
  MoeOutput operator()(const Value& x) const;
};

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_PARALLEL_MOE_H_
