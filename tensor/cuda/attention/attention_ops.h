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
// Kernels: bf16/f16 with head_dim 64 or 128 run on tensor cores (WMMA, attention_tc.cu), all
// else on the SIMT kernels (attention.cu). `kernel` overrides the choice (tests, benchmarks);
// with kAuto the environment variable SHARDMAP_ATTENTION_KERNEL=simt forces SIMT everywhere
// (tc or auto: tensor cores where eligible).
//
// Builds without the CUDA toolkit: every function throws OpError ("built without CUDA").
#ifndef SHARDMAP_TENSOR_CUDA_ATTENTION_ATTENTION_OPS_H_
#define SHARDMAP_TENSOR_CUDA_ATTENTION_ATTENTION_OPS_H_

#include <cstdint>

#include "tensor/cuda/attention/tc_tiling.h"
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

using AttentionKernel = attention_kernels::AttentionKernel;

// SHARDMAP_ATTENTION_KERNEL: unset, "", "auto" or "tc" -> kAuto; "simt" -> kSimt; anything else
// throws OpError naming the variable and the accepted values. Read on every call (cheap), so
// a benchmark may switch it between runs.
AttentionKernel AttentionKernelFromEnv();

// The kernel a call with `requested` runs for this dtype and head_dim: kAuto resolves through
// the environment, then to kTensorCore where eligible and kSimt elsewhere. kTensorCore on an
// ineligible dtype/head_dim throws OpError (what runs on tensor cores, and how to fall back).
AttentionKernel ResolveAttentionKernel(AttentionKernel requested, DType dtype, int64_t head_dim);

AttentionOutputs CausalAttention(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                                 int64_t q_offset,
                                 AttentionKernel kernel = AttentionKernel::kAuto);
AttentionGrads CausalAttentionBackward(const Tensor& q, const Tensor& k, const Tensor& v,
                                       const Tensor& out, const Tensor& lse, const Tensor& dout,
                                       double scale, int64_t q_offset,
                                       AttentionKernel kernel = AttentionKernel::kAuto);

}  // namespace shardmap::cuda

#endif  // SHARDMAP_TENSOR_CUDA_ATTENTION_ATTENTION_OPS_H_
