// Small helpers for the shardmap tests: deterministic random tensors and comparisons.
#ifndef SHARDMAP_TESTS_TEST_UTIL_H_
#define SHARDMAP_TESTS_TEST_UTIL_H_

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tensor/tensor.h"

namespace shardmap::testing {

// Uniform in [-1, 1), from a fixed-seed LCG (independent of tensor/random).
inline Tensor Rand(std::vector<int64_t> shape, uint64_t seed, DType dtype = DType::kF64) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  std::vector<double> v(n);
  uint64_t x = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (int64_t i = 0; i < n; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    v[i] = static_cast<double>((x >> 11) & ((1ull << 53) - 1)) / static_cast<double>(1ull << 53);
    v[i] = 2 * v[i] - 1;
  }
  Tensor t = Tensor::FromVector<double>(absl::Span<const int64_t>(shape), v);
  if (dtype == DType::kF64) return t;
  std::vector<float> f(v.begin(), v.end());
  return Tensor::FromVector<float>(absl::Span<const int64_t>(shape), f);
}

inline double MaxAbsDiff(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) return INFINITY;
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) m = std::max(m, std::fabs(a.at(i) - b.at(i)));
  return m;
}

inline bool BitwiseEqual(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  for (int64_t i = 0; i < a.numel(); ++i) {
    if (a.at(i) != b.at(i)) return false;
  }
  return true;
}

#define EXPECT_TENSOR_NEAR(a, b, tol)                                                     \
  EXPECT_LE(::shardmap::testing::MaxAbsDiff((a), (b)), (tol))                             \
      << "shapes " << (a).ShapeString() << " vs " << (b).ShapeString()

}  // namespace shardmap::testing

#endif  // SHARDMAP_TESTS_TEST_UTIL_H_
