// Layout ops. All results are contiguous; Reshape and SliceRows (tensor.h) are views.
//
//   Transpose(x /*[2,3,4]*/, 0, 2)          -> [4,3,2]
//   Permute(x /*[2,3,4]*/, {1, 2, 0})       -> [3,4,2]
//   Slice(x /*[4,10]*/, 1, 2, 5)            -> [4,5]   (dim 1, start 2, length 5)
//   Concat({a /*[2,3]*/, b /*[2,5]*/}, 1)   -> [2,8]
//   Split(x /*[2,8]*/, 1, {3, 5})           -> {[2,3], [2,5]}
//   Cast(x, DType::kBF16)                   (round to nearest even)
#ifndef SHARDMAP_TENSOR_OPS_SHAPE_OPS_H_
#define SHARDMAP_TENSOR_OPS_SHAPE_OPS_H_

#include <vector>

#include "tensor/tensor.h"

namespace shardmap {

// Transpose and Permute always return new storage, even for the identity permutation.
Tensor Transpose(const Tensor& x, int dim0, int dim1);
Tensor Permute(const Tensor& x, const std::vector<int>& perm);
Tensor Slice(const Tensor& x, int dim, int64_t start, int64_t length);
Tensor Concat(const std::vector<Tensor>& parts, int dim);
std::vector<Tensor> Split(const Tensor& x, int dim, const std::vector<int64_t>& sizes);
// Splits dim into n equal chunks; OpError when not divisible.
std::vector<Tensor> Chunk(const Tensor& x, int dim, int n);
// Cast to x's own dtype returns x itself (shared storage, no copy). Float -> int truncates.
Tensor Cast(const Tensor& x, DType dtype);

// Writes `part` into `whole` at offset `start` along `dim` (inverse of Slice; shapes must agree
// on every other dim). Used to assemble sharded outputs.
void SliceAssign(Tensor& whole, int dim, int64_t start, const Tensor& part);

}  // namespace shardmap

#endif  // SHARDMAP_TENSOR_OPS_SHAPE_OPS_H_
