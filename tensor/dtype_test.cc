#include "tensor/dtype.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace shardmap {
namespace {

float Bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

// Independent decoders: value = (-1)^s * 2^(e - bias) * (1 + m / 2^mbits), subnormals at e == 0.
double DecodeRef(uint16_t h, int ebits, int mbits) {
  const int bias = (1 << (ebits - 1)) - 1;
  const int s = h >> 15, e = (h >> mbits) & ((1 << ebits) - 1), m = h & ((1 << mbits) - 1);
  double v;
  if (e == (1 << ebits) - 1) {
    v = m == 0 ? std::numeric_limits<double>::infinity() : std::nan("");
  } else if (e == 0) {
    v = std::ldexp(static_cast<double>(m), 1 - bias - mbits);
  } else {
    v = std::ldexp(1.0 + static_cast<double>(m) / (1 << mbits), e - bias);
  }
  return s ? -v : v;
}
double F16Ref(uint16_t h) { return DecodeRef(h, 5, 10); }
double BF16Ref(uint16_t h) { return DecodeRef(h, 8, 7); }

// Brute-force nearest-even rounding onto a table of the non-negative finite values of a format
// (bit patterns 0..max_finite, increasing), plus the overflow threshold value `beyond` (the
// power of two one ulp past max) that stands for infinity.
class RefRounder {
 public:
  RefRounder(double (*decode)(uint16_t), uint16_t max_finite, uint16_t inf_bits, double beyond)
      : inf_bits_(inf_bits) {
    for (uint32_t b = 0; b <= max_finite; ++b) values_.push_back(decode(static_cast<uint16_t>(b)));
    values_.push_back(beyond);
  }
  uint16_t Round(float f) const {
    const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
    const double x = std::fabs(static_cast<double>(f));
    if (x >= values_.back()) return sign | inf_bits_;
    const size_t hi = std::upper_bound(values_.begin(), values_.end(), x) - values_.begin();
    const size_t lo = hi - 1;
    if (values_[lo] == x) return sign | static_cast<uint16_t>(lo);
    const double dlo = x - values_[lo], dhi = values_[hi] - x;
    size_t pick = dlo < dhi ? lo : (dhi < dlo ? hi : (lo % 2 == 0 ? lo : hi));
    if (pick == values_.size() - 1) return sign | inf_bits_;
    return sign | static_cast<uint16_t>(pick);
  }

 private:
  std::vector<double> values_;
  uint16_t inf_bits_;
};

TEST(DTypeTest, SizesNamesAndFloating) {
  EXPECT_EQ(DTypeSize(DType::kF32), 4u);
  EXPECT_EQ(DTypeSize(DType::kF64), 8u);
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kI32), 4u);
  EXPECT_EQ(DTypeSize(DType::kI64), 8u);
  EXPECT_STREQ(DTypeName(DType::kBF16), "bf16");
  EXPECT_STREQ(DTypeName(DType::kI64), "i64");
  EXPECT_TRUE(IsFloating(DType::kF16));
  EXPECT_FALSE(IsFloating(DType::kI32));
}

TEST(DTypeTest, F16DecodeAllBitPatterns) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const uint16_t h = static_cast<uint16_t>(b);
    const double ref = F16Ref(h);
    const float got = F16ToFloat(h);
    if (std::isnan(ref)) {
      EXPECT_TRUE(std::isnan(got)) << std::hex << b;
      EXPECT_TRUE(std::isnan(F16ToFloat(FloatToF16(got)))) << std::hex << b;
      continue;
    }
    ASSERT_EQ(static_cast<double>(got), ref) << std::hex << b;
    ASSERT_EQ(std::signbit(got), (b & 0x8000) != 0) << std::hex << b;
    ASSERT_EQ(FloatToF16(got), h) << "round trip of 0x" << std::hex << b;
  }
}

TEST(DTypeTest, BF16DecodeAllBitPatterns) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const uint16_t h = static_cast<uint16_t>(b);
    const double ref = BF16Ref(h);
    const float got = BF16ToFloat(h);
    if (std::isnan(ref)) {
      EXPECT_TRUE(std::isnan(got)) << std::hex << b;
      EXPECT_TRUE(std::isnan(BF16ToFloat(FloatToBF16(got)))) << std::hex << b;
      continue;
    }
    ASSERT_EQ(static_cast<double>(got), ref) << std::hex << b;
    ASSERT_EQ(FloatToBF16(got), h) << "round trip of 0x" << std::hex << b;
  }
}

// Every halfway point between neighbouring f16 values (subnormals included) rounds to the even
// pattern; points just off the halfway round to the nearer one.
TEST(DTypeTest, F16HalfwayCasesTieToEven) {
  for (uint32_t b = 0; b < 0x7bff; ++b) {
    const double lo = F16Ref(static_cast<uint16_t>(b)), hi = F16Ref(static_cast<uint16_t>(b + 1));
    const float mid = static_cast<float>((lo + hi) / 2);  // exact: needs 12 bits of 24
    ASSERT_EQ(static_cast<double>(mid), (lo + hi) / 2);
    const uint16_t even = (b % 2 == 0) ? b : b + 1;
    ASSERT_EQ(FloatToF16(mid), even) << std::hex << b;
    ASSERT_EQ(FloatToF16(-mid), even | 0x8000) << std::hex << b;
    ASSERT_EQ(FloatToF16(std::nextafter(mid, 0.0f)), b) << std::hex << b;
    ASSERT_EQ(FloatToF16(std::nextafter(mid, 1e30f)), b + 1) << std::hex << b;
  }
}

TEST(DTypeTest, BF16HalfwayCasesTieToEven) {
  for (uint32_t b = 0; b < 0x7f7f; ++b) {
    const double lo = BF16Ref(static_cast<uint16_t>(b)), hi = BF16Ref(static_cast<uint16_t>(b + 1));
    const float mid = static_cast<float>((lo + hi) / 2);
    ASSERT_EQ(static_cast<double>(mid), (lo + hi) / 2);
    const uint16_t even = (b % 2 == 0) ? b : b + 1;
    ASSERT_EQ(FloatToBF16(mid), even) << std::hex << b;
    ASSERT_EQ(FloatToBF16(std::nextafter(mid, 0.0f)), b) << std::hex << b;
    ASSERT_EQ(FloatToBF16(std::nextafter(mid, std::numeric_limits<float>::infinity())), b + 1)
        << std::hex << b;
  }
}

TEST(DTypeTest, OverflowInfinityAndNaN) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(FloatToF16(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToF16(65519.99f), 0x7bff);
  EXPECT_EQ(FloatToF16(65520.0f), 0x7c00);  // halfway to 2^16 ties to the even pattern: inf
  EXPECT_EQ(FloatToF16(1e10f), 0x7c00);
  EXPECT_EQ(FloatToF16(-1e10f), 0xfc00);
  EXPECT_EQ(FloatToF16(inf), 0x7c00);
  EXPECT_EQ(FloatToBF16(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(FloatToBF16(-inf), 0xff80);
  // A NaN whose payload sits only in the bits that are dropped must stay NaN.
  EXPECT_TRUE(std::isnan(BF16ToFloat(FloatToBF16(Bits(0x7f800001u)))));
  EXPECT_TRUE(std::isnan(F16ToFloat(FloatToF16(Bits(0x7f800001u)))));
  EXPECT_TRUE(std::isnan(F16ToFloat(FloatToF16(-std::nanf("")))));
  // Below half the smallest f16 subnormal (2^-25) flushes to signed zero; just above rounds up.
  EXPECT_EQ(FloatToF16(std::ldexp(1.0f, -25)), 0x0000);
  EXPECT_EQ(FloatToF16(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  EXPECT_EQ(FloatToF16(-std::ldexp(1.0f, -30)), 0x8000);
}

// Random float bit patterns against the brute-force nearest-even reference.
TEST(DTypeTest, RandomFloatsMatchBruteForceRounding) {
  const RefRounder f16(F16Ref, 0x7bff, 0x7c00, 65536.0);
  const RefRounder bf16(BF16Ref, 0x7f7f, 0x7f80, std::ldexp(1.0, 128));
  std::mt19937 rng(1234);
  for (int i = 0; i < 200000; ++i) {
    uint32_t b = rng();
    if (i % 2 == 0) b = (b & 0x83ffffffu) | 0x38000000u;  // half the samples near f16's range
    const float f = Bits(b);
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToF16(f), f16.Round(f)) << std::hex << b;
    ASSERT_EQ(FloatToBF16(f), bf16.Round(f)) << std::hex << b;
  }
}

}  // namespace
}  // namespace shardmap
