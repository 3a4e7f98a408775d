// CUDA graphs: capture the kernels of a step once, replay them with one launch per step (no
// host-side op dispatch, allocation or type checking), for static shapes.
//
//   Tensor x = Tensor::Empty({b, d}, DType::kF32, Device::Cuda(0));   // captured input
//   Tensor loss;                                                       // captured output
//   cuda::CudaGraph graph(/*device=*/0);
//   absl::Status s = graph.Capture([&] {
//     loss = TrainStep(x, params);      // forward + backward + in-place SGD update of params
//   });
//   for (const Tensor& batch : batches) {
//     cuda::CopyInto(batch, x);         // new inputs go INTO the captured input tensor
//     graph.Replay();                   // runs the whole step on this thread's current stream
//     log(loss.To(Device::Cpu()));      // outputs are read FROM the captured output tensors
//   }
//
// What Capture does: on this thread's current stream of `device` (cuda/runtime.h: the stream a
// StreamScope bound; a thread that bound none captures on a stream of its own, bound for fn) it
// waits for the work already queued there, begins a stream capture in thread-local mode, routes
// every allocation on that stream into a private pool of the caching allocator (so no eager
// allocation is ever handed an address the graph writes), runs fn (its
// kernels are recorded, not executed), ends the capture and instantiates the graph. Tensors that
// fn allocates and that outlive it (outputs, updated state) keep their addresses for every
// replay; tensors from before the capture that fn drops stay allocated for the graph (handed to
// no one); the pool's memory is returned when the CudaGraph is destroyed.
//
// Rules (static shapes, no host round trips): fn must launch the same work for every replay, so
//   * inputs are tensors allocated before Capture; write new values into them before Replay;
//   * outputs are tensors fn assigns; each Replay overwrites them;
//   * fn must not synchronise with the host (item(), ToVector(), To(Device::Cpu()), a host ->
//     device copy of a fresh host tensor, an in-process collective): CUDA (or, for host ->
//     device copies and in-process collectives, this library) refuses, and Capture returns that
//     error as a Status naming the capture and this rule;
//   * work fn launches on other streams is not captured.
// In-process collectives (virtual ranks) synchronise with the host inside every call, so a step
// of GPU ranks under RunSpmd cannot be captured: the collective ops refuse with an error that says
// to use NCCL or to run eagerly.
//
// Without a GPU (or a CUDA build) Capture and Replay return FailedPrecondition naming the reason.
#ifndef SHARDMAP_TENSOR_CUDA_GRAPH_H_
#define SHARDMAP_TENSOR_CUDA_GRAPH_H_

#include <cstdint>
#include <functional>

#include "absl/status/status.h"
#include "tensor/cuda/caching_allocator.h"
#include "tensor/cuda/runtime.h"
#include "tensor/tensor.h"

namespace shardmap::cuda {

class CudaGraph {
 public:
  explicit CudaGraph(int device = 0);
  ~CudaGraph();  // destroys the graph and its executable, releases the private pool
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  // Records fn's work on this thread's current stream of the device. fn may throw OpError; the
  // capture is then abandoned and its Status returned (annotated). Once per CudaGraph.
  absl::Status Capture(const std::function<void()>& fn);
  // Launches the captured graph on this thread's current stream of the device (asynchronous:
  // ordered before later work on that stream). FailedPrecondition before a successful Capture.
  absl::Status Replay();

  bool captured() const { return exec_ != nullptr; }
  int device() const { return device_; }
  // Nodes (kernels, copies, memsets) in the captured graph; 0 before Capture.
  int64_t num_nodes() const { return num_nodes_; }

 private:
  int device_;
  void* graph_ = nullptr;  // cudaGraph_t
  void* exec_ = nullptr;   // cudaGraphExec_t
  CachingAllocator::PoolId pool_ = 0;
  bool has_pool_ = false;
  bool tried_ = false;
  int64_t num_nodes_ = 0;
};

// Whether this thread's current stream of `device` is being captured (false without CUDA).
bool IsCapturing(int device);

// Copies src's elements into dst (same dtype and numel; any devices), ordered on the current
// stream of dst's device when dst is on a GPU. Use it to feed a captured input tensor. Throws
// OpError on a mismatch.
void CopyInto(const Tensor& src, Tensor& dst);

}  // namespace shardmap::cuda

#endif  // SHARDMAP_TENSOR_CUDA_GRAPH_H_
