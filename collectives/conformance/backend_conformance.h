// The backend conformance suite: the same cases, run against every registered backend (its
// Backend::run_world), checking what collectives/communicator.h promises. Every collective and
// dtype against the naive references of collectives/reference_reduce.h, world sizes 1, 2, 3, 5
// and odd counts; Split; PpermuteStart handles; a failing rank failing its peers (no hang); a
// silent rank timing out its peers; ranks that disagree on op, count, dtype or reduce op failing
// with InvalidArgument on every rank; bad arguments refused. A case that does not apply to a
// backend is skipped with its reason (GTEST_SKIP), never passed silently.
//
// A backend's test instantiates it (one small file, see docs/design.md "Adding a backend"):
//
//   INSTANTIATE_TEST_SUITE_P(Gloo, BackendConformanceTest,
//                            ::testing::Values(ConformanceTarget{.backend = "gloo"}),
//                            ConformanceTargetName);
#ifndef SHARDMAP_COLLECTIVES_CONFORMANCE_BACKEND_CONFORMANCE_H_
#define SHARDMAP_COLLECTIVES_CONFORMANCE_BACKEND_CONFORMANCE_H_

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace shardmap::collectives::conformance {

// Buffers in GPU memory, for backends whose memory_space().device is set (NCCL): the suite
// fills and reads host copies and moves them with these. Host backends leave it empty.
struct DeviceMemory {
  std::function<void*(int device, size_t bytes)> alloc;  // nullptr on failure
  std::function<void(int device, void* p)> free;
  // Blocking copies (the data has landed when they return).
  std::function<void(int device, void* dst, const void* src, size_t bytes)> to_device;
  std::function<void(int device, void* dst, const void* src, size_t bytes)> to_host;
};

struct ConformanceTarget {
  std::string backend;  // a registered name (collectives/backend_registry.h)
  std::vector<int> world_sizes = {1, 2, 3, 5};
  // Reductions give the bits of the rank-order reference (in-process, Gloo); else compared
  // within a tolerance per dtype (NCCL's ring and tree orders).
  bool bitwise_reductions = true;
  // A failing rank's own code and message reach its peers (in-process, NCCL through the
  // store); else the peers only name the rank they lost (Gloo: a closed connection).
  bool peers_get_failed_status = true;
  DeviceMemory device;  // set for GPU-memory backends
};

std::string ConformanceTargetName(const ::testing::TestParamInfo<ConformanceTarget>& info);

class BackendConformanceTest : public ::testing::TestWithParam<ConformanceTarget> {};

}  // namespace shardmap::collectives::conformance

#endif  // SHARDMAP_COLLECTIVES_CONFORMANCE_BACKEND_CONFORMANCE_H_
