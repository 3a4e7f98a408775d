#include "tensor/ops/multi_tensor.h"

#include <cmath>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "tensor/testing/test_util.h"

namespace shardmap {
namespace {

using testing::ExpectAllClose;
using testing::ExpectOpError;
using testing::RandomTensor;

double NaiveSumSq(const std::vector<Tensor>& ts) {
  double s = 0;
  for (const Tensor& t : ts) {
    for (int64_t i = 0; i < t.numel(); ++i) s += t.at(i) * t.at(i);
  }
  return s;
}

TEST(MultiTensorTest, SumOfSquaresMatchesANaiveLoop) {
  const std::vector<Tensor> ts = {
      RandomTensor({7, 13}, DType::kF32, 1, -3, 3), RandomTensor({0, 4}, DType::kF32, 2),
      RandomTensor({33}, DType::kBF16, 3), RandomTensor({5, 2, 3}, DType::kF16, 4),
      RandomTensor({20000}, DType::kF32, 5)};
  const Tensor s = SumOfSquares(ts);
  EXPECT_EQ(s.rank(), 0);
  EXPECT_EQ(s.dtype(), DType::kF32);
  EXPECT_NEAR(s.item(), NaiveSumSq(ts), 1e-6 * NaiveSumSq(ts));
  // Any f64 tensor makes the result f64 (and exact to f64 rounding).
  std::vector<Tensor> with64 = ts;
  with64.push_back(RandomTensor({9}, DType::kF64, 6));
  const Tensor s64 = SumOfSquares(with64);
  EXPECT_EQ(s64.dtype(), DType::kF64);
  EXPECT_NEAR(s64.item(), NaiveSumSq(with64), 1e-12 * NaiveSumSq(with64));
  // Empty lists and lists of empty tensors sum to 0.
  EXPECT_EQ(SumOfSquares({}).item(), 0.0);
  EXPECT_EQ(SumOfSquares({Tensor::Zeros({0})}).item(), 0.0);
  // Infinity and NaN propagate.
  const Tensor inf = Tensor::FromVector<float>({2}, {1, std::numeric_limits<float>::infinity()});
  EXPECT_TRUE(std::isinf(SumOfSquares({inf}).item()));
  const Tensor nan = Tensor::FromVector<float>({2}, {1, std::nanf("")});
  EXPECT_TRUE(std::isnan(SumOfSquares({nan, inf}).item()));
}

TEST(MultiTensorTest, SumOfSquaresInAChosenDtype) {
  const std::vector<Tensor> ts = {RandomTensor({7, 13}, DType::kF32, 1, -3, 3),
                                  RandomTensor({33}, DType::kBF16, 3)};
  // f32 inputs, f64 result: the f64 accumulation is kept (no f32 rounding of the sum).
  const Tensor s64 = SumOfSquares(ts, DType::kF64);
  EXPECT_EQ(s64.rank(), 0);
  EXPECT_EQ(s64.dtype(), DType::kF64);
  EXPECT_NEAR(s64.item(), NaiveSumSq(ts), 1e-12 * NaiveSumSq(ts));
  const Tensor s32 = SumOfSquares({RandomTensor({4}, DType::kF64, 2)}, DType::kF32);
  EXPECT_EQ(s32.dtype(), DType::kF32);
  ExpectOpError([&] { SumOfSquares(ts, DType::kBF16); }, {"expected f32 or f64"});
}

TEST(MultiTensorTest, ClipCoefficientIsPyTorchs) {
  for (double ss : {0.0, 0.25, 1.0, 4.0, 1e6}) {
    for (DType dt : {DType::kF32, DType::kF64}) {
      const Tensor c = ClipCoefficient(Tensor::Scalar(ss, dt), 1.5);
      EXPECT_EQ(c.dtype(), dt);
      const double want = std::min(1.0, 1.5 / (std::sqrt(ss) + 1e-6));
      EXPECT_NEAR(c.item(), want, 1e-7 * want) << ss;
    }
  }
  EXPECT_TRUE(std::isnan(ClipCoefficient(Tensor::Scalar(std::nan("")), 1.0).item()));
  EXPECT_EQ(ClipCoefficient(Tensor::Scalar(INFINITY), 1.0).item(), 0.0);
  ExpectOpError([] { ClipCoefficient(Tensor::Scalar(1.0), 0.0); },
                {"clip_coefficient", "max_norm", "> 0"});
  ExpectOpError([] { ClipCoefficient(Tensor::Zeros({2}), 1.0); },
                {"clip_coefficient", "sum_sq", "f32[2]", "one-element"});
}

TEST(MultiTensorTest, ScaleInPlaceWritesTheStorage) {
  const std::vector<Tensor> ts = {RandomTensor({4, 5}, DType::kF32, 7),
                                  RandomTensor({3}, DType::kF64, 8),
                                  RandomTensor({6}, DType::kBF16, 9), Tensor::Zeros({0, 2})};
  std::vector<std::vector<double>> want;
  for (const Tensor& t : ts) {
    std::vector<double> w;
    for (int64_t i = 0; i < t.numel(); ++i) w.push_back(t.at(i) * 0.5);  // exact in bf16 too
    want.push_back(w);
  }
  const Tensor view = ts[0].SliceRows(1, 2);  // shares ts[0]'s storage
  ScaleInPlace(ts, Tensor::Scalar(0.5, DType::kF64));
  for (size_t k = 0; k < ts.size(); ++k) {
    ExpectAllClose(ts[k], want[k], 1e-7, 0, "tensor " + std::to_string(k));
  }
  EXPECT_NEAR(view.at(0), want[0][5], 1e-7);
  ScaleInPlace({}, Tensor::Scalar(2.0));  // nothing to do
}

TEST(MultiTensorTest, ErrorsNameTheTensorAndTheFix) {
  const Tensor f = Tensor::Ones({3});
  ExpectOpError([&] { SumOfSquares({f, Tensor::Zeros({2}, DType::kI32)}); },
                {"sum_of_squares", "tensor 1 of the list", "i32[2]", "floating"});
  ExpectOpError([&] { SumOfSquares({f, Tensor()}); },
                {"sum_of_squares", "tensor 1 of the list", "undefined"});
  ExpectOpError([&] { ScaleInPlace({f}, Tensor::Zeros({1}, DType::kBF16)); },
                {"scale_in_place", "scale", "bf16[1]", "f32 or f64"});
}

}  // namespace
}  // namespace shardmap
