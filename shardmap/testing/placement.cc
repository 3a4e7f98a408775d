#include "shardmap/testing/placement.h"

#include <cstdlib>
#include <cstring>
#include <string>

#include "gtest/gtest.h"
#include "tensor/cuda/runtime.h"

namespace shardmap::testing {

bool GpuTestRequested() {
  const char* v = std::getenv("SHARDMAP_TEST_PLACEMENT");
  return v != nullptr && std::strcmp(v, "gpu") == 0;
}

DevicePlacement TestPlacement() {
  return GpuTestRequested() ? DevicePlacement::SharedGpu() : DevicePlacement::Cpu();
}

namespace {

// Skips every test of a gpu-variant binary when there is no GPU to run its ranks on.
class SkipWithoutGpu : public ::testing::Environment {
 public:
  void SetUp() override {
    if (GpuTestRequested() && !cuda::Available()) {
      GTEST_SKIP() << "SHARDMAP_TEST_PLACEMENT=gpu but no GPU: " << cuda::UnavailableReason();
    }
  }
};

const bool kInstalled = [] {
  ::testing::AddGlobalTestEnvironment(new SkipWithoutGpu);
  return true;
}();

}  // namespace
}  // namespace shardmap::testing
