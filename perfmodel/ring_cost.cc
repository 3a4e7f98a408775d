#include "perfmodel/ring_cost.h"

namespace shardmap::perfmodel {

const char* CollectiveName(CollectiveKind k) {
  switch (k) {
    case CollectiveKind::kAllReduce: return "all_reduce";
    case CollectiveKind::kAllGather: return "all_gather";
    case CollectiveKind::kReduceScatter: return "reduce_scatter";
  }
  return "?";
}

CollectiveCost RingCost(const RingLink& link) {
  return [link](CollectiveKind kind, int t, double bytes) {
    if (t <= 1) return 0.0;
    const double steps = kind == CollectiveKind::kAllReduce ? 2.0 : 1.0;
    return link.alpha_s + steps * (t - 1) / t * bytes / link.busbw;
  };
}

}  // namespace shardmap::perfmodel
