// DistributedEnv: this process's place in a multi-process job, read from the environment the
// way torchrun and Slurm set it.
//
//   absl::StatusOr<DistributedEnv> env = DistributedEnvFromEnvironment();
//   // torchrun: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT
//   // Slurm:    SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, plus MASTER_ADDR, MASTER_PORT
//   TcpStore::Create(env->store_options());
//
// torchrun's variables win when both sets are present. Missing or malformed variables give an
// error naming the variable and what was expected.
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

  TcpStoreOptions store_options(absl::Duration timeout = absl::Seconds(60)) const {
    return TcpStoreOptions{master_addr, master_port, rank, world_size, timeout};
  }
};

// `getenv` returns nullptr for unset variables (tests pass a map lookup).
absl::StatusOr<DistributedEnv> ParseDistributedEnv(
    const std::function<const char*(const char*)>& getenv);

// Reads the process environment.
absl::StatusOr<DistributedEnv> DistributedEnvFromEnvironment();

}  // namespace shardmap::collectives

#endif  // SHARDMAP_COLLECTIVES_DISTRIBUTED_ENV_H_
