// The comparison helper itself: every kind of mismatch must fail, with a message that says where.
#include "tensor/testing/compare.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest-spi.h"
#include "gtest/gtest.h"
#include "tensor/cuda/runtime.h"

namespace shardmap::testing {
namespace {

using ::testing::HasSubstr;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

Tensor F64(std::vector<int64_t> shape, std::vector<double> v) {
  return Tensor::FromVector<double>(absl::Span<const int64_t>(shape), v);
}

std::string Message(const ::testing::AssertionResult& r) { return r.message(); }

TEST(TensorsNear, EqualAndWithinToleranceTensorsPass) {
  const Tensor a = F64({2, 2}, {1, 2, 3, 4});
  EXPECT_TRUE(TensorsNear(a, a.Clone(), 0));
  EXPECT_TRUE(TensorsNear(a, F64({2, 2}, {1, 2, 3, 4 + 1e-9}), 1e-8));
  EXPECT_TRUE(TensorsNear(a, F64({2, 2}, {1, 2, 3, 4.4}), 0, 0.1));  // relative to |want|
  EXPECT_TRUE(TensorsNear(F64({2}, {0.0, 1}), F64({2}, {-0.0, 1}), 0));
}

TEST(TensorsNear, MatchingNonFinitePatternsPass) {
  const Tensor a = F64({4}, {kNaN, kInf, -kInf, 1});
  EXPECT_TRUE(TensorsNear(a, a.Clone(), 0));
  EXPECT_EQ(MaxAbsDiff(a, a.Clone()), 0);
}

TEST(TensorsNear, AllNanResultFailsAgainstFiniteReference) {
  const Tensor want = F64({2, 3}, {1, 2, 3, 4, 5, 6});
  const Tensor got = Tensor::Full({2, 3}, kNaN, DType::kF64);
  const auto r = TensorsNear(got, want, 1e-12);
  EXPECT_FALSE(r);
  EXPECT_THAT(Message(r), HasSubstr("6 of 6 elements"));
  EXPECT_THAT(Message(r), HasSubstr("got nan"));
  EXPECT_EQ(MaxAbsDiff(got, want), kInf);
  EXPECT_EQ(MaxAbsDiff(want, got), kInf);
  // A huge tolerance does not excuse a NaN either.
  EXPECT_FALSE(TensorsNear(got, want, 1e300));
}

TEST(TensorsNear, EveryNonFiniteMismatchFails) {
  const std::vector<std::pair<double, double>> cases = {
      {kNaN, 1}, {1, kNaN}, {kInf, 1}, {1, kInf}, {kInf, -kInf}, {-kInf, kInf}, {kNaN, kInf},
      {-kInf, kNaN}};
  for (const auto& [g, w] : cases) {
    const auto r = TensorsNear(F64({2}, {0, g}), F64({2}, {0, w}), 1e300);
    EXPECT_FALSE(r) << "got " << g << " want " << w;
    EXPECT_THAT(Message(r), HasSubstr("worst at [1]"));
    EXPECT_EQ(MaxAbsDiff(F64({2}, {0, g}), F64({2}, {0, w})), kInf);
  }
}

TEST(TensorsNear, ShapeDtypeAndDefinednessMismatchesFail) {
  const Tensor a = F64({2, 3}, {1, 2, 3, 4, 5, 6});
  const auto shape = TensorsNear(a, a.Reshape({3, 2}), 1);
  EXPECT_FALSE(shape);
  EXPECT_THAT(Message(shape), HasSubstr("got f64[2,3], want f64[3,2]"));
  EXPECT_EQ(MaxAbsDiff(a, a.Reshape({3, 2})), kInf);

  const Tensor f = Tensor::FromVector<float>({2, 3}, {1, 2, 3, 4, 5, 6});
  const auto dtype = TensorsNear(f, a, 1);
  EXPECT_FALSE(dtype);
  EXPECT_THAT(Message(dtype), HasSubstr("got f32[2,3], want f64[2,3]"));
  EXPECT_FALSE(TensorsBitwiseEqual(f, a));
  EXPECT_EQ(MaxAbsDiff(f, a), 0);  // values only: dtypes may differ

  EXPECT_FALSE(TensorsNear(Tensor(), a, 1));
  EXPECT_FALSE(TensorsNear(a, Tensor(), 1));
  EXPECT_TRUE(TensorsNear(Tensor(), Tensor(), 0));
  EXPECT_EQ(MaxAbsDiff(Tensor(), a), kInf);
}

TEST(TensorsNear, MessageNamesCountWorstIndexAndValues) {
  const Tensor want = F64({2, 3}, {0, 0, 0, 0, 0, 0});
  const Tensor got = F64({2, 3}, {0, 0.5, 0, 0, 0, 2});
  const auto r = TensorsNear(got, want, 0.1);
  ASSERT_FALSE(r);
  EXPECT_THAT(Message(r), HasSubstr("f64[2,3] vs f64[2,3]: 2 of 6 elements"));
  EXPECT_THAT(Message(r), HasSubstr("worst at [1,2]: got 2, want 0, diff 2"));
  EXPECT_EQ(MaxAbsDiff(got, want), 2);
}

TEST(TensorsNear, EveryDtypeCompares) {
  for (DType t : {DType::kF32, DType::kF64, DType::kBF16, DType::kF16}) {
    const Tensor a = Tensor::FromVector<float>({3}, {1, -2, 0.5f}, t);
    const Tensor b = Tensor::FromVector<float>({3}, {1, -2, 0.75f}, t);
    EXPECT_TRUE(TensorsNear(a, a.Clone(), 0)) << DTypeName(t);
    EXPECT_FALSE(TensorsNear(a, b, 0.1)) << DTypeName(t);
    EXPECT_TRUE(TensorsNear(a, b, 0.25)) << DTypeName(t);
    const Tensor nan = Tensor::FromVector<float>({3}, {1, -2, NAN}, t);
    EXPECT_FALSE(TensorsNear(nan, a, 1e30)) << DTypeName(t);
    EXPECT_TRUE(TensorsNear(nan, nan.Clone(), 0)) << DTypeName(t);
  }
  // Integers compare exactly, beyond double's 53-bit mantissa.
  const int64_t big = (int64_t{1} << 60) + 1;
  const Tensor i64a = Tensor::FromVector<int64_t>({2}, {big, -3});
  const Tensor i64b = Tensor::FromVector<int64_t>({2}, {big - 1, -3});
  EXPECT_FALSE(TensorsNear(i64a, i64b, 0));
  EXPECT_TRUE(TensorsNear(i64a, i64b, 1));
  EXPECT_EQ(MaxAbsDiff(i64a, i64b), 1);
  const Tensor i32a = Tensor::FromVector<int32_t>({2}, {7, -3});
  EXPECT_FALSE(TensorsNear(i32a, Tensor::FromVector<int32_t>({2}, {7, -4}), 0));
  EXPECT_TRUE(TensorsNear(i32a, i32a.Clone(), 0));
}

TEST(TensorsNear, SizeZeroAndScalarTensors) {
  EXPECT_TRUE(TensorsNear(Tensor::Zeros({0, 3}), Tensor::Zeros({0, 3}), 0));
  EXPECT_FALSE(TensorsNear(Tensor::Zeros({0, 3}), Tensor::Zeros({3, 0}), 0));
  const auto r = TensorsNear(Tensor::Scalar(1), Tensor::Scalar(2), 0.5);
  EXPECT_FALSE(r);
  EXPECT_THAT(Message(r), HasSubstr("worst at []"));
}

TEST(TensorsNear, ViewsOfSharedStorageCompareTheirOwnElements) {
  const Tensor whole = F64({4, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
  EXPECT_TRUE(TensorsNear(whole.SliceRows(2, 2), F64({2, 2}, {5, 6, 7, 8}), 0));
  EXPECT_FALSE(TensorsNear(whole.SliceRows(1, 2), F64({2, 2}, {5, 6, 7, 8}), 0));
}

TEST(TensorsNearScaled, ToleranceScalesWithTheLargestReferenceValue) {
  const Tensor want = F64({3}, {100, 1, -kInf});
  EXPECT_TRUE(TensorsNearScaled(F64({3}, {100, 1.9, -kInf}), want, 0.01));  // 1 <= 0.01 * 100
  const auto r = TensorsNearScaled(F64({3}, {100, 2.1, -kInf}), want, 0.01);
  EXPECT_FALSE(r);
  EXPECT_THAT(Message(r), HasSubstr("max|want| 100"));
  EXPECT_FALSE(TensorsNearScaled(F64({3}, {100, kNaN, -kInf}), want, 1));
  EXPECT_FALSE(TensorsNearScaled(F64({3}, {100, 1, -kInf}), F64({3}, {0, 0, 0}), 1));
}

TEST(TensorsBitwiseEqual, ComparesBytes) {
  const Tensor a = F64({3}, {1, kNaN, -kInf});
  EXPECT_TRUE(TensorsBitwiseEqual(a, a.Clone()));
  EXPECT_FALSE(TensorsBitwiseEqual(F64({1}, {0.0}), F64({1}, {-0.0})));
  const auto r = TensorsBitwiseEqual(F64({3}, {1, 2, 3}), F64({3}, {1, 2, std::nextafter(3.0, 4)}));
  EXPECT_FALSE(r);
  EXPECT_THAT(Message(r), HasSubstr("1 of 3 elements differ bitwise; first at [2]"));
  EXPECT_FALSE(TensorsBitwiseEqual(a, a.Reshape({1, 3})));
}

TEST(TensorMacros, ReportNonFatalFailures) {
  const Tensor want = F64({2}, {1, 2});
  const Tensor nan = F64({2}, {kNaN, 2});
  EXPECT_NONFATAL_FAILURE(EXPECT_TENSOR_NEAR(nan, want, 1e-12), "got nan, want 1");
  EXPECT_NONFATAL_FAILURE(EXPECT_TENSOR_EQ(nan, want), "differ bitwise");
  EXPECT_FATAL_FAILURE(ASSERT_TENSOR_NEAR(F64({2}, {1, 2}), F64({2}, {1, 3}), 0.5),
                       "worst at [1]");
  EXPECT_TENSOR_NEAR(want, want.Clone(), 0);
  EXPECT_TENSOR_EQ(want, want.Clone());
}

TEST(TensorsNear, DeviceTensorsAreCopiedToTheHost) {
  if (!cuda::Available()) GTEST_SKIP() << "no GPU: " << cuda::UnavailableReason();
  const Tensor a = F64({3}, {1, 2, 3});
  const Tensor g = a.To(Device::Cuda(0));
  EXPECT_TRUE(TensorsNear(g, a, 0));
  EXPECT_TRUE(TensorsBitwiseEqual(g, a));
  EXPECT_FALSE(TensorsNear(g, F64({3}, {1, 2, kNaN}), 1));
}

}  // namespace
}  // namespace shardmap::testing
