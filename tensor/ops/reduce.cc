#include "tensor/ops/reduce.h"

#include <cmath>
#include <limits>
#include <type_traits>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_join.h"
#include "tensor/cpu/vec_math.h"
#include "tensor/cuda/reduce/reduce_ops.h"
#include "tensor/error.h"
#include "tensor/internal/accounting.h"
#include "tensor/ops/elementwise.h"
#include "tensor/ops/internal/op_util.h"
#include "tensor/ops/shape_ops.h"

namespace shardmap {
namespace {

using internal::DimVec;

enum class Kind { kSum, kMax, kMin };

using BoolVec = absl::InlinedVector<bool, 8>;  // heap-free for rank <= 8

struct Plan {
  BoolVec reduced;  // per input dim
  Shape out_shape;            // with keepdim applied
  int64_t count = 1;          // elements folded into each output
};

Plan MakePlan(const char* op, const Tensor& x, const std::vector<int>& dims, bool keepdim) {
  Plan p;
  p.reduced.assign(x.rank(), dims.empty());
  for (int dim : dims) {
    const int d = internal::NormalizeDim(op, dim, x);
    if (p.reduced[d]) {
      OpFail(op, ": dim ", dim, " listed twice in {", absl::StrJoin(dims, ","), "} for ",
             x.ShapeString());
    }
    p.reduced[d] = true;
  }
  for (int i = 0; i < x.rank(); ++i) {
    if (p.reduced[i]) {
      p.count *= x.shape()[i];
      if (keepdim) p.out_shape.push_back(1);
    } else {
      p.out_shape.push_back(x.shape()[i]);
    }
  }
  return p;
}

// The f64 sum of f32 rows: its row-into-columns fold has a vector kernel (same bits).
struct SumF64Fold {
  void operator()(double& a, float v) const { a += v; }
  void operator()(double& a, double v) const { a += v; }
};
template <typename T, typename A, typename Fold>
constexpr bool kVecSumRows =
    std::is_same_v<T, float> && std::is_same_v<A, double> && std::is_same_v<Fold, SumF64Fold>;

// Folds x into acc (one slot per output, pre-initialised) with fold(acc, v). Collapses runs of
// dims that are all reduced or all kept, walks the outer dims with an odometer and runs the
// innermost dim as a tight loop (a contiguous reduction, or an elementwise fold into a row).
template <typename T, typename A, typename Fold>
void ReduceInto(const Tensor& x, const BoolVec& reduced, A* acc, Fold fold) {
  DimVec sizes, out_str;
  BoolVec red;
  {
    const int r = x.rank();
    DimVec ostr(r, 0);
    int64_t os = 1;
    for (int i = r - 1; i >= 0; --i) {
      if (!reduced[i]) {
        ostr[i] = os;
        os *= x.shape()[i];
      }
    }
    for (int i = 0; i < r; ++i) {
      const int64_t n = x.shape()[i];
      if (n == 1) continue;
      if (!sizes.empty() && red.back() == reduced[i]) {
        sizes.back() *= n;
        out_str.back() = ostr[i];
      } else {
        sizes.push_back(n);
        out_str.push_back(ostr[i]);
        red.push_back(reduced[i]);
      }
    }
  }
  const T* in = x.data<T>();
  if (sizes.empty()) {
    fold(acc[0], in[0]);
    return;
  }
  const int d = static_cast<int>(sizes.size());
  const int64_t inner = sizes[d - 1];
  const int64_t rows = x.numel() / inner;
  const bool inner_reduced = red[d - 1];
  DimVec idx(d, 0);
  int64_t o = 0;
  for (int64_t row = 0; row < rows; ++row) {
    const T* src = in + row * inner;
    if (inner_reduced) {
      A a = acc[o];
      for (int64_t j = 0; j < inner; ++j) fold(a, src[j]);
      acc[o] = a;
    } else if constexpr (kVecSumRows<T, A, Fold>) {  // rows added into f64 column sums
      cpu::Vec().accumulate_f64(src, acc + o, inner);
    } else {
      A* dst = acc + o;
      for (int64_t j = 0; j < inner; ++j) fold(dst[j], src[j]);
    }
    for (int k = d - 2; k >= 0; --k) {
      o += out_str[k];
      if (++idx[k] < sizes[k]) break;
      o -= out_str[k] * sizes[k];
      idx[k] = 0;
    }
  }
}

void RequireIdentity(const char* op, Kind kind, const Tensor& x, const Plan& plan) {
  if (kind != Kind::kSum && plan.count == 0 && NumElements(plan.out_shape) > 0) {
    OpFail(op, ": reducing an empty dim of ", x.ShapeString(),
           " has no identity; reduce only non-empty dims");
  }
}

Tensor Reduce(const char* op, Kind kind, const Tensor& x, const std::vector<int>& dims,
              bool keepdim, bool mean) {
  internal::OpScope scope;
  internal::RequireFloating(op, x);
  const Plan plan = MakePlan(op, x, dims, keepdim);
  RequireIdentity(op, kind, x, plan);  // before the half-type cast: errors name x's own dtype
  if (scope.counting()) {  // 1 flop per input element
    scope.Record(op, x.dtype(), static_cast<double>(x.numel()),
                 static_cast<double>(x.nbytes()) +
                     static_cast<double>(NumElements(plan.out_shape) * DTypeSize(x.dtype())));
  }
  if (x.is_meta()) return Tensor::Empty(plan.out_shape, x.dtype(), x.device());
  if (x.is_cuda()) {
    const cuda::ReduceOp cop = kind == Kind::kMax   ? cuda::ReduceOp::kMax
                               : kind == Kind::kMin ? cuda::ReduceOp::kMin
                               : mean               ? cuda::ReduceOp::kMean
                                                    : cuda::ReduceOp::kSum;
    return cuda::Reduce(cop, x, plan.reduced, plan.out_shape);
  }
  if (internal::IsHalf(x.dtype())) {
    return Cast(Reduce(op, kind, Cast(x, DType::kF32), dims, keepdim, mean), x.dtype());
  }
  Tensor out = Tensor::Empty(plan.out_shape, x.dtype());
  const int64_t n_out = out.numel();
  if (n_out == 0) return out;
  // f32 rows reduced over trailing dims (sum / mean / max over the last dims): vector kernels,
  // f64 sums and NaN-propagating max as below.
  int first_reduced = x.rank();
  while (first_reduced > 0 && plan.reduced[first_reduced - 1]) --first_reduced;
  bool trailing = first_reduced < x.rank();
  for (int i = 0; i < first_reduced; ++i) trailing = trailing && !plan.reduced[i];
  if (x.dtype() == DType::kF32 && trailing && kind != Kind::kMin && plan.count > 0) {
    const cpu::VecKernels& k = cpu::Vec();
    const float* px = x.data<float>();
    float* po = out.data<float>();
    const int64_t c = plan.count;
    for (int64_t i = 0; i < n_out; ++i) {
      po[i] = kind == Kind::kMax ? k.max(px + i * c, c)
                                 : static_cast<float>(mean ? k.sum(px + i * c, c) /
                                                                 static_cast<double>(c)
                                                           : k.sum(px + i * c, c));
    }
    return out;
  }
  internal::DispatchF32F64(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    T* po = out.data<T>();
    if (kind == Kind::kSum) {
      // Accumulate in f64: cheap next to the memory traffic, and sums of many f32 stay accurate.
      absl::InlinedVector<double, 16> acc(n_out, 0.0);  // small outputs stay off the heap
      if (x.numel() > 0) {
        ReduceInto<T>(x, plan.reduced, acc.data(), SumF64Fold{});
      }
      const double scale = mean ? 1.0 / static_cast<double>(plan.count) : 1.0;
      for (int64_t i = 0; i < n_out; ++i) {
        po[i] = static_cast<T>(mean && plan.count == 0 ? std::nan("") : acc[i] * scale);
      }
    } else if (kind == Kind::kMax) {
      for (int64_t i = 0; i < n_out; ++i) po[i] = -std::numeric_limits<T>::infinity();
      ReduceInto<T>(x, plan.reduced, po, [](T& a, T v) { a = (v > a || v != v) ? v : a; });
    } else {
      for (int64_t i = 0; i < n_out; ++i) po[i] = std::numeric_limits<T>::infinity();
      ReduceInto<T>(x, plan.reduced, po, [](T& a, T v) { a = (v < a || v != v) ? v : a; });
    }
  });
  return out;
}

}  // namespace

Tensor Sum(const Tensor& x, const std::vector<int>& dims, bool keepdim) {
  return Reduce("sum", Kind::kSum, x, dims, keepdim, /*mean=*/false);
}
Tensor Mean(const Tensor& x, const std::vector<int>& dims, bool keepdim) {
  return Reduce("mean", Kind::kSum, x, dims, keepdim, /*mean=*/true);
}
Tensor Max(const Tensor& x, const std::vector<int>& dims, bool keepdim) {
  return Reduce("max", Kind::kMax, x, dims, keepdim, /*mean=*/false);
}
Tensor Min(const Tensor& x, const std::vector<int>& dims, bool keepdim) {
  return Reduce("min", Kind::kMin, x, dims, keepdim, /*mean=*/false);
}

Tensor ArgMax(const Tensor& x, int dim, bool keepdim) {
  internal::OpScope scope;
  internal::RequireFloating("argmax", x);
  const int d = internal::NormalizeDim("argmax", dim, x);
  Shape out_shape;
  for (int i = 0; i < x.rank(); ++i) {
    if (i != d) {
      out_shape.push_back(x.shape()[i]);
    } else if (keepdim) {
      out_shape.push_back(1);
    }
  }
  if (x.device().kind != DeviceKind::kCPU || scope.counting()) {
    if (NumElements(out_shape) > 0 && x.shape()[d] == 0) {
      OpFail("argmax: dim ", dim, " of ", x.ShapeString(), " is empty");
    }
    if (scope.counting()) {  // 1 comparison per input element
      scope.Record("argmax", x.dtype(), static_cast<double>(x.numel()),
                   static_cast<double>(x.nbytes()) +
                       static_cast<double>(NumElements(out_shape) * DTypeSize(DType::kI64)));
    }
    if (x.is_meta()) return Tensor::Empty(out_shape, DType::kI64, x.device());
    if (x.is_cuda()) return cuda::ArgMax(x, d, out_shape);
  }
  const Tensor xf = internal::IsHalf(x.dtype()) ? Cast(x, DType::kF32) : x;
  Tensor out = Tensor::Empty(out_shape, DType::kI64);
  const int64_t n = x.shape()[d];
  const int64_t outer = internal::Prod(x.shape(), 0, d);
  const int64_t inner = internal::Prod(x.shape(), d + 1, x.rank());
  if (out.numel() == 0) return out;
  if (n == 0) OpFail("argmax: dim ", dim, " of ", x.ShapeString(), " is empty");
  int64_t* po = out.data<int64_t>();
  internal::DispatchF32F64(xf.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* in = xf.data<T>();
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t i = 0; i < inner; ++i) {
        const T* p = in + o * n * inner + i;
        int64_t best = 0;
        T bv = p[0];
        for (int64_t j = 1; j < n && bv == bv; ++j) {  // the first NaN wins, like NumPy
          const T v = p[j * inner];
          if (v > bv || v != v) {
            bv = v;
            best = j;
          }
        }
        po[o * inner + i] = best;
      }
    }
  });
  return out;
}

Tensor SumToShape(const Tensor& dy, absl::Span<const int64_t> shape) {
  internal::RequireFloating("sum_to_shape", dy);
  const int r = dy.rank(), k = static_cast<int>(shape.size());
  bool ok = k <= r;
  std::vector<int> dims;
  for (int i = 0; ok && i < r; ++i) {
    const int j = i - (r - k);  // aligned dim of `shape`, from the right
    if (j < 0) {
      dims.push_back(i);
    } else if (shape[j] == 1 && dy.shape()[i] != 1) {
      dims.push_back(i);
    } else if (shape[j] != dy.shape()[i]) {
      ok = false;
    }
  }
  if (!ok) {
    OpFail("sum_to_shape: ", dy.ShapeString(), " is not a broadcast of shape ",
           ShapeToString(shape), "; expected a shape that broadcasts to ",
           ShapeToString(dy.shape()));
  }
  if (dims.empty()) return dy;
  return Sum(dy, dims, /*keepdim=*/true).Reshape(shape);
}

}  // namespace shardmap
