// Gloo backend: one rank per process (or per thread, each with its own context), host memory,
// over Gloo's TCP transport (Debian's libgloo). Rendezvous through the project's TcpStore, so it
// starts from the same torchrun / Slurm environment as the NCCL backend.
//
//   // Started by `collectives/launch --nproc_per_node=4 -- prog` or torchrun / srun:
//   absl::StatusOr<std::unique_ptr<Communicator>> comm = CreateGlooCommunicatorFromEnv({});
//   std::vector<float> x(1024, (*comm)->rank());
//   (*comm)->AllReduce(x.data(), x.data(), x.size(), DataType::kF32, ReduceOp::kSum);
//
// Semantics are the in-process backend's (collectives/README.md): reductions run in rank order
// 0..n-1 with the shared CPU kernel (bf16/f16 accumulate in f32, round once), so every rank gets
// the same bits, and the same bits as RunInProcess. Every collective first exchanges a small call
// descriptor with its peers (with the caller's CallTag: op, axes, shape, program order), so
// mismatched calls, and calls reordered across groups, fail with InvalidArgument on every rank
// instead of corrupting memory or pairing the wrong peers. Any failure (a peer process that died, a peer silent for `timeout`, bad
// arguments, a mismatch) poisons the world: this rank closes its connections of every group of
// the world, so peers waiting on it fail at once naming it, and later calls fail too.
//
// AllReduceStart / AllGatherStart / ReduceScatterStart overlap (OverlapsStartedCalls): they run
// on a background thread of the communicator over a duplicate group (async_lane.h), opened by
// the first started call (a Split every rank makes there). A failure on either thread fails
// both, and the peers' started calls get the failing rank's status as its blocking calls do.
#ifndef SHARDMAP_COLLECTIVES_GLOO_COMMUNICATOR_H_
#define SHARDMAP_COLLECTIVES_GLOO_COMMUNICATOR_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "collectives/communicator.h"
#include "collectives/tcp_store.h"

namespace shardmap::collectives {

struct GlooOptions {
  // Longest wait for a peer in one call (and for the connection setup) before the call fails
  // naming the peer it waited for.
  absl::Duration timeout = absl::Minutes(5);
  // Address the transport listens on and advertises to peers. Empty: CreateGlooCommunicator
  // uses 127.0.0.1; CreateGlooCommunicatorFromEnv uses 127.0.0.1 when MASTER_ADDR is a loopback
  // address and this host's name otherwise (multi-node).
  std::string hostname;
  // Network interface to use instead of `hostname` (like GLOO_SOCKET_IFNAME, which the FromEnv
  // factory reads when this is empty).
  std::string iface;
  // Prefix of this world's keys in the store; distinct worlds on one store need distinct ones.
  std::string store_prefix = "gloo";
};

// Collective over all ranks of `store` (every rank calls it). The world and the communicators
// split from it keep the store: Split rendezvous through it.
absl::StatusOr<std::unique_ptr<Communicator>> CreateGlooCommunicator(
    std::shared_ptr<TcpStore> store, const GlooOptions& options);

// Reads DistributedEnv (RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT or Slurm's variables) and
// rendezvous through a TcpStore at MASTER_ADDR:MASTER_PORT.
absl::StatusOr<std::unique_ptr<Communicator>> CreateGlooCommunicatorFromEnv(
    const GlooOptions& options);

}  // namespace shardmap::collectives

#endif  // SHARDMAP_COLLECTIVES_GLOO_COMMUNICATOR_H_
