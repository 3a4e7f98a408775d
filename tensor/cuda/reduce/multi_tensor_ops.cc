#include "tensor/cuda/reduce/multi_tensor_ops.h"

#include <cstdint>
#include <vector>

#include "tensor/error.h"

#if SHARDMAP_HAS_CUDA
#include <cuda_runtime.h>

#include "tensor/cuda/internal/cuda_check.h"
#include "tensor/cuda/reduce/multi_tensor_kernels.h"
#include "tensor/cuda/runtime.h"
#endif

namespace shardmap::cuda {

#if SHARDMAP_HAS_CUDA
namespace {

using kernels::MultiTensorEntry;

#define SM_MT_LAUNCH(expr) SM_CUDA_CHECK(static_cast<cudaError_t>(expr))

bool Aligned16(const void* p) { return p == nullptr || reinterpret_cast<uintptr_t>(p) % 16 == 0; }

MultiTensorEntry EntryOf(const Tensor& t) {
  MultiTensorEntry e;
  e.a = const_cast<void*>(t.raw_data());
  e.n = t.numel();
  e.dtype = static_cast<int32_t>(t.dtype());
  e.aligned = Aligned16(e.a) ? 1 : 0;
  return e;
}

// The table on the device (uploaded on `stream`), alive while the returned tensor is.
struct DeviceTable {
  Tensor storage;
  const MultiTensorEntry* ptr;
  int count;
  int64_t chunks;
};

DeviceTable Upload(std::vector<MultiTensorEntry>& entries, Device device, void* stream) {
  DeviceTable t;
  t.chunks = kernels::PlanMultiTensorChunks(entries);
  t.count = static_cast<int>(entries.size());
  const int64_t bytes = static_cast<int64_t>(entries.size() * sizeof(MultiTensorEntry));
  t.storage = Tensor::Empty({(bytes + 7) / 8 > 0 ? (bytes + 7) / 8 : 1}, DType::kI64, device);
  if (bytes > 0) {
    SM_MT_LAUNCH(kernels::LaunchUploadTable(entries.data(), static_cast<size_t>(bytes),
                                            t.storage.raw_data(), stream));
  }
  t.ptr = static_cast<const MultiTensorEntry*>(t.storage.raw_data());
  return t;
}

bool IsF64(const Tensor& t) { return t.dtype() == DType::kF64; }

}  // namespace

Tensor SumOfSquares(absl::Span<const Tensor> tensors, DType out_dtype, Device device) {
  DeviceGuard guard(device.index);
  void* stream = CurrentStream(device.index);
  std::vector<MultiTensorEntry> entries;
  for (const Tensor& t : tensors) {
    if (t.numel() > 0) entries.push_back(EntryOf(t));
  }
  DeviceTable table = Upload(entries, device, stream);
  Tensor partials = Tensor::Empty({kernels::MultiTensorBlocks(table.chunks)}, DType::kF64, device);
  Tensor out = Tensor::Empty({}, out_dtype, device);
  SM_MT_LAUNCH(kernels::LaunchSumOfSquares(table.ptr, table.count, table.chunks,
                                           static_cast<double*>(partials.raw_data()),
                                           out.raw_data(), out_dtype, stream));
  return out;
}

void ScaleInPlace(absl::Span<const Tensor> tensors, const Tensor& scale) {
  const Device device = scale.device();
  DeviceGuard guard(device.index);
  void* stream = CurrentStream(device.index);
  std::vector<MultiTensorEntry> entries;
  for (const Tensor& t : tensors) {
    if (t.numel() > 0) entries.push_back(EntryOf(t));
  }
  if (entries.empty()) return;
  DeviceTable table = Upload(entries, device, stream);
  SM_MT_LAUNCH(kernels::LaunchScaleInPlace(table.ptr, table.count, table.chunks,
                                           scale.raw_data(), IsF64(scale), stream));
}

Tensor ClipCoefficient(const Tensor& sum_sq, double max_norm) {
  const Device device = sum_sq.device();
  DeviceGuard guard(device.index);
  Tensor out = Tensor::Empty({}, sum_sq.dtype(), device);
  SM_MT_LAUNCH(kernels::LaunchClipCoefficient(sum_sq.raw_data(), IsF64(sum_sq), max_norm,
                                              out.raw_data(), IsF64(sum_sq),
                                              CurrentStream(device.index)));
  return out;
}

void AdamWStep(absl::Span<const Tensor> params, absl::Span<const Tensor> grads,
               absl::Span<const Tensor> exp_avg, absl::Span<const Tensor> exp_avg_sq,
               absl::Span<const bool> decay, const AdamWHyper& h, const Tensor& scalars,
               int64_t set_step, const Tensor& grad_scale, const Tensor& lr,
               const Tensor& skip_if_nonfinite) {
  const Device device = scalars.device();
  DeviceGuard guard(device.index);
  void* stream = CurrentStream(device.index);
  std::vector<MultiTensorEntry> entries;
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].numel() == 0) continue;
    MultiTensorEntry e = EntryOf(params[i]);
    e.b = const_cast<void*>(grads[i].raw_data());
    e.c = const_cast<void*>(exp_avg[i].raw_data());
    e.d = const_cast<void*>(exp_avg_sq[i].raw_data());
    e.decay = decay[i] ? 1 : 0;
    e.aligned = Aligned16(e.a) && Aligned16(e.b) && Aligned16(e.c) && Aligned16(e.d) ? 1 : 0;
    entries.push_back(e);
  }
  auto* sc = static_cast<kernels::AdamWScalars*>(const_cast<void*>(scalars.raw_data()));
  SM_MT_LAUNCH(kernels::LaunchAdamWPrepare(
      sc, set_step, h.lr, h.beta1, h.beta2, h.weight_decay,
      grad_scale.defined() ? grad_scale.raw_data() : nullptr,
      grad_scale.defined() && IsF64(grad_scale), stream,
      lr.defined() ? static_cast<const double*>(lr.raw_data()) : nullptr,
      skip_if_nonfinite.defined() ? skip_if_nonfinite.raw_data() : nullptr,
      skip_if_nonfinite.defined() && IsF64(skip_if_nonfinite)));
  if (entries.empty()) return;
  DeviceTable table = Upload(entries, device, stream);
  SM_MT_LAUNCH(kernels::LaunchAdamW(table.ptr, table.count, table.chunks, sc, h.beta1, h.beta2,
                                    h.eps, stream));
}

#else  // !SHARDMAP_HAS_CUDA

namespace {
[[noreturn]] void NoCuda(const char* op) {
  OpFail(op, ": a CUDA tensor, but this build of shardmap was built without CUDA");
}
}  // namespace

Tensor SumOfSquares(absl::Span<const Tensor>, DType, Device) { NoCuda("sum_of_squares"); }
void ScaleInPlace(absl::Span<const Tensor>, const Tensor&) { NoCuda("scale_in_place"); }
Tensor ClipCoefficient(const Tensor&, double) { NoCuda("clip_coefficient"); }
void AdamWStep(absl::Span<const Tensor>, absl::Span<const Tensor>, absl::Span<const Tensor>,
               absl::Span<const Tensor>, absl::Span<const bool>, const AdamWHyper&,
               const Tensor&, int64_t, const Tensor&, const Tensor&, const Tensor&) {
  NoCuda("fused_adamw");
}

#endif  // SHARDMAP_HAS_CUDA

}  // namespace shardmap::cuda
