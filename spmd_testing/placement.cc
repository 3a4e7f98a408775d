#include "spmd_testing/placement.h"

#include <cstdlib>
#include <cstring>
#include <string>

#include "gtest/gtest.h"
#include "tensor/cuda/runtime.h"

namespace shardmap::spmd_testing {

bool GpuTestRequested() {
  const char* v = std::getenv("SHARDMAP_TEST_PLACEMENT");
  return v != nullptr && std::strcmp(v, "gpu") == 0;
}

DevicePlacement TestPlacement() {
  return GpuTestRequested() ? DevicePlacement::SharedGpu() : DevicePlacement::Cpu();
}

namespace {

// Skips each test of a gpu-variant binary when there is no GPU to run its ranks on. A listener,
// not a global Environment: a GTEST_SKIP in Environment::SetUp leaves the tests unrun but
// reported as passed ("[  PASSED  ]", result="completed" in the XML). Skipping in OnTestStart
// marks the current test skipped before its SetUp and body run (gtest checks IsSkipped() after
// constructing the fixture), so each case reports SKIPPED with the reason.
class SkipWithoutGpu : public ::testing::EmptyTestEventListener {
 public:
  void OnTestStart(const ::testing::TestInfo&) override {
    if (GpuTestRequested() && !cuda::Available()) {
      GTEST_SKIP() << "no GPU: " << cuda::UnavailableReason()
                   << " (the gpu variant, SHARDMAP_TEST_PLACEMENT=gpu, runs its ranks on a GPU)";
    }
  }
};

const bool kInstalled = [] {
  ::testing::UnitTest::GetInstance()->listeners().Append(new SkipWithoutGpu);
  return true;
}();

}  // namespace
}  // namespace shardmap::spmd_testing
