// Reductions over dims.
//
//   Sum(x /*f32[4,5,6]*/, {1})            -> f32[4,6]
//   Sum(x, {1}, /*keepdim=*/true)         -> f32[4,1,6]
//   Sum(x, {})                            -> f32[] (all dims)
//   SumToShape(dy /*f32[4,8]*/, {8})      -> f32[8]  (undoes broadcasting: the VJP of Add)
//
// Negative dims count from the end; a dim listed twice or out of range is an OpError. The mean
// over an empty dim is NaN; Max/Min over an empty dim are an OpError (no identity).
// f32 sums accumulate in f64 where cheap; bf16/f16 accumulate in f32.
#ifndef SHARDMAP_TENSOR_OPS_REDUCE_H_
#define SHARDMAP_TENSOR_OPS_REDUCE_H_

#include <vector>

#include "tensor/tensor.h"

namespace shardmap {

Tensor Sum(const Tensor& x, const std::vector<int>& dims, bool keepdim = false);
Tensor Mean(const Tensor& x, const std::vector<int>& dims, bool keepdim = false);
Tensor Max(const Tensor& x, const std::vector<int>& dims, bool keepdim = false);
Tensor Min(const Tensor& x, const std::vector<int>& dims, bool keepdim = false);
// Index of the max along one dim (first on ties), as i64; the dim is removed unless keepdim.
Tensor ArgMax(const Tensor& x, int dim, bool keepdim = false);

// Sums dy down to `shape`, which dy's shape broadcasts from. Returns dy itself (shared storage)
// when the shapes are already equal.
Tensor SumToShape(const Tensor& dy, absl::Span<const int64_t> shape);

}  // namespace shardmap

#endif  // SHARDMAP_TENSOR_OPS_REDUCE_H_
