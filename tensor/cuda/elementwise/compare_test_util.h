// Test helpers for the CUDA kernels: run an op on the GPU and on the CPU on the same inputs and
// compare element by element, within a tolerance counted in units of the dtype's epsilon.
//
//   Tensor a = RandomTensor({7, 13}, DType::kBF16, 1);
//   ExpectMatchesCpu(Host(Add(Dev(a), Dev(b))), Add(a, b), kExact, "add bf16");
#ifndef SHARDMAP_TENSOR_CUDA_ELEMENTWISE_COMPARE_TEST_UTIL_H_
#define SHARDMAP_TENSOR_CUDA_ELEMENTWISE_COMPARE_TEST_UTIL_H_

#include <cmath>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tensor/cuda/runtime.h"
#include "tensor/tensor.h"
#include "tensor/testing/test_util.h"

namespace shardmap::testing {

inline Tensor Dev(const Tensor& t) { return t.To(Device::Cuda(0)); }
inline Tensor Host(const Tensor& t) { return t.To(Device::Cpu()); }

// |got - want| <= eps(dtype) * (rel * |want| + abs); NaN matches NaN, infinities match exactly.
struct Tol {
  double rel;
  double abs;
};
constexpr Tol kExact{0, 0};
constexpr Tol kUlp{1, 0};          // correctly rounded arithmetic
constexpr Tol kTranscendental{8, 8};  // CUDA's libm vs glibc: a few ulps, abs for cancellation

inline double Epsilon(DType t) {
  switch (t) {
    case DType::kF32: return 0x1p-23;
    case DType::kF64: return 0x1p-52;
    case DType::kBF16: return 0x1p-7;
    case DType::kF16: return 0x1p-10;
    default: return 0;
  }
}

inline void ExpectMatchesCpu(const Tensor& got, const Tensor& want, Tol tol,
                             const std::string& what) {
  ASSERT_TRUE(got.defined()) << what;
  EXPECT_FALSE(got.is_cuda()) << what << ": copy the result back first";
  ASSERT_EQ(got.ShapeString(), want.ShapeString()) << what;
  const std::vector<double> g = got.ToVector<double>(), w = want.ToVector<double>();
  // Half types: the f32 results may differ by a few f32 ulps and then round to neighbouring
  // half values, so allow one half ulp whenever any tolerance is allowed.
  const bool half = want.dtype() == DType::kBF16 || want.dtype() == DType::kF16;
  const double rel = half && tol.rel > 0 ? 1 : tol.rel, abs = half && tol.abs > 0 ? 1 : tol.abs;
  const double eps = Epsilon(want.dtype());
  int64_t bad = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    const bool ok = std::isnan(w[i])   ? std::isnan(g[i])
                    : std::isinf(w[i]) ? g[i] == w[i]
                                       : std::fabs(g[i] - w[i]) <=
                                             eps * (rel * std::fabs(w[i]) + abs);
    if (!ok && ++bad <= 5) {
      ADD_FAILURE() << what << ": at flat index " << i << " of " << want.ShapeString() << " got "
                    << g[i] << ", CPU has " << w[i];
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << w.size() << " elements differ";
}

}  // namespace shardmap::testing

#endif  // SHARDMAP_TENSOR_CUDA_ELEMENTWISE_COMPARE_TEST_UTIL_H_
