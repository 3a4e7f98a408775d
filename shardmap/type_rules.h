// The SPMD type rules of the collectives and casts, as data: per op the kinds it accepts on each
// mesh axis it runs over, the kind it makes of them, and the fix text for each kind it rejects
// (as JAX keeps one rule per primitive). Pure functions on SpmdType: no context, no tensors, so
// the rules are tested directly and the ops apply them in one place.
//
// Before (in each collective): a ForAxes loop with its own TypeFail texts.
// After:
//   const CollectiveRule& r = CollectiveRuleFor(Collective::kAllReduceSum);
//   std::optional<Rejection> no = CheckCollective(r, x.type, mask, /*dim=*/-1);
//   // no->axis = first rejected axis; no->rule = "takes a partial sum (P), but x is V";
//   // no->fix = "if each device's value is one addend of the sum you want ..."
//   SpmdType y = CollectiveResult(r, x.type, mask, /*dim=*/-1, /*invariant=*/false);  // P -> R
//
// The typed ops' rules are pure functions here too (ElementwiseRule, NonlinearRule, MatmulRule):
// each returns the result type or sets a Rejection, and the op throws it with its operands:
//   std::optional<Rejection> no;
//   SpmdType t = MatmulRule(a.type, 2, b.type, 2, false, false, mesh.axis_names(), no);
//   // {tp:S1} @ {tp:S0} -> {tp:P} (row-parallel); {dp:S1} @ {tp:S0} -> no->rule "contracts a's
//   // dim sharded over 'dp' with b's dim sharded over 'tp': ..."
// Also the kind-only rules of erased (unchecked) mode, ErasedJoin and ErasedUnary.
#ifndef SHARDMAP_SHARDMAP_TYPE_RULES_H_
#define SHARDMAP_SHARDMAP_TYPE_RULES_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/types/span.h"

#include "shardmap/mesh.h"
#include "shardmap/spmd_type.h"

namespace shardmap {

enum class Collective : uint8_t {
  kAllReduceSum,
  kAllReduceMeanMaxMin,
  kAllGather,
  kReduceScatter,
  kAllToAll,        // even chunks
  kAllToAllSizes,   // split_sizes / concat_sizes
  kPpermute,
  kBroadcast,
  kConvertIToR,
  kConvertRToP,
  kReinterpret,     // V -> P
  kVary,            // R -> V
  kCount,
};

// What the op makes of each axis it runs over.
enum class CollectiveResultKind : uint8_t {
  kRorI,       // all_reduce: R, or I when asked
  kGathered,   // all_gather: kRorI, and other axes sharding the gathered dim more minorly lose S
  kScattered,  // reduce_scatter: S(dim), and other axes sharding dim lose S as in kGathered
  kSharded,    // all_to_all: S(dim)
  kR,
  kP,
  kV,
  kKeepV,      // vary: R becomes V, V (and S(d)) stays
};

// A collective's transpose (its VJP), as JAX's transposes are themselves typed primitives: the
// collective the VJP applies to the cotangent, whose own rule then gives the cotangent's type.
struct CollectiveTranspose {
  Collective op;    // Collective::kCount: a local op (no collective; the cotangent keeps its type)
  bool invariant;   // op is asked for an I result (To::kI)
  bool keeps_root;  // then the cotangent stays on the root only (broadcast): P on R primals
};

// Texts may use $0 (the op's dim) and $1 (the dim x is sharded along on the axis, else $0).
struct CollectiveRule {
  const char* name;   // as messages print it: "all_reduce(sum)"
  const char* takes;  // "takes a partial sum (P)"; the message adds ", but x is V"
  // By AxisKind (R, I, V, P): nullptr when accepted, else the fix for that kind.
  std::array<const char*, 4> fix;
  // When an accepted S(d) shards another dim than the op's: the rule and fix, or nullptr when
  // any V is accepted.
  const char* wrong_dim_rule;
  const char* wrong_dim_fix;
  CollectiveResultKind result;
  const char* api;    // the function's name, as logs and agreement tags print it: "all_reduce"
  bool communicates;  // moves data between devices (the casts convert/reinterpret/vary do not)
  // The transpose of the op with an R result (or the op's only form), and of its I form
  // (To::kI). The transpose's dims are the op's swapped (the forward's result dim is checked,
  // its checked dim is the result: all_to_all(split, concat) transposes to (concat, split)).
  CollectiveTranspose transpose;
  CollectiveTranspose transpose_invariant;
};

const CollectiveRule& CollectiveRuleFor(Collective c);

struct Rejection {
  int axis;          // the first rejected mesh axis
  std::string rule;  // "takes a partial sum (P), but x is V"
  std::string fix;
};

// The first axis of mask whose type r rejects (dim: the op's dim, -1 when it has none), or
// nullopt. Strings are built only on rejection.
std::optional<Rejection> CheckCollective(const CollectiveRule& r, const SpmdType& x,
                                         AxisMask mask, int dim);
// x's type with each axis of mask replaced as r says (dim: the dim the result is sharded or
// gathered along; invariant: kRorI/kGathered give I instead of R).
SpmdType CollectiveResult(const CollectiveRule& r, const SpmdType& x, AxisMask mask, int dim,
                          bool invariant);

const char* KindName(AxisKind k);  // "R", "I", "V", "P"

// ---------------------------------------------------------------------------------------------
// Cotangent types. A cotangent's type is its primal's dual (R<->P, I<->I, V<->V); the VJPs derive
// it from the typed ops they run and state it here, in one place, where the derived type is a
// valid but less precise (or promoted) form of the dual:
//   primal R, derived V: P (the transpose of the implicit R -> V promotion: no communication);
//   primal V or S(d), derived R, I or V of unknown layout: the primal's V or S(d) (a value that
//   is the same on every device is one varying value; the shards of a V primal's cotangent are
//   its shards).
// Other axes keep the derived type: a derived S(e) for a primal S(d) (the tape accepts it only
// for the same blocks), P for a non-R primal and I for a non-I one are VJP bugs the tape's
// check reports.
SpmdType CotangentType(const SpmdType& derived, const SpmdType& primal);

// The type the table gives x's cotangent through collective c over mask (the forward's dims as
// in CheckCollective / CollectiveResult; invariant: To::kI): the dual of c's result, through
// c's transpose's rule (and keeps_root), stated by CotangentType. For every x the rule accepts
// this equals Dual(x) (type_rules_test checks each row).
SpmdType CollectiveCotangentType(Collective c, const SpmdType& x, AxisMask mask, int check_dim,
                                 int result_dim, bool invariant);

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

// ---------------------------------------------------------------------------------------------
// The typed ops' rules. Each returns the result type, or sets `no` (the first rejected axis, the
// rule and the fix) and returns an empty type. axis_names: the mesh's, for messages (missing
// names print as "a<i>"). Shapes are the operands' local shapes.

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

// matmul(a, b, ta, tb) of operands of ranks a_rank, b_rank (b of rank > 2 is batched): R@R = R,
// S on a's free dim or b's free dim stays S of the output's, contracting a dim both shard over
// one axis gives P, contracting dims sharded over different axes is rejected; P@R = P.
inline SpmdType MatmulRule(const SpmdType& a, int a_rank, const SpmdType& b, int b_rank,
                           bool ta, bool tb, absl::Span<const std::string> axis_names,
                           std::optional<Rejection>& no);

// The output dim that dim d of an operand of shape `in` lands on when broadcast to `out`, or -1
// when d is broadcast (size 1 against a larger size) or d < 0.
int BroadcastDim(absl::Span<const int64_t> in, int d, absl::Span<const int64_t> out);

// The output dim that a shard dim d (S(d)) of a local shape `in` lands on through a reshape to
// `out`, or -1 when the shards are no longer blocks of one output dim (then V). Each device's
// block stays a contiguous block of output dim e exactly when the elements before d and before
// e agree: prod(in[:d]) == prod(out[:e]). Of several such e (size-1 dims at the boundary) the
// first is taken, size 1 or not, so splitting [.., h*hd] -> [.., h, hd] keeps S on the heads
// dim also when each device holds one head:
//   {tp:S2} [b,t,hd] -> [b,t,1,hd] is {tp:S2} (heads, 1 per device), not S3 (head_dim).
// To insert a size-1 dim next to a sharded dim, insert it after: [b,t,h,hd] -> [b,t,h,1,hd].
int ReshapeDim(absl::Span<const int64_t> in, absl::Span<const int64_t> out, int d);

// Whether S(d) and S(e) of a value of local shape `shape` describe the same blocks (the same
// elements before both: only size-1 dims between them), e.g. dims 2 and 3 of [b,t,1,hd]. A
// cotangent typed S(e) for a primal S(d) is then retyped, not rejected.
bool SameShardBlocks(absl::Span<const int64_t> shape, int d, int e);

// x's type through a reshape of its local shape `in` to `out` (ReshapeDim on each S axis).
SpmdType ReshapeRule(const SpmdType& x, absl::Span<const int64_t> in,
                     absl::Span<const int64_t> out);

// ---------------------------------------------------------------------------------------------
// Reductions, the nn ops and the layout ops. Shapes are local; dims are normalised and sorted.

// sum / mean / sum_partial over dims nd of a rank-`rank` x. partial: a sharded reduced dim gives
// P (sum_partial), and summing every dim of a V of unknown layout gives its share (P); otherwise
// a sharded reduced dim is rejected. linear=false: P is rejected as by NonlinearRule.
SpmdType ReduceRule(const char* op, const SpmdType& x, int rank, absl::Span<const int> nd,
                    bool keepdim, bool partial, bool linear,
                    absl::Span<const std::string> axis_names, std::optional<Rejection>& no);

// max / local_max over dims nd: nonlinear (P rejected); a sharded reduced dim is rejected for
// max (one shard's max is not the max) and gives V for local_max.
SpmdType MaxRule(const char* op, const SpmdType& x, absl::Span<const int> nd, bool keepdim,
                 bool local, absl::Span<const std::string> axis_names,
                 std::optional<Rejection>& no);

// A normalisation over dim d (softmax, norms, cross_entropy's classes) rejects an S(d) axis.
std::optional<Rejection> CheckDimNotSharded(const SpmdType& x, int d, const char* fix);

// embedding(table [rows, hidden], ids of rank ids_rank): a vocab-parallel table (S0) with R/I ids
// gives P (its axes are set in *vocab); S1 gives S(ids_rank); R/I tables take the ids' type. P
// operands are rejected even unchecked (checked=false skips the other checks).
SpmdType EmbeddingRule(const SpmdType& table, const SpmdType& ids, int ids_rank, bool checked,
                       AxisMask* vocab, std::optional<Rejection>& no);

// take_along_last(x of rank x_rank, idx): as EmbeddingRule, for x sharded along its last dim.
SpmdType TakeAlongLastRule(const SpmdType& x, int x_rank, const SpmdType& idx, bool checked,
                           AxisMask* vocab, std::optional<Rejection>& no);

// cross_entropy(logits, targets): logits as NonlinearRule, and the targets distributed like
// the logits' rows (R targets go with R, I or P-free logits).
SpmdType CrossEntropyRule(const SpmdType& logits, const SpmdType& targets,
                          absl::Span<const std::string> axis_names, std::optional<Rejection>& no);

// permute(x, perm): S(perm[k]) becomes S(k). perm entries may be negative (from the end).
SpmdType PermuteRule(const SpmdType& x, absl::Span<const int> perm, int rank);

// slice / concat along dim: S(dim) becomes V (the pieces are no longer the shards of one whole).
SpmdType SliceRule(const SpmdType& x, int dim);

// broadcast_to(x of shape in, out): S(d) follows d to its output dim, V where d is broadcast.
SpmdType BroadcastRule(const SpmdType& x, absl::Span<const int64_t> in,
                       absl::Span<const int64_t> out);

// ---------------------------------------------------------------------------------------------
// Inline fast paths of the common cases (the typed ops' overhead on small tensors): operands of
// one type, or without S, P and I; everything else goes to the full rules (out of line).

namespace internal {

SpmdType ElementwiseRuleFull(const char* op, const SpmdType& a, absl::Span<const int64_t> a_shape,
                             const SpmdType& b, absl::Span<const int64_t> b_shape,
                             absl::Span<const int64_t> out, bool multilinear, bool divide,
                             std::optional<Rejection>& no);
SpmdType MatmulRuleFull(const SpmdType& a, int a_rank, const SpmdType& b, int b_rank, bool ta,
                        bool tb, absl::Span<const std::string> axis_names,
                        std::optional<Rejection>& no);

inline bool SameSpan(absl::Span<const int64_t> x, absl::Span<const int64_t> y) {
  if (x.size() != y.size()) return false;
  for (size_t k = 0; k < x.size(); ++k) {
    if (x[k] != y[k]) return false;
  }
  return true;
}

}  // namespace internal

namespace internal {

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

inline SpmdType MatmulRule(const SpmdType& a, int a_rank, const SpmdType& b, int b_rank,
                           bool ta, bool tb, absl::Span<const std::string> axis_names,
                           std::optional<Rejection>& no) {
  if (std::optional<SpmdType> t = internal::MatmulFast(a, b)) return *std::move(t);
  return internal::MatmulRuleFull(a, a_rank, b, b_rank, ta, tb, axis_names, no);
}

}  // namespace shardmap

#endif  // SHARDMAP_SHARDMAP_TYPE_RULES_H_
