// Running SPMD code: RunSpmd starts mesh.size() in-process ranks (threads, on the placement's
// devices), RunOnCommunicator runs this process's rank over an existing communicator (the
// multi-process local view). Each installs the rank's RankContext for the body.
//
//   absl::Status s = RunSpmd(*Mesh::Create({{"dp", 2}, {"tp", 3}}), [&](RankContext& ctx) {
//     ...typed ops and collectives...
//   });
#ifndef SHARDMAP_SHARDMAP_RUNTIME_SPMD_RUNNER_H_
#define SHARDMAP_SHARDMAP_RUNTIME_SPMD_RUNNER_H_

#include <functional>

#include "absl/status/status.h"
#include "collectives/communicator.h"
#include "collectives/in_process.h"
#include "shardmap/runtime/device_placement.h"
#include "shardmap/mesh.h"
#include "shardmap/runtime/rank_context.h"

namespace shardmap {

struct SpmdOptions {
  TypeCheck check = TypeCheck::kOn;
  collectives::InProcessOptions comm;
  // Where the ranks run. A GPU placement sets comm.memory_space (device, index, the rank's
  // stream); leave comm.memory_space unset then. With the default (CPU) placement, a
  // comm.memory_space that puts ranks on GPUs places them there too.
  DevicePlacement placement;
};
// Runs body on mesh.size() in-process ranks, each with its RankContext installed. An OpError (or
// another exception) thrown by a rank becomes that rank's Status; a failing rank poisons the world
// so the others do not hang. Returns the first failure, annotated with its rank and coordinates.
absl::Status RunSpmd(const Mesh& mesh, const std::function<void(RankContext&)>& body,
                     const SpmdOptions& options = {});

// Runs body with a RankContext over an existing communicator (the local view in a multi-process
// program: comm is this process's world, comm.size() == mesh.size()). When the communicator
// works on device memory (NCCL), the rank runs on that GPU: the thread is bound to the
// communicator's device and stream for the body (so kernels and collectives are ordered on one
// stream), ctx.device() is that GPU, and the stream is synchronised before returning.
absl::Status RunOnCommunicator(collectives::Communicator& comm, const Mesh& mesh,
                               const std::function<void(RankContext&)>& body,
                               TypeCheck check = TypeCheck::kOn);

}  // namespace shardmap

#endif  // SHARDMAP_SHARDMAP_RUNTIME_SPMD_RUNNER_H_
