// NCCL across processes, one per GPU, through the real launcher and TCP rendezvous. Skips with
// fewer than two GPUs (NCCL before 2.30 refuses two ranks on one GPU).
#include <sys/wait.h>

#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "collectives/internal/gpu_count.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace {

using ::testing::HasSubstr;

// Runs `launch --nproc_per_node=n -- program args` and returns its output; *status: pclose's.
std::string Launch(int n, const std::string& program_and_args, int* status) {
  const std::string cmd = absl::StrCat("collectives/launch --nproc_per_node=", n, " -- ",
                                       program_and_args, " 2>&1");
  FILE* f = ::popen(cmd.c_str(), "r");
  if (f == nullptr) {
    *status = -1;
    return "popen failed";
  }
  std::string out;
  char buf[4096];
  size_t k;
  while ((k = std::fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, k);
  *status = ::pclose(f);
  return out;
}

// The line nccl_failure_check printed for `rank` (empty when none).
std::string StatusLine(const std::string& out, int rank, int n) {
  const std::string tag = absl::StrCat("nccl_failure_check rank ", rank, " of ", n, ": ");
  const size_t at = out.find(tag);
  if (at == std::string::npos) return "";
  const size_t end = out.find('\n', at);
  return out.substr(at + tag.size(), end == std::string::npos ? std::string::npos : end - at - tag.size());
}

int FailureWorld(int gpus) { return gpus < 3 ? gpus : 3; }

TEST(NcclMultiprocessFailureTest, MismatchedCallsAreInvalidArgumentOnEveryRankNamingBoth) {
  const int gpus = shardmap::collectives::internal::VisibleGpuCount();
  if (gpus < 2) GTEST_SKIP() << "needs at least 2 GPUs (one NCCL rank per GPU), found " << gpus;
  const int n = FailureWorld(gpus);
  int status = 0;
  const std::string out = Launch(
      n, absl::StrCat("collectives/nccl_failure_check --mode=mismatch --timeout_s=5 --fail_rank=",
                      n - 1), &status);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << out;
  for (int r = 0; r < n; ++r) {
    const std::string line = StatusLine(out, r, n);
    EXPECT_THAT(line, HasSubstr("INVALID_ARGUMENT")) << "rank " << r << "\n" << out;
    EXPECT_THAT(line, HasSubstr("mismatched collectives")) << "rank " << r << "\n" << out;
    // Both calls named: the all-reduces of 4 and 5 elements (#2), or, where NCCL let a rank
    // through the mismatched call, the barrier (#3) it got stuck in next.
    EXPECT_THAT(line, ::testing::ContainsRegex("rank [0-9] called [A-Za-z]+\\(.*\\) #[23] but rank "
                                               "[0-9] called [A-Za-z]+\\(.*\\) #[23]"))
        << "rank " << r << "\n" << out;
  }
}

TEST(NcclMultiprocessFailureTest, ABadArgumentOnOneRankReachesItsPeersWithItsCode) {
  const int gpus = shardmap::collectives::internal::VisibleGpuCount();
  if (gpus < 2) GTEST_SKIP() << "needs at least 2 GPUs (one NCCL rank per GPU), found " << gpus;
  const int n = FailureWorld(gpus);
  int status = 0;
  const std::string out =
      Launch(n, "collectives/nccl_failure_check --mode=bad_root --timeout_s=60 --fail_rank=1",
             &status);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << out;
  for (int r = 0; r < n; ++r) {
    const std::string line = StatusLine(out, r, n);
    EXPECT_THAT(line, HasSubstr("INVALID_ARGUMENT")) << "rank " << r << "\n" << out;
    EXPECT_THAT(line, HasSubstr("is not a rank of this group")) << "rank " << r << "\n" << out;
    // Long before the 60 s timeout: the peers saw the publication while they waited.
    EXPECT_THAT(line, ::testing::Not(HasSubstr("timed out"))) << "rank " << r << "\n" << out;
    if (r != 1) {
      EXPECT_THAT(line, HasSubstr("rank 1 failed: ")) << "rank " << r << "\n" << out;
    }
  }
}

TEST(NcclMultiprocessFailureTest, ARankThatAbortsItsWorldGivesItsPeersItsStatus) {
  const int gpus = shardmap::collectives::internal::VisibleGpuCount();
  if (gpus < 2) GTEST_SKIP() << "needs at least 2 GPUs (one NCCL rank per GPU), found " << gpus;
  const int n = FailureWorld(gpus);
  int status = 0;
  const std::string out =
      Launch(n, "collectives/nccl_failure_check --mode=abort --timeout_s=60 --fail_rank=0",
             &status);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << out;
  for (int r = 0; r < n; ++r) {
    const std::string line = StatusLine(out, r, n);
    EXPECT_THAT(line, HasSubstr("FAILED_PRECONDITION")) << "rank " << r << "\n" << out;
    EXPECT_THAT(line, HasSubstr("step 3 of rank 0 threw: loss is NaN"))
        << "rank " << r << "\n" << out;
    if (r != 0) {
      EXPECT_THAT(line, HasSubstr("rank 0 failed: ")) << "rank " << r << "\n" << out;
    }
  }
}

TEST(NcclMultiprocessTest, EveryOpAcrossProcesses) {
  const int gpus = shardmap::collectives::internal::VisibleGpuCount();
  if (gpus < 2) GTEST_SKIP() << "needs at least 2 GPUs, found " << gpus;
  const int n = gpus < 4 ? gpus : 4;
  const std::string cmd = absl::StrCat("collectives/launch --nproc_per_node=", n,
                                       " -- collectives/nccl_check 2>&1");
  FILE* f = ::popen(cmd.c_str(), "r");
  ASSERT_NE(f, nullptr);
  std::string out;
  char buf[4096];
  size_t k;
  while ((k = std::fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, k);
  const int status = ::pclose(f);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << out;
  for (int r = 0; r < n; ++r) {
    EXPECT_THAT(out, ::testing::HasSubstr(absl::StrCat("nccl_check ok: rank ", r, " of ", n)));
  }
}

}  // namespace
