#include "tensor/cuda/runtime.h"

#include <atomic>
#include <cstdlib>
#include <string>

#include "absl/strings/ascii.h"
#include "tensor/error.h"

#if SHARDMAP_HAS_CUDA
#include <cuda_runtime.h>

#include <mutex>

#include "absl/strings/str_cat.h"
#include "base/host_waits.h"
#include "tensor/cuda/internal/cuda_check.h"
#endif

namespace shardmap::cuda {

namespace {
std::atomic<void (*)()> after_stream_wait{nullptr};

std::atomic<bool>& DeterministicFlag() {
  static std::atomic<bool>* on =
      new std::atomic<bool>(DeterministicFromEnv(std::getenv("SHARDMAP_DETERMINISTIC")));
  return *on;
}
}  // namespace

void internal::SetAfterStreamWait(void (*hook)()) { after_stream_wait.store(hook); }

bool DeterministicFromEnv(const char* value) {
  if (value == nullptr) return false;
  const std::string v = absl::AsciiStrToLower(value);
  return v == "1" || v == "on" || v == "true";
}
bool Deterministic() { return DeterministicFlag().load(std::memory_order_relaxed); }
void SetDeterministic(bool on) { DeterministicFlag().store(on, std::memory_order_relaxed); }

#if SHARDMAP_HAS_CUDA

namespace {

// This thread's binding per device (StreamScope); nullptr means unbound.
constexpr int kMaxBoundDevices = 64;
thread_local StreamHandle bound_streams[kMaxBoundDevices] = {};

struct Probe {
  int count = 0;
  std::string reason;
};

const Probe& GetProbe() {
  static const Probe* probe = [] {
    auto* p = new Probe;
    cudaError_t e = cudaGetDeviceCount(&p->count);
    if (e != cudaSuccess) {
      p->count = 0;
      p->reason = absl::StrCat("cudaGetDeviceCount: ", cudaGetErrorName(e), ": ",
                               cudaGetErrorString(e));
      cudaGetLastError();  // clear the sticky-free error so later calls start clean
    } else if (p->count == 0) {
      p->reason = "cudaGetDeviceCount found no GPU";
    }
    return p;
  }();
  return *probe;
}

void RequireDevice(int device, const char* what) {
  const int n = DeviceCount();
  if (device < 0 || device >= n) {
    OpFail(what, ": CUDA device ", device, " does not exist (", n, " visible",
           n == 0 ? absl::StrCat(": ", UnavailableReason()) : std::string(), ")");
  }
}

}  // namespace

bool Available() { return GetProbe().count > 0; }
int DeviceCount() { return GetProbe().count; }
std::string DeviceName(int device) {
  if (device < 0 || device >= DeviceCount()) return "";
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) return "";
  return prop.name;
}
std::string UnavailableReason() { return Available() ? std::string() : GetProbe().reason; }

StreamHandle NewStream(int device) {
  RequireDevice(device, "cuda::NewStream");
  DeviceGuard guard(device);
  cudaStream_t s = nullptr;
  SM_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return s;
}

StreamHandle CurrentStream(int device) {
  if (device >= 0 && device < kMaxBoundDevices && bound_streams[device] != nullptr) {
    return bound_streams[device];
  }
  return cudaStreamPerThread;
}

StreamScope::StreamScope(int device, StreamHandle stream)
    : device_(device), prev_stream_(nullptr), prev_current_device_(0) {
  RequireDevice(device, "cuda::StreamScope");
  if (device >= kMaxBoundDevices) {
    OpFail("cuda::StreamScope: device ", device, " is beyond the ", kMaxBoundDevices,
           " devices a thread can bind streams on");
  }
  SM_CUDA_CHECK(cudaGetDevice(&prev_current_device_));
  SM_CUDA_CHECK(cudaSetDevice(device));
  prev_stream_ = bound_streams[device];
  bound_streams[device] = stream;
}

StreamScope::~StreamScope() {
  bound_streams[device_] = prev_stream_;
  cudaSetDevice(prev_current_device_);
}

DeviceGuard::DeviceGuard(int device) : prev_(0) {
  SM_CUDA_CHECK(cudaGetDevice(&prev_));
  if (prev_ != device) SM_CUDA_CHECK(cudaSetDevice(device));
}

DeviceGuard::~DeviceGuard() { cudaSetDevice(prev_); }

void Synchronize(int device) {
  RequireDevice(device, "cuda::Synchronize");
  DeviceGuard guard(device);
  cudaStream_t stream = static_cast<cudaStream_t>(CurrentStream(device));
  // Asked first without blocking: a stream already idle (after a step's read back, say) costs
  // no host wait and is not counted as one (base/host_waits.h).
  const cudaError_t q = cudaStreamQuery(stream);
  if (q != cudaSuccess) {
    if (q != cudaErrorNotReady) SM_CUDA_CHECK(q);
    base::CountHostWait(base::HostWait::kStreamSync);
    SM_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  // The index checks queued on this stream have their answers now: a bad id in the last ops of a
  // run (after its last read back) is still found, at the run's final wait.
  if (void (*hook)() = after_stream_wait.load(); hook != nullptr) hook();
}

#else  // !SHARDMAP_HAS_CUDA

namespace {
[[noreturn]] void NoCuda(const char* what) {
  OpFail(what, ": this build has no CUDA support (the CUDA toolkit was not found at build time;"
               " set CUDA_PATH or install it under /usr/local/cuda and rebuild)");
}
}  // namespace

bool Available() { return false; }
int DeviceCount() { return 0; }
std::string DeviceName(int) { return ""; }
std::string UnavailableReason() { return "built without the CUDA toolkit"; }
StreamHandle NewStream(int) { NoCuda("cuda::NewStream"); }
StreamHandle CurrentStream(int) { return nullptr; }
StreamScope::StreamScope(int device, StreamHandle)
    : device_(device), prev_stream_(nullptr), prev_current_device_(0) {
  NoCuda("cuda::StreamScope");
}
StreamScope::~StreamScope() = default;
DeviceGuard::DeviceGuard(int) : prev_(0) { NoCuda("cuda::DeviceGuard"); }
DeviceGuard::~DeviceGuard() = default;
void Synchronize(int) { NoCuda("cuda::Synchronize"); }

#endif  // SHARDMAP_HAS_CUDA

}  // namespace shardmap::cuda
