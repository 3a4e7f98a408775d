// The f32 CPU ops that run on the vector kernels (tensor/cpu/vec_math.h) against the same ops in
// f64 (the scalar reference paths), on rows of odd lengths that exercise the vector tails, IEEE
// edge values, and rows holding NaN / +inf / only -inf (whose NaN patterns must match f64's).
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tensor/ops/elementwise.h"
#include "tensor/ops/nn.h"
#include "tensor/ops/reduce.h"
#include "tensor/ops/shape_ops.h"
#include "tensor/testing/test_util.h"

namespace shardmap {
namespace {

using testing::ExpectAllClose;
using testing::RandomTensor;

const double kInf = std::numeric_limits<double>::infinity();
const double kNaN = std::numeric_limits<double>::quiet_NaN();

// f32 result vs the f64 op on the same (f32-representable) inputs, rounded to f32.
void ExpectF32MatchesF64(const std::function<Tensor(const std::vector<Tensor>&)>& op,
                         const std::vector<Tensor>& in64, double rtol, double atol,
                         const std::string& what) {
  std::vector<Tensor> in32;
  for (const Tensor& t : in64) {
    in32.push_back(IsFloating(t.dtype()) ? Cast(t, DType::kF32) : t);
  }
  const Tensor want = Cast(op(in64), DType::kF32);
  ExpectAllClose(op(in32), want.ToVector<double>(), rtol, atol, what);
}

// [5, n]: three random rows, then special rows (NaN in the tail, +inf first, all -inf).
Tensor Rows(int64_t n, uint32_t seed, double lo, double hi, bool specials) {
  std::vector<double> v = RandomTensor({5, n}, DType::kF32, seed, lo, hi).ToVector<double>();
  if (specials) {
    v[3 * n + n - 1] = kNaN;
    v[4 * n] = kInf;
  }
  return Tensor::FromVector<double>({5, n}, v, DType::kF64);
}

const std::vector<int64_t> kLengths = {1, 7, 17, 1023};

TEST(VecPathsTest, ElementwiseOpsOnEdgeValuesAndTails) {
  const std::vector<double> edges = {0,    -0.0, kInf,  -kInf,   kNaN,   3e38, -3e38, 1e20,
                                     -1e20, 1e-30, -1e-30, 1e-40, -1e-40, 88.7, -88.7, -104,
                                     20,   -20,  -0.75, 0.5,     -5,     -10,  1};
  std::vector<Tensor> inputs = {Cast(
      Tensor::FromVector<double>({static_cast<int64_t>(edges.size())}, edges, DType::kF32),
      DType::kF64)};
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{17}, int64_t{1023}}) {
    inputs.push_back(Cast(Cast(RandomTensor({n}, DType::kF64, 10 + n, -8, 8), DType::kF32),
                          DType::kF64));
  }
  using Op = std::function<Tensor(const std::vector<Tensor>&)>;
  const std::vector<std::pair<const char*, Op>> unary = {
      {"exp", [](auto& t) { return Exp(t[0]); }},
      {"log", [](auto& t) { return Log(t[0]); }},
      {"tanh", [](auto& t) { return Tanh(t[0]); }},
      {"silu", [](auto& t) { return Silu(t[0]); }},
      {"gelu_tanh", [](auto& t) { return Gelu(t[0], GeluApprox::kTanh); }},
      {"gelu_erf", [](auto& t) { return Gelu(t[0], GeluApprox::kNone); }},
      {"gelu_tanh_grad", [](auto& t) { return GeluGrad(t[0], t[1], GeluApprox::kTanh); }},
      {"gelu_erf_grad", [](auto& t) { return GeluGrad(t[0], t[1], GeluApprox::kNone); }},
      {"silu_grad", [](auto& t) { return SiluGrad(t[0], t[1]); }},
  };
  for (const Tensor& x : inputs) {
    const Tensor dy = Cast(Cast(RandomTensor(x.shape(), DType::kF64, 7, -2, 2), DType::kF32),
                           DType::kF64);
    for (const auto& [name, op] : unary) {
      // f64 keeps the textbook formulas, which lose everything to cancellation or overflow where
      // the f32 kernels do not (gelu at x = -10, gelu' at x = 1e20): compare those within 1e-6
      // absolute, the rest within a few f32 ulps.
      const bool edge = x.numel() == static_cast<int64_t>(edges.size());
      const bool grad = std::string(name).find("grad") != std::string::npos;
      if (edge && grad) continue;  // the f64 formulas give NaN for finite huge x
      ExpectF32MatchesF64(op, {x, dy}, 4e-7, 1e-6, std::string(name) + " n=" +
                                                       std::to_string(x.numel()));
    }
  }
}

TEST(VecPathsTest, SoftmaxFamilyOnOddRowsAndSpecialRows) {
  uint32_t seed = 1;
  for (int64_t n : kLengths) {
    Tensor x = Rows(n, seed++, -20, 20, /*specials=*/true);
    std::vector<double> v = x.ToVector<double>();
    for (int64_t j = 0; j < n; ++j) v[2 * n + j] = -kInf;  // an all -inf row: NaN
    x = Tensor::FromVector<double>({5, n}, v, DType::kF64);
    const Tensor dy = Rows(n, seed++, -1, 1, false);
    const std::string tag = " n=" + std::to_string(n);
    ExpectF32MatchesF64([](auto& t) { return Softmax(t[0], -1); }, {x}, 1e-5, 1e-7,
                        "softmax" + tag);
    ExpectF32MatchesF64([](auto& t) { return LogSoftmax(t[0], -1); }, {x}, 1e-5, 1e-5,
                        "log_softmax" + tag);
    const Tensor xf = Rows(n, seed++, -20, 20, false);
    ExpectF32MatchesF64([](auto& t) { return SoftmaxBackward(Softmax(t[0], -1), t[1], -1); },
                        {xf, dy}, 1e-5, 1e-6, "softmax_backward" + tag);
    ExpectF32MatchesF64(
        [](auto& t) { return LogSoftmaxBackward(LogSoftmax(t[0], -1), t[1], -1); }, {xf, dy},
        1e-5, 1e-5, "log_softmax_backward" + tag);
    const Tensor targets = Tensor::FromVector<int64_t>({5}, {0, n - 1, n / 2, 0, n - 1});
    const Tensor dloss = Rows(1, seed++, 0.5, 1.5, false).Reshape({5});
    ExpectF32MatchesF64([&](auto& t) { return CrossEntropy(t[0], targets); }, {x}, 1e-5, 1e-5,
                        "cross_entropy" + tag);
    ExpectF32MatchesF64([&](auto& t) { return CrossEntropyBackward(t[0], targets, t[1]); },
                        {x, dloss}, 1e-5, 1e-6, "cross_entropy_backward" + tag);
  }
}

TEST(VecPathsTest, NormsAndRowReductions) {
  uint32_t seed = 50;
  for (int64_t n : kLengths) {
    const Tensor x = Rows(n, seed++, -3, 5, /*specials=*/true);
    const Tensor gamma = Rows(n, seed++, 0.5, 1.5, false).SliceRows(0, 1).Reshape({n});
    const Tensor beta = Rows(n, seed++, -1, 1, false).SliceRows(0, 1).Reshape({n});
    const std::string tag = " n=" + std::to_string(n);
    ExpectF32MatchesF64([](auto& t) { return LayerNorm(t[0], t[1], t[2], 1e-5).y; },
                        {x, gamma, beta}, 1e-5, 1e-5, "layer_norm y" + tag);
    ExpectF32MatchesF64([](auto& t) { return LayerNorm(t[0], t[1], t[2], 1e-5).rstd; },
                        {x, gamma, beta}, 1e-5, 1e-5, "layer_norm rstd" + tag);
    ExpectF32MatchesF64([](auto& t) { return RmsNorm(t[0], t[1], 1e-5).y; }, {x, gamma}, 1e-5,
                        1e-5, "rms_norm y" + tag);
    ExpectF32MatchesF64([](auto& t) { return Sum(t[0], {-1}); }, {x}, 1e-6, 1e-6, "sum" + tag);
    ExpectF32MatchesF64([](auto& t) { return Mean(t[0], {-1}); }, {x}, 1e-6, 1e-6, "mean" + tag);
    ExpectF32MatchesF64([](auto& t) { return Max(t[0], {-1}); }, {x}, 0, 0, "max" + tag);
    ExpectF32MatchesF64([](auto& t) { return Max(t[0], {0, 1}); }, {x}, 0, 0, "max all" + tag);
    ExpectF32MatchesF64([n](auto& t) { return Sum(t[0].Reshape({5, 1, n}), {1, 2}); }, {x}, 1e-6,
                        1e-6, "sum trailing" + tag);
  }
}

// The norm backwards on the vector passes, against the f64 path: 5 rows, odd lengths, one row at
// a time and (rows of 4096 and more) a 4-row group then a single row; dx, dgamma, dbeta (dgamma
// and dbeta sum over the rows).
TEST(VecPathsTest, NormBackwardsOnRowGroups) {
  uint32_t seed = 70;
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1023}, int64_t{4099}}) {
    const Tensor x = Rows(n, seed++, -3, 5, /*specials=*/false);
    const Tensor dy = Rows(n, seed++, -2, 2, /*specials=*/false);
    const Tensor gamma = Rows(n, seed++, 0.5, 1.5, false).SliceRows(0, 1).Reshape({n});
    const std::string tag = " n=" + std::to_string(n);
    auto ln = [](const std::vector<Tensor>& t, int out) {
      const LayerNormResult f = LayerNorm(t[0], t[1], Tensor(), 1e-5);
      const LayerNormGrads g = LayerNormBackward(t[0], t[1], f.mean, f.rstd, t[2]);
      return out == 0 ? g.dx : out == 1 ? g.dgamma : g.dbeta;
    };
    for (int out : {0, 1, 2}) {
      ExpectF32MatchesF64([&](auto& t) { return ln(t, out); }, {x, gamma, dy}, 1e-4, 1e-4,
                          "layer_norm_backward output " + std::to_string(out) + tag);
    }
    auto rms = [](const std::vector<Tensor>& t, bool dgamma) {
      const RmsNormGrads g = RmsNormBackward(t[0], t[1], RmsNorm(t[0], t[1], 1e-5).rstd, t[2]);
      return dgamma ? g.dgamma : g.dx;
    };
    for (bool dgamma : {false, true}) {
      ExpectF32MatchesF64([&](auto& t) { return rms(t, dgamma); }, {x, gamma, dy}, 1e-4, 1e-4,
                          std::string("rms_norm_backward ") + (dgamma ? "dgamma" : "dx") + tag);
    }
  }
}

}  // namespace
}  // namespace shardmap
