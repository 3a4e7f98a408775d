// Row routing kernels for mixture-of-experts layers, on the CPU and on GPU tensors
// (tensor/cuda/routing: the same results; ScatterAddRows sums with atomics there, so rows hit
// twice may differ in the last bits between runs). Indices live on the data's device.
//
//   TopKResult t = TopK(probs /*[n,e]*/, 2);       // t.values [n,2] (descending), t.indices i64
//   Tensor dx = TopKBackward(dvalues, t.indices, 8); // [n,8]: dvalues scattered to the picks
//   Tensor b = GatherRows(x /*[n,d]*/, idx /*[m]*/);          // b[i] = x[idx[i]], 0 where idx = -1
//   Tensor y = ScatterAddRows(b /*[m,d]*/, idx /*[m]*/, n);   // y[idx[i]] += b[i]; -1 skipped
//
// GatherRows and ScatterAddRows are each other's transpose (the VJP pair). Rows are x's
// leading dims flattened: x [a, b, d] has a*b rows of d. Ties in TopK go to the lower index
// (deterministic); NaN input is an OpError.
#ifndef SHARDMAP_TENSOR_OPS_ROUTING_H_
#define SHARDMAP_TENSOR_OPS_ROUTING_H_

#include <cstdint>
#include <string>

#include "tensor/tensor.h"

namespace shardmap {

struct TopKResult {
  Tensor values;   // x's dtype, shape x.shape with the last dim k
  Tensor indices;  // i64, same shape
};
// The k largest entries along the last dim, in descending order. 1 <= k <= x.dim(-1).
TopKResult TopK(const Tensor& x, int64_t k);
// dvalues [..., k] put at `indices` of a zero [..., n] tensor (dvalues' dtype).
Tensor TopKBackward(const Tensor& dvalues, const Tensor& indices, int64_t n);

// out[i, :] = x_rows[idx[i], :] for idx[i] in [0, rows), zeros for idx[i] == -1.
// x rank >= 2; idx i32/i64 of rank 1; out [m, x.dim(-1)], x's dtype.
Tensor GatherRows(const Tensor& x, const Tensor& idx);
// out [n, x.dim(-1)] zeros, then out[idx[i], :] += x_rows[i, :] (idx[i] == -1 skipped).
// x has idx.numel() rows.
Tensor ScatterAddRows(const Tensor& x, const Tensor& idx, int64_t n);

// Indices of a shard: out[i] (i64, ids' shape and device) = i * stride + (ids[i] - start) where
// start <= ids[i] < start + size, else -1 (stride 0: the local row of a vocab shard; stride =
// size: the flat position in a [n, size] shard, for take-along-last gathers). strict: an id
// outside the range is an OpError "<op>: index <id> at position <i> is out of range
// [start, start + size)<context>" instead of -1. ids i32/i64 of any shape.
Tensor LocalIndices(const Tensor& ids, int64_t start, int64_t size, int64_t stride = 0,
                    bool strict = false, const char* op = "local_indices",
                    const std::string& context = "");

}  // namespace shardmap

#endif  // SHARDMAP_TENSOR_OPS_ROUTING_H_
