// DistributedEnv: this process's place in a multi-process job, read from the environment the
// way torchrun and Slurm set it.
//
//   absl::StatusOr<DistributedEnv> env = DistributedEnvFromEnvironment();
//   // torchrun: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT
//   // Slurm:    SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, plus MASTER_ADDR, MASTER_PORT
//   // both:     SHARDMAP_STORE_TOKEN (the rendezvous store's secret, see tcp_store.h), and
//   //           SHARDMAP_STORE_ALLOW_ALL_INTERFACES=1 only to let a wildcard MASTER_ADDR bind
//   TcpStore::Create(env->store_options());
//
// torchrun's variables win when both sets are present. Missing or malformed variables give an
// error naming the variable and what was expected. collectives/launch sets all of them; with
// torchrun or srun, export SHARDMAP_STORE_TOKEN (the same random value for every rank) first:
//   export SHARDMAP_STORE_TOKEN=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
#ifndef SHARDMAP_COLLECTIVES_DISTRIBUTED_ENV_H_
#define SHARDMAP_COLLECTIVES_DISTRIBUTED_ENV_H_

#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "collectives/tcp_store.h"

namespace shardmap::collectives {

struct DistributedEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr;
  int master_port = 0;
  std::string source;  // "torchrun" or "slurm"
  // SHARDMAP_STORE_TOKEN; required when world_size > 1 (may be empty for one process).
  std::string store_token;
  // SHARDMAP_STORE_ALLOW_ALL_INTERFACES=1: rank 0 may bind a wildcard MASTER_ADDR (tcp_store.h).
  bool allow_all_interfaces = false;

  TcpStoreOptions store_options(absl::Duration timeout = absl::Seconds(60)) const {
    TcpStoreOptions o;
    o.host = master_addr;
    o.port = master_port;
    o.rank = rank;
    o.world_size = world_size;
    o.timeout = timeout;
    o.token = store_token;
    o.allow_all_interfaces = allow_all_interfaces;
    return o;
  }
};

// `getenv` returns nullptr for unset variables (tests pass a map lookup).
absl::StatusOr<DistributedEnv> ParseDistributedEnv(
    const std::function<const char*(const char*)>& getenv);

// Reads the process environment.
absl::StatusOr<DistributedEnv> DistributedEnvFromEnvironment();

}  // namespace shardmap::collectives

#endif  // SHARDMAP_COLLECTIVES_DISTRIBUTED_ENV_H_
