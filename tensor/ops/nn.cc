#include "tensor/ops/nn.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tensor/cpu/vec_math.h"
#include "tensor/cuda/nn/nn_ops.h"
#include "tensor/error.h"
#include "tensor/internal/accounting.h"
#include "tensor/ops/internal/op_util.h"
#include "tensor/ops/shape_ops.h"

namespace shardmap {
namespace {

using internal::Prod;
using internal::ShapeBytes;
using internal::TensorBytes;

// FLOPs per element (op_counter.h).
constexpr double kSoftmaxFlops = 5, kSoftmaxBackwardFlops = 4;
constexpr double kLayerNormFlops = 8, kLayerNormBackwardFlops = 12;
constexpr double kRmsNormFlops = 5, kRmsNormBackwardFlops = 9;
constexpr double kCrossEntropyFlops = 5, kCrossEntropyBackwardFlops = 4;

// f64 stays f64; everything else computes in f32.
DType ComputeType(DType t) { return t == DType::kF64 ? DType::kF64 : DType::kF32; }

// "[1,2]": the multi-index of flat position i in shape, for error messages.
std::string IndexString(absl::Span<const int64_t> shape, int64_t i) {
  std::vector<int64_t> idx(shape.size());
  for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
    idx[d] = shape[d] == 0 ? 0 : i % shape[d];
    i = shape[d] == 0 ? 0 : i / shape[d];
  }
  return absl::StrCat("[", absl::StrJoin(idx, ","), "]");
}

// Layout of a reduction along one dim: outer x n x inner.
struct Lanes {
  int64_t outer, n, inner;
};
Lanes LanesOf(const Tensor& x, int d) {
  return {Prod(x.shape(), 0, d), x.shape()[d], Prod(x.shape(), d + 1, x.rank())};
}

// Calls fn(in_lane, out_lane, stride) for every lane along the dim.
template <typename T, typename Fn>
void ForEachLane(const Lanes& l, const T* in, T* out, Fn fn) {
  for (int64_t o = 0; o < l.outer; ++o) {
    for (int64_t i = 0; i < l.inner; ++i) {
      const int64_t base = o * l.n * l.inner + i;
      fn(in + base, out + base, l.inner);
    }
  }
}

Tensor SoftmaxImpl(const char* op, const Tensor& x, int dim, bool log) {
  internal::OpScope scope;
  internal::RequireFloating(op, x);
  const int d = internal::NormalizeDim(op, dim, x);
  if (scope.counting()) {
    scope.Record(op, x.dtype(), kSoftmaxFlops * static_cast<double>(x.numel()),
                 2 * TensorBytes(x));
  }
  if (x.is_meta()) return Tensor::Empty(x.shape(), x.dtype(), x.device());
  if (x.is_cuda()) return cuda::Softmax(x, d, log);
  if (internal::IsHalf(x.dtype())) {
    return Cast(SoftmaxImpl(op, Cast(x, DType::kF32), d, log), x.dtype());
  }
  Tensor out = Tensor::Empty(x.shape(), x.dtype());
  if (x.numel() == 0) return out;
  const Lanes l = LanesOf(x, d);
  if (x.dtype() == DType::kF32 && l.inner == 1) {
    // Contiguous rows: vector max, then exp(x - max) with its f64 sum in one pass, then a scale.
    const cpu::VecKernels& k = cpu::Vec();
    for (int64_t r = 0; r < l.outer; ++r) {
      const float* in = x.data<float>() + r * l.n;
      float* o = out.data<float>() + r * l.n;
      float mx = k.max(in, l.n);
      if (std::isinf(mx) && mx < 0) mx = 0;  // an all -inf row: avoid inf - inf
      if (log) {
        const float lse = mx + static_cast<float>(std::log(k.exp_shift_sum(in, mx, nullptr, l.n)));
        k.shift(in, -lse, o, l.n);
      } else {
        const float inv = static_cast<float>(1.0 / k.exp_shift_sum(in, mx, o, l.n));
        k.scale(o, inv, o, l.n);
      }
    }
    return out;
  }
  internal::DispatchF32F64(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    ForEachLane(l, x.data<T>(), out.data<T>(), [&](const T* in, T* o, int64_t s) {
      T mx = -std::numeric_limits<T>::infinity();
      for (int64_t j = 0; j < l.n; ++j) mx = std::max(mx, in[j * s]);
      if (std::isinf(mx) && mx < 0) mx = 0;  // an all -inf row: avoid inf - inf
      double sum = 0;
      if (log) {
        for (int64_t j = 0; j < l.n; ++j) sum += std::exp(in[j * s] - mx);
        const T lse = mx + static_cast<T>(std::log(sum));
        for (int64_t j = 0; j < l.n; ++j) o[j * s] = in[j * s] - lse;
      } else {
        for (int64_t j = 0; j < l.n; ++j) {
          const T e = std::exp(in[j * s] - mx);
          o[j * s] = e;
          sum += e;
        }
        const T inv = static_cast<T>(1.0 / sum);
        for (int64_t j = 0; j < l.n; ++j) o[j * s] *= inv;
      }
    });
  });
  return out;
}

Tensor SoftmaxBackwardImpl(const char* op, const Tensor& y, const Tensor& dy, int dim, bool log) {
  internal::OpScope scope;
  internal::RequireFloating(op, y, "y");
  internal::RequireFloating(op, dy, "dy");
  internal::RequireSameDType(op, y, dy);
  internal::RequireSameShape(op, y, dy);
  const int d = internal::NormalizeDim(op, dim, y);
  internal::RequireSameDevice(op, y, dy);
  if (scope.counting()) {
    scope.Record(op, y.dtype(), kSoftmaxBackwardFlops * static_cast<double>(y.numel()),
                 3 * TensorBytes(y));
  }
  if (y.is_meta()) return Tensor::Empty(y.shape(), y.dtype(), y.device());
  if (y.is_cuda()) return cuda::SoftmaxBackward(y, dy, d, log);
  if (internal::IsHalf(y.dtype())) {
    return Cast(SoftmaxBackwardImpl(op, Cast(y, DType::kF32), Cast(dy, DType::kF32), d, log),
                y.dtype());
  }
  Tensor dx = Tensor::Empty(y.shape(), y.dtype());
  if (y.numel() == 0) return dx;
  const Lanes l = LanesOf(y, d);
  if (y.dtype() == DType::kF32 && l.inner == 1) {  // contiguous rows: vector passes
    const cpu::VecKernels& k = cpu::Vec();
    for (int64_t r = 0; r < l.outer; ++r) {
      const float* py = y.data<float>() + r * l.n;
      const float* pg = dy.data<float>() + r * l.n;
      float* px = dx.data<float>() + r * l.n;
      if (log) {  // dx = dy - softmax * sum(dy), softmax = exp(y)
        k.log_softmax_bwd(py, pg, static_cast<float>(k.sum(pg, l.n)), px, l.n);
      } else {  // dx = y * (dy - sum(dy * y))
        k.softmax_bwd(py, pg, static_cast<float>(k.dot(pg, py, l.n)), px, l.n);
      }
    }
    return dx;
  }
  internal::DispatchF32F64(y.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* py = y.data<T>();
    const T* pg = dy.data<T>();
    T* px = dx.data<T>();
    for (int64_t o = 0; o < l.outer; ++o) {
      for (int64_t i = 0; i < l.inner; ++i) {
        const int64_t b = o * l.n * l.inner + i, s = l.inner;
        double acc = 0;
        if (log) {  // dx = dy - softmax * sum(dy)
          for (int64_t j = 0; j < l.n; ++j) acc += pg[b + j * s];
          for (int64_t j = 0; j < l.n; ++j) {
            px[b + j * s] = pg[b + j * s] - std::exp(py[b + j * s]) * static_cast<T>(acc);
          }
        } else {  // dx = y * (dy - sum(dy * y))
          for (int64_t j = 0; j < l.n; ++j) acc += pg[b + j * s] * py[b + j * s];
          for (int64_t j = 0; j < l.n; ++j) {
            px[b + j * s] = py[b + j * s] * (pg[b + j * s] - static_cast<T>(acc));
          }
        }
      }
    }
  });
  return dx;
}

// Checks an optional per-feature parameter: undefined, or floating of shape [h].
void CheckParam(const char* op, const Tensor& p, const char* name, const Tensor& x) {
  if (!p.defined()) return;
  internal::RequireFloating(op, p, name);
  if (p.rank() != 1 || p.dim(0) != x.dim(-1)) {
    OpFail(op, ": ", name, " is ", p.ShapeString(), " but x is ", x.ShapeString(),
           "; expected ", name, " of shape [", x.dim(-1), "] (the last dim of x)");
  }
}

void CheckNormInput(const char* op, const Tensor& x) {
  internal::RequireFloating(op, x, "x");
  if (x.rank() < 1) OpFail(op, ": x ", x.ShapeString(), " needs rank >= 1 (normalises dim -1)");
}

// The norm backwards' x, gamma and dy (the statistics are checked by each).
void CheckNormBackwardInputs(const char* op, const Tensor& x, const Tensor& gamma,
                             const Tensor& dy) {
  CheckNormInput(op, x);
  CheckParam(op, gamma, "gamma", x);
  internal::RequireFloating(op, dy, "dy");
  internal::RequireSameDType(op, x, dy);
  internal::RequireSameShape(op, x, dy);
}

// Returns p in dtype ct, or an undefined tensor.
Tensor AsCompute(const Tensor& p, DType ct) { return p.defined() ? Cast(p, ct) : Tensor(); }

Shape RowShape(const Tensor& x) { return Shape(x.shape().begin(), x.shape().end() - 1); }

void CheckStats(const char* op, const Tensor& stat, const char* name, const Tensor& x) {
  internal::RequireFloating(op, stat, name);
  // The shape alone: a numel test (x.numel() / h) breaks for rows of width 0, where x has no
  // elements but each of its rows still has a mean and an rstd.
  if (stat.shape() != RowShape(x)) {
    OpFail(op, ": ", name, " is ", stat.ShapeString(), " but x is ", x.ShapeString(),
           "; expected shape ", ShapeToString(RowShape(x)), " from the forward pass");
  }
}

// Layer norm (mean given) or RMS norm (mean null, no db) backward of f32 rows of h on the vector
// passes: pass 1 over a group of rows (dg / db read and written once per group), then each row's
// dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)) while the group is in cache.
void NormBackwardF32(const float* x, const float* dy, const float* g, const float* mean,
                     const float* rstd, float* dx, float* dg, float* db, int64_t h, int64_t rows) {
  const cpu::VecKernels& k = cpu::Vec();
  // Long rows: dg and db (8h bytes) outgrow L1, so read and write them once per 4 rows (h 8192:
  // 4.7 -> 3.7 ms for 512 rows). Short rows: one at a time, so pass 2 finds its row in L1 (h
  // 1024: 3.2 ms one at a time, 4.2-4.5 ms in fours).
  const int64_t group = h >= 4096 ? 4 : 1;
  double sums[2 * 4];
  for (int64_t r0 = 0; r0 < rows; r0 += group) {
    const int64_t nr = std::min(group, rows - r0);
    k.norm_bwd_sums(x + r0 * h, dy + r0 * h, g, mean ? mean + r0 : nullptr, rstd + r0, dg, db, h,
                    nr, sums);
    for (int64_t r = 0; r < nr; ++r) {
      const int64_t i = r0 + r;
      const float a = mean ? static_cast<float>(sums[2 * r] / h) : 0.0f;
      k.norm_bwd_dx(x + i * h, dy + i * h, g, mean ? mean[i] : 0.0f, rstd[i], a,
                    static_cast<float>(sums[2 * r + 1] / h), dx + i * h, h);
    }
  }
}

}  // namespace

Tensor Softmax(const Tensor& x, int dim) { return SoftmaxImpl("softmax", x, dim, false); }
Tensor LogSoftmax(const Tensor& x, int dim) { return SoftmaxImpl("log_softmax", x, dim, true); }
Tensor SoftmaxBackward(const Tensor& y, const Tensor& dy, int dim) {
  return SoftmaxBackwardImpl("softmax_backward", y, dy, dim, false);
}
Tensor LogSoftmaxBackward(const Tensor& y, const Tensor& dy, int dim) {
  return SoftmaxBackwardImpl("log_softmax_backward", y, dy, dim, true);
}

LayerNormResult LayerNorm(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps) {
  internal::OpScope scope;
  CheckNormInput("layer_norm", x);
  CheckParam("layer_norm", gamma, "gamma", x);
  CheckParam("layer_norm", beta, "beta", x);
  internal::RequireSameDevice("layer_norm", x, gamma);
  internal::RequireSameDevice("layer_norm", x, beta);
  if (scope.counting() || x.is_meta()) {  // y in x's dtype; mean and rstd in the compute dtype
    const Shape rows = RowShape(x);
    const DType ct = ComputeType(x.dtype());
    if (scope.counting()) {
      scope.Record("layer_norm", x.dtype(), kLayerNormFlops * static_cast<double>(x.numel()),
                   2 * TensorBytes(x) + TensorBytes(gamma) + TensorBytes(beta) +
                       2 * ShapeBytes(rows, ct));
    }
    if (x.is_meta()) {
      return {Tensor::Empty(x.shape(), x.dtype(), x.device()),
              Tensor::Empty(rows, ct, x.device()), Tensor::Empty(rows, ct, x.device())};
    }
  }
  if (x.is_cuda()) {
    cuda::NormForward f = cuda::LayerNorm(x, gamma, beta, eps);
    return {f.y, f.mean, f.rstd};
  }
  const DType ct = ComputeType(x.dtype());
  const Tensor xc = Cast(x, ct), g = AsCompute(gamma, ct), b = AsCompute(beta, ct);
  LayerNormResult r;
  Tensor y = Tensor::Empty(x.shape(), ct);
  r.mean = Tensor::Empty(RowShape(x), ct);
  r.rstd = Tensor::Empty(RowShape(x), ct);
  const int64_t h = x.dim(-1), rows = h == 0 ? r.mean.numel() : x.numel() / h;
  internal::DispatchF32F64(ct, [&](auto zero) {
    using T = decltype(zero);
    const T* px = xc.data<T>();
    const T* pg = g.defined() ? g.data<T>() : nullptr;
    const T* pb = b.defined() ? b.data<T>() : nullptr;
    T* py = y.data<T>();
    for (int64_t i = 0; i < rows; ++i) {
      const T* row = px + i * h;
      double s = 0, ss = 0;
      if constexpr (std::is_same_v<T, float>) {  // vector passes, f64 sums
        s = cpu::Vec().sum(row, h);
      } else {
        for (int64_t j = 0; j < h; ++j) s += row[j];
      }
      const double mean = h == 0 ? 0.0 : s / h;
      if constexpr (std::is_same_v<T, float>) {
        ss = cpu::Vec().sum_sq_diff(row, mean, h);
      } else {
        for (int64_t j = 0; j < h; ++j) ss += (row[j] - mean) * (row[j] - mean);
      }
      const double var = h == 0 ? 0.0 : ss / h;
      const T m = static_cast<T>(mean), rs = static_cast<T>(1.0 / std::sqrt(var + eps));
      r.mean.data<T>()[i] = m;
      r.rstd.data<T>()[i] = rs;
      T* out = py + i * h;
      if constexpr (std::is_same_v<T, float>) {
        cpu::Vec().norm_affine(row, m, rs, pg, pb, out, h);
      } else if (pg && pb) {  // the usual affine case as one branch-free (vectorisable) loop
        for (int64_t j = 0; j < h; ++j) out[j] = (row[j] - m) * rs * pg[j] + pb[j];
      } else {
        for (int64_t j = 0; j < h; ++j) {
          T v = (row[j] - m) * rs;
          if (pg) v *= pg[j];
          if (pb) v += pb[j];
          out[j] = v;
        }
      }
    }
  });
  r.y = Cast(y, x.dtype());
  return r;
}

LayerNormGrads LayerNormBackward(const Tensor& x, const Tensor& gamma, const Tensor& mean,
                                 const Tensor& rstd, const Tensor& dy) {
  const char* op = "layer_norm_backward";
  internal::OpScope scope;
  CheckNormBackwardInputs(op, x, gamma, dy);
  CheckStats(op, mean, "mean", x);
  CheckStats(op, rstd, "rstd", x);
  for (const Tensor* t : {&gamma, &mean, &rstd, &dy}) internal::RequireSameDevice(op, x, *t);
  if (scope.counting() || x.is_meta()) {  // dgamma only with gamma; dbeta always
    const DType pt = gamma.defined() ? gamma.dtype() : x.dtype();
    const int64_t h = x.dim(-1);
    if (scope.counting()) {
      scope.Record(op, x.dtype(), kLayerNormBackwardFlops * static_cast<double>(x.numel()),
                   3 * TensorBytes(x) + TensorBytes(gamma) + TensorBytes(mean) +
                       TensorBytes(rstd) + (gamma.defined() ? 2 : 1) * ShapeBytes({h}, pt));
    }
    if (x.is_meta()) {
      LayerNormGrads g;
      g.dx = Tensor::Empty(x.shape(), x.dtype(), x.device());
      if (gamma.defined()) g.dgamma = Tensor::Empty({h}, pt, x.device());
      g.dbeta = Tensor::Empty({h}, pt, x.device());
      return g;
    }
  }
  if (x.is_cuda()) {
    cuda::NormBackward b = cuda::LayerNormBackward(x, gamma, mean, rstd, dy);
    return {b.dx, b.dgamma, b.dbeta};
  }
  const DType ct = ComputeType(x.dtype());
  const Tensor xc = Cast(x, ct), g = AsCompute(gamma, ct), dyc = Cast(dy, ct);
  const Tensor mc = Cast(mean, ct), rc = Cast(rstd, ct);
  const int64_t h = x.dim(-1), rows = mean.numel();
  Tensor dx = Tensor::Empty(x.shape(), ct);
  Tensor dg = Tensor::Zeros({h}, ct), db = Tensor::Zeros({h}, ct);
  internal::DispatchF32F64(ct, [&](auto zero) {
    using T = decltype(zero);
    const T* px = xc.data<T>();
    const T* pg = g.defined() ? g.data<T>() : nullptr;
    const T* pdy = dyc.data<T>();
    T* pdx = dx.data<T>();
    T* pdg = dg.data<T>();
    T* pdb = db.data<T>();
    if constexpr (std::is_same_v<T, float>) {  // vector passes
      NormBackwardF32(px, pdy, pg, mc.data<float>(), rc.data<float>(), pdx, pdg, pdb, h, rows);
      return;
    }
    for (int64_t i = 0; i < rows; ++i) {
      const T m = mc.data<T>()[i], rs = rc.data<T>()[i];
      const T* row = px + i * h;
      const T* grow = pdy + i * h;
      // dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), dxhat = dy * gamma.
      double s1 = 0, s2 = 0;
      for (int64_t j = 0; j < h; ++j) {
        const T xhat = (row[j] - m) * rs;
        const T dxhat = pg ? grow[j] * pg[j] : grow[j];
        s1 += dxhat;
        s2 += dxhat * xhat;
        pdg[j] += grow[j] * xhat;
        pdb[j] += grow[j];
      }
      const T a = static_cast<T>(s1 / h), c = static_cast<T>(s2 / h);
      for (int64_t j = 0; j < h; ++j) {
        const T xhat = (row[j] - m) * rs;
        const T dxhat = pg ? grow[j] * pg[j] : grow[j];
        pdx[i * h + j] = rs * (dxhat - a - xhat * c);
      }
    }
  });
  LayerNormGrads out;
  out.dx = Cast(dx, x.dtype());
  const DType pt = gamma.defined() ? gamma.dtype() : x.dtype();
  if (gamma.defined()) out.dgamma = Cast(dg, pt);
  out.dbeta = Cast(db, pt);
  return out;
}

RmsNormResult RmsNorm(const Tensor& x, const Tensor& gamma, double eps) {
  internal::OpScope scope;
  CheckNormInput("rms_norm", x);
  CheckParam("rms_norm", gamma, "gamma", x);
  internal::RequireSameDevice("rms_norm", x, gamma);
  if (scope.counting() || x.is_meta()) {  // y in x's dtype; rstd in the compute dtype
    const Shape rows = RowShape(x);
    const DType ct = ComputeType(x.dtype());
    if (scope.counting()) {
      scope.Record("rms_norm", x.dtype(), kRmsNormFlops * static_cast<double>(x.numel()),
                   2 * TensorBytes(x) + TensorBytes(gamma) + ShapeBytes(rows, ct));
    }
    if (x.is_meta()) {
      return {Tensor::Empty(x.shape(), x.dtype(), x.device()),
              Tensor::Empty(rows, ct, x.device())};
    }
  }
  if (x.is_cuda()) {
    cuda::NormForward f = cuda::RmsNorm(x, gamma, eps);
    return {f.y, f.rstd};
  }
  const DType ct = ComputeType(x.dtype());
  const Tensor xc = Cast(x, ct), g = AsCompute(gamma, ct);
  RmsNormResult r;
  Tensor y = Tensor::Empty(x.shape(), ct);
  r.rstd = Tensor::Empty(RowShape(x), ct);
  const int64_t h = x.dim(-1), rows = r.rstd.numel();
  internal::DispatchF32F64(ct, [&](auto zero) {
    using T = decltype(zero);
    const T* px = xc.data<T>();
    const T* pg = g.defined() ? g.data<T>() : nullptr;
    T* py = y.data<T>();
    for (int64_t i = 0; i < rows; ++i) {
      const T* row = px + i * h;
      double ss = 0;
      if constexpr (std::is_same_v<T, float>) {  // vector pass, f64 sum
        ss = cpu::Vec().sum_sq_diff(row, 0.0, h);
      } else {
        for (int64_t j = 0; j < h; ++j) ss += static_cast<double>(row[j]) * row[j];
      }
      const T rs = static_cast<T>(1.0 / std::sqrt((h == 0 ? 0.0 : ss / h) + eps));
      r.rstd.data<T>()[i] = rs;
      if constexpr (std::is_same_v<T, float>) {
        cpu::Vec().norm_affine(row, 0.0f, rs, pg, nullptr, py + i * h, h);
      } else {
        for (int64_t j = 0; j < h; ++j) py[i * h + j] = pg ? row[j] * rs * pg[j] : row[j] * rs;
      }
    }
  });
  r.y = Cast(y, x.dtype());
  return r;
}

RmsNormGrads RmsNormBackward(const Tensor& x, const Tensor& gamma, const Tensor& rstd,
                             const Tensor& dy) {
  const char* op = "rms_norm_backward";
  internal::OpScope scope;
  CheckNormBackwardInputs(op, x, gamma, dy);
  CheckStats(op, rstd, "rstd", x);
  for (const Tensor* t : {&gamma, &rstd, &dy}) internal::RequireSameDevice(op, x, *t);
  if (scope.counting() || x.is_meta()) {
    const int64_t h = x.dim(-1);
    if (scope.counting()) {
      scope.Record(op, x.dtype(), kRmsNormBackwardFlops * static_cast<double>(x.numel()),
                   3 * TensorBytes(x) + TensorBytes(gamma) + TensorBytes(rstd) +
                       (gamma.defined() ? ShapeBytes({h}, gamma.dtype()) : 0.0));
    }
    if (x.is_meta()) {
      RmsNormGrads g;
      g.dx = Tensor::Empty(x.shape(), x.dtype(), x.device());
      if (gamma.defined()) g.dgamma = Tensor::Empty({h}, gamma.dtype(), x.device());
      return g;
    }
  }
  if (x.is_cuda()) {
    cuda::NormBackward b = cuda::RmsNormBackward(x, gamma, rstd, dy);
    return {b.dx, b.dgamma};
  }
  const DType ct = ComputeType(x.dtype());
  const Tensor xc = Cast(x, ct), g = AsCompute(gamma, ct), dyc = Cast(dy, ct);
  const Tensor rc = Cast(rstd, ct);
  const int64_t h = x.dim(-1), rows = rstd.numel();
  Tensor dx = Tensor::Empty(x.shape(), ct);
  Tensor dg = Tensor::Zeros({h}, ct);
  internal::DispatchF32F64(ct, [&](auto zero) {
    using T = decltype(zero);
    const T* px = xc.data<T>();
    const T* pg = g.defined() ? g.data<T>() : nullptr;
    const T* pdy = dyc.data<T>();
    T* pdx = dx.data<T>();
    T* pdg = dg.data<T>();
    if constexpr (std::is_same_v<T, float>) {  // vector passes (mean 0, no dbeta)
      NormBackwardF32(px, pdy, pg, nullptr, rc.data<float>(), pdx, pdg, nullptr, h, rows);
      return;
    }
    for (int64_t i = 0; i < rows; ++i) {
      const T rs = rc.data<T>()[i];
      const T* row = px + i * h;
      const T* grow = pdy + i * h;
      // dx = rstd * (dxhat - xhat * mean(dxhat * xhat)), xhat = x * rstd, dxhat = dy * gamma.
      double s = 0;
      for (int64_t j = 0; j < h; ++j) {
        const T xhat = row[j] * rs;
        const T dxhat = pg ? grow[j] * pg[j] : grow[j];
        s += dxhat * xhat;
        pdg[j] += grow[j] * xhat;
      }
      const T c = static_cast<T>(s / h);
      for (int64_t j = 0; j < h; ++j) {
        const T xhat = row[j] * rs;
        const T dxhat = pg ? grow[j] * pg[j] : grow[j];
        pdx[i * h + j] = rs * (dxhat - xhat * c);
      }
    }
  });
  RmsNormGrads out;
  out.dx = Cast(dx, x.dtype());
  if (gamma.defined()) out.dgamma = Cast(dg, gamma.dtype());
  return out;
}

Tensor Embedding(const Tensor& table, const Tensor& ids) {
  internal::OpScope scope;
  internal::RequireDefined("embedding", table, "table");
  internal::RequireInteger("embedding", ids, "ids");
  if (table.rank() != 2) {
    OpFail("embedding: table ", table.ShapeString(), " must have rank 2 [rows, features]");
  }
  internal::RequireSameDevice("embedding", table, ids);
  if (scope.counting() || table.is_meta()) {  // ids read, one row gathered per id
    Shape out_shape = ids.shape();
    out_shape.push_back(table.dim(1));
    if (scope.counting()) {
      scope.Record("embedding", table.dtype(), 0,
                   TensorBytes(ids) + 2 * ShapeBytes(out_shape, table.dtype()));
    }
    // (ids are not read on meta: an out-of-range id is caught only on a real device)
    if (table.is_meta()) return Tensor::Empty(out_shape, table.dtype(), table.device());
  }
  if (table.is_cuda()) return cuda::Embedding(table, ids);
  const int64_t v = table.dim(0), h = table.dim(1);
  Shape out_shape = ids.shape();
  out_shape.push_back(h);
  Tensor out = Tensor::Empty(out_shape, table.dtype());
  const size_t row_bytes = static_cast<size_t>(h) * DTypeSize(table.dtype());
  const char* src = static_cast<const char*>(table.raw_data());
  char* dst = static_cast<char*>(out.raw_data());
  for (int64_t i = 0; i < ids.numel(); ++i) {
    const int64_t id = internal::IndexAt(ids, i);
    if (id < 0 || id >= v) {
      OpFail("embedding: id ", id, " at ", IndexString(ids.shape(), i), " of ids ",
             ids.ShapeString(), " is out of range for table ", table.ShapeString(),
             "; expected 0 <= id < ", v);
    }
    if (row_bytes > 0) std::memcpy(dst + i * row_bytes, src + id * row_bytes, row_bytes);
  }
  return out;
}

Tensor EmbeddingBackward(const Tensor& ids, const Tensor& dy, int64_t num_rows) {
  const char* op = "embedding_backward";
  internal::OpScope scope;
  internal::RequireInteger(op, ids, "ids");
  internal::RequireFloating(op, dy, "dy");
  if (num_rows < 0) OpFail(op, ": num_rows is ", num_rows, "; expected >= 0");
  Shape expect = ids.shape();
  if (dy.rank() != ids.rank() + 1) {
    OpFail(op, ": dy ", dy.ShapeString(), " must have shape ids.shape + [features] for ids ",
           ids.ShapeString());
  }
  expect.push_back(dy.dim(-1));
  if (dy.shape() != expect) {
    OpFail(op, ": dy ", dy.ShapeString(), " must have shape ", ShapeToString(expect),
           " (ids.shape + [features]) for ids ", ids.ShapeString());
  }
  internal::RequireSameDevice(op, ids, dy);
  if (scope.counting()) {  // one add per dy element into the zeroed table gradient
    scope.Record(op, dy.dtype(), static_cast<double>(dy.numel()),
                 TensorBytes(ids) + TensorBytes(dy) +
                     ShapeBytes({num_rows, dy.dim(-1)}, dy.dtype()));
  }
  if (dy.is_meta()) return Tensor::Empty({num_rows, dy.dim(-1)}, dy.dtype(), dy.device());
  if (dy.is_cuda()) return cuda::EmbeddingBackward(ids, dy, num_rows);
  const DType ct = ComputeType(dy.dtype());
  const Tensor dyc = Cast(dy, ct);
  const int64_t h = dy.dim(-1);
  Tensor out = Tensor::Zeros({num_rows, h}, ct);
  internal::DispatchF32F64(ct, [&](auto zero) {
    using T = decltype(zero);
    const T* g = dyc.data<T>();
    T* o = out.data<T>();
    for (int64_t i = 0; i < ids.numel(); ++i) {
      const int64_t id = internal::IndexAt(ids, i);
      if (id < 0 || id >= num_rows) {
        OpFail(op, ": id ", id, " at ", IndexString(ids.shape(), i), " of ids ",
               ids.ShapeString(), " is out of range; expected 0 <= id < ", num_rows);
      }
      T* row = o + id * h;
      const T* grow = g + i * h;
      for (int64_t j = 0; j < h; ++j) row[j] += grow[j];
    }
  });
  return Cast(out, dy.dtype());
}

namespace {

// Shared checks of cross-entropy: logits [..., v], targets [...] (integer).
void CheckCrossEntropy(const char* op, const Tensor& logits, const Tensor& targets) {
  internal::RequireFloating(op, logits, "logits");
  internal::RequireInteger(op, targets, "targets");
  if (logits.rank() < 1 || targets.rank() != logits.rank() - 1 ||
      !std::equal(targets.shape().begin(), targets.shape().end(), logits.shape().begin())) {
    OpFail(op, ": logits ", logits.ShapeString(), " and targets ", targets.ShapeString(),
           " do not match; expected logits [n, vocab] with targets [n] (or [..., vocab] / [...])");
  }
}

int64_t CheckedTarget(const char* op, const Tensor& targets, int64_t i, int64_t v,
                      int64_t ignore_index) {
  const int64_t t = internal::IndexAt(targets, i);
  if (t != ignore_index && (t < 0 || t >= v)) {
    OpFail(op, ": target ", t, " at ", IndexString(targets.shape(), i), " of targets ",
           targets.ShapeString(), " is out of range; expected 0 <= target < ", v,
           " or ignore_index (", ignore_index, ")");
  }
  return t;
}

}  // namespace

Tensor CrossEntropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index) {
  const char* op = "cross_entropy";
  internal::OpScope scope;
  CheckCrossEntropy(op, logits, targets);
  internal::RequireSameDevice(op, logits, targets);
  const DType loss_dtype = ComputeType(logits.dtype());  // f32 for the half types
  if (scope.counting()) {
    scope.Record(op, logits.dtype(), kCrossEntropyFlops * static_cast<double>(logits.numel()),
                 TensorBytes(logits) + TensorBytes(targets) +
                     ShapeBytes(targets.shape(), loss_dtype));
  }
  // (targets are not read on meta: an out-of-range target is caught only on a real device)
  if (logits.is_meta()) return Tensor::Empty(targets.shape(), loss_dtype, logits.device());
  if (logits.is_cuda()) return cuda::CrossEntropy(logits, targets, ignore_index);
  const DType ct = ComputeType(logits.dtype());
  const Tensor lc = Cast(logits, ct);
  const int64_t v = logits.dim(-1), rows = targets.numel();
  Tensor loss = Tensor::Empty(targets.shape(), ct);
  internal::DispatchF32F64(ct, [&](auto zero) {
    using T = decltype(zero);
    const T* pl = lc.data<T>();
    T* po = loss.data<T>();
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t t = CheckedTarget(op, targets, i, v, ignore_index);
      if (t == ignore_index) {
        po[i] = 0;
        continue;
      }
      const T* row = pl + i * v;
      T mx = row[0];
      double s = 0;
      if constexpr (std::is_same_v<T, float>) {  // vectorized row passes
        mx = std::max(mx, cpu::Vec().max(row, v));
        s = cpu::Vec().exp_shift_sum(row, mx, nullptr, v);
      } else {
        for (int64_t j = 1; j < v; ++j) mx = std::max(mx, row[j]);
        for (int64_t j = 0; j < v; ++j) s += std::exp(static_cast<double>(row[j] - mx));
      }
      po[i] = static_cast<T>(static_cast<double>(mx) + std::log(s) - row[t]);
    }
  });
  return loss;
}

Tensor CrossEntropyBackward(const Tensor& logits, const Tensor& targets, const Tensor& dloss,
                            int64_t ignore_index) {
  const char* op = "cross_entropy_backward";
  internal::OpScope scope;
  CheckCrossEntropy(op, logits, targets);
  internal::RequireFloating(op, dloss, "dloss");
  if (dloss.shape() != targets.shape()) {
    OpFail(op, ": dloss ", dloss.ShapeString(), " must have the shape of targets ",
           targets.ShapeString());
  }
  internal::RequireSameDevice(op, logits, targets);
  internal::RequireSameDevice(op, logits, dloss);
  if (scope.counting()) {
    scope.Record(op, logits.dtype(),
                 kCrossEntropyBackwardFlops * static_cast<double>(logits.numel()),
                 2 * TensorBytes(logits) + TensorBytes(targets) + TensorBytes(dloss));
  }
  if (logits.is_meta()) return Tensor::Empty(logits.shape(), logits.dtype(), logits.device());
  if (logits.is_cuda()) return cuda::CrossEntropyBackward(logits, targets, dloss, ignore_index);
  const DType ct = ComputeType(logits.dtype());
  const Tensor lc = Cast(logits, ct), dl = Cast(dloss, ct);
  const int64_t v = logits.dim(-1), rows = targets.numel();
  Tensor dx = Tensor::Empty(logits.shape(), ct);
  internal::DispatchF32F64(ct, [&](auto zero) {
    using T = decltype(zero);
    const T* pl = lc.data<T>();
    const T* pd = dl.data<T>();
    T* po = dx.data<T>();
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t t = CheckedTarget(op, targets, i, v, ignore_index);
      T* out = po + i * v;
      if (t == ignore_index) {
        for (int64_t j = 0; j < v; ++j) out[j] = 0;
        continue;
      }
      const T* row = pl + i * v;
      T mx = row[0];
      if constexpr (std::is_same_v<T, float>) {  // vectorized: exp written once, then scaled
        mx = std::max(mx, cpu::Vec().max(row, v));
        const float scale =
            static_cast<float>(static_cast<double>(pd[i]) / cpu::Vec().exp_shift_sum(row, mx, out, v));
        cpu::Vec().scale(out, scale, out, v);
      } else {
        for (int64_t j = 1; j < v; ++j) mx = std::max(mx, row[j]);
        double s = 0;
        for (int64_t j = 0; j < v; ++j) s += std::exp(static_cast<double>(row[j] - mx));
        const double scale = static_cast<double>(pd[i]) / s;
        for (int64_t j = 0; j < v; ++j) {
          out[j] = static_cast<T>(std::exp(static_cast<double>(row[j] - mx)) * scale);
        }
      }
      out[t] -= pd[i];
    }
  });
  return Cast(dx, logits.dtype());
}

Tensor CausalMask(const Tensor& scores, int64_t offset, double fill) {
  internal::OpScope scope;
  internal::RequireFloating("causal_mask", scores, "scores");
  if (scores.rank() < 2) {
    OpFail("causal_mask: scores ", scores.ShapeString(), " need rank >= 2 [..., s, t]");
  }
  // Offsets past either end mask everything or nothing; clamping keeps i + offset + 1 in range.
  offset = std::clamp<int64_t>(offset, -scores.dim(-2) - 1, scores.dim(-1));
  if (scope.counting()) scope.Record("causal_mask", scores.dtype(), 0, 2 * TensorBytes(scores));
  if (scores.is_meta()) return Tensor::Empty(scores.shape(), scores.dtype(), scores.device());
  if (scores.is_cuda()) return cuda::CausalMask(scores, offset, fill);
  if (internal::IsHalf(scores.dtype())) {
    return Cast(CausalMask(Cast(scores, DType::kF32), offset, fill), scores.dtype());
  }
  Tensor out = scores.Clone();
  const int64_t s = scores.dim(-2), t = scores.dim(-1);
  const int64_t mats = s * t == 0 ? 0 : scores.numel() / (s * t);
  internal::DispatchF32F64(scores.dtype(), [&](auto zero) {
    using T = decltype(zero);
    T* p = out.data<T>();
    const T f = static_cast<T>(fill);
    for (int64_t b = 0; b < mats; ++b) {
      for (int64_t i = 0; i < s; ++i) {
        T* row = p + (b * s + i) * t;
        for (int64_t j = std::max<int64_t>(0, i + offset + 1); j < t; ++j) row[j] = f;
      }
    }
  });
  return out;
}

Tensor CausalSoftmax(const Tensor& scores, int64_t offset) {
  internal::OpScope scope;
  internal::RequireFloating("causal_softmax", scores, "scores");
  if (scores.rank() < 2) {
    OpFail("causal_softmax: scores ", scores.ShapeString(), " need rank >= 2 [..., s, t]");
  }
  offset = std::clamp<int64_t>(offset, -scores.dim(-2) - 1, scores.dim(-1));
  if (scope.counting()) {  // counted over every score, masked or not (the kernel writes all)
    scope.Record("causal_softmax", scores.dtype(),
                 kSoftmaxFlops * static_cast<double>(scores.numel()), 2 * TensorBytes(scores));
  }
  if (scores.is_meta()) return Tensor::Empty(scores.shape(), scores.dtype(), scores.device());
  if (scores.is_cuda()) return cuda::CausalSoftmax(scores, offset);  // one fused kernel
  if (internal::IsHalf(scores.dtype())) {
    return Cast(CausalSoftmax(Cast(scores, DType::kF32), offset), scores.dtype());
  }
  Tensor out = Tensor::Empty(scores.shape(), scores.dtype());
  const int64_t s = scores.dim(-2), t = scores.dim(-1);
  const int64_t mats = s * t == 0 ? 0 : scores.numel() / (s * t);
  internal::DispatchF32F64(scores.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* in = scores.data<T>();
    T* o = out.data<T>();
    for (int64_t r = 0; r < mats * s; ++r) {
      const T* row = in + r * t;
      T* orow = o + r * t;
      const int64_t n = std::clamp<int64_t>(r % s + offset + 1, 0, t);  // visible keys
      if constexpr (std::is_same_v<T, float>) {
        if (n > 0) {
          const cpu::VecKernels& k = cpu::Vec();
          float mx = k.max(row, n);
          if (std::isinf(mx) && mx < 0) mx = 0;  // an all -inf row: avoid inf - inf
          const float inv = static_cast<float>(1.0 / k.exp_shift_sum(row, mx, orow, n));
          k.scale(orow, inv, orow, n);
        }
      } else {  // the generic softmax lane, over the visible keys only
        if (n > 0) {
          T mx = row[0];
          for (int64_t j = 1; j < n; ++j) mx = std::max(mx, row[j]);
          if (std::isinf(mx) && mx < 0) mx = 0;
          double sum = 0;
          for (int64_t j = 0; j < n; ++j) {
            const T e = std::exp(row[j] - mx);
            orow[j] = e;
            sum += e;
          }
          const T inv = static_cast<T>(1.0 / sum);
          for (int64_t j = 0; j < n; ++j) orow[j] *= inv;
        }
      }
      std::fill(orow + n, orow + t, T(0));
    }
  });
  return out;
}

}  // namespace shardmap
