// RunGlooThreads: N ranks as N threads of this process, each with its own Gloo communicator
// (its own TCP store client, transport device and connections over loopback), for tests and
// benchmarks that want real Gloo traffic without launching processes. Real jobs use one process
// per rank (CreateGlooCommunicatorFromEnv).
//
//   absl::Status s = RunGlooThreads(4, [](Communicator& comm) -> absl::Status {
//     float x = comm.rank();
//     return comm.AllReduce(&x, &x, 1, DataType::kF32, ReduceOp::kSum);   // x == 6 everywhere
//   });
//
// Returns OK when every rank's function did, else the first failure by rank, annotated with it.
// A rank that fails closes its connections, so its peers fail too instead of waiting.
#ifndef SHARDMAP_COLLECTIVES_GLOO_THREADS_H_
#define SHARDMAP_COLLECTIVES_GLOO_THREADS_H_

#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "collectives/communicator.h"
#include "collectives/gloo_communicator.h"

namespace shardmap::collectives {

// Every rank's status (index = rank); `fn` is not called on a rank whose setup failed.
std::vector<absl::Status> RunGlooThreadsEach(
    int world_size, const std::function<absl::Status(Communicator&)>& fn,
    const GlooOptions& options = {});

absl::Status RunGlooThreads(int world_size, const std::function<absl::Status(Communicator&)>& fn,
                            const GlooOptions& options = {});

}  // namespace shardmap::collectives

#endif  // SHARDMAP_COLLECTIVES_GLOO_THREADS_H_
