#include "tensor/cuda/routing/routing_ops.h"

#include "tensor/error.h"

#if SHARDMAP_HAS_CUDA
#include <cuda_runtime.h>

#include "tensor/cuda/device_memory.h"
#include "tensor/cuda/internal/cuda_check.h"
#include "tensor/cuda/internal/op_context.h"
#include "tensor/cuda/nn/kernels.h"
#include "tensor/cuda/routing/kernels.h"
#include "tensor/cuda/runtime.h"
#endif

namespace shardmap::cuda {

#if SHARDMAP_HAS_CUDA

namespace {

using internal::BadPosition;
using internal::DeviceIndexAt;
using internal::OnDevice;

namespace rk = routing_kernels;

#define SM_ROUTING_LAUNCH(expr) SM_CUDA_CHECK(static_cast<cudaError_t>(expr))




DType AccType(DType t) { return t == DType::kF64 ? DType::kF64 : DType::kF32; }

}  // namespace

TopKOutputs TopK(const Tensor& x, int64_t k) {
  OnDevice on(x);
  const int64_t n = x.dim(-1), rows = n == 0 ? 0 : x.numel() / n;
  Shape out_shape = x.shape();
  out_shape.back() = k;
  TopKOutputs out{Tensor::Empty(out_shape, x.dtype(), on.device),
                  Tensor::Empty(out_shape, DType::kI64, on.device)};
  if (rows == 0) return out;
  BadPosition bad(on);
  SM_ROUTING_LAUNCH(rk::LaunchTopK(x.raw_data(), x.dtype(), rows, n, k, out.values.raw_data(),
                                   static_cast<int64_t*>(out.indices.raw_data()), bad.ptr(),
                                   on.stream));
  if (const int64_t p = bad.Read(); p >= 0) {
    OpFail("top_k: x ", x.ShapeString(), " holds NaN at row ", p / n, ", column ", p % n,
           "; top-k of NaN is undefined");
  }
  return out;
}

Tensor TopKBackward(const Tensor& dvalues, const Tensor& indices, int64_t n) {
  OnDevice on(dvalues);
  const int64_t k = dvalues.dim(-1), rows = k == 0 ? 0 : dvalues.numel() / k;
  Shape out_shape = dvalues.shape();
  out_shape.back() = n;
  Tensor out = Tensor::Empty(out_shape, dvalues.dtype(), on.device);
  BadPosition bad(on);
  SM_ROUTING_LAUNCH(rk::LaunchTopKBackward(dvalues.raw_data(), dvalues.dtype(), indices.raw_data(),
                                           indices.dtype() == DType::kI64, rows, k, n,
                                           out.raw_data(), bad.ptr(), on.stream));
  if (rows > 0 && k > 0) {
    if (const int64_t p = bad.Read(); p >= 0) {
      OpFail("top_k_backward: index ", DeviceIndexAt(indices, p), " at row ", p / k,
             " is out of range; expected 0 <= index < ", n);
    }
  }
  return out;
}

Tensor GatherRows(const Tensor& x, const Tensor& idx) {
  OnDevice on(x);
  const int64_t d = x.dim(-1), m = idx.numel();
  int64_t rows = 1;  // the leading dims' product (x has rank >= 2)
  for (int i = 0; i + 1 < x.rank(); ++i) rows *= x.dim(i);
  Tensor out = Tensor::Empty({m, d}, x.dtype(), on.device);
  if (m == 0) return out;
  BadPosition bad(on);
  SM_ROUTING_LAUNCH(rk::LaunchGatherRows(x.raw_data(), rows, d,
                                         static_cast<int>(DTypeSize(x.dtype())), idx.raw_data(),
                                         idx.dtype() == DType::kI64, m, out.raw_data(), bad.ptr(),
                                         on.stream));
  if (const int64_t i = bad.Read(); i >= 0) {
    OpFail("gather_rows: idx[", i, "] = ", DeviceIndexAt(idx, i),
           " is out of range; expected -1 (no row) or 0 <= idx < ", rows);
  }
  return out;
}

Tensor ScatterAddRows(const Tensor& x, const Tensor& idx, int64_t n) {
  OnDevice on(x);
  const int64_t d = x.dim(-1), m = idx.numel();
  const DType ct = AccType(x.dtype());
  Tensor acc = Tensor::Empty({n, d}, ct, on.device);
  BadPosition bad(on);
  SM_ROUTING_LAUNCH(rk::LaunchScatterAddRows(x.raw_data(), x.dtype(), m, d, idx.raw_data(),
                                             idx.dtype() == DType::kI64, n, acc.raw_data(),
                                             bad.ptr(), on.stream));
  if (m > 0) {
    if (const int64_t i = bad.Read(); i >= 0) {
      OpFail("scatter_add_rows: idx[", i, "] = ", DeviceIndexAt(idx, i),
             " is out of range; expected -1 (no row) or 0 <= idx < ", n);
    }
  }
  if (ct == x.dtype()) return acc;
  Tensor out = Tensor::Empty({n, d}, x.dtype(), on.device);
  SM_ROUTING_LAUNCH(nn_kernels::LaunchCast(acc.raw_data(), ct, out.raw_data(), x.dtype(),
                                           acc.numel(), on.stream));
  return out;
}

Tensor LocalIndices(const Tensor& ids, int64_t start, int64_t size, int64_t stride, bool strict,
                    const char* op, const std::string& context) {
  OnDevice on(ids);
  Tensor out = Tensor::Empty(ids.shape(), DType::kI64, on.device);
  if (ids.numel() == 0) return out;
  BadPosition bad(on);
  SM_ROUTING_LAUNCH(rk::LaunchLocalIndices(ids.raw_data(), ids.dtype() == DType::kI64,
                                           ids.numel(), start, size, stride,
                                           static_cast<int64_t*>(out.raw_data()),
                                           strict ? bad.ptr() : nullptr, on.stream));
  if (strict) {
    if (const int64_t i = bad.Read(); i >= 0) {
      OpFail(op, ": index ", DeviceIndexAt(ids, i), " at position ", i, " is out of range [", start,
             ", ", start + size, ")", context);
    }
  }
  return out;
}

#else  // !SHARDMAP_HAS_CUDA

namespace {
[[noreturn]] void NoCuda(const char* op) {
  OpFail(op, ": a CUDA tensor, but this build of shardmap was built without CUDA");
}
}  // namespace

TopKOutputs TopK(const Tensor&, int64_t) { NoCuda("top_k"); }
Tensor TopKBackward(const Tensor&, const Tensor&, int64_t) { NoCuda("top_k_backward"); }
Tensor GatherRows(const Tensor&, const Tensor&) { NoCuda("gather_rows"); }
Tensor ScatterAddRows(const Tensor&, const Tensor&, int64_t) { NoCuda("scatter_add_rows"); }
Tensor LocalIndices(const Tensor&, int64_t, int64_t, int64_t, bool, const char* op,
                    const std::string&) {
  NoCuda(op);
}

#endif  // SHARDMAP_HAS_CUDA

}  // namespace shardmap::cuda
