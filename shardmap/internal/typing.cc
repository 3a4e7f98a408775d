#include "shardmap/internal/typing.h"

#include "absl/strings/str_cat.h"
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

}  // namespace shardmap::internal
