// SimulatedLinkSpmdRunner: the SPMD runner (TrainOptions::hooks.spmd_runner) that runs every
// rank of a mesh as an in-process rank whose world communicator is wrapped in a simulated link
// (collectives/simulated_link.h), so a whole TrainGpt run pays the modelled link time on every
// collective, blocking or started, and its overlap can be measured on this machine.
//
//   TrainOptions o = ...;
//   std::vector<collectives::LinkStats> per_rank;   // filled when the run returns
//   o.hooks.spmd_runner = SimulatedLinkSpmdRunner({.ring = {.alpha_s = 20e-6, .busbw = 2e9}},
//                                                 &per_rank);
//   absl::StatusOr<TrainResult> r = TrainGpt(layout, init, tokens, o);
//
// A launched process (Gloo, --backend with collectives/launch) wraps its own world instead:
//   collectives::SimulatedLinkCommunicator slow(world.get(), link);  o.runtime.comm = &slow;
// Host memory only (the in-process ranks' default placement).
#ifndef SHARDMAP_MODELS_TRAIN_SIMULATED_LINK_RUNNER_H_
#define SHARDMAP_MODELS_TRAIN_SIMULATED_LINK_RUNNER_H_

#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "collectives/simulated_link.h"
#include "collectives/in_process.h"
#include "shardmap/mesh.h"
#include "shardmap/rank_context.h"

namespace shardmap {

// What TrainOptions::hooks.spmd_runner holds.
using SpmdRunnerFn =
    std::function<absl::Status(const Mesh&, const std::function<void(RankContext&)>&)>;

// stats (optional, not owned): resized to the mesh's ranks and filled with each rank's totals
// when the ranks return. `options`: the in-process world's (timeout, debug checks).
SpmdRunnerFn SimulatedLinkSpmdRunner(collectives::SimulatedLink link,
                                     std::vector<collectives::LinkStats>* stats = nullptr,
                                   collectives::InProcessOptions options = {});

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_TRAIN_SIMULATED_LINK_RUNNER_H_
