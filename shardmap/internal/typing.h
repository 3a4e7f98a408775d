// Helpers shared by the typed ops and collectives: context access, tape recording, and the
// construction of type-error messages (built only on failure).
#ifndef SHARDMAP_SHARDMAP_INTERNAL_TYPING_H_
#define SHARDMAP_SHARDMAP_INTERNAL_TYPING_H_

#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

#include "shardmap/runtime/context.h"
#include "shardmap/runtime/tape_hook.h"
#include "shardmap/rules/type_rules.h"
#include "shardmap/v_origin.h"
#include "shardmap/value.h"
#include "tensor/error.h"

namespace shardmap::internal {

struct Operand {
  const char* name;
  const Value* value;
};

// "mul: <rule> on axis 'tp'. operands: a=f32[4,8]{tp:P}, b=f32[8]{tp:P}. Fix: <fix>". When an
// operand is V of unknown layout on that axis with a recorded origin, the message says where it
// came from, and the fix is the origin's unless the program asked for the V (as_varying): a cast
// (reinterpret, convert) would only hide a V that a mistake made.
[[noreturn]] void TypeFail(const char* op, int axis, const std::string& rule,
                           const std::string& fix, std::initializer_list<Operand> operands);

std::string AxisName(int axis);

// The origins (shardmap/v_origin.h) of out's axes that are V of unknown layout and have none
// yet: an operand's that is V of unknown layout on that axis (the first with an origin), or,
// when no operand was, a new record naming this op, why (`reason`), the `fix` and the kind.
// Cheap unless a new record is made.
void StampOrigins(std::string_view op, SpmdType& out, std::initializer_list<Operand> operands,
                  std::string_view reason, std::string_view fix,
                  VKind kind = VKind::kLayoutLost);
// An error when x's V on some axis came from mixed shards (VKind::kMixed): summing it claims
// the devices hold addends of one total, which they do not. Names the origin.
void CheckNotMixed(const char* op, const Value& x);

// Whether t has a V of unknown layout without an origin (StampOrigins has work to do).
inline bool HasUnstampedV(const SpmdType& t) {
  for (int i = 0; i < t.num_axes(); ++i) {
    if (t[i].is_unknown_v() && t[i].origin == 0) return true;
  }
  return false;
}

// The first origin among operands' V-of-unknown-layout axes: on `axis` when axis >= 0, else on
// any axis. Sets *operand and *axis_out to where it was found; nullptr when none.
const VOrigin* FindOperandOrigin(std::initializer_list<Operand> operands, int axis,
                                 const char** operand, int* axis_out);

// Runs f (a kernel call); an OpError it throws (a shape or dtype error) is rethrown with the
// operands' SPMD types and the origins of their V axes appended.
[[noreturn]] void RethrowWithTypes(const char* op, std::initializer_list<Operand> operands,
                                   const OpError& e);
template <typename F>
auto WithTypes(const char* op, std::initializer_list<Operand> operands, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const OpError& e) {
    RethrowWithTypes(op, operands, e);
  }
}

// Throws: v was typed under another mesh than the running program's (a Value kept from one
// shard_map or RunSpmd and used in another), so its axis types would be read against the wrong
// axes.
[[noreturn]] void ForeignMeshFail(const char* op, const Value& v);
// Throws: a required operand is an undefined (default-constructed) Value.
[[noreturn]] void UndefinedOperandFail(const char* op, const char* operand);

// Checks that a required operand is defined and belongs to the running program's mesh (by
// Mesh::id(); a type built without a mesh, id 0, by its number of axes). An undefined Value has
// no type and no mesh: it is reported as undefined, never as foreign. A pointer test and two
// integer compares. operand: its name in the message ("x", "gamma"), or nullptr.
inline void CheckMesh(const char* op, const Value& v, const char* operand = nullptr) {
  if (!v.defined()) UndefinedOperandFail(op, operand);
  const RankContext* ctx = RankContext::Current();
  if (ctx == nullptr) return;  // the op fails on the missing context itself
  const uint32_t id = v.type.mesh_id();
  if ((id != 0 && id != ctx->mesh().id()) || v.type.num_axes() != ctx->mesh().num_axes()) {
    ForeignMeshFail(op, v);
  }
}

// An optional operand (norm weights, a bias): undefined means "left out" and passes; a defined
// one is checked as CheckMesh does. Ops with optional operands must use this, not CheckMesh.
inline void CheckOptionalMesh(const char* op, const Value& v, const char* operand = nullptr) {
  if (v.defined()) CheckMesh(op, v, operand);
}

inline bool NeedsTape(const Value& a) { return a.node >= 0 && CurrentRecorder() != nullptr; }
inline bool NeedsTape(const Value& a, const Value& b) {
  return (a.node >= 0 || b.node >= 0) && CurrentRecorder() != nullptr;
}

template <typename F>
void RecordOp(const char* op, std::initializer_list<const Value*> inputs, Value& out, F&& vjp) {
  CurrentRecorder()->Record(op, inputs, out, VjpFn(std::forward<F>(vjp)));
}

using ::shardmap::ErasedJoin;   // type_rules.h
using ::shardmap::ErasedUnary;

// The running context type-checks (RankContext::checked()).
bool Checked();
// The elementwise binary rule of a and b (already checked by CheckMesh): unchecked, the erased
// join. multilinear=false: linear (add/sub). divide: b is nonlinear. Throws its rejection.
SpmdType BinaryType(const char* op, const Value& a, const Value& b, const Shape& out,
                    bool multilinear, bool divide);
// CheckMesh of a and b, then BinaryType (not dividing).
SpmdType ElementwiseType(const char* op, const Value& a, const Value& b, const Shape& out,
                         bool multilinear);
// CheckMesh of x, then the rule of a unary nonlinear op (x's type, or its rejection).
SpmdType NonlinearTypeOf(const char* op, const Value& x);
// g as the cotangent of a primal of type `primal`: its type as CotangentType (type_rules.h)
// states it from the type the VJP's typed ops derived. Every VJP ends with it, so a cotangent's
// type comes from one place.
inline Value AsCotangent(Value g, const SpmdType& primal) {
  g.type = CotangentType(g.type, primal);
  return g;
}
// Throws when `dim` of x is sharded (S(dim)) on some axis; `fix` says what to do instead.
void CheckDimNotSharded(const char* op, const Value& x, int dim, const char* fix);

}  // namespace shardmap::internal

#endif  // SHARDMAP_SHARDMAP_INTERNAL_TYPING_H_
