// Typed fused causal attention with its VJP (kernels in tensor/ops/attention.h: the f64 CPU
// reference, the FlashAttention-style CUDA kernel on GPU tensors).
//
//   // q, k, v [b, t, heads, head_dim]: b S0 on dp, heads S2 on tp (Megatron), t whole
//   Value o = causal_attention(q, k, v, 1 / std::sqrt(head_dim));   // [b, t, heads, head_dim]
//
// = softmax(causal_mask(q k^T * scale, q_offset), -1) v per (batch, head) without the
// [b, heads, tq, tk] scores in memory on GPUs. k and v may have another length tk; query i sits
// at position i + q_offset and sees keys j <= i + q_offset (a query that sees no key gives 0).
// k and v may have fewer heads than q (grouped-query attention: kv_heads dividing heads; query
// head h reads kv head h / (heads / kv_heads), HF's repeat_kv without the copies; sharding the
// heads over tp then needs tp dividing kv_heads, so each device keeps whole groups).
//
// Rules (per axis): attention is nonlinear, so a P input is an error; the batch (dim 0) and heads
// (dim 2) may be sharded but then q, k and v must be sharded alike (each device pairs its own
// queries with its own keys); the sequence (dim 1) must not be sharded: the softmax needs every
// key, and the causal mask global positions (under context parallelism use RingCausalAttention
// of models/parallel/ring_attention.h over the cp axis); head_dim (dim 3) must be whole. The output has
// the join of the three types; the gradients are linear in the output's cotangent (its P stays
// P), and R primals get P gradients where the cotangent is varying.
#ifndef SHARDMAP_SHARDMAP_OPS_ATTENTION_OPS_H_
#define SHARDMAP_SHARDMAP_OPS_ATTENTION_OPS_H_

#include <cstdint>

#include "shardmap/value.h"

namespace shardmap {

Value causal_attention(const Value& q, const Value& k, const Value& v, double scale,
                       int64_t q_offset = 0);

}  // namespace shardmap

#endif  // SHARDMAP_SHARDMAP_OPS_ATTENTION_OPS_H_
