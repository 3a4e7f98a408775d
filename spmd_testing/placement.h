// Where the ranks of shardmap's test helpers run: CPU threads by default; the GPU (several
// virtual ranks sharing GPU 0, each on its own stream) when the test runs with
// SHARDMAP_TEST_PLACEMENT=gpu, which the `gpu = True` variant of shardmap_cc_test sets
// (spmd_testing/defs.bzl).
//
//   #include "spmd_testing/testing.h"
//   using namespace shardmap;
//
//   TEST(Placement, WhatTheHelpersUse) {
//     ShardMapOptions o;
//     o.placement = spmd_testing::TestPlacement();   // CPU here, SharedGpu() in the gpu variant
//     EXPECT_EQ(o.placement.is_cpu(), !spmd_testing::GpuTestRequested());
//   }
//
// Under SHARDMAP_TEST_PLACEMENT=gpu without a usable GPU, every test of the binary is reported
// skipped, each with the reason ("no GPU: ..."; a gtest event listener this library installs),
// instead of failing, passing without running, or silently running on the CPU.
#ifndef SHARDMAP_SPMD_TESTING_PLACEMENT_H_
#define SHARDMAP_SPMD_TESTING_PLACEMENT_H_

#include "shardmap/context.h"

namespace shardmap::spmd_testing {

// True when SHARDMAP_TEST_PLACEMENT=gpu (the gpu variant of shardmap_cc_test).
bool GpuTestRequested();

// SharedGpu() when GpuTestRequested(), else Cpu().
DevicePlacement TestPlacement();

}  // namespace shardmap::spmd_testing

#endif  // SHARDMAP_SPMD_TESTING_PLACEMENT_H_
