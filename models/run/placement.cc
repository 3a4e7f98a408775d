#include "models/run/placement.h"

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "tensor/cuda/runtime.h"

ABSL_FLAG(std::string, mesh, "",
          "mesh axes, e.g. dp=2,tp=2 or pp=2,dp=2 or ep=2 (axes pp, dp, dp_replicate, dp_shard, "
          "ep, cp, tp; default: one device)");
ABSL_FLAG(bool, sp, false, "sequence parallelism (needs a tp axis)");
ABSL_FLAG(std::string, device, "cpu",
          "cpu or cuda. cuda in-process: one rank per GPU when this process sees at least as "
          "many GPUs as the mesh has ranks, else every rank a virtual rank on GPU 0 (a stream "
          "each); --gpu_ranks overrides. cuda with --backend=nccl: each process on GPU "
          "LOCAL_RANK");
ABSL_FLAG(std::string, gpu_ranks, "auto",
          "--device=cuda in-process: auto, shared (every rank on GPU 0) or per_gpu (rank r on "
          "GPU r)");
namespace shardmap {

absl::Status CheckPlacementFlags() {
  const std::string device = absl::GetFlag(FLAGS_device);
  const std::string gpu_ranks = absl::GetFlag(FLAGS_gpu_ranks);
  if (device != "cpu" && device != "cuda") {
    return absl::InvalidArgumentError(absl::StrCat("--device ", device, ": use cpu or cuda"));
  }
  if (gpu_ranks != "auto" && gpu_ranks != "shared" && gpu_ranks != "per_gpu") {
    return absl::InvalidArgumentError(
        absl::StrCat("--gpu_ranks ", gpu_ranks, ": use auto, shared or per_gpu"));
  }
  if (device == "cpu" && gpu_ranks != "auto") {
    return absl::InvalidArgumentError("--gpu_ranks needs --device=cuda");
  }
  return absl::OkStatus();
}

absl::StatusOr<DevicePlacement> ResolvePlacement(const Mesh& mesh) {
  if (absl::Status s = CheckPlacementFlags(); !s.ok()) return s;
  if (absl::GetFlag(FLAGS_device) == "cpu") return DevicePlacement();
  if (!cuda::Available()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--device=cuda: no usable GPU (", cuda::UnavailableReason(), "); use --device=cpu"));
  }
  const std::string gpu_ranks = absl::GetFlag(FLAGS_gpu_ranks);
  const bool per_gpu =
      gpu_ranks == "per_gpu" || (gpu_ranks == "auto" && cuda::DeviceCount() >= mesh.size());
  return per_gpu ? DevicePlacement::GpuPerRank() : DevicePlacement::SharedGpu(0);
}

}  // namespace shardmap
