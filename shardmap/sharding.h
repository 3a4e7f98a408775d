// Moving between global tensors and per-device shards, and the checks at a shard_map boundary.
// shard_map (shard_map.h) and the differentiable shard_map (autograd/value_and_grad.h) use these;
// they are public for tools and tests.
//
//   Tensor w1_local = ShardOf(w1, mesh, P(None, "tp"), /*rank=*/2);   // columns of tp index 2
//   Tensor y = *Assemble(mesh, P("dp"), per_rank_outputs, types[0]);
//   //  S axes: blocks placed; P axes: summed; R/I axes: taken from index 0 of the axis.
#ifndef SHARDMAP_SHARDMAP_SHARDING_H_
#define SHARDMAP_SHARDMAP_SHARDING_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "shardmap/mesh.h"
#include "shardmap/partition_spec.h"
#include "shardmap/value.h"
#include "tensor/tensor.h"

namespace shardmap {

// The block of `global` that `rank` holds under `spec` (a copy). The spec must be valid for it.
Tensor ShardOf(const Tensor& global, const Mesh& mesh, const PartitionSpec& spec, int rank);

// The global tensor from every rank's local tensor (indexed by rank), given the spec and the
// (common) type of the locals: axes named in the spec place blocks; P axes (unreduced outputs,
// gradients of replicated inputs) are summed; R/I axes are taken from index 0 of the axis.
// The result is a host tensor: device locals are copied to the host first (their producing
// streams must have finished, as they have after RunSpmd); bf16/f16 sums are done in f32.
absl::StatusOr<Tensor> Assemble(const Mesh& mesh, const PartitionSpec& spec,
                                absl::Span<const Tensor> locals, const SpmdType& type);

// Checks an output's type against its out_spec (docs/design.md section 4.2): an axis named at dim d
// must be V (S(d) or unknown) — R/I are accepted and tiled as in JAX; an unreduced axis must be P;
// an axis not named must be R or I. Throws OpError naming the output, the axis and the fix.
void CheckOutputType(const Value& out, const Mesh& mesh, const PartitionSpec& spec,
                     const std::string& what);

// Runtime check (debugging user casts): every value typed R or I on an axis is bitwise identical
// across that axis (a hash of each rank's bytes, exchanged with one all_gather over the world).
// Collective: every rank must call it with the same values. Throws OpError naming the first
// pair of ranks that differ.
void CheckReplicationAtRuntime(absl::Span<const Value> values, const std::string& what);

}  // namespace shardmap

#endif  // SHARDMAP_SHARDMAP_SHARDING_H_
