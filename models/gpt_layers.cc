#include "models/gpt_layers.h"

#include <cmath>

#include "shardmap/collective_ops.h"
#include "shardmap/einsum.h"
#include "shardmap/nn_ops.h"
#include "shardmap/ops.h"
#include "shardmap/tape_hook.h"

namespace shardmap {

Value EnterTensorParallel(const Value& x, const TensorParallel& tp) {
  return tp.on() && tp.sp ? all_gather(x, 0, tp.axis) : x;
}

Value LeaveTensorParallel(const Value& yp, const TensorParallel& tp) {
  if (!tp.on()) return yp;
  return tp.sp ? reduce_scatter(yp, 0, tp.axis) : all_reduce(yp, tp.axis);
}

Value ColumnParallelLinear::operator()(const Value& x) const {
  return EnterTensorParallel(x, tp).matmul(weight) + bias;
}

Value RowParallelLinear::operator()(const Value& x) const {
  return LeaveTensorParallel(x.matmul(weight), tp) + bias;
}

Value LayerNorm::operator()(const Value& x) const { return layer_norm(x, weight, bias, eps); }

Value VocabParallelEmbedding::operator()(const Value& ids) const {
  return LeaveTensorParallel(embedding(weight, ids), tp);
}

Value VocabParallelCrossEntropy(const Value& logits, const Value& targets,
                                const TensorParallel& tp) {
  if (!tp.on()) return cross_entropy(logits, targets);
  Value m;
  {
    NoGradScope constant;  // the shift cancels in the loss: no gradient, no backward collective
    m = all_reduce(local_max(logits, {1}, true), tp.axis, To::kR, ReduceKind::kMax);
  }
  Value z = logits - Value(m.tensor, m.type);
  Value sum_exp = all_reduce(sum_partial(exp(z), {1}, true), tp.axis);
  Value picked = all_reduce(take_along_last(z, targets), tp.axis);
  return log(sum_exp).reshape({z.dim(0)}) - picked;
}

Value Mlp::operator()(const Value& x) const { return c_proj(gelu(c_fc(x), GeluApprox::kTanh)); }

Value CausalSelfAttention::operator()(const Value& x) const {
  Value h = EnterTensorParallel(x, tp);
  const int64_t rows = h.dim(0), e = c_attn_weight.dim(2), heads = e / head_dim;
  Value qkv = einsum("nd,dce->nce", h, c_attn_weight) + c_attn_bias;        // [n, 3, e]
  qkv = qkv.reshape({rows / seq, seq, 3, heads, head_dim});                 // [b, t, 3, h, hd]
  Value q = slice(qkv, 2, 0, 1), k = slice(qkv, 2, 1, 1), v = slice(qkv, 2, 2, 1);
  Value scores = einsum("btchd,bschd->bhts", q, k) *
                 (1.0 / std::sqrt(static_cast<double>(head_dim)));
  Value p = softmax(causal_mask(scores), -1);
  Value o = einsum("bhts,bschd->bthd", p, v).reshape({rows, e});           // S1 on tp
  return c_proj(o);
}

Value Block::operator()(const Value& x) const {
  Value y = x + attn(ln_1(x));
  return y + mlp(ln_2(y));
}

}  // namespace shardmap
