// Launchers of the fused causal attention kernels (attention.cu), called by attention_ops.cc.
//
//   AttentionDims dims{batch, heads, tq, tk, head_dim, q_offset, scale};
//   int e = attention_kernels::LaunchForward(q, k, v, o, lse, DType::kBF16, dims, stream);
//   SM_CUDA_CHECK(static_cast<cudaError_t>(e));
//
// Plain C++: raw device pointers, the element DType, a cudaStream_t as void*; each returns a
// cudaError_t as int. Layouts are contiguous: q, o, dq, do [b, tq, h, d]; k, v, dk, dv
// [b, tk, h, d]; lse and delta [b, h, tq] in the accumulator type A (double for f64 data, float
// otherwise). Every product and sum is in A; outputs round once to the element type.
// Grouped-query attention: k, v, dk, dv have kv_heads heads (dividing heads); query head h reads
// kv head h / (heads / kv_heads), and dk, dv sum over the query heads of their group (inside one
// block, still without atomics).
//
// Causality: query i sits at position i + q_offset and sees keys j <= i + q_offset. A query that
// sees no key gets o = 0, lse = -inf and zero gradients. The caller clamps q_offset to
// [-tq - 1, tk] (anything beyond masks all or nothing) and checks head_dim <= kMaxHeadDim.
// The scores [b, h, tq, tk] never exist in memory: each block streams K/V (or Q/dO) tiles through
// shared memory with an online softmax (FlashAttention-2's forward; its backward recomputes the
// probabilities from lse, one kernel for dK/dV per key block and one for dQ per query block, so
// nothing is accumulated with atomics and the results are deterministic). bf16/f16 with
// head_dim 64 or 128 take the tensor-core kernels (tc_kernels.h, attention_tc.cu) unless
// dims.kernel is kSimt; everything else takes the SIMT kernels of attention.cu.
#ifndef SHARDMAP_TENSOR_CUDA_ATTENTION_KERNELS_H_
#define SHARDMAP_TENSOR_CUDA_ATTENTION_KERNELS_H_

#include <cstdint>

#include "tensor/cuda/attention/tc_tiling.h"
#include "tensor/dtype.h"

namespace shardmap::cuda::attention_kernels {

struct AttentionDims {
  int64_t batch = 0, heads = 0, tq = 0, tk = 0, head_dim = 0;
  int64_t kv_heads = 0;  // heads of k and v (dividing heads); 0: heads
  int64_t q_offset = 0;
  double scale = 1.0;
  // bf16/f16 with head_dim 64 or 128 run on tensor cores (attention_tc.cu) unless kSimt.
  AttentionKernel kernel = AttentionKernel::kAuto;
};

// o [b, tq, h, d] (dtype) and lse [b, h, tq] (A) of softmax(q k^T * scale, causal) v.
int LaunchForward(const void* q, const void* k, const void* v, void* o, void* lse, DType dtype,
                  const AttentionDims& dims, void* stream);

// dq, dk, dv (dtype) from the forward's o and lse and the output gradient dout. `delta` is a
// workspace of b * h * tq elements of A (rowsum(dout * o)).
int LaunchBackward(const void* q, const void* k, const void* v, const void* o, const void* lse,
                   const void* dout, void* dq, void* dk, void* dv, void* delta, DType dtype,
                   const AttentionDims& dims, void* stream);

}  // namespace shardmap::cuda::attention_kernels

#endif  // SHARDMAP_TENSOR_CUDA_ATTENTION_KERNELS_H_
