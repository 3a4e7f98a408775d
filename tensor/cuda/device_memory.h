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
#ifndef SHARDMAP_TENSOR_CUDA_DEVICE_MEMORY_H_
#define SHARDMAP_TENSOR_CUDA_DEVICE_MEMORY_H_

#include <cstddef>

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

}  // namespace shardmap::cuda

#endif  // SHARDMAP_TENSOR_CUDA_DEVICE_MEMORY_H_
