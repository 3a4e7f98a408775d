// shardmap's testing library for users' Bazel test targets (GoogleTest). One include:
//
//   #include "shardmap/testing/testing.h"
//
//   one_device.h         ShardedMatchesOneDevice: a shard_map on each mesh of a list equals the
//                        same function on one device (outputs and gradients, per-dtype
//                        tolerances; failures name mesh, output, rank, worst element)
//   collectives.h        CollectivesAre / ExpectCollectives: the collectives of a step, forward
//                        and backward, with bytes
//   finite_difference.h  GradientsMatchFiniteDifferences: f64 central differences across ranks
//   rejection.h          RejectedWith: a program fails with a message containing given text,
//                        within a bounded wait (a hang fails the test)
//   placement.h          TestPlacement: CPU ranks, or GPU ranks in shardmap_cc_test's gpu variant
//   tensor/testing/compare.h  (re-exported) TensorsNear, TensorsBitwiseEqual, MaxAbsDiff,
//                        EXPECT_TENSOR_NEAR / ASSERT_TENSOR_NEAR / EXPECT_TENSOR_EQ: whole-tensor
//                        comparisons with exact NaN/inf semantics
//
// Build rule (shardmap/testing/defs.bzl):
//
//   load("@shardmap//shardmap/testing:defs.bzl", "shardmap_cc_test")
//   shardmap_cc_test(name = "my_layer_test", srcs = ["my_layer_test.cc"], deps = [":my_layer"],
//                    gpu = True)   # adds my_layer_test_gpu (tags = ["gpu"])
//
// A complete user workspace with a layer and its test: examples/external_user/.
#ifndef SHARDMAP_SHARDMAP_TESTING_TESTING_H_
#define SHARDMAP_SHARDMAP_TESTING_TESTING_H_

#include "shardmap/testing/collectives.h"
#include "shardmap/testing/finite_difference.h"
#include "shardmap/testing/one_device.h"
#include "shardmap/testing/placement.h"
#include "shardmap/testing/rejection.h"
#include "tensor/testing/compare.h"

#endif  // SHARDMAP_SHARDMAP_TESTING_TESTING_H_
