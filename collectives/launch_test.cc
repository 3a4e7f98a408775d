// Runs the real launcher with real processes on loopback.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace {

using ::testing::HasSubstr;
using ::testing::Not;

struct Result {
  int exit_code = -1;
  std::string output;
  absl::Duration took;
};

// Runs `collectives/launch args...` and captures stdout and stderr together.
Result RunLaunch(const std::vector<std::string>& args) {
  const absl::Time start = absl::Now();
  std::string cmd = "collectives/launch";
  for (const auto& a : args) absl::StrAppend(&cmd, " ", a);
  absl::StrAppend(&cmd, " 2>&1");
  Result r;
  FILE* f = ::popen(cmd.c_str(), "r");
  if (f == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) r.output.append(buf, n);
  const int status = ::pclose(f);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.took = absl::Now() - start;
  return r;
}

TEST(LaunchTest, RanksRendezvousAndAgreeOnTheBlob) {
  for (int n : {1, 3, 4}) {
    Result r = RunLaunch({absl::StrCat("--nproc_per_node=", n), "--", "collectives/rendezvous_check"});
    EXPECT_EQ(r.exit_code, 0) << r.output;
    for (int rank = 0; rank < n; ++rank) {
      EXPECT_THAT(r.output, HasSubstr(absl::StrCat("[rank ", rank, "] rendezvous ok: ", n,
                                                   " ranks agree")));
      EXPECT_THAT(r.output, HasSubstr(absl::StrCat("(local rank ", rank, ")")));
    }
  }
}

TEST(LaunchTest, AFailingRankStopsTheOthersQuickly) {
  // The survivors would wait 30 s in the rendezvous; the launcher must stop them at once.
  for (int fail : {0, 2}) {
    Result r = RunLaunch({"--nproc_per_node=4", "--grace_period_s=1", "--",
                          "collectives/rendezvous_check", absl::StrCat("--fail_rank=", fail)});
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_THAT(r.output, HasSubstr(absl::StrCat("[rank ", fail, "] rank ", fail,
                                                 " failing on purpose")));
    EXPECT_THAT(r.output, HasSubstr(absl::StrCat("launch: rank ", fail,
                                                 " failed (exit code 3)")));
    EXPECT_THAT(r.output, Not(HasSubstr("rendezvous ok")));
    EXPECT_LT(r.took, absl::Seconds(10)) << r.output;
  }
}

TEST(LaunchTest, MisuseIsReported) {
  Result r = RunLaunch({"--nproc_per_node=2"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("no program given after --"));
  r = RunLaunch({"--nproc_per_node=zero", "--", "true"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("--nproc_per_node must be an integer"));
  r = RunLaunch({"--nproc_per_node=2", "--", "/nonexistent/program"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("cannot execute '/nonexistent/program'"));
  EXPECT_THAT(r.output, HasSubstr("failed (exit code 127)"));
}

}  // namespace
