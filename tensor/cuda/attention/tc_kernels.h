// Tensor-core (WMMA) fused causal attention for bf16/f16 with head_dim 64 or 128
// (attention_tc.cu); called by attention.cu's launchers when tc_tiling.h's UseTensorCores says
// so. Same contract as kernels.h (layouts, causality, f32 lse/delta, no host sync); products
// run as bf16/f16 16x16x16 fragments with f32 accumulation, so P and dS are rounded to the
// element type before their GEMMs (as FlashAttention-2 does), the softmax statistics stay f32.
//
//   if (UseTensorCores(dtype, dims.head_dim, dims.kernel, aligned))
//     return LaunchTcForward(q, k, v, o, lse, dtype, dims, stream);
#ifndef SHARDMAP_TENSOR_CUDA_ATTENTION_TC_KERNELS_H_
#define SHARDMAP_TENSOR_CUDA_ATTENTION_TC_KERNELS_H_

#include "tensor/cuda/attention/kernels.h"
#include "tensor/dtype.h"

namespace shardmap::cuda::attention_kernels {

// o and lse. Requires TensorCoreEligible(dtype, head_dim), tq > 0, batch * heads > 0 and
// 16-byte aligned q, k, v.
int LaunchTcForward(const void* q, const void* k, const void* v, void* o, void* lse, DType dtype,
                    const AttentionDims& dims, void* stream);

// dq, dk, dv given delta = rowsum(dout * o) (already computed). Requires as LaunchTcForward plus
// tk > 0 and 16-byte aligned dout.
int LaunchTcGrads(const void* q, const void* k, const void* v, const void* dout, const void* lse,
                  const void* delta, void* dq, void* dk, void* dv, DType dtype,
                  const AttentionDims& dims, void* stream);

}  // namespace shardmap::cuda::attention_kernels

#endif  // SHARDMAP_TENSOR_CUDA_ATTENTION_TC_KERNELS_H_
