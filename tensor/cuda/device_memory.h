// Device memory for tensor storage: one CachingAllocator per GPU (blocks reused per stream, no
// cudaMalloc in the steady state of a training step), and copies between host and device.
//
//   void* p = cuda::DeviceAllocate(/*device=*/0, nbytes);     // on this thread's current stream
//   cuda::CopyHostToDevice(p, 0, host_ptr, nbytes);            // through pinned staging
//   cuda::CopyDeviceToHost(host_ptr, p, 0, nbytes);            // waits for the stream
//   cuda::DeviceFree(0, p);
//   cuda::DeviceAllocator(0).stats().raw_allocs;               // cudaMalloc calls so far
//
// Host<->device copies are ordered on the current stream of the device (cuda/runtime.h).
// CopyHostToDevice returns once `src` may be reused (its bytes are in pinned staging or already
// on the device); CopyDeviceToHost returns once `dst` holds the bytes. Device-to-device copies
// are asynchronous on the destination device's current stream, peer-to-peer between GPUs.
// Every function throws OpError (with file:line and CUDA's error text) on failure, and without a
// GPU names the missing toolkit or device.
//
// Deferred index checks: the nn and routing ops note the first bad index a kernel meets in a
// device word and, by default, read it back at once (a host sync per op). When deferred (the
// trainer's rank threads, DeferredIndexChecksScope; SetDeferredIndexChecks(true) for the
// process) an op queues a copy of its word into pinned host memory instead (DeferIndexCheck), with
// an event after it; the thread's next wait for a stream, which it does anyway (CopyDeviceToHost:
// the step's loss read; cuda::Synchronize: the end of RunSpmd's rank), runs every check whose
// copy has landed: the first bad op's error is thrown there, with a note that it was deferred.
// No sync per op; at most 256 checks wait per thread (the 257th waits for the oldest one's event,
// whatever stream it was on: one destroyed since is fine). SHARDMAP_DEFER_INDEX_CHECKS, when set,
// overrides both (0: stop at the op, for debugging; 1: defer everywhere).
#ifndef SHARDMAP_TENSOR_CUDA_DEVICE_MEMORY_H_
#define SHARDMAP_TENSOR_CUDA_DEVICE_MEMORY_H_

#include <cstddef>
#include <cstdint>
#include <functional>

#include "tensor/cuda/caching_allocator.h"
#include "tensor/dtype.h"

namespace shardmap::cuda {

CachingAllocator& DeviceAllocator(int device);

void* DeviceAllocate(int device, size_t nbytes);
void DeviceFree(int device, void* p);

void CopyHostToDevice(void* dst, int device, const void* src, size_t nbytes);
void CopyDeviceToHost(void* dst, const void* src, int device, size_t nbytes);
void CopyDeviceToDevice(void* dst, int dst_device, const void* src, int src_device,
                        size_t nbytes);
void MemsetZero(void* p, int device, size_t nbytes);
// dst[i] = value (converted to dtype) for i < n, on the current stream.
void Fill(void* dst, int device, DType dtype, int64_t n, double value);

// Whether this thread's ops defer their index checks (see above).
bool DeferredIndexChecks();
// The process default (off).
void SetDeferredIndexChecks(bool on);
// This thread's choice for the scope (nests; the environment variable still wins).
class DeferredIndexChecksScope {
 public:
  explicit DeferredIndexChecksScope(bool on);
  ~DeferredIndexChecksScope();
  DeferredIndexChecksScope(const DeferredIndexChecksScope&) = delete;
  DeferredIndexChecksScope& operator=(const DeferredIndexChecksScope&) = delete;

 private:
  int prev_;
};
// "1", "on", "true" (any case): on; unset or else: off.
bool DeferredIndexChecksFromEnv(const char* value);
// Queues a copy of the int64 at `device_word` (on this thread's current stream of `device`);
// once the stream has reached it, `fail(value)` runs if the value is >= 0 (fail throws).
void DeferIndexCheck(int device, const void* device_word, std::function<void(int64_t)> fail);
// Waits for this thread's current stream of `device` and runs its queued checks (e.g. at the end
// of a step that reads nothing back).
void RunDeferredIndexChecks(int device);
// This thread's checks not yet run (0 without CUDA).
size_t PendingDeferredIndexChecks();

}  // namespace shardmap::cuda

#endif  // SHARDMAP_TENSOR_CUDA_DEVICE_MEMORY_H_
