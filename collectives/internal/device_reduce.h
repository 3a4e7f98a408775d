// GPU reduction kernel for the in-process backend on device memory (several ranks sharing one
// GPU). Same semantics as ReduceBuffers (reduce.h): sources in order 0..n-1, bf16/f16 through
// f32 with one rounding, integers wrap, avg = sum / n. Plain C++ interface (no CUDA types) so
// host code compiled without nvcc can call it; only linked when the CUDA toolkit is present.
//
//   const void* srcs[3] = {a, b, c};   // device pointers on the current device
//   int err = DeviceReduceLaunch(dst, srcs, 3, count, dtype, op, stream);  // a cudaError_t
#ifndef SHARDMAP_COLLECTIVES_INTERNAL_DEVICE_REDUCE_H_
#define SHARDMAP_COLLECTIVES_INTERNAL_DEVICE_REDUCE_H_

#include <cstddef>

namespace shardmap::collectives::internal {

// The most sources one launch takes; callers fall back to host staging beyond it.
constexpr int kMaxDeviceReduceSources = 64;

// dtype / op are the integer values of collectives::DataType / ReduceOp. Returns a cudaError_t
// (0 = success) of the launch; the work is asynchronous on `stream` (a cudaStream_t).
int DeviceReduceLaunch(void* dst, const void* const* srcs, int n, size_t count, int dtype,
                       int op, void* stream);

}  // namespace shardmap::collectives::internal

#endif  // SHARDMAP_COLLECTIVES_INTERNAL_DEVICE_REDUCE_H_
