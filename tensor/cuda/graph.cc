#include "tensor/cuda/graph.h"

#include <cstring>
#include <map>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "tensor/cuda/device_memory.h"
#include "tensor/error.h"

#if SHARDMAP_HAS_CUDA
#include <cuda_runtime.h>

#include "base/host_waits.h"
#include "tensor/cuda/internal/cuda_check.h"
#endif

namespace shardmap::cuda {

namespace {

absl::Status Unavailable(const char* what) {
  return absl::FailedPreconditionError(
      absl::StrCat("CudaGraph::", what, ": no GPU to capture on (", UnavailableReason(),
                   "); run the step eagerly"));
}

}  // namespace

void CopyInto(const Tensor& src, Tensor& dst) {
  if (!src.defined() || !dst.defined()) OpFail("cuda::CopyInto: undefined tensor");
  if (src.dtype() != dst.dtype() || src.numel() != dst.numel()) {
    OpFail("cuda::CopyInto: ", src.ShapeString(), " does not fit into ", dst.ShapeString(),
           "; a captured input keeps its dtype and size (static shapes)");
  }
  const size_t n = dst.nbytes();
  if (n == 0) return;
  if (!src.is_cuda() && !dst.is_cuda()) {
    std::memmove(dst.raw_data(), src.raw_data(), n);
  } else if (!src.is_cuda()) {
    CopyHostToDevice(dst.raw_data(), dst.device().index, src.raw_data(), n);
  } else if (!dst.is_cuda()) {
    CopyDeviceToHost(dst.raw_data(), src.raw_data(), src.device().index, n);
  } else {
    CopyDeviceToDevice(dst.raw_data(), dst.device().index, src.raw_data(), src.device().index, n);
  }
}

#if SHARDMAP_HAS_CUDA

bool IsCapturing(int device) {
  if (!Available() || device < 0 || device >= DeviceCount()) return false;
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(static_cast<cudaStream_t>(CurrentStream(device)), &st) !=
      cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return st != cudaStreamCaptureStatusNone;
}

CudaGraph::CudaGraph(int device) : device_(device) {}

CudaGraph::~CudaGraph() {
  if (exec_ != nullptr) {
    internal::NoteCudaError(cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_)),
                            "cudaGraphExecDestroy (~CudaGraph)");
  }
  if (graph_ != nullptr) {
    internal::NoteCudaError(cudaGraphDestroy(static_cast<cudaGraph_t>(graph_)),
                            "cudaGraphDestroy (~CudaGraph)");
  }
  // Blocks of the pool still held by tensors are handed back when those tensors are freed.
  if (has_pool_) DeviceAllocator(device_).ReleasePool(pool_);
}

absl::Status CudaGraph::Capture(const std::function<void()>& fn) {
  if (!Available()) return Unavailable("Capture");
  if (device_ < 0 || device_ >= DeviceCount()) {
    return absl::InvalidArgumentError(absl::StrCat("CudaGraph: device ", device_,
                                                   " does not exist (", DeviceCount(),
                                                   " visible)"));
  }
  if (tried_) {
    return absl::FailedPreconditionError(
        "CudaGraph::Capture: this graph was already captured (once per CudaGraph); make a new "
        "CudaGraph to capture another step");
  }
  tried_ = true;
  const std::string where = absl::StrCat("while capturing a CUDA graph on cuda:", device_);
  cudaStream_t stream = static_cast<cudaStream_t>(CurrentStream(device_));
  CachingAllocator& alloc = DeviceAllocator(device_);
  cudaGraph_t graph = nullptr;
  bool pool_begun = false;
  bool capture_begun = false;
  // An unbound thread's work goes to the per-thread default stream, whose handle the allocator
  // shares between all unbound threads: capture on a stream of this thread's own instead (bound
  // for fn), so the private pool catches exactly fn's allocations. Replay may still launch on
  // the per-thread default stream.
  std::optional<StreamScope> own_stream;

  absl::Status fn_status = CatchOpError([&] {
    DeviceGuard guard(device_);
    // Work queued eagerly before the capture (e.g. writes of the inputs) must not be folded
    // into, or race with, the captured work.
    base::CountHostWait(base::HostWait::kStreamSync);
    SM_CUDA_CHECK(cudaStreamSynchronize(stream));
    if (stream == cudaStreamPerThread) {
      thread_local std::map<int, StreamHandle> capture_streams;  // per device, kept
      StreamHandle& mine = capture_streams[device_];
      if (mine == nullptr) mine = NewStream(device_);
      own_stream.emplace(device_, mine);
      stream = static_cast<cudaStream_t>(mine);
    }
    pool_ = alloc.CreatePool();
    has_pool_ = true;
    alloc.BeginPool(pool_, stream);
    pool_begun = true;
    SM_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    capture_begun = true;
    fn();
  });

  absl::Status end_status;
  if (capture_begun) {
    DeviceGuard guard(device_);
    cudaError_t e = cudaStreamEndCapture(stream, &graph);
    if (e != cudaSuccess) {
      end_status = absl::InternalError(absl::StrCat("cudaStreamEndCapture: ", cudaGetErrorName(e),
                                                    ": ", cudaGetErrorString(e)));
      cudaGetLastError();
      if (graph != nullptr) cudaGraphDestroy(graph);
      graph = nullptr;
    }
  }
  if (pool_begun) alloc.EndPool(pool_);
  own_stream.reset();

  if (!fn_status.ok() || !end_status.ok()) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    cudaGetLastError();  // capture errors are not sticky; start the next call clean
    const absl::Status& s = fn_status.ok() ? end_status : fn_status;
    std::string msg(s.message());
    const bool sync_like = msg.find("capture") != std::string::npos ||
                           msg.find("Capture") != std::string::npos;
    return absl::Status(
        s.code() == absl::StatusCode::kInternal && sync_like
            ? absl::StatusCode::kFailedPrecondition
            : s.code(),
        absl::StrCat(where, ": ", msg,
                     sync_like ? "; the captured function must not synchronise with the host "
                                 "(item(), ToVector(), To(Device::Cpu()), host->device copies of "
                                 "fresh host tensors, in-process collectives): move those out of "
                                 "the step, or run it eagerly"
                               : ""));
  }

  cudaGraphExec_t exec = nullptr;
  cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
  if (e != cudaSuccess) {
    cudaGetLastError();
    cudaGraphDestroy(graph);
    return absl::InternalError(absl::StrCat(where, ": cudaGraphInstantiate: ",
                                            cudaGetErrorName(e), ": ", cudaGetErrorString(e)));
  }
  size_t n = 0;
  if (cudaGraphGetNodes(graph, nullptr, &n) != cudaSuccess) {
    cudaGetLastError();
    n = 0;
  }
  num_nodes_ = static_cast<int64_t>(n);
  graph_ = graph;
  exec_ = exec;
  return absl::OkStatus();
}

absl::Status CudaGraph::Replay() {
  if (!Available()) return Unavailable("Replay");
  if (exec_ == nullptr) {
    return absl::FailedPreconditionError(
        "CudaGraph::Replay: nothing captured (Capture first, and check its Status)");
  }
  return CatchOpError([&] {
    DeviceGuard guard(device_);
    SM_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_),
                                  static_cast<cudaStream_t>(CurrentStream(device_))));
  });
}

#else  // !SHARDMAP_HAS_CUDA

bool IsCapturing(int) { return false; }
CudaGraph::CudaGraph(int device) : device_(device) {}
CudaGraph::~CudaGraph() = default;
absl::Status CudaGraph::Capture(const std::function<void()>&) { return Unavailable("Capture"); }
absl::Status CudaGraph::Replay() { return Unavailable("Replay"); }

#endif  // SHARDMAP_HAS_CUDA

}  // namespace shardmap::cuda
