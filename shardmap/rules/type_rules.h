// The SPMD type rules of the collectives and casts, as data: per op the kinds it accepts on each
// mesh axis it runs over, the kind it makes of them, and the fix text for each kind it rejects
// (as JAX keeps one rule per primitive). Pure functions on SpmdType: no context, no tensors, so
// the rules are tested directly and the ops apply them in one place.
//
// Before (in each collective): a ForAxes loop with its own TypeFail texts.
// After:
//   const CollectiveRule& r = CollectiveRuleFor(Collective::kAllReduceSum);
//   std::optional<Rejection> no = CheckCollective(r, x.type, mask, /*dim=*/-1);
//   // no->axis = first rejected axis; no->rule = "takes a partial sum (P), but x is V";
//   // no->fix = "if each device's value is one addend of the sum you want ..."
//   SpmdType y = CollectiveResult(r, x.type, mask, /*dim=*/-1, /*invariant=*/false);  // P -> R
//
// The typed ops' rules are pure functions here too (ElementwiseRule, NonlinearRule, MatmulRule):
// each returns the result type or sets a Rejection, and the op throws it with its operands:
//   std::optional<Rejection> no;
//   SpmdType t = MatmulRule(a.type, 2, b.type, 2, false, false, mesh.axis_names(), no);
//   // {tp:S1} @ {tp:S0} -> {tp:P} (row-parallel); {dp:S1} @ {tp:S0} -> no->rule "contracts a's
//   // dim sharded over 'dp' with b's dim sharded over 'tp': ..."
// Also the kind-only rules of erased (unchecked) mode, ErasedJoin and ErasedUnary.
//
// One header for all the rules; each family lives in its own file:
//   type_rules_collective.h   the collectives table (with its transposes), CotangentType
//   type_rules_elementwise.h  binary (linear, multilinear), nonlinear, erased mode
//   type_rules_contraction.h  matmul and einsum: one ContractionRule
//   type_rules_reduce.h       sum / mean / sum_partial, max / local_max
//   type_rules_nn.h           normalisations, embedding, take_along_last, cross_entropy
//   type_rules_layout.h       reshape, permute, slice / concat, broadcast_to
//   type_rules_routing.h      gather_rows / scatter_add_rows (MoE routing)
//   type_rules_attention.h    causal_attention's q/k/v sharded alike
//   type_rules_base.h         Rejection, KindName
#ifndef SHARDMAP_SHARDMAP_RULES_TYPE_RULES_H_
#define SHARDMAP_SHARDMAP_RULES_TYPE_RULES_H_

#include "shardmap/rules/type_rules_attention.h"
#include "shardmap/rules/type_rules_base.h"
#include "shardmap/rules/type_rules_collective.h"
#include "shardmap/rules/type_rules_contraction.h"
#include "shardmap/rules/type_rules_elementwise.h"
#include "shardmap/rules/type_rules_layout.h"
#include "shardmap/rules/type_rules_nn.h"
#include "shardmap/rules/type_rules_reduce.h"
#include "shardmap/rules/type_rules_routing.h"

#endif  // SHARDMAP_SHARDMAP_RULES_TYPE_RULES_H_
