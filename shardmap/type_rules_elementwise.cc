#include "shardmap/type_rules_elementwise.h"

#include <algorithm>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "shardmap/internal/type_rule_cases.h"
#include "shardmap/type_rules_layout.h"

namespace shardmap {

using internal::InvariantCase;
using internal::NameOf;
using internal::JoinedShape;
using internal::KindWord;
using internal::PartialProductCase;
using internal::Rejected;

SpmdType internal::ElementwiseRuleFull(const char* op, const SpmdType& a,
                                       absl::Span<const int64_t> a_shape, const SpmdType& b,
                                       absl::Span<const int64_t> b_shape,
                                       absl::Span<const int64_t> out, bool multilinear,
                                       bool divide, std::optional<Rejection>& no) {
  SpmdType t = JoinedShape(a, b);
  for (int i = 0; i < t.num_axes(); ++i) {
    AxisType x = a[i], y = b[i];
    AxisKind kx = x.kind, ky = y.kind;
    if (InvariantCase(kx, ky, i, t, no)) {
      if (no) return SpmdType();
      continue;
    }
    if (divide && ky == AxisKind::kP) {
      return Rejected(no, i,
                      "the divisor is a partial sum (P); division is nonlinear in the divisor",
                      "all_reduce the divisor first");
    }
    if (kx == AxisKind::kP || ky == AxisKind::kP) {
      if (!multilinear) {
        if (kx != ky) {
          // Only an R operand added to a P one is the classic bias bug; a V one, or a
          // subtraction (say a forgotten all_reduce before `y - target`), is named as such.
          const AxisKind other = kx == AxisKind::kP ? ky : kx;
          const bool bias = std::string(op) == "add" && other == AxisKind::kR;
          const char* p_name = kx == AxisKind::kP ? "a" : "b";
          return Rejected(
              no, i,
              absl::StrCat("combines operand ", p_name, ", a partial sum (P), with a ",
                           KindWord(other),
                           " value: the sum over devices would count the non-P operand once "
                           "per device",
                           bias ? " (the 'bias added before the all-reduce' bug)" : ""),
              absl::StrCat("all_reduce (or reduce_scatter) operand ", p_name,
                           " first: it is still a pending sum, e.g. a row-parallel matmul's "
                           "output",
                           bias ? ", or add the bias after the reduction" : ""));
        }
        t[i] = AxisType::P();
        continue;
      }
      PartialProductCase(kx, ky, i, "all_reduce the P operand first", t, no);
      if (no) return SpmdType();
      continue;
    }
    if (kx == AxisKind::kR && ky == AxisKind::kR) {
      t[i] = AxisType::R();
      continue;
    }
    // At least one V, the other V or R (promoted).
    int dx = kx == AxisKind::kV ? BroadcastDim(a_shape, x.dim, out) : -2;
    int dy = ky == AxisKind::kV ? BroadcastDim(b_shape, y.dim, out) : -2;
    int d;
    if (dx == -2) {
      d = dy;
    } else if (dy == -2) {
      d = dx;
    } else {
      d = dx == dy ? dx : -1;
    }
    t[i] = d >= 0 ? AxisType::Sharded(d) : AxisType::V();
  }
  return t;
}

std::optional<Rejection> WholeAgainstShardedRule(const SpmdType& a,
                                                 absl::Span<const int64_t> a_shape,
                                                 const SpmdType& b,
                                                 absl::Span<const int64_t> b_shape,
                                                 absl::Span<const std::string> axis_names) {
  const int n = std::min(a.num_axes(), b.num_axes());
  for (int i = 0; i < n; ++i) {
    for (int side = 0; side < 2; ++side) {
      const AxisType s = side == 0 ? a[i] : b[i], w = side == 0 ? b[i] : a[i];
      const absl::Span<const int64_t> ss = side == 0 ? a_shape : b_shape;
      const absl::Span<const int64_t> ws = side == 0 ? b_shape : a_shape;
      if (!s.is_sharded() || (w.kind != AxisKind::kR && w.kind != AxisKind::kI)) continue;
      const int e = s.dim - (static_cast<int>(ss.size()) - static_cast<int>(ws.size()));
      if (s.dim >= static_cast<int>(ss.size()) || e < 0 || ws[e] == 1) continue;
      // A dim the whole operand shards over another axis is a block of the same dim (S on
      // disjoint axes combine): its local size is the shard's on a mesh of any size.
      const SpmdType& wt = side == 0 ? b : a;
      bool sharded_elsewhere = false;
      for (int j = 0; j < wt.num_axes(); ++j) {
        sharded_elsewhere |= wt[j].is_sharded() && wt[j].dim == e;
      }
      if (sharded_elsewhere) continue;
      const char* sn = side == 0 ? "a" : "b";
      const char* wn = side == 0 ? "b" : "a";
      const std::string axis = NameOf(axis_names, i);
      return Rejection{
          i,
          absl::StrCat(sn, "'s dim ", static_cast<int>(s.dim), " is sharded over '", axis,
                       "' but ", wn, "'s dim ", e, " (size ", ws[e],
                       "), which lines up with it, is whole (", KindName(w.kind),
                       "): each device would combine its shard with the whole dim"),
          absl::StrCat("shard ", wn, "'s dim ", e, " over '", axis, "' too (its in_spec, or "
                       "slice it to this device's positions: slice(vary(", wn, ", \"", axis,
                       "\"), ", e, ", axis_index(\"", axis, "\") * n, n)), or all_gather ", sn,
                       " over '", axis, "' first")};
    }
  }
  return std::nullopt;
}

SpmdType NonlinearRule(const char* op, const SpmdType& x, absl::Span<const std::string> axis_names,
                       std::optional<Rejection>& no) {
  for (int i = 0; i < x.num_axes(); ++i) {
    if (x[i].kind == AxisKind::kP) {
      return Rejected(no, i,
                      absl::StrCat(op, " is nonlinear, so it cannot take a partial sum (P): "
                                       "f(sum x_i) != sum f(x_i)"),
                      absl::StrCat("all_reduce(x, \"", NameOf(axis_names, i),
                                   "\") (or reduce_scatter) before ", op));
    }
  }
  return x;
}

}  // namespace shardmap
