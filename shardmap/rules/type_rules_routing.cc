#include "shardmap/rules/type_rules_routing.h"

namespace shardmap {

SpmdType RowOpRule(const SpmdType& x, const SpmdType& rows, std::optional<Rejection>& no) {
  const int na = x.num_axes();
  SpmdType t(na);
  t.set_mesh_id(x.mesh_id());
  for (int i = 0; i < na; ++i) {
    const AxisKind a = x[i].kind, b = rows[i].kind;
    if (b == AxisKind::kP) {
      no = Rejection{i, "the row indices are a partial sum (P)",
                     "indices must be per-device integers (R, I or V); all_reduce them first"};
      return t;
    }
    if (a == AxisKind::kP) {
      if (b == AxisKind::kV) {
        no = Rejection{i,
                       "x is a partial sum (P) but the row indices vary: each device would pick "
                       "different rows of its addend",
                       "all_reduce x first (or index with the same rows on every device)"};
        return t;
      }
      t[i] = AxisType::P();
    } else if (a == AxisKind::kI || b == AxisKind::kI) {
      if ((a == AxisKind::kI) != (b == AxisKind::kI) &&
          !(a == AxisKind::kI && b == AxisKind::kR)) {
        no = Rejection{i, "an invariant (I) value mixes only with I (or R) indices",
                       "convert it with convert(.., axis, Convert::kIToR) first"};
        return t;
      }
      t[i] = AxisType::I();
    } else if (a == AxisKind::kV || b == AxisKind::kV) {
      t[i] = AxisType::V();
    } else {
      t[i] = AxisType::R();
    }
  }
  return t;
}

}  // namespace shardmap
