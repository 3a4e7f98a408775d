// Fused causal attention: softmax(q k^T * scale, causal) v per (batch, head), with its backward,
// without the [b, h, tq, tk] scores in memory on GPUs.
//
//   // q [b, tq, h, d]; k, v [b, tk, kvh, d] with kvh dividing h (grouped-query attention: query
//   // head i reads kv head i / (h / kvh), as HF's repeat_kv; kvh = h: multi-head); any float
//   // dtype (all three the same)
//   CausalAttentionResult r = CausalAttention(q, k, v, 1 / std::sqrt(d));
//   // r.out [b, tq, h, d] in q's dtype; r.lse [b, h, tq] f32 (f64 for f64 inputs)
//   CausalAttentionGrads g = CausalAttentionBackward(q, k, v, r.out, r.lse, dout, scale);
//
// Causality: query i sits at position i + q_offset and sees keys j <= i + q_offset (q_offset = 0
// and tq = tk is ordinary causal self-attention; tk - tq lines up the last query with the last
// key; ring/context-parallel blocks pass their chunk's offset). A query that sees no key gets
// out = 0, lse = -inf and zero gradients. A NaN or infinite visible score makes its row NaN.
//
// CPU: the materialised reference, every sum in f64 (inputs widened once, results rounded once to
// their dtype); the backward recomputes the probabilities from q and k (out and lse are checked
// for shape only). Slow (scalar f64 loops): a reference and a fallback, not the CPU hot path.
// CUDA: tensor/cuda/attention (online softmax in f32, f64 for f64; head_dim 1 to 128); the
// backward uses out and lse (rowsum(dout * out) and exp(s - lse)).
// Errors (OpError) name the op, the operand and its shape.
#ifndef SHARDMAP_TENSOR_OPS_ATTENTION_H_
#define SHARDMAP_TENSOR_OPS_ATTENTION_H_

#include <cstdint>

#include "tensor/tensor.h"

namespace shardmap {

struct CausalAttentionResult {
  Tensor out;  // [b, tq, h, d], q's dtype
  Tensor lse;  // [b, h, tq]: logsumexp of each query's visible scores; f32 (f64 for f64)
};
struct CausalAttentionGrads {
  Tensor dq, dk, dv;  // shapes and dtype of q, k, v
};

CausalAttentionResult CausalAttention(const Tensor& q, const Tensor& k, const Tensor& v,
                                      double scale, int64_t q_offset = 0);
CausalAttentionGrads CausalAttentionBackward(const Tensor& q, const Tensor& k, const Tensor& v,
                                             const Tensor& out, const Tensor& lse,
                                             const Tensor& dout, double scale,
                                             int64_t q_offset = 0);

}  // namespace shardmap

#endif  // SHARDMAP_TENSOR_OPS_ATTENTION_H_
