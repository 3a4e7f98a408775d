#include "tensor/cuda/elementwise/shape_ops.h"

#include "tensor/cuda/elementwise/layout_kernels.h"
#include "tensor/error.h"

#if SHARDMAP_HAS_CUDA
#include "tensor/cuda/internal/cuda_check.h"
#include "tensor/cuda/runtime.h"
#endif

namespace shardmap::cuda {

#if SHARDMAP_HAS_CUDA

#define SM_LAUNCH(expr) SM_CUDA_CHECK(static_cast<cudaError_t>(expr))

namespace {

int64_t Prod(const Shape& s, int begin, int end) {
  int64_t n = 1;
  for (int i = begin; i < end; ++i) n *= s[i];
  return n;
}

}  // namespace

Tensor Permute(const Tensor& x, absl::Span<const int> perm) {
  const int r = x.rank();
  Shape out_shape(r);
  for (int i = 0; i < r; ++i) out_shape[i] = x.shape()[perm[i]];
  const int dev = x.device().index;
  DeviceGuard guard(dev);
  Tensor out = Tensor::Empty(out_shape, x.dtype(), x.device());
  if (out.numel() == 0) return out;
  kernels::PermuteDims d;
  if (!kernels::CollapsePermute(x.shape().data(), perm.data(), r, &d)) {
    OpFail("permute: ", x.ShapeString(), " needs more than ", kernels::kMaxPermuteRank,
           " dims after merging; the CUDA kernel supports at most that (reshape first)");
  }
  SM_LAUNCH(kernels::LaunchPermute(x.raw_data(), out.raw_data(), out.numel(),
                                   static_cast<int>(DTypeSize(x.dtype())), d,
                                   CurrentStream(dev)));
  return out;
}

Tensor Slice(const Tensor& x, int dim, int64_t start, int64_t length) {
  Shape out_shape = x.shape();
  out_shape[dim] = length;
  const int dev = x.device().index;
  DeviceGuard guard(dev);
  Tensor out = Tensor::Empty(out_shape, x.dtype(), x.device());
  if (out.numel() == 0) return out;
  const int64_t outer = Prod(x.shape(), 0, dim);
  const int64_t inner = Prod(x.shape(), dim + 1, x.rank()) * DTypeSize(x.dtype());  // bytes
  const int64_t size = x.shape()[dim];
  SM_LAUNCH(kernels::LaunchCopyRows(out.raw_data(), length * inner,
                                    static_cast<const char*>(x.raw_data()) + start * inner,
                                    size * inner, outer, length * inner, CurrentStream(dev)));
  return out;
}

void SliceAssign(Tensor& whole, int dim, int64_t start, const Tensor& part_in) {
  const int64_t outer = Prod(whole.shape(), 0, dim);
  const int64_t inner = Prod(whole.shape(), dim + 1, whole.rank()) * DTypeSize(whole.dtype());
  const int64_t size = whole.shape()[dim], length = part_in.shape()[dim];
  if (outer == 0 || length * inner == 0) return;
  const int dev = whole.device().index;
  DeviceGuard guard(dev);
  // The CPU version memmoves; overlapping device rows would race, so copy a shared part first.
  const Tensor part = part_in.SharesStorageWith(whole) ? part_in.Clone() : part_in;
  SM_LAUNCH(kernels::LaunchCopyRows(static_cast<char*>(whole.raw_data()) + start * inner,
                                    size * inner, part.raw_data(), length * inner, outer,
                                    length * inner, CurrentStream(dev)));
}

Tensor Cast(const Tensor& x, DType dtype) {
  const int dev = x.device().index;
  DeviceGuard guard(dev);
  Tensor out = Tensor::Empty(x.shape(), dtype, x.device());
  SM_LAUNCH(kernels::LaunchCast(x.raw_data(), x.dtype(), out.raw_data(), dtype, x.numel(),
                                CurrentStream(dev)));
  return out;
}

#else  // !SHARDMAP_HAS_CUDA

namespace {
[[noreturn]] void NoCuda(const char* op) {
  OpFail(op, ": CUDA tensors, but this build has no CUDA (built without the CUDA toolkit)");
}
}  // namespace

Tensor Permute(const Tensor&, absl::Span<const int>) { NoCuda("permute"); }
Tensor Slice(const Tensor&, int, int64_t, int64_t) { NoCuda("slice"); }
void SliceAssign(Tensor&, int, int64_t, const Tensor&) { NoCuda("slice_assign"); }
Tensor Cast(const Tensor&, DType) { NoCuda("cast"); }

#endif  // SHARDMAP_HAS_CUDA

}  // namespace shardmap::cuda
