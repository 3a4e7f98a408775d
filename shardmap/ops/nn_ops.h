// Typed neural-network ops with VJPs (kernels in tensor/ops/nn.h).
//
//   Value p  = softmax(scores, -1);                 // nonlinear; the softmax dim must be whole
//   Value pc = causal_softmax(scores);              // = softmax(causal_mask(scores), -1), fused
//   Value h  = layer_norm(x, gamma, beta);          // x S0 (sequence-parallel) is fine
//   Value e  = embedding(table, ids);               // table R: e has ids' type
//   Value ep = embedding(table_s0, ids);            // table S0 over tp (vocab-parallel):
//                                                   //   ids outside this shard give 0 rows,
//                                                   //   e is P on tp: all_reduce (or
//                                                   //   reduce_scatter for SP) resolves it
//   Value l  = cross_entropy(logits, targets);      // per-row loss [n]; class dim must be whole
//
// Rules (per axis): a P input of a nonlinear op is an error; normalising (softmax, norms, the
// classes of cross_entropy) over a dim that is sharded is an error (all_gather it, or write the
// vocab-parallel composite with all_reduce(max) / all_reduce(sum)); norm weights join the input
// like a multiplication (R weights with S0 activations give S0; their gradients are P, summed
// over the local rows). Embedding: table R -> ids' type; table S0 -> P (vocab-parallel, ids
// must be R on that axis); table S1 -> S(last) (hidden-parallel).
#ifndef SHARDMAP_SHARDMAP_OPS_NN_OPS_H_
#define SHARDMAP_SHARDMAP_OPS_NN_OPS_H_

#include <cstdint>
#include <vector>

#include "shardmap/value.h"

namespace shardmap {

Value softmax(const Value& x, int dim);
Value log_softmax(const Value& x, int dim);
// gamma/beta may be undefined Values (no affine part): layer_norm(x, Value(), Value()) is the
// plain normalisation on any mesh, checked or erased, with gradients. A defined weight is
// checked like any operand (its mesh, its type); x is required.
Value layer_norm(const Value& x, const Value& gamma, const Value& beta, double eps = 1e-5);
// gamma may be undefined (no scale), as for layer_norm.
Value rms_norm(const Value& x, const Value& gamma, double eps = 1e-6);
Value embedding(const Value& table, const Value& ids);
Value cross_entropy(const Value& logits, const Value& targets, int64_t ignore_index = -100);
// scores [..., q, k]: the last two dims are (query i, key j); entries with key index
// j > query index i + offset become -inf (their gradient is 0). Leading dims (batch, heads) are
// untouched.
Value causal_mask(const Value& scores, int64_t offset = 0);
// softmax(causal_mask(scores, offset), -1) as one op (same types, errors and gradient; one pass
// over the visible keys instead of a masked copy). A row with no visible key is 0, not NaN.
Value causal_softmax(const Value& scores, int64_t offset = 0);

// Max over dims (nonlinear). The gradient goes to the maximal elements (split evenly on ties).
// Reducing a sharded dim is an error naming local_max.
Value max(const Value& x, const std::vector<int>& dims, bool keepdim = false);
// Max over dims of this device's shard only: on axes that shard a reduced dim the result is V
// (each device's own maximum; all_reduce(.., ReduceKind::kMax) combines them).
Value local_max(const Value& x, const std::vector<int>& dims, bool keepdim = false);

// x[..., idx[...]] along the last dim: out shape = idx's shape (= x's leading dims).
// x S(last) on an axis (vocab-parallel): idx holds global indices and must be R/I there; indices
// outside this device's shard give 0, so the result is P (the pick of the one device that holds
// the index). Otherwise the result joins x's leading dims with idx like a multiplication.
Value take_along_last(const Value& x, const Value& idx);

}  // namespace shardmap

#endif  // SHARDMAP_SHARDMAP_OPS_NN_OPS_H_
