// Matrix products through OpenBLAS (one thread per call: ranks are the parallelism).
//
//   Matmul(a /*f32[m,k]*/, b /*f32[k,n]*/)                  -> f32[m,n]
//   Matmul(a /*f32[k,m]*/, b /*f32[n,k]*/, true, true)      -> f32[m,n]   (a^T b^T)
//   Matmul(x /*f32[b,s,k]*/, w /*f32[k,n]*/)                -> f32[b,s,n] (leading dims of a fold)
//   Matmul(q /*f32[b,h,s,d]*/, k /*f32[b,h,t,d]*/, false, true) -> f32[b,h,s,t] (batched)
//
// Rules: b of rank 2 multiplies the last dim of an a of any rank >= 2 (with trans_a only for rank
// 2); otherwise both operands have equal rank >= 3 and equal leading (batch) dims. f32 and f64 use
// BLAS; bf16/f16 compute in f32 and round once. Errors name the shapes and the flags.
#ifndef SHARDMAP_TENSOR_OPS_MATMUL_H_
#define SHARDMAP_TENSOR_OPS_MATMUL_H_

#include "tensor/tensor.h"

namespace shardmap {

Tensor Matmul(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false);

// Configures OpenBLAS for one thread per call; called once by Matmul, idempotent.
void PinBlasToOneThread();

}  // namespace shardmap

#endif  // SHARDMAP_TENSOR_OPS_MATMUL_H_
