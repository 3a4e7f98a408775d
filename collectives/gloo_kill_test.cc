// A Gloo rank process killed (SIGKILL) while its peers' started calls wait on it: the peers'
// Wait() fails at once naming it, long before the Gloo timeout. Ranks are forked processes (one
// per rank, as a launched job has; not collectives/launch, which stops the whole job when one
// rank dies), so the kernel closes the dead rank's sockets exactly as on a real crash. Its own
// binary: fork() happens before any thread exists.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "collectives/communicator.h"
#include "collectives/gloo_communicator.h"
#include "collectives/internal/free_port.h"
#include "collectives/tcp_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardmap::collectives {
namespace {

using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::HasSubstr;

constexpr int kRanks = 3;
constexpr int kKilled = 1;

// Rank r's program; the result goes to `fd` as "<code> <message>".
void RankMain(int r, int port, const std::string& token, int fd) {
  auto report = [fd](const absl::Status& s) {
    const std::string line = absl::StrCat(static_cast<int>(s.code()), " ", s.message());
    (void)!::write(fd, line.data(), line.size());
    ::close(fd);
    ::_exit(0);
  };
  TcpStoreOptions so;
  so.port = port;
  so.rank = r;
  so.world_size = kRanks;
  so.timeout = absl::Seconds(60);
  so.token = token;
  absl::StatusOr<std::unique_ptr<TcpStore>> store = TcpStore::Create(so);
  if (!store.ok()) report(store.status());
  GlooOptions o;
  o.timeout = absl::Seconds(60);
  absl::StatusOr<std::unique_ptr<Communicator>> comm =
      CreateGlooCommunicator(std::shared_ptr<TcpStore>(std::move(*store)), o);
  if (!comm.ok()) report(comm.status());
  Communicator& c = **comm;
  double warm = 1;  // opens the lane on every rank
  auto w = c.AllReduceStart(&warm, &warm, 1, DataType::kF64, ReduceOp::kSum);
  if (!w.ok()) report(w.status());
  if (absl::Status s = (*w)->Wait(); !s.ok()) report(s);
  if (r == kKilled) {  // its peers' started calls are in flight by now
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    ::raise(SIGKILL);
  }
  std::vector<float> x(200000, 1.0f);
  auto h = c.AllReduceStart(x.data(), x.data(), x.size(), DataType::kF32, ReduceOp::kSum);
  if (!h.ok()) report(h.status());
  report((*h)->Wait());
}

TEST(GlooKillTest, AKilledRankFailsItsPeersStartedCallsNamingIt) {
  absl::StatusOr<int> port = internal::PickFreePort();
  ASSERT_TRUE(port.ok()) << port.status();
  absl::StatusOr<std::string> token = NewStoreToken();
  ASSERT_TRUE(token.ok()) << token.status();
  const absl::Time start = absl::Now();
  std::vector<pid_t> pids(kRanks);
  std::vector<int> reads(kRanks);
  for (int r = 0; r < kRanks; ++r) {
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0);
    pids[r] = ::fork();
    ASSERT_GE(pids[r], 0);
    if (pids[r] == 0) {
      ::close(fds[0]);
      RankMain(r, *port, *token, fds[1]);
    }
    ::close(fds[1]);
    reads[r] = fds[0];
  }
  std::vector<std::string> out(kRanks);
  std::vector<int> status(kRanks, 0);
  for (int r = 0; r < kRanks; ++r) {
    char buf[4096];
    ssize_t n;
    while ((n = ::read(reads[r], buf, sizeof(buf))) > 0) out[r].append(buf, n);
    ::close(reads[r]);
    ::waitpid(pids[r], &status[r], 0);
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(30)) << "far below the 60 s Gloo timeout";
  EXPECT_TRUE(WIFSIGNALED(status[kKilled]) && WTERMSIG(status[kKilled]) == SIGKILL);
  for (int r = 0; r < kRanks; ++r) {
    if (r == kKilled) continue;
    // Lost it directly (Unavailable), or heard it from a peer that did (its code).
    EXPECT_THAT(out[r], AnyOf(::testing::StartsWith(absl::StrCat(
                                  static_cast<int>(absl::StatusCode::kUnavailable), " ")),
                              ::testing::StartsWith(absl::StrCat(
                                  static_cast<int>(absl::StatusCode::kAborted), " "))))
        << "rank " << r;
    EXPECT_THAT(out[r], AllOf(HasSubstr("AllReduce(f32, sum, count=200000)"),
                              HasSubstr("lost rank 1")))
        << "rank " << r;
  }
}

}  // namespace
}  // namespace shardmap::collectives
