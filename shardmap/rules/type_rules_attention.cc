#include "shardmap/rules/type_rules_attention.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace shardmap {

std::optional<Rejection> AttentionShardedAlikeRule(const SpmdType& q, const SpmdType& k,
                                                   const SpmdType& v) {
  for (int a = 0; a < q.num_axes(); ++a) {
    for (const auto& [name, x] : {std::pair{"k", &k}, std::pair{"v", &v}}) {
      const AxisType qa = q[a], xa = (*x)[a];
      if ((qa.is_sharded() || xa.is_sharded()) && qa != xa) {
        return Rejection{
            a,
            absl::StrCat("q is ", qa.ToString(), " but ", name, " is ", xa.ToString(),
                         ": attention pairs each device's queries with its own keys and values"),
            "shard q, k and v alike (batch S0 and/or heads S2 on the same axes)"};
      }
    }
  }
  return std::nullopt;
}

}  // namespace shardmap
