// Printing. 1-D and 2-D as usual; 3-D and up as a "matrix of matrices": the blocks of the
// innermost two dims are laid side by side along dim -3, those rows stacked along dim -4, side by
// side again along dim -5, ..., so every axis can be identified.
//
//   std::cout << ToString(Tensor::Arange(6).Reshape({2, 3}));
//   // f32[2,3]
//   // [[0, 1, 2],
//   //  [3, 4, 5]]
#ifndef SHARDMAP_TENSOR_PRINT_H_
#define SHARDMAP_TENSOR_PRINT_H_

#include <ostream>
#include <string>

#include "tensor/tensor.h"

namespace shardmap {

struct PrintOptions {
  int precision = 4;
  // Dims longer than this show their first and last edge_items/2 entries around "...".
  int64_t max_per_dim = 16;
  int64_t edge_items = 6;
};

std::string ToString(const Tensor& t, const PrintOptions& options = {});
std::ostream& operator<<(std::ostream& os, const Tensor& t);

}  // namespace shardmap

#endif  // SHARDMAP_TENSOR_PRINT_H_
