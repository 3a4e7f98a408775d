// NCCL backend: one rank per process (and per GPU), across nodes. Rendezvous through a TcpStore
// (rank 0 creates the ncclUniqueId and serves it); sub-groups through ncclCommSplit.
// Communicators are non-blocking (ncclConfig_t::blocking = 0): every call polls
// ncclCommGetAsyncError while it waits, and on an error or after `timeout` aborts the
// communicator (ncclCommAbort) and returns a Status naming the op, the group and the reason.
//
//   // Started by `collectives/launch --nproc_per_node=8 -- prog` or torchrun / srun:
//   absl::StatusOr<std::unique_ptr<Communicator>> comm = CreateNcclCommunicatorFromEnv({});
//   // buffers are device pointers on comm->memory_space().device_index, ordered on its stream;
//   // calls return once the stream finished the collective (host-blocking, like in-process).
//   (*comm)->AllReduce(d_x, d_x, n, DataType::kBF16, ReduceOp::kSum);
//
// Without the CUDA toolkit at build time, the factories return Unimplemented.
#ifndef SHARDMAP_COLLECTIVES_NCCL_COMMUNICATOR_H_
#define SHARDMAP_COLLECTIVES_NCCL_COMMUNICATOR_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "collectives/communicator.h"
#include "collectives/tcp_store.h"

namespace shardmap::collectives {

struct NcclOptions {
  // How long one call (or the initialisation) may take before the communicator is aborted.
  absl::Duration timeout = absl::Minutes(5);
  // CUDA device of this rank; -1: LOCAL_RANK modulo the visible device count.
  int device = -1;
  // cudaStream_t the collectives run on; nullptr: the communicator creates its own.
  void* stream = nullptr;
};

// True when built with CUDA and NCCL.
bool NcclCompiledIn();

// Collective over all ranks of `store`: every rank calls it. The store is only used during the
// call (keys "nccl/..."), so it may be destroyed afterwards once every rank returned.
absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(TcpStore& store,
                                                                     const NcclOptions& options);

// Reads DistributedEnv, rendezvous through a TcpStore at MASTER_ADDR:MASTER_PORT.
absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicatorFromEnv(
    const NcclOptions& options);

namespace internal {
// The store key CreateNcclCommunicator publishes the next unique id under: numbered by a
// counter in `store` (per store, per rank), so communicators made through several stores in
// uneven numbers still agree on their keys. Exposed for nccl_unique_id_key_test.
absl::StatusOr<std::string> NextNcclUniqueIdKey(TcpStore& store);
}  // namespace internal

}  // namespace shardmap::collectives

#endif  // SHARDMAP_COLLECTIVES_NCCL_COMMUNICATOR_H_
