// Where a training run's ranks run and how they reach each other: threads of this process
// (placement.h), or with a process-per-rank backend (--backend=gloo/nccl) this process's rank of
// the launcher's world; and the check that every process was started with the same settings.
#ifndef SHARDMAP_MODELS_RUN_CONNECTION_H_
#define SHARDMAP_MODELS_RUN_CONNECTION_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "collectives/communicator.h"
#include "shardmap/device_placement.h"
#include "shardmap/mesh.h"

namespace shardmap {

struct RankWorld {
  // This process's rank of a process-per-rank world; null: the ranks are threads of this process.
  std::unique_ptr<collectives::Communicator> world;
  DevicePlacement placement;
  bool print = true;  // rank 0 prints (every process of a gloo run sees the same losses)
  int processes() const { return world != nullptr ? world->size() : 1; }
};

// `devices`: --devices=cpu:N's N (0: not given), which must equal the mesh's size; `timeout`:
// how long a rank waits for a peer (--collective_timeout).
absl::StatusOr<RankWorld> ConnectRanks(const Mesh& mesh, int devices, absl::Duration timeout);

// Every process of a multi-process run must be started with the same settings. Each rank
// hashes each of its trainer flags (output paths aside; the data by its tokens) and all_gathers
// the hashes; a flag whose hash differs from rank 0's is named, with this rank's value, on every
// rank before the first step (instead of a hang or a "lost rank" later).
absl::Status AgreeOnSettings(collectives::Communicator& world, const std::vector<int64_t>& tokens);

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_RUN_CONNECTION_H_
