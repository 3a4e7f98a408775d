// What the host side of a CUDA op needs around its kernel launches (the nn and routing ops):
// the inputs' device made current with its current stream, a device word in which kernels note
// the first bad index they meet, and a single index read back for the error message.
//
//   OnDevice on(ids);                 // ids' GPU current, on.stream its current stream
//   BadPosition bad(on);              // kernels atomicMin positions into bad.ptr()
//   LaunchGather(..., bad.ptr(), on.stream);
//   if (int64_t p = bad.Read(); p >= 0) OpFail("gather: id ", DeviceIndexAt(ids, p), ...);
//   bad.Check([ids](int64_t p) { OpFail("gather: id ", DeviceIndexAt(ids, p), ...); });
//
// Check reads the word now, or when this thread defers its checks (the trainer's ranks,
// cuda::DeferredIndexChecksScope) at its next wait for a stream (device_memory.h): no host
// sync per op. Its `fail` must throw and must capture what it names by value (it may run after
// the op returned).
//
// Include only where SHARDMAP_HAS_CUDA is set.
#ifndef SHARDMAP_TENSOR_CUDA_INTERNAL_OP_CONTEXT_H_
#define SHARDMAP_TENSOR_CUDA_INTERNAL_OP_CONTEXT_H_

#include <cstdint>
#include <functional>

#include <cuda_runtime.h>

#include "tensor/cuda/device_memory.h"
#include "tensor/cuda/internal/cuda_check.h"
#include "tensor/cuda/runtime.h"
#include "tensor/tensor.h"

namespace shardmap::cuda::internal {

// The inputs' device made current, and its current stream.
struct OnDevice {
  explicit OnDevice(const Tensor& t)
      : device(t.device()), guard(device.index), stream(CurrentStream(device.index)) {}
  Device device;
  DeviceGuard guard;
  void* stream;
};

// A device word holding the first bad index position seen by a kernel (~0: none).
class BadPosition {
 public:
  explicit BadPosition(const OnDevice& on)
      : on_(on), word_(Tensor::Empty({1}, DType::kI64, on.device)) {
    SM_CUDA_CHECK(cudaMemsetAsync(word_.raw_data(), 0xFF, sizeof(int64_t),
                                  static_cast<cudaStream_t>(on.stream)));
  }
  unsigned long long* ptr() { return static_cast<unsigned long long*>(word_.raw_data()); }

  // The first bad position, or -1 when there is none or the stream is being captured into a
  // graph (a host sync is illegal then).
  int64_t Read() const {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    SM_CUDA_CHECK(cudaStreamIsCapturing(static_cast<cudaStream_t>(on_.stream), &status));
    if (status != cudaStreamCaptureStatusNone) return -1;
    int64_t pos = -1;
    CopyDeviceToHost(&pos, word_.raw_data(), on_.device.index, sizeof(pos));
    return pos;  // ~0 reads as -1
  }

  // fail(position) for the first bad position, now or deferred (see above); nothing inside a
  // capture.
  template <typename Fail>
  void Check(Fail fail) const {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    SM_CUDA_CHECK(cudaStreamIsCapturing(static_cast<cudaStream_t>(on_.stream), &status));
    if (status != cudaStreamCaptureStatusNone) return;
    if (DeferredIndexChecks()) {
      DeferIndexCheck(on_.device.index, word_.raw_data(), std::function<void(int64_t)>(fail));
      return;
    }
    int64_t pos = -1;
    CopyDeviceToHost(&pos, word_.raw_data(), on_.device.index, sizeof(pos));
    if (pos >= 0) fail(pos);
  }

 private:
  const OnDevice& on_;
  Tensor word_;
};

// Element i of a device i32/i64 tensor (a small host copy, for error messages).
inline int64_t DeviceIndexAt(const Tensor& ids, int64_t i) {
  if (ids.dtype() == DType::kI32) {
    int32_t v = 0;
    CopyDeviceToHost(&v, static_cast<const int32_t*>(ids.raw_data()) + i, ids.device().index,
                     sizeof(v));
    return v;
  }
  int64_t v = 0;
  CopyDeviceToHost(&v, static_cast<const int64_t*>(ids.raw_data()) + i, ids.device().index,
                   sizeof(v));
  return v;
}

}  // namespace shardmap::cuda::internal

#endif  // SHARDMAP_TENSOR_CUDA_INTERNAL_OP_CONTEXT_H_
