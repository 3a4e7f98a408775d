#include "shardmap/ops/routing_ops.h"

#include <optional>

#include "shardmap/runtime/context.h"
#include "shardmap/internal/typing.h"
#include "shardmap/rules/type_rules.h"
#include "tensor/error.h"
#include "tensor/ops/routing.h"

namespace shardmap {

using internal::NeedsTape;
using internal::RecordOp;
using internal::TypeFail;

namespace {

// The type of gather_rows(x, rows) / scatter_add_rows(x, rows, n) (see the header).
SpmdType RowOpType(const char* op, const Value& x, const Value& rows) {
  internal::CheckMesh(op, x);
  internal::CheckMesh(op, rows);
  RankContext& ctx = RankContext::Get(op);
  if (!ctx.checked()) return internal::ErasedJoin(x.type, internal::ErasedUnary(rows.type));
  std::optional<Rejection> no;
  SpmdType t = RowOpRule(x.type, rows.type, no);  // rules/type_rules_routing.h
  if (no) TypeFail(op, no->axis, no->rule, no->fix, {{"x", &x}, {"rows", &rows}});
  internal::StampOrigins(op, t, {{"x", &x}, {"rows", &rows}},
                         "a routing op picks rows by per-device indices (MoE dispatch)",
                         "route tokens with the same indices on every device, or combine the "
                         "routed rows back (scatter_add_rows, all_to_all) before this op",
                         VKind::kIntended);
  return t;
}

}  // namespace

TopKValues top_k(const Value& x, int64_t k) {
  internal::CheckMesh("top_k", x);
  SpmdType t = internal::NonlinearTypeOf("top_k", x);
  internal::CheckDimNotSharded("top_k", x, -1,
                               "all_gather x along its last dim first (top-k needs every "
                               "candidate on each device)");
  TopKResult r = TopK(x.tensor, k);
  TopKValues out{Value(std::move(r.values), t), Value(r.indices, t)};
  if (NeedsTape(x)) {
    const Tensor indices = r.indices;
    const int64_t n = x.dim(-1);
    RecordOp("top_k", {&x}, out.values, [indices, n](const Value& g, uint32_t, Value* d) {
      d[0] = Value(TopKBackward(g.tensor, indices, n), g.type);
    });
  }
  return out;
}

Value gather_rows(const Value& x, const Value& rows) {
  SpmdType t = RowOpType("gather_rows", x, rows);
  Value out(GatherRows(x.tensor, rows.tensor), t);
  if (NeedsTape(x)) {
    const Tensor idx = rows.tensor;
    const Shape xs = x.shape();
    const SpmdType xt = x.type;
    RecordOp("gather_rows", {&x}, out, [idx, xs, xt](const Value& g, uint32_t, Value* d) {
      int64_t n = xs.empty() ? 0 : 1;  // rows: all but the last dim
      for (size_t i = 0; i + 1 < xs.size(); ++i) n *= xs[i];
      d[0] = Value(ScatterAddRows(g.tensor, idx, n).Reshape(xs), Dual(xt));
    });
  }
  return out;
}

Value scatter_add_rows(const Value& x, const Value& rows, int64_t n) {
  SpmdType t = RowOpType("scatter_add_rows", x, rows);
  Value out(ScatterAddRows(x.tensor, rows.tensor, n), t);
  if (NeedsTape(x)) {
    const Tensor idx = rows.tensor;
    const Shape xs = x.shape();
    const SpmdType xt = x.type;
    RecordOp("scatter_add_rows", {&x}, out, [idx, xs, xt](const Value& g, uint32_t, Value* d) {
      d[0] = Value(GatherRows(g.tensor, idx).Reshape(xs), Dual(xt));
    });
  }
  return out;
}

}  // namespace shardmap
