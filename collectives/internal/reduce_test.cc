#include "collectives/internal/reduce.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "collectives/internal/half.h"
#include "gtest/gtest.h"

namespace shardmap::collectives::internal {
namespace {

// Independent bf16 rounding: pick the nearer of the two bf16 neighbours in double precision.
uint16_t RefF32ToBF16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t lo = static_cast<uint16_t>(x >> 16);
  if ((x & 0xffff) == 0) return lo;
  const uint16_t hi = lo + 1;
  const double dlo = std::fabs(static_cast<double>(BF16ToF32(lo)) - f);
  const double dhi = std::isinf(BF16ToF32(hi)) ? std::fabs(std::copysign(std::ldexp(1.0, 128), f) - f)
                                               : std::fabs(static_cast<double>(BF16ToF32(hi)) - f);
  if (dlo < dhi) return lo;
  if (dhi < dlo) return hi;
  return (lo & 1) ? hi : lo;
}

TEST(HalfTest, F16RoundTripsEveryValue) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = F16ToF32(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(F16ToF32(F32ToF16(f)))) << h;
      continue;
    }
    EXPECT_EQ(F32ToF16(f), h) << h;
    // Independent check against the compiler's _Float16.
    EXPECT_EQ(static_cast<float>(std::bit_cast<_Float16>(static_cast<uint16_t>(h))), f) << h;
  }
}

TEST(HalfTest, F16RoundingMatchesCompiler) {
  // Sweep f32 bit patterns with a stride that hits ties, subnormals, overflow and both signs.
  for (uint64_t x = 0; x < 0x100000000ull; x += 40009) {
    const float f = std::bit_cast<float>(static_cast<uint32_t>(x));
    if (std::isnan(f)) continue;
    const _Float16 ref = static_cast<_Float16>(f);
    EXPECT_EQ(F32ToF16(f), std::bit_cast<uint16_t>(ref)) << std::hex << x;
  }
  // Exact ties: halfway between 1 and the next f16 (1 + 2^-11) rounds to even (1).
  EXPECT_EQ(F32ToF16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  EXPECT_EQ(F32ToF16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  EXPECT_EQ(F32ToF16(65520.0f), 0x7c00);
  EXPECT_EQ(F32ToF16(65519.0f), 0x7bff);
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -25)), 0x0000);  // tie to even zero
  EXPECT_EQ(F32ToF16(std::ldexp(1.5f, -25)), 0x0001);
}

TEST(HalfTest, BF16RoundingMatchesReference) {
  for (uint64_t x = 0; x < 0x100000000ull; x += 30011) {
    const float f = std::bit_cast<float>(static_cast<uint32_t>(x));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(BF16ToF32(F32ToBF16(f))));
      continue;
    }
    EXPECT_EQ(F32ToBF16(f), RefF32ToBF16(f)) << std::hex << x;
  }
  EXPECT_EQ(F32ToBF16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);      // tie -> even
  EXPECT_EQ(F32ToBF16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);  // tie -> even
  EXPECT_EQ(BF16ToF32(0x3fc0), 1.5f);
}

template <typename T>
std::vector<T> Values(int r, size_t count, bool near_one) {
  std::vector<T> v(count);
  for (size_t i = 0; i < count; ++i) {
    const int k = static_cast<int>((r * 131 + i * 7) % 97) - 48;
    if constexpr (std::is_integral_v<T>) {
      v[i] = static_cast<T>(near_one ? (k % 3) + 1 : k * 1000003);
    } else {
      v[i] = static_cast<T>(near_one ? 1.0 + k / 512.0 : k / 8.0 + r * 1e-3);
    }
  }
  return v;
}

template <typename T>
void CheckPlain(DataType dtype) {
  for (int n : {1, 2, 3, 7}) {
    for (size_t count : {size_t{1}, size_t{5}, size_t{1023}, size_t{1025}, size_t{3000}}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMax, ReduceOp::kMin,
                          ReduceOp::kAvg}) {
        std::vector<std::vector<T>> in;
        std::vector<const void*> srcs;
        for (int r = 0; r < n; ++r) in.push_back(Values<T>(r, count, op == ReduceOp::kProd));
        for (auto& v : in) srcs.push_back(v.data());
        std::vector<T> out(count);
        ReduceBuffers(out.data(), srcs.data(), n, count, dtype, op);
        for (size_t i = 0; i < count; ++i) {
          T acc = in[0][i];
          for (int r = 1; r < n; ++r) {
            const T v = in[r][i];
            switch (op) {
              case ReduceOp::kSum:
              case ReduceOp::kAvg: acc = acc + v; break;
              case ReduceOp::kProd: acc = acc * v; break;
              case ReduceOp::kMax: acc = v > acc ? v : acc; break;
              case ReduceOp::kMin: acc = v < acc ? v : acc; break;
            }
          }
          if (op == ReduceOp::kAvg) acc = acc / static_cast<T>(n);
          ASSERT_EQ(std::memcmp(&acc, &out[i], sizeof(T)), 0)
              << "n=" << n << " count=" << count << " op=" << ReduceOpName(op) << " i=" << i;
        }
      }
    }
  }
}

TEST(ReduceTest, F32) { CheckPlain<float>(DataType::kF32); }
TEST(ReduceTest, F64) { CheckPlain<double>(DataType::kF64); }
TEST(ReduceTest, I32) { CheckPlain<int32_t>(DataType::kI32); }
TEST(ReduceTest, I64) { CheckPlain<int64_t>(DataType::kI64); }

TEST(ReduceTest, Bf16AndF16AccumulateInF32AndRoundOnce) {
  // 1 + 4 * 2^-9: each addend alone is lost in bf16 (8 bits), their f32 sum is not.
  const int n = 5;
  for (DataType dt : {DataType::kBF16, DataType::kF16}) {
    auto to = [&](float f) { return dt == DataType::kBF16 ? F32ToBF16(f) : F32ToF16(f); };
    auto from = [&](uint16_t h) { return dt == DataType::kBF16 ? BF16ToF32(h) : F16ToF32(h); };
    const float tiny = dt == DataType::kBF16 ? std::ldexp(1.0f, -9) : std::ldexp(1.0f, -12);
    std::vector<std::vector<uint16_t>> in(n, std::vector<uint16_t>(3));
    for (int r = 0; r < n; ++r) {
      in[r] = {to(r == 0 ? 1.0f : tiny), to(r + 0.5f), to(-r * 1.25f)};
    }
    std::vector<const void*> srcs;
    for (auto& v : in) srcs.push_back(v.data());
    std::vector<uint16_t> out(3);
    ReduceBuffers(out.data(), srcs.data(), n, 3, dt, ReduceOp::kSum);
    for (int i = 0; i < 3; ++i) {
      float acc = 0;
      for (int r = 0; r < n; ++r) acc += from(in[r][i]);
      EXPECT_EQ(out[i], to(acc)) << DataTypeName(dt) << " i=" << i;
    }
    EXPECT_EQ(from(out[0]), 1.0f + 4 * tiny);  // rounded once, not after every add
    ReduceBuffers(out.data(), srcs.data(), n, 3, dt, ReduceOp::kAvg);
    EXPECT_EQ(from(out[1]), (0.5f + 1.5f + 2.5f + 3.5f + 4.5f) / 5);
    ReduceBuffers(out.data(), srcs.data(), n, 3, dt, ReduceOp::kMin);
    EXPECT_EQ(from(out[2]), -5.0f);
  }
}

TEST(ReduceTest, IntegerSumWrapsInsteadOfOverflowUB) {
  const int32_t a[1] = {std::numeric_limits<int32_t>::max()}, b[1] = {1};
  const void* srcs[2] = {a, b};
  int32_t out[1];
  ReduceBuffers(out, srcs, 2, 1, DataType::kI32, ReduceOp::kSum);
  EXPECT_EQ(out[0], std::numeric_limits<int32_t>::min());
}

TEST(ReduceTest, InPlaceOnFirstSource) {
  std::vector<float> a = {1, 2, 3}, b = {10, 20, 30};
  const void* srcs[2] = {a.data(), b.data()};
  ReduceBuffers(a.data(), srcs, 2, 3, DataType::kF32, ReduceOp::kSum);
  EXPECT_EQ(a, (std::vector<float>{11, 22, 33}));
}

}  // namespace
}  // namespace shardmap::collectives::internal
