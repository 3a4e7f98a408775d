// Value: what per-device code computes with. A local Tensor, its SPMD type (one AxisType per axis
// of the current mesh, see spmd_type.h) and a tape slot (node >= 0 when it takes part in
// differentiation).
//
//   // inside shard_map (mesh dp x tp), x: f32[4,8]{dp:S0,tp:R}, w1: f32[8,6]{dp:R,tp:S1}
//   Value h = gelu(x.matmul(w1));            // f32[4,6]{dp:S0,tp:S1}
//   Value y = all_reduce(h.matmul(w2), "tp"); // row-parallel: P on tp, then R
//   y.ToString();                            // "f32[4,8]{dp:S0,tp:R}"
//
// Copying a Value copies a shared_ptr, an inline shape and a fixed array: cheap.
// The typed ops live in shardmap/ops.h, the collectives and casts in shardmap/collective_ops.h.
#ifndef SHARDMAP_SHARDMAP_VALUE_H_
#define SHARDMAP_SHARDMAP_VALUE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "shardmap/spmd_type.h"
#include "tensor/tensor.h"

namespace shardmap {

struct Value {
  Tensor tensor;
  SpmdType type;
  int32_t node = -1;  // tape slot, -1 when not differentiated

  Value() = default;
  Value(Tensor t, SpmdType ty) : tensor(std::move(t)), type(ty) {}

  // Constants inside per-device code (need a current RankContext for the number of axes).
  static Value Replicated(Tensor t);  // R on every axis
  static Value Invariant(Tensor t);   // I on every axis
  // A rank-0 R constant of the given dtype.
  static Value Scalar(double v, DType dtype = DType::kF32);

  bool defined() const { return tensor.defined(); }
  bool requires_grad() const { return node >= 0; }
  const Shape& shape() const { return tensor.shape(); }
  int rank() const { return tensor.rank(); }
  int64_t dim(int i) const { return tensor.dim(i); }
  DType dtype() const { return tensor.dtype(); }
  int64_t numel() const { return tensor.numel(); }
  double item() const { return tensor.item(); }

  // "f32[4,8]{dp:S0,tp:R}" (axis names from the current context, "a0".. without one).
  std::string ToString() const;

  // Method forms of ops.h, so per-device code reads left to right.
  Value matmul(const Value& b, bool trans_a = false, bool trans_b = false) const;
  Value T() const;  // transpose of the last two dims
  Value reshape(absl::Span<const int64_t> shape) const;  // one dim may be -1 (inferred)
  Value transpose(int d0, int d1) const;
  Value sum(const std::vector<int>& dims, bool keepdim = false) const;
  Value mean(const std::vector<int>& dims, bool keepdim = false) const;
};

}  // namespace shardmap

#endif  // SHARDMAP_SHARDMAP_VALUE_H_
