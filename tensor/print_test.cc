#include "tensor/print.h"

#include <cmath>
#include <sstream>

#include "gtest/gtest.h"

namespace shardmap {
namespace {

PrintOptions Small() {
  PrintOptions o;
  o.max_per_dim = 4;
  o.edge_items = 2;  // one entry each side of "..."
  return o;
}

TEST(PrintTest, OneAndTwoD) {
  EXPECT_EQ(ToString(Tensor::Arange(6).Reshape({2, 3})),
            "f32[2,3]\n"
            "[[0, 1, 2],\n"
            " [3, 4, 5]]");
  EXPECT_EQ(ToString(Tensor::FromVector<double>({3}, {-1.5, 10, 1.0 / 3})),
            "f64[3]\n"
            "[  -1.5,     10, 0.3333]");
  EXPECT_EQ(ToString(Tensor::FromVector<int64_t>({2, 2}, {1, -20, 300, 4})),
            "i64[2,2]\n"
            "[[  1, -20],\n"
            " [300,   4]]");
}

TEST(PrintTest, SpecialValuesDTypesAndEdgeCases) {
  EXPECT_EQ(ToString(Tensor::FromVector<float>({3}, {NAN, INFINITY, -INFINITY})),
            "f32[3]\n[ nan,  inf, -inf]");
  EXPECT_EQ(ToString(Tensor::FromVector<float>({2}, {1.0f / 3, 2}, DType::kBF16)),
            "bf16[2]\n[0.334,     2]");
  PrintOptions p;
  p.precision = 2;
  EXPECT_EQ(ToString(Tensor::FromVector<float>({2}, {3.14159f, 1234.5f}), p),
            "f32[2]\n[    3.1, 1.2e+03]");
  EXPECT_EQ(ToString(Tensor::Scalar(2.5)), "f32[]\n2.5");
  EXPECT_EQ(ToString(Tensor::Zeros({0, 3})), "f32[0,3]\n[]");
  EXPECT_EQ(ToString(Tensor()), "<undefined tensor>");
  std::ostringstream os;
  os << Tensor::Arange(2, DType::kI32);
  EXPECT_EQ(os.str(), "i32[2]\n[0, 1]");
}

TEST(PrintTest, ThreeDBlocksSideBySideAlongDimMinus3) {
  EXPECT_EQ(ToString(Tensor::Arange(12).Reshape({2, 2, 3})),
            "f32[2,2,3]\n"
            "[[ 0,  1,  2],   [[ 6,  7,  8],\n"
            " [ 3,  4,  5]]    [ 9, 10, 11]]");
}

TEST(PrintTest, FourDStacksRowsOfBlocksAlongDimMinus4) {
  EXPECT_EQ(ToString(Tensor::Arange(24).Reshape({2, 3, 2, 2})),
            "f32[2,3,2,2]\n"
            "[[ 0,  1],   [[ 4,  5],   [[ 8,  9],\n"
            " [ 2,  3]]    [ 6,  7]]    [10, 11]]\n"
            "\n"
            "[[12, 13],   [[16, 17],   [[20, 21],\n"
            " [14, 15]]    [18, 19]]    [22, 23]]");
}

TEST(PrintTest, FiveDPutsGridsSideBySideAlongDimMinus5) {
  EXPECT_EQ(ToString(Tensor::Arange(32).Reshape({2, 2, 2, 2, 2})),
            "f32[2,2,2,2,2]\n"
            "[[ 0,  1],   [[ 4,  5],  |  [[16, 17],   [[20, 21],\n"
            " [ 2,  3]]    [ 6,  7]]  |   [18, 19]]    [22, 23]]\n"
            "                         |\n"
            "[[ 8,  9],   [[12, 13],  |  [[24, 25],   [[28, 29],\n"
            " [10, 11]]    [14, 15]]  |   [26, 27]]    [30, 31]]");
}

TEST(PrintTest, LongDimsAreSummarised) {
  EXPECT_EQ(ToString(Tensor::Arange(10), Small()), "f32[10]\n[0, ..., 9]");
  EXPECT_EQ(ToString(Tensor::Arange(60).Reshape({6, 10}), Small()),
            "f32[6,10]\n"
            "[[ 0, ...,  9],\n"
            " ...,\n"
            " [50, ..., 59]]");
  EXPECT_EQ(ToString(Tensor::Arange(60).Reshape({5, 3, 4}), Small()),
            "f32[5,3,4]\n"
            "[[ 0,  1,  2,  3],   ...   [[48, 49, 50, 51],\n"
            " [ 4,  5,  6,  7],          [52, 53, 54, 55],\n"
            " [ 8,  9, 10, 11]]          [56, 57, 58, 59]]");
  // Within the limit nothing is elided.
  EXPECT_EQ(ToString(Tensor::Arange(4), Small()), "f32[4]\n[0, 1, 2, 3]");
  // A huge tensor prints quickly and compactly with the defaults.
  const std::string big = ToString(Tensor::Zeros({1000, 1000}));
  EXPECT_LT(big.size(), 2000u);
}

TEST(PrintTest, MetaTensorsSayMetaAndPrintNoValues) {
  const Tensor m = Tensor::Full({2, 3}, 1.5, DType::kBF16, Device::Meta());
  EXPECT_EQ(ToString(m), "bf16[2,3] on meta (no data)");
  std::ostringstream os;
  os << m;
  EXPECT_EQ(os.str(), "bf16[2,3] on meta (no data)");
}

}  // namespace
}  // namespace shardmap
