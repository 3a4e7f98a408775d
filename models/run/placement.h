// Where a binary's ranks run, resolved once for the trainer and the sampler: the flags --mesh,
// --sp, --device and --gpu_ranks (defined here, once) and the DevicePlacement they give.
//
//   absl::StatusOr<Mesh> mesh = ParseMesh(absl::GetFlag(FLAGS_mesh));
//   absl::StatusOr<DevicePlacement> p = ResolvePlacement(*mesh);  // in-process ranks
#ifndef SHARDMAP_MODELS_RUN_PLACEMENT_H_
#define SHARDMAP_MODELS_RUN_PLACEMENT_H_

#include <string>

#include "absl/flags/declare.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "shardmap/device_placement.h"
#include "shardmap/mesh.h"

namespace shardmap {

// --device and --gpu_ranks name known choices, and --gpu_ranks only with --device=cuda.
// InvalidArgument with the choices otherwise.
absl::Status CheckPlacementFlags();

// The in-process ranks' placement: CPU, or with --device=cuda one rank per GPU (--gpu_ranks
// per_gpu, or auto when this process sees at least mesh.size() GPUs) or every rank a virtual rank
// on GPU 0. FailedPrecondition when --device=cuda finds no usable GPU.
absl::StatusOr<DevicePlacement> ResolvePlacement(const Mesh& mesh);

}  // namespace shardmap

ABSL_DECLARE_FLAG(std::string, mesh);
ABSL_DECLARE_FLAG(bool, sp);
ABSL_DECLARE_FLAG(std::string, device);
ABSL_DECLARE_FLAG(std::string, gpu_ranks);

#endif  // SHARDMAP_MODELS_RUN_PLACEMENT_H_
