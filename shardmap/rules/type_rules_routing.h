// The routing ops' type rule (gather_rows, scatter_add_rows: MoE dispatch and combine).
//
//   std::optional<Rejection> no;
//   SpmdType t = RowOpRule({ep:R} x, {ep:V} rows, no);   // {ep:V}: each device's own rows
//   RowOpRule({tp:P} x, {tp:V} rows, no);                // no->rule "x is a partial sum (P) but
//                                                        //   the row indices vary: ..."
#ifndef SHARDMAP_SHARDMAP_RULES_TYPE_RULES_ROUTING_H_
#define SHARDMAP_SHARDMAP_RULES_TYPE_RULES_ROUTING_H_

#include <optional>

#include "shardmap/rules/type_rules_base.h"
#include "shardmap/spmd_type.h"

namespace shardmap {

// Per axis: P indices are rejected (indices are per-device integers); a P x keeps P with R or I
// indices and is rejected with varying ones (each device would pick different rows of its
// addend); I mixes only with I (or I x with R indices), giving I; any V gives V (of unknown
// layout: the routed rows); else R.
SpmdType RowOpRule(const SpmdType& x, const SpmdType& rows, std::optional<Rejection>& no);

}  // namespace shardmap

#endif  // SHARDMAP_SHARDMAP_RULES_TYPE_RULES_ROUTING_H_
