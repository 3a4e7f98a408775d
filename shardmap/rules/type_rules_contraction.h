// One contraction rule for matmul and einsum (matmul is the einsum "...mk,kn->...mn"), as a
// pure function of the operand types and the index letters of each operand and the output.
//
//   std::optional<Rejection> no;
//   ContractionRule({tp:S1}, "ti", {tp:S0}, "io", "to", names, no)   // {tp:P}: row-parallel
//   ContractionRule({dp:S0}, "ti", {tp:S1}, "io", "to", names, no)   // {dp:S0,tp:S1}
//   MatmulRule(a.type, 2, b.type, 2, false, false, names, no)         // the same, for matmul
//
// Per mesh axis: I meets only I; one P factor with R factors is P, P*P and P*V are rejected;
// R x R is R. A letter an operand holds as S on the axis stays S of the output dim it lands on
// when the other operand is R there or shards the same letter; a contracted letter both operands
// shard gives P (a partial sum); a contracted letter only one operand shards, letters of unknown
// layout (V) and different letters sharded by both give V (the local sizes then say what is
// wrong, or the per-device products are what the program wants). A contracted letter sharded
// over axis i in one operand while the other shards it over another axis j (and the first does
// not) is rejected: the devices would pair slices that do not match.
#ifndef SHARDMAP_SHARDMAP_RULES_TYPE_RULES_CONTRACTION_H_
#define SHARDMAP_SHARDMAP_RULES_TYPE_RULES_CONTRACTION_H_

#include <optional>
#include <string>
#include <string_view>

#include "absl/types/span.h"
#include "shardmap/spmd_type.h"
#include "shardmap/rules/type_rules_base.h"

namespace shardmap {

// la, lb, out: one letter per dim of a, b and the result; every letter of a and b is in the
// output or in both operands (contracted). axis_names: the mesh's, for messages.
SpmdType ContractionRule(const SpmdType& a, std::string_view la, const SpmdType& b,
                         std::string_view lb, std::string_view out,
                         absl::Span<const std::string> axis_names, std::optional<Rejection>& no);

// matmul(a, b, ta, tb) of operands of ranks a_rank, b_rank (b of rank > 2 is batched) as the
// contraction "...mk,kn->...mn" (with the transposes' letters swapped): R@R = R, S on a's free
// dim or b's free dim stays S of the output's, contracting a dim both shard over one axis gives
// P, contracting dims sharded over different axes is rejected; P@R = P.
inline SpmdType MatmulRule(const SpmdType& a, int a_rank, const SpmdType& b, int b_rank,
                           bool ta, bool tb, absl::Span<const std::string> axis_names,
                           std::optional<Rejection>& no);

namespace internal {

// The letters of matmul's operands and result, as ContractionRule takes them.
struct MatmulLetters {
  std::string a, b, out;
};
MatmulLetters MatmulAsContraction(int a_rank, int b_rank, bool ta, bool tb);

SpmdType MatmulRuleFull(const SpmdType& a, int a_rank, const SpmdType& b, int b_rank, bool ta,
                        bool tb, absl::Span<const std::string> axis_names,
                        std::optional<Rejection>& no);

// The fast path alone (nullopt: the case needs the full rule), exposed for tests.
inline std::optional<SpmdType> MatmulFast(const SpmdType& a, const SpmdType& b) {
  // Only R and V of unknown layout: R@R = R, anything with a V is V.
  if (a.num_axes() != b.num_axes()) return std::nullopt;
  SpmdType t(a.num_axes());
  t.set_mesh_id(a.mesh_id() != 0 ? a.mesh_id() : b.mesh_id());
  for (int i = 0; i < a.num_axes(); ++i) {
    const AxisType x = a[i], y = b[i];
    const bool fast = (x.kind == AxisKind::kR || (x.kind == AxisKind::kV && x.dim < 0)) &&
                      (y.kind == AxisKind::kR || (y.kind == AxisKind::kV && y.dim < 0));
    if (!fast) return std::nullopt;
    if (x.kind != AxisKind::kR || y.kind != AxisKind::kR) t[i] = AxisType::V();
  }
  return t;
}

}  // namespace internal

inline SpmdType MatmulRule(const SpmdType& a, int a_rank, const SpmdType& b, int b_rank,
                           bool ta, bool tb, absl::Span<const std::string> axis_names,
                           std::optional<Rejection>& no) {
  if (std::optional<SpmdType> t = internal::MatmulFast(a, b)) return *std::move(t);
  return internal::MatmulRuleFull(a, a_rank, b, b_rank, ta, tb, axis_names, no);
}

}  // namespace shardmap

#endif  // SHARDMAP_SHARDMAP_RULES_TYPE_RULES_CONTRACTION_H_
