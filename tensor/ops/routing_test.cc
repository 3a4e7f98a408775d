#include "tensor/ops/routing.h"

#include <vector>

#include "gtest/gtest.h"
#include "tensor/ops/shape_ops.h"
#include "tensor/testing/test_util.h"

namespace shardmap {
namespace {

using testing::ExpectOpError;
using testing::RandomTensor;

class RoutingTest : public ::testing::TestWithParam<DType> {};

// Naive top-k: k passes, each picking the largest remaining entry (lowest index on ties).
TEST_P(RoutingTest, TopKMatchesNaiveSelection) {
  const DType dt = GetParam();
  for (int64_t k : {1, 2, 5}) {
    Tensor x = RandomTensor({7, 5}, dt, 3 + k);
    TopKResult r = TopK(x, k);
    ASSERT_EQ(r.values.shape(), (Shape{7, k}));
    ASSERT_EQ(r.indices.dtype(), DType::kI64);
    for (int64_t i = 0; i < 7; ++i) {
      std::vector<bool> used(5, false);
      for (int64_t j = 0; j < k; ++j) {
        int64_t best = -1;
        for (int64_t c = 0; c < 5; ++c) {
          if (!used[c] && (best < 0 || x.at(i * 5 + c) > x.at(i * 5 + best))) best = c;
        }
        used[best] = true;
        EXPECT_EQ(r.indices.ToVector<int64_t>()[i * k + j], best) << i << "," << j;
        EXPECT_EQ(r.values.at(i * k + j), x.at(i * 5 + best));
      }
    }
  }
}

TEST_P(RoutingTest, TopKTiesGoToTheLowerIndex) {
  Tensor x = Tensor::FromVector<double>({2, 4}, {1, 3, 3, 0, 2, 2, 2, 2});
  x = Cast(x, GetParam());
  TopKResult r = TopK(x, 3);
  EXPECT_EQ(r.indices.ToVector<int64_t>(), (std::vector<int64_t>{1, 2, 0, 0, 1, 2}));
}

TEST_P(RoutingTest, TopKBackwardScattersToThePicks) {
  const DType dt = GetParam();
  Tensor dv = Tensor::FromVector<double>({2, 2}, {1, 2, 3, 4});
  Tensor ids = Tensor::FromVector<int64_t>({2, 2}, {2, 0, 1, 2});
  Tensor dx = TopKBackward(Cast(dv, dt), ids, 3);
  ASSERT_EQ(dx.shape(), (Shape{2, 3}));
  EXPECT_EQ(dx.dtype(), dt);
  EXPECT_EQ(Cast(dx, DType::kF64).ToVector<double>(), (std::vector<double>{2, 0, 1, 0, 3, 4}));
}

// gather then scatter against naive loops, odd sizes, -1 rows, repeated rows.
TEST_P(RoutingTest, GatherAndScatterMatchNaiveLoops) {
  const DType dt = GetParam();
  Tensor x = RandomTensor({5, 3}, dt, 7);
  Tensor idx = Tensor::FromVector<int64_t>({7}, {4, -1, 0, 4, 2, -1, 1});
  Tensor g = GatherRows(x, idx);
  ASSERT_EQ(g.shape(), (Shape{7, 3}));
  std::vector<int64_t> iv = idx.ToVector<int64_t>();
  for (int64_t i = 0; i < 7; ++i) {
    for (int64_t j = 0; j < 3; ++j) {
      EXPECT_EQ(g.at(i * 3 + j), iv[i] < 0 ? 0.0 : x.at(iv[i] * 3 + j));
    }
  }
  Tensor s = ScatterAddRows(g, idx, 6);
  ASSERT_EQ(s.shape(), (Shape{6, 3}));
  for (int64_t r = 0; r < 6; ++r) {
    for (int64_t j = 0; j < 3; ++j) {
      double want = 0;
      for (int64_t i = 0; i < 7; ++i) {
        if (iv[i] == r) want += g.at(i * 3 + j);
      }
      EXPECT_NEAR(s.at(r * 3 + j), want, dt == DType::kF64 ? 1e-15 : 1e-6);
    }
  }
}

// <ScatterAddRows(a), b> == <a, GatherRows(b)>: each is the other's transpose.
TEST_P(RoutingTest, GatherIsTheTransposeOfScatterAdd) {
  const DType dt = GetParam();
  Tensor a = RandomTensor({2, 3, 4}, dt, 1);  // 6 rows (leading dims flattened)
  Tensor b = RandomTensor({5, 4}, dt, 2);
  Tensor idx = Tensor::FromVector<int32_t>({6}, {3, 3, -1, 0, 4, 1});
  Tensor sa = ScatterAddRows(a, idx, 5), gb = GatherRows(b, idx);
  double lhs = 0, rhs = 0;
  for (int64_t i = 0; i < sa.numel(); ++i) lhs += sa.at(i) * b.at(i);
  for (int64_t i = 0; i < gb.numel(); ++i) rhs += a.at(i) * gb.at(i);
  EXPECT_NEAR(lhs, rhs, dt == DType::kF64 ? 1e-12 : 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, RoutingTest, ::testing::Values(DType::kF32, DType::kF64),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

// Rows of zero width are still rows: [5, 0] has 5 of them.
TEST(Routing, ZeroWidthRows) {
  const Tensor x = Tensor::Zeros({5, 0}, DType::kF32);
  const Tensor idx = Tensor::FromVector<int64_t>({2}, {4, 0});
  EXPECT_EQ(GatherRows(x, idx).shape(), (Shape{2, 0}));
  EXPECT_EQ(ScatterAddRows(Tensor::Zeros({2, 0}, DType::kF32), idx, 5).shape(), (Shape{5, 0}));
}

TEST(RoutingErrors, NameTheProblem) {
  Tensor x = RandomTensor({3, 4}, DType::kF64, 1);
  ExpectOpError([&] { TopK(x, 5); }, {"top_k", "k = 5", "1 <= k <= 4"});
  ExpectOpError([&] { TopK(x, 0); }, {"top_k", "k = 0"});
  Tensor nan = Tensor::FromVector<double>({1, 2}, {1.0, NAN});
  ExpectOpError([&] { TopK(nan, 1); }, {"top_k", "NaN", "column 1"});
  ExpectOpError([&] { GatherRows(x, Tensor::FromVector<int64_t>({2}, {0, 3})); },
                {"gather_rows", "idx[1] = 3", "0 <= idx < 3"});
  ExpectOpError([&] { GatherRows(x, Tensor::FromVector<int64_t>({1}, {-2})); },
                {"gather_rows", "idx[0] = -2"});
  ExpectOpError([&] { GatherRows(x, Tensor::FromVector<double>({1}, {0})); },
                {"gather_rows", "integer dtype"});
  ExpectOpError([&] { ScatterAddRows(x, Tensor::FromVector<int64_t>({2}, {0, 1}), 4); },
                {"scatter_add_rows", "3 rows", "2 entries"});
  ExpectOpError([&] { ScatterAddRows(x, Tensor::FromVector<int64_t>({3}, {0, 1, 4}), 4); },
                {"scatter_add_rows", "idx[2] = 4"});
  ExpectOpError([&] { GatherRows(RandomTensor({3}, DType::kF64, 1),
                                 Tensor::FromVector<int64_t>({1}, {0})); },
                {"gather_rows", "rank >= 2"});
}

TEST(LocalIndices, ShardRowsAndFlatPositions) {
  const Tensor ids = Tensor::FromVector<int64_t>({2, 3}, {4, 7, 5, 9, 3, 6});
  // A vocab shard [4, 8): local rows, -1 elsewhere.
  EXPECT_EQ(LocalIndices(ids, 4, 4).ToVector<int64_t>(),
            (std::vector<int64_t>{0, 3, 1, -1, -1, 2}));
  EXPECT_EQ(LocalIndices(ids, 4, 4).shape(), ids.shape());
  // Flat positions in a [6, 4] shard (stride 4), from i32 ids.
  EXPECT_EQ(LocalIndices(Cast(ids, DType::kI32), 4, 4, 4).ToVector<int64_t>(),
            (std::vector<int64_t>{0, 7, 9, -1, -1, 22}));
  ExpectOpError([&] { LocalIndices(ids, 4, 4, 0, /*strict=*/true, "pick", " for x"); },
                {"pick: index 9 at position 3 is out of range [4, 8) for x"});
  ExpectOpError([&] { LocalIndices(Tensor::Zeros({2}), 0, 4); }, {"local_indices", "integer"});
}

}  // namespace
}  // namespace shardmap
