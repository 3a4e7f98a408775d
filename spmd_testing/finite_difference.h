// Gradients of a shard_map against central finite differences of its own forward pass, in f64,
// across ranks: value_and_grad(f) runs the sharded backward on every rank; each probed element
// of each global input is nudged by +-eps and the sharded forward run again.
//
//   #include "spmd_testing/testing.h"
//   #include "shardmap/collective_ops.h"
//   #include "shardmap/ops.h"
//   #include "tensor/random.h"
//   using namespace shardmap;
//
//   TEST(Mlp, GradientsMatchFiniteDifferences) {
//     ShardFn mlp = [](const std::vector<Value>& in) -> std::vector<Value> {
//       Value y = all_reduce(gelu(in[0].matmul(in[1])).matmul(in[2]), "tp");  // x S0 on dp
//       return {all_reduce(sum_partial(y * y, {}), "dp")};                  // output 0: the loss
//     };
//     ShardMap f = shard_map(mlp, *Mesh::Create({{"dp", 2}, {"tp", 3}}),
//                            {P("dp"), P(None, "tp"), P("tp", None)}, {P()});
//     std::vector<Tensor> in = {RandomNormal({4, 5}, 1, 0, 1, DType::kF64),
//                               RandomNormal({5, 6}, 2, 0, 1, DType::kF64),
//                               RandomNormal({6, 5}, 3, 0, 1, DType::kF64)};
//     EXPECT_TRUE(spmd_testing::GradientsMatchFiniteDifferences(f, in));
//   }
//
// Up to options.max_probes elements per input are probed (evenly spread, first and last
// included), so the cost is 2 * max_probes forward runs per input. A failure names the mesh,
// the input, the element and the rank holding it, both derivatives and the tolerance. Inputs
// must be f64 (non-floating inputs are skipped); other dtypes are an error saying so.
#ifndef SHARDMAP_SPMD_TESTING_FINITE_DIFFERENCE_H_
#define SHARDMAP_SPMD_TESTING_FINITE_DIFFERENCE_H_

#include <optional>
#include <vector>

#include "gtest/gtest.h"
#include "shardmap/shard_map.h"
#include "spmd_testing/one_device.h"
#include "tensor/tensor.h"

namespace shardmap::spmd_testing {

struct FiniteDifferenceOptions {
  double eps = 1e-6;
  // |grad - fd| <= atol + rtol * |fd|: central differences in f64 are good to about eps^2 plus
  // rounding (|loss| * 1e-16 / eps); raise atol for large losses.
  Tolerance tolerance{1e-6, 1e-6};
  int max_probes = 16;  // elements probed per input
  // Where the ranks run; unset: TestPlacement().
  std::optional<DevicePlacement> placement;
};

::testing::AssertionResult GradientsMatchFiniteDifferences(
    const ShardMap& f, const std::vector<Tensor>& inputs,
    const FiniteDifferenceOptions& options = {});

}  // namespace shardmap::spmd_testing

#endif  // SHARDMAP_SPMD_TESTING_FINITE_DIFFERENCE_H_
