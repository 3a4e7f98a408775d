// Per-mesh-axis SPMD types (docs/design.md section 4.2).
//
//   R  replicate  same value on every device of the axis; gradient is P
//   I  invariant  same value computed redundantly; gradient is I
//   V  varying    different values; S(d) when known to be the d-th-dim shard of a whole; gradient V
//   P  partial    pending sum over the axis; gradient is R
//
//   SpmdType t(2);                       // two mesh axes, both R
//   t[0] = AxisType::Sharded(0);         // dp: S(0)
//   t.ToString({"dp", "tp"});            // "{dp:S0,tp:R}"
//   Dual(t).ToString({"dp", "tp"});      // "{dp:S0,tp:P}"
//   Dual(t).AxesOfKind(AxisKind::kP);    // 0b10: tp (bit i is mesh axis i, as Mesh's AxisMask)
//   mesh.AxisNamesOf(t.AxesOfKind(AxisKind::kP))   // {"tp"}: names for a collective
//
// SpmdType is a fixed array (no allocation): values carrying it are cheap to copy.
#ifndef SHARDMAP_SHARDMAP_SPMD_TYPE_H_
#define SHARDMAP_SHARDMAP_SPMD_TYPE_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/types/span.h"

namespace shardmap {

inline constexpr int kMaxMeshAxes = 8;

enum class AxisKind : uint8_t { kR, kI, kV, kP };

struct AxisType {
  AxisKind kind = AxisKind::kR;
  int8_t dim = -1;  // for kV: the tensor dim it shards (S(dim)), or -1 when unknown
  // For kV of unknown layout: where it came from (shardmap/v_origin.h; 0 unknown). Not part of
  // operator==: two V are the same type whatever made them; errors use it to name the cause.
  uint16_t origin = 0;

  static constexpr AxisType R() { return {AxisKind::kR, -1, 0}; }
  static constexpr AxisType I() { return {AxisKind::kI, -1, 0}; }
  static constexpr AxisType V(uint16_t origin = 0) { return {AxisKind::kV, -1, origin}; }
  static constexpr AxisType P() { return {AxisKind::kP, -1, 0}; }
  static constexpr AxisType Sharded(int d) {
    return {AxisKind::kV, static_cast<int8_t>(d), 0};
  }
  bool is_unknown_v() const { return kind == AxisKind::kV && dim < 0; }

  bool is_sharded() const { return kind == AxisKind::kV && dim >= 0; }
  bool operator==(const AxisType& o) const { return kind == o.kind && dim == o.dim; }
  bool operator!=(const AxisType& o) const { return !(*this == o); }
  std::string ToString() const;  // "R", "I", "V", "S1", "P"
};

// R<->P, I<->I, V<->V (S(d) stays S(d)).
AxisType Dual(AxisType t);

// One AxisType per axis of the mesh the value lives on, in mesh axis order.
class SpmdType {
 public:
  SpmdType() = default;
  explicit SpmdType(int num_axes, AxisType fill = AxisType::R());

  int num_axes() const { return n_; }
  // The Mesh::id() of the mesh these axes belong to; 0 for a type built without a mesh (then
  // only the number of axes is checked). Not part of operator== (which compares the axes).
  uint32_t mesh_id() const { return mesh_id_; }
  void set_mesh_id(uint32_t id) { mesh_id_ = id; }
  AxisType& operator[](int axis) { return axes_[axis]; }
  const AxisType& operator[](int axis) const { return axes_[axis]; }
  // The axes whose kind is k, as a bit mask (bit i: mesh axis i; a Mesh's AxisMask): e.g. the
  // axes a gradient is still a pending sum over, AxesOfKind(AxisKind::kP). The one place that
  // loop is written (collective_ops.h's AxesWhere gives the names).
  uint32_t AxesOfKind(AxisKind k) const {
    uint32_t mask = 0;
    for (int i = 0; i < n_; ++i) mask |= axes_[i].kind == k ? 1u << i : 0u;
    return mask;
  }
  bool operator==(const SpmdType& o) const;
  bool operator!=(const SpmdType& o) const { return !(*this == o); }

  // "{dp:S0,tp:R}"; axis_names may be shorter than num_axes (missing names print as "a<i>").
  std::string ToString(absl::Span<const std::string> axis_names) const;

 private:
  std::array<AxisType, kMaxMeshAxes> axes_{};
  uint8_t n_ = 0;
  uint32_t mesh_id_ = 0;
};

SpmdType Dual(const SpmdType& t);

}  // namespace shardmap

#endif  // SHARDMAP_SHARDMAP_SPMD_TYPE_H_
