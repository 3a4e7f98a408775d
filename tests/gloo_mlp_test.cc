// Multi-process runs of the Megatron MLP training steps over the Gloo backend on this machine:
// through the real launcher (2 and 4 processes; each checks itself against the in-process run),
// and failure: a killed process ends the job with a clear error in bounded time, and the
// survivors' collectives fail naming the dead rank.
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;
using ::testing::Not;

struct Result {
  int exit_code = -1;
  std::string output;
  absl::Duration took;
};

// An unused loopback port (collectives/internal/free_port.h is private to collectives/).
int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  ::close(fd);
  return ok ? ntohs(a.sin_port) : -1;
}

// Runs a shell command line, capturing stdout and stderr together.
Result Shell(const std::string& cmd) {
  const absl::Time start = absl::Now();
  Result r;
  FILE* f = ::popen((cmd + " 2>&1").c_str(), "r");
  if (f == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) r.output.append(buf, n);
  const int status = ::pclose(f);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.took = absl::Now() - start;
  return r;
}

TEST(GlooMlpTest, TwoAndFourProcessesMatchTheInProcessRun) {
  for (auto [n, dp] : {std::pair{2, 1}, std::pair{4, 2}}) {
    Result r = Shell(absl::StrCat("collectives/launch --nproc_per_node=", n,
                                " -- tests/gloo_mlp_program --dp=", dp));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    for (int rank = 0; rank < n; ++rank) {
      EXPECT_THAT(r.output, HasSubstr(absl::StrCat("gloo_mlp ok: rank ", rank, " of ", n, " (dp=",
                                                   dp, ", tp=", n / dp, "), 3 f64 steps")));
    }
  }
}

// Two "nodes" on this machine: two launchers (--nnodes=2) over loopback, 2 processes each.
TEST(GlooMlpTest, TwoLaunchersAsTwoNodes) {
  const int port = FreePort();
  ASSERT_GT(port, 0);
  std::string script = "export SHARDMAP_STORE_TOKEN=fedcba9876543210fedcba9876543210; ";
  for (int node = 0; node < 2; ++node) {
    absl::StrAppend(&script, "collectives/launch --nnodes=2 --node_rank=", node,
                    " --nproc_per_node=2 --master_addr=127.0.0.1 --master_port=", port,
                    " -- tests/gloo_mlp_program --dp=2 > ", ::testing::TempDir(), "/node", node,
                    ".txt 2>&1 & n", node, "=$!; ");
  }
  absl::StrAppend(&script, "wait $n0; echo node0=$?; wait $n1; echo node1=$?");
  Result r = Shell("sh -c '" + script + "'");
  EXPECT_THAT(r.output, HasSubstr("node0=0"));
  EXPECT_THAT(r.output, HasSubstr("node1=0"));
  std::string both;
  for (int node = 0; node < 2; ++node) {
    both += Shell(absl::StrCat("cat ", ::testing::TempDir(), "/node", node, ".txt")).output;
  }
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_THAT(both, HasSubstr(absl::StrCat("gloo_mlp ok: rank ", rank,
                                             " of 4 (dp=2, tp=2), 3 f64 steps")))
        << both;
  }
}

// Four processes, rank 0 reducing over dp then tp while the others reduce over tp then dp (the
// axis communicators already exist): Gloo compares the typed layer's call tags across processes,
// so the job fails naming both calls instead of returning wrong sums.
TEST(GlooMlpTest, CollectivesReorderedAcrossGroupsFailNamingBothCalls) {
  Result r = Shell("collectives/launch --nproc_per_node=4 --grace_period_s=1 -- "
                   "tests/gloo_mlp_program --dp=2 --reorder_rank=0 --timeout_s=60");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("mismatched collectives")) << r.output;
  EXPECT_THAT(r.output, HasSubstr("issued all_reduce over")) << r.output;
  EXPECT_THAT(r.output, HasSubstr("collective #3 of its program")) << r.output;
  EXPECT_THAT(r.output, HasSubstr("collective #4 of its program")) << r.output;
  EXPECT_LT(r.took, absl::Seconds(20)) << r.output;  // far below the 60 s Gloo timeout
}

TEST(GlooMlpTest, AKilledProcessEndsTheJobWithAClearError) {
  Result r = Shell("collectives/launch --nproc_per_node=3 --grace_period_s=1 -- "
                 "tests/gloo_mlp_program --die_rank=1 --timeout_s=60");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("rank 1: killing itself"));
  EXPECT_THAT(r.output, HasSubstr("rank 1 failed first (killed by signal 9"));
  EXPECT_THAT(r.output, Not(HasSubstr("gloo_mlp ok")));
  EXPECT_LT(r.took, absl::Seconds(20)) << r.output;  // far below the 60 s Gloo timeout
}

// Without a launcher that stops them, the survivors must fail by themselves, naming rank 1.
TEST(GlooMlpTest, SurvivorsOfAKilledRankFailNamingIt) {
  const int port = FreePort();
  ASSERT_GT(port, 0);
  const std::string dir = ::testing::TempDir();
  std::string script;
  for (int r = 0; r < 3; ++r) {
    absl::StrAppend(&script, "RANK=", r, " LOCAL_RANK=", r, " WORLD_SIZE=3 LOCAL_WORLD_SIZE=3 ",
                    "MASTER_ADDR=127.0.0.1 MASTER_PORT=", port,
                    " SHARDMAP_STORE_TOKEN=0123456789abcdef0123456789abcdef",
                    " tests/gloo_mlp_program --die_rank=1 --timeout_s=60 > ", dir, "/rank", r,
                    ".txt 2>&1 & p", r, "=$!; ");
  }
  absl::StrAppend(&script, "wait $p0; echo rc0=$?; wait $p1; echo rc1=$?; wait $p2; echo rc2=$?");
  Result r = Shell("sh -c '" + script + "'");
  EXPECT_LT(r.took, absl::Seconds(20)) << r.output;
  EXPECT_THAT(r.output, HasSubstr("rc0=1"));
  EXPECT_THAT(r.output, HasSubstr("rc1=137"));  // SIGKILL
  EXPECT_THAT(r.output, HasSubstr("rc2=1"));
  for (int rank : {0, 2}) {
    Result out = Shell(absl::StrCat("cat ", dir, "/rank", rank, ".txt"));
    EXPECT_THAT(out.output, AnyOf(HasSubstr("lost rank 1"), HasSubstr("rank 1 failed")))
        << "rank " << rank;
    // The survivor names itself: "(rank R)" on the world or "(rank R (world rank R))" on an
    // axis group, whichever collective it was in when the peer died.
    EXPECT_THAT(out.output, AnyOf(HasSubstr(absl::StrCat("(rank ", rank, ")")),
                                  HasSubstr(absl::StrCat("(rank ", rank, " (world rank ", rank,
                                                         "))"))));
  }
}

}  // namespace
