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
// Each row also names its transpose (CollectiveTranspose): the type rule of the cotangent and,
// in collective_ops.cc, the VJP are both derived from it. CotangentType states a cotangent's
// type from the one its VJP's typed ops derived.
#ifndef SHARDMAP_SHARDMAP_RULES_TYPE_RULES_COLLECTIVE_H_
#define SHARDMAP_SHARDMAP_RULES_TYPE_RULES_COLLECTIVE_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "shardmap/mesh.h"
#include "shardmap/spmd_type.h"
#include "shardmap/rules/type_rules_base.h"

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

// What a VJP does on each device after its transpose collective (or, for a local transpose,
// instead of one). The forward's own parameters (root, the reduce kind, its group index) say how.
enum class TransposeLocal : uint8_t {
  kNone,
  kKeepOnRoot,  // kept on the forward's root only, zeros elsewhere (broadcast): P on R primals
  kLocalChunk,  // this device's chunk of the gathered dim (all_gather to I)
  kSpread,      // as the forward reduced: mean scales by 1/n, max/min routes the cotangent to
                // the device that held the extreme (lowest index on ties)
};

// A collective's transpose (its VJP), as JAX's transposes are themselves typed primitives: the
// collective the VJP applies to the cotangent, whose own rule then gives the cotangent's type,
// then the local step. This is the one place a transpose is written: the VJP that
// collective_ops.cc records runs exactly this (RunTranspose there), with the forward's
// parameters transposed (dims and sizes swapped, ppermute's pairs inverted).
struct CollectiveTranspose {
  Collective op = Collective::kCount;  // kCount: a local op (no collective)
  bool invariant = false;              // op is asked for an I result (To::kI)
  TransposeLocal then = TransposeLocal::kNone;
};

// Texts may use $0 (the op's dim) and $1 (the dim x is sharded along on the axis, else $0).
// The table (type_rules_collective.cc) has one row per Collective, each naming its own enum
// value (checked at compile time), written with designated initializers.
struct CollectiveRule {
  Collective op;      // the row's key
  const char* name;   // as messages print it: "all_reduce(sum)"
  const char* takes;  // "takes a partial sum (P)"; the message adds ", but x is V"
  // By AxisKind (R, I, V, P): nullptr when accepted, else the fix for that kind.
  std::array<const char*, 4> fix;
  // When an accepted S(d) shards another dim than the op's: the rule and fix, or nullptr when
  // any V is accepted.
  const char* wrong_dim_rule = nullptr;
  const char* wrong_dim_fix = nullptr;
  CollectiveResultKind result;
  const char* api;    // the function's name, as logs and agreement tags print it: "all_reduce"
  bool communicates;  // moves data between devices (the casts convert/reinterpret/vary do not)
  // The transpose of the op with an R result (or the op's only form), and of its I form
  // (To::kI). The transpose's dims are the op's swapped (the forward's result dim is checked,
  // its checked dim is the result: all_to_all(split, concat) transposes to (concat, split)).
  CollectiveTranspose transpose;
  CollectiveTranspose transpose_invariant = {};
};

const CollectiveRule& CollectiveRuleFor(Collective c);
// c's transpose (invariant: of its To::kI form).
const CollectiveTranspose& TransposeOf(Collective c, bool invariant);

// The first axis of mask whose type r rejects (dim: the op's dim, -1 when it has none), or
// nullopt. Strings are built only on rejection.
std::optional<Rejection> CheckCollective(const CollectiveRule& r, const SpmdType& x,
                                         AxisMask mask, int dim);
// x's type with each axis of mask replaced as r says (dim: the dim the result is sharded or
// gathered along; invariant: kRorI/kGathered give I instead of R).
SpmdType CollectiveResult(const CollectiveRule& r, const SpmdType& x, AxisMask mask, int dim,
                          bool invariant);

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
// c's transpose's rule (and its local step), stated by CotangentType. For every x the rule accepts
// this equals Dual(x) (type_rules_test checks each row).
SpmdType CollectiveCotangentType(Collective c, const SpmdType& x, AxisMask mask, int check_dim,
                                 int result_dim, bool invariant);

}  // namespace shardmap

#endif  // SHARDMAP_SHARDMAP_RULES_TYPE_RULES_COLLECTIVE_H_
