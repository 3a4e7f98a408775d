// Text pictures of sharded values: which rank holds which block of the global tensor.
//
//   Mesh mesh = *Mesh::Create({{"dp", 2}, {"tp", 3}});
//   std::cout << VisualizeSharding(mesh, P("dp", "tp"), {4, 9});
//   //  f?[4,9] sharded P(dp,tp) over Mesh{dp:2,tp:3}
//   //               cols 0-2   cols 3-5   cols 6-8
//   //    rows 0-1   0          1          2
//   //    rows 2-3   3          4          5
//   std::cout << VisualizeSharding(mesh, P("dp"), {4, 9});   // each cell lists 3 ranks: "0,1,2"
//
//   // Inside per-device code, from a Value's SPMD type (S axes place blocks, R/I axes replicate,
//   // P axes are noted as pending sums, V axes of unknown layout are noted as such):
//   std::string s = Visualize(y);
//
// Rows are dim 0 and columns dim 1 (a 1-D tensor is one row; dims past 1 are listed, not drawn).
#ifndef SHARDMAP_SHARDMAP_VISUALIZE_H_
#define SHARDMAP_SHARDMAP_VISUALIZE_H_

#include <string>

#include "absl/types/span.h"
#include "shardmap/mesh.h"
#include "shardmap/partition_spec.h"
#include "shardmap/value.h"

namespace shardmap {

std::string VisualizeSharding(const Mesh& mesh, const PartitionSpec& spec,
                              absl::Span<const int64_t> global_shape);

// Per-device (needs the current RankContext).
std::string Visualize(const Value& v);

}  // namespace shardmap

#endif  // SHARDMAP_SHARDMAP_VISUALIZE_H_
