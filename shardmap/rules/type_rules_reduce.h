// The reductions' type rules: sum / mean / sum_partial (ReduceRule) and max / local_max
// (MaxRule). Dims are normalised and sorted; shapes are local.
//
//   ReduceRule("sum", {dp:S0}, 2, {0}, false, /*partial=*/true, true, names, no)   // {dp:P}
//   ReduceRule("sum", {dp:S0}, 2, {0}, false, /*partial=*/false, true, names, no)  // rejected
#ifndef SHARDMAP_SHARDMAP_RULES_TYPE_RULES_REDUCE_H_
#define SHARDMAP_SHARDMAP_RULES_TYPE_RULES_REDUCE_H_

#include <optional>
#include <string>

#include "absl/types/span.h"
#include "shardmap/spmd_type.h"
#include "shardmap/rules/type_rules_base.h"

namespace shardmap {

// sum / mean / sum_partial over dims nd of a rank-`rank` x. partial: a sharded reduced dim gives
// P (sum_partial), and summing every dim of a V of unknown layout gives its share (P); otherwise
// a sharded reduced dim is rejected. linear=false: P is rejected as by NonlinearRule.
SpmdType ReduceRule(const char* op, const SpmdType& x, int rank, absl::Span<const int> nd,
                    bool keepdim, bool partial, bool linear,
                    absl::Span<const std::string> axis_names, std::optional<Rejection>& no);

// max / local_max over dims nd: nonlinear (P rejected); a sharded reduced dim is rejected for
// max (one shard's max is not the max) and gives V for local_max.
SpmdType MaxRule(const char* op, const SpmdType& x, absl::Span<const int> nd, bool keepdim,
                 bool local, absl::Span<const std::string> axis_names,
                 std::optional<Rejection>& no);

}  // namespace shardmap

#endif  // SHARDMAP_SHARDMAP_RULES_TYPE_RULES_REDUCE_H_
