// Neural-network ops and their backward kernels.
//
//   Tensor p = Softmax(logits, -1);
//   LayerNormResult ln = LayerNorm(x /*[n,h]*/, gamma /*[h]*/, beta /*[h]*/, 1e-5);
//   LayerNormGrads g = LayerNormBackward(x, gamma, ln.mean, ln.rstd, dy);
//   Tensor loss = CrossEntropy(logits /*[n,v]*/, targets /*i32|i64 [n]*/);   // per-row, f32[n]
//   Tensor e = Embedding(table /*[v,h]*/, ids /*i64[b,s]*/);                 // [b,s,h]
//
// Normalisations are over the last dim. Errors name the op, shapes and the offending index.
#ifndef SHARDMAP_TENSOR_OPS_NN_H_
#define SHARDMAP_TENSOR_OPS_NN_H_

#include <limits>

#include "tensor/tensor.h"

namespace shardmap {

Tensor Softmax(const Tensor& x, int dim);
Tensor LogSoftmax(const Tensor& x, int dim);
// Given y = Softmax(x) (or LogSoftmax(x)) and dy, returns dx.
Tensor SoftmaxBackward(const Tensor& y, const Tensor& dy, int dim);
Tensor LogSoftmaxBackward(const Tensor& y, const Tensor& dy, int dim);

struct LayerNormResult {
  Tensor y;
  Tensor mean;  // x's shape without its last dim, f32 (f64 for f64 input)
  Tensor rstd;  // same shape as mean
};
struct LayerNormGrads {
  Tensor dx, dgamma, dbeta;
};
// gamma/beta may be undefined (no affine part). dgamma is undefined when gamma is; dbeta (the
// row sum of dy) is always returned, in gamma's dtype (x's dtype without gamma): the backward
// cannot know whether beta existed, so callers drop it when unused. mean/rstd may be any float
// dtype of the row shape; all compute is in f32 (f64 for f64 x).
LayerNormResult LayerNorm(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps);
LayerNormGrads LayerNormBackward(const Tensor& x, const Tensor& gamma, const Tensor& mean,
                                 const Tensor& rstd, const Tensor& dy);

struct RmsNormResult {
  Tensor y;
  Tensor rstd;
};
struct RmsNormGrads {
  Tensor dx, dgamma;
};
RmsNormResult RmsNorm(const Tensor& x, const Tensor& gamma, double eps);
RmsNormGrads RmsNormBackward(const Tensor& x, const Tensor& gamma, const Tensor& rstd,
                             const Tensor& dy);

// Rows of `table` picked by integer ids: out shape = ids.shape + [table.dim(1)].
// Out-of-range ids are an OpError naming the id and its position.
Tensor Embedding(const Tensor& table, const Tensor& ids);
// The scatter-add backward: a [num_rows, dy.dim(-1)] tensor, rows summed per id.
Tensor EmbeddingBackward(const Tensor& ids, const Tensor& dy, int64_t num_rows);

// Per-row negative log-likelihood of integer targets: -log_softmax(logits)[i, target[i]].
// Targets equal to ignore_index contribute 0. logits [n,v], targets [n] (or [..., v] and [...]).
// The loss is f64 for f64 logits and f32 otherwise; the backward returns logits' dtype.
Tensor CrossEntropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index = -100);
// d(per-row loss)/d(logits) scaled by dloss [n]: (softmax - onehot) * dloss.
Tensor CrossEntropyBackward(const Tensor& logits, const Tensor& targets, const Tensor& dloss,
                            int64_t ignore_index = -100);

// Causal mask on scores [..., s, t]: entries with key index j > query index i + offset are set to
// `fill` (default -inf). offset = t - s lines up the last query with the last key.
Tensor CausalMask(const Tensor& scores, int64_t offset = 0,
                  double fill = -std::numeric_limits<double>::infinity());
// Softmax(CausalMask(scores, offset), -1) in one pass that reads only the visible keys of each
// row and writes exact zeros past them (attention's hot path: no masked copy of [b,h,t,t]). A
// row with no visible key (i + offset < 0) is all zero on CPU, where the composite gives NaN.
// Its VJP is SoftmaxBackward(y, dy, -1): masked entries have y = 0, so their gradient is 0.
Tensor CausalSoftmax(const Tensor& scores, int64_t offset = 0);

}  // namespace shardmap

#endif  // SHARDMAP_TENSOR_OPS_NN_H_
