#include "tensor/cuda/reduce/reduce_ops.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "tensor/error.h"

#if SHARDMAP_HAS_CUDA
#include <cuda_runtime.h>

#include "tensor/cuda/device_memory.h"
#include "tensor/cuda/internal/cuda_check.h"
#include "tensor/cuda/reduce/reduce_kernels.h"
#include "tensor/cuda/runtime.h"
#endif

namespace shardmap::cuda {

#if SHARDMAP_HAS_CUDA
namespace {

using kernels::ReduceKind;

// Intermediate results of multi-pass reductions: f32 for f32/bf16/f16, f64 for f64.
DType AccDType(DType t) { return t == DType::kF64 ? DType::kF64 : DType::kF32; }

// Folds x (in_dtype, viewed as [outer, n, inner], n >= 1) into out (out_dtype, [outer, inner]),
// in as many passes as kernels::ReduceSegmentLength asks for; scale applies to the last pass
// of a sum.
void ReduceAxis(const void* x, DType in_dtype, void* out, DType out_dtype, ReduceKind kind,
                int64_t outer, int64_t n, int64_t inner, double scale, Device device,
                void* stream) {
  Tensor partial;  // the previous pass's output, alive until the next pass is queued
  while (true) {
    const int64_t seg = kernels::ReduceSegmentLength(outer, n, inner);
    if (seg >= n) {
      SM_CUDA_CHECK(static_cast<cudaError_t>(kernels::LaunchReducePass(
          x, in_dtype, out, out_dtype, kind, outer, n, inner, n, scale, stream)));
      return;
    }
    const int64_t nseg = (n + seg - 1) / seg;
    const DType acc = AccDType(out_dtype);
    Tensor next = Tensor::Empty({outer * nseg * inner}, acc, device);
    SM_CUDA_CHECK(static_cast<cudaError_t>(kernels::LaunchReducePass(
        x, in_dtype, next.raw_data(), acc, kind, outer, n, inner, seg, 1.0, stream)));
    // Freed blocks are reused in stream order (the caching allocator is per stream), so the
    // old partial may go as soon as the pass that reads it is queued.
    partial = next;
    x = partial.raw_data();
    in_dtype = acc;
    n = nseg;
  }
}

ReduceKind KindOf(ReduceOp op) {
  switch (op) {
    case ReduceOp::kMax: return ReduceKind::kMax;
    case ReduceOp::kMin: return ReduceKind::kMin;
    default: return ReduceKind::kSum;
  }
}

}  // namespace
#endif  // SHARDMAP_HAS_CUDA

Tensor Reduce(ReduceOp op, const Tensor& x, absl::Span<const bool> reduced,
              absl::Span<const int64_t> out_shape) {
#if SHARDMAP_HAS_CUDA
  const Device device = x.device();
  DeviceGuard guard(device.index);
  void* stream = CurrentStream(device.index);
  Tensor out = Tensor::Empty(out_shape, x.dtype(), device);
  if (out.numel() == 0) return out;
  int64_t count = 1;
  for (int d = 0; d < x.rank(); ++d) {
    if (reduced[d]) count *= x.shape()[d];
  }
  if (count == 0) {  // an empty fold: the sum is 0, the mean NaN (Max/Min were refused earlier)
    Fill(out.raw_data(), device.index, out.dtype(), out.numel(),
         op == ReduceOp::kMean ? std::numeric_limits<double>::quiet_NaN() : 0.0);
    return out;
  }
  // Runs of adjacent dims that are all reduced or all kept, outermost first (size-1 dims drop).
  std::vector<int64_t> sizes;
  std::vector<bool> red;
  for (int d = 0; d < x.rank(); ++d) {
    const int64_t s = x.shape()[d];
    if (s == 1) continue;
    if (!sizes.empty() && red.back() == reduced[d]) {
      sizes.back() *= s;
    } else {
      sizes.push_back(s);
      red.push_back(reduced[d]);
    }
  }
  const ReduceKind kind = KindOf(op);
  const double scale = op == ReduceOp::kMean ? 1.0 / static_cast<double>(count) : 1.0;
  int last = -1;  // the outermost reduced run: its pass writes the output
  for (int k = 0; k < static_cast<int>(sizes.size()) && last < 0; ++k) {
    if (red[k]) last = k;
  }
  if (last < 0) {  // nothing to fold (all reduced dims have size 1): a copy through the kernel
    ReduceAxis(x.raw_data(), x.dtype(), out.raw_data(), out.dtype(), kind, x.numel(), 1, 1, 1.0,
               device, stream);
    return out;
  }
  // Fold the reduced runs innermost first; each pass removes one run from `sizes`.
  const void* src = x.raw_data();
  DType src_dtype = x.dtype();
  Tensor partial;
  for (int k = static_cast<int>(sizes.size()) - 1; k >= 0; --k) {
    if (!red[k]) continue;
    int64_t outer = 1, inner = 1;
    for (int j = 0; j < k; ++j) outer *= sizes[j];
    for (int j = k + 1; j < static_cast<int>(sizes.size()); ++j) inner *= sizes[j];
    const int64_t n = sizes[k];
    sizes.erase(sizes.begin() + k);
    red.erase(red.begin() + k);
    if (k == last) {
      ReduceAxis(src, src_dtype, out.raw_data(), out.dtype(), kind, outer, n, inner, scale,
                 device, stream);
      break;
    }
    const DType acc = AccDType(x.dtype());
    Tensor next = Tensor::Empty({outer * inner}, acc, device);
    ReduceAxis(src, src_dtype, next.raw_data(), acc, kind, outer, n, inner, 1.0, device, stream);
    partial = next;
    src = partial.raw_data();
    src_dtype = acc;
  }
  return out;
#else
  (void)op, (void)x, (void)reduced, (void)out_shape;
  OpFail("reduce on ", x.device().ToString(), ": this build has no CUDA (built without CUDA)");
#endif
}

Tensor ArgMax(const Tensor& x, int dim, absl::Span<const int64_t> out_shape) {
#if SHARDMAP_HAS_CUDA
  const Device device = x.device();
  DeviceGuard guard(device.index);
  Tensor out = Tensor::Empty(out_shape, DType::kI64, device);
  if (out.numel() == 0) return out;
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < dim; ++d) outer *= x.shape()[d];
  for (int d = dim + 1; d < x.rank(); ++d) inner *= x.shape()[d];
  const int64_t n = x.shape()[dim];
  if (n == 0) OpFail("argmax: dim ", dim, " of ", x.ShapeString(), " is empty");
  SM_CUDA_CHECK(static_cast<cudaError_t>(kernels::LaunchArgMax(
      x.raw_data(), x.dtype(), out.data<int64_t>(), outer, n, inner, CurrentStream(device.index))));
  return out;
#else
  (void)dim, (void)out_shape;
  OpFail("argmax on ", x.device().ToString(), ": this build has no CUDA (built without CUDA)");
#endif
}

Tensor RandomBlock(kernels::RandomKind kind, absl::Span<const int64_t> global_shape,
                   absl::Span<const int64_t> offsets, absl::Span<const int64_t> local_shape,
                   uint64_t seed, double a, double b, int64_t n, DType dtype, Device device) {
  const int rank = static_cast<int>(global_shape.size());
  if (rank > kernels::kRandomMaxRank) {
    OpFail("random on ", device.ToString(), ": rank ", rank, " is over the device limit of ",
           kernels::kRandomMaxRank, "; generate on the CPU and copy with Tensor::To");
  }
#if SHARDMAP_HAS_CUDA
  Tensor out = Tensor::Empty(local_shape, dtype, device);  // names a missing device first
  DeviceGuard guard(device.index);
  kernels::RandomGeometry geo;
  geo.rank = rank;
  int64_t stride = 1;
  for (int k = rank - 1; k >= 0; --k) {
    geo.local[k] = local_shape[k];
    geo.global_stride[k] = stride;
    geo.base += offsets[k] * stride;
    stride *= global_shape[k];
  }
  geo.numel = out.numel();
  if (geo.numel == 0) return out;
  SM_CUDA_CHECK(static_cast<cudaError_t>(kernels::LaunchRandom(
      out.raw_data(), dtype, kind, geo, seed, a, b, n, CurrentStream(device.index))));
  return out;
#else
  (void)kind, (void)offsets, (void)local_shape, (void)seed, (void)a, (void)b, (void)n,
      (void)dtype;
  OpFail("random on ", device.ToString(), ": this build has no CUDA (built without CUDA)");
#endif
}

}  // namespace shardmap::cuda
