// Linear layers with fused epilogues, the GEMM forms of their backward passes, and the
// mixed-precision weight-gradient accumulation. On CUDA tensors these are single cuBLASLt calls
// with epilogues (bias, GELU with its input kept, dGELU with the bias gradient, the bias gradient
// of a weight-gradient GEMM, beta = 1 accumulation); on the CPU they compose Matmul, Add, Gelu,
// GeluGrad, Sum and Cast, and serve as the reference the GPU versions are tested against.
//
//   LinearResult h = Linear(x /*bf16[b,s,k]*/, w1 /*[k,n]*/, b1 /*[n]*/,
//                           LinearEpilogue::kBiasGelu);
//   // h.y = gelu(x @ w1 + b1); h.pre = x @ w1 + b1 (the GELU input, kept for the backward)
//   LinearGeluGrads g = LinearGeluBackward(dy /*[b,s,n2]*/, w2 /*[n,n2]*/, h.pre);
//   // g.dpre = (dy @ w2^T) * gelu'(h.pre); g.dbias = g.dpre summed over rows: db1 [n]
//   LinearWeightGrads wg = LinearWeightGrad(x, g.dpre, /*bias_grad=*/false);  // dw1 [k,n]
//
//   Tensor acc = Tensor::Zeros(MatmulShape(x2, dpre2, true), DType::kF32, x2.device());
//   MatmulAccumulate(acc, x2 /*bf16[rows,k]*/, dpre2 /*bf16[rows,n]*/, true);  // acc += x2^T dpre2
//
// bf16/f16 compute in f32 and round each output once (as Matmul does); f32 never uses TF32. The
// GPU's fused GELU is the tanh approximation: GeluApprox::kNone (erf) composes unfused ops there.
// Errors (OpError) name the op, the shapes and the offending argument.
#ifndef SHARDMAP_TENSOR_OPS_LINEAR_H_
#define SHARDMAP_TENSOR_OPS_LINEAR_H_

#include <cstdint>

#include "tensor/ops/elementwise.h"
#include "tensor/tensor.h"

namespace shardmap {

enum class LinearEpilogue : uint8_t { kNone, kBias, kGelu, kBiasGelu };

struct LinearResult {
  Tensor y;
  Tensor pre;  // the GELU input, for kGelu and kBiasGelu; undefined otherwise
};

// y = epilogue(x [..., k] @ w [k, n]), [..., n]. bias [n] must be given exactly for kBias and
// kBiasGelu (undefined otherwise).
LinearResult Linear(const Tensor& x, const Tensor& w, const Tensor& bias, LinearEpilogue epilogue,
                    GeluApprox approx = GeluApprox::kTanh);

struct LinearGeluGrads {
  Tensor dpre;   // [..., n]
  Tensor dbias;  // [n]; undefined without bias_grad
};

// The backward of a GELU linear layer through the next layer's weight: dpre = (dy [..., n2] @
// w [n, n2]^T) * gelu'(pre [..., n]), and dbias = dpre summed over all leading dims.
LinearGeluGrads LinearGeluBackward(const Tensor& dy, const Tensor& w, const Tensor& pre,
                                   bool bias_grad = true, GeluApprox approx = GeluApprox::kTanh);

struct LinearWeightGrads {
  Tensor dw;  // [k, n]
  Tensor db;  // [n]; undefined without bias_grad
};

// dw = x [..., k]^T @ dy [..., n] (leading dims folded, and equal), db = BiasGrad(dy).
LinearWeightGrads LinearWeightGrad(const Tensor& x, const Tensor& dy, bool bias_grad = true);

// dy [..., n] summed over all its leading dims: [n], in dy's dtype (f32 accumulation for half).
Tensor BiasGrad(const Tensor& dy);

// acc += op(a) @ op(b), in place, with Matmul's shape rules; acc is f32 for f32/bf16/f16
// operands (products accumulate without rounding to the operand dtype) and f64 for f64 ones.
void MatmulAccumulate(Tensor& acc, const Tensor& a, const Tensor& b, bool trans_a = false,
                      bool trans_b = false);

// The shape Matmul(a, b, trans_a, trans_b) returns, with Matmul's checks and errors (defined in
// matmul.cc). For allocating accumulators.
Shape MatmulShape(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false);

}  // namespace shardmap

#endif  // SHARDMAP_TENSOR_OPS_LINEAR_H_
