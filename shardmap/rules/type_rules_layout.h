// The layout ops' type rules (reshape, permute/transpose, slice/concat, broadcast_to) and the
// dim maps other rules share (BroadcastDim, ReshapeDim, SameShardBlocks). Shapes are local.
//
//   ReshapeRule({tp:S2}, [b, t, h*hd] -> [b, t, h, hd])   // {tp:S2}: the heads dim
//   SliceRule({tp:S1}, 1)                                   // {tp:V}
//   BroadcastRule({dp:S0}, [1, 8] -> [4, 8])                // {dp:V}: S on a broadcast dim
#ifndef SHARDMAP_SHARDMAP_RULES_TYPE_RULES_LAYOUT_H_
#define SHARDMAP_SHARDMAP_RULES_TYPE_RULES_LAYOUT_H_

#include <cstdint>

#include "absl/types/span.h"
#include "shardmap/spmd_type.h"

namespace shardmap {

// The output dim that dim d of an operand of shape `in` lands on when broadcast to `out`, or -1
// when d is broadcast (size 1 against a larger size) or d < 0.
int BroadcastDim(absl::Span<const int64_t> in, int d, absl::Span<const int64_t> out);

// The output dim that a shard dim d (S(d)) of a local shape `in` lands on through a reshape to
// `out`, or -1 when the shards are no longer blocks of one output dim (then V). Each device's
// block stays a contiguous block of output dim e exactly when the elements before d and before
// e agree: prod(in[:d]) == prod(out[:e]). Of several such e (size-1 dims at the boundary):
// - in[d] > 1: the shard keeps the count m of size-1 dims before it in its block: e is the
//   m-th such e from the first (the last when the output has fewer). So one row keeps its
//   heads' shard, and splitting [.., h*hd] -> [.., h, hd] keeps S on the heads dim also at one
//   head per device:
//     {tp:S1} [1, h*hd] -> [1, h, hd] is {tp:S1} (heads), not S0 (the size-1 row dim);
//     {tp:S2} [b,t,hd] -> [b,t,1,hd] is {tp:S2} (heads, 1 per device), not S3 (head_dim).
// - in[d] == 1 (one head per device): the shard stays on a size-1 dim, the m-th of them or
//   the last one left ([b,t,1,1,hd] S3 -> [b,t,1,hd] is S2), on the non-1 dim if none is left.
// Local shapes cannot tell every case apart: [1, 1, hd] S1 -> [1, hd] is S0 (a dropped size-1
// dim before the heads), so merging one row's single local head needs the heads dim moved
// first (models/model/model.cc, DecodeMergeHeads); and a size-1 dim inserted before the size-1
// dims that precede a shard ([1, h, hd] S1 -> [1, 1, h, hd]) moves it (to S1). To insert a
// size-1 dim next to a sharded dim, insert it after.
int ReshapeDim(absl::Span<const int64_t> in, absl::Span<const int64_t> out, int d);

// Whether S(d) and S(e) of a value of local shape `shape` describe the same blocks (the same
// elements before both: only size-1 dims between them), e.g. dims 2 and 3 of [b,t,1,hd]. A
// cotangent typed S(e) for a primal S(d) is then retyped, not rejected.
bool SameShardBlocks(absl::Span<const int64_t> shape, int d, int e);

// x's type through a reshape of its local shape `in` to `out` (ReshapeDim on each S axis).
SpmdType ReshapeRule(const SpmdType& x, absl::Span<const int64_t> in,
                     absl::Span<const int64_t> out);

// permute(x, perm): S(perm[k]) becomes S(k). perm entries may be negative (from the end).
SpmdType PermuteRule(const SpmdType& x, absl::Span<const int> perm, int rank);

// slice / concat along dim: S(dim) becomes V (the pieces are no longer the shards of one whole).
SpmdType SliceRule(const SpmdType& x, int dim);

// broadcast_to(x of shape in, out): S(d) follows d to its output dim, V where d is broadcast.
SpmdType BroadcastRule(const SpmdType& x, absl::Span<const int64_t> in,
                       absl::Span<const int64_t> out);

}  // namespace shardmap

#endif  // SHARDMAP_SHARDMAP_RULES_TYPE_RULES_LAYOUT_H_
