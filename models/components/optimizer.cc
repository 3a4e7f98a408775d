#include "models/components/optimizer.h"

#include <cmath>
#include <memory>
#include <set>

#include "absl/strings/str_cat.h"
#include "models/components/adamw_update.h"
#include "tensor/cuda/reduce/multi_tensor_ops.h"
#include "tensor/ops/elementwise.h"
#include "tensor/ops/shape_ops.h"

namespace shardmap {
namespace {

const NamedTensor* Find(const std::vector<NamedTensor>& v, const std::string& name) {
  for (const NamedTensor& t : v) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

bool MasterDType(DType t) { return t == DType::kF32 || t == DType::kF64; }

}  // namespace

absl::Status CheckParamsAndGrads(const std::vector<NamedTensor>& params,
                                 const std::vector<NamedTensor>& grads) {
  std::set<std::string> seen;
  for (const NamedTensor& p : params) {
    if (!seen.insert(p.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("parameter '", p.name, "' is listed twice"));
    }
    if (!p.tensor.defined()) {
      return absl::InvalidArgumentError(absl::StrCat("parameter '", p.name, "' is undefined"));
    }
    if (!MasterDType(p.tensor.dtype())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parameter '", p.name, "' is ", p.tensor.ShapeString(),
          ": master weights must be f32 (or f64); keep an f32 master copy and cast it to the "
          "compute dtype at use (models/parallel/mixed_precision.h)"));
    }
    const NamedTensor* g = Find(grads, p.name);
    if (g == nullptr || !g->tensor.defined()) {
      return absl::InvalidArgumentError(absl::StrCat("no gradient for parameter '", p.name, "'"));
    }
    if (g->tensor.shape() != p.tensor.shape() || g->tensor.dtype() != p.tensor.dtype()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "gradient of '", p.name, "' is ", g->tensor.ShapeString(), " but the parameter is ",
          p.tensor.ShapeString(),
          g->tensor.shape() == p.tensor.shape()
              ? "; cast the gradient to the master dtype (the VJP of the typed cast does this)"
              : ""));
    }
  }
  return absl::OkStatus();
}

absl::Status Sgd::Step(std::vector<NamedTensor>& params, const std::vector<NamedTensor>& grads) {
  if (absl::Status s = CheckParamsAndGrads(params, grads); !s.ok()) return s;
  ++steps_;
  const double lr = opt_.lr, mu = opt_.momentum;
  for (NamedTensor& p : params) {
    const Tensor& g = Find(grads, p.name)->tensor;
    Tensor u = g;
    if (mu != 0) {
      auto it = buf_.find(p.name);
      if (it == buf_.end()) {
        it = buf_.emplace(p.name, g.Clone()).first;
      } else {
        it->second = Add(MulScalar(it->second, mu), g);
      }
      u = opt_.nesterov ? Add(g, MulScalar(it->second, mu)) : it->second;
    }
    Tensor w = opt_.weight_decay != 0 ? MulScalar(p.tensor, 1.0 - lr * opt_.weight_decay)
                                      : p.tensor;
    p.tensor = Sub(w, MulScalar(u, lr));
  }
  return absl::OkStatus();
}

Tensor Sgd::momentum_buffer(const std::string& name) const {
  auto it = buf_.find(name);
  return it == buf_.end() ? Tensor() : it->second;
}

namespace {

// The fused CUDA path applies: every parameter an f32 tensor on one GPU.
bool AllF32OnOneGpu(const std::vector<NamedTensor>& params) {
  if (params.empty()) return false;
  for (const NamedTensor& p : params) {
    if (!p.tensor.is_cuda() || p.tensor.dtype() != DType::kF32 ||
        p.tensor.device() != params[0].tensor.device()) {
      return false;
    }
  }
  return true;
}

absl::Status CheckGradScale(const Tensor& s, Device device) {
  if (!s.defined()) return absl::OkStatus();
  if (s.numel() != 1 || (s.dtype() != DType::kF32 && s.dtype() != DType::kF64)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AdamW: grad_scale is ", s.ShapeString(), "; expected a one-element f32 or f64 tensor"));
  }
  if (s.device() != device) {
    return absl::InvalidArgumentError(
        absl::StrCat("AdamW: grad_scale is on ", s.device().ToString(), " but the parameters on ",
                     device.ToString(), "; compute it on their device (ClipCoefficient)"));
  }
  return absl::OkStatus();
}

absl::Status CheckControlScalar(const Tensor& s, const char* what, bool f64_only, Device device) {
  if (!s.defined()) return absl::OkStatus();
  if (s.numel() != 1 || (s.dtype() != DType::kF64 && (f64_only || s.dtype() != DType::kF32))) {
    return absl::InvalidArgumentError(absl::StrCat("AdamW: ", what, " is ", s.ShapeString(),
                                                   "; expected a one-element ",
                                                   f64_only ? "f64" : "f32 or f64", " tensor"));
  }
  if (s.device() != device) {
    return absl::InvalidArgumentError(
        absl::StrCat("AdamW: ", what, " is on ", s.device().ToString(), " but the parameters on ",
                     device.ToString(), "; keep it on their device"));
  }
  return absl::OkStatus();
}

double HostValue(const Tensor& s) { return s.item(); }

// FusedAdamWUpdate with the gradient multiplied by `scale` and then by `multiplier` (each a
// rounding in the parameter's dtype, as two tensor ops did); one factor is folded into the pass,
// and only when both differ from 1 does the gradient get a scaled copy first.
absl::Status ScaledUpdate(Tensor& p, const Tensor& g, Tensor& m, Tensor& v, AdamWCoefficients c,
                          double scale, double multiplier) {
  if (scale != 1.0 && multiplier != 1.0) {
    c.grad_scale = multiplier;
    return FusedAdamWUpdate(p, Mul(g, Tensor::Scalar(scale, p.dtype())), m, v, c);
  }
  c.grad_scale = scale != 1.0 ? scale : multiplier;
  return FusedAdamWUpdate(p, g, m, v, c);
}

}  // namespace

absl::Status AdamW::FusedCudaStep(std::vector<NamedTensor>& params,
                                  const std::vector<NamedTensor>& grads,
                                  const Tensor& grad_scale, const AdamWStepControl& control) {
  const Device device = params[0].tensor.device();
  std::vector<Tensor> ps, gs, ms, vs;
  std::vector<char> decay;
  for (NamedTensor& p : params) {
    const Tensor& g = Find(grads, p.name)->tensor;
    if (g.device() != device) {
      return absl::InvalidArgumentError(absl::StrCat(
          "gradient of '", p.name, "' is on ", g.device().ToString(), " but the parameter on ",
          device.ToString(), "; move the gradient to the parameter's device"));
    }
    State& st = state_[p.name];
    if (!st.m.defined() || st.m.shape() != p.tensor.shape()) {
      st.m = Tensor::Zeros(p.tensor.shape(), DType::kF32, device);
      st.v = Tensor::Zeros(p.tensor.shape(), DType::kF32, device);
    }
    // Restored state (SetState) may come from a CPU checkpoint or in f64.
    if (st.m.device() != device || st.m.dtype() != DType::kF32) st.m = Cast(st.m.To(device), DType::kF32);
    if (st.v.device() != device || st.v.dtype() != DType::kF32) st.v = Cast(st.v.To(device), DType::kF32);
    ps.push_back(p.tensor);
    gs.push_back(control.grad_multiplier != 1.0 ? MulScalar(g, control.grad_multiplier) : g);
    ms.push_back(st.m);
    vs.push_back(st.v);
    decay.push_back(opt_.weight_decay != 0 && opt_.no_decay.count(p.name) == 0);
  }
  if (!device_scalars_.defined() || device_scalars_.device() != device) {
    device_scalars_ = Tensor::Zeros({4}, DType::kI64, device);
    device_step_stale_ = true;
  }
  std::unique_ptr<bool[]> flags(new bool[decay.size()]);
  for (size_t i = 0; i < decay.size(); ++i) flags[i] = decay[i] != 0;
  cuda::AdamWStep(ps, gs, ms, vs, absl::Span<const bool>(flags.get(), decay.size()),
                  {opt_.lr, opt_.beta1, opt_.beta2, opt_.eps, opt_.weight_decay},
                  device_scalars_, device_step_stale_ ? steps_ : -1, grad_scale, control.lr,
                  control.skip_if_nonfinite);
  device_step_stale_ = false;
  ++steps_;
  return absl::OkStatus();
}

absl::Status AdamW::Step(std::vector<NamedTensor>& params, const std::vector<NamedTensor>& grads,
                         const Tensor& grad_scale, const AdamWStepControl& control) {
  if (absl::Status s = CheckParamsAndGrads(params, grads); !s.ok()) return s;
  if (!params.empty()) {
    const Device device = params[0].tensor.device();
    if (absl::Status s = CheckGradScale(grad_scale, device); !s.ok()) return s;
    if (absl::Status s = CheckControlScalar(control.lr, "lr", true, device); !s.ok()) return s;
    if (absl::Status s = CheckControlScalar(control.skip_if_nonfinite, "skip_if_nonfinite", false,
                                            device);
        !s.ok()) {
      return s;
    }
  }
  if (AllF32OnOneGpu(params)) return FusedCudaStep(params, grads, grad_scale, control);
  // The host path reads the control values (the same decisions as the fused kernel's).
  if (control.skip_if_nonfinite.defined() &&
      !std::isfinite(HostValue(control.skip_if_nonfinite))) {
    return absl::OkStatus();  // nothing changes, the count included
  }
  const double lr = control.lr.defined() ? HostValue(control.lr) : opt_.lr;
  ++steps_;
  const double t = static_cast<double>(steps_);
  const double b1 = opt_.beta1, b2 = opt_.beta2;
  const double bc1 = 1.0 - std::pow(b1, t);
  const double bc2 = 1.0 - std::pow(b2, t);
  const double step_size = lr / bc1;
  const double inv_sqrt_bc2 = 1.0 / std::sqrt(bc2);
  AdamWCoefficients c{.b1 = b1, .b2 = b2, .eps = opt_.eps, .step_size = step_size,
                      .inv_sqrt_bc2 = inv_sqrt_bc2};
  // The scale as the unfused form applied it (cast to the parameter's dtype, then multiplied),
  // times the host-side multiplier (clipping without a scaled copy of the gradients).
  const double scale = grad_scale.defined() ? HostValue(grad_scale) : 1.0;
  for (NamedTensor& p : params) {
    const Tensor& g = Find(grads, p.name)->tensor;
    State& st = state_[p.name];
    if (!st.m.defined() || st.m.shape() != p.tensor.shape()) {
      st.m = Tensor::Zeros(p.tensor.shape(), p.tensor.dtype(), p.tensor.device());
      st.v = Tensor::Zeros(p.tensor.shape(), p.tensor.dtype(), p.tensor.device());
    }
    // Restored state (SetState) may come in another dtype or on another device.
    if (st.m.device() != p.tensor.device() || st.m.dtype() != p.tensor.dtype()) {
      st.m = Cast(st.m.To(p.tensor.device()), p.tensor.dtype());
    }
    if (st.v.device() != p.tensor.device() || st.v.dtype() != p.tensor.dtype()) {
      st.v = Cast(st.v.To(p.tensor.device()), p.tensor.dtype());
    }
    const bool decay = opt_.weight_decay != 0 && opt_.no_decay.count(p.name) == 0;
    c.decay = decay ? 1.0 - lr * opt_.weight_decay : 1.0;
    // Two roundings as the unfused form had them: scale to the dtype, then the multiplier.
    if (absl::Status s = ScaledUpdate(p.tensor, g, st.m, st.v, c, scale, control.grad_multiplier);
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

Tensor AdamW::exp_avg(const std::string& name) const {
  auto it = state_.find(name);
  return it == state_.end() ? Tensor() : it->second.m;
}

void AdamW::SetState(const std::string& name, Tensor exp_avg, Tensor exp_avg_sq) {
  state_[name] = State{std::move(exp_avg), std::move(exp_avg_sq)};
}

Tensor AdamW::exp_avg_sq(const std::string& name) const {
  auto it = state_.find(name);
  return it == state_.end() ? Tensor() : it->second.v;
}

}  // namespace shardmap
