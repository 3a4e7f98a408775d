// Elementwise kernel launchers (binary.cu, unary.cu): plain host functions on raw device
// pointers, for the CUDA side of tensor/ops/elementwise.h. Each returns a cudaError_t as int.
//
//   // out[i] = a[i] + b[i] over n elements (equal shapes):
//   LaunchBinary(BinaryOp::kAdd, a, b, out, n, DType::kBF16, /*dims=*/nullptr, stream);
//   // bias f32[8] over f32[4,8]: collapsed dims {4,8}, strides a {8,1}, b {0,1}
//   BroadcastDims d = CollapseBroadcast({4, 8}, {4, 8}, {8});
//   LaunchBinary(BinaryOp::kAdd, x, bias, out, 32, DType::kF32, &d, stream);
//   LaunchUnary(UnaryOp::kMulScalar, x, y, n, DType::kF32, /*scalar=*/0.5, stream);
//
// Floating dtypes only (f32, f64, bf16, f16); bf16/f16 compute in f32 and round once (round to
// nearest even), f64 in double, exactly like the CPU loops. Operands may alias the output
// exactly (AddInPlace is Add with out == a), never partially.
#ifndef SHARDMAP_TENSOR_CUDA_ELEMENTWISE_ELEMENTWISE_KERNELS_H_
#define SHARDMAP_TENSOR_CUDA_ELEMENTWISE_ELEMENTWISE_KERNELS_H_

#include <cstdint>

#include "tensor/dtype.h"

namespace shardmap::cuda::kernels {

enum class BinaryOp : int {
  kAdd,
  kSub,
  kMul,
  kDiv,
  // Backward ops: (a, b) = (x or y, dy), equal shapes.
  kReluGrad,      // x > 0 ? dy : 0
  kGeluTanhGrad,  // dy * gelu_tanh'(x)
  kGeluErfGrad,   // dy * gelu_erf'(x)
  kSiluGrad,      // dy * silu'(x)
  kTanhGrad,      // dy * (1 - y*y)
};

enum class UnaryOp : int {
  kAddScalar,  // x + scalar
  kMulScalar,  // x * scalar
  kNeg,
  kExp,
  kLog,
  kTanh,
  kRelu,  // NaN stays NaN
  kSqrt,
  kGeluTanh,
  kGeluErf,
  kSilu,
};

constexpr int kMaxBroadcastRank = 8;

// A broadcast after collapsing: dims of size 1 dropped, neighbouring dims merged where both
// operands stay contiguous across them. Outermost first; strides in elements, 0 = broadcast.
struct BroadcastDims {
  int rank = 0;
  int64_t sizes[kMaxBroadcastRank] = {};
  int64_t a_strides[kMaxBroadcastRank] = {};
  int64_t b_strides[kMaxBroadcastRank] = {};
};

// Collapses the NumPy broadcast of shapes a and b to out (out must be their broadcast shape).
// Returns false when the collapsed rank exceeds kMaxBroadcastRank. Host code, header-only.
inline bool CollapseBroadcast(const int64_t* out, int out_rank, const int64_t* a, int a_rank,
                              const int64_t* b, int b_rank, BroadcastDims* d) {
  // Full-rank strides first (innermost last), like the CPU kernel.
  int64_t as = 1, bs = 1;
  int64_t a_str[64], b_str[64];
  if (out_rank > 64) return false;
  for (int i = out_rank - 1; i >= 0; --i) {
    const int ai = i - (out_rank - a_rank), bi = i - (out_rank - b_rank);
    const int64_t ad = ai >= 0 ? a[ai] : 1, bd = bi >= 0 ? b[bi] : 1;
    a_str[i] = ad == 1 ? 0 : as;
    b_str[i] = bd == 1 ? 0 : bs;
    as *= ad;
    bs *= bd;
  }
  d->rank = 0;
  for (int i = 0; i < out_rank; ++i) {
    if (out[i] == 1) continue;
    const int r = d->rank;
    if (r > 0 && d->a_strides[r - 1] == a_str[i] * out[i] &&
        d->b_strides[r - 1] == b_str[i] * out[i]) {
      d->sizes[r - 1] *= out[i];
      d->a_strides[r - 1] = a_str[i];
      d->b_strides[r - 1] = b_str[i];
    } else {
      if (r == kMaxBroadcastRank) return false;
      d->sizes[r] = out[i];
      d->a_strides[r] = a_str[i];
      d->b_strides[r] = b_str[i];
      d->rank = r + 1;
    }
  }
  return true;
}

// Which kernel a (collapsed) broadcast takes. Header-only so host tests can check the choice.
enum class BinaryPath {
  kSame,     // a[i], b[i]        (equal shapes, or equal once size-1 dims are dropped)
  kScalarA,  // a[0], b[i]
  kScalarB,  // a[i], b[0]
  kRowA,     // a[i % inner], b[i] (a is one row [inner] broadcast over the rows of b)
  kRowB,     // a[i], b[i % inner]
  kGeneral,  // per-element index math over dims
};

inline BinaryPath ClassifyBroadcast(const BroadcastDims* dims) {
  if (dims == nullptr || dims->rank == 0) return BinaryPath::kSame;
  const BroadcastDims& d = *dims;
  if (d.rank == 1) {
    if (d.a_strides[0] == 1 && d.b_strides[0] == 1) return BinaryPath::kSame;
    if (d.a_strides[0] == 0 && d.b_strides[0] == 1) return BinaryPath::kScalarA;
    if (d.a_strides[0] == 1 && d.b_strides[0] == 0) return BinaryPath::kScalarB;
  }
  if (d.rank == 2) {
    const int64_t inner = d.sizes[1];
    if (d.a_strides[0] == inner && d.a_strides[1] == 1 && d.b_strides[0] == 0 &&
        d.b_strides[1] == 1) {
      return BinaryPath::kRowB;
    }
    if (d.b_strides[0] == inner && d.b_strides[1] == 1 && d.a_strides[0] == 0 &&
        d.a_strides[1] == 1) {
      return BinaryPath::kRowA;
    }
  }
  return BinaryPath::kGeneral;
}

// out[i] = op(a[.], b[.]) for the n elements of the output. dims == nullptr: a, b and out all
// have n elements. Otherwise the general broadcast described by *dims (n = product of sizes);
// a broadcast whose collapsed form is a single dim (one operand a scalar, the other contiguous)
// and equal shapes take the vectorised paths.
int LaunchBinary(BinaryOp op, const void* a, const void* b, void* out, int64_t n, DType dtype,
                 const BroadcastDims* dims, void* stream);

// y[i] = op(x[i]) (scalar used by kAddScalar and kMulScalar: converted to the compute type,
// like the CPU's static_cast). x and y may be the same pointer.
int LaunchUnary(UnaryOp op, const void* x, void* y, int64_t n, DType dtype, double scalar,
                void* stream);

}  // namespace shardmap::cuda::kernels

#endif  // SHARDMAP_TENSOR_CUDA_ELEMENTWISE_ELEMENTWISE_KERNELS_H_
