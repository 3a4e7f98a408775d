#include "shardmap/routing_ops.h"

#include "shardmap/context.h"
#include "shardmap/internal/typing.h"
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
  const int na = x.type.num_axes();
  SpmdType t(na);
  t.set_mesh_id(x.type.mesh_id());
  if (!ctx.checked()) return internal::ErasedJoin(x.type, internal::ErasedUnary(rows.type));
  for (int i = 0; i < na; ++i) {
    const AxisKind a = x.type[i].kind, b = rows.type[i].kind;
    if (b == AxisKind::kP) {
      TypeFail(op, i, "the row indices are a partial sum (P)",
               "indices must be per-device integers (R, I or V); all_reduce them first",
               {{"x", &x}, {"rows", &rows}});
    }
    if (a == AxisKind::kP) {
      if (b == AxisKind::kV) {
        TypeFail(op, i,
                 "x is a partial sum (P) but the row indices vary: each device would pick "
                 "different rows of its addend",
                 "all_reduce x first (or index with the same rows on every device)",
                 {{"x", &x}, {"rows", &rows}});
      }
      t[i] = AxisType::P();
    } else if (a == AxisKind::kI || b == AxisKind::kI) {
      if ((a == AxisKind::kI) != (b == AxisKind::kI) &&
          !(a == AxisKind::kI && b == AxisKind::kR)) {
        TypeFail(op, i, "an invariant (I) value mixes only with I (or R) indices",
                 "convert it with convert(.., axis, Convert::kIToR) first",
                 {{"x", &x}, {"rows", &rows}});
      }
      t[i] = AxisType::I();
    } else if (a == AxisKind::kV || b == AxisKind::kV) {
      t[i] = AxisType::V();
    } else {
      t[i] = AxisType::R();
    }
  }
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
