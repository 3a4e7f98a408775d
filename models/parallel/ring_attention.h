// Context parallelism: causal attention over sequences split across the devices of a `cp` axis
// (ring attention), written as per-device code over typed Values.
//
//   // q: [b, t, heads, hd], k, v: [b, t, kv_heads, hd] (kv_heads dividing heads: grouped-query
//   // attention), this device's t = seq/cp tokens of each sequence in the load-balanced
//   // layout (below); heads may be split over tp, b over dp.
//   Value o = RingCausalAttention(q, k, v, "cp", 1 / std::sqrt(hd));   // [b, t, heads, hd]
//
// Load balancing: each sequence of `seq` tokens is cut into 2*cp chunks of c = seq/(2cp) tokens;
// device i holds chunks i and 2cp-1-i (in that order), so under the causal mask every device
// has the same work (an early chunk pairs with a late one).
//
// The ring: K and V travel together, one typed ppermute (device j -> j+1) per step, cp-1 steps,
// with their kv heads as they are: under grouped-query attention (Llama 3) kv head g serves
// query heads g*rep .. g*rep+rep-1 (rep = heads/kv_heads, HF's repeat_kv order) in the
// einsums, so the ring carries heads/kv_heads times fewer bytes than repeated K/V would, and
// the backward's dK/dV sum over each group (the einsum's VJP).
// At step s device i holds the K/V of device src = i-s (mod cp). Key blocks entirely above the
// causal diagonal are skipped, not computed and masked: step 0 computes chunk i x chunk i (masked
// diagonal) and chunk 2cp-1-i x both local chunks (masked with offset c); a source src < i
// contributes its first chunk to both query chunks; src > i both its chunks to the second
// query chunk only. Every step but the first does 2 blocks of c x c per device.
//
// Blocks merge with the online softmax of flash attention: per query row a running max m, sum
// l and unnormalised output acc, in the input dtype (f32 or f64), rescaled by exp(m_old - m_new)
// as blocks arrive; the output is acc / l. The max is a constant for the autograd (the shift
// cancels in acc / l), so the gradient is exact. The backward ring is the autograd's transpose of
// the forward one: each ppermute's VJP sends the K/V cotangent back (j+1 -> j); nothing here is a
// hand-written backward.
//
// Types: the received K/V blocks are V on the cp axis, so the output is V there (the rows are
// still this device's query rows); the other axes keep their types (dp S0 on b, tp S on heads).
// With axis "" (or an axis of size 1) it is the plain blocked causal attention of one device.
#ifndef SHARDMAP_MODELS_PARALLEL_RING_ATTENTION_H_
#define SHARDMAP_MODELS_PARALLEL_RING_ATTENTION_H_

#include <cstdint>
#include <string>

#include "shardmap/value.h"
#include "tensor/tensor.h"

namespace shardmap {

// The global position of token `local` (in [0, seq/cp)) of a sequence on device `index` of cp.
// Needs seq divisible by 2*cp.
int64_t LoadBalancedPosition(int64_t local, int64_t seq, int cp, int index);

// tokens [batch, seq] -> rows [batch*seq] ordered so that cutting them into batch_ways x cp
// contiguous blocks (batch axes major, cp minor: a PartitionSpec dim over (dp..., cp)) gives
// device (w, i) its batch/batch_ways sequences, each as chunks i then 2cp-1-i. cp = 1 is the
// plain row-major flattening. Needs batch divisible by batch_ways and seq by 2*cp.
Tensor LoadBalancedRows(const Tensor& tokens, int batch_ways, int cp);

// Permutes dim `dim` of x (length seq) into the load-balanced order: chunks 0, 2cp-1, 1, 2cp-2,
// ... (device i's pair at positions 2i, 2i+1); `inverse` undoes it. For tests and global views.
Tensor ToLoadBalancedOrder(const Tensor& x, int dim, int cp, bool inverse = false);

// Causal attention softmax(q k^T * scale) v of this device's queries against the keys of the
// whole sequence (see above). q [b, t, heads, hd], k, v [b, t, kv_heads, hd] with kv_heads
// dividing heads and t even (2 chunks per device); returns [b, t, heads, hd]. Throws OpError
// on bad shapes.
Value RingCausalAttention(const Value& q, const Value& k, const Value& v, const std::string& axis,
                          double scale);

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_PARALLEL_RING_ATTENTION_H_
