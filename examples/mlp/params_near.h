// MlpParams compared tensor by tensor through the repo's one comparison (tensor/testing/compare.h):
// NaN/inf patterns, shapes and dtypes must match; the message names the weight.
//
//   EXPECT_TRUE(ParamsNear(sharded.grads, reference.grads, 1e-10));
//   EXPECT_TRUE(ParamsNear(p, before, 0));   // unchanged (values, -0 == +0)
#ifndef SHARDMAP_EXAMPLES_MLP_PARAMS_NEAR_H_
#define SHARDMAP_EXAMPLES_MLP_PARAMS_NEAR_H_

#include "gtest/gtest.h"
#include "examples/mlp/parallel_mlp.h"
#include "tensor/testing/compare.h"

namespace shardmap::testing {

inline ::testing::AssertionResult ParamsNear(const MlpParams& got, const MlpParams& want,
                                             double atol, double rtol = 0) {
  const std::pair<const char*, const Tensor MlpParams::*> fields[] = {
      {"w1", &MlpParams::w1}, {"b1", &MlpParams::b1}, {"w2", &MlpParams::w2},
      {"b2", &MlpParams::b2}};
  for (const auto& [name, field] : fields) {
    ::testing::AssertionResult r = TensorsNear(got.*field, want.*field, atol, rtol);
    if (!r) return r << " (in " << name << ")";
  }
  return ::testing::AssertionSuccess();
}

}  // namespace shardmap::testing

#endif  // SHARDMAP_EXAMPLES_MLP_PARAMS_NEAR_H_
