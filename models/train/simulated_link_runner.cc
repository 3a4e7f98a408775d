#include "models/train/simulated_link_runner.h"

#include <utility>

#include "shardmap/collective_recorder.h"
#include "shardmap/spmd_runner.h"

namespace shardmap {

SpmdRunnerFn SimulatedLinkSpmdRunner(collectives::SimulatedLink link,
                                     std::vector<collectives::LinkStats>* stats,
                                   collectives::InProcessOptions options) {
  return [link, stats, options = std::move(options)](
             const Mesh& mesh, const std::function<void(RankContext&)>& body) -> absl::Status {
    if (absl::Status s = collectives::SimulatedLinkCommunicator::Check(link); !s.ok()) return s;
    if (stats != nullptr) stats->assign(mesh.size(), collectives::LinkStats{});
    // The rank threads record into the recorders of this thread, as RunSpmd's do.
    const std::vector<CollectiveRecorder*> recorders = internal::ActiveRecorders();
    return collectives::RunInProcess(
        mesh.size(),
        [&](collectives::Communicator& world) -> absl::Status {
          internal::ScopedInheritedRecorders inherit(recorders);
          collectives::SimulatedLinkCommunicator slow(&world, link);
          absl::Status s = RunOnCommunicator(slow, mesh, body);
          if (stats != nullptr) (*stats)[world.rank()] = slow.stats();
          return s;
        },
        options);
  };
}

}  // namespace shardmap
