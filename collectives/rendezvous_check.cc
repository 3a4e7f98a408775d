// Test program for launch_test: every rank joins the TcpStore from its environment, rank 0
// publishes a random blob, and every rank checks it got the same bytes.
//
//   launch --nproc_per_node=3 -- rendezvous_check [--fail_rank=K] [--timeout_s=30]
//   # rank K exits with code 3 before the rendezvous (the others then block in it).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "base/command_line.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "collectives/distributed_env.h"
#include "collectives/tcp_store.h"

ABSL_FLAG(int, fail_rank, -1, "this rank exits with code 3 before the rendezvous (-1: none)");
ABSL_FLAG(int, timeout_s, 30, "rendezvous timeout in seconds, in [1, 3600]");

namespace {

uint64_t Fnv(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

int Fail(const std::string& what) {
  std::fprintf(stderr, "rendezvous_check: %s\n", what.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  using shardmap::collectives::DistributedEnvFromEnvironment;
  using shardmap::collectives::TcpStore;
  if (absl::Status s = shardmap::base::ParseFlagsOnly(
          argc, argv,
          {.usage = "rendezvous check: run it under collectives/launch (or torchrun / srun with\n"
                    "SHARDMAP_STORE_TOKEN exported); every rank must read the same random blob "
                    "from rank 0."});
      !s.ok()) {
    return Fail(std::string(s.message()));
  }
  const int fail_rank = absl::GetFlag(FLAGS_fail_rank);
  const int timeout_s = absl::GetFlag(FLAGS_timeout_s);
  if (timeout_s < 1 || timeout_s > 3600) {
    return Fail(absl::StrCat("--timeout_s must be in [1, 3600], got ", timeout_s));
  }
  auto env = DistributedEnvFromEnvironment();
  if (!env.ok()) return Fail(env.status().ToString());
  if (env->rank == fail_rank) {
    std::printf("rank %d failing on purpose\n", env->rank);
    return 3;
  }
  auto store = TcpStore::Create(env->store_options(absl::Seconds(timeout_s)));
  if (!store.ok()) return Fail(store.status().ToString());
  if (env->rank == 0) {
    std::mt19937_64 gen(std::random_device{}() ^ static_cast<uint64_t>(getpid()));
    std::string blob(128, '\0');  // the size of an ncclUniqueId
    for (char& c : blob) c = static_cast<char>(gen());
    if (auto s = (*store)->Set("blob", blob); !s.ok()) return Fail(s.ToString());
  }
  auto blob = (*store)->Get("blob");
  if (!blob.ok()) return Fail(blob.status().ToString());
  const std::string digest = absl::StrCat(Fnv(*blob));
  if (auto s = (*store)->Set(absl::StrCat("digest/", env->rank), digest); !s.ok()) {
    return Fail(s.ToString());
  }
  if (auto s = (*store)->Barrier("digests"); !s.ok()) return Fail(s.ToString());
  for (int r = 0; r < env->world_size; ++r) {
    auto d = (*store)->Get(absl::StrCat("digest/", r));
    if (!d.ok()) return Fail(d.status().ToString());
    if (*d != digest) return Fail(absl::StrCat("rank ", r, " got a different blob"));
  }
  if (auto s = (*store)->Barrier("end"); !s.ok()) return Fail(s.ToString());
  std::printf("rendezvous ok: %d ranks agree on blob %s (local rank %d)\n", env->world_size,
              digest.c_str(), env->local_rank);
  return 0;
}
