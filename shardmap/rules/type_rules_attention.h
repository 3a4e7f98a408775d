// The fused attention op's own type rule (causal_attention; its other checks are the
// nonlinear rule and unsharded sequence and head_dim, from the elementwise and nn families).
//
//   std::optional<Rejection> no = AttentionShardedAlikeRule({tp:S2} q, {tp:S2} k, {tp:R} v);
//   // no->rule "q is S2 but v is R: attention pairs each device's queries with its own keys
//   // and values"
#ifndef SHARDMAP_SHARDMAP_RULES_TYPE_RULES_ATTENTION_H_
#define SHARDMAP_SHARDMAP_RULES_TYPE_RULES_ATTENTION_H_

#include <optional>

#include "shardmap/rules/type_rules_base.h"
#include "shardmap/spmd_type.h"

namespace shardmap {

// q, k and v must shard their dims alike on every axis that shards any of them.
std::optional<Rejection> AttentionShardedAlikeRule(const SpmdType& q, const SpmdType& k,
                                                   const SpmdType& v);

}  // namespace shardmap

#endif  // SHARDMAP_SHARDMAP_RULES_TYPE_RULES_ATTENTION_H_
