// Sharded == unsharded: run a shard_map on N simulated devices for each mesh of a list and
// compare its outputs (and the gradients of value_and_grad) with the same per-device function
// on one device: a mesh with the same axis names, every size 1, so collectives are identities.
//
//   #include "spmd_testing/testing.h"
//   #include "shardmap/collective_ops.h"
//   #include "shardmap/ops.h"
//   #include "tensor/random.h"
//   using namespace shardmap;
//
//   // The layer under test, built for any mesh with a "tp" axis (and maybe others).
//   ShardMap MakeMlp(const Mesh& mesh) {
//     ShardFn fn = [](const std::vector<Value>& in) -> std::vector<Value> {
//       Value y = all_reduce(gelu(in[0].matmul(in[1])).matmul(in[2]), "tp");
//       return {sum(y * y, {}), y};                       // output 0: the loss
//     };
//     return shard_map(fn, mesh, {P(), P(None, "tp"), P("tp", None)}, {P(), P()});
//   }
//
//   TEST(Mlp, ShardedMatchesOneDevice) {
//     std::vector<Tensor> in = {RandomNormal({5, 7}, 1, 0, 1, DType::kF64),    // x
//                               RandomNormal({7, 12}, 2, 0, 1, DType::kF64),   // w1
//                               RandomNormal({12, 7}, 3, 0, 1, DType::kF64)};  // w2
//     EXPECT_TRUE(spmd_testing::ShardedMatchesOneDevice(
//         MakeMlp, {{{"tp", 1}}, {{"tp", 2}}, {{"dp", 2}, {"tp", 3}}}, in));
//   }
//
// Tensors are compared with TensorsNear (tensor/testing/compare.h: NaN matches only NaN, an
// infinity only the same infinity). A failure names the mesh, the output (or gradient) and its
// name, TensorsNear's account (count, worst element, got/want) and the rank holding that element
// with its index there (for a gradient, also the axes its ranks' parts are summed over:
// ShardMap::GradientSpecs), e.g.
//  mesh {dp:2,tp:3}: gradient of input 1 (w1): f64[7,12] vs f64[7,12]: 3 of 84 elements differ
//  by more than atol 1e-12 + rtol 1e-12 * |want| (0 of them NaN/inf where the other is not);
//  worst at [4,5]: got 0.5, want 0.25, diff 0.25; that element is [4,5] (rank 5 (dp=1,tp=2),
//  local [4,1]; summed over dp) (f64 tolerance)
//
// Ranks run where TestPlacement() says (CPU, or the GPU in shardmap_cc_test's gpu variant),
// unless options.placement is set.
#ifndef SHARDMAP_SPMD_TESTING_ONE_DEVICE_H_
#define SHARDMAP_SPMD_TESTING_ONE_DEVICE_H_

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "shardmap/context.h"
#include "shardmap/mesh.h"
#include "shardmap/partition_spec.h"
#include "shardmap/shard_map.h"
#include "tensor/tensor.h"

namespace shardmap::spmd_testing {

// The axes of one mesh, e.g. {{"dp", 2}, {"tp", 3}}.
using MeshAxes = std::vector<std::pair<std::string, int>>;

// Builds the shard_map under test for a mesh (the same fn and specs for every mesh).
using ShardMapFactory = std::function<ShardMap(const Mesh& mesh)>;

// |got - want| <= atol + rtol * |want|, elementwise.
struct Tolerance {
  double atol;
  double rtol;
};

// Defaults by the dtype compared: f64 1e-12/1e-12, f32 1e-5/1e-5, f16 2e-3/2e-3,
// bf16 1.6e-2/1.6e-2 (a few units in the last place of a short sum); integers exact.
Tolerance DefaultTolerance(DType dtype);

struct OneDeviceOptions {
  // Also compare gradients: value_and_grad over both runs (output 0 must be the scalar loss).
  bool gradients = true;
  // Overrides DefaultTolerance for every dtype.
  std::optional<Tolerance> tolerance;
  // Where the sharded ranks run; unset: TestPlacement(). The one-device run is on the CPU.
  std::optional<DevicePlacement> placement;
};

// For each mesh: factory(mesh) on the inputs against factory(one-device mesh) on the same
// inputs. Success, or a failure listing every mismatch (see the header comment) and any error
// Status of either run.
::testing::AssertionResult ShardedMatchesOneDevice(const ShardMapFactory& factory,
                                                   const std::vector<MeshAxes>& meshes,
                                                   const std::vector<Tensor>& inputs,
                                                   const OneDeviceOptions& options = {});

// The comparison behind it, public for other helpers: `got` (assembled from the ranks of `mesh`
// per `spec`) against `want`. `what` names the tensor ("output 1 (y)"). Empty when they match,
// else one line describing the mismatch.
std::string CompareAssembled(const Mesh& mesh, const PartitionSpec& spec, const std::string& what,
                             const Tensor& got, const Tensor& want, const Tolerance& tol);

// Global element `flat` of a tensor of `shape` laid out per `spec` on `mesh`, and who holds it:
// "[4,5] (rank 5 (dp=1,tp=2), local [4,1])".
std::string LocateElement(const Mesh& mesh, const PartitionSpec& spec, const Shape& shape,
                          int64_t flat);

// "{dp:2,tp:3}"
std::string MeshAxesToString(const MeshAxes& axes);

}  // namespace shardmap::spmd_testing

#endif  // SHARDMAP_SPMD_TESTING_ONE_DEVICE_H_
