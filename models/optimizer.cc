#include "models/optimizer.h"

#include <cmath>
#include <set>

#include "absl/strings/str_cat.h"
#include "tensor/ops/elementwise.h"

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
          "compute dtype at use (models/mixed_precision.h)"));
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

absl::Status AdamW::Step(std::vector<NamedTensor>& params, const std::vector<NamedTensor>& grads) {
  if (absl::Status s = CheckParamsAndGrads(params, grads); !s.ok()) return s;
  ++steps_;
  const double t = static_cast<double>(steps_);
  const double b1 = opt_.beta1, b2 = opt_.beta2;
  const double bc1 = 1.0 - std::pow(b1, t);
  const double bc2 = 1.0 - std::pow(b2, t);
  const double step_size = opt_.lr / bc1;
  const double inv_sqrt_bc2 = 1.0 / std::sqrt(bc2);
  for (NamedTensor& p : params) {
    const Tensor& g = Find(grads, p.name)->tensor;
    State& st = state_[p.name];
    if (!st.m.defined() || st.m.shape() != p.tensor.shape()) {
      st.m = Tensor::Zeros(p.tensor.shape(), p.tensor.dtype(), p.tensor.device());
      st.v = Tensor::Zeros(p.tensor.shape(), p.tensor.dtype(), p.tensor.device());
    }
    st.m = Add(MulScalar(st.m, b1), MulScalar(g, 1.0 - b1));
    st.v = Add(MulScalar(st.v, b2), MulScalar(Mul(g, g), 1.0 - b2));
    Tensor denom = AddScalar(MulScalar(Sqrt(st.v), inv_sqrt_bc2), opt_.eps);
    const bool decay = opt_.weight_decay != 0 && opt_.no_decay.count(p.name) == 0;
    Tensor w = decay ? MulScalar(p.tensor, 1.0 - opt_.lr * opt_.weight_decay) : p.tensor;
    p.tensor = Sub(w, MulScalar(Div(st.m, denom), step_size));
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
