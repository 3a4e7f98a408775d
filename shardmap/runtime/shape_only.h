// Shape-only execution of one rank's SPMD program: RunShapeOnly runs `body` once, on the calling
// thread, as rank `rank` of `mesh` (any size: thousands of ranks cost nothing more), with its
// RankContext on the meta device (tensors with a shape and a dtype and no data) and its
// collectives through a collectives::ShapeOnlyCommunicator (validated, logged, nothing moved).
// The typed layer runs as in a real run: every op's type rule, every collective's SpmdType
// agreement, the tape and its VJPs; the rank's collectives go to ctx.collective_log() and to the
// CollectiveRecorders of the calling thread exactly as a real run records them, under `rank`.
//
//   Mesh mesh = *Mesh::Create({{"dp", 512}, {"tp", 8}});
//   CollectiveRecorder rec;
//   absl::Status s = RunShapeOnly(mesh, /*rank=*/9, [&](RankContext& ctx) {
//     Value x(Tensor::Empty({1024, 4096}, DType::kBF16, ctx.device()), ...);  // meta: no data
//     Value y = all_reduce(x.matmul(w), "tp");
//   });
//   rec.records(9);   // {all_reduce over tp: bf16, 8 MiB}, as rank 9 of a real run logs it
//
// What cannot be known without data: values (a host read of a meta tensor gives zeros, so code
// that branches on values takes the zero branch) and cross-rank agreement (the CallTag compare
// needs peers; each rank's own type checks still run). Per-axis communicators come from the
// mesh (ShapeOnlyCommunicator's SplitResolver): no Split needs the other ranks.
// Cost: O(mesh axes) to set up, O(1) per collective; nothing is O(world size).
#ifndef SHARDMAP_SHARDMAP_RUNTIME_SHAPE_ONLY_H_
#define SHARDMAP_SHARDMAP_RUNTIME_SHAPE_ONLY_H_

#include <functional>
#include <optional>

#include "absl/status/status.h"
#include "collectives/shape_only_communicator.h"
#include "shardmap/mesh.h"
#include "shardmap/runtime/rank_context.h"
#include "tensor/tensor.h"

namespace shardmap {

struct ShapeOnlyOptions {
  TypeCheck check = TypeCheck::kOn;
  // The rank's device. Unset: the meta device (no data). A CPU device runs the ops for real with
  // the collectives still shape-only (ShapeOnlyCommunicator::set_fill_outputs): for tests. Not a GPU.
  std::optional<Device> device;
};

// Runs body as rank `rank` of `mesh` (see above). InvalidArgument when rank is outside
// [0, mesh.size()); an OpError (or other exception) thrown by body becomes the Status, annotated
// with the rank's coordinates as RunSpmd does.
absl::Status RunShapeOnly(const Mesh& mesh, int rank,
                          const std::function<void(RankContext&)>& body,
                          const ShapeOnlyOptions& options = {});

// The SplitResolver of rank `rank` of `mesh` for RankContext's splits (color = axis mask *
// mesh.size() + group color, key = index in the group; see RankContext::Comm): the group's size
// from the mesh. InvalidArgument for a (color, key) that names no group of this rank.
collectives::ShapeOnlyCommunicator::SplitResolver MeshSplitResolver(const Mesh& mesh, int rank);

}  // namespace shardmap

#endif  // SHARDMAP_SHARDMAP_RUNTIME_SHAPE_ONLY_H_
