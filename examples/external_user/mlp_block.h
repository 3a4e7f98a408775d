// A user's layer: a Megatron MLP block, column-parallel then row-parallel over the mesh axis
// "tp", batch rows split over "dp", with a sum-of-squares loss.
//
//   Mesh mesh = *Mesh::Create({{"dp", 2}, {"tp", 3}});
//   ShardMap block = MakeMlpBlock(mesh);    // inputs x, w1, b1, w2, b2; outputs loss, y
//   absl::StatusOr<ShardMapGrads> r = value_and_grad(block)({x, w1, b1, w2, b2});
#ifndef EXTERNAL_USER_MLP_BLOCK_H_
#define EXTERNAL_USER_MLP_BLOCK_H_

#include "shardmap/mesh.h"
#include "shardmap/shard_map.h"
#include "shardmap/value.h"

namespace external_user {

// Per device: y = all_reduce_tp(gelu(x @ w1 + b1) @ w2) + b2.
shardmap::Value MlpBlock(const shardmap::Value& x, const shardmap::Value& w1,
                         const shardmap::Value& b1, const shardmap::Value& w2,
                         const shardmap::Value& b2);

// The block over a mesh with axes dp and tp: x [batch, d] P(dp), w1 [d, h] P(None, tp),
// b1 [h] P(tp), w2 [h, d] P(tp), b2 [d] P(); outputs: loss = sum(y^2) (summed over dp at the
// boundary) and y [batch, d] P(dp).
shardmap::ShardMap MakeMlpBlock(const shardmap::Mesh& mesh);

}  // namespace external_user

#endif  // EXTERNAL_USER_MLP_BLOCK_H_
