// SGD (plain, momentum, nesterov, decoupled weight decay) and AdamW against naive scalar
// references written element by element in double, over several steps, in f64 (tight) and f32
// (float rounding); plus the checks on names, shapes and dtypes.
#include "models/components/optimizer.h"

#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tensor/testing/compare.h"

namespace shardmap {
namespace {

std::vector<double> Values(int n, uint64_t seed, double scale) {
  std::vector<double> v(n);
  uint64_t x = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (int i = 0; i < n; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    v[i] = scale * (2.0 * static_cast<double>(x >> 11) / static_cast<double>(1ull << 53) - 1.0);
  }
  return v;
}

Tensor Make(const std::vector<int64_t>& shape, const std::vector<double>& v, DType dt) {
  if (dt == DType::kF64) return Tensor::FromVector<double>(shape, v);
  return Tensor::FromVector<float>(shape, std::vector<float>(v.begin(), v.end()));
}

// Gradients of a fixed quadratic-ish function, different at every step: g = p * c + noise(step).
std::vector<double> Grad(const std::vector<double>& p, int step, int which) {
  std::vector<double> noise = Values(static_cast<int>(p.size()), 100 + 7 * step + which, 0.3);
  std::vector<double> g(p.size());
  for (size_t i = 0; i < p.size(); ++i) g[i] = 0.8 * p[i] + noise[i];
  return g;
}

struct RefSgd {
  double lr, mu, wd;
  bool nesterov;
  std::vector<double> buf;
  void Step(std::vector<double>& p, const std::vector<double>& g) {
    if (buf.empty() && mu != 0) {
      buf = g;
    } else if (mu != 0) {
      for (size_t i = 0; i < p.size(); ++i) buf[i] = mu * buf[i] + g[i];
    }
    for (size_t i = 0; i < p.size(); ++i) {
      double u = mu == 0 ? g[i] : (nesterov ? g[i] + mu * buf[i] : buf[i]);
      p[i] = p[i] * (1 - lr * wd) - lr * u;
    }
  }
};

struct RefAdamW {
  double lr, b1, b2, eps, wd;
  int t = 0;
  std::vector<double> m, v;
  void Step(std::vector<double>& p, const std::vector<double>& g) {
    if (m.empty()) {
      m.assign(p.size(), 0);
      v.assign(p.size(), 0);
    }
    ++t;
    for (size_t i = 0; i < p.size(); ++i) {
      p[i] *= 1 - lr * wd;
      m[i] = b1 * m[i] + (1 - b1) * g[i];
      v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
      double mhat = m[i] / (1 - std::pow(b1, t));
      double vhat = v[i] / (1 - std::pow(b2, t));
      p[i] -= lr * mhat / (std::sqrt(vhat) + eps);
    }
  }
};

// Runs `steps` steps of opt on two parameters against two scalar references.
template <typename Opt, typename Ref>
void Compare(Opt& opt, Ref ref0, DType dt, double tol, int steps = 6) {
  std::vector<std::vector<double>> p = {Values(12, 1, 1.0), Values(5, 2, 0.5)};
  std::vector<std::vector<int64_t>> shapes = {{3, 4}, {5}};
  std::vector<Ref> ref = {ref0, ref0};
  std::vector<NamedTensor> params = {{"w", Make(shapes[0], p[0], dt)},
                                     {"b", Make(shapes[1], p[1], dt)}};
  for (int s = 0; s < steps; ++s) {
    // Gradients computed from the current tensor parameters (what training does); the reference
    // uses the same gradients.
    std::vector<NamedTensor> grads;
    // Deliberately listed in the other order: matching is by name.
    for (int k : {1, 0}) {
      std::vector<double> cur = params[k].tensor.template ToVector<double>();
      std::vector<double> g = Grad(cur, s, k);
      grads.push_back({params[k].name, Make(shapes[k], g, dt)});
      ref[k].Step(p[k], grads.back().tensor.template ToVector<double>());
    }
    ASSERT_TRUE(opt.Step(params, grads).ok());
    for (int k = 0; k < 2; ++k) {
      SCOPED_TRACE(absl::StrCat("step ", s, " param ", params[k].name));
      EXPECT_EQ(params[k].tensor.dtype(), dt);
      // The reference rounded once to dt, within tol of its largest value.
      EXPECT_TRUE(testing::TensorsNearScaled(params[k].tensor, Make(shapes[k], p[k], dt), tol));
      // Keep the reference on the tensor's rounding path (f32 state drifts otherwise).
      p[k] = params[k].tensor.template ToVector<double>();
    }
  }
  EXPECT_EQ(opt.steps(), steps);
}

class OptimizerDTypeTest : public ::testing::TestWithParam<DType> {
 protected:
  double tol() const { return GetParam() == DType::kF64 ? 1e-14 : 3e-6; }
};

TEST_P(OptimizerDTypeTest, SgdPlainMatchesScalarReference) {
  Sgd opt({.lr = 0.1});
  Compare(opt, RefSgd{0.1, 0, 0, false, {}}, GetParam(), tol());
}

TEST_P(OptimizerDTypeTest, SgdMomentumAndWeightDecayMatchScalarReference) {
  Sgd opt({.lr = 0.05, .momentum = 0.9, .weight_decay = 0.1});
  Compare(opt, RefSgd{0.05, 0.9, 0.1, false, {}}, GetParam(), tol());
  EXPECT_TRUE(opt.momentum_buffer("w").defined());
}

TEST_P(OptimizerDTypeTest, SgdNesterovMatchesScalarReference) {
  Sgd opt({.lr = 0.05, .momentum = 0.8, .nesterov = true});
  Compare(opt, RefSgd{0.05, 0.8, 0, true, {}}, GetParam(), tol());
}

TEST_P(OptimizerDTypeTest, AdamWMatchesScalarReference) {
  AdamW opt({.lr = 0.01, .beta1 = 0.9, .beta2 = 0.99, .eps = 1e-8, .weight_decay = 0.05});
  Compare(opt, RefAdamW{0.01, 0.9, 0.99, 1e-8, 0.05}, GetParam(), tol(), 8);
  EXPECT_EQ(opt.exp_avg("w").dtype(), GetParam());
  EXPECT_EQ(opt.exp_avg_sq("b").shape(), Shape({5}));
}

TEST_P(OptimizerDTypeTest, AdamWWithoutWeightDecayMatchesScalarReference) {
  AdamW opt({.lr = 0.02, .weight_decay = 0});
  Compare(opt, RefAdamW{0.02, 0.9, 0.999, 1e-8, 0}, GetParam(), tol(), 8);
}

INSTANTIATE_TEST_SUITE_P(DTypes, OptimizerDTypeTest, ::testing::Values(DType::kF32, DType::kF64),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

TEST(OptimizerTest, FirstAdamWStepMovesEachWeightByAboutLr) {
  // With bias correction, step 1 is lr * g / (|g| + eps): every weight moves by ~lr.
  AdamW opt({.lr = 0.01, .weight_decay = 0});
  std::vector<NamedTensor> params = {{"w", Tensor::FromVector<float>({3}, {1, 2, 3})}};
  std::vector<NamedTensor> grads = {{"w", Tensor::FromVector<float>({3}, {1e-3f, -5, 40})}};
  ASSERT_TRUE(opt.Step(params, grads).ok());
  EXPECT_NEAR(params[0].tensor.at(0), 1 - 0.01, 1e-6);
  EXPECT_NEAR(params[0].tensor.at(1), 2 + 0.01, 1e-6);
  EXPECT_NEAR(params[0].tensor.at(2), 3 - 0.01, 1e-6);
}

TEST(OptimizerTest, RejectsLowPrecisionMastersMissingAndMismatchedGradients) {
  AdamW opt;
  std::vector<NamedTensor> bf = {{"w", Tensor::Zeros({2}, DType::kBF16)}};
  absl::Status s = opt.Step(bf, {{"w", Tensor::Zeros({2}, DType::kBF16)}});
  EXPECT_FALSE(s.ok());
  EXPECT_NE(std::string(s.message()).find("master weights must be f32"), std::string::npos) << s;

  std::vector<NamedTensor> p = {{"w", Tensor::Zeros({2})}, {"b", Tensor::Zeros({1})}};
  s = opt.Step(p, {{"w", Tensor::Zeros({2})}});
  EXPECT_NE(std::string(s.message()).find("no gradient for parameter 'b'"), std::string::npos)
      << s;
  s = opt.Step(p, {{"w", Tensor::Zeros({2}, DType::kBF16)}, {"b", Tensor::Zeros({1})}});
  EXPECT_NE(std::string(s.message()).find("cast the gradient"), std::string::npos) << s;
  s = opt.Step(p, {{"w", Tensor::Zeros({3})}, {"b", Tensor::Zeros({1})}});
  EXPECT_FALSE(s.ok());
  std::vector<NamedTensor> dup = {{"w", Tensor::Zeros({2})}, {"w", Tensor::Zeros({2})}};
  EXPECT_FALSE(opt.Step(dup, {{"w", Tensor::Zeros({2})}}).ok());
  // Nothing was applied by the failed calls.
  EXPECT_EQ(opt.steps(), 0);
  EXPECT_FALSE(opt.exp_avg("w").defined());
}

TEST(OptimizerTest, NoDecayNamesSkipOnlyTheDecoupledDecay) {
  // Zero gradients: the Adam update is 0, so only the decay moves a weight.
  AdamW opt({.lr = 0.1, .weight_decay = 0.5, .no_decay = {"b"}});
  std::vector<NamedTensor> params = {{"w", Tensor::FromVector<double>({2}, {2, -4})},
                                     {"b", Tensor::FromVector<double>({2}, {2, -4})}};
  std::vector<NamedTensor> grads = {{"w", Tensor::Zeros({2}, DType::kF64)},
                                    {"b", Tensor::Zeros({2}, DType::kF64)}};
  ASSERT_TRUE(opt.Step(params, grads).ok());
  EXPECT_DOUBLE_EQ(params[0].tensor.at(0), 2 * (1 - 0.1 * 0.5));
  EXPECT_DOUBLE_EQ(params[0].tensor.at(1), -4 * (1 - 0.1 * 0.5));
  EXPECT_DOUBLE_EQ(params[1].tensor.at(0), 2);
  EXPECT_DOUBLE_EQ(params[1].tensor.at(1), -4);
}

// grad_scale multiplies every gradient: stepping with scale c equals stepping with c * g (f64
// exact, f32 within rounding); a bad scale is refused before anything changes.
TEST(OptimizerTest, AdamWGradScaleEqualsScaledGradients) {
  for (DType dt : {DType::kF64, DType::kF32}) {
    AdamW a({.lr = 0.01, .weight_decay = 0.1}), b({.lr = 0.01, .weight_decay = 0.1});
    std::vector<NamedTensor> pa = {{"w", Make({4}, Values(4, 3, 1.0), dt)}};
    std::vector<NamedTensor> pb = {{"w", pa[0].tensor.Clone()}};
    for (int s = 0; s < 3; ++s) {
      const std::vector<double> g = Values(4, 40 + s, 2.0);
      std::vector<double> g3(g);
      for (double& x : g3) x *= 0.3;
      ASSERT_TRUE(a.Step(pa, {{"w", Make({4}, g, dt)}}, Tensor::Scalar(0.3, dt)).ok());
      ASSERT_TRUE(b.Step(pb, {{"w", Make({4}, g3, dt)}}).ok());
      EXPECT_TRUE(testing::TensorsNearScaled(pa[0].tensor, pb[0].tensor,
                                             dt == DType::kF64 ? 1e-15 : 1e-6))
          << DTypeName(dt) << " step " << s;
    }
    const absl::Status bad = a.Step(pa, {{"w", Make({4}, Values(4, 9, 1.0), dt)}},
                                    Tensor::Zeros({2}, DType::kF32));
    EXPECT_NE(std::string(bad.message()).find("grad_scale is f32[2]"), std::string::npos) << bad;
    EXPECT_EQ(a.steps(), 3);
  }
}

}  // namespace
}  // namespace shardmap
