#include "tensor/ops/multi_tensor.h"

#include <cmath>
#include <string>

#include "tensor/cuda/reduce/multi_tensor_ops.h"
#include "tensor/error.h"
#include "tensor/internal/accounting.h"
#include "tensor/ops/internal/op_util.h"

namespace shardmap {
namespace {

// Every tensor defined, floating, contiguous storage, on tensors[0]'s device.
void CheckList(const char* op, absl::Span<const Tensor> tensors) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    const std::string what = "tensor " + std::to_string(i) + " of the list";
    internal::RequireFloating(op, t, what.c_str());
    if (t.device() != tensors[0].device()) {
      OpFail(op, ": tensor ", i, " of the list (", t.ShapeString(), ") is on ",
             t.device().ToString(), " but tensor 0 is on ", tensors[0].device().ToString(),
             "; call the op once per device (or move the tensors with Tensor::To)");
    }
  }
}

void CheckScalar(const char* op, const Tensor& s, const char* what) {
  internal::RequireDefined(op, s, what);
  if (s.numel() != 1 || (s.dtype() != DType::kF32 && s.dtype() != DType::kF64)) {
    OpFail(op, ": ", what, " is ", s.ShapeString(), "; expected a one-element f32 or f64 tensor");
  }
}

double HostSumSq(const Tensor& t) {
  const int64_t n = t.numel();
  double s = 0;
  switch (t.dtype()) {
    case DType::kF32: {
      const float* p = t.data<float>();
      for (int64_t i = 0; i < n; ++i) s += static_cast<double>(p[i]) * p[i];
      break;
    }
    case DType::kF64: {
      const double* p = t.data<double>();
      for (int64_t i = 0; i < n; ++i) s += p[i] * p[i];
      break;
    }
    default: {  // bf16 / f16
      const uint16_t* p = static_cast<const uint16_t*>(t.raw_data());
      const bool bf = t.dtype() == DType::kBF16;
      for (int64_t i = 0; i < n; ++i) {
        const double v = bf ? BF16ToFloat(p[i]) : F16ToFloat(p[i]);
        s += v * v;
      }
    }
  }
  return s;
}

double HostScalar(const Tensor& s) {
  return s.dtype() == DType::kF64 ? *s.data<double>() : *s.data<float>();
}

double ListBytes(absl::Span<const Tensor> tensors) {
  double b = 0;
  for (const Tensor& t : tensors) b += static_cast<double>(t.nbytes());
  return b;
}
double ListElements(absl::Span<const Tensor> tensors) {
  double n = 0;
  for (const Tensor& t : tensors) n += static_cast<double>(t.numel());
  return n;
}

}  // namespace

Tensor SumOfSquares(absl::Span<const Tensor> tensors) {
  const char* op = "sum_of_squares";
  CheckList(op, tensors);
  DType out = DType::kF32;
  for (const Tensor& t : tensors) {
    if (t.dtype() == DType::kF64) out = DType::kF64;
  }
  internal::OpScope scope;
  if (scope.counting()) {  // a multiply and an add per element
    scope.Record(op, out, 2 * ListElements(tensors), ListBytes(tensors) + DTypeSize(out));
  }
  if (!tensors.empty() && tensors[0].is_meta()) return Tensor::Empty({}, out, tensors[0].device());
  if (!tensors.empty() && tensors[0].is_cuda()) {
    return cuda::SumOfSquares(tensors, out, tensors[0].device());
  }
  double s = 0;
  for (const Tensor& t : tensors) s += HostSumSq(t);
  return Tensor::Scalar(s, out);
}

Tensor ClipCoefficient(const Tensor& sum_sq, double max_norm) {
  const char* op = "clip_coefficient";
  CheckScalar(op, sum_sq, "sum_sq");
  if (!(max_norm > 0) || !std::isfinite(max_norm)) {
    OpFail(op, ": max_norm is ", max_norm, "; expected a finite max_norm > 0");
  }
  internal::OpScope scope;
  if (scope.counting()) scope.Record(op, sum_sq.dtype(), 4, 2.0 * DTypeSize(sum_sq.dtype()));
  if (sum_sq.is_meta()) return Tensor::Empty({}, sum_sq.dtype(), sum_sq.device());
  if (sum_sq.is_cuda()) return cuda::ClipCoefficient(sum_sq, max_norm);
  const double norm = std::sqrt(HostScalar(sum_sq));
  double coef = max_norm / (norm + 1e-6);
  if (!(coef < 1.0)) coef = 1.0;
  if (std::isnan(norm)) coef = norm;
  return Tensor::Scalar(coef, sum_sq.dtype());
}

void ScaleInPlace(absl::Span<const Tensor> tensors, const Tensor& scale) {
  const char* op = "scale_in_place";
  CheckList(op, tensors);
  CheckScalar(op, scale, "scale");
  if (tensors.empty()) return;
  if (scale.device() != tensors[0].device()) {
    OpFail(op, ": scale ", scale.ShapeString(), " is on ", scale.device().ToString(),
           " but the tensors are on ", tensors[0].device().ToString(),
           "; keep the scale on the tensors' device (e.g. from ClipCoefficient of their sum)");
  }
  internal::OpScope scope;
  if (scope.counting()) {  // each element read, multiplied and written
    scope.Record(op, tensors[0].dtype(), ListElements(tensors), 2 * ListBytes(tensors));
  }
  if (scale.is_meta()) return;
  if (scale.is_cuda()) {
    cuda::ScaleInPlace(tensors, scale);
    return;
  }
  const double s = HostScalar(scale);
  for (const Tensor& t : tensors) {
    Tensor w = t;  // shares t's storage
    const int64_t n = w.numel();
    switch (w.dtype()) {
      case DType::kF32: {
        float* p = w.data<float>();
        const float f = static_cast<float>(s);
        for (int64_t i = 0; i < n; ++i) p[i] *= f;
        break;
      }
      case DType::kF64: {
        double* p = w.data<double>();
        for (int64_t i = 0; i < n; ++i) p[i] *= s;
        break;
      }
      default: {
        uint16_t* p = static_cast<uint16_t*>(w.raw_data());
        const float f = static_cast<float>(s);
        const bool bf = w.dtype() == DType::kBF16;
        for (int64_t i = 0; i < n; ++i) {
          p[i] = bf ? FloatToBF16(BF16ToFloat(p[i]) * f) : FloatToF16(F16ToFloat(p[i]) * f);
        }
      }
    }
  }
}

}  // namespace shardmap
