// Cross-entropy losses as typed ops: the mean over rows, and Megatron's vocab-parallel loss.
//
//   // logits [n, V] with the classes whole, targets [n] (i32/i64):
//   Value l = cross_entropy_mean(logits, targets);       // mean over the non-ignored rows
//
//   // Vocab-parallel (Megatron): logits [n, V/tp] sharded S(last) over "tp" (a column-parallel
//   // head), targets [n] global ids, R or I on "tp":
//   Value per_row = vocab_parallel_cross_entropy(logits, targets, "tp");   // [n], R on "tp"
//   Value loss = mean(per_row, {0});
//
// Both are composites of typed ops (cross_entropy; local_max, all_reduce(max), exp, sum_partial,
// all_reduce(sum), take_along_last), so their gradients and the backward collectives are those
// ops' transposes: the vocab-parallel loss issues three all_reduces of [rows] over the axis
// forward (the max, which carries no gradient, the sum of exponentials and the picked logit) and
// two backward (the transposes of the last two). Rows whose target equals ignore_index give
// loss 0 and gradient 0, as in PyTorch.
//
// Errors (OpError, returned as the shard_map's Status): a target outside [0, V) that is not
// ignore_index (V the global vocabulary: the local classes times the axis size), names the row
// and the range; targets whose shape is not logits' leading dims; a non-integer target dtype;
// an axis the mesh does not have; logits whose classes are not sharded over the axis (use
// cross_entropy) or are a pending sum (all_reduce first); for cross_entropy_mean, rows sharded
// over an axis (the mean needs the global row count: write the sum_partial form instead).
// Targets on a GPU are read back to check them, except while a CUDA graph is being captured
// (a host read is illegal then) or when the thread defers its index checks
// (tensor/cuda/device_memory.h; the trainer's rank threads, which check every token id on the
// host before the first step): there the ids are not checked here (no host sync per step) and
// out-of-range ids count as ignored.
#ifndef SHARDMAP_SHARDMAP_OPS_LOSS_OPS_H_
#define SHARDMAP_SHARDMAP_OPS_LOSS_OPS_H_

#include <cstdint>
#include <string>

#include "shardmap/value.h"

namespace shardmap {

// mean over the rows whose target is not ignore_index of cross_entropy(logits, targets): a
// scalar with the rows' type reduced away (R/I on every axis that does not shard the rows).
// All rows ignored: 0 (not NaN).
Value cross_entropy_mean(const Value& logits, const Value& targets, int64_t ignore_index = -100);

// Per-row loss [leading dims of logits] of logits whose last dim is sharded over `axis`;
// R on `axis`, the rows keep their other axes' types.
Value vocab_parallel_cross_entropy(const Value& logits, const Value& targets,
                                   const std::string& axis, int64_t ignore_index = -100);

}  // namespace shardmap

#endif  // SHARDMAP_SHARDMAP_OPS_LOSS_OPS_H_
