#include "models/components/adamw_update.h"

#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "tensor/internal/accounting.h"

namespace shardmap {
namespace {

template <typename T>
void Update(T* __restrict p, const T* __restrict g, T* __restrict m, T* __restrict v, int64_t n,
            const AdamWCoefficients& c) {
  const T b1 = static_cast<T>(c.b1), one_b1 = static_cast<T>(1.0 - c.b1);
  const T b2 = static_cast<T>(c.b2), one_b2 = static_cast<T>(1.0 - c.b2);
  const T eps = static_cast<T>(c.eps), step = static_cast<T>(c.step_size);
  const T inv = static_cast<T>(c.inv_sqrt_bc2), decay = static_cast<T>(c.decay);
  const T scale = static_cast<T>(c.grad_scale);
  const bool scaled = c.grad_scale != 1.0, decayed = c.decay != 1.0;
  for (int64_t i = 0; i < n; ++i) {
    const T gi = scaled ? g[i] * scale : g[i];
    const T mi = m[i] * b1 + gi * one_b1;
    const T vi = v[i] * b2 + (gi * gi) * one_b2;
    const T denom = std::sqrt(vi) * inv + eps;
    const T w = decayed ? p[i] * decay : p[i];
    m[i] = mi;
    v[i] = vi;
    p[i] = w - (mi / denom) * step;
  }
}

absl::Status Same(const char* what, const Tensor& t, const Tensor& p) {
  if (t.shape() != p.shape() || t.dtype() != p.dtype() || t.device() != p.device()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "FusedAdamWUpdate: ", what, " is ", t.ShapeString(), " on ", t.device().ToString(),
        " but the parameter is ", p.ShapeString(), " on ", p.device().ToString(),
        "; every operand must have the parameter's shape, dtype and device"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status FusedAdamWUpdate(Tensor& p, const Tensor& g, Tensor& m, Tensor& v,
                              const AdamWCoefficients& c) {
  if (p.dtype() != DType::kF32 && p.dtype() != DType::kF64) {
    return absl::InvalidArgumentError(absl::StrCat("FusedAdamWUpdate: the parameter is ",
                                                   p.ShapeString(), "; it must be f32 or f64"));
  }
  if (p.is_cuda()) {
    return absl::InvalidArgumentError(
        "FusedAdamWUpdate: CUDA tensors take the multi-tensor kernel (cuda::AdamWStep)");
  }
  for (auto [what, t] : {std::pair<const char*, const Tensor*>{"the gradient", &g},
                         {"exp_avg", &m}, {"exp_avg_sq", &v}}) {
    if (absl::Status s = Same(what, *t, p); !s.ok()) return s;
  }
  // One op for the OpCounter (the planner prices AdamW by it): per element 12 FLOPs (the
  // moments 7, the denominator 3 with sqrt as 1, the step 2) plus the scale and the decay when
  // applied; p, g, m, v read and p, m, v written.
  internal::OpScope scope;
  if (scope.counting()) {
    const double n = static_cast<double>(p.numel());
    const double per = 12 + (c.grad_scale != 1.0) + (c.decay != 1.0);
    scope.Record("adamw", p.dtype(), per * n, 7.0 * static_cast<double>(p.nbytes()));
  }
  if (p.is_meta() || p.numel() == 0) return absl::OkStatus();
  if (p.dtype() == DType::kF32) {
    Update(p.data<float>(), g.data<float>(), m.data<float>(), v.data<float>(), p.numel(), c);
  } else {
    Update(p.data<double>(), g.data<double>(), m.data<double>(), v.data<double>(), p.numel(), c);
  }
  return absl::OkStatus();
}

}  // namespace shardmap
