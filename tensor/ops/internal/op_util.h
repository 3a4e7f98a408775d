// Private helpers shared by the op implementations in tensor/ops/*.cc: argument checks that
// throw OpError with the op name and shapes, dim normalisation, f32/f64 dispatch, and an
// allocation-free odometer for strided loops.
#ifndef SHARDMAP_TENSOR_OPS_INTERNAL_OP_UTIL_H_
#define SHARDMAP_TENSOR_OPS_INTERNAL_OP_UTIL_H_

#include <cstdint>

#include "absl/container/inlined_vector.h"
#include "tensor/error.h"
#include "tensor/tensor.h"

namespace shardmap::internal {

// Small per-dim arrays; inline for rank <= 8 so the small-tensor path stays heap-free.
using DimVec = absl::InlinedVector<int64_t, 8>;

inline bool IsHalf(DType t) { return t == DType::kBF16 || t == DType::kF16; }

inline void RequireDefined(const char* op, const Tensor& t, const char* what) {
  if (!t.defined()) OpFail(op, ": ", what, " is an undefined tensor");
}

inline void RequireFloating(const char* op, const Tensor& t, const char* what = "input") {
  RequireDefined(op, t, what);
  if (!IsFloating(t.dtype())) {
    OpFail(op, ": ", what, " ", t.ShapeString(),
           " has an integer dtype; expected a floating dtype (f32, f64, bf16, f16)");
  }
}

inline void RequireInteger(const char* op, const Tensor& t, const char* what) {
  RequireDefined(op, t, what);
  if (t.dtype() != DType::kI32 && t.dtype() != DType::kI64) {
    OpFail(op, ": ", what, " ", t.ShapeString(), " must have an integer dtype (i32 or i64)");
  }
}

inline void RequireSameDType(const char* op, const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype()) {
    OpFail(op, ": dtype mismatch: ", a.ShapeString(), " vs ", b.ShapeString(),
           "; cast one operand first (Cast)");
  }
}

// Operands of one op must live on one device; a CPU tensor mixed with a GPU one is an error
// (never an implicit copy: it would hide a host<->device transfer in the hot path).
inline void RequireSameDevice(const char* op, const Tensor& a, const Tensor& b) {
  if (a.defined() && b.defined() && a.device() != b.device()) {
    OpFail(op, ": operands live on different devices: ", a.ShapeString(), " on ",
           a.device().ToString(), " and ", b.ShapeString(), " on ", b.device().ToString(),
           "; move one to the other's device with Tensor::To first");
  }
}

inline void RequireSameShape(const char* op, const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) {
    OpFail(op, ": shape mismatch: ", a.ShapeString(), " vs ", b.ShapeString(),
           "; expected equal shapes");
  }
}

// dim in [-rank, rank) -> [0, rank), else OpError naming op and tensor.
inline int NormalizeDim(const char* op, int dim, const Tensor& t) {
  const int r = t.rank();
  if (dim < -r || dim >= r) {
    OpFail(op, ": dim ", dim, " is out of range for ", t.ShapeString(), " (valid: ", -r, " to ",
           r - 1, ")");
  }
  return dim < 0 ? dim + r : dim;
}

// Bytes of a tensor (0 when undefined) and of a shape, for OpCount::bytes.
inline double TensorBytes(const Tensor& t) {
  return t.defined() ? static_cast<double>(t.nbytes()) : 0.0;
}
inline double ShapeBytes(absl::Span<const int64_t> shape, DType dtype) {
  return static_cast<double>(NumElements(shape)) * static_cast<double>(DTypeSize(dtype));
}

// Element i as int64 for an i32/i64 tensor.
inline int64_t IndexAt(const Tensor& ids, int64_t i) {
  return ids.dtype() == DType::kI32 ? ids.data<int32_t>()[i] : ids.data<int64_t>()[i];
}

// Product of shape[begin, end).
inline int64_t Prod(absl::Span<const int64_t> shape, int begin, int end) {
  int64_t n = 1;
  for (int i = begin; i < end; ++i) n *= shape[i];
  return n;
}

// Calls fn(T{}) with T = float for f32 and double for f64.
template <typename Fn>
decltype(auto) DispatchF32F64(DType t, Fn&& fn) {
  if (t == DType::kF64) return fn(double{});
  return fn(float{});
}

}  // namespace shardmap::internal

#endif  // SHARDMAP_TENSOR_OPS_INTERNAL_OP_UTIL_H_
