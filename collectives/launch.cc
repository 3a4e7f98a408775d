// launch: a torchrun-style local launcher. Starts N processes of a program with the
// environment DistributedEnv reads, prefixes their output with the rank, and if one fails, stops
// the others and exits non-zero naming the failed rank.
//
//   bazel-bin/collectives/launch --nproc_per_node=4 -- bazel-bin/my/train --steps=10
//   # each child gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1,
//   # MASTER_PORT=<a free port>; output lines come back as "[rank 2] ..."
//
// Flags (before `--`): --nproc_per_node=N (or --nproc-per-node), --master_port=P (default: a
// free port), --grace_period_s=S (SIGTERM to SIGKILL delay when stopping ranks, default 3).
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "collectives/internal/free_port.h"

namespace {

volatile sig_atomic_t g_interrupted = 0;
void OnSignal(int) { g_interrupted = 1; }

struct Child {
  int rank = 0;
  pid_t pid = -1;
  int out_fd = -1;  // stdout and stderr of the child, merged
  std::string pending;  // a partial line
  bool running = true;
  int status = 0;
};

int Usage(const char* msg) {
  std::fprintf(stderr,
               "launch: %s\nusage: launch --nproc_per_node=N [--master_port=P] "
               "[--grace_period_s=S] -- program [args...]\n",
               msg);
  return 2;
}

void Emit(int rank, const std::string& line) {
  std::string out = absl::StrCat("[rank ", rank, "] ", line, "\n");
  std::fwrite(out.data(), 1, out.size(), stdout);
  std::fflush(stdout);
}

// Reads what is available; returns false at EOF.
bool Drain(Child& c) {
  char buf[65536];
  ssize_t n = ::read(c.out_fd, buf, sizeof(buf));
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return true;
  if (n <= 0) {
    if (!c.pending.empty()) Emit(c.rank, c.pending);
    c.pending.clear();
    ::close(c.out_fd);
    c.out_fd = -1;
    return false;
  }
  c.pending.append(buf, static_cast<size_t>(n));
  size_t pos;
  while ((pos = c.pending.find('\n')) != std::string::npos) {
    Emit(c.rank, c.pending.substr(0, pos));
    c.pending.erase(0, pos + 1);
  }
  return true;
}

std::string DescribeStatus(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exit code ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return absl::StrCat("killed by signal ", WTERMSIG(status), " (", strsignal(WTERMSIG(status)),
                        ")");
  }
  return "unknown status";
}

}  // namespace

int main(int argc, char** argv) {
  int nproc = -1, port = 0;
  double grace_s = 3;
  int i = 1;
  for (; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--") { ++i; break; }
    std::string v;
    auto flag = [&](const char* name) {
      const std::string p = absl::StrCat(name, "=");
      if (!absl::StartsWith(a, p)) return false;
      v = a.substr(p.size());
      return true;
    };
    if (flag("--nproc_per_node") || flag("--nproc-per-node")) {
      if (!absl::SimpleAtoi(v, &nproc) || nproc < 1 || nproc > 4096) {
        return Usage(absl::StrCat("--nproc_per_node must be an integer in [1, 4096], got '", v,
                                  "'").c_str());
      }
    } else if (flag("--master_port") || flag("--master-port")) {
      if (!absl::SimpleAtoi(v, &port) || port < 1 || port > 65535) {
        return Usage(absl::StrCat("--master_port must be in [1, 65535], got '", v, "'").c_str());
      }
    } else if (flag("--grace_period_s")) {
      if (!absl::SimpleAtod(v, &grace_s) || grace_s < 0) {
        return Usage("--grace_period_s must be a non-negative number");
      }
    } else {
      return Usage(absl::StrCat("unknown flag '", a, "' (put the program after --)").c_str());
    }
  }
  if (nproc < 0) return Usage("--nproc_per_node is required");
  if (i >= argc) return Usage("no program given after --");
  if (port == 0) {
    auto p = shardmap::collectives::internal::PickFreePort();
    if (!p.ok()) return Usage(std::string(p.status().message()).c_str());
    port = *p;
  }

  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);

  std::vector<Child> children(nproc);
  for (int r = 0; r < nproc; ++r) {
    int fds[2];
    if (::pipe(fds) != 0) {
      std::perror("launch: pipe");
      return 1;
    }
    pid_t pid = ::fork();
    if (pid < 0) {
      std::perror("launch: fork");
      return 1;
    }
    if (pid == 0) {
      ::setpgid(0, 0);  // its own process group: stopping a rank stops its helpers too
      ::dup2(fds[1], 1);
      ::dup2(fds[1], 2);
      ::close(fds[0]);
      ::close(fds[1]);
      setenv("RANK", std::to_string(r).c_str(), 1);
      setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(nproc).c_str(), 1);
      setenv("LOCAL_WORLD_SIZE", std::to_string(nproc).c_str(), 1);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      ::execvp(argv[i], argv + i);
      std::fprintf(stderr, "launch: cannot execute '%s': %s\n", argv[i], std::strerror(errno));
      _exit(127);
    }
    ::setpgid(pid, pid);
    ::close(fds[1]);
    ::fcntl(fds[0], F_SETFL, ::fcntl(fds[0], F_GETFL) | O_NONBLOCK);
    children[r] = Child{r, pid, fds[0]};
  }

  using Clock = std::chrono::steady_clock;
  int failed_rank = -1;
  std::string failure;
  bool stopping = false;
  Clock::time_point kill_at{};
  auto stop_all = [&](const char* why) {
    if (stopping) return;
    stopping = true;
    for (auto& c : children) {
      if (c.running) ::kill(-c.pid, SIGTERM);
    }
    kill_at = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(grace_s * 1000));
    std::fprintf(stderr, "launch: %s; stopping the other ranks\n", why);
  };
  Clock::time_point all_exited{};
  bool any_running = true;
  while (true) {
    std::vector<pollfd> fds;
    std::vector<Child*> owners;
    for (auto& c : children) {
      if (c.out_fd >= 0) {
        fds.push_back({c.out_fd, POLLIN, 0});
        owners.push_back(&c);
      }
    }
    if (fds.empty() && !any_running) break;
    // Grandchildren could keep a pipe open after every rank exited: do not wait for them long.
    if (!any_running && Clock::now() - all_exited > std::chrono::seconds(1)) break;
    ::poll(fds.data(), fds.size(), 50);
    for (size_t k = 0; k < fds.size(); ++k) {
      if (fds[k].revents) Drain(*owners[k]);
    }
    any_running = false;
    for (auto& c : children) {
      if (!c.running) continue;
      int status;
      pid_t w = ::waitpid(c.pid, &status, WNOHANG);
      if (w == c.pid) {
        c.running = false;
        c.status = status;
        const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        if (!ok && !stopping) {
          failed_rank = c.rank;
          failure = DescribeStatus(status);
          stop_all(absl::StrCat("rank ", c.rank, " failed (", failure, ")").c_str());
        }
      } else {
        any_running = true;
      }
    }
    if (!any_running && all_exited == Clock::time_point{}) all_exited = Clock::now();
    if (g_interrupted && !stopping) stop_all("interrupted");
    if (stopping && any_running && Clock::now() >= kill_at) {
      for (auto& c : children) {
        if (c.running) ::kill(-c.pid, SIGKILL);
      }
    }
  }
  for (auto& c : children) {
    if (c.out_fd >= 0) ::close(c.out_fd);
  }
  if (failed_rank >= 0) {
    std::fprintf(stderr, "launch: rank %d failed (%s); the other ranks were stopped\n",
                 failed_rank, failure.c_str());
    return 1;
  }
  if (g_interrupted) {
    std::fprintf(stderr, "launch: interrupted\n");
    return 130;
  }
  return 0;
}
