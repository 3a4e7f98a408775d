// Where the ranks of an in-process SPMD run live (CPU, a GPU each, virtual ranks sharing a GPU),
// resolved to one Device per rank, and the ranks' memory spaces (device + pooled stream) that the
// in-process communicator works on.
//
//   SpmdOptions o;
//   o.placement = DevicePlacement::SharedGpu();  // every rank on GPU 0, a stream each
//   absl::StatusOr<std::vector<Device>> d = ResolvePlacement(o.placement, 4);  // 4 x cuda:0
//   // FailedPrecondition (naming the reason and DevicePlacement::Cpu()) without a usable GPU.
#ifndef SHARDMAP_SHARDMAP_RUNTIME_DEVICE_PLACEMENT_H_
#define SHARDMAP_SHARDMAP_RUNTIME_DEVICE_PLACEMENT_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "collectives/communicator.h"
#include "tensor/tensor.h"

namespace shardmap {

// Where the ranks of an in-process SPMD run live.
//   Cpu()         every rank on the host (the default; CPU kernels, host-memory collectives).
//   GpuPerRank()  rank r on GPU r; an error when there are fewer GPUs than ranks.
//   SharedGpu(g)  every rank on GPU g, each with its own stream (virtual ranks: kernels of the
//                 ranks overlap; collectives are in-process copies/reductions on device memory).
//   Custom(fn)    rank r on fn(r) (GPUs only, or CPU for every rank).
struct DevicePlacement {
  enum class Kind : uint8_t { kCpu, kGpuPerRank, kSharedGpu, kCustom };
  Kind kind = Kind::kCpu;
  int shared_gpu = 0;                     // kSharedGpu
  std::function<Device(int rank)> custom;  // kCustom

  static DevicePlacement Cpu() { return DevicePlacement{}; }
  static DevicePlacement GpuPerRank() { return DevicePlacement{Kind::kGpuPerRank, 0, nullptr}; }
  static DevicePlacement SharedGpu(int gpu = 0) {
    return DevicePlacement{Kind::kSharedGpu, gpu, nullptr};
  }
  static DevicePlacement Custom(std::function<Device(int rank)> fn) {
    return DevicePlacement{Kind::kCustom, 0, std::move(fn)};
  }
  bool is_cpu() const { return kind == Kind::kCpu; }
  std::string ToString() const;  // "cpu", "gpu-per-rank", "shared-gpu(0)", "custom"
};

// The device of each of world_size ranks. FailedPrecondition when a GPU placement is asked for
// without a usable GPU or with fewer GPUs than it needs (the message names both counts and the
// alternative); InvalidArgument for a custom placement that mixes CPU and GPU ranks.
absl::StatusOr<std::vector<Device>> ResolvePlacement(const DevicePlacement& placement,
                                                     int world_size);

struct SpmdOptions;  // spmd_runner.h

// The memory space of each rank of an in-process run under `options` (placement or
// comm.memory_space), with streams from the process-wide pool filled in; FailedPrecondition or
// InvalidArgument as ResolvePlacement, or when both disagree. Public for tests and tools.
absl::StatusOr<std::vector<collectives::MemorySpace>> RankMemorySpaces(const SpmdOptions& options,
                                                                       int world_size);

}  // namespace shardmap

#endif  // SHARDMAP_SHARDMAP_RUNTIME_DEVICE_PLACEMENT_H_
