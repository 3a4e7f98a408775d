#include "shardmap/runtime/shape_only.h"

#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tensor/error.h"

namespace shardmap {

namespace {

// The device shape-only ranks run on by default: the meta device (no data).
Device DefaultShapeOnlyDevice() { return Device::Meta(); }

// RankContext::Comm's color of `rank`'s group over `mask` (kept in step with it).
int64_t SplitColor(const Mesh& mesh, int rank, AxisMask mask) {
  const int64_t keyed = int64_t{mask} * mesh.size() + mesh.GroupColor(rank, mask);
  return keyed <= std::numeric_limits<int>::max() ? keyed : mesh.GroupColor(rank, mask);
}

}  // namespace

collectives::ShapeOnlyCommunicator::SplitResolver MeshSplitResolver(const Mesh& mesh, int rank) {
  return [mesh, rank](int color, int key) -> absl::StatusOr<collectives::SplitGroup> {
    // The axis sets whose color and key this rank would give: O(2^axes), not O(world).
    const AxisMask all = (AxisMask{1} << mesh.num_axes()) - 1;
    int size = -1;
    for (AxisMask mask = 1; mask < all; ++mask) {
      if (SplitColor(mesh, rank, mask) != color || mesh.GroupIndex(rank, mask) != key) continue;
      if (size >= 0 && size != mesh.GroupSize(mask)) {
        return absl::InternalError(absl::StrCat(
            "shape-only Split(color=", color, ", key=", key, ") of ", RankDescription(mesh, rank),
            " on ", mesh.ShortString(), " names groups of different sizes"));
      }
      size = mesh.GroupSize(mask);
    }
    if (size < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shape-only Split(color=", color, ", key=", key, ") of ",
          RankDescription(mesh, rank), " names no group of axes of ", mesh.ShortString(),
          " (shape-only runs split as RankContext does: color = axis mask * world size + group "
          "color, key = index in the group)"));
    }
    return collectives::SplitGroup{size, key};
  };
}

absl::Status RunShapeOnly(const Mesh& mesh, int rank,
                          const std::function<void(RankContext&)>& body,
                          const ShapeOnlyOptions& options) {
  if (rank < 0 || rank >= mesh.size()) {
    return absl::InvalidArgumentError(absl::StrCat("shape-only run: rank ", rank,
                                                   " is outside the ", mesh.size(),
                                                   " ranks of mesh ", mesh.ShortString()));
  }
  if (!body) return absl::InvalidArgumentError("shape-only run: body is empty");
  collectives::ShapeOnlyCommunicator world(mesh.size(), rank, MeshSplitResolver(mesh, rank),
                                           absl::StrCat("shape-only ", mesh.ShortString()));
  const Device device = options.device.value_or(DefaultShapeOnlyDevice());
  if (device.is_cuda()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shape-only run: device ", device.ToString(), " (the shape-only communicator moves no "
        "GPU memory); use the meta device, or the CPU for tests"));
  }
  world.set_memory_space(collectives::MemorySpace{.meta = device.is_meta()});
  world.set_fill_outputs(!device.is_meta());  // CPU tensors: numbers, not what malloc left
  RankContext ctx(mesh, rank, &world, options.check, device);
  ScopedRankContext scope(&ctx);
  absl::Status s = CatchOpError([&] { body(ctx); });
  if (!s.ok()) {
    return absl::Status(s.code(), absl::StrCat("shape-only run of ", RankDescription(mesh, rank),
                                               ": ", s.message()));
  }
  return s;
}

}  // namespace shardmap
