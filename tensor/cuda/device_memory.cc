#include "tensor/cuda/device_memory.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "tensor/cuda/runtime.h"
#include "tensor/error.h"

#if SHARDMAP_HAS_CUDA
#include <cuda_runtime.h>

#include "base/host_waits.h"
#include "tensor/cuda/internal/capture_mode.h"
#include "tensor/cuda/internal/cuda_check.h"
#include "tensor/cuda/internal/deferred_check_queue.h"
#include "tensor/cuda/kernels/fill.h"
#endif

namespace shardmap::cuda {
namespace {

void RequireDevice(int device, const char* what) {
  const int n = DeviceCount();
  if (device < 0 || device >= n) {
    OpFail(what, ": CUDA device ", device, " does not exist (", n, " visible",
           n == 0 ? absl::StrCat(": ", UnavailableReason()) : std::string(), ")");
  }
}

#if SHARDMAP_HAS_CUDA

cudaStream_t StreamOf(int device) { return static_cast<cudaStream_t>(CurrentStream(device)); }

// cudaMalloc/cudaFree would invalidate a capture in global or thread-local mode; the caching
// allocator only calls them for blocks that belong to the graph's private pool (or to no
// graph), so this thread may do so in relaxed mode.
using internal::RelaxedCaptureMode;

// Pinned staging for host->device copies: a ring of kSlots chunks per thread, so the memcpy into
// one overlaps the DMA out of the others. Each chunk's event says when its last DMA is done.
// The ring carries on from call to call (`next`): a copy waits only for the DMA of the copy
// kSlots chunks back (and the stream work queued before it), not for every copy's chunk 0.
struct Staging {
  static constexpr size_t kChunk = size_t{4} << 20;
  static constexpr int kSlots = 4;
  void* chunk[kSlots] = {};
  cudaEvent_t done[kSlots] = {};
  int device = -1;
  int next = 0;

  ~Staging() { Release(); }
  void Release() {
    for (int i = 0; i < kSlots; ++i) {
      if (done[i] != nullptr) {
        internal::NoteCudaError(cudaEventSynchronize(done[i]),
                                "cudaEventSynchronize (host->device staging release)");
        internal::NoteCudaError(cudaEventDestroy(done[i]),
                                "cudaEventDestroy (host->device staging release)");
        done[i] = nullptr;
      }
      if (chunk[i] != nullptr) {
        internal::NoteCudaError(cudaFreeHost(chunk[i]),
                                "cudaFreeHost (host->device staging release)");
        chunk[i] = nullptr;
      }
    }
    next = 0;
  }
  void Ensure(int dev) {
    if (chunk[kSlots - 1] != nullptr && done[kSlots - 1] != nullptr && device == dev) return;
    Release();
    device = dev;
    try {
      for (int i = 0; i < kSlots; ++i) {
        SM_CUDA_CHECK(cudaMallocHost(&chunk[i], kChunk));
        SM_CUDA_CHECK(cudaEventCreateWithFlags(&done[i], cudaEventDisableTiming));
      }
    } catch (...) {
      // A half-made staging (some chunks without their events) must not pass the check above
      // on the next call: that would memcpy into a null chunk.
      Release();
      throw;
    }
  }
  // The next chunk of the ring, once its previous DMA has finished: asked first without
  // blocking, so a chunk whose DMA is over (the usual case) costs no host wait.
  int Take() {
    const int i = next;
    next = (next + 1) % kSlots;
    const cudaError_t q = cudaEventQuery(done[i]);
    if (q == cudaSuccess) return i;
    if (q != cudaErrorNotReady) SM_CUDA_CHECK(q);
    base::CountHostWait(base::HostWait::kEventSync);
    SM_CUDA_CHECK(cudaEventSynchronize(done[i]));
    return i;
  }
};

// The deferred index checks of this thread (device_memory.h): per slot a pinned host word and an
// event recorded after the copy into it (internal/deferred_check_queue.h: checks are run by their
// event, so one on a stream destroyed since is run like any other).
struct DeferredChecks {
  static constexpr int kSlots = 256;
  int64_t* host = nullptr;  // pinned [kSlots]
  cudaEvent_t landed[kSlots] = {};
  std::unique_ptr<internal::DeferredCheckQueue> queue;
  ~DeferredChecks() {
    queue.reset();
    for (cudaEvent_t& e : landed) {
      if (e != nullptr) {
        internal::NoteCudaError(cudaEventDestroy(e), "cudaEventDestroy (deferred index checks)");
      }
    }
    if (host != nullptr) {
      internal::NoteCudaError(cudaFreeHost(host), "cudaFreeHost (deferred index checks)");
    }
  }
  void Ensure() {
    if (queue != nullptr) return;
    if (host == nullptr) {
      void* p = nullptr;
      SM_CUDA_CHECK(cudaMallocHost(&p, kSlots * sizeof(int64_t)));
      host = static_cast<int64_t*>(p);
    }
    for (cudaEvent_t& e : landed) {
      if (e == nullptr) SM_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    }
    internal::DeferredCheckQueue::SlotOps ops;
    ops.done = [this](int slot) {
      const cudaError_t e = cudaEventQuery(landed[slot]);
      if (e == cudaErrorNotReady) return false;
      SM_CUDA_CHECK(e);
      return true;
    };
    ops.wait = [this](int slot) {
      base::CountHostWait(base::HostWait::kEventSync);
      SM_CUDA_CHECK(cudaEventSynchronize(landed[slot]));
    };
    ops.value = [this](int slot) { return host[slot]; };
    queue = std::make_unique<internal::DeferredCheckQueue>(kSlots, std::move(ops));
  }
};
thread_local DeferredChecks deferred_checks;

// The op's `fail`, whose error then says it was deferred (a CUDA error met while running the
// checks is left as it is).
std::function<void(int64_t)> WithDeferredNote(std::function<void(int64_t)> fail) {
  return [fail = std::move(fail)](int64_t pos) {
    try {
      fail(pos);
    } catch (const OpError& e) {
      throw OpError(absl::Status(
          e.status().code(),
          absl::StrCat(e.status().message(),
                       " (found at a later wait for the stream: index checks are deferred, "
                       "cuda::DeferredIndexChecksScope; run with SHARDMAP_DEFER_INDEX_CHECKS=0 "
                       "to stop at the op)")));
    }
  };
}

// Runs (and drops) this thread's queued checks whose copies have landed; throws the first
// failure. Called after every wait for a stream (a read back, Synchronize).
void RunLandedChecks() {
  DeferredChecks& d = deferred_checks;
  if (d.queue == nullptr || d.queue->pending() == 0) return;
  d.queue->RunFinished();
}

// Synchronize (runtime.cc, a layer below) runs the landed checks after its wait.
[[maybe_unused]] const bool registered_after_wait =
    (internal::SetAfterStreamWait(&RunLandedChecks), true);

#endif

std::atomic<bool>& DeferFlag() {
  static std::atomic<bool>* on = new std::atomic<bool>(false);
  return *on;
}
// SHARDMAP_DEFER_INDEX_CHECKS when set (non-empty): -1 unset, else 0/1.
int DeferFromEnv() {
  static const int env = [] {
    const char* v = std::getenv("SHARDMAP_DEFER_INDEX_CHECKS");
    if (v == nullptr || *v == '\0') return -1;
    return DeferredIndexChecksFromEnv(v) ? 1 : 0;
  }();
  return env;
}
thread_local int defer_scope = -1;  // DeferredIndexChecksScope's choice (-1: none)

}  // namespace

bool DeferredIndexChecksFromEnv(const char* value) {
  if (value == nullptr) return false;
  const std::string v = absl::AsciiStrToLower(value);
  return v == "1" || v == "on" || v == "true";
}
bool DeferredIndexChecks() {
  if (const int env = DeferFromEnv(); env >= 0) return env == 1;
  if (defer_scope >= 0) return defer_scope == 1;
  return DeferFlag().load(std::memory_order_relaxed);
}

DeferredIndexChecksScope::DeferredIndexChecksScope(bool on) : prev_(defer_scope) {
  defer_scope = on ? 1 : 0;
}
DeferredIndexChecksScope::~DeferredIndexChecksScope() { defer_scope = prev_; }
void SetDeferredIndexChecks(bool on) { DeferFlag().store(on, std::memory_order_relaxed); }

#if SHARDMAP_HAS_CUDA

void DeferIndexCheck(int device, const void* device_word, std::function<void(int64_t)> fail) {
  RequireDevice(device, "cuda::DeferIndexCheck");
  DeviceGuard guard(device);
  DeferredChecks& d = deferred_checks;
  d.Ensure();
  // Full: waits for the oldest check's copy (by its event: its stream may be gone) and runs the
  // landed ones, whose error (an earlier op's) is thrown here.
  const int slot = d.queue->Acquire();
  const cudaStream_t stream = static_cast<cudaStream_t>(CurrentStream(device));
  cudaError_t e = cudaMemcpyAsync(&d.host[slot], device_word, sizeof(int64_t),
                                  cudaMemcpyDeviceToHost, stream);
  if (e == cudaSuccess) e = cudaEventRecord(d.landed[slot], stream);
  if (e != cudaSuccess) {
    d.queue->Release(slot);
    SM_CUDA_CHECK(e);
  }
  d.queue->Add(slot, WithDeferredNote(std::move(fail)));
}

void RunDeferredIndexChecks(int device) {
  RequireDevice(device, "cuda::RunDeferredIndexChecks");
  DeviceGuard guard(device);
  const cudaStream_t stream = static_cast<cudaStream_t>(CurrentStream(device));
  base::CountHostWait(base::HostWait::kStreamSync);
  SM_CUDA_CHECK(cudaStreamSynchronize(stream));
  RunLandedChecks();
}

size_t PendingDeferredIndexChecks() {
  const DeferredChecks& d = deferred_checks;
  return d.queue == nullptr ? 0 : d.queue->pending();
}

CachingAllocator& DeviceAllocator(int device) {
  RequireDevice(device, "cuda::DeviceAllocator");
  static std::vector<std::unique_ptr<CachingAllocator>>* allocators = [] {
    auto* v = new std::vector<std::unique_ptr<CachingAllocator>>();
    for (int d = 0; d < DeviceCount(); ++d) {
      CachingAllocator::RawOps raw;
      raw.malloc = [d](size_t n) -> void* {
        DeviceGuard guard(d);
        RelaxedCaptureMode relaxed;
        void* p = nullptr;
        cudaError_t e = cudaMalloc(&p, n);
        if (e == cudaErrorMemoryAllocation) {
          cudaGetLastError();  // not sticky: clear it so the retry and later calls are clean
          return nullptr;
        }
        SM_CUDA_CHECK(e);
        return p;
      };
      // Called from tensors' deleters, which must not throw: a failure is printed and
      // remembered, and the next checked CUDA call's error names it (internal/cuda_check.h).
      const std::string free_op = absl::StrCat("cudaFree (caching allocator, cuda:", d, ")");
      const std::string sync_op =
          absl::StrCat("cudaDeviceSynchronize (caching allocator, cuda:", d, ")");
      raw.free = [d, free_op](void* p) {
        DeviceGuard guard(d);
        RelaxedCaptureMode relaxed;
        internal::NoteCudaError(cudaFree(p), free_op.c_str());
      };
      raw.synchronize = [d, sync_op] {
        DeviceGuard guard(d);
        base::CountHostWait(base::HostWait::kDeviceSync);
        internal::NoteCudaError(cudaDeviceSynchronize(), sync_op.c_str());
      };
      v->push_back(std::make_unique<CachingAllocator>(std::move(raw), absl::StrCat("cuda:", d)));
    }
    return v;  // never destroyed: tensors may outlive static destruction order
  }();
  return *(*allocators)[device];
}

// The allocator's stream key of this thread's current stream. cudaStreamPerThread is one handle
// value for every thread but a different stream in each: keyed by the handle, a block freed by
// one unbound thread (its kernels maybe still queued) would be reused by another thread's stream
// with no ordering between them. So an unbound thread gets a key of its own, never reused by a
// later thread (the allocator only compares keys; it never passes them to CUDA).
StreamHandle AllocatorStreamKey(int device) {
  StreamHandle s = CurrentStream(device);
  if (s != static_cast<StreamHandle>(cudaStreamPerThread)) return s;
  static std::atomic<uintptr_t> next{1};
  thread_local const uintptr_t mine = next.fetch_add(1) * 2 + 1;  // odd: no real stream's address
  return reinterpret_cast<StreamHandle>(mine);
}

void* DeviceAllocate(int device, size_t nbytes) {
  return DeviceAllocator(device).Allocate(nbytes, AllocatorStreamKey(device));
}

void DeviceFree(int device, void* p) {
  if (p == nullptr) return;
  DeviceAllocator(device).Free(p, AllocatorStreamKey(device));
}

void CopyHostToDevice(void* dst, int device, const void* src, size_t nbytes) {
  RequireDevice(device, "cuda::CopyHostToDevice");
  if (nbytes == 0) return;
  DeviceGuard guard(device);
  cudaStream_t stream = StreamOf(device);
  // Under a stream capture the copy out of the staging chunk would be recorded and replayed
  // later from whatever the chunk then holds, and the chunk's event would be left recorded in
  // the capture (every later copy of this thread failing on it): refuse before touching either.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  SM_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  if (capture != cudaStreamCaptureStatusNone) {
    OpFail("cuda::CopyHostToDevice: a host->device copy (", nbytes, " bytes to cuda:", device,
           ") cannot be captured in a CUDA graph: its host bytes are read at capture time, not at "
           "each replay; copy new inputs into a captured input tensor before Replay "
           "(cuda::CopyInto), or build the tensor on the device");
  }
  thread_local Staging staging;
  staging.Ensure(device);
  const char* from = static_cast<const char*>(src);
  char* to = static_cast<char*>(dst);
  for (size_t done = 0; done < nbytes;) {
    const size_t n = std::min(Staging::kChunk, nbytes - done);
    const int i = staging.Take();
    std::memcpy(staging.chunk[i], from + done, n);
    SM_CUDA_CHECK(cudaMemcpyAsync(to + done, staging.chunk[i], n, cudaMemcpyHostToDevice, stream));
    SM_CUDA_CHECK(cudaEventRecord(staging.done[i], stream));
    done += n;
  }
}

void CopyDeviceToHost(void* dst, const void* src, int device, size_t nbytes) {
  RequireDevice(device, "cuda::CopyDeviceToHost");
  if (nbytes == 0) return;
  DeviceGuard guard(device);
  cudaStream_t stream = StreamOf(device);
  SM_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToHost, stream));
  base::CountHostWait(base::HostWait::kDeviceToHostRead);
  SM_CUDA_CHECK(cudaStreamSynchronize(stream));
  // The stream is done: the index checks queued on it have their answers (device_memory.h).
  RunLandedChecks();
}

void CopyDeviceToDevice(void* dst, int dst_device, const void* src, int src_device,
                        size_t nbytes) {
  RequireDevice(dst_device, "cuda::CopyDeviceToDevice");
  RequireDevice(src_device, "cuda::CopyDeviceToDevice");
  if (nbytes == 0) return;
  DeviceGuard guard(dst_device);
  cudaStream_t stream = StreamOf(dst_device);
  if (dst_device == src_device) {
    SM_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice, stream));
  } else {
    // The source device's queued work must be done before the copy reads it. With src_device
    // current: an unbound thread's stream there is cudaStreamPerThread, which names the
    // per-thread stream of the *current* device (under dst's guard it would wait on dst's).
    {
      DeviceGuard src_guard(src_device);
      base::CountHostWait(base::HostWait::kStreamSync);
      SM_CUDA_CHECK(cudaStreamSynchronize(StreamOf(src_device)));
    }
    SM_CUDA_CHECK(cudaMemcpyPeerAsync(dst, dst_device, src, src_device, nbytes, stream));
    // The source block is cached per stream of src_device: once the caller frees it, work on
    // that stream may reuse it while this copy (ordered only on dst's stream) still reads it.
    base::CountHostWait(base::HostWait::kStreamSync);
    SM_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
}

void MemsetZero(void* p, int device, size_t nbytes) {
  RequireDevice(device, "cuda::MemsetZero");
  if (nbytes == 0) return;
  DeviceGuard guard(device);
  SM_CUDA_CHECK(cudaMemsetAsync(p, 0, nbytes, StreamOf(device)));
}

void Fill(void* dst, int device, DType dtype, int64_t n, double value) {
  RequireDevice(device, "cuda::Fill");
  DeviceGuard guard(device);
  SM_CUDA_CHECK(static_cast<cudaError_t>(
      kernels::LaunchFill(dst, dtype, n, value, CurrentStream(device))));
}

#else  // !SHARDMAP_HAS_CUDA

CachingAllocator& DeviceAllocator(int device) {
  RequireDevice(device, "cuda::DeviceAllocator");
  __builtin_unreachable();
}
void* DeviceAllocate(int device, size_t) {
  RequireDevice(device, "cuda::DeviceAllocate");
  return nullptr;
}
void DeviceFree(int, void*) {}
void CopyHostToDevice(void*, int device, const void*, size_t) {
  RequireDevice(device, "cuda::CopyHostToDevice");
}
void CopyDeviceToHost(void*, const void*, int device, size_t) {
  RequireDevice(device, "cuda::CopyDeviceToHost");
}
void CopyDeviceToDevice(void*, int dst_device, const void*, int, size_t) {
  RequireDevice(dst_device, "cuda::CopyDeviceToDevice");
}
void MemsetZero(void*, int device, size_t) { RequireDevice(device, "cuda::MemsetZero"); }
void Fill(void*, int device, DType, int64_t, double) { RequireDevice(device, "cuda::Fill"); }
void DeferIndexCheck(int device, const void*, std::function<void(int64_t)>) {
  RequireDevice(device, "cuda::DeferIndexCheck");
}
void RunDeferredIndexChecks(int device) { RequireDevice(device, "cuda::RunDeferredIndexChecks"); }
size_t PendingDeferredIndexChecks() { return 0; }

#endif  // SHARDMAP_HAS_CUDA

}  // namespace shardmap::cuda
