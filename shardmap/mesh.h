// Mesh: an N-d array of ranks with named axes, row-major, the last axis innermost.
//
//   absl::StatusOr<Mesh> m = Mesh::Create({{"dp", 2}, {"tp", 4}});   // 8 ranks
//   m->size();                     // 8
//   m->AxisIndex("tp");            // 1
//   m->Coords(6);                  // {1, 2}: rank 6 is dp=1, tp=2
//   m->RankAt({1, 2});             // 6
//   m->AxisGroupOf(6, {"tp"});     // color/index of rank 6's tp group: ranks {4,5,6,7}
//   Mesh tp = m->Submesh({"tp"});   // the axes tp only (a view used inside a dp slice)
//   Mesh f = m->Flatten({"dp", "tp"}, "world");  // one axis of 8
//   std::cout << m->ToString();    // a grid showing which rank sits where
//
// Names must be unique and non-empty, sizes >= 1, at most kMaxMeshAxes axes. Errors are
// InvalidArgument with the offending name/size.
#ifndef SHARDMAP_SHARDMAP_MESH_H_
#define SHARDMAP_SHARDMAP_MESH_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace shardmap {

class Mesh {
 public:
  static absl::StatusOr<Mesh> Create(std::vector<std::pair<std::string, int>> axes);

  int num_axes() const;
  int size() const;  // product of axis sizes
  const std::vector<std::string>& axis_names() const;
  int axis_size(int axis) const;
  // -1 when absent.
  int AxisIndex(const std::string& name) const;
  absl::StatusOr<int> AxisSizeOf(const std::string& name) const;

  std::vector<int> Coords(int rank) const;
  int RankAt(absl::Span<const int> coords) const;

  absl::StatusOr<Mesh> Submesh(const std::vector<std::string>& axes) const;
  absl::StatusOr<Mesh> Flatten(const std::vector<std::string>& axes, std::string new_name) const;

  std::string ToString() const;
};

}  // namespace shardmap

#endif  // SHARDMAP_SHARDMAP_MESH_H_
