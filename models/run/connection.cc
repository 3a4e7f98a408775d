#include "models/run/connection.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "collectives/backend_registry.h"
#include "models/run/placement.h"
#include "models/run/train_flags.h"
#include "tensor/cuda/runtime.h"
#include "tensor/tensor.h"

namespace shardmap {

absl::StatusOr<RankWorld> ConnectRanks(const Mesh& mesh, int devices, absl::Duration timeout) {
  if (devices != 0 && devices != mesh.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--devices cpu:", devices, " but the mesh ", mesh.ShortString(), " has ", mesh.size(),
        " ranks; make them equal (or leave --devices out)"));
  }
  RankWorld out;
  collectives::ProcessWorldOptions world_options;
  world_options.timeout = timeout;
  absl::StatusOr<std::unique_ptr<collectives::Communicator>> connected =
      collectives::ConnectTrainingWorld(absl::GetFlag(FLAGS_backend), mesh.size(),
                                        absl::GetFlag(FLAGS_device) == "cuda", world_options);
  if (!connected.ok()) return connected.status();
  out.world = *std::move(connected);
  if (out.world == nullptr) {
    absl::StatusOr<DevicePlacement> placement = ResolvePlacement(mesh);
    if (!placement.ok()) return placement.status();
    out.placement = *placement;
  } else if (absl::Status s = CheckPlacementFlags(); !s.ok()) {
    return s;
  }
  out.print = out.world == nullptr || out.world->rank() == 0;
  return out;
}

absl::Status AgreeOnSettings(collectives::Communicator& world,
                             const std::vector<int64_t>& tokens) {
  std::vector<std::pair<std::string, std::string>> settings;  // name, value
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (!IsTrainFlagFile(flag->Filename())) continue;
    const std::string n(name);
    if (n == "save" || n == "trace" || n == "data" || n == "text" || n == "tokenizer") continue;
    settings.emplace_back(n, flag->CurrentValue());
  }
  std::sort(settings.begin(), settings.end());
  uint64_t data_hash = 1469598103934665603ull;  // FNV-1a over the token ids
  for (int64_t t : tokens) data_hash = (data_hash ^ static_cast<uint64_t>(t)) * 1099511628211ull;
  settings.emplace_back("data", absl::StrCat("tokens with hash ", data_hash, " (",
                                             tokens.size(), " tokens)"));
  const size_t n = settings.size();
  std::vector<int64_t> mine(n), all(n * world.size());
  for (size_t i = 0; i < n; ++i) {
    uint64_t h = 1469598103934665603ull;
    for (unsigned char ch : settings[i].first + "=" + settings[i].second) {
      h = (h ^ ch) * 1099511628211ull;
    }
    mine[i] = static_cast<int64_t>(h);
  }
  absl::Status gathered;
  if (world.memory_space().device) {
    // NCCL works on device memory: the hashes go through buffers on this rank's GPU.
    const Device gpu = Device::Cuda(world.memory_space().device_index);
    Tensor send = Tensor::FromVector<int64_t>({static_cast<int64_t>(n)}, mine).To(gpu);
    Tensor recv = Tensor::Empty({static_cast<int64_t>(n) * world.size()}, DType::kI64, gpu);
    cuda::Synchronize(gpu.index);  // the copy is done before the communicator's stream reads it
    gathered = world.AllGather(send.raw_data(), recv.raw_data(), n, collectives::DataType::kI64);
    if (gathered.ok()) {
      // NCCL's call returns once enqueued on its stream: read there (ordered after it), then
      // ask whether it failed meanwhile.
      cuda::StreamScope on_comm(gpu.index,
                                static_cast<cuda::StreamHandle>(world.memory_space().stream));
      all = recv.To(Device::Cpu()).ToVector<int64_t>();
      gathered = world.AsyncError();
    }
  } else {
    gathered = world.AllGather(mine.data(), all.data(), n, collectives::DataType::kI64);
  }
  if (!gathered.ok()) {
    return absl::Status(gathered.code(),
                        absl::StrCat("agreeing on the run's settings: ", gathered.message()));
  }
  std::vector<std::string> differ;
  for (size_t i = 0; i < n; ++i) {
    std::vector<int> ranks;
    for (int r = 1; r < world.size(); ++r) {
      if (all[r * n + i] != all[i]) ranks.push_back(r);
    }
    if (!ranks.empty()) {
      differ.push_back(absl::StrCat("--", settings[i].first, " (rank ", absl::StrJoin(ranks, ", "),
                                    " differ", ranks.size() == 1 ? "s" : "",
                                    " from rank 0; this rank, ", world.rank(), ", has ",
                                    settings[i].second, ")"));
    }
  }
  if (differ.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "the processes were started with different settings: ", absl::StrJoin(differ, "; "),
      "; start every rank with the same flags"));
}

}  // namespace shardmap
