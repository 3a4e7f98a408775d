// Alpha-beta fits of measured collective times: seconds = alpha + bytes * seconds_per_byte, a
// least-squares line through (bytes, seconds) samples, and a collective cost that reads such
// fits per (kind, ranks). The planner fits collectives_bench and its own CPU measurements with
// FitAlphaBeta; bench's TP model prices the simulated devices' collectives with FittedCost.
//
//   AlphaBeta ab = FitAlphaBeta({1e3, 1e4, 1e5}, {5e-6, 3.2e-5, 3.02e-4});
//   CollectiveCost cost = FittedCost({{{CollectiveKind::kAllReduce, 2}, ab}});
//   double s = cost(CollectiveKind::kAllReduce, 2, 5e4);   // alpha_s + 5e4 * seconds_per_byte
#ifndef SHARDMAP_PERFMODEL_ALPHA_BETA_H_
#define SHARDMAP_PERFMODEL_ALPHA_BETA_H_

#include <map>
#include <utility>
#include <vector>

#include "perfmodel/ring_cost.h"

namespace shardmap::perfmodel {

// seconds = alpha_s + bytes * seconds_per_byte.
struct AlphaBeta {
  double alpha_s = 0, seconds_per_byte = 0;
};

// Least-squares line through (bytes[i], seconds[i]). std::invalid_argument for fewer than 2
// pairs, counts that differ, or all sizes the same.
AlphaBeta FitAlphaBeta(const std::vector<double>& bytes, const std::vector<double>& seconds);

using FittedTable = std::map<std::pair<CollectiveKind, int>, AlphaBeta>;
// seconds = alpha + full_bytes * seconds_per_byte of the fit for (kind, t). A (kind, t) missing
// from the table is an error: std::out_of_range from the returned cost, naming it.
CollectiveCost FittedCost(FittedTable table);

}  // namespace shardmap::perfmodel

#endif  // SHARDMAP_PERFMODEL_ALPHA_BETA_H_
