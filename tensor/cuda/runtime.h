// The CUDA runtime as the tensor layer sees it: is there a GPU, which device and stream does this
// thread's work go to. Usable (and false/empty) in builds without the CUDA toolkit.
//
//   if (!cuda::Available()) GTEST_SKIP() << cuda::UnavailableReason();
//   cuda::StreamHandle s = cuda::NewStream(/*device=*/0);
//   {
//     cuda::StreamScope scope(0, s);     // this thread's CUDA ops now run on device 0, stream s
//     Tensor y = Add(x, x);              // launched on s
//   }
//
// One stream per rank: each rank thread binds its own (RunSpmd does this for GPU ranks), so the
// kernels of ranks that share a GPU overlap and the caching allocator reuses blocks per stream
// without cross-stream synchronisation. A thread that binds nothing uses a per-thread default
// stream of the device (cudaStreamPerThread), never the legacy NULL stream.
#ifndef SHARDMAP_TENSOR_CUDA_RUNTIME_H_
#define SHARDMAP_TENSOR_CUDA_RUNTIME_H_

#include <string>

namespace shardmap::cuda {

using StreamHandle = void*;  // a cudaStream_t

// True when this build has CUDA and at least one GPU is visible.
bool Available();
int DeviceCount();
// The card's name (cudaDeviceProp::name, e.g. "NVIDIA H100 80GB HBM3"); "" without it.
std::string DeviceName(int device);
// Why Available() is false, e.g. "built without the CUDA toolkit" or
// "cudaGetDeviceCount: cudaErrorNoDevice: no CUDA-capable device is detected".
std::string UnavailableReason();

// A new non-blocking stream on `device`. It lives until the process ends (streams are few: one
// per rank). Throws OpError without CUDA.
StreamHandle NewStream(int device);

// The stream this thread's CUDA ops on `device` use: the one bound by the innermost StreamScope
// for that device, else the device's per-thread default stream.
StreamHandle CurrentStream(int device);

// Binds this thread to (device, stream) for the scope; nests (the bindings of other devices stay
// in force). Makes `device` current. Devices 0..63.
class StreamScope {
 public:
  StreamScope(int device, StreamHandle stream);
  ~StreamScope();
  StreamScope(const StreamScope&) = delete;
  StreamScope& operator=(const StreamScope&) = delete;

 private:
  int device_;
  StreamHandle prev_stream_;  // device_'s binding before the scope (nullptr: none)
  int prev_current_device_;
};

// Makes `device` current for this thread for the scope (cudaSetDevice), restoring the previous.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_;
};

// Deterministic GPU work (as torch.use_deterministic_algorithms): when on, every op picks its
// algorithm without timing anything (GEMMs keep cuBLASLt's heuristic's first answer instead of
// the autotuned fastest, which can differ between processes), so two runs of the same program
// on the same card and toolkit give the same bits. Ops that are deterministic regardless (the
// embedding backward: a stable sort, no atomics) are unaffected. Off by default, or on when the
// environment sets SHARDMAP_DETERMINISTIC to 1/on/true; set it before the first GEMM (plans
// tuned earlier keep their choice). Usable without CUDA.
//
//   cuda::SetDeterministic(absl::GetFlag(FLAGS_deterministic));
bool Deterministic();
void SetDeterministic(bool on);
// SHARDMAP_DETERMINISTIC's value: "1", "on", "true" (any case) are on; unset or else off.
bool DeterministicFromEnv(const char* value);

// Waits for the work queued on this thread's current stream of `device`, then runs this thread's
// deferred index checks that have landed (device_memory.h). Throws OpError on a CUDA error
// (including an earlier asynchronous kernel fault) or a bad index found by such a check.
void Synchronize(int device);

namespace internal {
// Called by Synchronize after its wait (set once by device_memory.cc, which owns the deferred
// index checks: a layer above this one).
void SetAfterStreamWait(void (*hook)());
}  // namespace internal

}  // namespace shardmap::cuda

#endif  // SHARDMAP_TENSOR_CUDA_RUNTIME_H_
