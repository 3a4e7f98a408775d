// The CUDA elementwise kernels against the CPU ops on the same inputs: every op, every float
// dtype, edge shapes (empty, one element, odd sizes, a long row, misaligned views) and every
// broadcast path. Skips without a GPU; the error paths that need no GPU run everywhere.
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tensor/cuda/elementwise/compare_test_util.h"
#include "tensor/cuda/runtime.h"
#include "tensor/error.h"
#include "tensor/ops/elementwise.h"
#include "tensor/ops/shape_ops.h"
#include "tensor/tensor.h"
#include "tensor/testing/test_util.h"

namespace shardmap {
namespace {

using testing::Dev;
using testing::ExpectMatchesCpu;
using testing::ExpectOpError;
using testing::Host;
using testing::kExact;
using testing::kTranscendental;
using testing::kUlp;
using testing::RandomTensor;
using testing::Tol;

const DType kFloatTypes[] = {DType::kF32, DType::kF64, DType::kBF16, DType::kF16};

std::string Name(const char* op, DType t, const Shape& s) {
  return std::string(op) + " " + DTypeName(t) + ShapeToString(s);
}

const std::vector<Shape>& EdgeShapes() {
  static const std::vector<Shape> shapes = {
      {0}, {1}, {}, {7}, {7, 13}, {3, 0, 5}, {2, 3, 4, 5, 6}, {1, 1000003}};
  return shapes;
}

struct BinaryCase {
  const char* name;
  std::function<Tensor(const Tensor&, const Tensor&)> fn;
  Tol tol;
};

std::vector<BinaryCase> ArithmeticOps() {
  return {{"add", [](const Tensor& a, const Tensor& b) { return Add(a, b); }, kUlp},
          {"sub", [](const Tensor& a, const Tensor& b) { return Sub(a, b); }, kUlp},
          {"mul", [](const Tensor& a, const Tensor& b) { return Mul(a, b); }, kUlp},
          {"div", [](const Tensor& a, const Tensor& b) { return Div(a, b); }, kUlp}};
}

TEST(ElementwiseCudaTest, WithoutAGpuCudaTensorsAreAnOpError) {
  if (cuda::Available()) GTEST_SKIP() << "a GPU is present";
  EXPECT_THROW(Tensor::Zeros({2}, DType::kF32, Device::Cuda(0)), OpError);
  EXPECT_THROW(Tensor::Ones({2}).To(Device::Cuda(0)), OpError);
}

TEST(ElementwiseCudaTest, BinarySameShape) {
  SKIP_WITHOUT_GPU();
  uint32_t seed = 1;
  for (const BinaryCase& op : ArithmeticOps()) {
    for (DType t : kFloatTypes) {
      for (const Shape& s : EdgeShapes()) {
        const Tensor a = RandomTensor(s, t, seed++);
        const Tensor b = RandomTensor(s, t, seed++, 0.25, 3.0);  // no division by ~0
        ExpectMatchesCpu(Host(op.fn(Dev(a), Dev(b))), op.fn(a, b), op.tol, Name(op.name, t, s));
      }
    }
  }
}

TEST(ElementwiseCudaTest, BinaryBroadcastEveryPath) {
  SKIP_WITHOUT_GPU();
  const std::vector<std::pair<Shape, Shape>> pairs = {
      {{4, 8}, {8}},                      // bias over rows (vector path)
      {{8}, {4, 8}},                      // bias as lhs
      {{5, 7}, {7}},                      // bias, odd width (scalar path)
      {{3, 1000003}, {1000003}},          // a long bias row
      {{7, 13}, {1}},                     // scalar rhs
      {{1}, {7, 13}},                     // scalar lhs
      {{7, 13}, {}},                      // rank-0 rhs
      {{}, {1, 1000003}},                 // rank-0 lhs, long row
      {{7, 1}, {1, 13}},                  // outer product
      {{7, 13}, {7, 1}},                  // column broadcast
      {{1, 5}, {5}},                      // equal after dropping size-1 dims
      {{1, 1}, {1}},                      // one element
      {{2, 1, 3, 1, 5}, {4, 3, 6, 5}},    // rank 5
      {{2, 3, 1, 5, 1, 7}, {3, 4, 5, 6, 1}},  // rank 6, alternating
      {{0, 3}, {3}},                      // empty
      {{4, 0}, {1}},                      // empty
  };
  uint32_t seed = 100;
  for (const BinaryCase& op : ArithmeticOps()) {
    for (DType t : kFloatTypes) {
      for (const auto& [sa, sb] : pairs) {
        const Tensor a = RandomTensor(sa, t, seed++);
        const Tensor b = RandomTensor(sb, t, seed++, 0.25, 3.0);
        ExpectMatchesCpu(Host(op.fn(Dev(a), Dev(b))), op.fn(a, b), op.tol,
                         Name(op.name, t, sa) + " with " + ShapeToString(sb));
      }
    }
  }
}

TEST(ElementwiseCudaTest, MisalignedViewsTakeTheScalarPaths) {
  SKIP_WITHOUT_GPU();
  for (DType t : kFloatTypes) {
    const Tensor a = RandomTensor({9, 7}, t, 1), b = RandomTensor({9, 7}, t, 2);
    const Tensor bias = RandomTensor({8}, t, 3);
    // Rows 1..5 of a [9,7] tensor start 7 elements in: not 16-byte aligned.
    const Tensor da = Dev(a).SliceRows(1, 5), db = Dev(b).SliceRows(2, 5);
    const Tensor ha = a.SliceRows(1, 5), hb = b.SliceRows(2, 5);
    ExpectMatchesCpu(Host(Add(da, db)), Add(ha, hb), kUlp, Name("add misaligned", t, ha.shape()));
    ExpectMatchesCpu(Host(Mul(da, Dev(b).SliceRows(0, 1))), Mul(ha, b.SliceRows(0, 1)), kUlp,
                     Name("mul misaligned row", t, ha.shape()));
    const Tensor dv = Dev(RandomTensor({4, 9}, t, 4)).SliceRows(1, 3).Reshape({3, 9});
    const Tensor hv = RandomTensor({4, 9}, t, 4).SliceRows(1, 3).Reshape({3, 9});
    ExpectMatchesCpu(Host(Sub(dv, Dev(RandomTensor({9}, t, 5)))),
                     Sub(hv, RandomTensor({9}, t, 5)), kUlp, Name("sub misaligned bias", t, {3, 9}));
    ExpectMatchesCpu(Host(Exp(da)), Exp(ha), kTranscendental, Name("exp misaligned", t, {5, 7}));
    // A one-element operand with a misaligned full one: the scalar kernels without packs.
    const Tensor s1 = RandomTensor({1}, t, 7, 0.25, 3.0);
    ExpectMatchesCpu(Host(Sub(da, Dev(s1))), Sub(ha, s1), kUlp,
                     Name("sub misaligned scalar rhs", t, ha.shape()));
    ExpectMatchesCpu(Host(Div(Dev(s1), da)), Div(s1, ha), kUlp,
                     Name("div misaligned scalar lhs", t, ha.shape()));
    // Width 8 would allow the vector bias path, but the lhs starts one element in.
    const Tensor flat = RandomTensor({25}, t, 6);
    const Tensor dm = Dev(flat).SliceRows(1, 24).Reshape({3, 8});
    const Tensor hm = flat.SliceRows(1, 24).Reshape({3, 8});
    ExpectMatchesCpu(Host(Add(dm, Dev(bias))), Add(hm, bias), kUlp,
                     Name("add misaligned bias", t, {3, 8}));
    ExpectMatchesCpu(Host(Div(Dev(bias), dm)), Div(bias, hm), kUlp,
                     Name("div misaligned bias lhs", t, {3, 8}));
    Tensor acc = Dev(flat).SliceRows(1, 24);
    AddInPlace(acc, Dev(flat).SliceRows(0, 24));
    Tensor hacc = flat.Clone().SliceRows(1, 24);
    AddInPlace(hacc, flat.SliceRows(0, 24));
    ExpectMatchesCpu(Host(acc), hacc, kExact, Name("add_in_place misaligned", t, {24}));
  }
}

struct UnaryCase {
  const char* name;
  std::function<Tensor(const Tensor&)> fn;
  Tol tol;
  double lo, hi;  // input range
};

std::vector<UnaryCase> UnaryOps() {
  return {
      {"add_scalar", [](const Tensor& x) { return AddScalar(x, 0.3); }, kUlp, -2, 2},
      {"mul_scalar", [](const Tensor& x) { return MulScalar(x, -1.7); }, kUlp, -2, 2},
      {"neg", [](const Tensor& x) { return Neg(x); }, kExact, -2, 2},
      {"exp", [](const Tensor& x) { return Exp(x); }, kTranscendental, -4, 4},
      {"log", [](const Tensor& x) { return Log(x); }, kTranscendental, 0.01, 10},
      {"tanh", [](const Tensor& x) { return Tanh(x); }, kTranscendental, -4, 4},
      {"relu", [](const Tensor& x) { return Relu(x); }, kExact, -2, 2},
      {"sqrt", [](const Tensor& x) { return Sqrt(x); }, kUlp, 0, 10},
      {"gelu_tanh", [](const Tensor& x) { return Gelu(x, GeluApprox::kTanh); }, kTranscendental,
       -5, 5},
      {"gelu_erf", [](const Tensor& x) { return Gelu(x, GeluApprox::kNone); }, kTranscendental,
       -5, 5},
      {"silu", [](const Tensor& x) { return Silu(x); }, kTranscendental, -6, 6},
  };
}

TEST(ElementwiseCudaTest, UnaryOps) {
  SKIP_WITHOUT_GPU();
  uint32_t seed = 200;
  for (const UnaryCase& op : UnaryOps()) {
    for (DType t : kFloatTypes) {
      for (const Shape& s : EdgeShapes()) {
        const Tensor x = RandomTensor(s, t, seed++, op.lo, op.hi);
        ExpectMatchesCpu(Host(op.fn(Dev(x))), op.fn(x), op.tol, Name(op.name, t, s));
      }
    }
  }
}

TEST(ElementwiseCudaTest, SpecialValues) {
  SKIP_WITHOUT_GPU();
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> v = {nan, inf, -inf, 0.0f, -0.0f, 1e-30f, -1e-30f, 3e38f, -3e38f,
                                88.8f, -104.0f, 20.0f};
  const Shape s = {static_cast<int64_t>(v.size())};
  for (DType t : kFloatTypes) {
    const Tensor x = Tensor::FromVector<float>(s, v, t);
    const Tensor g = Tensor::FromVector<float>(s, std::vector<float>(v.size(), 2.5f), t);
    for (const UnaryCase& op : UnaryOps()) {
      ExpectMatchesCpu(Host(op.fn(Dev(x))), op.fn(x), op.tol, Name(op.name, t, s) + " specials");
    }
    // Relu keeps NaN visible; ReluGrad of NaN is 0 on both devices.
    EXPECT_TRUE(std::isnan(Host(Relu(Dev(x))).at(0))) << DTypeName(t);
    ExpectMatchesCpu(Host(ReluGrad(Dev(x), Dev(g))), ReluGrad(x, g), kExact,
                     Name("relu_grad", t, s) + " specials");
    ExpectMatchesCpu(Host(Add(Dev(x), Dev(x))), Add(x, x), kExact, Name("add", t, s) + " specials");
    ExpectMatchesCpu(Host(Div(Dev(g), Dev(x))), Div(g, x), kUlp, Name("div", t, s) + " specials");
  }
}

// The derivative formulas amplify a libm ulp: e.g. gelu_tanh' has x * (1 - t*t) * du * dy with
// t = tanh(u) near -1 for x = -4, so one ulp of t moves the result by ~10 ulps of 1.
constexpr Tol kDerivative{16, 64};

std::vector<BinaryCase> GradOps() {
  return {
      {"relu_grad", [](const Tensor& x, const Tensor& g) { return ReluGrad(x, g); }, kExact},
      {"gelu_grad_tanh",
       [](const Tensor& x, const Tensor& g) { return GeluGrad(x, g, GeluApprox::kTanh); },
       kDerivative},
      {"gelu_grad_erf",
       [](const Tensor& x, const Tensor& g) { return GeluGrad(x, g, GeluApprox::kNone); },
       kDerivative},
      {"silu_grad", [](const Tensor& x, const Tensor& g) { return SiluGrad(x, g); },
       kDerivative},
      {"tanh_grad", [](const Tensor& y, const Tensor& g) { return TanhGrad(y, g); }, kUlp},
  };
}

TEST(ElementwiseCudaTest, BackwardOps) {
  SKIP_WITHOUT_GPU();
  uint32_t seed = 300;
  for (const BinaryCase& op : GradOps()) {
    for (DType t : kFloatTypes) {
      for (const Shape& s : EdgeShapes()) {
        const Tensor x = RandomTensor(s, t, seed++, -4, 4);
        const Tensor g = RandomTensor(s, t, seed++);
        // tanh_grad: 1 - y*y cancels near |y| = 1; the kernels do the same IEEE operations
        // (no FMA contraction), so one ulp of the inputs' scale still bounds it.
        ExpectMatchesCpu(Host(op.fn(Dev(x), Dev(g))), op.fn(x, g),
                         std::string(op.name) == "tanh_grad" ? Tol{1, 16} : op.tol,
                         Name(op.name, t, s));
      }
    }
  }
}

TEST(ElementwiseCudaTest, AddInPlace) {
  SKIP_WITHOUT_GPU();
  uint32_t seed = 400;
  for (DType t : kFloatTypes) {
    for (const Shape& s : EdgeShapes()) {
      Tensor acc = RandomTensor(s, t, seed++);
      const Tensor x = RandomTensor(s, t, seed++);
      Tensor dacc = Dev(acc);
      const Tensor dx = Dev(x);
      AddInPlace(dacc, dx);
      AddInPlace(acc, x);
      ExpectMatchesCpu(Host(dacc), acc, kExact, Name("add_in_place", t, s));
      AddInPlace(dacc, dacc);  // acc += acc: exact aliasing is allowed
      AddInPlace(acc, acc);
      ExpectMatchesCpu(Host(dacc), acc, kExact, Name("add_in_place aliased", t, s));
    }
  }
}

// acc and x are views of one storage that overlap without being equal: the kernel's threads
// would race (read elements of x that others already wrote), so x is read as before the call.
TEST(ElementwiseCudaTest, AddInPlacePartiallyOverlappingViews) {
  SKIP_WITHOUT_GPU();
  const int64_t n = (int64_t{1} << 22) + 5;  // enough blocks that a race shows
  for (DType t : {DType::kF32, DType::kBF16}) {
    for (int64_t shift : {1, 8, -1, -8}) {  // x ahead of acc, or behind it; vector or scalar
      const Tensor base = RandomTensor({n + 8}, t, 500);
      const int64_t a0 = shift > 0 ? 0 : -shift, x0 = shift > 0 ? shift : 0;
      const Tensor want = Add(base.SliceRows(a0, n), base.SliceRows(x0, n));
      const Tensor dbase = Dev(base);
      Tensor acc = dbase.SliceRows(a0, n);
      AddInPlace(acc, dbase.SliceRows(x0, n));
      ExpectMatchesCpu(Host(acc), want, kExact,
                       Name("add_in_place overlap", t, {n}) + " shift " + std::to_string(shift));
    }
  }
}

TEST(ElementwiseCudaTest, ResultsLiveOnTheInputDevice) {
  SKIP_WITHOUT_GPU();
  const Tensor x = Dev(RandomTensor({3, 4}, DType::kF32, 1));
  EXPECT_EQ(Add(x, x).device(), Device::Cuda(0));
  EXPECT_EQ(Gelu(x).device(), Device::Cuda(0));
  EXPECT_EQ(GeluGrad(x, x).device(), Device::Cuda(0));
  EXPECT_EQ(Add(x, Dev(RandomTensor({4}, DType::kF32, 2))).device(), Device::Cuda(0));
}

TEST(ElementwiseCudaTest, ErrorsReadLikeTheCpuOnes) {
  SKIP_WITHOUT_GPU();
  const Tensor c = RandomTensor({2, 3}, DType::kF32, 1);
  const Tensor g = Dev(c);
  // Mixed devices name both.
  ExpectOpError([&] { Add(c, g); }, {"add", "cpu", "cuda:0", "f32[2,3]"});
  ExpectOpError([&] { Mul(g, c); }, {"mul", "cuda:0", "cpu"});
  ExpectOpError([&] { GeluGrad(g, c); }, {"gelu_grad", "cuda:0", "cpu"});
  Tensor acc = Dev(c);
  ExpectOpError([&] { AddInPlace(acc, c); }, {"add_in_place", "cuda:0", "cpu"});
  // The shared argument checks run before the device dispatch: identical messages.
  const Tensor c64 = RandomTensor({2, 3}, DType::kF64, 2);
  const Tensor c4 = RandomTensor({4}, DType::kF32, 3);
  const absl::Status cpu_dtype = CatchOpError([&] { Add(c, c64); });
  const absl::Status gpu_dtype = CatchOpError([&] { Add(g, Dev(c64)); });
  EXPECT_EQ(cpu_dtype.message(), gpu_dtype.message());
  const absl::Status cpu_bc = CatchOpError([&] { Add(c, c4); });
  const absl::Status gpu_bc = CatchOpError([&] { Add(g, Dev(c4)); });
  EXPECT_FALSE(gpu_bc.ok());
  EXPECT_EQ(cpu_bc.message(), gpu_bc.message());
  const Tensor gi = Dev(Tensor::Zeros({2}, DType::kI32));
  ExpectOpError([&] { Exp(gi); }, {"exp", "integer dtype"});
  ExpectOpError([&] { ReluGrad(g, Dev(c4)); }, {"relu_grad", "shape mismatch"});
}

}  // namespace
}  // namespace shardmap
