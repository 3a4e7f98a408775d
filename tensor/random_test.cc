#include "tensor/random.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "tensor/internal/philox.h"
#include "tensor/ops/shape_ops.h"
#include "tensor/testing/test_util.h"

namespace shardmap {
namespace {

using testing::ExpectOpError;

// Known-answer vectors of Philox-4x32-10 from the Random123 distribution (kat_vectors).
TEST(RandomTest, PhiloxKnownAnswers) {
  auto check = [](internal::Block got, std::vector<uint32_t> want) {
    for (int i = 0; i < 4; ++i) EXPECT_EQ(got.v[i], want[i]) << "word " << i;
  };
  check(internal::Philox4x32(0, 0, 0, 0, 0, 0),
        {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u});
  check(internal::Philox4x32(~0u, ~0u, ~0u, ~0u, ~0u, ~0u),
        {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu});
  check(internal::Philox4x32(0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u, 0xa4093822u,
                             0x299f31d0u),
        {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u});
}

TEST(RandomTest, DeterministicPerSeed) {
  const Tensor a = RandomNormal({3, 4}, 7), b = RandomNormal({3, 4}, 7),
               c = RandomNormal({3, 4}, 8);
  EXPECT_EQ(a.ToVector<double>(), b.ToVector<double>());
  EXPECT_NE(a.ToVector<double>(), c.ToVector<double>());
  // Element i depends only on (seed, i): a longer tensor extends a shorter one.
  const Tensor longer = RandomNormal({20}, 7);
  for (int i = 0; i < 12; ++i) EXPECT_EQ(longer.at(i), a.at(i));
  // Uniform and normal streams are not the same numbers.
  EXPECT_NE(RandomUniform({4}, 7).ToVector<double>(), RandomNormal({4}, 7).ToVector<double>());
}

// Tiles `global` into blocks cut at the given boundaries per dim, generates each block alone, and
// checks it against the slice of the whole tensor; then reassembles the whole from the blocks.
void CheckTiling(const Shape& global, const std::vector<std::vector<int64_t>>& cuts, DType dt,
                 bool normal) {
  const uint64_t seed = 1234;
  const Tensor whole = normal ? RandomNormal(global, seed, 0.5, 2.0, dt)
                              : RandomUniform(global, seed, -1.0, 3.0, dt);
  Tensor assembled = Tensor::Zeros(global, dt);
  const int r = static_cast<int>(global.size());
  std::vector<size_t> pick(r, 0);
  while (true) {
    Shape off(r), len(r);
    for (int d = 0; d < r; ++d) {
      off[d] = cuts[d][pick[d]];
      len[d] = cuts[d][pick[d] + 1] - off[d];
    }
    const Tensor block = normal ? RandomNormalSlice(global, off, len, seed, 0.5, 2.0, dt)
                                : RandomUniformSlice(global, off, len, seed, -1.0, 3.0, dt);
    Tensor want = whole;
    for (int d = 0; d < r; ++d) want = Slice(want, d, off[d], len[d]);
    ASSERT_EQ(block.shape(), want.shape());
    ASSERT_EQ(block.ToVector<double>(), want.ToVector<double>())
        << "block at " << ShapeToString(off) << " of " << ShapeToString(global);
    // Place the block's elements at their global positions (bit copies).
    for (int64_t i = 0; i < block.numel(); ++i) {
      const auto li = testing::Unflatten(block.shape(), i);
      int64_t g = 0;
      for (int d = 0; d < r; ++d) g = g * global[d] + off[d] + li[d];
      if (dt == DType::kF32) {
        assembled.data<float>()[g] = block.data<float>()[i];
      } else if (dt == DType::kF64) {
        assembled.data<double>()[g] = block.data<double>()[i];
      } else {
        static_cast<uint16_t*>(assembled.raw_data())[g] =
            static_cast<const uint16_t*>(block.raw_data())[i];
      }
    }
    int d = r - 1;
    for (; d >= 0; --d) {
      if (++pick[d] + 1 < cuts[d].size()) break;
      pick[d] = 0;
    }
    if (d < 0) break;
  }
  EXPECT_EQ(assembled.ToVector<double>(), whole.ToVector<double>());
}

TEST(RandomTest, SlicesEqualTheSameSliceOfTheWhole) {
  for (DType dt : {DType::kF32, DType::kF64, DType::kBF16, DType::kF16}) {
    for (bool normal : {true, false}) {
      // 2-D: column shards over 4 ranks, row shards over 3 ranks, a 2x2 grid with uneven cuts.
      CheckTiling({6, 8}, {{0, 6}, {0, 2, 4, 6, 8}}, dt, normal);
      CheckTiling({9, 5}, {{0, 3, 6, 9}, {0, 5}}, dt, normal);
      CheckTiling({7, 5}, {{0, 3, 7}, {0, 1, 5}}, dt, normal);
      // 3-D: non-contiguous blocks on every dim, odd sizes, including an empty block.
      CheckTiling({5, 6, 7}, {{0, 2, 5}, {0, 3, 3, 6}, {0, 1, 4, 7}}, dt, normal);
      // 4-D sharded on dims 1 and 3 only.
      CheckTiling({2, 6, 3, 4}, {{0, 2}, {0, 2, 4, 6}, {0, 3}, {0, 2, 4}}, dt, normal);
    }
  }
}

TEST(RandomTest, NormalAndUniformMoments) {
  const int64_t n = 200000;
  const Tensor z = RandomNormal({n}, 3, 1.0, 2.0, DType::kF64);
  double s = 0, ss = 0, s3 = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double v = (z.at(i) - 1.0) / 2.0;
    s += v;
    ss += v * v;
    s3 += v * v * v;
  }
  EXPECT_NEAR(s / n, 0.0, 0.01);
  EXPECT_NEAR(ss / n, 1.0, 0.015);
  EXPECT_NEAR(s3 / n, 0.0, 0.03);
  // Tail mass beyond 3 sigma: 0.27%.
  int64_t tail = 0;
  for (int64_t i = 0; i < n; ++i) tail += std::fabs((z.at(i) - 1.0) / 2.0) > 3.0;
  EXPECT_NEAR(static_cast<double>(tail) / n, 0.0027, 0.0006);

  const Tensor u = RandomUniform({n}, 4, -2.0, 6.0, DType::kF64);
  std::vector<int64_t> bins(8, 0);
  for (int64_t i = 0; i < n; ++i) {
    const double v = u.at(i);
    ASSERT_GE(v, -2.0);
    ASSERT_LT(v, 6.0);
    ++bins[static_cast<int>(v + 2.0)];
  }
  for (int64_t c : bins) EXPECT_NEAR(static_cast<double>(c) / n, 0.125, 0.005);
}

TEST(RandomTest, RandomInts) {
  const Tensor t = RandomInts({3, 10000}, 7, 5);
  EXPECT_EQ(t.dtype(), DType::kI64);
  std::vector<int64_t> counts(7, 0);
  for (int64_t i = 0; i < t.numel(); ++i) {
    const int64_t v = static_cast<int64_t>(t.at(i));
    ASSERT_GE(v, 0);
    ASSERT_LT(v, 7);
    ++counts[v];
  }
  for (int64_t c : counts) EXPECT_NEAR(static_cast<double>(c) / t.numel(), 1.0 / 7, 0.01);
  EXPECT_EQ(RandomInts({5}, 1, 1).ToVector<int64_t>(), std::vector<int64_t>(5, 0));
  // A rank's block of rows and columns equals the same block of the whole.
  const Tensor whole = RandomInts({6, 9}, 1000, 3);
  const Tensor block = RandomIntsSlice({6, 9}, {2, 4}, {3, 5}, 1000, 3);
  EXPECT_EQ(block.ToVector<int64_t>(),
            Slice(Slice(whole, 0, 2, 3), 1, 4, 5).ToVector<int64_t>());
  EXPECT_EQ(RandomInts({4}, 100, 9).ToVector<int64_t>(),
            RandomInts({4}, 100, 9).ToVector<int64_t>());
}

TEST(RandomTest, Errors) {
  ExpectOpError(
      [] {
        RandomNormalSlice({4, 4}, {0, 2}, {4, 3}, 1);
      },
      {"random_normal", "[0,2]", "[4,3]", "[4,4]", "dim 1"});
  ExpectOpError([] { RandomUniformSlice({4, 4}, {0}, {4, 4}, 1); }, {"random_uniform", "rank"});
  ExpectOpError([] { RandomNormalSlice({4}, {-1}, {2}, 1); }, {"random_normal"});
  ExpectOpError([] { RandomNormal({2}, 1, 0, 1, DType::kI32); }, {"random_normal", "i32"});
  ExpectOpError([] { RandomUniform({2}, 1, 2.0, 1.0); }, {"random_uniform", "low"});
  ExpectOpError([] { RandomInts({2}, 0, 1); }, {"random_ints", "n is 0"});
  ExpectOpError([] { RandomIntsSlice({4}, {3}, {2}, 5, 1); }, {"random_ints", "does not fit"});
  ExpectOpError([] { RandomInts({-1}, 5, 1); }, {"random_ints"});
  ExpectOpError([] { RandomNormal({-2}, 1); }, {"random_normal"});
}

}  // namespace
}  // namespace shardmap
