// Helpers the type-rule families share (type_rules_*.cc): naming, rejection, and the cases
// every product shares (an invariant meets only I; a partial sum only R factors).
#ifndef SHARDMAP_SHARDMAP_INTERNAL_TYPE_RULE_CASES_H_
#define SHARDMAP_SHARDMAP_INTERNAL_TYPE_RULE_CASES_H_

#include <optional>
#include <string>

#include "absl/types/span.h"
#include "shardmap/spmd_type.h"
#include "shardmap/rules/type_rules_base.h"

namespace shardmap::internal {

inline bool InMask(uint32_t mask, int i) { return (mask & (1u << i)) != 0; }

// names[axis], or "a<axis>" when names is shorter.
std::string NameOf(absl::Span<const std::string> names, int axis);
// "replicated (R)", "invariant (I)", "varying (V)", "partial (P)".
const char* KindWord(AxisKind k);
// Sets `no` and returns an empty type.
SpmdType Rejected(std::optional<Rejection>& no, int axis, std::string rule, std::string fix);
// A type of a's number of axes (all R), with the mesh id of a (or b).
SpmdType JoinedShape(const SpmdType& a, const SpmdType& b);

// The cases products (mul, div, matmul, einsum) and sums share: an invariant (I) meets only I.
// Returns whether it decided axis i (t[i] set, or `no`).
bool InvariantCaseSlow(AxisKind kx, AxisKind ky, int i, SpmdType& t,
                       std::optional<Rejection>& no);
// A product with a partial sum (P) operand: P*R = P; P*P and P*V are rejected (p_times_v_fix).
// Returns whether it decided axis i.
bool PartialProductCaseSlow(AxisKind kx, AxisKind ky, int i, const char* p_times_v_fix,
                            SpmdType& t, std::optional<Rejection>& no);

// The fast tests inline (the rules run on every typed op); the cases out of line.
inline bool InvariantCase(AxisKind kx, AxisKind ky, int i, SpmdType& t,
                          std::optional<Rejection>& no) {
  if (kx != AxisKind::kI && ky != AxisKind::kI) return false;
  return InvariantCaseSlow(kx, ky, i, t, no);
}
inline bool PartialProductCase(AxisKind kx, AxisKind ky, int i, const char* p_times_v_fix,
                               SpmdType& t, std::optional<Rejection>& no) {
  if (kx != AxisKind::kP && ky != AxisKind::kP) return false;
  return PartialProductCaseSlow(kx, ky, i, p_times_v_fix, t, no);
}

}  // namespace shardmap::internal

#endif  // SHARDMAP_SHARDMAP_INTERNAL_TYPE_RULE_CASES_H_
