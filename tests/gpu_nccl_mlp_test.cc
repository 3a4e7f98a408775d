// One GPU per process with NCCL: runs tests/gpu_nccl_mlp_check on every visible GPU (up to 4)
// through collectives/launch. Skips with fewer than two GPUs.
#include <sys/wait.h>

#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensor/cuda/runtime.h"

namespace {

// Runs the check on n processes; returns its output, expects exit 0.
std::string Launch(int n, const std::string& args) {
  const std::string cmd = absl::StrCat("collectives/launch --nproc_per_node=", n,
                                       " -- tests/gpu_nccl_mlp_check ", args, " 2>&1");
  FILE* f = ::popen(cmd.c_str(), "r");
  if (f == nullptr) return "popen failed";
  std::string out;
  char buf[4096];
  size_t k;
  while ((k = std::fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, k);
  const int status = ::pclose(f);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << out;
  return out;
}

TEST(GpuNcclMlpTest, MegatronMlpOneGpuPerProcessMatchesCpu) {
  const int gpus = shardmap::cuda::DeviceCount();
  if (gpus < 2) GTEST_SKIP() << "needs at least 2 GPUs, found " << gpus;
  const int n = gpus < 4 ? gpus : 4;
  const std::string out = Launch(n, "");
  for (int r = 0; r < n; ++r) {
    EXPECT_THAT(out, ::testing::HasSubstr(absl::StrCat("gpu_nccl_mlp_check ok: rank ", r, " of ",
                                                       n)));
  }
}

TEST(GpuNcclMlpTest, CapturedStepWithNcclAllReducesEqualsEager) {
  const int gpus = shardmap::cuda::DeviceCount();
  if (gpus < 2) GTEST_SKIP() << "needs at least 2 GPUs, found " << gpus;
  const int n = gpus < 4 ? gpus : 4;
  const std::string out = Launch(n, "--graph");
  for (int r = 0; r < n; ++r) {
    EXPECT_THAT(out, ::testing::HasSubstr(absl::StrCat("gpu_nccl_mlp_check graph ok: rank ", r,
                                                       " of ", n)));
  }
}

}  // namespace
