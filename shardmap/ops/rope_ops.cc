#include "shardmap/ops/rope_ops.h"

#include <cstdint>

#include "shardmap/internal/typing.h"
#include "tensor/error.h"
#include "tensor/ops/elementwise.h"
#include "tensor/ops/shape_ops.h"

namespace shardmap {
namespace {

void CheckShapes(const Value& x, const Value& cos, const Value& sin) {
  if (x.tensor.rank() != 3 || x.dim(2) % 2 != 0) {
    OpFail("rope: x is ", x.tensor.ShapeString(),
           "; expected [rows, heads, head_dim] with an even head_dim (the two rotated halves)");
  }
  const Shape want = {x.dim(0), 1, x.dim(2)};
  if (cos.tensor.shape() != want || sin.tensor.shape() != want) {
    OpFail("rope: cos ", cos.tensor.ShapeString(), " and sin ", sin.tensor.ShapeString(),
           " must both be ", ShapeToString(want), " for x ", x.tensor.ShapeString(),
           " (one row of angles per row of x, broadcast over the heads)");
  }
  if (cos.dtype() != x.dtype() || sin.dtype() != x.dtype()) {
    OpFail("rope: cos/sin are ", DTypeName(cos.dtype()), "/", DTypeName(sin.dtype()),
           " but x is ", DTypeName(x.dtype()), "; build the tables in x's dtype");
  }
}

template <typename T>
Tensor RopeLoop(const Tensor& x, const Tensor& cos, const Tensor& sin) {
  const int64_t n = x.dim(0), heads = x.dim(1), hd = x.dim(2), half = hd / 2;
  Tensor y = Tensor::Empty(x.shape(), x.dtype());
  const T* px = x.data<T>();
  const T* pc = cos.data<T>();
  const T* ps = sin.data<T>();
  T* py = y.data<T>();
  for (int64_t r = 0; r < n; ++r) {
    const T* c = pc + r * hd;
    const T* s = ps + r * hd;
    for (int64_t h = 0; h < heads; ++h) {
      const T* a = px + (r * heads + h) * hd;
      T* o = py + (r * heads + h) * hd;
      for (int64_t i = 0; i < half; ++i) o[i] = a[i] * c[i] - a[i + half] * s[i];
      for (int64_t i = half; i < hd; ++i) o[i] = a[i] * c[i] + a[i - half] * s[i];
    }
  }
  return y;
}

// The composed form (any device and dtype).
Tensor RopeComposed(const Tensor& x, const Tensor& cos, const Tensor& sin) {
  const int64_t half = x.dim(2) / 2;
  Tensor rotated = Concat({Neg(Slice(x, 2, half, half)), Slice(x, 2, 0, half)}, 2);
  return Add(Mul(x, cos), Mul(rotated, sin));
}

Tensor RopeTensor(const Tensor& x, const Tensor& cos, const Tensor& sin) {
  const bool cpu = !x.is_cuda() && !x.is_meta();
  if (cpu && x.dtype() == DType::kF32) return RopeLoop<float>(x, cos, sin);
  if (cpu && x.dtype() == DType::kF64) return RopeLoop<double>(x, cos, sin);
  return RopeComposed(x, cos, sin);
}

}  // namespace

Value rope(const Value& x, const Value& cos, const Value& sin) {
  internal::CheckMesh("rope", x, "x");
  internal::CheckMesh("rope", cos, "cos");
  internal::CheckMesh("rope", sin, "sin");
  if (x.tensor.rank() == 3) {
    internal::CheckDimNotSharded("rope", x, -1,
                                 "all_gather head_dim first (the rotation pairs its two halves)");
  }
  CheckShapes(x, cos, sin);
  const SpmdType t = internal::ElementwiseType("rope", x, cos, x.shape(), true);
  Value out(RopeTensor(x.tensor, cos.tensor, sin.tensor), t);
  if (internal::NeedsTape(x)) {
    const Value c(cos.tensor, cos.type), minus_s(Neg(sin.tensor), sin.type);
    const SpmdType primal = x.type;
    internal::RecordOp("rope", {&x}, out, [c, minus_s, primal](const Value& g, uint32_t need,
                                                                Value* d) {
      if (need & 1) d[0] = internal::AsCotangent(rope(g, c, minus_s), primal);
    });
  }
  return out;
}

}  // namespace shardmap
