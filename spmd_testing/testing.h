// shardmap's testing library for users' Bazel test targets (GoogleTest): target
// @shardmap//spmd_testing (testonly), namespace shardmap::spmd_testing (not `testing`, which
// would be ambiguous with GoogleTest's after `using namespace shardmap;`). One include:
//
//   #include "spmd_testing/testing.h"
//   #include "shardmap/collective_ops.h"
//   #include "shardmap/ops.h"
//   #include "tensor/random.h"
//   using namespace shardmap;
//
//   TEST(Doc, TestingAtAGlance) {
//     ShardFn fn = [](const std::vector<Value>& in) -> std::vector<Value> {
//       Value y = all_reduce(in[0].matmul(in[1]), "tp");   // x S1, w S0: a pending sum, reduced
//       return {sum(y * y, {}), y};
//     };
//     auto make = [&](const Mesh& m) {
//       return shard_map(fn, m, {P(None, "tp"), P("tp")}, {P(), P()});
//     };
//     std::vector<Tensor> in = {RandomNormal({4, 6}, 1, 0, 1, DType::kF64),
//                               RandomNormal({6, 3}, 2, 0, 1, DType::kF64)};
//     EXPECT_TRUE(spmd_testing::ShardedMatchesOneDevice(make, {{{"tp", 2}}, {{"tp", 3}}}, in));
//     EXPECT_TRUE(spmd_testing::TensorsNear(in[1], in[1].Clone(), 0));   // re-exported
//   }
//
// What each header holds. one_device.h: ShardedMatchesOneDevice, a shard_map on each mesh of a
// list equals the same function on one device (outputs and gradients, per-dtype tolerances;
// failures name mesh, output, rank, worst element). collectives.h: CollectivesAre /
// ExpectCollectives, the collectives of a step, forward and backward, with bytes.
// finite_difference.h: GradientsMatchFiniteDifferences, f64 central differences across ranks.
// rejection.h: RejectedWith, a program fails with a message containing given text, within a
// bounded wait (a hang fails the test). placement.h: TestPlacement, CPU ranks, or GPU ranks in
// shardmap_cc_test's gpu variant. tensor/testing/compare.h, re-exported here as
// spmd_testing::TensorsNear, ...: TensorsNear, TensorsNearScaled, TensorsBitwiseEqual,
// MaxAbsDiff and EXPECT_TENSOR_NEAR / ASSERT_TENSOR_NEAR / EXPECT_TENSOR_EQ, whole-tensor
// comparisons with exact NaN/inf semantics.
//
// Build rule (spmd_testing/defs.bzl), which adds this library, the shardmap libraries a test of
// per-device code uses and GoogleTest's main:
//
//   load("@shardmap//spmd_testing:defs.bzl", "shardmap_cc_test")
//   shardmap_cc_test(name = "my_layer_test", srcs = ["my_layer_test.cc"], deps = [":my_layer"],
//                    gpu = True)   # adds my_layer_test_gpu (tags = ["gpu"])
//
// The examples in these headers are compiled and run by //spmd_testing:header_examples_test. A
// complete user workspace with a layer and its test: examples/external_user/.
#ifndef SHARDMAP_SPMD_TESTING_TESTING_H_
#define SHARDMAP_SPMD_TESTING_TESTING_H_

#include "spmd_testing/collectives.h"
#include "spmd_testing/finite_difference.h"
#include "spmd_testing/one_device.h"
#include "spmd_testing/placement.h"
#include "spmd_testing/rejection.h"
#include "tensor/testing/compare.h"

namespace shardmap::spmd_testing {

// The tensor comparisons, under this library's name.
using ::shardmap::testing::MaxAbsDiff;
using ::shardmap::testing::TensorsBitwiseEqual;
using ::shardmap::testing::TensorsNear;
using ::shardmap::testing::TensorsNearScaled;

}  // namespace shardmap::spmd_testing

#endif  // SHARDMAP_SPMD_TESTING_TESTING_H_
