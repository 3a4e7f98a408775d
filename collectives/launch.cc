// launch: a torchrun-style launcher. Starts --nproc_per_node processes of a program on this
// machine with the environment DistributedEnv reads, prefixes their output lines with the rank,
// and if one fails, stops the others and exits non-zero naming the rank that failed first.
//
//   bazel-bin/collectives/launch --nproc_per_node=4 -- bazel-bin/my/train --steps=10
//   # each child gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1,
//   # MASTER_PORT=<a free port>, SHARDMAP_STORE_TOKEN=<random>; lines come back as "[rank 2] ..."
//
//   # Two machines, 8 processes each: the same token (a shared secret) on both launchers.
//   export SHARDMAP_STORE_TOKEN=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
//   launch --nnodes=2 --node_rank=0 --nproc_per_node=8 --master_addr=node0 --master_port=29500 -- prog
//   launch --nnodes=2 --node_rank=1 --nproc_per_node=8 --master_addr=node0 --master_port=29500 -- prog
//
// Process handling: each rank runs in its own process group; on a failed or killed rank, or on
// SIGINT/SIGTERM/SIGHUP to the launcher, every rank's group gets the signal (SIGTERM for a
// failure), then SIGKILL after --grace_period_s. Ranks get PR_SET_PDEATHSIG=SIGKILL, so even a
// SIGKILLed launcher leaves no rank behind (a rank's own children are the rank's business).
// Exit code: 0 when every rank succeeded, 1 when a rank failed ("rank K failed first" on stderr),
// 128+signal when interrupted, 2 for bad flags.
//
// Output never blocks failure handling: a writer thread per stream (stdout, stderr) writes what
// the main loop queues, so reaping ranks and handling signals go on while nobody reads the
// launcher's output. While the stdout queue holds kMaxQueuedBytes the launcher stops reading
// the ranks' pipes (they block in their own writes, as without a launcher); what is still queued
// when the launcher exits is dropped and counted on stderr. A line longer than kMaxLineBytes is
// printed in pieces of that size, so a rank that never prints a newline costs bounded memory.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/command_line.h"
#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "collectives/internal/free_port.h"
#include "collectives/tcp_store.h"

ABSL_FLAG(int, nproc_per_node, 1, "processes (ranks) to start on this machine");
ABSL_FLAG(int, nnodes, 1, "machines in the job; each runs one launcher");
ABSL_FLAG(int, node_rank, 0, "this machine's index in [0, nnodes); node 0 hosts the store");
ABSL_FLAG(std::string, master_addr, "127.0.0.1",
          "address of node 0, where rank 0 serves the rendezvous store (it binds only this "
          "address: keep the loopback default on one machine); a wildcard (0.0.0.0, ::) needs "
          "--allow_all_interfaces");
ABSL_FLAG(bool, allow_all_interfaces, false,
          "accept a wildcard --master_addr (0.0.0.0 or ::), which makes the store listen on "
          "every interface of node 0: anyone who can reach any of them can try the token");
ABSL_FLAG(int, master_port, 0,
          "port of the rendezvous store; 0 picks a free one (one machine only)");
ABSL_FLAG(double, grace_period_s, 3,
          "seconds between SIGTERM and SIGKILL when stopping ranks, in [0, 3600]");
ABSL_FLAG(std::string, token, "",
          "the job's rendezvous store token (a shared secret, 16-256 printable characters); "
          "default: $SHARDMAP_STORE_TOKEN, else a random one when --nnodes=1. Every launcher of "
          "a multi-node job needs the same one; prefer the environment variable (command lines "
          "are visible to other users)");

namespace {

volatile sig_atomic_t g_signal = 0;  // the last SIGINT/SIGTERM/SIGHUP received
void OnSignal(int signo) { g_signal = signo; }

struct Child {
  int rank = 0;
  pid_t pid = -1;  // also its process group id
  int out_fd = -1;  // stdout and stderr of the child, merged
  std::string pending;  // a partial line
  bool running = true;
};

struct Config {
  int nproc = 1, nnodes = 1, node_rank = 0, port = 0;
  std::string addr, token;
  bool allow_all = false;  // --allow_all_interfaces
  double grace_s = 3;
  std::vector<char*> program;  // null-terminated argv
};

int Usage(const std::string& msg) {
  std::fprintf(stderr,
               "launch: %s\nusage: launch [--nproc_per_node=N] [--nnodes=M --node_rank=K "
               "--master_addr=A --master_port=P] [--grace_period_s=S] -- program [args...]\n"
               "(launch --help lists every flag)\n",
               msg.c_str());
  return 2;
}

// 0.0.0.0, ::, and their spellings: the addresses that bind every interface.
bool IsWildcardAddress(const std::string& addr) {
  std::string a = addr;
  if (a.size() >= 2 && a.front() == '[' && a.back() == ']') a = a.substr(1, a.size() - 2);
  in_addr v4{};
  if (::inet_pton(AF_INET, a.c_str(), &v4) == 1) return v4.s_addr == htonl(INADDR_ANY);
  in6_addr v6{};
  if (::inet_pton(AF_INET6, a.c_str(), &v6) == 1) {
    return IN6_IS_ADDR_UNSPECIFIED(&v6) || (IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr32[3] == 0);
  }
  return a == "0" || a == "0.0" || a == "0.0.0" || a == "*" || a == "any" ||
         shardmap::collectives::ResolvesToAllInterfaces(a);  // 0x0, 00, 0.0x0, ...
}

// Validates the flags; an error message says what is wrong and how to fix it.
absl::Status ReadConfig(Config& c) {
  c.nproc = absl::GetFlag(FLAGS_nproc_per_node);
  c.nnodes = absl::GetFlag(FLAGS_nnodes);
  c.node_rank = absl::GetFlag(FLAGS_node_rank);
  c.addr = absl::GetFlag(FLAGS_master_addr);
  c.port = absl::GetFlag(FLAGS_master_port);
  c.grace_s = absl::GetFlag(FLAGS_grace_period_s);
  c.token = absl::GetFlag(FLAGS_token);
  c.allow_all = absl::GetFlag(FLAGS_allow_all_interfaces);
  if (c.nproc < 1 || c.nproc > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("--nproc_per_node must be in [1, 4096], got ", c.nproc));
  }
  if (c.nnodes < 1 || c.nnodes > 4096) {
    return absl::InvalidArgumentError(absl::StrCat("--nnodes must be in [1, 4096], got ",
                                                   c.nnodes));
  }
  if (c.node_rank < 0 || c.node_rank >= c.nnodes) {
    return absl::InvalidArgumentError(absl::StrCat("--node_rank must be in [0, --nnodes=",
                                                   c.nnodes, "), got ", c.node_rank));
  }
  if (c.addr.empty()) return absl::InvalidArgumentError("--master_addr is empty");
  if (IsWildcardAddress(c.addr) && !absl::GetFlag(FLAGS_allow_all_interfaces)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--master_addr=", c.addr, " would make rank 0's store listen on every interface of "
        "this machine; give node 0's address on the network the nodes share (or 127.0.0.1 on "
        "one machine), or pass --allow_all_interfaces if you mean it"));
  }
  if (c.port < 0 || c.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--master_port must be in [1, 65535] (or 0: pick one), got ", c.port));
  }
  if (c.port == 0 && c.nnodes > 1) {
    return absl::InvalidArgumentError(
        "--master_port is required with --nnodes > 1: every node's launcher must be given the "
        "same port");
  }
  // !(x <= 3600) also rejects NaN.
  if (!(c.grace_s >= 0 && c.grace_s <= 3600)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--grace_period_s must be a number of seconds in [0, 3600], got ", c.grace_s));
  }
  if (c.token.empty()) {
    if (const char* env = std::getenv(shardmap::collectives::kStoreTokenEnvVar)) c.token = env;
  }
  if (c.token.empty()) {
    if (c.nnodes > 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a multi-node job needs one store token shared by every node's launcher: export ",
          shardmap::collectives::kStoreTokenEnvVar,
          "=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n') with the same value on "
          "every node (or pass --token)"));
    }
    absl::StatusOr<std::string> t = shardmap::collectives::NewStoreToken();
    if (!t.ok()) return t.status();
    c.token = *t;
  }
  if (absl::Status s = shardmap::collectives::CheckStoreToken(c.token); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--token / ",
                                                   shardmap::collectives::kStoreTokenEnvVar,
                                                   ": ", s.message()));
  }
  if (c.port == 0) {
    absl::StatusOr<int> p = shardmap::collectives::internal::PickFreePort();
    if (!p.ok()) return p.status();
    c.port = *p;
  }
  return absl::OkStatus();
}

constexpr size_t kMaxQueuedBytes = size_t{4} << 20;
constexpr size_t kMaxLineBytes = size_t{64} << 10;

// One output stream written by its own thread, so that the main loop never blocks in a write
// (see the file comment). The thread is detached: at exit it may still be blocked in write().
class Writer {
 public:
  explicit Writer(int fd) : fd_(fd) { std::thread([this] { Run(); }).detach(); }

  void Put(std::string s) {
    std::lock_guard<std::mutex> l(mu_);
    queued_ += s.size();
    queue_.push_back(std::move(s));
    cv_.notify_one();
  }
  bool Full() {
    std::lock_guard<std::mutex> l(mu_);
    return queued_ >= kMaxQueuedBytes;
  }
  // Waits until everything queued was written, at most `timeout`; returns the bytes left.
  size_t Drain(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait_for(l, timeout, [&] { return queued_ == 0; });
    return queued_;
  }

 private:
  void Run() {
    std::unique_lock<std::mutex> l(mu_);
    while (true) {
      cv_.wait(l, [&] { return !queue_.empty(); });
      std::string s = std::move(queue_.front());
      queue_.pop_front();
      l.unlock();
      size_t done = 0;
      while (done < s.size()) {
        const ssize_t w = ::write(fd_, s.data() + done, s.size() - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break;  // a closed stream: drop
        done += static_cast<size_t>(w);
      }
      l.lock();
      queued_ -= s.size();
      cv_.notify_all();
    }
  }

  const int fd_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::string> queue_;  // guarded by mu_
  size_t queued_ = 0;              // bytes in queue_ and in the write under way; guarded by mu_
};

Writer* g_out = nullptr;  // stdout and stderr once the ranks start (never destroyed)
Writer* g_err = nullptr;

void Emit(int rank, absl::string_view line) {
  g_out->Put(absl::StrCat("[rank ", rank, "] ", line, "\n"));
}

// The launcher's own messages.
void Say(const std::string& msg) {
  if (g_err == nullptr) {
    std::fprintf(stderr, "%s", msg.c_str());
  } else {
    g_err->Put(msg);
  }
}

// Reads what is available and queues complete lines (and pieces of kMaxLineBytes of a longer
// one); closes the pipe at EOF.
void Drain(Child& c) {
  char buf[65536];
  ssize_t n = ::read(c.out_fd, buf, sizeof(buf));
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (n <= 0) {
    if (!c.pending.empty()) Emit(c.rank, c.pending);
    c.pending.clear();
    ::close(c.out_fd);
    c.out_fd = -1;
    return;
  }
  c.pending.append(buf, static_cast<size_t>(n));
  const absl::string_view all(c.pending);
  size_t start = 0;
  while (true) {
    const size_t pos = all.find('\n', start);
    const size_t end = pos == absl::string_view::npos ? all.size() : pos;
    if (end - start >= kMaxLineBytes) {  // a piece of a long line
      Emit(c.rank, all.substr(start, kMaxLineBytes));
      start += kMaxLineBytes;
      continue;
    }
    if (pos == absl::string_view::npos) break;
    Emit(c.rank, all.substr(start, pos - start));
    start = pos + 1;
  }
  c.pending.erase(0, start);
}

std::string DescribeStatus(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exit code ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return absl::StrCat("killed by signal ", WTERMSIG(status), " (", strsignal(WTERMSIG(status)),
                        ")");
  }
  return "unknown status";
}

// In the forked child: never returns.
[[noreturn]] void ExecRank(const Config& c, int local_rank, int out_fd, pid_t launcher) {
  ::setpgid(0, 0);  // its own process group: stopping a rank stops its helpers too
  // Die with the launcher, even when it is SIGKILLed; it may already be gone.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != launcher) _exit(128 + SIGKILL);
  // The launcher ignores SIGPIPE and blocks nothing; an exec keeps ignored signals ignored.
  ::signal(SIGPIPE, SIG_DFL);
  ::dup2(out_fd, 1);
  ::dup2(out_fd, 2);
  if (out_fd > 2) ::close(out_fd);
  const int rank = c.node_rank * c.nproc + local_rank;
  setenv("RANK", std::to_string(rank).c_str(), 1);
  setenv("LOCAL_RANK", std::to_string(local_rank).c_str(), 1);
  setenv("WORLD_SIZE", std::to_string(c.nnodes * c.nproc).c_str(), 1);
  setenv("LOCAL_WORLD_SIZE", std::to_string(c.nproc).c_str(), 1);
  setenv("GROUP_RANK", std::to_string(c.node_rank).c_str(), 1);
  setenv("MASTER_ADDR", c.addr.c_str(), 1);
  setenv("MASTER_PORT", std::to_string(c.port).c_str(), 1);
  setenv(shardmap::collectives::kStoreTokenEnvVar, c.token.c_str(), 1);
  // Rank 0's store refuses a wildcard MASTER_ADDR unless told: --allow_all_interfaces tells it.
  setenv(shardmap::collectives::kAllowAllInterfacesEnvVar, c.allow_all ? "1" : "0", 1);
  ::execvp(c.program[0], c.program.data());
  std::fprintf(stderr, "launch: cannot execute '%s': %s\n", c.program[0], std::strerror(errno));
  _exit(127);
}

}  // namespace

int main(int argc, char** argv) {
  // Flags end at "--"; everything after it is the program and its own flags.
  int split = 1;
  while (split < argc && std::strcmp(argv[split], "--") != 0) ++split;
  if (absl::Status s = shardmap::base::ParseFlagsOnly(
          split, argv,
          {.usage = "torchrun-style launcher: launch [flags] -- program [args...]\n"
                    "Starts --nproc_per_node ranks of the program with RANK, LOCAL_RANK, "
                    "WORLD_SIZE,\nLOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT and "
                    "SHARDMAP_STORE_TOKEN set; prefixes their\noutput with \"[rank R] \"; stops "
                    "every rank when one fails or on SIGINT/SIGTERM/SIGHUP.",
           .positional_hint = "put the program after --"});
      !s.ok()) {
    return Usage(std::string(s.message()));
  }
  Config c;
  if (absl::Status s = ReadConfig(c); !s.ok()) return Usage(std::string(s.message()));
  if (split + 1 >= argc) return Usage("no program given after --");
  c.program.assign(argv + split + 1, argv + argc);
  c.program.push_back(nullptr);

  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  for (int s : {SIGINT, SIGTERM, SIGHUP}) sigaction(s, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
  std::fflush(nullptr);  // from here on only the writers write to stdout and stderr
  g_out = new Writer(1);
  g_err = new Writer(2);

  const pid_t self = ::getpid();
  std::vector<Child> children(c.nproc);
  for (int r = 0; r < c.nproc; ++r) {
    const int rank = c.node_rank * c.nproc + r;
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) {
      std::perror("launch: pipe");
      return 1;
    }
    pid_t pid = ::fork();
    if (pid < 0) {
      std::perror("launch: fork");
      return 1;
    }
    if (pid == 0) {
      ::close(fds[0]);
      ExecRank(c, r, fds[1], self);
    }
    ::setpgid(pid, pid);  // also here, so the group exists before we may signal it
    ::close(fds[1]);
    ::fcntl(fds[0], F_SETFL, ::fcntl(fds[0], F_GETFL) | O_NONBLOCK);
    children[r] = Child{rank, pid, fds[0]};
  }

  using Clock = std::chrono::steady_clock;
  int failed_rank = -1, stop_signal = 0;
  std::string failure;
  bool stopping = false;
  Clock::time_point kill_at{};
  auto signal_groups = [&](int signo) {
    // Exited ranks too: their helpers may still run in the group.
    for (const Child& ch : children) ::kill(-ch.pid, signo);
  };
  auto stop_all = [&](int signo, const std::string& why) {
    if (stopping) return;
    stopping = true;
    signal_groups(signo);
    kill_at = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(c.grace_s * 1000));
    Say(absl::StrCat("launch: ", why, "; stopping every rank\n"));
  };
  Clock::time_point all_exited{};
  bool any_running = true, killed = false;
  while (true) {
    std::vector<pollfd> fds;
    std::vector<Child*> owners;
    // While stdout's queue is full the ranks' pipes are left alone (backpressure); reaping and
    // signals below go on.
    const bool room = !g_out->Full();
    for (Child& ch : children) {
      if (room && ch.out_fd >= 0) {
        fds.push_back({ch.out_fd, POLLIN, 0});
        owners.push_back(&ch);
      }
    }
    if (!any_running && std::none_of(children.begin(), children.end(),
                                     [](const Child& ch) { return ch.out_fd >= 0; })) {
      break;
    }
    // Grandchildren could keep a pipe open after every rank exited: do not wait for them long.
    if (!any_running && Clock::now() - all_exited > std::chrono::seconds(1)) break;
    ::poll(fds.data(), fds.size(), room ? 50 : 10);
    for (size_t k = 0; k < fds.size(); ++k) {
      if (fds[k].revents) Drain(*owners[k]);
    }
    any_running = false;
    for (Child& ch : children) {
      if (!ch.running) continue;
      int status;
      if (::waitpid(ch.pid, &status, WNOHANG) != ch.pid) {
        any_running = true;
        continue;
      }
      ch.running = false;
      const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      if (!ok && !stopping) {
        failed_rank = ch.rank;
        failure = DescribeStatus(status);
        stop_all(SIGTERM, absl::StrCat("rank ", ch.rank, " failed first (", failure, ")"));
      }
    }
    if (!any_running && all_exited == Clock::time_point{}) all_exited = Clock::now();
    if (g_signal != 0 && !stopping) {
      stop_signal = g_signal;
      stop_all(stop_signal, absl::StrCat("received signal ", stop_signal, " (",
                                         strsignal(stop_signal), ")"));
    }
    if (stopping && !killed && Clock::now() >= kill_at) {
      signal_groups(SIGKILL);
      killed = true;
    }
  }
  if (stopping) signal_groups(SIGKILL);  // whatever is left of the ranks' groups
  for (Child& ch : children) {
    if (ch.out_fd >= 0) ::close(ch.out_fd);
  }
  int code = 0;
  if (failed_rank >= 0) {
    Say(absl::StrCat("launch: rank ", failed_rank, " failed first (", failure,
                     "); the other ranks were stopped\n"));
    code = 1;
  } else if (stop_signal != 0) {
    Say(absl::StrCat("launch: stopped by signal ", stop_signal, " (", strsignal(stop_signal),
                     ")\n"));
    code = 128 + stop_signal;
  }
  // Whoever reads our output gets a bounded time to take the rest; a reader that is gone or
  // stuck must not keep the launcher (and the job's exit code) from its caller.
  const auto patience = std::chrono::milliseconds(2000);
  if (const size_t left = g_out->Drain(patience); left > 0) {
    Say(absl::StrCat("launch: ", left, " bytes of rank output were dropped: stdout was not "
                     "being read\n"));
  }
  g_err->Drain(patience);
  std::_Exit(code);  // the writer threads may be blocked in write(): do not wait for them
}
