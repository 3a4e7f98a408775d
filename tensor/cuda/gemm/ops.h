// Matrix products of CUDA tensors through cuBLASLt: the GPU side of shardmap::Matmul and of the
// fused linear layers in tensor/ops/linear.h. Callers normally use those public ops, which check
// shapes, dtypes and devices and then dispatch here for CUDA tensors.
//
//   Tensor x = RandomTensor({4, 128, 1024}, DType::kBF16).To(Device::Cuda(0));
//   Tensor y = cuda::Matmul(x, w /*bf16[1024,4096]*/, false, false);   // bf16[4,128,4096]
//   Tensor y2, pre;
//   if (!cuda::LinearForward(x, w, b, /*gelu=*/true, &y2, &pre)) { /* compose unfused ops */ }
//
// bf16/f16/f32 operands accumulate in f32 (CUBLAS_COMPUTE_32F: TF32 is never used, so f32
// results match the CPU to ~1e-6 relative); f64 uses CUBLAS_COMPUTE_64F. Work is enqueued on the
// calling thread's current stream of the tensors' device (tensor/cuda/runtime.h) and is
// asynchronous. Plans (descriptors plus the heuristic's algorithm) are cached per shape, so the
// steady state neither queries the heuristic nor allocates beyond the outputs.
//
// The fused entry points return false, having done nothing, when cuBLASLt cannot fuse the case
// (for example GELU with n % 8 != 0, or no algorithm for the epilogue on this GPU); the public
// op then composes unfused ops. cuBLASLt's GELU is the tanh approximation.
//
// This target must not depend on //tensor:ops (which depends on it). Without the CUDA toolkit
// every function throws OpError ("built without CUDA").
#ifndef SHARDMAP_TENSOR_CUDA_GEMM_OPS_H_
#define SHARDMAP_TENSOR_CUDA_GEMM_OPS_H_

#include "tensor/cuda/gemm/internal/gemm.h"
#include "tensor/tensor.h"

namespace shardmap::cuda {

// shardmap::Matmul's rules (tensor/ops/matmul.h), already checked by the caller.
Tensor Matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b);

// acc += op(a) @ op(b) with beta = 1, in place. acc is f32 for f32/bf16/f16 operands (the
// mixed-precision weight-gradient path) and f64 for f64 ones; its shape is Matmul's output.
// Checked by the caller.
void MatmulAccumulate(Tensor& acc, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b);

// x [..., k] @ w [k, n] (+ bias [n]); with gelu: *pre = that sum and *y = gelu_tanh(*pre).
// Without gelu, *pre is left undefined.
bool LinearForward(const Tensor& x, const Tensor& w, const Tensor& bias, bool gelu, Tensor* y,
                   Tensor* pre);

// *dpre = (dy [..., n2] @ w [n, n2]^T) * gelu_tanh'(pre [..., n]); with bias_grad, *dbias [n] is
// the sum of *dpre over all rows (cuBLASLt's DGELU_BGRAD epilogue).
bool LinearGeluBackward(const Tensor& dy, const Tensor& w, const Tensor& pre, bool bias_grad,
                        Tensor* dpre, Tensor* dbias);

// *dw [k, n] = x [..., k]^T @ dy [..., n] with the leading dims folded; with bias_grad, *db [n]
// is dy's row sum, fused as cuBLASLt's bias-gradient epilogue of the rhs.
bool LinearWeightGrad(const Tensor& x, const Tensor& dy, bool bias_grad, Tensor* dw, Tensor* db);

// dy [..., n] summed over all leading dims: [n], in dy's dtype, accumulated in f32 (f64 for
// f64) as a ones[1, rows] @ dy[rows, n] product.
Tensor BiasGrad(const Tensor& dy);

// Counters of the plan cache and cuBLASLt calls, process-wide (all devices, all threads).
using GemmStats = gemm_internal::GemmStats;
GemmStats GetGemmStats();

}  // namespace shardmap::cuda

#endif  // SHARDMAP_TENSOR_CUDA_GEMM_OPS_H_
