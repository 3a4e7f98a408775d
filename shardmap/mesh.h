// Mesh: an N-d array of ranks with named axes, row-major, the last axis innermost.
//
//   absl::StatusOr<Mesh> m = Mesh::Create({{"dp", 2}, {"tp", 4}});   // 8 ranks
//   m->size();                     // 8
//   m->AxisIndex("tp");            // 1
//   m->Coords(6);                  // {1, 2}: rank 6 is dp=1, tp=2
//   m->RankAt({1, 2});             // 6
//   m->GroupColor(6, m->Mask({"tp"}))  // 1: rank 6's tp group is {4,5,6,7}
//   m->GroupIndex(6, m->Mask({"tp"}))  // 2: its position in that group
//   Mesh tp = *m->Submesh({"tp"});   // the axes tp only (a view used inside a dp slice)
//   Mesh f = *m->Flatten({"dp", "tp"}, "world");  // one axis of 8
//   std::cout << m->ToString();    // a grid showing which rank sits where
//   std::cout << *m;               // "Mesh{dp:2,tp:4}" (ShortString); also in gtest messages
//   absl::StrFormat("on %s", *m);  // "on Mesh{dp:2,tp:4}"
//
// Names must be unique and non-empty, sizes >= 1, at most kMaxMeshAxes axes. Errors are
// InvalidArgument with the offending name/size. Several meshes may describe the same ranks (e.g.
// an expert-parallel mesh beside the dp x tp mesh); a Mesh is a plain value, cheap to copy.
//
// An axis set (several axes used at once by a collective) is a bit mask over axis indices; its
// ranks are ordered row-major over those axes in mesh order (the first axis major).
#ifndef SHARDMAP_SHARDMAP_MESH_H_
#define SHARDMAP_SHARDMAP_MESH_H_

#include <cstdint>
#include <iosfwd>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "shardmap/spmd_type.h"

namespace shardmap {

using AxisMask = uint32_t;

class Mesh {
 public:
  Mesh() = default;  // zero axes, one rank
  static absl::StatusOr<Mesh> Create(std::vector<std::pair<std::string, int>> axes);

  int num_axes() const { return static_cast<int>(names_.size()); }
  int size() const { return size_; }  // product of axis sizes
  const std::vector<std::string>& axis_names() const { return names_; }
  int axis_size(int axis) const { return sizes_[axis]; }
  // -1 when absent.
  int AxisIndex(const std::string& name) const;
  absl::StatusOr<int> AxisSizeOf(const std::string& name) const;

  std::vector<int> Coords(int rank) const;
  int Coord(int rank, int axis) const { return (rank / strides_[axis]) % sizes_[axis]; }
  int RankAt(absl::Span<const int> coords) const;

  // Axis sets. Mask() fails (InvalidArgument naming the axis and the mesh) on unknown or repeated
  // names; MaskOrDie is for names already validated.
  absl::StatusOr<AxisMask> Mask(const std::vector<std::string>& axes) const;
  int GroupSize(AxisMask mask) const;
  // Identifies the group of `rank` over `mask` (ranks agreeing on every other axis): 0..n/GroupSize.
  int GroupColor(int rank, AxisMask mask) const;
  // Position of `rank` inside its group (row-major over the masked axes in mesh order).
  int GroupIndex(int rank, AxisMask mask) const;
  // The world rank at position `index` of `rank`'s group.
  int GroupMember(int rank, AxisMask mask, int index) const;
  // "tp" or "(dp,tp)".
  std::string MaskToString(AxisMask mask) const;
  // The names of the axes of mask, in mesh order (what collectives take): {"dp", "tp"}.
  std::vector<std::string> AxisNamesOf(AxisMask mask) const;

  absl::StatusOr<Mesh> Submesh(const std::vector<std::string>& axes) const;
  // Replaces `axes` (which must be adjacent, in mesh order) by one axis `new_name` of their
  // product, keeping the rank order.
  absl::StatusOr<Mesh> Flatten(const std::vector<std::string>& axes, std::string new_name) const;

  bool operator==(const Mesh& o) const { return names_ == o.names_ && sizes_ == o.sizes_; }
  // A fingerprint of the axis names and sizes (equal meshes have equal ids; never 0). Values
  // carry it in their SpmdType, so an op refuses a value typed under another mesh.
  uint32_t id() const { return id_; }

  // "Mesh{dp:2,tp:4}"
  std::string ShortString() const;
  // The short form followed by a grid of ranks (two last axes as rows x columns).
  std::string ToString() const;

  // absl::StrFormat("%s", mesh): the ShortString.
  friend absl::FormatConvertResult<absl::FormatConversionCharSet::kString> AbslFormatConvert(
      const Mesh& m, const absl::FormatConversionSpec&, absl::FormatSink* sink) {
    sink->Append(m.ShortString());
    return {true};
  }
  // absl::StrCat(mesh) and LOG(INFO) << mesh with Abseil 20230125 and later (this repository
  // builds with 20220623, which does not call it yet; any sink with Append(string_view) works).
  template <typename Sink>
  friend void AbslStringify(Sink& sink, const Mesh& m) {
    sink.Append(absl::string_view(m.ShortString()));
  }

 private:
  std::vector<std::string> names_;
  std::vector<int> sizes_;
  std::vector<int> strides_;
  int size_ = 1;
  static constexpr uint32_t kNoAxesId = 0x5EED;
  uint32_t id_ = kNoAxesId;

  uint32_t ComputeId() const;
};

// Prints the ShortString: "Mesh{dp:2,tp:4}".
std::ostream& operator<<(std::ostream& os, const Mesh& mesh);

}  // namespace shardmap

#endif  // SHARDMAP_SHARDMAP_MESH_H_
