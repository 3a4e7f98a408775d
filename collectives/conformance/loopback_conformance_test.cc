// The "Adding a backend" recipe of docs/design.md, followed for a toy: the loopback backend
// (loopback_communicator.h) registered here, the conformance suite instantiated on it, and the
// path train_gpt takes (ConnectTrainingWorld) connecting it as a launched process would.
// SHARDMAP_LOOPBACK_FAULT=<fault> registers it with that fault (loopback_faults_test.sh).
#include <cstdlib>
#include <memory>
#include <string>

#include "collectives/backend_registry.h"
#include "collectives/conformance/backend_conformance.h"
#include "collectives/conformance/loopback_communicator.h"
#include "collectives/internal/free_port.h"
#include "gmock/gmock.h"

namespace shardmap::collectives::conformance {
namespace {

const bool kRegistered = [] {
  const char* env = std::getenv("SHARDMAP_LOOPBACK_FAULT");
  absl::StatusOr<LoopbackFault> fault = ParseLoopbackFault(env == nullptr ? "none" : env);
  if (!fault.ok()) {
    fprintf(stderr, "SHARDMAP_LOOPBACK_FAULT: %s\n", std::string(fault.status().message()).c_str());
    std::abort();
  }
  absl::Status s = RegisterBackend(LoopbackBackend(*fault));
  if (!s.ok()) {
    fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    std::abort();
  }
  return true;
}();

INSTANTIATE_TEST_SUITE_P(Backend, BackendConformanceTest,
                         ::testing::Values(ConformanceTarget{.backend = "loopback",
                                                             .peers_get_failed_status = false}),
                         ConformanceTargetName);

TEST(LoopbackBackendTest, TrainGptsPathConnectsItAsALaunchedProcess) {
  ASSERT_TRUE(kRegistered);
  EXPECT_THAT(BackendFlagHelp(), ::testing::HasSubstr("loopback (a toy"));
  absl::StatusOr<int> port = internal::PickFreePort();
  ASSERT_TRUE(port.ok()) << port.status();
  // What collectives/launch --nproc_per_node=1 sets.
  setenv("RANK", "0", 1);
  setenv("WORLD_SIZE", "1", 1);
  setenv("LOCAL_RANK", "0", 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", std::to_string(*port).c_str(), 1);
  absl::StatusOr<std::unique_ptr<Communicator>> w = ConnectTrainingWorld("loopback", 1, false);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_NE(*w, nullptr);
  EXPECT_THAT((*w)->name(), ::testing::StartsWith("loopback over "));
  double x = 1.5;
  EXPECT_TRUE((*w)->AllReduce(&x, &x, 1, DataType::kF64, ReduceOp::kSum).ok());
  EXPECT_EQ(x, 1.5);
  EXPECT_EQ(ConnectTrainingWorld("loopback", 1, /*device_cuda=*/true).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shardmap::collectives::conformance
