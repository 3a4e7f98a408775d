// Elementwise ops with NumPy broadcasting, on floating tensors of one dtype (f32, f64, bf16, f16;
// bf16/f16 compute in f32 and round once).
//
//   Tensor y = Add(x, bias);              // f32[4,8] + f32[8] -> f32[4,8]
//   Tensor g = Gelu(x, GeluApprox::kTanh);
//   Tensor dx = GeluGrad(x, dy, GeluApprox::kTanh);   // dy * gelu'(x)
//
// On the CPU, f32 exp/log/tanh/gelu/silu and the GELU/SiLU gradients run on the SLEEF vector
// kernels of tensor/cpu/vec_math.h (runtime AVX-512/AVX2/SSE2 dispatch; accuracy bound stated
// there: a few ulp); f64 keeps the scalar libm loops.
//
// Errors (OpError): dtype mismatch, shapes that do not broadcast; messages name the op and shapes.
#ifndef SHARDMAP_TENSOR_OPS_ELEMENTWISE_H_
#define SHARDMAP_TENSOR_OPS_ELEMENTWISE_H_

#include "absl/types/span.h"
#include "tensor/tensor.h"

namespace shardmap {

// The broadcast result shape of a and b, or OpError naming `op`.
Shape BroadcastShapes(const char* op, absl::Span<const int64_t> a, absl::Span<const int64_t> b);

Tensor Add(const Tensor& a, const Tensor& b);
Tensor Sub(const Tensor& a, const Tensor& b);
Tensor Mul(const Tensor& a, const Tensor& b);
Tensor Div(const Tensor& a, const Tensor& b);

Tensor AddScalar(const Tensor& a, double s);
Tensor MulScalar(const Tensor& a, double s);
Tensor Neg(const Tensor& a);

Tensor Exp(const Tensor& a);
Tensor Log(const Tensor& a);
Tensor Tanh(const Tensor& a);
Tensor Relu(const Tensor& a);
Tensor Sqrt(const Tensor& a);
enum class GeluApprox : uint8_t { kNone /* erf */, kTanh };
Tensor Gelu(const Tensor& a, GeluApprox approx = GeluApprox::kTanh);
Tensor Silu(const Tensor& a);

// Backward kernels: dy times the derivative, evaluated at the forward input x (or output y).
// x (or y) and dy must have equal shapes and dtypes. Relu and ReluGrad keep NaN visible: relu(NaN)
// is NaN.
Tensor ReluGrad(const Tensor& x, const Tensor& dy);
Tensor GeluGrad(const Tensor& x, const Tensor& dy, GeluApprox approx = GeluApprox::kTanh);
Tensor SiluGrad(const Tensor& x, const Tensor& dy);
Tensor TanhGrad(const Tensor& y, const Tensor& dy);

// In place: acc += x (same shape and dtype). Gradient accumulation uses this. NumPy semantics on
// every device: x is read as it was before the call, even when it overlaps acc (a partially
// overlapping x is copied first; x == acc exactly doubles acc).
void AddInPlace(Tensor& acc, const Tensor& x);

}  // namespace shardmap

#endif  // SHARDMAP_TENSOR_OPS_ELEMENTWISE_H_
