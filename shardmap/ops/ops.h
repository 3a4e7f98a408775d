// Typed tensor ops on Values: each computes the local kernel (tensor/ops), derives the output's
// SPMD type from its operands' (docs/design.md 4.2), and records itself with a VJP written in
// typed ops on the tape (shardmap/tape_hook.h).
//
//   Value h = gelu(x.matmul(w1));        // nonlinear: P is an error, other types pass through
//   Value y = h.matmul(w2);              // S1 @ S0 contracting on tp -> P on tp
//   Value z = y + b;                     // P + R: error (the "bias before the all-reduce" bug)
//   Value s = sum_partial(x, {0});       // x S0 on dp: the local sum is P on dp
//
// Rules, per mesh axis (checked when the context's TypeCheck is kOn):
//   nonlinear (exp, log, tanh, relu, gelu, silu, sqrt, softmax, norms, max): P is an error.
//   linear (+, -, neg, reshape, transpose, slice, concat, sum over unsharded dims):
//       P+P=P, R+R=R, I+I=I, V+V=V, R+V=V (R is promoted; the transpose reinterprets the V
//       cotangent as P, no communication); I with anything else, P+R and P+V are errors.
//   multilinear (*, matmul): R*R=R, I*I=I, R*V=V, P*R=P; P*P, P*V and I*other are errors;
//       a matmul contracting a dim that both operands hold as S on the same axis gives P;
//       sharded free/batch dims stay S. Division is multilinear in the numerator and nonlinear
//       in the divisor.
//   reductions: summing a dim held as S(d) is an error except through sum_partial (-> P).
//   layout: transpose/permute move S(d) with the dim; reshape moves S(d) to an output dim with
//       as many elements before it as before d, after as many size-1 dims as precede d in its
//       block ([1, h*hd] -> [1, h, hd] keeps S on h, and [.., h*hd] -> [.., h, hd] keeps S on
//       h at one head per device; ReshapeDim has the cases), otherwise the axis
//       becomes plain V; slicing a sharded dim or concatenating along it gives V.
// Scalar add to a P value is an error (it would be added once per device); scalar multiply is
// linear. Errors throw OpError naming the op, each operand as "f32[4,8]{dp:S0,tp:P}", the rule
// and the fix.
//
// Binary elementwise ops broadcast as numpy does (trailing dims aligned, size-1 dims stretched):
// f32[4,8] + f32[8] and f32[4,1] * f32[1,8] work; S on a broadcast size-1 dim becomes V.
// Matmul/einsum operands sharded over one axis on dims that do not match (or a sharded
// contracted dim against a whole one) are an error (docs/design.md section 4.2; declare intended
// per-device blocks with as_varying, collective_ops.h); two V operands of unknown dims give V
// (never P: a P must be a known partial sum); two S operands of elementwise ops agree only when
// they shard the same output dim, otherwise V. Every V of unknown layout records where it came
// from (v_origin.h), and later errors name it.
#ifndef SHARDMAP_SHARDMAP_OPS_OPS_H_
#define SHARDMAP_SHARDMAP_OPS_OPS_H_

#include <vector>

#include "shardmap/value.h"
#include "tensor/ops/elementwise.h"

namespace shardmap {

Value add(const Value& a, const Value& b);
Value sub(const Value& a, const Value& b);
Value mul(const Value& a, const Value& b);
Value div(const Value& a, const Value& b);
Value neg(const Value& a);
Value add_scalar(const Value& a, double s);
Value mul_scalar(const Value& a, double s);

inline Value operator+(const Value& a, const Value& b) { return add(a, b); }
inline Value operator-(const Value& a, const Value& b) { return sub(a, b); }
inline Value operator*(const Value& a, const Value& b) { return mul(a, b); }
inline Value operator/(const Value& a, const Value& b) { return div(a, b); }
inline Value operator-(const Value& a) { return neg(a); }
inline Value operator+(const Value& a, double s) { return add_scalar(a, s); }
inline Value operator-(const Value& a, double s) { return add_scalar(a, -s); }
inline Value operator*(const Value& a, double s) { return mul_scalar(a, s); }
inline Value operator*(double s, const Value& a) { return mul_scalar(a, s); }
inline Value operator/(const Value& a, double s) { return mul_scalar(a, 1.0 / s); }

Value exp(const Value& x);
Value log(const Value& x);
Value tanh(const Value& x);
Value relu(const Value& x);
Value sqrt(const Value& x);
Value gelu(const Value& x, GeluApprox approx = GeluApprox::kTanh);
Value silu(const Value& x);

Value matmul(const Value& a, const Value& b, bool trans_a = false, bool trans_b = false);

Value sum(const Value& x, const std::vector<int>& dims, bool keepdim = false);
Value mean(const Value& x, const std::vector<int>& dims, bool keepdim = false);
// Sums over dims, some of which may be sharded: on each axis holding one of them as S(d), the
// result is P (the local share of the global sum). dims = {} sums everything; summing every dim
// of a V value of unknown layout also gives P (the local share of the total over devices).
Value sum_partial(const Value& x, const std::vector<int>& dims, bool keepdim = false);

// One dim may be -1: inferred from the others (x.reshape({-1}) flattens; {b, -1} keeps dim 0).
Value reshape(const Value& x, absl::Span<const int64_t> shape);
Value transpose(const Value& x, int d0, int d1);
Value permute(const Value& x, const std::vector<int>& perm);
Value slice(const Value& x, int dim, int64_t start, int64_t length);
Value concat(const std::vector<Value>& parts, int dim);
Value cast(const Value& x, DType dtype);
// x as a constant of the differentiation: the same tensor and type, no tape slot, so no
// gradient flows back through it (JAX's lax.stop_gradient, PyTorch's detach()).
Value stop_gradient(const Value& x);

// Backward kernels as typed ops (multilinear in the cotangent dy; not differentiable again).
Value relu_grad(const Value& x, const Value& dy);
Value gelu_grad(const Value& x, const Value& dy, GeluApprox approx = GeluApprox::kTanh);
Value silu_grad(const Value& x, const Value& dy);
Value tanh_grad(const Value& y, const Value& dy);
// Sums dy down to `shape` (undoes broadcasting); sharded dims summed away give P.
Value sum_to_shape(const Value& dy, absl::Span<const int64_t> shape);
// Broadcasts x to `shape` (x's shape must broadcast to it).
Value broadcast_to(const Value& x, absl::Span<const int64_t> shape);

}  // namespace shardmap

#endif  // SHARDMAP_SHARDMAP_OPS_OPS_H_
