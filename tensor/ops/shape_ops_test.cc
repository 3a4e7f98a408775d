#include "tensor/ops/shape_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "gtest/gtest.h"
#include "tensor/testing/test_util.h"

namespace shardmap {
namespace {

using testing::ExpectOpError;
using testing::RandomTensor;
using testing::Unflatten;

int64_t Flat(absl::Span<const int64_t> shape, const std::vector<int64_t>& idx) {
  int64_t f = 0;
  for (size_t d = 0; d < shape.size(); ++d) f = f * shape[d] + idx[d];
  return f;
}

TEST(ShapeOpsTest, PermuteEveryPermutationAgainstNaive) {
  for (DType dt : {DType::kF32, DType::kI64, DType::kBF16, DType::kF64}) {
    // Small shapes for every permutation; sizes past the 32-wide transpose tiles, with ragged
    // edges, for the tiled path.
    for (const Shape& s : {Shape{2, 3, 4}, Shape{3, 1, 5, 2}, Shape{0, 2, 3}, Shape{3, 70, 45}}) {
      const Tensor x = RandomTensor(s, dt, 1, -100, 100);
      std::vector<int> perm(s.size());
      std::iota(perm.begin(), perm.end(), 0);
      do {
        const Tensor y = Permute(x, perm);
        for (size_t d = 0; d < s.size(); ++d) ASSERT_EQ(y.shape()[d], s[perm[d]]);
        for (int64_t i = 0; i < y.numel(); ++i) {
          const auto out_idx = Unflatten(y.shape(), i);
          std::vector<int64_t> in_idx(s.size());
          for (size_t d = 0; d < s.size(); ++d) in_idx[perm[d]] = out_idx[d];
          ASSERT_EQ(y.at(i), x.at(Flat(s, in_idx)));
        }
      } while (std::next_permutation(perm.begin(), perm.end()));
    }
  }
}

// The tiled transpose path (buffered tiles, 4x4 SSE2 blocks for 4-byte elements) against a
// naive element-by-element reference, bit for bit: odd sizes below, at and past the tile edges,
// every dtype (element sizes 2, 4, 8), and rank-3/4 permutes that move the innermost dim.
TEST(ShapeOpsTest, TiledTransposeMatchesNaiveBits) {
  const std::vector<Shape> shapes2 = {{1, 1},  {7, 13},  {33, 65}, {1000, 3}, {3, 1000},
                                      {64, 64}, {65, 129}, {4, 4},  {130, 67}};
  for (DType dt : {DType::kF32, DType::kF64, DType::kI32, DType::kI64, DType::kBF16,
                   DType::kF16}) {
    const size_t es = DTypeSize(dt);
    auto check = [&](const Tensor& x, const std::vector<int>& perm) {
      const Tensor y = Permute(x, perm);
      const Shape& s = x.shape();
      const char* px = static_cast<const char*>(x.raw_data());
      const char* py = static_cast<const char*>(y.raw_data());
      for (int64_t i = 0; i < y.numel(); ++i) {
        const auto out_idx = Unflatten(y.shape(), i);
        std::vector<int64_t> in_idx(s.size());
        for (size_t d = 0; d < s.size(); ++d) in_idx[perm[d]] = out_idx[d];
        ASSERT_EQ(std::memcmp(py + i * es, px + Flat(s, in_idx) * es, es), 0)
            << x.ShapeString() << " element " << i;
      }
    };
    for (const Shape& s : shapes2) {
      const Tensor x = RandomTensor(s, dt, 3, -1000, 1000);
      check(x, {1, 0});
      const Tensor t = Transpose(x, 0, 1);
      EXPECT_EQ(Transpose(t, 0, 1).ToVector<double>(), x.ToVector<double>());
    }
    const Tensor x3 = RandomTensor({3, 33, 65}, dt, 4, -1000, 1000);
    check(x3, {0, 2, 1});
    check(x3, {2, 1, 0});
    check(x3, {2, 0, 1});
    const Tensor x4 = RandomTensor({2, 5, 67, 70}, dt, 5, -1000, 1000);
    check(x4, {0, 1, 3, 2});  // [b,s,h,d] -> [b,s,d,h]
    check(x4, {0, 2, 1, 3});  // [b,s,h,d] -> [b,h,s,d]: rows of d move whole
    check(x4, {3, 2, 1, 0});
    check(x4, {0, 3, 1, 2});
  }
  // f32 outputs of 4 MiB and more take the streaming-store path (odd edges and an unaligned row
  // stride included).
  for (const Shape& s : {Shape{1031, 1040}, Shape{1040, 1031}, Shape{2, 1031, 520}}) {
    const Tensor x = RandomTensor(s, DType::kF32, 6, -1000, 1000);
    const std::vector<int> perm =
        s.size() == 2 ? std::vector<int>{1, 0} : std::vector<int>{0, 2, 1};
    const Tensor y = Permute(x, perm);
    const std::vector<float> xv = x.ToVector<float>(), yv = y.ToVector<float>();
    const int64_t b = s.size() == 3 ? s[0] : 1, m = s[s.size() - 2], n = s.back();
    for (int64_t k = 0; k < b; ++k) {
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          ASSERT_EQ(yv[k * m * n + j * m + i], xv[k * m * n + i * n + j])
              << x.ShapeString() << " at " << k << "," << i << "," << j;
        }
      }
    }
  }
}

TEST(ShapeOpsTest, Transpose) {
  const Tensor x = Tensor::Arange(6).Reshape({2, 3});
  EXPECT_EQ(Transpose(x, 0, 1).ToVector<float>(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  EXPECT_EQ(Transpose(x, -1, -2).ToVector<float>(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  const Tensor same = Transpose(x, 1, 1);
  EXPECT_FALSE(same.SharesStorageWith(x));  // always fresh storage
  EXPECT_EQ(same.ToVector<float>(), x.ToVector<float>());
  ExpectOpError([&] { Transpose(x, 0, 2); }, {"transpose", "dim 2", "f32[2,3]"});
  ExpectOpError([&] { Permute(x, {0}); }, {"permute", "rank 2"});
  ExpectOpError([&] { Permute(x, {1, 1}); }, {"permute", "twice"});
}

TEST(ShapeOpsTest, SliceEveryDim) {
  const Shape s = {3, 5, 4};
  const Tensor x = RandomTensor(s, DType::kF32, 2);
  for (int d = 0; d < 3; ++d) {
    for (int64_t start = 0; start <= s[d]; ++start) {
      for (int64_t len = 0; start + len <= s[d]; ++len) {
        const Tensor y = Slice(x, d, start, len);
        Shape want = s;
        want[d] = len;
        ASSERT_EQ(y.shape(), want);
        for (int64_t i = 0; i < y.numel(); ++i) {
          auto idx = Unflatten(want, i);
          idx[d] += start;
          ASSERT_EQ(y.at(i), x.at(Flat(s, idx)));
        }
      }
    }
  }
  EXPECT_FALSE(Slice(x, 0, 0, 3).SharesStorageWith(x));
  ExpectOpError([&] { Slice(x, 1, 3, 3); }, {"slice", "[3, 6)", "f32[3,5,4]", "dim size 5"});
  ExpectOpError([&] { Slice(x, 1, -1, 2); }, {"slice", "f32[3,5,4]"});
  ExpectOpError([&] { Slice(x, 1, 0, -1); }, {"slice"});
  ExpectOpError([&] { Slice(x, 3, 0, 1); }, {"slice", "dim 3"});
}

TEST(ShapeOpsTest, ConcatSplitChunkSliceAssign) {
  const Tensor a = RandomTensor({2, 3, 4}, DType::kF64, 3);
  const Tensor b = RandomTensor({2, 1, 4}, DType::kF64, 4);
  const Tensor c = RandomTensor({2, 0, 4}, DType::kF64, 5);
  const Tensor cat = Concat({a, c, b}, 1);
  ASSERT_EQ(cat.shape(), (Shape{2, 4, 4}));
  for (int64_t i = 0; i < cat.numel(); ++i) {
    auto idx = Unflatten(cat.shape(), i);
    const double want = idx[1] < 3 ? a.at(Flat(a.shape(), idx))
                                   : b.at(Flat(b.shape(), {idx[0], idx[1] - 3, idx[2]}));
    ASSERT_EQ(cat.at(i), want);
  }
  const auto parts = Split(cat, -2, {3, 0, 1});
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[0].ToVector<double>(), a.ToVector<double>());
  EXPECT_EQ(parts[1].shape(), (Shape{2, 0, 4}));
  EXPECT_EQ(parts[2].ToVector<double>(), b.ToVector<double>());
  const auto chunks = Chunk(cat, 2, 2);
  ASSERT_EQ(chunks.size(), 2u);
  EXPECT_EQ(Concat(chunks, 2).ToVector<double>(), cat.ToVector<double>());
  Tensor whole = Tensor::Zeros({2, 4, 4}, DType::kF64);
  SliceAssign(whole, 1, 3, b);
  SliceAssign(whole, 1, 0, a);
  EXPECT_EQ(whole.ToVector<double>(), cat.ToVector<double>());

  ExpectOpError([&] { Concat({}, 0); }, {"concat", "no tensors"});
  ExpectOpError([&] { Concat({a, Tensor::Zeros({2, 3, 5}, DType::kF64)}, 1); },
                {"concat", "part 1", "f64[2,3,5]", "f64[2,3,4]"});
  ExpectOpError([&] { Concat({a, Tensor::Zeros({2, 3, 4})}, 0); }, {"concat", "f32[2,3,4]"});
  ExpectOpError([&] { Split(a, 1, {1, 1}); }, {"split", "sum to 2", "f64[2,3,4]"});
  ExpectOpError([&] { Split(a, 1, {4, -1}); }, {"split", "negative"});
  ExpectOpError([&] { Chunk(a, 1, 2); }, {"chunk", "not divisible", "f64[2,3,4]"});
  ExpectOpError([&] { Chunk(a, 1, 0); }, {"chunk", "positive"});
  ExpectOpError([&] { SliceAssign(whole, 1, 2, a); }, {"slice_assign", "[2, 5)"});
  ExpectOpError([&] { SliceAssign(whole, 1, 0, Tensor::Zeros({2, 1, 3}, DType::kF64)); },
                {"slice_assign", "f64[2,1,3]", "does not fit"});
}

TEST(ShapeOpsTest, CastAllPairs) {
  const std::vector<double> vals = {0, 1, -2, 3, 100, -7, 65504, 0.5};
  const std::vector<DType> all = {DType::kF32, DType::kF64, DType::kBF16,
                                  DType::kF16, DType::kI32, DType::kI64};
  for (DType from : all) {
    for (DType to : all) {
      // Integers small enough to be exact in every dtype (bf16 holds 65504 only approximately).
      std::vector<double> v = vals;
      if (from == DType::kBF16 || to == DType::kBF16) v[6] = 256;
      if (from == DType::kI32 || from == DType::kI64 || to == DType::kI32 ||
          to == DType::kI64) {
        v[7] = 5;
      }
      const Tensor x = Tensor::FromVector<double>({2, 4}, v, from);
      const Tensor y = Cast(x, to);
      ASSERT_EQ(y.dtype(), to);
      ASSERT_EQ(y.shape(), x.shape());
      EXPECT_EQ(y.ToVector<double>(), v) << DTypeName(from) << "->" << DTypeName(to);
    }
  }
  const Tensor same = Tensor::Zeros({2});
  EXPECT_TRUE(Cast(same, DType::kF32).SharesStorageWith(same));  // documented no-op
}

TEST(ShapeOpsTest, CastRoundsToNearestEvenOnce) {
  // f32 -> bf16/f16 tie cases.
  const Tensor t = Tensor::FromVector<float>({3}, {1.00390625f, 1.01171875f, 2049.0f});
  EXPECT_EQ(Cast(t, DType::kBF16).ToVector<double>(),
            (std::vector<double>{1.0, 1.015625, 2048.0}));
  EXPECT_EQ(Cast(t, DType::kF16).at(2), 2048.0);
  // f64 just above a bf16 halfway point: a double rounding through f32 would land on the tie and
  // round to even (1.0); one correct rounding gives the upper neighbour.
  const double d = 1.00390625 + std::ldexp(1.0, -40);
  EXPECT_EQ(Cast(Tensor::FromVector<double>({1}, {d}), DType::kBF16).at(0), 1.0078125);
  const double e = 1.00048828125 + std::ldexp(1.0, -40);  // f16 halfway above 1.0, plus a bit
  EXPECT_EQ(Cast(Tensor::FromVector<double>({1}, {e}), DType::kF16).at(0), 1.0009765625);
  // Overflow and NaN.
  const Tensor big = Tensor::FromVector<double>({2}, {1e6, std::nan("")});
  EXPECT_TRUE(std::isinf(Cast(big, DType::kF16).at(0)));
  EXPECT_TRUE(std::isnan(Cast(big, DType::kBF16).at(1)));
}

}  // namespace
}  // namespace shardmap
