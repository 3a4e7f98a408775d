#include "models/parallel/mixed_precision.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "shardmap/context.h"
#include "shardmap/ops.h"
#include "tensor/ops/elementwise.h"
#include "tensor/error.h"
#include "tensor/ops/reduce.h"

namespace shardmap {

bool PrecisionPolicy::FromName(const std::string& name, PrecisionPolicy* out) {
  if (name == "f32" || name == "fp32") {
    *out = Fp32();
  } else if (name == "bf16") {
    *out = Bf16Mixed();
  } else if (name == "f16" || name == "fp16") {
    *out = Fp16Mixed();
  } else {
    return false;
  }
  return true;
}

std::string PrecisionPolicy::ToString() const {
  return absl::StrCat("param ", DTypeName(param), ", compute ", DTypeName(compute),
                      ", activation reduce ", DTypeName(activation_reduce), ", grad reduce ",
                      DTypeName(reduce), ", loss ", DTypeName(loss));
}

Value CastTo(const Value& x, DType dtype) {
  if (x.dtype() == dtype) return x;
  return cast(x, dtype);
}

Value ReduceActivation(const Value& x, const Axes& axes, const PrecisionPolicy& p) {
  return CastTo(all_reduce(CastTo(x, p.activation_reduce), axes), x.dtype());
}

Value ReduceScatterActivation(const Value& x, int dim, const Axes& axes,
                              const PrecisionPolicy& p) {
  return CastTo(reduce_scatter(CastTo(x, p.activation_reduce), dim, axes), x.dtype());
}

Value ReduceGradient(const Value& g, const SpmdType& param_type, const PrecisionPolicy& p) {
  if (!g.defined()) return g;
  RankContext& ctx = RankContext::Get("ReduceGradient");
  std::vector<std::string> axes = ctx.mesh().AxisNamesOf(param_type.AxesOfKind(AxisKind::kR));
  Value out = axes.empty() ? CastTo(g, p.param)
                           : CastTo(all_reduce(CastTo(g, p.reduce), Axes(std::move(axes))),
                                    p.param);
  if (!ctx.checked()) out.type = param_type;  // the erased summary may say P for a V axis
  return out;
}

std::vector<Value> ReduceGradients(const std::vector<Value>& grads,
                                   const std::vector<Value>& params, const PrecisionPolicy& p) {
  if (grads.size() != params.size()) {
    OpFail("ReduceGradients: ", grads.size(), " gradients for ", params.size(), " parameters");
  }
  std::vector<Value> out;
  out.reserve(grads.size());
  for (size_t k = 0; k < grads.size(); ++k) out.push_back(ReduceGradient(grads[k], params[k].type, p));
  return out;
}

Value ReduceScatterGradient(const Value& g, int dim, const Axes& axes, const PrecisionPolicy& p) {
  return CastTo(reduce_scatter(CastTo(g, p.reduce), dim, axes), p.param);
}

bool AllFinite(const Tensor& x) {
  if (!x.defined() || x.numel() == 0) return true;
  // inf * 0 and NaN * 0 are NaN; finite * 0 is 0 (and the sum of zeros stays 0).
  return std::isfinite(Sum(MulScalar(x, 0.0), {}).item());
}

bool AllFinite(const std::vector<NamedTensor>& xs) {
  bool ok = true;
  for (const NamedTensor& t : xs) ok = ok && AllFinite(t.tensor);
  return ok;
}

LossScaler::LossScaler(LossScalerOptions options) : opt_(options), scale_(options.init_scale) {}

LossScaler LossScaler::Static(double scale) {
  LossScalerOptions o;
  o.init_scale = scale;
  o.dynamic = false;
  return LossScaler(o);
}

bool LossScaler::UnscaleAndCheck(std::vector<NamedTensor>& grads) {
  const double inv = 1.0 / scale_;
  for (NamedTensor& g : grads) {
    if (g.tensor.defined() && inv != 1.0) g.tensor = MulScalar(g.tensor, inv);
  }
  return Update(AllFinite(grads));
}

bool LossScaler::Update(bool found_finite) {
  if (!found_finite) {
    ++skipped_;
    good_ = 0;
    if (opt_.dynamic) scale_ = std::max(opt_.min_scale, scale_ * opt_.backoff_factor);
    return false;
  }
  ++good_;
  if (opt_.dynamic && good_ >= opt_.growth_interval) {
    scale_ = std::min(opt_.max_scale, scale_ * opt_.growth_factor);
    good_ = 0;
  }
  return true;
}

}  // namespace shardmap
