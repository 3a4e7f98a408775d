// Fill kernel launcher (tensor/cuda/kernels/fill.cu): dst[i] = value for i < n, value converted
// to dtype (half types round to nearest even). Returns a cudaError_t as int.
#ifndef SHARDMAP_TENSOR_CUDA_KERNELS_FILL_H_
#define SHARDMAP_TENSOR_CUDA_KERNELS_FILL_H_

#include <cstdint>

#include "tensor/dtype.h"

namespace shardmap::cuda::kernels {

int LaunchFill(void* dst, DType dtype, int64_t n, double value, void* stream);

}  // namespace shardmap::cuda::kernels

#endif  // SHARDMAP_TENSOR_CUDA_KERNELS_FILL_H_
