#include "shardmap/ops/ops.h"

#include <algorithm>
#include <optional>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "shardmap/runtime/context.h"
#include "shardmap/internal/typing.h"
#include "shardmap/rules/type_rules.h"
#include "tensor/error.h"
#include "tensor/ops/matmul.h"
#include "tensor/ops/reduce.h"
#include "tensor/ops/shape_ops.h"

namespace shardmap {


using internal::BinaryType;
using internal::Checked;
using internal::NeedsTape;
using internal::RecordOp;
using internal::TypeFail;

// ---------------------------------------------------------------------------------------------
// Value basics.

Value Value::Replicated(Tensor t) {
  RankContext& ctx = RankContext::Get("Value::Replicated");
  SpmdType type(ctx.mesh().num_axes(), AxisType::R());
  type.set_mesh_id(ctx.mesh().id());
  return Value(std::move(t), type);
}

Value Value::Invariant(Tensor t) {
  RankContext& ctx = RankContext::Get("Value::Invariant");
  SpmdType type(ctx.mesh().num_axes(), AxisType::I());
  type.set_mesh_id(ctx.mesh().id());
  return Value(std::move(t), type);
}

Value Value::Scalar(double v, DType dtype) {
  // On the running rank's device (a GPU rank's constants live on its GPU), filled there by a
  // kernel rather than copied from the host, so a CUDA-graph capture records the value itself.
  RankContext* ctx = RankContext::Current();
  return Replicated(Tensor::Full({}, v, dtype, ctx != nullptr ? ctx->device() : Device::Cpu()));
}

std::string Value::ToString() const {
  std::string s = tensor.defined() ? tensor.ShapeString() : "undefined";
  RankContext* ctx = RankContext::Current();
  if (ctx != nullptr) return s + type.ToString(ctx->mesh().axis_names());
  return s + type.ToString({});
}

Value Value::matmul(const Value& b, bool ta, bool tb) const {
  return shardmap::matmul(*this, b, ta, tb);
}
Value Value::T() const { return shardmap::transpose(*this, rank() - 2, rank() - 1); }
Value Value::reshape(absl::Span<const int64_t> s) const { return shardmap::reshape(*this, s); }
Value Value::transpose(int d0, int d1) const { return shardmap::transpose(*this, d0, d1); }
Value Value::sum(const std::vector<int>& dims, bool keepdim) const {
  return shardmap::sum(*this, dims, keepdim);
}
Value Value::mean(const std::vector<int>& dims, bool keepdim) const {
  return shardmap::mean(*this, dims, keepdim);
}

namespace {

// Both operands defined and of the running mesh: before any kernel touches them.
void CheckBinaryOperands(const char* op, const Value& a, const Value& b) {
  internal::CheckMesh(op, a, "a");
  internal::CheckMesh(op, b, "b");
}

// The primal value without its tape slot, for capture in VJPs (no cycles, no re-recording).
Value Detached(const Value& v) { return Value(v.tensor, v.type); }

// What a linear op's VJP needs of a primal: its shape and type.
struct PrimalMeta {
  explicit PrimalMeta(const Value& v) : shape(v.shape()), type(v.type) {}
  Shape shape;
  SpmdType type;
};

Value LinearGradTo(const Value& g, const PrimalMeta& m) {
  Value r = g.shape() == m.shape ? g : sum_to_shape(g, m.shape);
  return internal::AsCotangent(std::move(r), m.type);
}

Value BinaryGradTo(const Value& g, const Value& primal) {
  Value r = g.shape() == primal.shape() ? g : sum_to_shape(g, primal.shape());
  return internal::AsCotangent(std::move(r), primal.type);
}

}  // namespace


// ---------------------------------------------------------------------------------------------
// Elementwise.

Value add(const Value& a, const Value& b) {
  CheckBinaryOperands("add", a, b);
  Tensor t = internal::WithTypes("add", {{"a", &a}, {"b", &b}},
                                 [&] { return Add(a.tensor, b.tensor); });
  SpmdType ty = BinaryType("add", a, b, t.shape(), false, false);
  Value out(std::move(t), ty);
  if (NeedsTape(a, b)) {
    // Only the primals' shapes and types are needed (no tensor references kept alive).
    RecordOp("add", {&a, &b}, out,
             [ma = PrimalMeta(a), mb = PrimalMeta(b)](const Value& g, uint32_t need, Value* d) {
               if (need & 1) d[0] = LinearGradTo(g, ma);
               if (need & 2) d[1] = LinearGradTo(g, mb);
             });
  }
  return out;
}

Value sub(const Value& a, const Value& b) {
  CheckBinaryOperands("sub", a, b);
  Tensor t = internal::WithTypes("sub", {{"a", &a}, {"b", &b}},
                                 [&] { return Sub(a.tensor, b.tensor); });
  SpmdType ty = BinaryType("sub", a, b, t.shape(), false, false);
  Value out(std::move(t), ty);
  if (NeedsTape(a, b)) {
    RecordOp("sub", {&a, &b}, out,
             [ma = PrimalMeta(a), mb = PrimalMeta(b)](const Value& g, uint32_t need, Value* d) {
               if (need & 1) d[0] = LinearGradTo(g, ma);
               if (need & 2) d[1] = LinearGradTo(neg(g), mb);
             });
  }
  return out;
}

Value mul(const Value& a, const Value& b) {
  CheckBinaryOperands("mul", a, b);
  Tensor t = internal::WithTypes("mul", {{"a", &a}, {"b", &b}},
                                 [&] { return Mul(a.tensor, b.tensor); });
  SpmdType ty = BinaryType("mul", a, b, t.shape(), true, false);
  Value out(std::move(t), ty);
  if (NeedsTape(a, b)) {
    RecordOp("mul", {&a, &b}, out,
             [a = Detached(a), b = Detached(b)](const Value& g, uint32_t need, Value* d) {
      if (need & 1) d[0] = BinaryGradTo(g * b, a);
      if (need & 2) d[1] = BinaryGradTo(g * a, b);
    });
  }
  return out;
}

Value div(const Value& a, const Value& b) {
  CheckBinaryOperands("div", a, b);
  Tensor t = internal::WithTypes("div", {{"a", &a}, {"b", &b}},
                                 [&] { return Div(a.tensor, b.tensor); });
  SpmdType ty = BinaryType("div", a, b, t.shape(), true, true);
  Value out(std::move(t), ty);
  if (NeedsTape(a, b)) {
    Value o = out;
    RecordOp("div", {&a, &b}, out,
             [a = Detached(a), b = Detached(b), o](const Value& g, uint32_t need, Value* d) {
      if (need & 1) d[0] = BinaryGradTo(g / b, a);
      // d(a/b)/db = -(a/b)/b; o is a/b without its tape slot.
      if (need & 2) d[1] = BinaryGradTo(neg(g * Value(o.tensor, o.type) / b), b);
    });
  }
  return out;
}

Value neg(const Value& a) {
  internal::CheckMesh("neg", a);
  Value out(Neg(a.tensor), a.type);
  if (NeedsTape(a)) {
    RecordOp("neg", {&a}, out, [](const Value& g, uint32_t, Value* d) { d[0] = neg(g); });
  }
  return out;
}

Value add_scalar(const Value& a, double s) {
  internal::CheckMesh("add_scalar", a);
  if (Checked()) {
    for (int i = 0; i < a.type.num_axes(); ++i) {
      if (a.type[i].kind == AxisKind::kP) {
        TypeFail("add_scalar", i,
                 "adds a constant to a partial sum (P): it would be added once per device",
                 "all_reduce x first", {{"x", &a}});
      }
    }
  }
  Value out(AddScalar(a.tensor, s), a.type);
  if (NeedsTape(a)) {
    RecordOp("add_scalar", {&a}, out, [](const Value& g, uint32_t, Value* d) { d[0] = g; });
  }
  return out;
}

Value mul_scalar(const Value& a, double s) {
  internal::CheckMesh("mul_scalar", a);
  Value out(MulScalar(a.tensor, s), a.type);
  if (NeedsTape(a)) {
    RecordOp("mul_scalar", {&a}, out,
             [s](const Value& g, uint32_t, Value* d) { d[0] = mul_scalar(g, s); });
  }
  return out;
}

namespace {

// Backward kernels: multilinear in dy with the primal-derived operand acting as an R factor of
// the same type as the primal.
SpmdType GradKernelType(const char* op, const Value& x, const Value& dy) {
  return internal::ElementwiseType(op, x, dy, dy.shape(), true);
}

}  // namespace

Value relu_grad(const Value& x, const Value& dy) {
  const SpmdType t = GradKernelType("relu_grad", x, dy);
  return Value(ReluGrad(x.tensor, dy.tensor), t);
}
Value gelu_grad(const Value& x, const Value& dy, GeluApprox approx) {
  const SpmdType t = GradKernelType("gelu_grad", x, dy);
  return Value(GeluGrad(x.tensor, dy.tensor, approx), t);
}
Value silu_grad(const Value& x, const Value& dy) {
  const SpmdType t = GradKernelType("silu_grad", x, dy);
  return Value(SiluGrad(x.tensor, dy.tensor), t);
}
Value tanh_grad(const Value& y, const Value& dy) {
  const SpmdType t = GradKernelType("tanh_grad", y, dy);
  return Value(TanhGrad(y.tensor, dy.tensor), t);
}


namespace {

// A unary nonlinear op: the kernel's result y = f(x) typed by NonlinearType, and on the tape
// d = vjp(saved, g), where saved is x or, for ops whose derivative is cheaper from it, y.
enum class Saves { kInput, kOutput };

// The kernel runs after the type check (never on an undefined or foreign operand).
template <typename Kernel, typename Vjp>
Value UnaryNonlinear(const char* op, const Value& x, Kernel kernel, Saves saves, Vjp vjp) {
  const SpmdType t = internal::NonlinearTypeOf(op, x);
  Value out(kernel(x.tensor), t);
  if (NeedsTape(x)) {
    Value saved = Detached(saves == Saves::kOutput ? out : x);
    RecordOp(op, {&x}, out,
             [saved, vjp](const Value& g, uint32_t, Value* d) { d[0] = vjp(saved, g); });
  }
  return out;
}

}  // namespace

Value exp(const Value& x) {
  return UnaryNonlinear("exp", x, [](const Tensor& t) { return Exp(t); }, Saves::kOutput,
                        [](const Value& y, const Value& g) { return g * y; });
}

Value log(const Value& x) {
  return UnaryNonlinear("log", x, [](const Tensor& t) { return Log(t); }, Saves::kInput,
                        [](const Value& xd, const Value& g) { return g / xd; });
}

Value tanh(const Value& x) {
  return UnaryNonlinear("tanh", x, [](const Tensor& t) { return Tanh(t); }, Saves::kOutput,
                        [](const Value& y, const Value& g) { return tanh_grad(y, g); });
}

Value relu(const Value& x) {
  return UnaryNonlinear("relu", x, [](const Tensor& t) { return Relu(t); }, Saves::kInput,
                        [](const Value& xd, const Value& g) { return relu_grad(xd, g); });
}

Value sqrt(const Value& x) {
  return UnaryNonlinear("sqrt", x, [](const Tensor& t) { return Sqrt(t); }, Saves::kOutput,
                        [](const Value& y, const Value& g) { return mul_scalar(g / y, 0.5); });
}

Value gelu(const Value& x, GeluApprox approx) {
  return UnaryNonlinear("gelu", x, [approx](const Tensor& t) { return Gelu(t, approx); },
                        Saves::kInput,
                        [approx](const Value& xd, const Value& g) {
                          return gelu_grad(xd, g, approx);
                        });
}

Value silu(const Value& x) {
  return UnaryNonlinear("silu", x, [](const Tensor& t) { return Silu(t); }, Saves::kInput,
                        [](const Value& xd, const Value& g) { return silu_grad(xd, g); });
}

// ---------------------------------------------------------------------------------------------
// Matmul.

namespace {

struct MatmulDims {
  int a_contract, a_free, b_contract, b_free, out_rank;
  bool batched;
};

MatmulDims GetMatmulDims(const Value& a, const Value& b, bool ta, bool tb) {
  MatmulDims m;
  int ar = a.rank(), br = b.rank();
  m.a_contract = ta ? ar - 2 : ar - 1;
  m.a_free = ta ? ar - 1 : ar - 2;
  m.b_contract = tb ? br - 1 : br - 2;
  m.b_free = tb ? br - 2 : br - 1;
  m.out_rank = ar;
  m.batched = br > 2;
  return m;
}

SpmdType MatmulType(const Value& a, const Value& b, bool ta, bool tb) {
  internal::CheckMesh("matmul", a);
  internal::CheckMesh("matmul", b);
  if (!Checked()) return internal::ErasedJoin(a.type, b.type);
  std::optional<Rejection> no;
  SpmdType t = MatmulRule(a.type, a.rank(), b.type, b.rank(), ta, tb,
                          RankContext::Get("matmul").mesh().axis_names(), no);
  if (no) TypeFail("matmul", no->axis, no->rule, no->fix, {{"a", &a}, {"b", &b}});
  internal::StampOrigins("matmul", t, {{"a", &a}, {"b", &b}}, "a contraction of unknown layout",
                         "all_gather the operand of unknown layout first");
  return t;
}

}  // namespace

namespace {

// Local contracted sizes that differ are usually a spec mistake: one operand's contracted dim is
// sharded and the other's is whole. Says so with the SPMD types, before the kernel's plain
// shape error.
void CheckContractedSizes(const Value& a, const Value& b, bool ta, bool tb) {
  if (a.rank() < 2 || b.rank() < 2) return;  // the kernel reports the ranks
  const MatmulDims m = GetMatmulDims(a, b, ta, tb);
  const int64_t ka = a.dim(m.a_contract), kb = b.dim(m.b_contract);
  if (ka == kb) return;
  std::string hints;
  for (int i = 0; i < a.type.num_axes() && i < b.type.num_axes(); ++i) {
    const bool sa = a.type[i].is_sharded() && a.type[i].dim == m.a_contract;
    const bool sb = b.type[i].is_sharded() && b.type[i].dim == m.b_contract;
    if (sa == sb) continue;
    const std::string ax = internal::AxisName(i);
    const char* sharded = sa ? "a" : "b";
    const char* whole = sa ? "b" : "a";
    const int sharded_dim = sa ? m.a_contract : m.b_contract;
    const int whole_dim = sa ? m.b_contract : m.a_contract;
    absl::StrAppend(&hints, " ", sharded, "'s contracted dim ", sharded_dim, " is sharded over '",
                    ax, "' but ", whole, "'s dim ", whole_dim, " is whole: shard ", whole,
                    "'s dim ", whole_dim, " over '", ax,
                    "' too (its in_spec; a row-parallel matmul then gives a partial sum), or "
                    "all_gather(", sharded, ", ", sharded_dim, ", \"", ax, "\") first.");
  }
  OpFail("matmul: ", a.ToString(), " @ ", b.ToString(), ": the contracted dims differ on this "
         "device (", ka, " vs ", kb, ").", hints.empty() ? " Check the operands' shapes." : hints);
}

}  // namespace

Value matmul(const Value& a, const Value& b, bool ta, bool tb) {
  SpmdType type = MatmulType(a, b, ta, tb);
  CheckContractedSizes(a, b, ta, tb);
  Value out(internal::WithTypes("matmul", {{"a", &a}, {"b", &b}},
                                [&] { return Matmul(a.tensor, b.tensor, ta, tb); }),
            type);
  if (NeedsTape(a, b)) {
    RecordOp("matmul", {&a, &b}, out, [ad = Detached(a), bd = Detached(b), ta, tb](
                                          const Value& g, uint32_t need, Value* d) {
      if (need & 1) {
        Value da = ta ? matmul(bd, g, tb, true) : matmul(g, bd, false, !tb);
        d[0] = internal::AsCotangent(std::move(da), ad.type);
      }
      if (need & 2) {
        Value db;
        if (bd.rank() == 2 && ad.rank() > 2) {
          Value a2 = reshape(ad, {-1, ad.dim(-1)});
          Value g2 = reshape(g, {-1, g.dim(-1)});
          db = tb ? matmul(g2, a2, true, false) : matmul(a2, g2, true, false);
        } else {
          db = tb ? matmul(g, ad, true, ta) : matmul(ad, g, !ta, false);
        }
        d[1] = internal::AsCotangent(std::move(db), bd.type);
      }
    });
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Reductions.

namespace {

std::vector<int> NormalizeDims(const std::vector<int>& dims, int rank) {
  std::vector<int> out;
  if (dims.empty()) {
    out.resize(rank);
    std::iota(out.begin(), out.end(), 0);
    return out;
  }
  for (int d : dims) out.push_back(d < 0 ? d + rank : d);
  std::sort(out.begin(), out.end());
  return out;
}

// partial: sharded reduced dims give P (sum_partial); otherwise they are an error naming `op`.
SpmdType ReduceType(const char* op, const Value& x, const std::vector<int>& nd, bool keepdim,
                    bool partial, bool linear) {
  internal::CheckMesh(op, x);
  if (!Checked()) {
    SpmdType t = internal::ErasedUnary(x.type);
    if (partial) {
      for (int i = 0; i < t.num_axes(); ++i) {
        if (t[i].kind == AxisKind::kV) t[i].kind = AxisKind::kP;
      }
    }
    return t;
  }
  std::optional<Rejection> no;
  if (partial && static_cast<int>(nd.size()) == x.rank()) internal::CheckNotMixed(op, x);
  SpmdType t = ReduceRule(op, x.type, x.rank(), nd, keepdim, partial, linear,
                          RankContext::Get(op).mesh().axis_names(), no);
  if (no) TypeFail(op, no->axis, no->rule, no->fix, {{"x", &x}});
  return t;
}

Shape KeepdimShape(const Shape& in, const std::vector<int>& nd) {
  Shape s = in;
  for (int d : nd) s[d] = 1;
  return s;
}

}  // namespace

Value sum(const Value& x, const std::vector<int>& dims, bool keepdim) {
  std::vector<int> nd = NormalizeDims(dims, x.rank());
  const SpmdType t = ReduceType("sum", x, nd, keepdim, false, true);
  Value out(Sum(x.tensor, nd, keepdim), t);
  if (NeedsTape(x)) {
    Shape ks = KeepdimShape(x.shape(), nd);
    Shape xs = x.shape();
    RecordOp("sum", {&x}, out, [ks, xs](const Value& g, uint32_t, Value* d) {
      d[0] = broadcast_to(reshape(g, ks), xs);
    });
  }
  return out;
}

Value sum_partial(const Value& x, const std::vector<int>& dims, bool keepdim) {
  std::vector<int> nd = NormalizeDims(dims, x.rank());
  const SpmdType t = ReduceType("sum_partial", x, nd, keepdim, true, true);
  Value out(Sum(x.tensor, nd, keepdim), t);
  if (NeedsTape(x)) {
    Shape ks = KeepdimShape(x.shape(), nd);
    Shape xs = x.shape();
    SpmdType xt = x.type;
    RecordOp("sum_partial", {&x}, out, [ks, xs, xt](const Value& g, uint32_t, Value* d) {
      // The cotangent of a P axis is R: every shard gets the same gradient (a valid V).
      d[0] = internal::AsCotangent(broadcast_to(reshape(g, ks), xs), xt);
    });
  }
  return out;
}

Value mean(const Value& x, const std::vector<int>& dims, bool keepdim) {
  std::vector<int> nd = NormalizeDims(dims, x.rank());
  int64_t count = 1;
  for (int d : nd) count *= x.dim(d);
  const SpmdType t = ReduceType("mean", x, nd, keepdim, false, true);
  Value out(Mean(x.tensor, nd, keepdim), t);
  if (NeedsTape(x)) {
    Shape ks = KeepdimShape(x.shape(), nd);
    Shape xs = x.shape();
    double scale = 1.0 / static_cast<double>(count);
    RecordOp("mean", {&x}, out, [ks, xs, scale](const Value& g, uint32_t, Value* d) {
      d[0] = broadcast_to(reshape(mul_scalar(g, scale), ks), xs);
    });
  }
  return out;
}

Value sum_to_shape(const Value& dy, absl::Span<const int64_t> shape) {
  int off = dy.rank() - static_cast<int>(shape.size());
  std::vector<int> nd;
  for (int d = 0; d < dy.rank(); ++d) {
    if (d < off || (shape[d - off] == 1 && dy.dim(d) != 1)) nd.push_back(d);
  }
  SpmdType t = ReduceType("sum_to_shape", dy, nd, true, true, true);
  // Re-index S dims from dy's rank to shape's rank.
  for (int i = 0; i < t.num_axes(); ++i) {
    if (t[i].is_sharded()) t[i] = AxisType::Sharded(t[i].dim - off);
  }
  return Value(SumToShape(dy.tensor, shape), t);
}

Value broadcast_to(const Value& x, absl::Span<const int64_t> shape) {
  internal::CheckMesh("broadcast_to", x);
  if (x.shape() == Shape(shape.begin(), shape.end())) return Detached(x);
  Tensor z = Tensor::Zeros(shape, x.dtype(), x.tensor.device());
  Tensor t = Add(z, x.tensor);
  SpmdType ty = BroadcastRule(x.type, x.shape(), t.shape());
  internal::StampOrigins("broadcast_to", ty, {{"x", &x}},
                         "broadcasts a sharded dim of local size 1, so the layout is lost",
                         "broadcast before sharding, or all_gather that dim first");
  Value out(std::move(t), ty);
  if (NeedsTape(x)) {
    Shape xs = x.shape();
    SpmdType xt = x.type;
    RecordOp("broadcast_to", {&x}, out, [xs, xt](const Value& g, uint32_t, Value* d) {
      d[0] = internal::AsCotangent(sum_to_shape(g, xs), xt);
    });
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Layout.

Value reshape(const Value& x, absl::Span<const int64_t> shape) {
  internal::CheckMesh("reshape", x);
  Tensor t = internal::WithTypes("reshape", {{"x", &x}}, [&] { return x.tensor.Reshape(shape); });
  SpmdType ty = Checked() ? ReshapeRule(x.type, x.shape(), t.shape())
                          : internal::ErasedUnary(x.type);
  if (internal::HasUnstampedV(ty)) internal::StampOrigins(
      absl::StrCat("reshape to ", t.ShapeString()), ty, {{"x", &x}},
      "the reshape splits or merges a sharded dim so that no output dim holds whole shards",
      "keep the sharded dim whole (or outermost among the dims it splits into: e.g. heads as "
      "[kv, rep], not [rep, kv]), or all_gather it before the reshape");
  Value out(std::move(t), ty);
  if (NeedsTape(x)) {
    Shape xs = x.shape();
    RecordOp("reshape", {&x}, out, [xs, xt = x.type](const Value& g, uint32_t, Value* d) {
      d[0] = internal::AsCotangent(reshape(g, xs), xt);
    });
  }
  return out;
}

Value stop_gradient(const Value& x) {
  internal::CheckMesh("stop_gradient", x);
  return Detached(x);
}

Value permute(const Value& x, const std::vector<int>& perm) {
  internal::CheckMesh("permute", x);
  Tensor t = Permute(x.tensor, perm);
  Value out(std::move(t), PermuteRule(x.type, perm, x.rank()));
  if (NeedsTape(x)) {
    std::vector<int> inv(perm.size());
    for (size_t k = 0; k < perm.size(); ++k) {
      inv[perm[k] < 0 ? perm[k] + x.rank() : perm[k]] = static_cast<int>(k);
    }
    RecordOp("permute", {&x}, out,
             [inv](const Value& g, uint32_t, Value* d) { d[0] = permute(g, inv); });
  }
  return out;
}

Value transpose(const Value& x, int d0, int d1) {
  std::vector<int> perm(x.rank());
  std::iota(perm.begin(), perm.end(), 0);
  if (d0 < 0) d0 += x.rank();
  if (d1 < 0) d1 += x.rank();
  if (d0 < 0 || d1 < 0 || d0 >= x.rank() || d1 >= x.rank()) {
    OpFail("transpose: dims ", d0, ",", d1, " out of range for ", x.ToString());
  }
  std::swap(perm[d0], perm[d1]);
  return permute(x, perm);
}

Value slice(const Value& x, int dim, int64_t start, int64_t length) {
  internal::CheckMesh("slice", x);
  if (dim < 0) dim += x.rank();
  Tensor t = Slice(x.tensor, dim, start, length);
  SpmdType ty = SliceRule(x.type, dim);
  internal::StampOrigins("slice", ty, {{"x", &x}},
                         "slices a sharded dim, so each device keeps a piece of its own shard",
                         "slice the whole tensor before sharding it, or all_gather it first");
  Value out(std::move(t), ty);
  if (NeedsTape(x)) {
    Shape xs = x.shape();
    SpmdType xt = x.type;
    RecordOp("slice", {&x}, out, [xs, xt, dim, start](const Value& g, uint32_t, Value* d) {
      Tensor z = Tensor::Zeros(xs, g.dtype(), g.tensor.device());
      SliceAssign(z, dim, start, g.tensor);
      d[0] = internal::AsCotangent(Value(std::move(z), g.type), xt);
    });
  }
  return out;
}

Value concat(const std::vector<Value>& parts, int dim) {
  for (const Value& p : parts) internal::CheckMesh("concat", p);
  if (parts.empty()) OpFail("concat: no parts");
  if (dim < 0) dim += parts[0].rank();
  std::vector<Tensor> ts;
  ts.reserve(parts.size());
  for (const Value& p : parts) ts.push_back(p.tensor);
  Tensor t = Concat(ts, dim);
  SpmdType ty = parts[0].type;
  for (size_t k = 1; k < parts.size(); ++k) {
    ty = internal::ElementwiseType("concat", Value(parts[0].tensor, ty), parts[k], t.shape(),
                                   false);
  }
  Value out(std::move(t), SliceRule(ty, dim));
  bool any = false;
  for (const Value& p : parts) any |= p.node >= 0;
  if (any && CurrentRecorder() != nullptr) {
    std::vector<Value> ps;
    for (const Value& p : parts) ps.push_back(Detached(p));
    // The recorder takes an initializer_list: record pairwise-free by nesting is not possible,
    // so concat records through a small fixed-arity list (up to 8 parts); more parts are folded.
    if (parts.size() > 8) {
      std::vector<Value> head(parts.begin(), parts.begin() + 7);
      std::vector<Value> tail(parts.begin() + 7, parts.end());
      head.push_back(concat(tail, dim));
      return concat(head, dim);
    }
    const Value* p[8] = {};
    for (size_t k = 0; k < parts.size(); ++k) p[k] = &parts[k];
    auto vjp = [ps, dim](const Value& g, uint32_t need, Value* d) {
      int64_t off = 0;
      for (size_t k = 0; k < ps.size(); ++k) {
        int64_t len = ps[k].dim(dim);
        if (need & (1u << k)) {
          d[k] = internal::AsCotangent(slice(g, dim, off, len), ps[k].type);
        }
        off += len;
      }
    };
    switch (parts.size()) {
      case 1: RecordOp("concat", {p[0]}, out, vjp); break;
      case 2: RecordOp("concat", {p[0], p[1]}, out, vjp); break;
      case 3: RecordOp("concat", {p[0], p[1], p[2]}, out, vjp); break;
      case 4: RecordOp("concat", {p[0], p[1], p[2], p[3]}, out, vjp); break;
      case 5: RecordOp("concat", {p[0], p[1], p[2], p[3], p[4]}, out, vjp); break;
      case 6: RecordOp("concat", {p[0], p[1], p[2], p[3], p[4], p[5]}, out, vjp); break;
      case 7: RecordOp("concat", {p[0], p[1], p[2], p[3], p[4], p[5], p[6]}, out, vjp); break;
      default:
        RecordOp("concat", {p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7]}, out, vjp);
    }
  }
  return out;
}

Value cast(const Value& x, DType dtype) {
  internal::CheckMesh("cast", x);
  Value out(Cast(x.tensor, dtype), x.type);
  if (NeedsTape(x)) {
    DType from = x.dtype();
    RecordOp("cast", {&x}, out,
             [from](const Value& g, uint32_t, Value* d) { d[0] = cast(g, from); });
  }
  return out;
}

}  // namespace shardmap
