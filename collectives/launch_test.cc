// Runs the real launcher with real processes on loopback: rendezvous, two "nodes" on one
// machine, failures, signals, and that no rank outlives the launcher.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "collectives/internal/free_port.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kToken[] = "launch-test-token-0123456789";

// collectives/launch with `args`, its stdout and stderr merged into output.
class Launcher {
 public:
  // stdout_unread: the launcher's stdout goes to a pipe nobody reads (only stderr is read).
  explicit Launcher(const std::vector<std::string>& args,
                    const std::vector<std::string>& extra_env = {}, bool stdout_unread = false) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) return;
    int unread[2] = {-1, -1};
    if (stdout_unread && ::pipe2(unread, O_CLOEXEC) != 0) return;
    unread_ = unread[0];
    std::vector<std::string> argv_s = {"collectives/launch"};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<std::string> env_s = extra_env;
    for (char** e = environ; *e != nullptr; ++e) {
      if (!absl::StartsWith(*e, "SHARDMAP_STORE_TOKEN=")) env_s.push_back(*e);
    }
    std::vector<char*> env;
    for (auto& e : env_s) env.push_back(e.data());
    env.push_back(nullptr);
    start_ = absl::Now();
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(stdout_unread ? unread[1] : fds[1], 1);
      ::dup2(fds[1], 2);
      ::execve(argv[0], argv.data(), env.data());
      _exit(127);
    }
    ::close(fds[1]);
    if (unread[1] >= 0) ::close(unread[1]);
    fd_ = fds[0];
  }
  ~Launcher() {
    if (pid_ > 0 && exit_code_ == kRunning) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (fd_ >= 0) ::close(fd_);
    if (unread_ >= 0) ::close(unread_);
  }

  // Reads output until pred(output) holds or the launcher's output ends or the timeout passes.
  bool ReadUntil(const std::function<bool(const std::string&)>& pred, absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (!pred(output_)) {
      if (fd_ < 0 || absl::Now() >= deadline) return false;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      char buf[65536];
      const ssize_t n = ::read(fd_, buf, sizeof(buf));
      if (n <= 0) {
        ::close(fd_);
        fd_ = -1;
      } else {
        output_.append(buf, static_cast<size_t>(n));
      }
    }
    return true;
  }

  // Waits for the launcher to exit; its exit code, 128+signal if killed, -1 on timeout.
  int Wait(absl::Duration timeout = absl::Seconds(60)) {
    ReadUntil([](const std::string&) { return false; }, timeout);  // to EOF
    const absl::Time deadline = absl::Now() + timeout;
    while (exit_code_ == kRunning && absl::Now() < deadline) {
      int status;
      rusage usage{};
      if (::wait4(pid_, &status, WNOHANG, &usage) == pid_) {
        exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        took_ = absl::Now() - start_;
        max_rss_kib_ = usage.ru_maxrss;
      } else {
        absl::SleepFor(absl::Milliseconds(10));
      }
    }
    return exit_code_ == kRunning ? -1 : exit_code_;
  }

  pid_t pid() const { return pid_; }
  const std::string& output() const { return output_; }
  absl::Duration took() const { return took_; }
  // The launcher's peak resident memory (its ranks' too, the largest of them), once exited.
  long max_rss_kib() const { return max_rss_kib_; }

 private:
  static constexpr int kRunning = -1000;
  pid_t pid_ = -1;
  int fd_ = -1;
  int unread_ = -1;  // the read end of the unread stdout pipe, held open so writes block
  long max_rss_kib_ = 0;
  std::string output_;
  int exit_code_ = kRunning;
  absl::Time start_;
  absl::Duration took_;
};

struct Result {
  int exit_code;
  std::string output;
  absl::Duration took;
};

Result RunLaunch(const std::vector<std::string>& args,
                 const std::vector<std::string>& extra_env = {}) {
  Launcher l(args, extra_env);
  const int code = l.Wait();
  return {code, l.output(), l.took()};
}

// The numbers that follow `marker` in lines of `output` ("[rank 1] pid 1234" -> 1234).
std::vector<int> NumbersAfter(const std::string& output, absl::string_view marker) {
  std::vector<int> found;
  for (absl::string_view line : absl::StrSplit(output, '\n')) {
    const size_t at = line.find(marker);
    if (at == absl::string_view::npos) continue;
    int v;
    if (absl::SimpleAtoi(line.substr(at + marker.size()), &v)) found.push_back(v);
  }
  return found;
}

// Gone or a zombie (its parent, the reaper the orphans went to, may not have reaped it yet).
bool IsDead(int pid) {
  std::ifstream f(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat;
  if (!std::getline(f, stat)) return true;
  const size_t paren = stat.rfind(')');
  return paren == std::string::npos || paren + 2 >= stat.size() || stat[paren + 2] == 'Z' ||
         stat[paren + 2] == 'X';
}

bool AllDeadWithin(const std::vector<int>& pids, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    bool all = true;
    for (int p : pids) all = all && IsDead(p);
    if (all) return true;
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(20));
  }
}

// A rank that prints its pid, then runs until stopped (checking every 0.1 s).
std::vector<std::string> SleepingRank(const std::string& before = "") {
  return {"/bin/sh", "-c", absl::StrCat(before, "echo pid $$; while true; do sleep 0.1; done")};
}

std::vector<std::string> Concat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST(LaunchTest, RanksRendezvousAndAgreeOnTheBlob) {
  for (int n : {1, 3}) {  // 6 ranks: TwoNodesOnOneMachine
    Result r = RunLaunch({absl::StrCat("--nproc_per_node=", n), "--", "collectives/rendezvous_check"});
    EXPECT_EQ(r.exit_code, 0) << r.output;
    for (int rank = 0; rank < n; ++rank) {
      EXPECT_THAT(r.output, HasSubstr(absl::StrCat("[rank ", rank, "] rendezvous ok: ", n,
                                                   " ranks agree")));
      EXPECT_THAT(r.output, HasSubstr(absl::StrCat("(local rank ", rank, ")")));
    }
  }
}

TEST(LaunchTest, EveryRankGetsItsEnvironmentAndTheJobsToken) {
  Result r = RunLaunch({"--nproc_per_node=2", "--", "/bin/sh", "-c",
                        "echo env $RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $MASTER_ADDR "
                        "${#SHARDMAP_STORE_TOKEN} $SHARDMAP_STORE_TOKEN"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("[rank 0] env 0 0 2 2 127.0.0.1 32 "));
  EXPECT_THAT(r.output, HasSubstr("[rank 1] env 1 1 2 2 127.0.0.1 32 "));
  // Both ranks got the same (random) token; a second job gets another.
  std::vector<std::string> tokens;
  for (absl::string_view line : absl::StrSplit(r.output, '\n')) {
    if (absl::StrContains(line, " env ")) tokens.emplace_back(line.substr(line.rfind(' ') + 1));
  }
  ASSERT_EQ(tokens.size(), 2u) << r.output;
  EXPECT_EQ(tokens[0], tokens[1]);
  Result again = RunLaunch({"--", "/bin/sh", "-c", "echo $SHARDMAP_STORE_TOKEN"});
  EXPECT_THAT(again.output, Not(HasSubstr(tokens[0])));
  // A token from the environment is passed on as it is.
  Result given = RunLaunch({"--", "/bin/sh", "-c", "echo token $SHARDMAP_STORE_TOKEN"},
                           {absl::StrCat("SHARDMAP_STORE_TOKEN=", kToken)});
  EXPECT_THAT(given.output, HasSubstr(absl::StrCat("[rank 0] token ", kToken)));
}

TEST(LaunchTest, TwoNodesOnOneMachine) {
  // Two launchers (--nnodes=2) on loopback, 3 ranks each: one world of 6. Node 0 takes the
  // token from the environment, node 1 from --token.
  auto port = shardmap::collectives::internal::PickFreePort();
  ASSERT_TRUE(port.ok());
  const std::vector<std::string> common = {"--nnodes=2", "--nproc_per_node=3",
                                           "--master_addr=127.0.0.1",
                                           absl::StrCat("--master_port=", *port)};
  const std::vector<std::string> prog = {"--", "collectives/rendezvous_check"};
  Launcher node1(Concat(Concat(common, {"--node_rank=1", absl::StrCat("--token=", kToken)}),
                        prog));
  Launcher node0(Concat(Concat(common, {"--node_rank=0"}), prog),
                 {absl::StrCat("SHARDMAP_STORE_TOKEN=", kToken)});
  EXPECT_EQ(node0.Wait(), 0) << node0.output();
  EXPECT_EQ(node1.Wait(), 0) << node1.output();
  for (int rank = 0; rank < 6; ++rank) {
    const Launcher& node = rank < 3 ? node0 : node1;
    EXPECT_THAT(node.output(), HasSubstr(absl::StrCat("[rank ", rank, "] rendezvous ok: 6 ranks "
                                                      "agree")));
    EXPECT_THAT(node.output(), HasSubstr(absl::StrCat("(local rank ", rank % 3, ")")));
  }
  // The same blob everywhere: both outputs name one digest.
  const size_t at = node0.output().find("agree on blob ");
  ASSERT_NE(at, std::string::npos);
  const std::string digest = node0.output().substr(at, 30);
  EXPECT_THAT(node1.output(), HasSubstr(digest));
}

TEST(LaunchTest, AFailingRankStopsTheOthersQuickly) {
  // The survivors would wait 30 s in the rendezvous; the launcher must stop them at once.
  for (int fail : {0, 2}) {
    Result r = RunLaunch({"--nproc_per_node=3", "--grace_period_s=1", "--",
                          "collectives/rendezvous_check", absl::StrCat("--fail_rank=", fail)});
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_THAT(r.output, HasSubstr(absl::StrCat("[rank ", fail, "] rank ", fail,
                                                 " failing on purpose")));
    EXPECT_THAT(r.output, HasSubstr(absl::StrCat("launch: rank ", fail,
                                                 " failed first (exit code 3)")));
    EXPECT_THAT(r.output, Not(HasSubstr("rendezvous ok")));
    EXPECT_LT(r.took, absl::Seconds(10)) << r.output;
  }
}

TEST(LaunchTest, AKilledRankIsNamedAndItsProcessGroupKilled) {
  // Rank 1 starts a helper in the background and is then killed; the helper (same process
  // group) must not survive, nor must rank 0.
  Launcher l({"--nproc_per_node=2", "--grace_period_s=0.5", "--", "/bin/sh", "-c",
              "echo pid $$; if [ \"$RANK\" = 1 ]; then sleep 60 & echo helper $!; sleep 0.3; "
              "kill -9 $$; fi; while true; do sleep 0.1; done"});
  EXPECT_EQ(l.Wait(), 1) << l.output();
  EXPECT_THAT(l.output(), HasSubstr("launch: rank 1 failed first (killed by signal 9"));
  EXPECT_LT(l.took(), absl::Seconds(10)) << l.output();
  std::vector<int> pids = NumbersAfter(l.output(), "] pid ");
  std::vector<int> helper = NumbersAfter(l.output(), "] helper ");
  ASSERT_EQ(pids.size(), 2u) << l.output();
  ASSERT_EQ(helper.size(), 1u) << l.output();
  pids.push_back(helper[0]);
  EXPECT_TRUE(AllDeadWithin(pids, absl::Seconds(5)));
}

TEST(LaunchTest, SigkillOfTheLauncherLeavesNoOrphan) {
  Launcher l(Concat({"--nproc_per_node=3", "--"}, SleepingRank()));
  ASSERT_TRUE(l.ReadUntil([](const std::string& out) { return NumbersAfter(out, "] pid ").size() == 3; },
                          absl::Seconds(30)))
      << l.output();
  const std::vector<int> pids = NumbersAfter(l.output(), "] pid ");
  ASSERT_EQ(::kill(l.pid(), SIGKILL), 0);
  EXPECT_EQ(l.Wait(), 128 + SIGKILL);
  EXPECT_TRUE(AllDeadWithin(pids, absl::Seconds(5)));
}

TEST(LaunchTest, SignalsAreForwardedAndNothingIsLeftBehind) {
  for (int sig : {SIGTERM, SIGHUP, SIGINT}) {
    Launcher l(Concat({"--nproc_per_node=2", "--"},
                      SleepingRank("trap 'echo stopping; exit 7' TERM HUP INT; ")));
    ASSERT_TRUE(l.ReadUntil([](const std::string& out) { return NumbersAfter(out, "] pid ").size() == 2; },
                            absl::Seconds(30)))
        << l.output();
    const std::vector<int> pids = NumbersAfter(l.output(), "] pid ");
    ASSERT_EQ(::kill(l.pid(), sig), 0);
    EXPECT_EQ(l.Wait(), 128 + sig) << l.output();
    EXPECT_THAT(l.output(), HasSubstr("[rank 0] stopping"));  // the rank got the signal
    EXPECT_THAT(l.output(), HasSubstr("[rank 1] stopping"));
    EXPECT_THAT(l.output(), HasSubstr(absl::StrCat("launch: stopped by signal ", sig)));
    EXPECT_LT(l.took(), absl::Seconds(10));
    EXPECT_TRUE(AllDeadWithin(pids, absl::Seconds(5))) << "signal " << sig;
  }
  // A rank that ignores SIGTERM is killed after the grace period.
  Launcher stubborn(Concat({"--nproc_per_node=2", "--grace_period_s=0.5", "--"},
                           SleepingRank("trap '' TERM; ")));
  ASSERT_TRUE(stubborn.ReadUntil(
      [](const std::string& out) { return NumbersAfter(out, "] pid ").size() == 2; },
      absl::Seconds(30)));
  const std::vector<int> pids = NumbersAfter(stubborn.output(), "] pid ");
  ASSERT_EQ(::kill(stubborn.pid(), SIGTERM), 0);
  EXPECT_EQ(stubborn.Wait(), 128 + SIGTERM) << stubborn.output();
  EXPECT_LT(stubborn.took(), absl::Seconds(10));
  EXPECT_TRUE(AllDeadWithin(pids, absl::Seconds(5)));
}

// Nobody reads the launcher's stdout (a full pipe): a failing rank still stops the job, and a
// signal still stops the launcher, while a rank floods its output.
TEST(LaunchTest, UnreadStdoutDoesNotBlockFailureHandlingOrSignals) {
  Launcher failing({"--nproc_per_node=3", "--grace_period_s=0.5", "--", "/bin/sh", "-c",
                    "if [ \"$RANK\" = 1 ]; then sleep 1; exit 3; fi; exec yes flooding"},
                   {}, /*stdout_unread=*/true);
  EXPECT_EQ(failing.Wait(absl::Seconds(30)), 1) << failing.output();
  EXPECT_THAT(failing.output(), HasSubstr("launch: rank 1 failed first (exit code 3)"));
  EXPECT_THAT(failing.output(), HasSubstr("bytes of rank output were dropped"));
  EXPECT_LT(failing.took(), absl::Seconds(10)) << failing.output();

  Launcher signalled({"--nproc_per_node=2", "--grace_period_s=0.5", "--", "/bin/sh", "-c",
                      "exec yes flooding"},
                     {}, /*stdout_unread=*/true);
  absl::SleepFor(absl::Seconds(1));  // long enough to fill the pipe
  ASSERT_EQ(::kill(signalled.pid(), SIGTERM), 0);
  EXPECT_EQ(signalled.Wait(absl::Seconds(30)), 128 + SIGTERM) << signalled.output();
  EXPECT_THAT(signalled.output(), HasSubstr("launch: stopped by signal 15"));
  EXPECT_LT(signalled.took(), absl::Seconds(10)) << signalled.output();
}

// A rank that prints 80 MB without a newline: the launcher prints it in bounded pieces, each
// with the rank prefix, loses nothing, and its memory stays bounded.
TEST(LaunchTest, AnEndlessLineIsPrintedInBoundedPieces) {
  constexpr long kBytes = 80'000'000;
  Launcher l({"--nproc_per_node=1", "--", "/bin/sh", "-c",
              absl::StrCat("head -c ", kBytes, " /dev/zero | tr '\\0' x; echo; echo done")});
  EXPECT_EQ(l.Wait(absl::Seconds(60)), 0) << l.output().substr(0, 1000);
  long xs = 0;
  size_t longest = 0, pieces = 0;
  for (absl::string_view line : absl::StrSplit(l.output(), '\n')) {
    if (line.empty()) continue;
    EXPECT_TRUE(absl::StartsWith(line, "[rank 0] ")) << line.substr(0, 100);
    line.remove_prefix(std::min(line.size(), sizeof("[rank 0] ") - 1));
    if (line.find_first_not_of('x') == absl::string_view::npos) {
      xs += static_cast<long>(line.size());
      ++pieces;
    }
    longest = std::max(longest, line.size());
  }
  EXPECT_EQ(xs, kBytes);
  EXPECT_LE(longest, size_t{64} << 10);
  EXPECT_GE(pieces, static_cast<size_t>(kBytes / (64 << 10)));
  EXPECT_THAT(l.output(), HasSubstr("[rank 0] done"));
  // The line buffer is bounded: unbounded, it held the whole line twice (122 MB peak for a
  // 40 MB line, so 160 MB and more for this one); bounded, ~10 MB (~41 MB under
  // ThreadSanitizer, whose shadow memory counts; ~107 MiB under AddressSanitizer, whose
  // quarantine keeps the freed pieces mapped).
#if defined(__SANITIZE_ADDRESS__)
  constexpr long kMaxRssKib = 150 * 1024;
#else
  constexpr long kMaxRssKib = 64 * 1024;
#endif
  std::printf("launcher peak RSS %ld KiB\n", l.max_rss_kib());
  EXPECT_LT(l.max_rss_kib(), kMaxRssKib) << "launcher peak RSS " << l.max_rss_kib() << " KiB";
}

TEST(LaunchTest, AWildcardMasterAddrNeedsAFlag) {
  for (const char* addr : {"0.0.0.0", "::", "[::]", "0", "0x0", "00", "000.000.000.000", "0.0x0"}) {
    Result r = RunLaunch({absl::StrCat("--master_addr=", addr), "--", "true"});
    EXPECT_EQ(r.exit_code, 2) << addr << ": " << r.output;
    EXPECT_THAT(r.output, HasSubstr("every interface")) << addr;
    EXPECT_THAT(r.output, HasSubstr("--allow_all_interfaces")) << addr;
  }
  Result r = RunLaunch({"--master_addr=0.0.0.0", "--allow_all_interfaces", "--nproc_per_node=2",
                        "--", "collectives/rendezvous_check"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("rendezvous ok: 2 ranks agree"));
}

// A stopped (SIGSTOP) Gloo peer: rank 0 reports the timeout at the timeout and exits soon
// after; the store it serves does not wait the store's own timeout (60 s here, 300 s by
// default) for the stopped rank to disconnect.
TEST(LaunchTest, AStoppedGlooPeerFailsTheOthersAtTheTimeoutAndTheyExit) {
  Result r = RunLaunch({"--nproc_per_node=2", "--grace_period_s=0.5", "--",
                        "collectives/gloo_check", "--stop_rank=1", "--timeout_s=2",
                        "--store_timeout_s=60"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("timed out after 2s waiting for rank 1")) << r.output;
  EXPECT_THAT(r.output, HasSubstr("[rank 0] exiting after")) << r.output;
  EXPECT_THAT(r.output, HasSubstr("launch: rank 0 failed first (exit code 1)")) << r.output;
  EXPECT_LT(r.took, absl::Seconds(15)) << r.output;
}

TEST(LaunchTest, MisuseIsReported) {
  struct Case {
    std::vector<std::string> args;
    const char* expect;
    int code = 2;
  };
  const std::vector<Case> cases = {
      {{"--nproc_per_node=2"}, "no program given after --"},
      {{"--nproc_per_node=zero", "--", "true"}, "Illegal value 'zero' specified for flag "
                                                 "'nproc_per_node'", 1},  // Abseil's own check
      {{"--nproc_per_node=0", "--", "true"}, "--nproc_per_node must be in [1, 4096], got 0"},
      {{"--grace_period_s=nan", "--", "true"}, "--grace_period_s must be a number of seconds"},
      {{"--grace_period_s=inf", "--", "true"}, "--grace_period_s must be a number of seconds"},
      {{"--grace_period_s=-1", "--", "true"}, "--grace_period_s must be a number of seconds"},
      {{"--grace_period_s=1e300", "--", "true"}, "in [0, 3600], got 1e+300"},
      {{"--nnodes=2", "--node_rank=2", "--master_port=1234", "--", "true"},
       "--node_rank must be in [0, --nnodes=2), got 2"},
      {{"--nnodes=2", "--", "true"}, "--master_port is required with --nnodes > 1"},
      {{"--nnodes=2", "--master_port=1234", "--", "true"},
       "a multi-node job needs one store token shared by every node's launcher"},
      {{"--token=short", "--", "true"}, "the store token has 5 characters"},
      {{"--master_port=70000", "--", "true"}, "--master_port must be in [1, 65535]"},
      {{"stray", "--", "true"}, "unexpected argument 'stray' (put the program after --)"},
  };
  for (const Case& c : cases) {
    Result r = RunLaunch(c.args);
    EXPECT_EQ(r.exit_code, c.code) << r.output;
    EXPECT_THAT(r.output, HasSubstr(c.expect)) << absl::StrJoin(c.args, " ");
  }
  Result r = RunLaunch({"--nproc_per_node=2", "--", "/nonexistent/program"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("cannot execute '/nonexistent/program'"));
  EXPECT_THAT(r.output, HasSubstr("failed first (exit code 127)"));
}

TEST(LaunchTest, HelpListsTheFlags) {
  for (const char* prog : {"collectives/launch", "collectives/rendezvous_check"}) {
    FILE* f = ::popen(absl::StrCat(prog, " --help 2>&1").c_str(), "r");
    ASSERT_NE(f, nullptr);
    std::string out;
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, n);
    ::pclose(f);
    if (absl::EndsWith(prog, "launch")) {
      for (const char* flag : {"--nproc_per_node", "--nnodes", "--node_rank", "--master_addr",
                               "--master_port", "--grace_period_s", "--token",
                               "--allow_all_interfaces"}) {
        EXPECT_THAT(out, HasSubstr(flag));
      }
      EXPECT_THAT(out, HasSubstr("SHARDMAP_STORE_TOKEN"));
    } else {
      EXPECT_THAT(out, HasSubstr("--fail_rank"));
      EXPECT_THAT(out, HasSubstr("--timeout_s"));
    }
  }
}

}  // namespace
