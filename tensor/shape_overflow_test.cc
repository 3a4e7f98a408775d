// Shape and size arithmetic that would overflow int64 is a clear error, never a wrapped (and
// accepted) element count.
#include <cstdint>
#include <limits>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensor/error.h"
#include "tensor/ops/nn.h"
#include "tensor/tensor.h"

namespace shardmap {
namespace {

using ::testing::HasSubstr;
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
constexpr int64_t kMin = std::numeric_limits<int64_t>::min();

void ExpectFails(const absl::Status& s, const std::string& part) {
  ASSERT_FALSE(s.ok()) << "accepted";
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(part)) << s;
}

TEST(ShapeOverflow, ReshapeWhoseProductWrapsIsRefused) {
  const Tensor four = Tensor::Zeros({4}, DType::kF32);
  const Tensor empty = Tensor::Zeros({0}, DType::kF32);
  const int64_t big = (int64_t{1} << 62) + 1;  // big * 4 wraps to 4
  ExpectFails(CatchOpError([&] { four.Reshape({big, 4}); }), "int64");
  ExpectFails(CatchOpError([&] { four.Reshape({int64_t{1} << 32, int64_t{1} << 32}); }), "int64");
  ExpectFails(CatchOpError([&] { empty.Reshape({int64_t{1} << 32, int64_t{1} << 32}); }),
              "int64");
  ExpectFails(CatchOpError([&] { four.Reshape({-1, big, 4}); }), "int64");
  // Legitimate reshapes, zero-size ones included, still work.
  EXPECT_EQ(four.Reshape({2, 2}).shape(), (Shape{2, 2}));
  EXPECT_EQ(empty.Reshape({0, kMax}).shape(), (Shape{0, kMax}));
  EXPECT_EQ(empty.Reshape({3, 0}).numel(), 0);
}

TEST(ShapeOverflow, SliceRowsPastTheEndIsRefused) {
  const Tensor t = Tensor::Zeros({5, 3}, DType::kF64);
  ExpectFails(CatchOpError([&] { t.SliceRows(1, kMax); }), "out of range");
  ExpectFails(CatchOpError([&] { t.SliceRows(kMax, 1); }), "out of range");
  ExpectFails(CatchOpError([&] { t.SliceRows(6, 0); }), "out of range");
  ExpectFails(CatchOpError([&] { t.SliceRows(-1, 1); }), "out of range");
  const Tensor s = t.SliceRows(5, 0);
  EXPECT_EQ(s.numel(), 0);
  EXPECT_EQ(t.SliceRows(2, 3).numel(), 9);
}

TEST(ShapeOverflow, ElementCountOverflowIsRefused) {
  ExpectFails(CatchOpError([&] { NumElements({kMax, 2}); }), "int64");
  EXPECT_EQ(NumElements({kMax, 0}), 0);
  ExpectFails(CatchOpError([&] { Tensor::Zeros({int64_t{1} << 40, int64_t{1} << 40}); }),
              "too many elements");
}

TEST(ShapeOverflow, InvalidDTypeIsRefused) {
  ExpectFails(CatchOpError([&] { Tensor::Zeros({2}, static_cast<DType>(77)); }),
              "invalid DType value 77");
}

// Against a naive mask: element (i, j) is filled when j > i + offset, computed in 128 bits.
void ExpectNaiveMask(const Tensor& scores, int64_t offset) {
  const Tensor m = CausalMask(scores, offset, -5.0);
  const int64_t s = scores.dim(0), t = scores.dim(1);
  for (int64_t i = 0; i < s; ++i) {
    for (int64_t j = 0; j < t; ++j) {
      const bool masked = static_cast<__int128>(j) > static_cast<__int128>(i) + offset;
      EXPECT_EQ(m.at(i * t + j), masked ? -5.0 : scores.at(i * t + j))
          << "offset " << offset << " at (" << i << "," << j << ")";
    }
  }
}

TEST(ShapeOverflow, CausalMaskWithExtremeOffsets) {
  Tensor scores = Tensor::Zeros({3, 4}, DType::kF64);
  for (int64_t i = 0; i < 12; ++i) scores.data<double>()[i] = static_cast<double>(i + 1);
  for (int64_t offset : {kMax, kMax - 1, kMin, kMin + 1, int64_t{-4}, int64_t{-5}, int64_t{3},
                         int64_t{4}, int64_t{0}, int64_t{-1}}) {
    ExpectNaiveMask(scores, offset);
  }
}

}  // namespace
}  // namespace shardmap
