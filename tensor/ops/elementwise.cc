#include "tensor/ops/elementwise.h"

#include <cmath>
#include <cstring>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "tensor/cpu/vec_math.h"
#include "tensor/cuda/elementwise/elementwise_ops.h"
#include "tensor/error.h"
#include "tensor/internal/accounting.h"
#include "tensor/ops/internal/op_util.h"
#include "tensor/ops/shape_ops.h"

namespace shardmap {
namespace {

using internal::DimVec;

// Fails with both shapes and the first offending dim (counted from the end, as NumPy aligns).
Shape BroadcastOrFail(const char* op, absl::Span<const int64_t> a, absl::Span<const int64_t> b,
                      const Tensor* ta, const Tensor* tb) {
  const size_t r = std::max(a.size(), b.size());
  Shape out(r);
  for (size_t i = 0; i < r; ++i) {  // i counts from the end
    const int64_t da = i < a.size() ? a[a.size() - 1 - i] : 1;
    const int64_t db = i < b.size() ? b[b.size() - 1 - i] : 1;
    if (da != db && da != 1 && db != 1) {
      OpFail(op, ": shapes ", ta ? ta->ShapeString() : ShapeToString(a), " and ",
             tb ? tb->ShapeString() : ShapeToString(b), " do not broadcast: dim -", i + 1,
             " is ", da, " vs ", db, "; sizes must be equal or one of them 1");
    }
    out[r - 1 - i] = da == 1 ? db : da;
  }
  return out;
}

// out[i] = f(a[i], b[i]) over n elements; sa/sb are 0 (broadcast) or 1. Separate loops per
// stride pair so each is a tight, vectorisable loop.
template <typename T, typename F>
inline void BinaryRun(const T* __restrict a, const T* __restrict b, T* __restrict out,
                      int64_t n, int64_t sa, int64_t sb, F f) {
  if (sa == 1 && sb == 1) {
    for (int64_t i = 0; i < n; ++i) out[i] = f(a[i], b[i]);
  } else if (sa == 1) {
    const T bv = b[0];
    for (int64_t i = 0; i < n; ++i) out[i] = f(a[i], bv);
  } else if (sb == 1) {
    const T av = a[0];
    for (int64_t i = 0; i < n; ++i) out[i] = f(av, b[i]);
  } else {
    const T v = f(a[0], b[0]);
    for (int64_t i = 0; i < n; ++i) out[i] = v;
  }
}

// General broadcasting: collapse dims that are contiguous-compatible in both operands, then walk
// the outer dims with an odometer and run the innermost dim as a tight loop.
// `vec` (may be null): the f32 vector kernel of f, used for rows where both operands advance.
template <typename T, typename F>
void BinaryBroadcast(const Tensor& a, const Tensor& b, Tensor& out, F f,
                     cpu::VecGradFn cpu::VecKernels::*vec) {
  const int r = out.rank();
  const Shape& os = out.shape();
  DimVec sizes, sa, sb;  // collapsed, outermost first
  {
    DimVec a_str(r, 0), b_str(r, 0);
    int64_t as = 1, bs = 1;
    for (int i = r - 1; i >= 0; --i) {
      const int ai = i - (r - a.rank()), bi = i - (r - b.rank());
      const int64_t ad = ai >= 0 ? a.shape()[ai] : 1, bd = bi >= 0 ? b.shape()[bi] : 1;
      a_str[i] = ad == 1 ? 0 : as;
      b_str[i] = bd == 1 ? 0 : bs;
      as *= ad;
      bs *= bd;
    }
    for (int i = 0; i < r; ++i) {
      if (os[i] == 1) continue;  // size-1 dims do not move any pointer
      if (!sizes.empty() && sa.back() == a_str[i] * os[i] && sb.back() == b_str[i] * os[i]) {
        sizes.back() *= os[i];
        sa.back() = a_str[i];
        sb.back() = b_str[i];
      } else {
        sizes.push_back(os[i]);
        sa.push_back(a_str[i]);
        sb.push_back(b_str[i]);
      }
    }
  }
  const T* pa = a.data<T>();
  const T* pb = b.data<T>();
  T* po = out.data<T>();
  if (sizes.empty()) {  // every dim is 1
    po[0] = f(pa[0], pb[0]);
    return;
  }
  const int d = static_cast<int>(sizes.size());
  const int64_t inner = sizes[d - 1];
  const int64_t rows = out.numel() / inner;
  DimVec idx(d, 0);
  int64_t oa = 0, ob = 0;
  cpu::VecGradFn row_kernel = nullptr;
  if constexpr (std::is_same_v<T, float>) {
    if (vec != nullptr && sa[d - 1] == 1 && sb[d - 1] == 1) row_kernel = cpu::Vec().*vec;
  }
  for (int64_t row = 0; row < rows; ++row) {
    if (row_kernel != nullptr) {  // e.g. a bias row added to every row of a matrix
      if constexpr (std::is_same_v<T, float>) {
        row_kernel(pa + oa, pb + ob, po + row * inner, inner);
      }
    } else {
      BinaryRun(pa + oa, pb + ob, po + row * inner, inner, sa[d - 1], sb[d - 1], f);
    }
    for (int k = d - 2; k >= 0; --k) {  // odometer step
      oa += sa[k];
      ob += sb[k];
      if (++idx[k] < sizes[k]) break;
      oa -= sa[k] * sizes[k];
      ob -= sb[k] * sizes[k];
      idx[k] = 0;
    }
  }
}

// F is a generic lambda (T, T) -> T, instantiated for float and double.
// Device tensors go to the CUDA kernel `cop` after the same checks; f32 operands of equal shapes
// go to the vector kernel `vec` when there is one (see tensor/cpu/vec_math.h).
// Meta tensors get an output of the broadcast shape after the same checks. `flops` per output
// element (op_counter.h).
template <typename F>
Tensor Binary(const char* op, cuda::BinaryOp cop, const Tensor& a, const Tensor& b, F f,
              cpu::VecGradFn cpu::VecKernels::*vec = nullptr, double flops = 1) {
  internal::OpScope scope;
  internal::RequireFloating(op, a, "lhs");
  internal::RequireFloating(op, b, "rhs");
  internal::RequireSameDType(op, a, b);
  internal::RequireSameDevice(op, a, b);
  if (scope.counting() || a.device().kind != DeviceKind::kCPU) {
    const Shape out_shape =
        a.shape() == b.shape() ? a.shape() : BroadcastOrFail(op, a.shape(), b.shape(), &a, &b);
    if (scope.counting()) {
      const double n = static_cast<double>(NumElements(out_shape));
      scope.Record(op, a.dtype(), flops * n,
                   static_cast<double>(a.nbytes() + b.nbytes()) + n * DTypeSize(a.dtype()));
    }
    if (a.is_meta()) return Tensor::Empty(out_shape, a.dtype(), a.device());
    if (a.is_cuda()) return cuda::Binary(op, cop, a, b, out_shape);
  }
  if (internal::IsHalf(a.dtype())) {  // compute in f32, round once
    return Cast(Binary(op, cop, Cast(a, DType::kF32), Cast(b, DType::kF32), f, vec), a.dtype());
  }
  if (a.shape() == b.shape()) {  // the hot path: no index math
    Tensor out = Tensor::Empty(a.shape(), a.dtype());
    if (vec != nullptr && a.dtype() == DType::kF32) {
      (cpu::Vec().*vec)(a.data<float>(), b.data<float>(), out.data<float>(), a.numel());
      return out;
    }
    internal::DispatchF32F64(a.dtype(), [&](auto zero) {
      using T = decltype(zero);
      BinaryRun(a.data<T>(), b.data<T>(), out.data<T>(), a.numel(), 1, 1, f);
    });
    return out;
  }
  Tensor out = Tensor::Empty(BroadcastOrFail(op, a.shape(), b.shape(), &a, &b), a.dtype());
  if (out.numel() == 0) return out;
  internal::DispatchF32F64(a.dtype(), [&](auto zero) {
    using T = decltype(zero);
    if (b.numel() == 1 && out.numel() == a.numel()) {
      BinaryRun(a.data<T>(), b.data<T>(), out.data<T>(), a.numel(), 1, 0, f);
    } else if (a.numel() == 1 && out.numel() == b.numel()) {
      BinaryRun(a.data<T>(), b.data<T>(), out.data<T>(), b.numel(), 0, 1, f);
    } else {
      BinaryBroadcast<T>(a, b, out, f, vec);
    }
  });
  return out;
}

// Device tensors go to the CUDA kernel `cop` (with `scalar` for AddScalar / MulScalar); f32 ones
// to the vector kernel `vec` when there is one.
// Records a one-input elementwise op: `flops` per element, the input read and the output written.
void CountUnary(const internal::OpScope& scope, const char* op, const Tensor& a, double flops) {
  if (scope.counting()) {
    scope.Record(op, a.dtype(), flops * static_cast<double>(a.numel()),
                 2.0 * static_cast<double>(a.nbytes()));
  }
}

template <typename F>
Tensor Unary(const char* op, cuda::UnaryOp cop, const Tensor& a, F f, double scalar = 0,
             cpu::VecUnaryFn cpu::VecKernels::*vec = nullptr, double flops = 1) {
  internal::OpScope scope;
  internal::RequireFloating(op, a);
  CountUnary(scope, op, a, flops);
  if (a.is_meta()) return Tensor::Empty(a.shape(), a.dtype(), a.device());
  if (a.is_cuda()) return cuda::Unary(op, cop, a, scalar);
  if (internal::IsHalf(a.dtype())) {
    return Cast(Unary(op, cop, Cast(a, DType::kF32), f, scalar, vec), a.dtype());
  }
  Tensor out = Tensor::Empty(a.shape(), a.dtype());
  if (vec != nullptr && a.dtype() == DType::kF32) {
    (cpu::Vec().*vec)(a.data<float>(), out.data<float>(), a.numel());
    return out;
  }
  internal::DispatchF32F64(a.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* __restrict pa = a.data<T>();
    T* __restrict po = out.data<T>();
    const int64_t n = a.numel();
    for (int64_t i = 0; i < n; ++i) po[i] = f(pa[i]);
  });
  return out;
}

// FLOPs per element (op_counter.h); a transcendental function counts as 1.
constexpr double kTranscendentalFlops = 1;
constexpr double kGeluTanhFlops = 8;
constexpr double kGeluErfFlops = 5;
constexpr double kSiluFlops = 4;
constexpr double kGeluTanhGradFlops = 14;
constexpr double kGeluErfGradFlops = 10;
constexpr double kSiluGradFlops = 7;
constexpr double kTanhGradFlops = 3;

constexpr double kSqrt2OverPi = 0.79788456080286535588;  // sqrt(2/pi)
constexpr double kInvSqrt2 = 0.70710678118654752440;
constexpr double kInvSqrt2Pi = 0.39894228040143267794;  // 1/sqrt(2 pi)
constexpr double kGeluC = 0.044715;

template <typename T>
inline T GeluTanhFwd(T x) {
  const T u = T(kSqrt2OverPi) * (x + T(kGeluC) * x * x * x);
  return T(0.5) * x * (T(1) + std::tanh(u));
}
template <typename T>
inline T GeluTanhDer(T x) {
  const T u = T(kSqrt2OverPi) * (x + T(kGeluC) * x * x * x);
  const T t = std::tanh(u);
  const T du = T(kSqrt2OverPi) * (T(1) + T(3 * kGeluC) * x * x);
  return T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * du;
}
template <typename T>
inline T GeluErfFwd(T x) {
  return T(0.5) * x * (T(1) + std::erf(x * T(kInvSqrt2)));
}
template <typename T>
inline T GeluErfDer(T x) {
  return T(0.5) * (T(1) + std::erf(x * T(kInvSqrt2))) +
         x * T(kInvSqrt2Pi) * std::exp(T(-0.5) * x * x);
}
template <typename T>
inline T Sigmoid(T x) {
  return T(1) / (T(1) + std::exp(-x));
}

}  // namespace

Shape BroadcastShapes(const char* op, absl::Span<const int64_t> a, absl::Span<const int64_t> b) {
  return BroadcastOrFail(op, a, b, nullptr, nullptr);
}

Tensor Add(const Tensor& a, const Tensor& b) {
  return Binary("add", cuda::BinaryOp::kAdd, a, b, [](auto x, auto y) { return x + y; },
                &cpu::VecKernels::add);
}
Tensor Sub(const Tensor& a, const Tensor& b) {
  return Binary("sub", cuda::BinaryOp::kSub, a, b, [](auto x, auto y) { return x - y; },
                &cpu::VecKernels::sub);
}
Tensor Mul(const Tensor& a, const Tensor& b) {
  return Binary("mul", cuda::BinaryOp::kMul, a, b, [](auto x, auto y) { return x * y; },
                &cpu::VecKernels::mul);
}
Tensor Div(const Tensor& a, const Tensor& b) {
  return Binary("div", cuda::BinaryOp::kDiv, a, b, [](auto x, auto y) { return x / y; },
                &cpu::VecKernels::div);
}

Tensor AddScalar(const Tensor& a, double s) {
  internal::OpScope scope;
  internal::RequireFloating("add_scalar", a);
  CountUnary(scope, "add_scalar", a, 1);
  if (a.device().kind == DeviceKind::kCPU && a.dtype() == DType::kF32) {  // the vector kernel
    Tensor out = Tensor::Empty(a.shape(), a.dtype());
    cpu::Vec().shift(a.data<float>(), static_cast<float>(s), out.data<float>(), a.numel());
    return out;
  }
  return Unary(
      "add_scalar", cuda::UnaryOp::kAddScalar, a,
      [s](auto x) { return x + static_cast<decltype(x)>(s); }, s);
}
Tensor MulScalar(const Tensor& a, double s) {
  internal::OpScope scope;
  internal::RequireFloating("mul_scalar", a);
  CountUnary(scope, "mul_scalar", a, 1);
  if (a.device().kind == DeviceKind::kCPU && a.dtype() == DType::kF32) {  // the vector kernel
    Tensor out = Tensor::Empty(a.shape(), a.dtype());
    cpu::Vec().scale(a.data<float>(), static_cast<float>(s), out.data<float>(), a.numel());
    return out;
  }
  return Unary(
      "mul_scalar", cuda::UnaryOp::kMulScalar, a,
      [s](auto x) { return x * static_cast<decltype(x)>(s); }, s);
}
Tensor Neg(const Tensor& a) {
  return Unary("neg", cuda::UnaryOp::kNeg, a, [](auto x) { return -x; });
}
Tensor Exp(const Tensor& a) {
  return Unary(
      "exp", cuda::UnaryOp::kExp, a, [](auto x) { return std::exp(x); }, 0, &cpu::VecKernels::exp,
      kTranscendentalFlops);
}
Tensor Log(const Tensor& a) {
  return Unary(
      "log", cuda::UnaryOp::kLog, a, [](auto x) { return std::log(x); }, 0, &cpu::VecKernels::log,
      kTranscendentalFlops);
}
Tensor Tanh(const Tensor& a) {
  return Unary(
      "tanh", cuda::UnaryOp::kTanh, a, [](auto x) { return std::tanh(x); }, 0,
      &cpu::VecKernels::tanh, kTranscendentalFlops);
}
Tensor Relu(const Tensor& a) {
  // NaN propagates (x != x) so bad values stay visible instead of becoming 0.
  return Unary("relu", cuda::UnaryOp::kRelu, a,
               [](auto x) { return x > 0 || x != x ? x : decltype(x)(0); });
}
Tensor Sqrt(const Tensor& a) {
  return Unary(
      "sqrt", cuda::UnaryOp::kSqrt, a, [](auto x) { return std::sqrt(x); }, 0, nullptr,
      kTranscendentalFlops);
}
Tensor Gelu(const Tensor& a, GeluApprox approx) {
  if (approx == GeluApprox::kTanh) {
    return Unary(
        "gelu", cuda::UnaryOp::kGeluTanh, a, [](auto x) { return GeluTanhFwd(x); }, 0,
        &cpu::VecKernels::gelu_tanh, kGeluTanhFlops);
  }
  return Unary(
      "gelu", cuda::UnaryOp::kGeluErf, a, [](auto x) { return GeluErfFwd(x); }, 0,
      &cpu::VecKernels::gelu_erf, kGeluErfFlops);
}
Tensor Silu(const Tensor& a) {
  return Unary(
      "silu", cuda::UnaryOp::kSilu, a, [](auto x) { return x * Sigmoid(x); }, 0,
      &cpu::VecKernels::silu, kSiluFlops);
}

Tensor ReluGrad(const Tensor& x, const Tensor& dy) {
  internal::RequireSameShape("relu_grad", x, dy);
  return Binary("relu_grad", cuda::BinaryOp::kReluGrad, x, dy,
                [](auto v, auto g) { return v > 0 ? g : decltype(v)(0); });
}
Tensor GeluGrad(const Tensor& x, const Tensor& dy, GeluApprox approx) {
  internal::RequireSameShape("gelu_grad", x, dy);
  if (approx == GeluApprox::kTanh) {
    return Binary(
        "gelu_grad", cuda::BinaryOp::kGeluTanhGrad, x, dy,
        [](auto v, auto g) { return g * GeluTanhDer(v); }, &cpu::VecKernels::gelu_tanh_grad,
        kGeluTanhGradFlops);
  }
  return Binary(
      "gelu_grad", cuda::BinaryOp::kGeluErfGrad, x, dy,
      [](auto v, auto g) { return g * GeluErfDer(v); }, &cpu::VecKernels::gelu_erf_grad,
      kGeluErfGradFlops);
}
Tensor SiluGrad(const Tensor& x, const Tensor& dy) {
  internal::RequireSameShape("silu_grad", x, dy);
  return Binary(
      "silu_grad", cuda::BinaryOp::kSiluGrad, x, dy,
      [](auto v, auto g) {
        using T = decltype(v);
        const T s = Sigmoid(v);
        return g * s * (T(1) + v * (T(1) - s));
      },
      &cpu::VecKernels::silu_grad, kSiluGradFlops);
}
Tensor TanhGrad(const Tensor& y, const Tensor& dy) {
  internal::RequireSameShape("tanh_grad", y, dy);
  return Binary("tanh_grad", cuda::BinaryOp::kTanhGrad, y, dy,
                [](auto v, auto g) { return g * (decltype(v)(1) - v * v); }, nullptr,
                kTanhGradFlops);
}

void AddInPlace(Tensor& acc, const Tensor& x_in) {
  internal::OpScope scope;
  internal::RequireFloating("add_in_place", acc, "accumulator");
  internal::RequireFloating("add_in_place", x_in, "addend");
  internal::RequireSameDType("add_in_place", acc, x_in);
  internal::RequireSameShape("add_in_place", acc, x_in);
  internal::RequireSameDevice("add_in_place", acc, x_in);
  if (scope.counting()) {  // reads acc and x, writes acc
    scope.Record("add_in_place", acc.dtype(), static_cast<double>(acc.numel()),
                 3.0 * static_cast<double>(acc.nbytes()));
  }
  if (acc.is_meta()) return;
  if (acc.is_cuda()) {
    cuda::AddInPlace(acc, x_in);
    return;
  }
  // NumPy semantics, as the CUDA kernel: acc += x as x was before the call. An x that partially
  // overlaps acc is read from a copy; x == acc exactly is fine elementwise.
  const char* pa_bytes = static_cast<const char*>(acc.raw_data());
  const char* px_bytes = static_cast<const char*>(x_in.raw_data());
  const size_t nb = acc.nbytes();
  const bool partial = x_in.SharesStorageWith(acc) && px_bytes != pa_bytes &&
                       px_bytes < pa_bytes + nb && pa_bytes < px_bytes + nb;
  const Tensor x = partial ? x_in.Clone() : x_in;
  const int64_t n = acc.numel();
  switch (acc.dtype()) {
    case DType::kF32: {
      float* pa = acc.data<float>();  // no __restrict: x may be acc itself
      const float* px = x.data<float>();
      for (int64_t i = 0; i < n; ++i) pa[i] += px[i];
      break;
    }
    case DType::kF64: {
      double* pa = acc.data<double>();
      const double* px = x.data<double>();
      for (int64_t i = 0; i < n; ++i) pa[i] += px[i];
      break;
    }
    default: {  // bf16/f16: add in f32, round once per element
      const bool bf = acc.dtype() == DType::kBF16;
      uint16_t* pa = static_cast<uint16_t*>(acc.raw_data());
      const uint16_t* px = static_cast<const uint16_t*>(x.raw_data());
      for (int64_t i = 0; i < n; ++i) {
        pa[i] = bf ? FloatToBF16(BF16ToFloat(pa[i]) + BF16ToFloat(px[i]))
                   : FloatToF16(F16ToFloat(pa[i]) + F16ToFloat(px[i]));
      }
    }
  }
}

}  // namespace shardmap
