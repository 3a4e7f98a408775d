#include "tensor/cuda/elementwise/elementwise_ops.h"

#include "tensor/error.h"

#if SHARDMAP_HAS_CUDA
#include "tensor/cuda/internal/cuda_check.h"
#include "tensor/cuda/runtime.h"
#endif

namespace shardmap::cuda {

#if SHARDMAP_HAS_CUDA

#define SM_LAUNCH(expr) SM_CUDA_CHECK(static_cast<cudaError_t>(expr))

Tensor Binary(const char* name, BinaryOp op, const Tensor& a, const Tensor& b,
              absl::Span<const int64_t> out_shape) {
  const int dev = a.device().index;
  DeviceGuard guard(dev);
  Tensor out = Tensor::Empty(out_shape, a.dtype(), a.device());
  if (out.numel() == 0) return out;
  kernels::BroadcastDims dims;
  const kernels::BroadcastDims* pd = nullptr;
  if (a.shape() != b.shape()) {
    if (!kernels::CollapseBroadcast(out.shape().data(), out.rank(), a.shape().data(), a.rank(),
                                    b.shape().data(), b.rank(), &dims)) {
      OpFail(name, ": broadcasting ", a.ShapeString(), " with ", b.ShapeString(),
             " needs more than ", kernels::kMaxBroadcastRank,
             " dims after merging; the CUDA kernels support at most that (reshape first)");
    }
    pd = &dims;
  }
  SM_LAUNCH(kernels::LaunchBinary(op, a.raw_data(), b.raw_data(), out.raw_data(), out.numel(),
                                  a.dtype(), pd, CurrentStream(dev)));
  return out;
}

Tensor Unary(const char* name, UnaryOp op, const Tensor& x, double scalar) {
  (void)name;
  const int dev = x.device().index;
  DeviceGuard guard(dev);
  Tensor out = Tensor::Empty(x.shape(), x.dtype(), x.device());
  SM_LAUNCH(kernels::LaunchUnary(op, x.raw_data(), out.raw_data(), x.numel(), x.dtype(), scalar,
                                 CurrentStream(dev)));
  return out;
}

void AddInPlace(Tensor& acc, const Tensor& x_in) {
  const int dev = acc.device().index;
  DeviceGuard guard(dev);
  // The kernel allows x == acc exactly, never a partial overlap (threads would read elements of
  // x that other threads already wrote): read such an x from a copy, so acc += x as it was.
  const char* pa = static_cast<const char*>(acc.raw_data());
  const char* px = static_cast<const char*>(x_in.raw_data());
  const size_t nb = acc.nbytes();
  const bool partial = x_in.SharesStorageWith(acc) && px != pa && px < pa + nb && pa < px + nb;
  const Tensor x = partial ? x_in.Clone() : x_in;
  SM_LAUNCH(kernels::LaunchBinary(BinaryOp::kAdd, acc.raw_data(), x.raw_data(), acc.raw_data(),
                                  acc.numel(), acc.dtype(), nullptr, CurrentStream(dev)));
}

#else  // !SHARDMAP_HAS_CUDA

Tensor Binary(const char* name, BinaryOp, const Tensor&, const Tensor&,
              absl::Span<const int64_t>) {
  OpFail(name, ": CUDA tensors, but this build has no CUDA (built without the CUDA toolkit)");
}
Tensor Unary(const char* name, UnaryOp, const Tensor&, double) {
  OpFail(name, ": CUDA tensors, but this build has no CUDA (built without the CUDA toolkit)");
}
void AddInPlace(Tensor&, const Tensor&) {
  OpFail("add_in_place: CUDA tensors, but this build has no CUDA (built without the CUDA toolkit)");
}

#endif  // SHARDMAP_HAS_CUDA

}  // namespace shardmap::cuda
