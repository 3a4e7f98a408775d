// The gpu variant's skip, checked from outside the tests it skips: this binary runs under
// SHARDMAP_TEST_PLACEMENT=gpu (as shardmap_cc_test's <name>_gpu does) and its own main inspects
// the results after RUN_ALL_TESTS. Without a GPU every case must be reported SKIPPED with a
// reason starting "no GPU:" and none of the bodies may run; with a GPU every case must run and
// pass. Before the fix, a GTEST_SKIP in a global Environment left the cases unrun but reported
// as passed.
#include <atomic>
#include <cstdio>
#include <string>

#include "gtest/gtest.h"
#include "spmd_testing/placement.h"
#include "tensor/cuda/runtime.h"

namespace {

std::atomic<int> bodies_run{0};

TEST(GpuSkip, First) {
  ++bodies_run;
  EXPECT_TRUE(shardmap::spmd_testing::GpuTestRequested());
}

TEST(GpuSkip, Second) { ++bodies_run; }

class GpuSkipFixture : public ::testing::Test {};
TEST_F(GpuSkipFixture, Third) { ++bodies_run; }

// The number of problems found, each printed.
int CheckResults() {
  const ::testing::UnitTest& unit = *::testing::UnitTest::GetInstance();
  const bool gpu = shardmap::cuda::Available();
  int problems = 0;
  auto problem = [&](const std::string& what) {
    std::fprintf(stderr, "gpu_skip_test: %s\n", what.c_str());
    ++problems;
  };
  if (!shardmap::spmd_testing::GpuTestRequested())
    problem("SHARDMAP_TEST_PLACEMENT=gpu is not set");
  if (unit.total_test_count() != 3) problem("expected 3 test cases");
  for (int s = 0; s < unit.total_test_suite_count(); ++s) {
    const ::testing::TestSuite& suite = *unit.GetTestSuite(s);
    for (int t = 0; t < suite.total_test_count(); ++t) {
      const ::testing::TestInfo& info = *suite.GetTestInfo(t);
      const ::testing::TestResult& r = *info.result();
      const std::string name = std::string(info.test_suite_name()) + "." + info.name();
      if (gpu) {
        if (r.Skipped() || !r.Passed()) problem(name + " did not run and pass on the GPU");
        continue;
      }
      if (!r.Skipped()) problem(name + " is not reported skipped without a GPU");
      if (r.total_part_count() != 1) {
        problem(name + " has no skip record");
        continue;
      }
      const std::string msg = r.GetTestPartResult(0).message();
      if (msg.rfind("no GPU: ", 0) != 0) problem(name + ": the reason is '" + msg + "'");
    }
  }
  if (!gpu && bodies_run != 0) problem("a test body ran without a GPU");
  if (!gpu && unit.skipped_test_count() != 3) problem("skipped_test_count is not 3");
  if (gpu && bodies_run != 3) problem("not every test body ran on the GPU");
  return problems;
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const int failed = RUN_ALL_TESTS();
  const int problems = CheckResults();
  if (problems == 0) std::printf("gpu_skip_test: results as expected\n");
  return failed != 0 || problems != 0 ? 1 : 0;
}
