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
  absl::StrAppend(&msg, ". Fix: ", fix);
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
