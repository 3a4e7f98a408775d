// The alpha-beta cost of a ring collective: over t ranks on links of bus bandwidth B (nccl-tests
// "busbw") and per-collective latency alpha,
//   all_reduce                  = alpha + 2 (t-1)/t * S / B
//   all_gather / reduce_scatter = alpha +   (t-1)/t * S / B
// S the full tensor's bytes (the all_reduce buffer, the gathered output, the unreduced input);
// 0 at t = 1. Used by the planner (models/planner/cost_model.h) and bench's TP model.
//
//   CollectiveCost cost = RingCost({/*alpha_s=*/8e-6, /*busbw=*/370e9});
//   double s = cost(CollectiveKind::kAllReduce, /*t=*/8, /*full_bytes=*/64e6);
//   CollectiveName(CollectiveKind::kAllGather);   // "all_gather"
#ifndef SHARDMAP_PERFMODEL_RING_COST_H_
#define SHARDMAP_PERFMODEL_RING_COST_H_

#include <functional>

namespace shardmap::perfmodel {

enum class CollectiveKind { kAllReduce, kAllGather, kReduceScatter };
const char* CollectiveName(CollectiveKind k);  // "all_reduce", "all_gather", "reduce_scatter"

// seconds = cost(kind, t, full_bytes)
using CollectiveCost = std::function<double(CollectiveKind, int, double)>;

struct RingLink {
  double alpha_s = 0;  // per-collective latency
  double busbw = 0;    // bytes/s, nccl-tests "busbw"
};
// Ring alpha-beta (see the top of this file); 0 at t <= 1.
CollectiveCost RingCost(const RingLink& link);

}  // namespace shardmap::perfmodel

#endif  // SHARDMAP_PERFMODEL_RING_COST_H_
