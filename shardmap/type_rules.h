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
SpmdType ElementwiseRule(const char* op, const SpmdType& a, absl::Span<const int64_t> a_shape,
                         const SpmdType& b, absl::Span<const int64_t> b_shape,
                         absl::Span<const int64_t> out, bool multilinear, bool divide,
                         std::optional<Rejection>& no);

// A nonlinear unary op (gelu, exp, ...): any kind but P, the type unchanged.
SpmdType NonlinearRule(const char* op, const SpmdType& x, absl::Span<const std::string> axis_names,
                       std::optional<Rejection>& no);

// matmul(a, b, ta, tb) of operands of ranks a_rank, b_rank (b of rank > 2 is batched): R@R = R,
// S on a's free dim or b's free dim stays S of the output's, contracting a dim both shard over
// one axis gives P, contracting dims sharded over different axes is rejected; P@R = P.
SpmdType MatmulRule(const SpmdType& a, int a_rank, const SpmdType& b, int b_rank, bool ta,
                    bool tb, absl::Span<const std::string> axis_names,
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

}  // namespace shardmap

#endif  // SHARDMAP_SHARDMAP_TYPE_RULES_H_
