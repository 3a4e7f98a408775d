#include "shardmap/spmd_type.h"

#include "absl/strings/str_cat.h"

namespace shardmap {

std::string AxisType::ToString() const {
  switch (kind) {
    case AxisKind::kR: return "R";
    case AxisKind::kI: return "I";
    case AxisKind::kP: return "P";
    case AxisKind::kV: return dim >= 0 ? absl::StrCat("S", static_cast<int>(dim)) : "V";
  }
  return "?";
}

AxisType Dual(AxisType t) {
  switch (t.kind) {
    case AxisKind::kR: return AxisType::P();
    case AxisKind::kP: return AxisType::R();
    default: return t;
  }
}

SpmdType::SpmdType(int num_axes, AxisType fill) : n_(static_cast<uint8_t>(num_axes)) {
  for (int i = 0; i < num_axes; ++i) axes_[i] = fill;
}

bool SpmdType::operator==(const SpmdType& o) const {
  if (n_ != o.n_) return false;
  for (int i = 0; i < n_; ++i) {
    if (axes_[i] != o.axes_[i]) return false;
  }
  return true;
}

std::string SpmdType::ToString(absl::Span<const std::string> axis_names) const {
  std::string s = "{";
  for (int i = 0; i < n_; ++i) {
    if (i > 0) s += ",";
    if (i < static_cast<int>(axis_names.size())) {
      absl::StrAppend(&s, axis_names[i], ":", axes_[i].ToString());
    } else {
      absl::StrAppend(&s, "a", i, ":", axes_[i].ToString());
    }
  }
  s += "}";
  return s;
}

SpmdType Dual(const SpmdType& t) {
  SpmdType d = t;
  for (int i = 0; i < t.num_axes(); ++i) d[i] = Dual(t[i]);
  return d;
}

}  // namespace shardmap
