// PartitionSpec: for each tensor dim, the mesh axes (none, one or several, first major) it is
// split over, like JAX's P("dp", None) / P(("dp","cp"), "tp").
//
//   PartitionSpec a = P("dp", None);          // dim 0 over dp, dim 1 whole
//   PartitionSpec b = P({"dp", "cp"}, "tp");  // dim 0 over dp (major) and cp, dim 1 over tp
//   PartitionSpec c = P();                    // fully replicated (every axis R)
//   PartitionSpec d = P(None).Unreduced({"tp"});  // an output left as a pending sum over tp
//   a.ToString();                             // "P(dp,None)"
//
//   // Checks against a mesh and a global shape; errors name the tensor, dim, size and axes:
//   absl::Status s = b.Validate(mesh, {10, 8}, "w1");
//   //  "while splitting dim 0 of 'w1' (size 10) over axes (dp,cp) of product 4:
//   //   10 is not divisible by 4"
//
// Dims past the spec's length are whole. An axis may appear at most once per spec (across dims
// and the unreduced set). Several axes on one dim must be listed in mesh order (unlike JAX):
// collectives over several axes order their devices row-major in mesh order, so this keeps a
// spec's blocks and a collective's chunks in the same order.
#ifndef SHARDMAP_SHARDMAP_PARTITION_SPEC_H_
#define SHARDMAP_SHARDMAP_PARTITION_SPEC_H_

#include <initializer_list>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "shardmap/axis_names.h"
#include "shardmap/mesh.h"
#include "shardmap/spmd_type.h"
#include "tensor/tensor.h"

namespace shardmap {

class PartitionSpec {
 public:
  PartitionSpec() = default;
  explicit PartitionSpec(std::vector<std::vector<std::string>> dims) : dims_(std::move(dims)) {}

  int size() const { return static_cast<int>(dims_.size()); }
  const std::vector<std::string>& dim_axes(int d) const { return dims_[d]; }
  const std::vector<std::vector<std::string>>& dims() const { return dims_; }
  const std::vector<std::string>& unreduced() const { return unreduced_; }

  // The same spec, with the output left as a pending sum (P) over `axes`.
  PartitionSpec Unreduced(std::vector<std::string> axes) const;

  // Unknown axes, an axis used twice, a spec longer than the tensor's rank, dims not divisible by
  // the product of their axes. `what` names the tensor in messages ("w1", "input 2").
  absl::Status Validate(const Mesh& mesh, absl::Span<const int64_t> global_shape,
                        const std::string& what) const;
  // The structural checks only (unknown/repeated axes), for specs without a shape yet.
  absl::Status ValidateAxes(const Mesh& mesh, const std::string& what) const;

  // Shape of one rank's shard (requires Validate to have passed).
  Shape LocalShape(const Mesh& mesh, absl::Span<const int64_t> global_shape) const;
  // Global shape from a local shard's shape.
  Shape GlobalShape(const Mesh& mesh, absl::Span<const int64_t> local_shape) const;
  // Which block of dim d `rank` holds (row-major over the dim's axes), and how many blocks.
  int BlockIndex(const Mesh& mesh, int rank, int d) const;
  int NumBlocks(const Mesh& mesh, int d) const;

  // The SPMD type of an input under this spec: S(d) for an axis named at dim d, P for the
  // unreduced axes, and `unnamed` (R, or I on request) for the rest.
  SpmdType InputType(const Mesh& mesh, AxisType unnamed = AxisType::R()) const;

  // Bit mask of the axes named in dims (not the unreduced ones).
  AxisMask ShardedMask(const Mesh& mesh) const;
  AxisMask UnreducedMask(const Mesh& mesh) const;

  // "P(dp,None)", "P((dp,cp),tp)", "P(None, unreduced=tp)"
  std::string ToString() const;

 private:
  std::vector<std::vector<std::string>> dims_;
  std::vector<std::string> unreduced_;
};

// P("dp", None), P({"dp","cp"}, "tp"), P() ...: up to 8 dims.
// P(dims...): one AxisNames per tensor dim, leading dims first; trailing dims left out are
// unsharded. (Overloads rather than a template, so braced lists like {"dp","cp"} work.)
PartitionSpec P();
PartitionSpec P(AxisNames d0);
PartitionSpec P(AxisNames d0, AxisNames d1);
PartitionSpec P(AxisNames d0, AxisNames d1, AxisNames d2);
PartitionSpec P(AxisNames d0, AxisNames d1, AxisNames d2, AxisNames d3);
PartitionSpec P(AxisNames d0, AxisNames d1, AxisNames d2, AxisNames d3, AxisNames d4);
PartitionSpec P(AxisNames d0, AxisNames d1, AxisNames d2, AxisNames d3, AxisNames d4,
                AxisNames d5);
PartitionSpec P(AxisNames d0, AxisNames d1, AxisNames d2, AxisNames d3, AxisNames d4,
                AxisNames d5, AxisNames d6);
PartitionSpec P(AxisNames d0, AxisNames d1, AxisNames d2, AxisNames d3, AxisNames d4,
                AxisNames d5, AxisNames d6, AxisNames d7);

}  // namespace shardmap

#endif  // SHARDMAP_SHARDMAP_PARTITION_SPEC_H_
