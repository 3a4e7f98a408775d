#include "collectives/distributed_env.h"

#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace shardmap::collectives {
namespace {

constexpr char kHelp[] =
    " (expected torchrun's RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT, or Slurm's "
    "SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID with MASTER_ADDR and MASTER_PORT; "
    "plus SHARDMAP_STORE_TOKEN; `collectives/launch --nproc_per_node=N -- prog` sets them all)";

absl::StatusOr<int> ReadInt(const std::function<const char*(const char*)>& getenv,
                            const char* name, int min, int max) {
  const char* v = getenv(name);
  if (v == nullptr) return absl::NotFoundError(absl::StrCat(name, " is not set", kHelp));
  int x;
  if (!absl::SimpleAtoi(v, &x)) {
    return absl::InvalidArgumentError(absl::StrCat(name, "='", v, "' is not an integer"));
  }
  if (x < min || x > max) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, "=", x, " is outside [", min, ", ", max, "]"));
  }
  return x;
}

}  // namespace

absl::StatusOr<DistributedEnv> ParseDistributedEnv(
    const std::function<const char*(const char*)>& getenv) {
  DistributedEnv env;
  const bool torchrun = getenv("RANK") != nullptr || getenv("WORLD_SIZE") != nullptr;
  const bool slurm = getenv("SLURM_PROCID") != nullptr;
  if (!torchrun && !slurm) {
    return absl::NotFoundError(absl::StrCat("no distributed environment found", kHelp));
  }
  const char* rank_var = torchrun ? "RANK" : "SLURM_PROCID";
  const char* size_var = torchrun ? "WORLD_SIZE" : "SLURM_NTASKS";
  const char* local_var = torchrun ? "LOCAL_RANK" : "SLURM_LOCALID";
  env.source = torchrun ? "torchrun" : "slurm";
  auto size = ReadInt(getenv, size_var, 1, 1 << 24);
  if (!size.ok()) return size.status();
  env.world_size = *size;
  auto rank = ReadInt(getenv, rank_var, 0, env.world_size - 1);
  if (!rank.ok()) {
    if (absl::IsInvalidArgument(rank.status())) {
      return absl::InvalidArgumentError(absl::StrCat(rank.status().message(), " (", size_var,
                                                     "=", env.world_size, ")"));
    }
    return rank.status();
  }
  env.rank = *rank;
  // LOCAL_RANK is optional for a single-process job, otherwise required.
  if (getenv(local_var) != nullptr || env.world_size > 1) {
    auto local = ReadInt(getenv, local_var, 0, env.world_size - 1);
    if (!local.ok()) return local.status();
    env.local_rank = *local;
  }
  const char* addr = getenv("MASTER_ADDR");
  if (addr == nullptr || addr[0] == '\0') {
    if (env.world_size > 1) {
      return absl::NotFoundError(absl::StrCat("MASTER_ADDR is not set", kHelp));
    }
    addr = "127.0.0.1";
  }
  env.master_addr = addr;
  if (getenv("MASTER_PORT") != nullptr || env.world_size > 1) {
    auto port = ReadInt(getenv, "MASTER_PORT", 1, 65535);
    if (!port.ok()) return port.status();
    env.master_port = *port;
  }
  if (const char* all = getenv(kAllowAllInterfacesEnvVar); all != nullptr && all[0] != '\0') {
    const std::string v = all;
    if (v != "0" && v != "1") {
      return absl::InvalidArgumentError(absl::StrCat(
          kAllowAllInterfacesEnvVar, "='", v, "': expected 1 (rank 0's store may listen on every "
          "interface when MASTER_ADDR is a wildcard) or 0"));
    }
    env.allow_all_interfaces = v == "1";
  }
  const char* token = getenv(kStoreTokenEnvVar);
  if (token != nullptr) env.store_token = token;
  if (env.world_size > 1 || !env.store_token.empty()) {
    if (token == nullptr) {
      return absl::NotFoundError(absl::StrCat(
          kStoreTokenEnvVar, " is not set: the rendezvous store refuses ranks without the job's "
          "token. collectives/launch sets it; with torchrun or srun, export the same random "
          "value to every rank first, e.g. `export ", kStoreTokenEnvVar,
          "=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n')`"));
    }
    if (absl::Status s = CheckStoreToken(env.store_token); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(kStoreTokenEnvVar, ": ", s.message()));
    }
  }
  return env;
}

absl::StatusOr<DistributedEnv> DistributedEnvFromEnvironment() {
  return ParseDistributedEnv([](const char* name) { return std::getenv(name); });
}

}  // namespace shardmap::collectives
