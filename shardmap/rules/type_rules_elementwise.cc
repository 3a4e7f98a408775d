#include "shardmap/rules/type_rules_elementwise.h"

#include <algorithm>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "shardmap/internal/type_rule_cases.h"
#include "shardmap/rules/type_rules_layout.h"

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
