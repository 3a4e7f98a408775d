#include "shardmap/runtime/device_placement.h"

#include <map>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "shardmap/runtime/spmd_runner.h"
#include "tensor/cuda/runtime.h"
#include "tensor/error.h"

namespace shardmap {

std::string DevicePlacement::ToString() const {
  switch (kind) {
    case Kind::kCpu: return "cpu";
    case Kind::kGpuPerRank: return "gpu-per-rank";
    case Kind::kSharedGpu: return absl::StrCat("shared-gpu(", shared_gpu, ")");
    case Kind::kCustom: return "custom";
  }
  return "?";
}

absl::StatusOr<std::vector<Device>> ResolvePlacement(const DevicePlacement& placement,
                                                     int world_size) {
  std::vector<Device> devices(world_size, Device::Cpu());
  if (placement.is_cpu()) return devices;
  auto no_gpu = [&]() {
    return absl::FailedPreconditionError(absl::StrCat(
        "device placement ", placement.ToString(), " needs a GPU but none is usable: ",
        cuda::UnavailableReason(), "; run on the CPU (DevicePlacement::Cpu(), the default)"));
  };
  const int gpus = cuda::DeviceCount();
  switch (placement.kind) {
    case DevicePlacement::Kind::kCpu:
      return devices;
    case DevicePlacement::Kind::kGpuPerRank:
      if (gpus == 0) return no_gpu();
      if (gpus < world_size) {
        return absl::FailedPreconditionError(absl::StrCat(
            "device placement gpu-per-rank puts each of the ", world_size,
            " ranks on its own GPU but only ", gpus, " GPU", gpus == 1 ? " is" : "s are",
            " visible; use DevicePlacement::SharedGpu() to run several ranks on one GPU (each "
            "with its own stream), or a smaller mesh"));
      }
      for (int r = 0; r < world_size; ++r) devices[r] = Device::Cuda(r);
      return devices;
    case DevicePlacement::Kind::kSharedGpu:
      if (gpus == 0) return no_gpu();
      if (placement.shared_gpu < 0 || placement.shared_gpu >= gpus) {
        return absl::FailedPreconditionError(absl::StrCat(
            "device placement shared-gpu(", placement.shared_gpu, ") names GPU ",
            placement.shared_gpu, " but ", gpus, " GPU", gpus == 1 ? " is" : "s are",
            " visible"));
      }
      for (int r = 0; r < world_size; ++r) devices[r] = Device::Cuda(placement.shared_gpu);
      return devices;
    case DevicePlacement::Kind::kCustom: {
      if (!placement.custom) {
        return absl::InvalidArgumentError("device placement custom has no function");
      }
      int on_gpu = 0;
      for (int r = 0; r < world_size; ++r) {
        devices[r] = placement.custom(r);
        if (!devices[r].is_cuda()) continue;
        ++on_gpu;
        if (gpus == 0) return no_gpu();
        if (devices[r].index < 0 || devices[r].index >= gpus) {
          return absl::FailedPreconditionError(absl::StrCat(
              "device placement custom puts rank ", r, " on ", devices[r].ToString(), " but ",
              gpus, " GPU", gpus == 1 ? " is" : "s are", " visible"));
        }
      }
      if (on_gpu != 0 && on_gpu != world_size) {
        return absl::InvalidArgumentError(absl::StrCat(
            "device placement custom puts ", on_gpu, " of ", world_size,
            " ranks on GPUs and the others on the CPU; a collective needs every rank's memory "
            "of one kind: place all ranks on GPUs or all on the CPU"));
      }
      return devices;
    }
  }
  return devices;
}

namespace {

// One stream per (device, rank slot), created on first use and kept for the process: repeated
// RunSpmd calls reuse them, and with them the caching allocator's per-stream blocks.
absl::StatusOr<cuda::StreamHandle> PooledStream(int device, int slot) {
  static std::mutex mu;
  static auto* pool = new std::map<std::pair<int, int>, cuda::StreamHandle>;
  std::lock_guard<std::mutex> lock(mu);
  auto it = pool->find({device, slot});
  if (it != pool->end()) return it->second;
  cuda::StreamHandle s = nullptr;
  absl::Status st = CatchOpError([&] { s = cuda::NewStream(device); });
  if (!st.ok()) return st;
  (*pool)[{device, slot}] = s;
  return s;
}

}  // namespace

absl::StatusOr<std::vector<collectives::MemorySpace>> RankMemorySpaces(const SpmdOptions& options,
                                                                       int world_size) {
  std::vector<collectives::MemorySpace> spaces(world_size);
  if (!options.placement.is_cpu()) {
    absl::StatusOr<std::vector<Device>> devices = ResolvePlacement(options.placement, world_size);
    if (!devices.ok()) return devices.status();
    for (int r = 0; r < world_size; ++r) {
      const Device d = (*devices)[r];
      spaces[r] = collectives::MemorySpace{d.is_cuda(), d.index, nullptr};
      if (options.comm.memory_space) {
        collectives::MemorySpace m = options.comm.memory_space(r);
        if (m.device != d.is_cuda() || (m.device && m.device_index != d.index)) {
          return absl::InvalidArgumentError(absl::StrCat(
              "rank ", r, " is placed on ", d.ToString(), " by placement ",
              options.placement.ToString(), " but comm.memory_space puts its buffers on ",
              m.device ? absl::StrCat("cuda:", m.device_index) : std::string("cpu"),
              "; set only the placement"));
        }
        spaces[r].stream = m.stream;
      }
    }
  } else if (options.comm.memory_space) {
    const int gpus = cuda::DeviceCount();
    int on_gpu = 0;
    for (int r = 0; r < world_size; ++r) {
      spaces[r] = options.comm.memory_space(r);
      if (!spaces[r].device) continue;
      ++on_gpu;
      if (spaces[r].device_index < 0 || spaces[r].device_index >= gpus) {
        return absl::FailedPreconditionError(absl::StrCat(
            "comm.memory_space puts rank ", r, " on cuda:", spaces[r].device_index, " but ", gpus,
            " GPU", gpus == 1 ? " is" : "s are", " visible",
            gpus == 0 ? absl::StrCat(" (", cuda::UnavailableReason(), ")") : std::string(),
            "; DevicePlacement::SharedGpu() runs several ranks on one GPU"));
      }
    }
    if (on_gpu != 0 && on_gpu != world_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "comm.memory_space puts ", on_gpu, " of ", world_size,
          " ranks on GPUs and the others on the CPU; all ranks need the same kind of memory"));
    }
  }
  std::map<int, int> next_slot;  // device -> rank slots handed out
  for (int r = 0; r < world_size; ++r) {
    collectives::MemorySpace& m = spaces[r];
    if (!m.device || m.stream != nullptr) continue;
    absl::StatusOr<cuda::StreamHandle> s = PooledStream(m.device_index, next_slot[m.device_index]++);
    if (!s.ok()) return s.status();
    m.stream = *s;
  }
  return spaces;
}

}  // namespace shardmap
