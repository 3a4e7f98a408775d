#include "shardmap/internal/typing.h"

#include <optional>

#include "absl/strings/str_cat.h"
#include "shardmap/mesh.h"
#include "tensor/error.h"

namespace shardmap::internal {

std::string AxisName(int axis) {
  RankContext* ctx = RankContext::Current();
  if (ctx != nullptr && axis >= 0 && axis < ctx->mesh().num_axes()) {
    return ctx->mesh().axis_names()[axis];
  }
  return absl::StrCat("a", axis);
}

namespace {

std::string OperandsString(std::initializer_list<Operand> operands) {
  std::string s;
  for (const Operand& o : operands) {
    if (o.value == nullptr || !o.value->defined()) continue;
    absl::StrAppend(&s, s.empty() ? "" : ", ", o.name, "=", o.value->ToString());
  }
  return s;
}

// "; x is V (layout unknown) on 'tp' since ...", or "" when no operand's V has an origin.
std::string OriginSentence(std::initializer_list<Operand> operands, int axis,
                           const VOrigin** found) {
  const char* name = nullptr;
  int at = -1;
  const VOrigin* o = FindOperandOrigin(operands, axis, &name, &at);
  if (found != nullptr) *found = o;
  if (o == nullptr) return "";
  return absl::StrCat(". ", DescribeVOrigin(name, AxisName(at), *o));
}

}  // namespace

const VOrigin* FindOperandOrigin(std::initializer_list<Operand> operands, int axis,
                                 const char** operand, int* axis_out) {
  for (const Operand& o : operands) {
    if (o.value == nullptr || !o.value->defined()) continue;
    const SpmdType& t = o.value->type;
    for (int i = axis >= 0 ? axis : 0; i < (axis >= 0 ? axis + 1 : t.num_axes()); ++i) {
      if (i >= t.num_axes() || !t[i].is_unknown_v()) continue;
      if (const VOrigin* r = FindVOrigin(t[i].origin)) {
        *operand = o.name;
        *axis_out = i;
        return r;
      }
    }
  }
  return nullptr;
}

void StampOrigins(std::string_view op, SpmdType& out, std::initializer_list<Operand> operands,
                  std::string_view reason, std::string_view fix, VKind kind) {
  if (!HasUnstampedV(out)) return;
  for (int i = 0; i < out.num_axes(); ++i) {
    if (!out[i].is_unknown_v() || out[i].origin != 0) continue;
    bool operand_v = false;
    for (const Operand& o : operands) {
      if (o.value == nullptr || !o.value->defined() || i >= o.value->type.num_axes()) continue;
      const AxisType a = o.value->type[i];
      if (!a.is_unknown_v()) continue;
      operand_v = true;
      if (a.origin != 0) {
        out[i].origin = a.origin;
        break;
      }
    }
    if (operand_v) continue;  // an operand's V without a recorded origin: not this op's doing
    out[i].origin = RecordVOrigin(VOrigin{std::string(op), std::string(reason),
                                          OperandsString(operands), std::string(fix), kind});
  }
}

void CheckNotMixed(const char* op, const Value& x) {
  if (!Checked()) return;
  for (int i = 0; i < x.type.num_axes(); ++i) {
    if (!x.type[i].is_unknown_v()) continue;
    const VOrigin* o = FindVOrigin(x.type[i].origin);
    if (o == nullptr || o->kind != VKind::kMixed) continue;
    TypeFail(op, i,
             "sums a V whose devices hold no pieces of one whole (it mixed operands sharded on "
             "different dims), so the sum is no partial sum (P) of anything",
             o->fix, {{"x", &x}});
  }
}

void RethrowWithTypes(const char* op, std::initializer_list<Operand> operands, const OpError& e) {
  std::string msg(e.status().message());
  absl::StrAppend(&msg, ". SPMD types (", op, "): ", OperandsString(operands),
                  OriginSentence(operands, -1, nullptr));
  throw OpError(absl::Status(e.status().code(), msg));
}

void TypeFail(const char* op, int axis, const std::string& rule, const std::string& fix,
              std::initializer_list<Operand> operands) {
  std::string msg = absl::StrCat(op, ": ", rule);
  if (axis >= 0) absl::StrAppend(&msg, " on axis '", AxisName(axis), "'");
  msg += ". operands: ";
  bool first = true;
  for (const Operand& o : operands) {
    absl::StrAppend(&msg, first ? "" : ", ", o.name, "=", o.value->ToString());
    first = false;
  }
  const VOrigin* origin = nullptr;
  msg += OriginSentence(operands, axis, &origin);
  if (origin != nullptr && !origin->intended()) {
    // The cause is the op that made the V; a cast here would make the wrong values look right.
    absl::StrAppend(&msg, ". Fix: at ", origin->op, ": ", origin->fix,
                    ". Do not cast the V away here (reinterpret, convert): its values are not "
                    "the shards or addends the program means");
  } else {
    absl::StrAppend(&msg, ". Fix: ", fix);
  }
  throw OpError(absl::InvalidArgumentError(msg));
}

void UndefinedOperandFail(const char* op, const char* operand) {
  OpFail(op, ": ", operand != nullptr ? absl::StrCat("operand '", operand, "'") : "an operand",
         " is an undefined Value (default-constructed, or moved from), but the op needs it; "
         "pass a computed Value (only optional operands, such as layer_norm's gamma and beta, "
         "may be left undefined)");
}

void ForeignMeshFail(const char* op, const Value& v) {
  const Mesh& mesh = RankContext::Get(op).mesh();
  OpFail(op, ": an operand of type ", v.tensor.ShapeString(), v.type.ToString({}),
         " belongs to another mesh (",
         v.type.mesh_id() != 0 ? "its mesh id differs" : "its number of axes differs",
         ") than the running program's ", mesh.ShortString(),
         ", so its per-axis types would be read against the wrong axes. A Value lives inside the "
         "shard_map or RunSpmd that made it: pass the tensor (v.tensor) as an input of this "
         "shard_map instead, with a spec for this mesh");
}

bool Checked() { return RankContext::Get("typed op").checked(); }

SpmdType BinaryType(const char* op, const Value& a, const Value& b, const Shape& out,
                    bool multilinear, bool divide) {
  if (!Checked()) return ErasedJoin(a.type, b.type);
  std::optional<Rejection> no;
  SpmdType t = ElementwiseRule(op, a.type, a.shape(), b.type, b.shape(), out, multilinear,
                               divide, no);
  if (no) TypeFail(op, no->axis, no->rule, no->fix, {{"a", &a}, {"b", &b}});
  // A new V: both operands sharded over the axis on dims that do not line up (mixed), or a
  // sharded dim of local size 1 broadcast (its layout lost).
  bool mixed = false;
  for (int i = 0; i < t.num_axes(); ++i) {
    mixed |= t[i].is_unknown_v() && a.type[i].is_sharded() && b.type[i].is_sharded();
  }
  StampOrigins(op, t, {{"a", &a}, {"b", &b}},
               mixed ? "its operands are sharded over this axis on dims that do not line up, so "
                       "each device combines pieces of different dims"
                     : "a sharded dim of local size 1 is broadcast, so the layout is lost",
               mixed ? "give both operands the same sharding on this axis (all_gather one of "
                       "them, or permute/reshape it so the sharded dims line up)"
                     : "broadcast before sharding, or all_gather the size-1 dim first",
               mixed ? VKind::kMixed : VKind::kLayoutLost);
  return t;
}

SpmdType ElementwiseType(const char* op, const Value& a, const Value& b, const Shape& out,
                         bool multilinear) {
  CheckMesh(op, a, "a");
  CheckMesh(op, b, "b");
  return BinaryType(op, a, b, out, multilinear, false);
}

SpmdType NonlinearTypeOf(const char* op, const Value& x) {
  CheckMesh(op, x);
  if (!Checked()) return x.type;
  std::optional<Rejection> no;
  NonlinearRule(op, x.type, RankContext::Get(op).mesh().axis_names(), no);
  if (no) TypeFail(op, no->axis, no->rule, no->fix, {{"x", &x}});
  return x.type;
}

void CheckDimNotSharded(const char* op, const Value& x, int dim, const char* fix) {
  if (!Checked()) return;
  std::optional<Rejection> no =
      shardmap::CheckDimNotSharded(x.type, dim < 0 ? dim + x.rank() : dim, fix);
  if (no) TypeFail(op, no->axis, no->rule, no->fix, {{"x", &x}});
}

}  // namespace shardmap::internal
