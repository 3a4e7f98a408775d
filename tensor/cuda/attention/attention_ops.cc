#include "tensor/cuda/attention/attention_ops.h"

#include <climits>
#include <cstdlib>
#include <string>

#include "tensor/cuda/attention/tiling.h"
#include "tensor/error.h"

#if SHARDMAP_HAS_CUDA
#include <cuda_runtime.h>

#include "tensor/cuda/attention/kernels.h"
#include "tensor/cuda/internal/cuda_check.h"
#include "tensor/cuda/runtime.h"
#endif

namespace shardmap::cuda {

namespace ak = attention_kernels;

void CheckCudaAttentionSizes(int64_t batch, int64_t heads, int64_t tq, int64_t tk,
                             int64_t head_dim) {
  if (ak::PaddedHeadDim(head_dim) == 0) {
    OpFail("causal_attention: head_dim ", head_dim, " is not supported by the CUDA kernel (1 to ",
           ak::kMaxHeadDim, "); split the heads further or use the materialised path "
           "(einsum + causal_softmax)");
  }
  const int64_t bh = batch * heads;
  const ak::AttentionTiling f = ak::ForwardTiling(bh, tq, head_dim, 4);
  const ak::AttentionTiling g = ak::KeyGradTiling(bh, tk, head_dim, 4);
  if (f.blocks > INT_MAX || g.blocks > INT_MAX) {
    OpFail("causal_attention: batch*heads ", bh, " with ", tq, " queries and ", tk,
           " keys needs more than 2^31-1 CUDA blocks; split the batch");
  }
}

AttentionKernel AttentionKernelFromEnv() {
  const char* env = std::getenv("SHARDMAP_ATTENTION_KERNEL");
  const std::string v = env == nullptr ? "" : env;
  if (v.empty() || v == "auto" || v == "tc") return AttentionKernel::kAuto;
  if (v == "simt") return AttentionKernel::kSimt;
  OpFail("causal_attention: SHARDMAP_ATTENTION_KERNEL='", v,
         "' is not one of simt, tc, auto (tc and auto: tensor cores for bf16/f16 with head_dim "
         "64 or 128, SIMT elsewhere; simt: SIMT everywhere)");
}

AttentionKernel ResolveAttentionKernel(AttentionKernel requested, DType dtype, int64_t head_dim) {
  const bool eligible = ak::TensorCoreEligible(dtype, head_dim);
  if (requested == AttentionKernel::kTensorCore && !eligible) {
    OpFail("causal_attention: the tensor-core kernel runs bf16 or f16 with head_dim 64 or 128, "
           "not ", DTypeName(dtype), " with head_dim ", head_dim,
           "; request AttentionKernel::kAuto or kSimt");
  }
  if (requested == AttentionKernel::kAuto) requested = AttentionKernelFromEnv();
  if (requested == AttentionKernel::kSimt) return AttentionKernel::kSimt;
  return eligible ? AttentionKernel::kTensorCore : AttentionKernel::kSimt;
}

#if SHARDMAP_HAS_CUDA

namespace {

#define SM_ATTN_LAUNCH(expr) SM_CUDA_CHECK(static_cast<cudaError_t>(expr))

DType AccType(DType t) { return t == DType::kF64 ? DType::kF64 : DType::kF32; }

ak::AttentionDims DimsOf(const Tensor& q, const Tensor& k, double scale, int64_t q_offset,
                         AttentionKernel kernel) {
  ak::AttentionDims d;
  d.batch = q.dim(0);
  d.tq = q.dim(1);
  d.heads = q.dim(2);
  d.kv_heads = k.dim(2);  // grouped-query attention: fewer kv heads (checked by the caller)
  d.head_dim = q.dim(3);
  d.tk = k.dim(1);
  d.q_offset = q_offset;
  d.scale = scale;
  d.kernel = ResolveAttentionKernel(kernel, q.dtype(), q.dim(3));
  return d;
}

}  // namespace

AttentionOutputs CausalAttention(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                                 int64_t q_offset, AttentionKernel kernel) {
  CheckCudaAttentionSizes(q.dim(0), q.dim(2), q.dim(1), k.dim(1), q.dim(3));
  const Device device = q.device();
  DeviceGuard guard(device.index);
  void* stream = CurrentStream(device.index);
  AttentionOutputs r;
  r.out = Tensor::Empty(q.shape(), q.dtype(), device);
  r.lse = Tensor::Empty({q.dim(0), q.dim(2), q.dim(1)}, AccType(q.dtype()), device);
  SM_ATTN_LAUNCH(ak::LaunchForward(q.raw_data(), k.raw_data(), v.raw_data(), r.out.raw_data(),
                                   r.lse.raw_data(), q.dtype(),
                                   DimsOf(q, k, scale, q_offset, kernel), stream));
  return r;
}

AttentionGrads CausalAttentionBackward(const Tensor& q, const Tensor& k, const Tensor& v,
                                       const Tensor& out, const Tensor& lse, const Tensor& dout,
                                       double scale, int64_t q_offset, AttentionKernel kernel) {
  CheckCudaAttentionSizes(q.dim(0), q.dim(2), q.dim(1), k.dim(1), q.dim(3));
  const Device device = q.device();
  DeviceGuard guard(device.index);
  void* stream = CurrentStream(device.index);
  AttentionGrads g;
  g.dq = Tensor::Empty(q.shape(), q.dtype(), device);
  g.dk = Tensor::Empty(k.shape(), k.dtype(), device);
  g.dv = Tensor::Empty(v.shape(), v.dtype(), device);
  Tensor delta = Tensor::Empty({q.dim(0), q.dim(2), q.dim(1)}, AccType(q.dtype()), device);
  SM_ATTN_LAUNCH(ak::LaunchBackward(q.raw_data(), k.raw_data(), v.raw_data(), out.raw_data(),
                                    lse.raw_data(), dout.raw_data(), g.dq.raw_data(),
                                    g.dk.raw_data(), g.dv.raw_data(), delta.raw_data(), q.dtype(),
                                    DimsOf(q, k, scale, q_offset, kernel), stream));
  return g;
}

#else  // !SHARDMAP_HAS_CUDA

AttentionOutputs CausalAttention(const Tensor&, const Tensor&, const Tensor&, double, int64_t,
                                 AttentionKernel) {
  OpFail("causal_attention: a CUDA tensor, but this build of shardmap was built without CUDA");
}
AttentionGrads CausalAttentionBackward(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                       const Tensor&, const Tensor&, double, int64_t,
                                       AttentionKernel) {
  OpFail("causal_attention_backward: a CUDA tensor, but this build of shardmap was built "
         "without CUDA");
}

#endif  // SHARDMAP_HAS_CUDA

}  // namespace shardmap::cuda
