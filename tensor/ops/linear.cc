#include "tensor/ops/linear.h"

#include <algorithm>
#include <vector>

#include "tensor/cpu/vec_math.h"
#include "tensor/cuda/gemm/ops.h"
#include "tensor/error.h"
#include "tensor/internal/accounting.h"
#include "tensor/ops/internal/op_util.h"
#include "tensor/ops/matmul.h"
#include "tensor/ops/reduce.h"
#include "tensor/ops/shape_ops.h"

namespace shardmap {
namespace {

// The dtype the math runs in: f32 for the half types, else the dtype itself.
DType ComputeDType(DType t) { return internal::IsHalf(t) ? DType::kF32 : t; }

// x [..., c] as a rank-2 [rows, c] view.
Tensor Rows(const Tensor& x) {
  return x.Reshape({internal::Prod(x.shape(), 0, x.rank() - 1), x.dim(-1)});
}

void RequireRankAtLeast(const char* op, const Tensor& t, int rank, const char* what) {
  if (t.rank() < rank) {
    OpFail(op, ": ", what, " ", t.ShapeString(), " needs rank >= ", rank);
  }
}

void RequireVector(const char* op, const Tensor& t, int64_t n, const char* what) {
  if (t.rank() != 1 || t.dim(0) != n) {
    OpFail(op, ": ", what, " ", t.ShapeString(), " must have shape [", n, "]");
  }
}

bool HasBias(LinearEpilogue e) {
  return e == LinearEpilogue::kBias || e == LinearEpilogue::kBiasGelu;
}
bool HasGelu(LinearEpilogue e) {
  return e == LinearEpilogue::kGelu || e == LinearEpilogue::kBiasGelu;
}

double Bytes(const Tensor& t) { return t.defined() ? static_cast<double>(t.nbytes()) : 0.0; }
double Bytes(absl::Span<const int64_t> shape, DType dtype) {
  return static_cast<double>(NumElements(shape)) * static_cast<double>(DTypeSize(dtype));
}

// GELU's FLOPs per element, forward and gradient (op_counter.h, as Gelu and GeluGrad count).
double GeluFlops(GeluApprox a) { return a == GeluApprox::kTanh ? 8 : 5; }
double GeluGradFlops(GeluApprox a) { return a == GeluApprox::kTanh ? 14 : 10; }

}  // namespace

LinearResult Linear(const Tensor& x, const Tensor& w, const Tensor& bias, LinearEpilogue epilogue,
                    GeluApprox approx) {
  constexpr const char* kOp = "linear";
  internal::RequireFloating(kOp, x, "x");
  internal::RequireFloating(kOp, w, "w");
  RequireRankAtLeast(kOp, x, 2, "x");
  if (w.rank() != 2) OpFail(kOp, ": w ", w.ShapeString(), " must be rank 2 [k, n]");
  MatmulShape(x, w);  // checks the contracted dims and dtypes
  internal::RequireSameDevice(kOp, x, w);
  if (HasBias(epilogue)) {
    if (!bias.defined()) OpFail(kOp, ": the epilogue adds a bias but bias is undefined");
    internal::RequireSameDType(kOp, x, bias);
    RequireVector(kOp, bias, w.dim(1), "bias");
    internal::RequireSameDevice(kOp, x, bias);
  } else if (bias.defined()) {
    OpFail(kOp, ": bias ", bias.ShapeString(),
           " given to an epilogue without bias (use kBias or kBiasGelu)");
  }
  const bool gelu = HasGelu(epilogue);
  internal::OpScope scope;  // after MatmulShape, whose checks are not an op
  if (scope.counting() || x.is_meta()) {
    const Shape y_shape = MatmulShape(x, w);
    const int64_t k = w.dim(0), n = w.dim(1), rows = n == 0 ? 0 : NumElements(y_shape) / n;
    const double outs = static_cast<double>(NumElements(y_shape));
    if (scope.counting()) {
      internal::RecordGemm(
          scope, "linear", x.dtype(), 1, rows, n, k, false, false,
          Bytes(x) + Bytes(w) + Bytes(bias) + Bytes(y_shape, x.dtype()) * (gelu ? 2 : 1),
          outs * ((HasBias(epilogue) ? 1 : 0) + (gelu ? GeluFlops(approx) : 0)));
    }
    if (x.is_meta()) {  // pre is returned only with GELU, as on the CPU and GPU
      return {Tensor::Empty(y_shape, x.dtype(), x.device()),
              gelu ? Tensor::Empty(y_shape, x.dtype(), x.device()) : Tensor()};
    }
  }
  if (epilogue == LinearEpilogue::kNone) return {Matmul(x, w), Tensor()};
  if (x.is_cuda() && (!gelu || approx == GeluApprox::kTanh)) {
    LinearResult r;
    if (cuda::LinearForward(x, w, bias, gelu, &r.y, &r.pre)) return r;
  }
  // Composed: on the CPU the reference, on the GPU the fallback when cuBLASLt cannot fuse.
  const DType ct = ComputeDType(x.dtype());
  Tensor pre = Matmul(Cast(x, ct), Cast(w, ct));
  LinearResult r;
  if (ct == DType::kF32 && !pre.is_cuda() && gelu && HasBias(epilogue)) {
    // Fused on the CPU: one pass adds the bias into the fresh product and applies GELU.
    const Tensor b = Cast(bias, ct);
    Tensor y = Tensor::Empty(pre.shape(), ct);
    const int64_t n = w.dim(1), rows = n == 0 ? 0 : pre.numel() / n;
    const cpu::VecKernels& k = cpu::Vec();
    (approx == GeluApprox::kTanh ? k.bias_gelu_tanh : k.bias_gelu_erf)(
        pre.data<float>(), b.data<float>(), y.data<float>(), rows, n);
    r.y = Cast(y, x.dtype());
    r.pre = Cast(pre, x.dtype());
    return r;
  }
  if (HasBias(epilogue)) pre = Add(pre, Cast(bias, ct));
  if (gelu) {
    r.y = Cast(Gelu(pre, approx), x.dtype());
    r.pre = Cast(pre, x.dtype());
  } else {
    r.y = Cast(pre, x.dtype());
  }
  return r;
}

LinearGeluGrads LinearGeluBackward(const Tensor& dy, const Tensor& w, const Tensor& pre,
                                   bool bias_grad, GeluApprox approx) {
  constexpr const char* kOp = "linear_gelu_backward";
  internal::RequireFloating(kOp, dy, "dy");
  internal::RequireFloating(kOp, w, "w");
  internal::RequireFloating(kOp, pre, "pre");
  RequireRankAtLeast(kOp, dy, 2, "dy");
  if (w.rank() != 2) OpFail(kOp, ": w ", w.ShapeString(), " must be rank 2 [n, n2]");
  internal::RequireSameDType(kOp, dy, pre);
  const Shape dh_shape = MatmulShape(dy, w, false, true);
  if (dh_shape != pre.shape()) {
    OpFail(kOp, ": dy ", dy.ShapeString(), " @ w ", w.ShapeString(), "^T has shape ",
           ShapeToString(dh_shape), " but pre is ", pre.ShapeString());
  }
  internal::RequireSameDevice(kOp, dy, w);
  internal::RequireSameDevice(kOp, dy, pre);
  internal::OpScope scope;
  const int64_t n = w.dim(0);
  if (scope.counting()) {  // dh = dy @ w^T, then GELU's gradient (and the bias sum) per element
    const double outs = static_cast<double>(pre.numel());
    const int64_t rows = n == 0 ? 0 : pre.numel() / n;
    internal::RecordGemm(scope, kOp, dy.dtype(), 1, rows, n, w.dim(1), false, true,
                         Bytes(dy) + Bytes(w) + 2 * Bytes(pre) +
                             (bias_grad ? Bytes({n}, dy.dtype()) : 0.0),
                         outs * (GeluGradFlops(approx) + (bias_grad ? 1 : 0)));
  }
  if (dy.is_meta()) {
    LinearGeluGrads g;
    g.dpre = Tensor::Empty(pre.shape(), dy.dtype(), dy.device());
    if (bias_grad) g.dbias = Tensor::Empty({n}, dy.dtype(), dy.device());
    return g;
  }
  if (dy.is_cuda() && approx == GeluApprox::kTanh) {
    LinearGeluGrads g;
    if (cuda::LinearGeluBackward(dy, w, pre, bias_grad, &g.dpre, &g.dbias)) return g;
  }
  const DType ct = ComputeDType(dy.dtype());
  Tensor dh = Matmul(Cast(dy, ct), Cast(w, ct), false, true);
  LinearGeluGrads g;
  if (ct == DType::kF32 && !dh.is_cuda() && bias_grad) {
    // Fused on the CPU: dpre overwrites the fresh dh, and each row of it is added into an f64
    // bias gradient while still in cache.
    const Tensor pc = Cast(pre, ct);
    const int64_t rows = n == 0 ? 0 : dh.numel() / n;
    std::vector<double> db(n, 0.0);
    const cpu::VecKernels& k = cpu::Vec();
    (approx == GeluApprox::kTanh ? k.gelu_tanh_grad_bias : k.gelu_erf_grad_bias)(
        pc.data<float>(), dh.data<float>(), dh.data<float>(), db.data(), rows, n);
    g.dpre = Cast(dh, dy.dtype());
    g.dbias = Cast(Tensor::FromVector<double>({n}, db, DType::kF64), dy.dtype());
    return g;
  }
  const Tensor dpre = GeluGrad(Cast(pre, ct), dh, approx);
  g.dpre = Cast(dpre, dy.dtype());
  if (bias_grad) g.dbias = Cast(Sum(Rows(dpre), {0}), dy.dtype());
  return g;
}

LinearWeightGrads LinearWeightGrad(const Tensor& x, const Tensor& dy, bool bias_grad) {
  constexpr const char* kOp = "linear_weight_grad";
  internal::RequireFloating(kOp, x, "x");
  internal::RequireFloating(kOp, dy, "dy");
  internal::RequireSameDType(kOp, x, dy);
  RequireRankAtLeast(kOp, x, 2, "x");
  if (x.rank() != dy.rank() ||
      !std::equal(x.shape().begin(), x.shape().end() - 1, dy.shape().begin())) {
    OpFail(kOp, ": x ", x.ShapeString(), " and dy ", dy.ShapeString(),
           " must have equal leading dims");
  }
  internal::RequireSameDevice(kOp, x, dy);
  internal::OpScope scope;
  const int64_t k = x.dim(-1), n = dy.dim(-1), rows = internal::Prod(x.shape(), 0, x.rank() - 1);
  if (scope.counting()) {  // dw = x^T @ dy over the folded rows; db: 1 flop per dy element
    internal::RecordGemm(scope, kOp, x.dtype(), 1, k, n, rows, true, false,
                         Bytes(x) + Bytes(dy) + Bytes({k, n}, x.dtype()) +
                             (bias_grad ? Bytes({n}, x.dtype()) : 0.0),
                         bias_grad ? static_cast<double>(dy.numel()) : 0.0);
  }
  LinearWeightGrads g;
  if (x.is_meta()) {
    g.dw = Tensor::Empty({k, n}, x.dtype(), x.device());
    if (bias_grad) g.db = Tensor::Empty({n}, x.dtype(), x.device());
    return g;
  }
  if (x.is_cuda() && cuda::LinearWeightGrad(x, dy, bias_grad, &g.dw, &g.db)) return g;
  g.dw = Matmul(Rows(x), Rows(dy), true, false);
  if (bias_grad) g.db = BiasGrad(dy);
  return g;
}

Tensor BiasGrad(const Tensor& dy) {
  constexpr const char* kOp = "bias_grad";
  internal::RequireFloating(kOp, dy, "dy");
  RequireRankAtLeast(kOp, dy, 1, "dy");
  internal::OpScope scope;
  if (scope.counting()) {  // 1 flop per element summed
    scope.Record(kOp, dy.dtype(), dy.rank() == 1 ? 0.0 : static_cast<double>(dy.numel()),
                 Bytes(dy) + Bytes({dy.dim(-1)}, dy.dtype()));
  }
  if (dy.rank() == 1) return dy.Clone();  // no leading dims to sum
  if (dy.is_meta()) return Tensor::Empty({dy.dim(-1)}, dy.dtype(), dy.device());
  if (dy.is_cuda()) return cuda::BiasGrad(dy);
  const DType ct = ComputeDType(dy.dtype());
  return Cast(Sum(Cast(Rows(dy), ct), {0}), dy.dtype());
}

void MatmulAccumulate(Tensor& acc, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  constexpr const char* kOp = "matmul_accumulate";
  const Shape shape = MatmulShape(a, b, trans_a, trans_b);
  internal::RequireFloating(kOp, acc, "accumulator");
  const DType want = a.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
  if (acc.dtype() != want) {
    OpFail(kOp, ": accumulator ", acc.ShapeString(), " must be ", DTypeName(want), " for ",
           DTypeName(a.dtype()), " operands");
  }
  if (acc.shape() != shape) {
    OpFail(kOp, ": accumulator ", acc.ShapeString(), " must have the product's shape ",
           ShapeToString(shape));
  }
  internal::RequireSameDevice(kOp, a, b);
  internal::RequireSameDevice(kOp, acc, a);
  internal::OpScope scope;
  if (scope.counting()) {  // acc is read and written; + 1 flop per element for the add
    const int r = static_cast<int>(shape.size());
    const int64_t k = trans_a ? a.dim(-2) : a.dim(-1), n = shape[r - 1];
    // A rank-2 rhs folds lhs's leading dims into rows (as Matmul does); else they are a batch.
    const int64_t batch = b.rank() == 2 ? 1 : internal::Prod(shape, 0, r - 2);
    const int64_t m = b.rank() == 2 ? internal::Prod(shape, 0, r - 1) : shape[r - 2];
    internal::RecordGemm(scope, kOp, a.dtype(), batch, m, n, k, trans_a, trans_b,
                         Bytes(a) + Bytes(b) + 2 * Bytes(acc), static_cast<double>(acc.numel()));
  }
  if (a.is_meta()) return;
  if (a.is_cuda()) {
    cuda::MatmulAccumulate(acc, a, b, trans_a, trans_b);
    return;
  }
  AddInPlace(acc, Matmul(Cast(a, want), Cast(b, want), trans_a, trans_b));
}

}  // namespace shardmap
