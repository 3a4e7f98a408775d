// Test program for launch_test: every rank joins a Gloo world from its environment and runs one
// all-reduce; a rank may stop itself (SIGSTOP) first, like a process a debugger or the OOM
// handling of a cluster froze.
//
//   launch --nproc_per_node=2 -- gloo_check --stop_rank=1 --timeout_s=2 --store_timeout_s=60
//   # rank 0 prints the timeout naming rank 1 and exits 1 soon after it (the store it serves
//   # does not wait the store's 60 s for the stopped rank).
#include <signal.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "base/command_line.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "collectives/distributed_env.h"
#include "collectives/gloo_communicator.h"
#include "collectives/tcp_store.h"

ABSL_FLAG(int, stop_rank, -1, "this rank stops itself with SIGSTOP before the all-reduce");
ABSL_FLAG(int, timeout_s, 30, "Gloo timeout in seconds, in [1, 3600]");
ABSL_FLAG(int, store_timeout_s, 30, "the rendezvous store's timeout in seconds, in [1, 3600]");

namespace {

int Fail(const std::string& what) {
  std::fprintf(stderr, "gloo_check: %s\n", what.c_str());
  std::fflush(stderr);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace shardmap::collectives;
  if (absl::Status s = shardmap::base::ParseFlagsOnly(
          argc, argv, {.usage = "gloo check: run it under collectives/launch; every rank joins a "
                                "Gloo world and runs one all-reduce."});
      !s.ok()) {
    return Fail(std::string(s.message()));
  }
  const int timeout_s = absl::GetFlag(FLAGS_timeout_s);
  const int store_timeout_s = absl::GetFlag(FLAGS_store_timeout_s);
  if (timeout_s < 1 || timeout_s > 3600 || store_timeout_s < 1 || store_timeout_s > 3600) {
    return Fail("--timeout_s and --store_timeout_s must be in [1, 3600]");
  }
  const absl::Time start = absl::Now();
  absl::Status result;
  {
    auto env = DistributedEnvFromEnvironment();
    if (!env.ok()) return Fail(env.status().ToString());
    auto store = TcpStore::Create(env->store_options(absl::Seconds(store_timeout_s)));
    if (!store.ok()) return Fail(store.status().ToString());
    GlooOptions o;
    o.timeout = absl::Seconds(timeout_s);
    o.hostname = "127.0.0.1";
    auto comm = CreateGlooCommunicator(std::shared_ptr<TcpStore>(std::move(*store)), o);
    if (!comm.ok()) return Fail(comm.status().ToString());
    if ((*comm)->rank() == absl::GetFlag(FLAGS_stop_rank)) ::raise(SIGSTOP);
    std::vector<float> x(1000, 1.0f);
    result = (*comm)->AllReduce(x.data(), x.data(), x.size(), DataType::kF32, ReduceOp::kSum);
    if (result.ok() && x[999] != static_cast<float>((*comm)->size())) {
      result = absl::InternalError(absl::StrCat("wrong sum ", x[999]));
    }
    std::printf("all-reduce after %.1f s: %s\n", absl::ToDoubleSeconds(absl::Now() - start),
                result.ToString().c_str());
    std::fflush(stdout);
  }  // the communicator, then the store (rank 0: its server) go away here
  std::printf("exiting after %.1f s\n", absl::ToDoubleSeconds(absl::Now() - start));
  return result.ok() ? 0 : 1;
}
