// CUDA reductions against the CPU ops (tensor/ops/reduce.h) on the same inputs: every op, every
// float dtype, dims first/middle/last/several/all, keepdim, empty and size-1 dims, odd sizes,
// long rows (split into segments), many tiny rows, long columns, NaN, ArgMax ties. GPU tests skip
// without a GPU; the error-path test runs everywhere.
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "tensor/cuda/runtime.h"
#include "tensor/error.h"
#include "tensor/ops/reduce.h"
#include "tensor/ops/shape_ops.h"
#include "tensor/tensor.h"
#include "tensor/testing/test_util.h"

namespace shardmap {
namespace {

using testing::ExpectOpError;
using testing::RandomTensor;

const Device kGpu = Device::Cuda(0);
constexpr DType kFloatTypes[] = {DType::kF32, DType::kF64, DType::kBF16, DType::kF16};

enum class R { kSum, kMean, kMax, kMin };

const char* Name(R r) {
  switch (r) {
    case R::kSum: return "sum";
    case R::kMean: return "mean";
    case R::kMax: return "max";
    default: return "min";
  }
}

Tensor Run(R r, const Tensor& x, const std::vector<int>& dims, bool keepdim) {
  switch (r) {
    case R::kSum: return Sum(x, dims, keepdim);
    case R::kMean: return Mean(x, dims, keepdim);
    case R::kMax: return Max(x, dims, keepdim);
    default: return Min(x, dims, keepdim);
  }
}

// One unit in the last place of w in dtype t.
double Ulp(DType t, double w) {
  const int p = t == DType::kBF16 ? 7 : t == DType::kF16 ? 10 : t == DType::kF32 ? 23 : 52;
  const int min_exp = t == DType::kF16 ? -14 : t == DType::kF64 ? -1022 : -126;
  int e = 0;
  std::frexp(w, &e);  // |w| = m * 2^e, m in [0.5, 1)
  return std::ldexp(1.0, std::max(e - 1, min_exp) - p);
}

// Elements folded into each output.
int64_t FoldCount(const Tensor& x, const std::vector<int>& dims) {
  if (dims.empty()) return x.numel();
  int64_t c = 1;
  for (int d : dims) c *= x.shape()[d < 0 ? d + x.rank() : d];
  return c;
}

// got (device result, brought back) vs want (CPU op). Max/Min are exact. Sums: f32 relative
// 1e-5 plus an absolute term for cancellation (inputs are in [-2, 2), so a sum of c terms is
// O(2 sqrt(c))); f64 1e-12; bf16/f16 one ulp of the output (both sides accumulate in >= f32).
void ExpectMatchesCpu(R r, const Tensor& x, const std::vector<int>& dims, bool keepdim) {
  const std::string what = absl::StrCat(Name(r), " of ", x.ShapeString(), " over {",
                                        absl::StrJoin(dims, ","), "} keepdim=", keepdim);
  const Tensor want = Run(r, x, dims, keepdim);
  const Tensor dev = Run(r, x.To(kGpu), dims, keepdim);
  ASSERT_TRUE(dev.is_cuda()) << what;
  const Tensor got = dev.To(Device::Cpu());
  ASSERT_EQ(got.shape(), want.shape()) << what;
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  const DType t = x.dtype();
  const double count = static_cast<double>(FoldCount(x, dims));
  const bool sum = r == R::kSum || r == R::kMean;
  double rel = 0, abs = 0;
  if (sum) {
    const double spread = 2.0 * std::sqrt(std::max(count, 1.0)) / (r == R::kMean ? count : 1.0);
    rel = t == DType::kF64 ? 1e-12 : 1e-5;
    abs = (t == DType::kF64 ? 1e-13 : 1e-6) * spread;
  }
  for (int64_t i = 0; i < want.numel(); ++i) {
    const double g = got.at(i), w = want.at(i);
    if (std::isnan(w)) {
      ASSERT_TRUE(std::isnan(g)) << what << " at " << i << ": got " << g;
    } else if (!sum || std::isinf(w)) {
      ASSERT_EQ(g, w) << what << " at " << i;
    } else {
      double tol = rel * std::fabs(w) + abs;
      if (t == DType::kBF16 || t == DType::kF16) tol += Ulp(t, w);
      ASSERT_NEAR(g, w, tol) << what << " at " << i;
    }
  }
}

void ExpectAllOpsMatch(const Tensor& x, const std::vector<int>& dims) {
  for (R r : {R::kSum, R::kMean, R::kMax, R::kMin}) {
    for (bool keep : {false, true}) ExpectMatchesCpu(r, x, dims, keep);
  }
}

TEST(ReduceCudaTest, OddShapeEveryDimSetEveryDType) {
  SKIP_WITHOUT_GPU();
  uint32_t seed = 1;
  for (DType t : kFloatTypes) {
    const Tensor x = RandomTensor({7, 13, 5}, t, seed++);
    for (const std::vector<int>& dims : std::vector<std::vector<int>>{
             {}, {0}, {1}, {2}, {-1}, {0, 1}, {1, 2}, {0, 2}, {2, 0}, {0, 1, 2}}) {
      ExpectAllOpsMatch(x, dims);
    }
    const Tensor y = RandomTensor({2, 3, 4, 5}, t, seed++);
    for (const std::vector<int>& dims :
         std::vector<std::vector<int>>{{0, 2}, {1, 3}, {0, 3}, {0, 1, 3}, {1, 2}}) {
      ExpectAllOpsMatch(y, dims);
    }
  }
}

TEST(ReduceCudaTest, SizeOneAndScalarShapes) {
  SKIP_WITHOUT_GPU();
  for (DType t : kFloatTypes) {
    ExpectAllOpsMatch(RandomTensor({1}, t, 3), {0});
    ExpectAllOpsMatch(RandomTensor({1}, t, 3), {});
    ExpectAllOpsMatch(RandomTensor({}, t, 4), {});
    ExpectAllOpsMatch(RandomTensor({1, 1, 1}, t, 5), {1});
    ExpectAllOpsMatch(RandomTensor({3, 1, 4}, t, 6), {1});      // folds nothing: a copy
    ExpectAllOpsMatch(RandomTensor({3, 1, 4}, t, 6), {0, 1});
    ExpectAllOpsMatch(RandomTensor({1, 9, 1}, t, 7), {0, 2});
  }
}

TEST(ReduceCudaTest, EmptyDims) {
  SKIP_WITHOUT_GPU();
  for (DType t : kFloatTypes) {
    const Tensor e = Tensor::Zeros({3, 0}, t).To(kGpu);
    EXPECT_EQ(Sum(e, {1}).To(Device::Cpu()).ToVector<double>(), (std::vector<double>{0, 0, 0}));
    const Tensor m = Mean(e, {1}).To(Device::Cpu());
    for (int i = 0; i < 3; ++i) EXPECT_TRUE(std::isnan(m.at(i)));
    EXPECT_EQ(Sum(e, {0}).shape(), (Shape{0}));
    EXPECT_EQ(Max(e, {0}).shape(), (Shape{0}));
    EXPECT_EQ(Sum(e, {}).To(Device::Cpu()).item(), 0.0);
    EXPECT_EQ(ArgMax(e, 0).shape(), (Shape{0}));
  }
}

TEST(ReduceCudaTest, LongRowsSplitIntoSegments) {
  SKIP_WITHOUT_GPU();
  for (DType t : kFloatTypes) {
    const Tensor x = RandomTensor({1000003}, t, 11);
    ExpectMatchesCpu(R::kSum, x, {0}, false);
    ExpectMatchesCpu(R::kMean, x, {}, true);
    ExpectMatchesCpu(R::kMax, x, {0}, false);
    ExpectMatchesCpu(R::kMin, x, {-1}, false);
  }
  const Tensor y = RandomTensor({3, 300007}, DType::kF32, 12);  // few long rows
  ExpectAllOpsMatch(y, {1});
  const Tensor z = RandomTensor({1100, 5000}, DType::kF32, 13);  // many rows over 4096
  ExpectMatchesCpu(R::kSum, z, {1}, false);
  ExpectMatchesCpu(R::kMax, z, {1}, false);
}

TEST(ReduceCudaTest, ManyTinyRowsAndLongColumns) {
  SKIP_WITHOUT_GPU();
  for (DType t : {DType::kF32, DType::kBF16, DType::kF64}) {
    const Tensor x = RandomTensor({200003, 3}, t, 21);
    ExpectMatchesCpu(R::kSum, x, {1}, false);   // a row of 3 per output
    ExpectMatchesCpu(R::kMax, x, {1}, true);
    ExpectMatchesCpu(R::kSum, x, {0}, false);   // 3 columns of 200003: several passes
    ExpectMatchesCpu(R::kMean, x, {0}, true);
    ExpectMatchesCpu(R::kMin, x, {0}, false);
  }
  const Tensor w = RandomTensor({129, 257, 3}, DType::kF32, 22);
  ExpectAllOpsMatch(w, {0, 2});
  ExpectAllOpsMatch(w, {1});
}

TEST(ReduceCudaTest, LongConstantSumStaysAccurate) {
  SKIP_WITHOUT_GPU();
  // 2^20 copies of 0.1f: a sequential float sum drifts by ~1%; the segmented tree keeps the
  // relative error near 1e-6.
  const Tensor x = Tensor::Full({1 << 20}, 0.1, DType::kF32, kGpu);
  EXPECT_NEAR(Sum(x, {}).item(), (1 << 20) * static_cast<double>(0.1f), 1e-5 * (1 << 20) * 0.1);
}

TEST(ReduceCudaTest, NaNPropagatesLikeTheCpu) {
  SKIP_WITHOUT_GPU();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (DType t : kFloatTypes) {
    std::vector<float> v(6 * 70);
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 11) - 5;
    v[3] = nan;             // row 0, early
    v[70 + 69] = nan;       // row 1, last
    v[2 * 70 + 5] = inf;    // row 2: +inf max
    v[3 * 70 + 6] = -inf;   // row 3: -inf min
    v[4 * 70 + 0] = nan;    // row 4: first
    v[4 * 70 + 1] = inf;
    const Tensor x = Tensor::FromVector<float>({6, 70}, v, t);
    for (R r : {R::kSum, R::kMean, R::kMax, R::kMin}) {
      ExpectMatchesCpu(r, x, {1}, false);
      ExpectMatchesCpu(r, x, {0}, false);
      ExpectMatchesCpu(r, x, {}, false);
    }
    const Tensor got = Max(x.To(kGpu), {1}).To(Device::Cpu());
    EXPECT_TRUE(std::isnan(got.at(0)) && std::isnan(got.at(1)) && std::isnan(got.at(4)));
    EXPECT_EQ(got.at(2), inf);
    EXPECT_EQ(Min(x.To(kGpu), {1}).To(Device::Cpu()).at(3), -inf);
  }
}

TEST(ReduceCudaTest, ArgMaxMatchesCpu) {
  SKIP_WITHOUT_GPU();
  uint32_t seed = 31;
  for (DType t : kFloatTypes) {
    for (const Shape& s : std::vector<Shape>{{7, 13, 5}, {1}, {3, 1}, {2, 3000}, {5000, 3}}) {
      const Tensor x = RandomTensor(s, t, seed++);
      for (int d = 0; d < x.rank(); ++d) {
        for (bool keep : {false, true}) {
          const Tensor want = ArgMax(x, d, keep);
          const Tensor got = ArgMax(x.To(kGpu), d, keep).To(Device::Cpu());
          ASSERT_EQ(got.shape(), want.shape());
          ASSERT_EQ(got.dtype(), DType::kI64);
          EXPECT_EQ(got.ToVector<int64_t>(), want.ToVector<int64_t>())
              << DTypeName(t) << ShapeToString(s) << " dim " << d << " keepdim " << keep;
        }
      }
    }
  }
}

TEST(ReduceCudaTest, ArgMaxTiesNaNAndLongRows) {
  SKIP_WITHOUT_GPU();
  const double nan = std::nan(""), inf = std::numeric_limits<double>::infinity();
  for (DType t : kFloatTypes) {
    // Ties (first index), all equal, all -inf, NaN first / later / twice.
    const std::vector<std::vector<double>> rows = {
        {1, 5, 3, 5, 5}, {2, 2, 2, 2, 2}, {-inf, -inf, -inf, -inf, -inf},
        {nan, 9, 9, 1, 1}, {1, 9, nan, 9, nan}, {-inf, 0, -0.0, 0, -1}};
    std::vector<double> flat;
    for (const auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());
    const Tensor x = Tensor::FromVector<double>({6, 5}, flat, t);
    EXPECT_EQ(ArgMax(x.To(kGpu), 1).To(Device::Cpu()).ToVector<int64_t>(),
              (std::vector<int64_t>{1, 0, 0, 0, 2, 1}))
        << DTypeName(t);
    EXPECT_EQ(ArgMax(x.To(kGpu), 0).To(Device::Cpu()).ToVector<int64_t>(),
              ArgMax(x, 0).ToVector<int64_t>());
    // A long row (a block per row) with the max repeated near the end and a tie at the start.
    std::vector<double> big(1000003);
    for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<double>(i % 97) / 97;
    big[999990] = 3;
    big[1000000] = 3;
    const Tensor b = Tensor::FromVector<double>({1000003}, big, t);
    EXPECT_EQ(ArgMax(b.To(kGpu), 0).To(Device::Cpu()).item(), 999990.0) << DTypeName(t);
    big[12345] = nan;
    big[777777] = nan;
    const Tensor bn = Tensor::FromVector<double>({1000003}, big, t);
    EXPECT_EQ(ArgMax(bn.To(kGpu), 0).To(Device::Cpu()).item(), 12345.0) << DTypeName(t);
  }
}

// Rows of 17..2048 (a warp per row) and over 2048 (a block per row): ties and NaNs placed so the
// lowest index sits in a higher lane (or warp) than a later equal value, so a cross-lane or
// cross-warp reduction that prefers the lower lane instead of the lower index fails.
TEST(ReduceCudaTest, ArgMaxWarpAndBlockRowsPreferTheLowerIndexAcrossLanes) {
  SKIP_WITHOUT_GPU();
  const double nan = std::nan(""), inf = std::numeric_limits<double>::infinity();
  for (DType t : kFloatTypes) {
    // n = 40: lane = k % 32.
    std::vector<std::vector<double>> rows(6, std::vector<double>(40, 0.0));
    rows[0][5] = rows[0][20] = 3;    // lanes 5, 20 -> 5
    rows[1][20] = rows[1][37] = 3;   // lanes 20, 5 -> 20
    rows[2][33] = rows[2][1] = 3;    // both lane 1 -> 1
    rows[3][30] = rows[3][34] = nan;  // lanes 30, 2 -> 30 (first NaN)
    rows[3][3] = 7;
    rows[4].assign(40, -inf);        // all -inf -> 0
    for (int k = 0; k < 40; ++k) rows[5][k] = k % 8;  // max 7 first at 7 (lane 7), also 39
    std::vector<double> flat;
    for (const auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());
    const Tensor x = Tensor::FromVector<double>({6, 40}, flat, t);
    EXPECT_EQ(ArgMax(x.To(kGpu), 1).To(Device::Cpu()).ToVector<int64_t>(),
              (std::vector<int64_t>{5, 20, 1, 30, 0, 7}))
        << DTypeName(t) << " warp rows";
    EXPECT_EQ(ArgMax(x, 1).ToVector<int64_t>(), (std::vector<int64_t>{5, 20, 1, 30, 0, 7}));
    // n = 3000, blockDim 256: thread = k % 256, warp = thread / 32.
    std::vector<double> b(2 * 3000, 0.0);
    b[250] = b[2060] = 5;                   // thread 250 (warp 7) vs 12 (warp 0) -> 250
    b[3000 + 2500] = b[3000 + 511] = nan;   // thread 196 (warp 6) vs 255 (warp 7) -> 511
    b[3000 + 7] = 9;
    const Tensor xb = Tensor::FromVector<double>({2, 3000}, b, t);
    EXPECT_EQ(ArgMax(xb.To(kGpu), 1).To(Device::Cpu()).ToVector<int64_t>(),
              (std::vector<int64_t>{250, 511}))
        << DTypeName(t) << " block rows";
    // Random rows of every warp-path length class, against the CPU (bf16/f16 have many ties).
    for (const Shape& s : std::vector<Shape>{{9, 17}, {5, 33}, {7, 100}, {3, 2048}}) {
      const Tensor r = RandomTensor(s, t, 77);
      EXPECT_EQ(ArgMax(r.To(kGpu), 1).To(Device::Cpu()).ToVector<int64_t>(),
                ArgMax(r, 1).ToVector<int64_t>())
          << DTypeName(t) << ShapeToString(s);
    }
  }
}

TEST(ReduceCudaTest, SumToShape) {
  SKIP_WITHOUT_GPU();
  for (DType t : kFloatTypes) {
    const Tensor dy = RandomTensor({2, 4, 8}, t, 41);
    const Tensor g = dy.To(kGpu);
    EXPECT_TRUE(SumToShape(g, {2, 4, 8}).SharesStorageWith(g));
    for (const Shape& s : std::vector<Shape>{{8}, {4, 1}, {1, 8}, {2, 1, 8}, {1}, {}}) {
      const Tensor want = SumToShape(dy, s);
      const Tensor got = SumToShape(g, s);
      ASSERT_TRUE(got.is_cuda());
      ASSERT_EQ(got.shape(), want.shape());
      const Tensor h = got.To(Device::Cpu());
      for (int64_t i = 0; i < want.numel(); ++i) {
        const double w = want.at(i);
        const double tol = t == DType::kF64 ? 1e-12 : 1e-5 * (1 + std::fabs(w)) +
                           (t == DType::kBF16 || t == DType::kF16 ? Ulp(t, w) : 0.0);
        EXPECT_NEAR(h.at(i), w, tol) << DTypeName(t) << " to " << ShapeToString(s);
      }
    }
  }
}

TEST(ReduceCudaTest, ArgumentErrorsReadTheSameOnBothDevices) {
  SKIP_WITHOUT_GPU();
  for (DType t : {DType::kF32, DType::kBF16}) {
    const Tensor e = Tensor::Zeros({3, 0}, t);
    for (const Tensor& x : {e, e.To(kGpu)}) {
      const std::string s = e.ShapeString();
      ExpectOpError([&] { Max(x, {1}); }, {"max", s.c_str(), "empty"});
      ExpectOpError([&] { Min(x, {-1}); }, {"min", s.c_str(), "empty"});
      ExpectOpError([&] { Sum(x, {2}); }, {"sum", "out of range", s.c_str()});
      ExpectOpError([&] { Mean(x, {0, -2}); }, {"mean", "listed twice"});
      ExpectOpError([&] { ArgMax(x, 1); }, {"argmax", "empty"});
      ExpectOpError([&] { SumToShape(x, {4}); }, {"sum_to_shape", "not a broadcast"});
    }
  }
  const Tensor ints = Tensor::Zeros({3}, DType::kI32).To(kGpu);
  ExpectOpError([&] { Sum(ints, {}); }, {"sum", "integer dtype"});
  ExpectOpError([&] { ArgMax(ints, 0); }, {"argmax", "integer dtype"});
}

// Runs everywhere: the CPU path keeps its errors (the dispatch sits after the shared checks),
// and a device tensor cannot be made without a GPU, so the device ops are never reached.
TEST(ReduceCudaTest, ErrorPathsWithoutAGpu) {
  const Tensor e = Tensor::Zeros({3, 0}, DType::kBF16);
  ExpectOpError([&] { Max(e, {1}); }, {"max", "bf16[3,0]", "empty"});  // names x's own dtype
  ExpectOpError([&] { Sum(e, {5}); }, {"sum", "out of range"});
  if (cuda::Available()) GTEST_SKIP() << "a GPU is present";
  EXPECT_THROW(Tensor::Ones({4}).To(kGpu), OpError);
}

}  // namespace
}  // namespace shardmap
