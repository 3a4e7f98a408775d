// The elementwise ops' type rules: binary (linear add/sub, multilinear mul/div), nonlinear
// unary, and the kind-only rules of erased (unchecked) mode. ElementwiseRule is an inline fast
// path (operands of one type) in front of the full rule.
//
//   std::optional<Rejection> no;
//   ElementwiseRule("add", {tp:P}, a_shape, {tp:R}, b_shape, out, false, false, no);
//   // no->rule: "combines operand a, a partial sum (P), with a replicated (R) value ... (the
//   // 'bias added before the all-reduce' bug)"
//   NonlinearRule("gelu", {tp:P}, names, no);   // rejected: f(sum x_i) != sum f(x_i)
#ifndef SHARDMAP_SHARDMAP_RULES_TYPE_RULES_ELEMENTWISE_H_
#define SHARDMAP_SHARDMAP_RULES_TYPE_RULES_ELEMENTWISE_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/types/span.h"
#include "shardmap/spmd_type.h"
#include "shardmap/rules/type_rules_base.h"

namespace shardmap {

// Kind-only join for erased mode (max of kinds; no S dims, no checks). For programs that pass
// the checks it agrees with the checked type on whether each axis is R, I or P/V.
inline SpmdType ErasedJoin(const SpmdType& a, const SpmdType& b) {
  SpmdType t(a.num_axes());
  t.set_mesh_id(a.mesh_id() != 0 ? a.mesh_id() : b.mesh_id());
  for (int i = 0; i < a.num_axes(); ++i) {
    t[i].kind = a[i].kind > b[i].kind ? a[i].kind : b[i].kind;
  }
  return t;
}

// Drops S(d) knowledge (V stays V): for erased mode outputs.
inline SpmdType ErasedUnary(const SpmdType& a) {
  SpmdType t = a;
  for (int i = 0; i < a.num_axes(); ++i) t[i].dim = -1;
  return t;
}

// Elementwise binary ops: add/sub are linear (P+P = P, P+R rejected: the bias bug), mul/div are
// multilinear (P*R = P, P*P and P*V rejected); divide: b is a divisor (P rejected). I meets only I.
// An S(d) operand keeps S on the broadcast output dim when both agree.
inline SpmdType ElementwiseRule(const char* op, const SpmdType& a,
                                absl::Span<const int64_t> a_shape, const SpmdType& b,
                                absl::Span<const int64_t> b_shape, absl::Span<const int64_t> out,
                                bool multilinear, bool divide, std::optional<Rejection>& no);

// A nonlinear unary op (gelu, exp, ...): any kind but P, the type unchanged.
SpmdType NonlinearRule(const char* op, const SpmdType& x, absl::Span<const std::string> axis_names,
                       std::optional<Rejection>& no);

namespace internal {

SpmdType ElementwiseRuleFull(const char* op, const SpmdType& a, absl::Span<const int64_t> a_shape,
                             const SpmdType& b, absl::Span<const int64_t> b_shape,
                             absl::Span<const int64_t> out, bool multilinear, bool divide,
                             std::optional<Rejection>& no);

inline bool SameSpan(absl::Span<const int64_t> x, absl::Span<const int64_t> y) {
  if (x.size() != y.size()) return false;
  for (size_t k = 0; k < x.size(); ++k) {
    if (x[k] != y[k]) return false;
  }
  return true;
}

// The fast paths alone (nullopt: the case needs the full rule). Exposed so tests can check
// where they fire, not only that they agree with the full rules.
inline std::optional<SpmdType> ElementwiseFast(const SpmdType& a,
                                               absl::Span<const int64_t> a_shape,
                                               const SpmdType& b,
                                               absl::Span<const int64_t> b_shape,
                                               absl::Span<const int64_t> out, bool multilinear) {
  // Equal types: R, I, V, P (P+P; P*P is rejected) keep their kind; S(d) keeps d when neither
  // operand is broadcast.
  bool fast = a.num_axes() == b.num_axes();
  bool sharded = false;
  for (int i = 0; fast && i < a.num_axes(); ++i) {
    fast = a[i] == b[i] && !(multilinear && a[i].kind == AxisKind::kP);
    sharded |= a[i].dim >= 0;
  }
  if (!fast || (sharded && !(SameSpan(a_shape, out) && SameSpan(b_shape, out)))) {
    return std::nullopt;
  }
  SpmdType t = a;
  if (t.mesh_id() == 0) t.set_mesh_id(b.mesh_id());
  return t;
}

}  // namespace internal

inline SpmdType ElementwiseRule(const char* op, const SpmdType& a,
                                absl::Span<const int64_t> a_shape, const SpmdType& b,
                                absl::Span<const int64_t> b_shape, absl::Span<const int64_t> out,
                                bool multilinear, bool divide, std::optional<Rejection>& no) {
  if (std::optional<SpmdType> t = internal::ElementwiseFast(a, a_shape, b, b_shape, out,
                                                            multilinear)) {
    return *std::move(t);
  }
  return internal::ElementwiseRuleFull(op, a, a_shape, b, b_shape, out, multilinear, divide, no);
}

}  // namespace shardmap

#endif  // SHARDMAP_SHARDMAP_RULES_TYPE_RULES_ELEMENTWISE_H_
