// CPU tests of the fused linear ops (the references the cuBLASLt epilogues are tested against in
// tensor/cuda/gemm/gemm_cuda_test.cc): every result is checked against naive loops in double.
#include "tensor/ops/linear.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "tensor/ops/matmul.h"
#include "tensor/ops/shape_ops.h"
#include "tensor/testing/test_util.h"

namespace shardmap {
namespace {

using testing::ExpectAllClose;
using testing::ExpectOpError;
using testing::RandomTensor;

constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kInvSqrt2 = 0.7071067811865476;

double GeluRef(double x, GeluApprox approx) {
  if (approx == GeluApprox::kTanh) {
    return 0.5 * x * (1 + std::tanh(kSqrt2OverPi * (x + 0.044715 * x * x * x)));
  }
  return 0.5 * x * (1 + std::erf(x * kInvSqrt2));
}

double GeluGradRef(double x, GeluApprox approx) {
  if (approx == GeluApprox::kTanh) {
    const double t = std::tanh(kSqrt2OverPi * (x + 0.044715 * x * x * x));
    const double du = kSqrt2OverPi * (1 + 3 * 0.044715 * x * x);
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * du;
  }
  return 0.5 * (1 + std::erf(x * kInvSqrt2)) + x * std::exp(-0.5 * x * x) * 0.3989422804014327;
}

// C[m,n] = A[m,k] B[k,n] (+ bias[n]) from row-major values (already rounded to their dtype).
std::vector<double> NaiveLinear(const std::vector<double>& a, const std::vector<double>& b,
                                const std::vector<double>* bias, int64_t m, int64_t k,
                                int64_t n) {
  std::vector<double> c(m * n, 0.0);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double s = bias ? (*bias)[j] : 0.0;
      for (int64_t p = 0; p < k; ++p) s += a[i * k + p] * b[p * n + j];
      c[i * n + j] = s;
    }
  }
  return c;
}

// Transposes a row-major [r, c] matrix.
std::vector<double> T(const std::vector<double>& v, int64_t r, int64_t c) {
  std::vector<double> t(v.size());
  for (int64_t i = 0; i < r; ++i) {
    for (int64_t j = 0; j < c; ++j) t[j * r + i] = v[i * c + j];
  }
  return t;
}

std::vector<double> Map(std::vector<double> v, double (*f)(double, GeluApprox), GeluApprox a) {
  for (double& x : v) x = f(x, a);
  return v;
}

// Relative tolerance for an output rounded once to dtype.
double Rtol(DType t) {
  switch (t) {
    case DType::kBF16: return 1.0 / 128;  // 2 ulps of bf16
    case DType::kF16: return 1.0 / 1024;
    case DType::kF32: return 1e-5;
    default: return 1e-12;
  }
}
double Atol(DType t) { return Rtol(t) * 0.1; }

class LinearDTypeTest : public ::testing::TestWithParam<DType> {};

TEST_P(LinearDTypeTest, BiasMatchesNaive) {
  const DType dt = GetParam();
  const Tensor x = RandomTensor({2, 3, 5}, dt, 1);
  const Tensor w = RandomTensor({5, 4}, dt, 2);
  const Tensor b = RandomTensor({4}, dt, 3);
  const LinearResult r = Linear(x, w, b, LinearEpilogue::kBias);
  EXPECT_EQ(r.y.ShapeString(), std::string(DTypeName(dt)) + "[2,3,4]");
  EXPECT_FALSE(r.pre.defined());
  const auto bias = b.ToVector<double>();
  ExpectAllClose(r.y, NaiveLinear(x.ToVector<double>(), w.ToVector<double>(), &bias, 6, 5, 4),
                 Rtol(dt), Atol(dt));
}

TEST_P(LinearDTypeTest, GeluEpiloguesMatchNaive) {
  const DType dt = GetParam();
  const Tensor x = RandomTensor({7, 13}, dt, 4);
  const Tensor w = RandomTensor({13, 9}, dt, 5, -0.5, 0.5);
  const Tensor b = RandomTensor({9}, dt, 6);
  for (GeluApprox approx : {GeluApprox::kTanh, GeluApprox::kNone}) {
    const auto bias = b.ToVector<double>();
    const std::vector<double> pre =
        NaiveLinear(x.ToVector<double>(), w.ToVector<double>(), &bias, 7, 13, 9);
    const LinearResult r = Linear(x, w, b, LinearEpilogue::kBiasGelu, approx);
    ExpectAllClose(r.pre, pre, Rtol(dt), Atol(dt), "pre");
    ExpectAllClose(r.y, Map(pre, GeluRef, approx), Rtol(dt), Atol(dt), "y");

    const std::vector<double> pre_nb =
        NaiveLinear(x.ToVector<double>(), w.ToVector<double>(), nullptr, 7, 13, 9);
    const LinearResult r2 = Linear(x, w, Tensor(), LinearEpilogue::kGelu, approx);
    ExpectAllClose(r2.pre, pre_nb, Rtol(dt), Atol(dt), "pre (no bias)");
    ExpectAllClose(r2.y, Map(pre_nb, GeluRef, approx), Rtol(dt), Atol(dt), "y (no bias)");
  }
}

TEST_P(LinearDTypeTest, GeluBackwardMatchesNaive) {
  const DType dt = GetParam();
  const int64_t m = 6, n = 8, n2 = 5;
  const Tensor dy = RandomTensor({2, 3, n2}, dt, 7);
  const Tensor w = RandomTensor({n, n2}, dt, 8);
  const Tensor pre = RandomTensor({2, 3, n}, dt, 9);
  for (GeluApprox approx : {GeluApprox::kTanh, GeluApprox::kNone}) {
    const LinearGeluGrads g = LinearGeluBackward(dy, w, pre, /*bias_grad=*/true, approx);
    // dh = dy @ w^T
    std::vector<double> dpre = NaiveLinear(dy.ToVector<double>(), T(w.ToVector<double>(), n, n2),
                                           nullptr, m, n2, n);
    const std::vector<double> p = pre.ToVector<double>();
    std::vector<double> dbias(n, 0.0);
    for (int64_t i = 0; i < m * n; ++i) {
      dpre[i] *= GeluGradRef(p[i], approx);
      dbias[i % n] += dpre[i];
    }
    EXPECT_EQ(g.dpre.shape(), pre.shape());
    ExpectAllClose(g.dpre, dpre, Rtol(dt), Atol(dt), "dpre");
    ExpectAllClose(g.dbias, dbias, Rtol(dt) * 4, Atol(dt) * 4, "dbias");
    EXPECT_FALSE(LinearGeluBackward(dy, w, pre, /*bias_grad=*/false, approx).dbias.defined());
  }
}

TEST_P(LinearDTypeTest, WeightGradAndBiasGradMatchNaive) {
  const DType dt = GetParam();
  const Tensor x = RandomTensor({2, 5, 3}, dt, 10);
  const Tensor dy = RandomTensor({2, 5, 4}, dt, 11);
  const LinearWeightGrads g = LinearWeightGrad(x, dy);
  ExpectAllClose(g.dw, NaiveLinear(T(x.ToVector<double>(), 10, 3), dy.ToVector<double>(),
                                   nullptr, 3, 10, 4),
                 Rtol(dt), Atol(dt) * 10, "dw");
  std::vector<double> db(4, 0.0);
  const auto d = dy.ToVector<double>();
  for (size_t i = 0; i < d.size(); ++i) db[i % 4] += d[i];
  ExpectAllClose(g.db, db, Rtol(dt), Atol(dt) * 10, "db");
  ExpectAllClose(BiasGrad(dy), db, Rtol(dt), Atol(dt) * 10, "BiasGrad");
  EXPECT_EQ(BiasGrad(dy).ShapeString(), std::string(DTypeName(dt)) + "[4]");
  EXPECT_FALSE(LinearWeightGrad(x, dy, /*bias_grad=*/false).db.defined());
}

TEST_P(LinearDTypeTest, MatmulAccumulateAddsTheProductInF32) {
  const DType dt = GetParam();
  const DType acc_dt = dt == DType::kF64 ? DType::kF64 : DType::kF32;
  const Tensor a = RandomTensor({9, 7}, dt, 12);   // used transposed: [7, 9]
  const Tensor b = RandomTensor({9, 5}, dt, 13);
  const Tensor acc0 = RandomTensor({7, 5}, acc_dt, 14);
  Tensor acc = acc0.Clone();
  MatmulAccumulate(acc, a, b, /*trans_a=*/true, /*trans_b=*/false);
  std::vector<double> want =
      NaiveLinear(T(a.ToVector<double>(), 9, 7), b.ToVector<double>(), nullptr, 7, 9, 5);
  const auto a0 = acc0.ToVector<double>();
  for (size_t i = 0; i < want.size(); ++i) want[i] += a0[i];
  // The accumulator is f32 even for half operands: no rounding to the operand dtype.
  ExpectAllClose(acc, want, dt == DType::kF64 ? 1e-12 : 1e-5, 1e-5);
  // Twice is twice.
  MatmulAccumulate(acc, a, b, true, false);
  for (size_t i = 0; i < want.size(); ++i) want[i] = 2 * want[i] - a0[i];
  ExpectAllClose(acc, want, dt == DType::kF64 ? 1e-12 : 1e-5, 1e-5);
}

INSTANTIATE_TEST_SUITE_P(AllFloat, LinearDTypeTest,
                         ::testing::Values(DType::kF32, DType::kF64, DType::kBF16, DType::kF16),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(DTypeName(info.param));
                         });

TEST(LinearTest, NoEpilogueIsMatmul) {
  const Tensor x = RandomTensor({4, 6}, DType::kF32, 15);
  const Tensor w = RandomTensor({6, 3}, DType::kF32, 16);
  const LinearResult r = Linear(x, w, Tensor(), LinearEpilogue::kNone);
  ExpectAllClose(r.y, Matmul(x, w).ToVector<double>(), 0, 0);
}

TEST(LinearTest, HalfOutputsAreRoundedOnce) {
  // (1 + 3/1024) + 3/1024 in bf16 (ulp 1/128 at 1): rounding after the matmul and again after
  // the bias gives 1 both times; one rounding of the exact 1 + 6/1024 gives 1 + 1/128.
  const Tensor x = Tensor::FromVector<float>({1, 2}, {1.0f, 3.0f / 1024}, DType::kBF16);
  const Tensor w = Tensor::FromVector<float>({2, 1}, {1.0f, 1.0f}, DType::kBF16);
  const Tensor b = Tensor::FromVector<float>({1}, {3.0f / 1024}, DType::kBF16);
  const LinearResult r = Linear(x, w, b, LinearEpilogue::kBias);
  EXPECT_EQ(r.y.at(0), 1.0 + 1.0 / 128);
}

TEST(LinearTest, EmptyDims) {
  const Tensor x = Tensor::Zeros({0, 4});
  const Tensor w = RandomTensor({4, 8}, DType::kF32, 17);
  const Tensor b = RandomTensor({8}, DType::kF32, 18);
  EXPECT_EQ(Linear(x, w, b, LinearEpilogue::kBiasGelu).y.ShapeString(), "f32[0,8]");
  // k = 0: the product is empty, y is the bias.
  const LinearResult r =
      Linear(Tensor::Zeros({3, 0}), Tensor::Zeros({0, 8}), b, LinearEpilogue::kBias);
  std::vector<double> want;
  for (int i = 0; i < 3; ++i) {
    for (double v : b.ToVector<double>()) want.push_back(v);
  }
  ExpectAllClose(r.y, want, 0, 0);
  ExpectAllClose(BiasGrad(Tensor::Zeros({0, 3})), {0, 0, 0}, 0, 0);
  const LinearWeightGrads g = LinearWeightGrad(Tensor::Zeros({0, 2}), Tensor::Zeros({0, 3}));
  ExpectAllClose(g.dw, std::vector<double>(6, 0.0), 0, 0);
  Tensor acc = Tensor::Full({2, 3}, 1.5);
  MatmulAccumulate(acc, Tensor::Zeros({2, 0}), Tensor::Zeros({0, 3}));
  ExpectAllClose(acc, std::vector<double>(6, 1.5), 0, 0);
}

TEST(LinearTest, MatmulShapeFollowsMatmul) {
  const Tensor a = Tensor::Zeros({2, 3, 4}), b = Tensor::Zeros({4, 5});
  EXPECT_EQ(ShapeToString(MatmulShape(a, b)), "[2,3,5]");
  EXPECT_EQ(ShapeToString(MatmulShape(Tensor::Zeros({2, 4, 3}), Tensor::Zeros({2, 5, 4}), true,
                                      true)),
            "[2,3,5]");
  ExpectOpError([&] { MatmulShape(a, Tensor::Zeros({3, 5})); }, {"matmul", "contracted"});
}

TEST(LinearTest, Errors) {
  const Tensor x = Tensor::Zeros({2, 4}), w = Tensor::Zeros({4, 3}), b = Tensor::Zeros({3});
  ExpectOpError([&] { Linear(x, w, Tensor(), LinearEpilogue::kBias); },
                {"linear", "bias is undefined"});
  ExpectOpError([&] { Linear(x, w, b, LinearEpilogue::kGelu); },
                {"linear", "f32[3]", "without bias"});
  ExpectOpError([&] { Linear(x, w, Tensor::Zeros({4}), LinearEpilogue::kBias); },
                {"linear", "bias f32[4]", "[3]"});
  ExpectOpError([&] { Linear(x, Tensor::Zeros({5, 3}), b, LinearEpilogue::kBias); },
                {"matmul", "f32[2,4] @ f32[5,3]"});
  ExpectOpError([&] { Linear(x, Tensor::Zeros({2, 4, 3}), b, LinearEpilogue::kBias); },
                {"linear", "rank 2"});
  ExpectOpError([&] { Linear(x, w, Tensor::Zeros({3}, DType::kF64), LinearEpilogue::kBias); },
                {"linear", "dtype"});
  ExpectOpError(
      [&] { LinearGeluBackward(Tensor::Zeros({2, 3}), w, Tensor::Zeros({2, 5})); },
      {"linear_gelu_backward", "[2,4]", "pre is f32[2,5]"});
  ExpectOpError([&] { LinearWeightGrad(Tensor::Zeros({2, 4}), Tensor::Zeros({3, 4})); },
                {"linear_weight_grad", "leading dims"});
  Tensor acc16 = Tensor::Zeros({2, 3}, DType::kBF16);
  ExpectOpError(
      [&] {
        MatmulAccumulate(acc16, Tensor::Zeros({2, 4}, DType::kBF16),
                         Tensor::Zeros({4, 3}, DType::kBF16));
      },
      {"matmul_accumulate", "must be f32", "bf16 operands"});
  Tensor acc = Tensor::Zeros({3, 3});
  ExpectOpError([&] { MatmulAccumulate(acc, x, w); },
                {"matmul_accumulate", "f32[3,3]", "[2,3]"});
}

}  // namespace
}  // namespace shardmap
