#include "tensor/ops/reduce.h"

#include <cmath>
#include <limits>

#include "gtest/gtest.h"
#include "tensor/ops/shape_ops.h"
#include "tensor/testing/test_util.h"

namespace shardmap {
namespace {

using testing::ExpectAllClose;
using testing::ExpectOpError;
using testing::RandomTensor;
using testing::Unflatten;

enum class R { kSum, kMean, kMax, kMin };

// Naive reference: route every input element to its output slot by multi-index.
std::vector<double> RefReduce(R kind, const Tensor& x, const std::vector<bool>& reduced) {
  Shape out_shape;
  int64_t count = 1;
  for (int d = 0; d < x.rank(); ++d) {
    if (reduced[d]) {
      count *= x.shape()[d];
    } else {
      out_shape.push_back(x.shape()[d]);
    }
  }
  const double init = kind == R::kMax   ? -std::numeric_limits<double>::infinity()
                      : kind == R::kMin ? std::numeric_limits<double>::infinity()
                                        : 0.0;
  std::vector<double> out(NumElements(out_shape), init);
  for (int64_t i = 0; i < x.numel(); ++i) {
    const auto idx = Unflatten(x.shape(), i);
    int64_t o = 0;
    for (int d = 0; d < x.rank(); ++d) {
      if (!reduced[d]) o = o * x.shape()[d] + idx[d];
    }
    const double v = x.at(i);
    if (kind == R::kMax) {
      out[o] = std::max(out[o], v);
    } else if (kind == R::kMin) {
      out[o] = std::min(out[o], v);
    } else {
      out[o] += v;
    }
  }
  if (kind == R::kMean) {
    for (double& v : out) v /= static_cast<double>(count);
  }
  return out;
}

Tensor RunReduce(R kind, const Tensor& x, const std::vector<int>& dims, bool keepdim) {
  switch (kind) {
    case R::kSum: return Sum(x, dims, keepdim);
    case R::kMean: return Mean(x, dims, keepdim);
    case R::kMax: return Max(x, dims, keepdim);
    default: return Min(x, dims, keepdim);
  }
}

TEST(ReduceTest, AllDimSubsetsAgainstNaiveLoops) {
  const std::vector<Shape> shapes = {{5}, {2, 3, 4}, {3, 1, 4, 2}, {7, 9}, {1, 1}, {}};
  uint32_t seed = 1;
  for (DType dt : {DType::kF64, DType::kF32}) {
    for (const Shape& s : shapes) {
      const Tensor x = RandomTensor(s, dt, seed++);
      const int r = x.rank();
      for (int mask = 0; mask < (1 << r); ++mask) {
        std::vector<int> dims;
        std::vector<bool> reduced(r);
        for (int d = 0; d < r; ++d) {
          reduced[d] = (mask >> d) & 1;
          if (reduced[d]) dims.push_back(d % 2 ? d - r : d);  // mix negative dims in
        }
        if (dims.empty()) reduced.assign(r, true);  // {} means every dim
        for (R kind : {R::kSum, R::kMean, R::kMax, R::kMin}) {
          for (bool keep : {false, true}) {
            const Tensor got = RunReduce(kind, x, dims, keep);
            Shape want_shape;
            for (int d = 0; d < r; ++d) {
              if (!reduced[d]) {
                want_shape.push_back(s[d]);
              } else if (keep) {
                want_shape.push_back(1);
              }
            }
            ASSERT_EQ(got.shape(), want_shape) << x.ShapeString() << " mask " << mask;
            ExpectAllClose(got, RefReduce(kind, x, reduced), dt == DType::kF64 ? 1e-14 : 1e-6,
                           1e-12, x.ShapeString());
          }
        }
      }
    }
  }
}

TEST(ReduceTest, LongSumsAccumulateAccurately) {
  // 2^20 copies of 0.1f: a float accumulator drifts by ~1%; f64 accumulation does not.
  const Tensor x = Tensor::Full({1 << 20}, 0.1, DType::kF32);
  EXPECT_NEAR(Sum(x, {}).item(), (1 << 20) * static_cast<double>(0.1f), 1e-2);
}

TEST(ReduceTest, EmptyDims) {
  const Tensor e = Tensor::Zeros({3, 0});
  EXPECT_EQ(Sum(e, {1}).ToVector<double>(), (std::vector<double>{0, 0, 0}));
  EXPECT_TRUE(std::isnan(Mean(e, {1}).at(0)));
  EXPECT_EQ(Sum(e, {0}).shape(), (Shape{0}));
  EXPECT_EQ(Max(e, {0}).shape(), (Shape{0}));  // nothing to reduce into: fine
  ExpectOpError([&] { Max(e, {1}); }, {"max", "f32[3,0]", "empty"});
}

TEST(ReduceTest, HalfDTypesAccumulateInF32) {
  const Tensor x = RandomTensor({4, 33}, DType::kBF16, 3);
  const Tensor got = Sum(x, {1});
  EXPECT_EQ(got.dtype(), DType::kBF16);
  const std::vector<double> ref = RefReduce(R::kSum, x, {false, true});
  for (int i = 0; i < 4; ++i) EXPECT_EQ(got.at(i), BF16ToFloat(FloatToBF16(ref[i])));
}

TEST(ReduceTest, MaxPropagatesNaN) {
  const Tensor x = Tensor::FromVector<float>({2, 2}, {1, std::nanf(""), 3, 2});
  EXPECT_TRUE(std::isnan(Max(x, {1}).at(0)));
  EXPECT_EQ(Max(x, {1}).at(1), 3.0);
  EXPECT_TRUE(std::isnan(Min(x, {0}).at(1)));
}

TEST(ReduceTest, ArgMax) {
  const Tensor x = Tensor::FromVector<float>({2, 3, 2}, {1, 5, 3, 5, 3, 0,  //
                                                         -1, -2, -1, -3, -4, 9});
  EXPECT_EQ(ArgMax(x, 1).ToVector<int64_t>(), (std::vector<int64_t>{1, 0, 0, 2}));
  EXPECT_EQ(ArgMax(x, -1).ToVector<int64_t>(), (std::vector<int64_t>{1, 1, 0, 0, 0, 1}));
  EXPECT_EQ(ArgMax(x, 0).ToVector<int64_t>(), (std::vector<int64_t>{0, 0, 0, 0, 0, 1}));
  EXPECT_EQ(ArgMax(x, 1, true).shape(), (Shape{2, 1, 2}));
  EXPECT_EQ(ArgMax(x, 1).dtype(), DType::kI64);
  // First NaN wins; ties go to the first index.
  const Tensor n = Tensor::FromVector<double>({4}, {1, std::nan(""), 7, std::nan("")});
  EXPECT_EQ(ArgMax(n, 0).item(), 1.0);
  // Random cases against a naive scan.
  const Tensor r = RandomTensor({5, 17}, DType::kF32, 4);
  const Tensor am = ArgMax(r, 1);
  for (int i = 0; i < 5; ++i) {
    int best = 0;
    for (int j = 1; j < 17; ++j) {
      if (r.at(i * 17 + j) > r.at(i * 17 + best)) best = j;
    }
    EXPECT_EQ(am.at(i), best);
  }
  ExpectOpError([] { ArgMax(Tensor::Zeros({2, 0}), 1); }, {"argmax", "f32[2,0]", "empty"});
  ExpectOpError([&] { ArgMax(x, 3); }, {"argmax", "dim 3", "f32[2,3,2]"});
}

TEST(ReduceTest, SumToShapeUndoesBroadcasting) {
  const Tensor dy = RandomTensor({4, 3, 5}, DType::kF64, 9);
  struct C {
    Shape target;
    std::vector<bool> reduced;  // on dy's dims
  };
  for (const C& c : std::vector<C>{{{5}, {true, true, false}},
                                   {{3, 1}, {true, false, true}},
                                   {{1, 3, 5}, {true, false, false}},
                                   {{4, 1, 1}, {false, true, true}},
                                   {{}, {true, true, true}},
                                   {{4, 3, 5}, {false, false, false}}}) {
    const Tensor got = SumToShape(dy, c.target);
    ASSERT_EQ(got.shape(), c.target);
    ExpectAllClose(got, RefReduce(R::kSum, dy, c.reduced), 1e-14, 1e-14,
                   ShapeToString(c.target));
  }
  ExpectOpError([&] { SumToShape(dy, {2}); }, {"sum_to_shape", "f64[4,3,5]", "[2]"});
  ExpectOpError([&] { SumToShape(dy, {1, 4, 3, 5}); }, {"sum_to_shape"});
}

TEST(ReduceTest, Errors) {
  const Tensor x = Tensor::Zeros({2, 3});
  ExpectOpError([&] { Sum(x, {0, -2}); }, {"sum", "listed twice", "f32[2,3]"});
  ExpectOpError([&] { Mean(x, {2}); }, {"mean", "dim 2", "out of range", "f32[2,3]"});
  ExpectOpError([&] { Sum(Tensor::Zeros({2}, DType::kI32), {}); }, {"sum", "i32[2]", "floating"});
}

}  // namespace
}  // namespace shardmap
