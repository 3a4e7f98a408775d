// The one tensor comparison for every test in the repo: dtype and shape must match, non-finite
// values must sit in exactly the same places (NaN where NaN, +inf where +inf, -inf where -inf),
// and finite values must satisfy |got - want| <= atol + rtol * |want| elementwise.
//
//   EXPECT_TENSOR_NEAR(got, want, 1e-12);                 // f64 against an f64 reference
//   EXPECT_TRUE(TensorsNear(got, want, 1e-6, 1e-5));      // with a relative part
//   ASSERT_TENSOR_NEAR(got, want, 0);                     // exact values, -0 == +0
//   EXPECT_TENSOR_EQ(got, want);                          // same dtype, shape and bytes
//   EXPECT_TRUE(TensorsNearScaled(got, want, 1e-5));      // within 1e-5 * max|want|
//   double d = MaxAbsDiff(a, b);                          // +inf if shapes or NaN/inf differ
//
// Failures name both shapes and dtypes, how many elements are out of tolerance, and the worst
// element's multi-index with got, want and their difference. Device tensors are copied to the
// host first. Integer tensors compare exactly as 64-bit integers (no rounding through double).
#ifndef SHARDMAP_TENSOR_TESTING_COMPARE_H_
#define SHARDMAP_TENSOR_TESTING_COMPARE_H_

#include "gtest/gtest.h"
#include "tensor/tensor.h"

namespace shardmap::testing {

// Passes when dtypes and shapes are equal, the NaN/+inf/-inf patterns match exactly and every
// finite pair satisfies |got - want| <= atol + rtol * |want|. Two undefined tensors are near.
::testing::AssertionResult TensorsNear(const Tensor& got, const Tensor& want, double atol,
                                       double rtol = 0);

// TensorsNear with atol = rel * max|want| over want's finite elements: "within rel of the
// reference's scale", for results (GPU kernels, f32 training steps) whose error grows with the
// largest value rather than with each element.
::testing::AssertionResult TensorsNearScaled(const Tensor& got, const Tensor& want, double rel);

// Passes when dtypes and shapes are equal and the element bytes are identical (so NaN == NaN
// with the same payload, and -0 != +0).
::testing::AssertionResult TensorsBitwiseEqual(const Tensor& got, const Tensor& want);

// max |a - b| over all elements, comparing values (dtypes may differ, e.g. a bf16 result against
// its f32 source). Matching NaN/inf pairs count 0; a differing NaN/inf pattern or differing
// shapes (or one undefined tensor) give +inf, never 0. For messages use TensorsNear.
double MaxAbsDiff(const Tensor& a, const Tensor& b);

}  // namespace shardmap::testing

#define EXPECT_TENSOR_NEAR(got, want, atol) \
  EXPECT_TRUE(::shardmap::testing::TensorsNear((got), (want), (atol)))
#define ASSERT_TENSOR_NEAR(got, want, atol) \
  ASSERT_TRUE(::shardmap::testing::TensorsNear((got), (want), (atol)))
#define EXPECT_TENSOR_EQ(got, want) \
  EXPECT_TRUE(::shardmap::testing::TensorsBitwiseEqual((got), (want)))
#define ASSERT_TENSOR_EQ(got, want) \
  ASSERT_TRUE(::shardmap::testing::TensorsBitwiseEqual((got), (want)))

#endif  // SHARDMAP_TENSOR_TESTING_COMPARE_H_
