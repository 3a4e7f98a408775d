// CUDA implementation of the fused causal attention of tensor/ops/attention.h, for GPU tensors.
//
//   cuda::AttentionOutputs f = cuda::CausalAttention(q, k, v, 0.125, /*q_offset=*/0);
//   cuda::AttentionGrads g = cuda::CausalAttentionBackward(q, k, v, f.out, f.lse, dout, 0.125, 0);
//
// The caller (tensor/ops/attention.cc) has checked shapes, dtypes and devices and clamped
// q_offset; these check only what the kernels add: head_dim <= 128 (the register tiles), and
// that the grid fits. Work runs on cuda::CurrentStream of the inputs' device; no host sync, so
// both are legal inside CUDA-graph capture. Deterministic (no atomics).
//
// Builds without the CUDA toolkit: every function throws OpError ("built without CUDA").
#ifndef SHARDMAP_TENSOR_CUDA_ATTENTION_ATTENTION_OPS_H_
#define SHARDMAP_TENSOR_CUDA_ATTENTION_ATTENTION_OPS_H_

#include <cstdint>

#include "tensor/tensor.h"

namespace shardmap::cuda {

struct AttentionOutputs {
  Tensor out;  // [b, tq, h, d], q's dtype
  Tensor lse;  // [b, h, tq], f32 (f64 for f64 inputs)
};
struct AttentionGrads {
  Tensor dq, dk, dv;
};

// Throws OpError naming the limit when the CUDA kernels cannot run these sizes (head_dim above
// 128, a grid over 2^31 - 1 blocks). Callable in any build (pure host logic).
void CheckCudaAttentionSizes(int64_t batch, int64_t heads, int64_t tq, int64_t tk,
                             int64_t head_dim);

AttentionOutputs CausalAttention(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                                 int64_t q_offset);
AttentionGrads CausalAttentionBackward(const Tensor& q, const Tensor& k, const Tensor& v,
                                       const Tensor& out, const Tensor& lse, const Tensor& dout,
                                       double scale, int64_t q_offset);

}  // namespace shardmap::cuda

#endif  // SHARDMAP_TENSOR_CUDA_ATTENTION_ATTENTION_OPS_H_
