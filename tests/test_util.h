// Small helpers for the shardmap tests: deterministic random tensors, plus the repo's one tensor
// comparison (tensor/testing/compare.h).
#ifndef SHARDMAP_TESTS_TEST_UTIL_H_
#define SHARDMAP_TESTS_TEST_UTIL_H_

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tensor/tensor.h"
#include "tensor/testing/compare.h"  // TensorsNear, EXPECT_TENSOR_NEAR, ...

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

}  // namespace shardmap::testing

#endif  // SHARDMAP_TESTS_TEST_UTIL_H_
