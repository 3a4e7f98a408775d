#include "tensor/ops/elementwise.h"

#include <cmath>
#include <functional>

#include "gtest/gtest.h"
#include "tensor/ops/shape_ops.h"
#include "tensor/testing/test_util.h"

namespace shardmap {
namespace {

using testing::BroadcastSource;
using testing::ExpectAllClose;
using testing::ExpectGradMatchesFiniteDiff;
using testing::ExpectOpError;
using testing::RandomTensor;
using testing::Unflatten;

struct BinCase {
  Shape a, b, out;
};

const std::vector<BinCase>& BroadcastCases() {
  static const auto* cases = new std::vector<BinCase>{
      {{3, 5}, {3, 5}, {3, 5}},
      {{1037}, {1037}, {1037}},  // long enough for vector body plus tail
      {{4, 1, 3}, {2, 3}, {4, 2, 3}},
      {{1}, {2, 3}, {2, 3}},
      {{}, {2, 3}, {2, 3}},
      {{2, 3}, {}, {2, 3}},
      {{2, 1}, {1, 3}, {2, 3}},
      {{5, 1, 1, 4}, {3, 1}, {5, 1, 3, 4}},
      {{0, 3}, {3}, {0, 3}},
      {{2, 3, 1}, {1, 1, 7}, {2, 3, 7}},
      {{3, 1, 5}, {3, 4, 5}, {3, 4, 5}},
      {{1, 1}, {1}, {1, 1}},
      {{6, 7}, {7}, {6, 7}},
      {{6, 7}, {6, 1}, {6, 7}},
      {{9, 37}, {37}, {9, 37}},  // a bias row: vector kernel per row, with a tail
      {{2, 5, 35}, {5, 35}, {2, 5, 35}},
  };
  return *cases;
}

double RefOp(char op, double x, double y) {
  switch (op) {
    case '+': return x + y;
    case '-': return x - y;
    case '*': return x * y;
    default: return x / y;
  }
}

Tensor Apply(char op, const Tensor& a, const Tensor& b) {
  switch (op) {
    case '+': return Add(a, b);
    case '-': return Sub(a, b);
    case '*': return Mul(a, b);
    default: return Div(a, b);
  }
}

// Naive reference: every output element computed from its multi-index, in the dtype's compute
// precision (f64 for f64, f32 otherwise), then rounded once to the dtype.
std::vector<double> RefBinary(char op, const Tensor& a, const Tensor& b, const Shape& out,
                              DType dtype) {
  std::vector<double> r(NumElements(out));
  for (int64_t i = 0; i < static_cast<int64_t>(r.size()); ++i) {
    const auto idx = Unflatten(out, i);
    const double x = a.at(BroadcastSource(a.shape(), idx));
    const double y = b.at(BroadcastSource(b.shape(), idx));
    if (dtype == DType::kF64) {
      r[i] = RefOp(op, x, y);
    } else {
      const float f = static_cast<float>(RefOp(op, static_cast<float>(x), static_cast<float>(y)));
      r[i] = dtype == DType::kF32   ? f
             : dtype == DType::kBF16 ? BF16ToFloat(FloatToBF16(f))
                                     : F16ToFloat(FloatToF16(f));
    }
  }
  return r;
}

TEST(ElementwiseTest, BinaryOpsBroadcastAgainstNaiveLoops) {
  uint32_t seed = 1;
  for (DType dt : {DType::kF32, DType::kF64, DType::kBF16, DType::kF16}) {
    for (const BinCase& c : BroadcastCases()) {
      const Tensor a = RandomTensor(c.a, dt, seed++);
      const Tensor b = RandomTensor(c.b, dt, seed++, 0.5, 3.0);  // away from 0 for div
      for (char op : {'+', '-', '*', '/'}) {
        const Tensor got = Apply(op, a, b);
        ASSERT_EQ(got.shape(), c.out) << a.ShapeString() << op << b.ShapeString();
        ASSERT_EQ(got.dtype(), dt);
        // Exact: one operation, one rounding, both sides.
        ExpectAllClose(got, RefBinary(op, a, b, c.out, dt), 0, 0,
                       a.ShapeString() + " " + op + " " + b.ShapeString());
        const Tensor swapped = Apply(op, b, a);
        ExpectAllClose(swapped, RefBinary(op, b, a, c.out, dt), 0, 0, "swapped");
      }
    }
  }
}

TEST(ElementwiseTest, BroadcastShapes) {
  EXPECT_EQ(BroadcastShapes("t", {8, 1, 6, 1}, {7, 1, 5}), (Shape{8, 7, 6, 5}));
  EXPECT_EQ(BroadcastShapes("t", {}, {}), Shape{});
  EXPECT_EQ(BroadcastShapes("t", {0}, {1}), Shape{0});
  ExpectOpError([] { BroadcastShapes("myop", {2, 3}, {4}); },
                {"myop", "[2,3]", "[4]", "dim -1", "3 vs 4"});
}

TEST(ElementwiseTest, BinaryErrors) {
  const Tensor a = Tensor::Zeros({2, 3}), b = Tensor::Zeros({3, 2});
  ExpectOpError([&] { Add(a, b); }, {"add", "f32[2,3]", "f32[3,2]", "broadcast"});
  ExpectOpError([&] { Mul(a, Tensor::Zeros({2, 3}, DType::kF64)); },
                {"mul", "dtype mismatch", "f32[2,3]", "f64[2,3]"});
  ExpectOpError([&] { Sub(Tensor::Zeros({2}, DType::kI64), Tensor::Zeros({2}, DType::kI64)); },
                {"sub", "i64[2]", "floating"});
  ExpectOpError([&] { Div(a, Tensor()); }, {"div", "undefined"});
  ExpectOpError([&] { Exp(Tensor::Zeros({2}, DType::kI32)); }, {"exp", "i32[2]", "floating"});
  ExpectOpError([&] { GeluGrad(a, Tensor::Zeros({3})); }, {"gelu_grad", "shape mismatch"});
  Tensor acc = Tensor::Zeros({2, 3});
  ExpectOpError([&] { AddInPlace(acc, Tensor::Zeros({3})); },
                {"add_in_place", "f32[2,3]", "f32[3]"});
  ExpectOpError([&] { AddInPlace(acc, Tensor::Zeros({2, 3}, DType::kF64)); },
                {"add_in_place", "dtype"});
}

// Independent scalar formulas for the unary ops.
double RefGeluTanh(double x) {
  return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}
double RefGeluErf(double x) { return x * 0.5 * std::erfc(-x / std::sqrt(2.0)); }
double RefSilu(double x) { return x / (1 + std::exp(-x)); }

TEST(ElementwiseTest, UnaryOpsAgainstFormulas) {
  struct U {
    const char* name;
    std::function<Tensor(const Tensor&)> op;
    std::function<double(double)> ref;
  };
  const std::vector<U> ops = {
      {"exp", [](const Tensor& t) { return Exp(t); }, [](double x) { return std::exp(x); }},
      {"log", [](const Tensor& t) { return Log(t); }, [](double x) { return std::log(x); }},
      {"tanh", [](const Tensor& t) { return Tanh(t); }, [](double x) { return std::tanh(x); }},
      {"relu", [](const Tensor& t) { return Relu(t); }, [](double x) { return x > 0 ? x : 0; }},
      {"sqrt", [](const Tensor& t) { return Sqrt(t); }, [](double x) { return std::sqrt(x); }},
      {"neg", [](const Tensor& t) { return Neg(t); }, [](double x) { return -x; }},
      {"gelu_tanh", [](const Tensor& t) { return Gelu(t, GeluApprox::kTanh); }, RefGeluTanh},
      {"gelu_erf", [](const Tensor& t) { return Gelu(t, GeluApprox::kNone); }, RefGeluErf},
      {"silu", [](const Tensor& t) { return Silu(t); }, RefSilu},
      {"add_scalar", [](const Tensor& t) { return AddScalar(t, 1.5); },
       [](double x) { return x + 1.5; }},
      {"mul_scalar", [](const Tensor& t) { return MulScalar(t, -3.0); },
       [](double x) { return -3 * x; }},
  };
  for (const U& u : ops) {
    const bool positive = std::string(u.name) == "log" || std::string(u.name) == "sqrt";
    for (DType dt : {DType::kF64, DType::kF32, DType::kBF16}) {
      const Tensor x = RandomTensor({3, 37}, dt, 5, positive ? 0.1 : -4.0, 4.0);
      std::vector<double> want(x.numel());
      for (int64_t i = 0; i < x.numel(); ++i) want[i] = u.ref(x.at(i));
      const Tensor y = u.op(x);
      ASSERT_EQ(y.shape(), x.shape());
      ASSERT_EQ(y.dtype(), dt);
      // f64 to a few ulps; f32 to float precision; bf16 to half a bf16 ulp plus f32 error.
      const double rtol = dt == DType::kF64 ? 1e-14 : dt == DType::kF32 ? 3e-6 : 4e-3;
      ExpectAllClose(y, want, rtol, dt == DType::kF64 ? 1e-15 : 1e-6, u.name);
    }
    // Empty and rank-0 inputs.
    EXPECT_EQ(u.op(Tensor::Zeros({0, 4})).shape(), (Shape{0, 4}));
    EXPECT_EQ(u.op(Tensor::Scalar(positive ? 2.0 : -0.5, DType::kF64)).item(),
              u.ref(positive ? 2.0 : -0.5));
  }
}

TEST(ElementwiseTest, NaNPropagatesThroughRelu) {
  const Tensor y = Relu(Tensor::FromVector<float>({3}, {std::nanf(""), -1.0f, 2.0f}));
  EXPECT_TRUE(std::isnan(y.at(0)));
  EXPECT_EQ(y.at(1), 0.0);
  EXPECT_EQ(y.at(2), 2.0);
}

TEST(ElementwiseTest, HalfUnaryRoundsOnceFromF32) {
  const Tensor x = RandomTensor({64}, DType::kF16, 8);
  const Tensor y = Exp(x);
  for (int64_t i = 0; i < x.numel(); ++i) {
    ASSERT_EQ(y.at(i), F16ToFloat(FloatToF16(std::exp(static_cast<float>(x.at(i))))));
  }
}

TEST(ElementwiseTest, BackwardKernelsMatchFiniteDifferences) {
  // Inputs kept away from relu's kink at 0.
  Tensor x = RandomTensor({4, 7}, DType::kF64, 11);
  for (int64_t i = 0; i < x.numel(); ++i) {
    double& v = x.data<double>()[i];
    if (std::fabs(v) < 0.05) v += 0.1;
  }
  ExpectGradMatchesFiniteDiff(
      x, [](const Tensor& t) { return Relu(t); },
      [](const Tensor& t, const Tensor& dy) { return ReluGrad(t, dy); });
  for (GeluApprox a : {GeluApprox::kTanh, GeluApprox::kNone}) {
    ExpectGradMatchesFiniteDiff(
        x, [a](const Tensor& t) { return Gelu(t, a); },
        [a](const Tensor& t, const Tensor& dy) { return GeluGrad(t, dy, a); });
  }
  ExpectGradMatchesFiniteDiff(
      x, [](const Tensor& t) { return Silu(t); },
      [](const Tensor& t, const Tensor& dy) { return SiluGrad(t, dy); });
  ExpectGradMatchesFiniteDiff(
      x, [](const Tensor& t) { return Tanh(t); },
      [](const Tensor& t, const Tensor& dy) { return TanhGrad(Tanh(t), dy); });
  // f32 kernels agree with the f64 ones.
  const Tensor dy = RandomTensor({4, 7}, DType::kF64, 12);
  const Tensor g64 = GeluGrad(x, dy, GeluApprox::kNone);
  const Tensor g32 = GeluGrad(Cast(x, DType::kF32), Cast(dy, DType::kF32), GeluApprox::kNone);
  ExpectAllClose(g32, g64.ToVector<double>(), 1e-5, 1e-6, "gelu_grad f32");
}

TEST(ElementwiseTest, AddInPlaceWithOverlappingViewsReadsXAsBefore) {
  for (DType dt : {DType::kF32, DType::kF64, DType::kBF16, DType::kF16}) {
    // x one element behind acc, and one ahead: NumPy semantics, acc[i] = t[i+1] + t[i] (resp.
    // t[i] + t[i+1]) with t as it was, whichever direction a sequential loop would run over.
    for (int shift : {-1, 1}) {
      Tensor t = Cast(Tensor::Arange(40).Reshape({40}), dt);
      const std::vector<double> before = t.ToVector<double>();
      Tensor acc = t.SliceRows(shift < 0 ? 1 : 0, 39);
      AddInPlace(acc, t.SliceRows(shift < 0 ? 0 : 1, 39));
      std::vector<double> want(39);
      for (int i = 0; i < 39; ++i) want[i] = before[i] + before[i + 1];
      ExpectAllClose(acc, want, 0, 0, DTypeName(dt));
    }
    Tensor same = Cast(Tensor::Arange(5).Reshape({5}), dt);
    AddInPlace(same, same);  // x == acc exactly: doubled
    ExpectAllClose(same, {0, 2, 4, 6, 8}, 0, 0, DTypeName(dt));
  }
}

TEST(ElementwiseTest, AddInPlace) {
  for (DType dt : {DType::kF32, DType::kF64, DType::kBF16, DType::kF16}) {
    Tensor acc = RandomTensor({3, 5}, dt, 21);
    const Tensor before = acc.Clone();
    const Tensor x = RandomTensor({3, 5}, dt, 22);
    AddInPlace(acc, x);
    ExpectAllClose(acc, RefBinary('+', before, x, {3, 5}, dt), 0, 0, DTypeName(dt));
  }
}

}  // namespace
}  // namespace shardmap
