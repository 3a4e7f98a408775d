// The tensor-parallel layer cases of //bench:tp_bench and //bench:tp_model_report: builds a GPT
// layer (models/parallel/layers.h) sharded over `tp` in-process ranks (simulated CPU devices, virtual
// ranks sharing one GPU with a stream each, or one GPU per rank), runs warm-up + measured steps
// (forward, or forward + backward through the tape), and returns rank 0's step times with the
// time and bytes spent in collectives (bench/timed_communicator.h).
//
//   LayerCase c{Layer::kMlp, /*tp=*/2, /*sp=*/true, /*fwd_bwd=*/true, /*tokens=*/512, /*d=*/512};
//   absl::StatusOr<LayerTiming> t = RunLayer(c, /*warmup=*/1, /*measured=*/3);
//   absl::StatusOr<LayerTiming> one = RunUnsharded(c, 1, 3);   // same layer, one device, no TP
//   c.backend = Backend::kSharedGpu; c.dtype = DType::kBF16;    // 2 virtual ranks on GPU 0
//   t = RunLayer(c, 2, 5);   // FailedPrecondition (with the reason) without a usable GPU
//
// Shapes: activations [tokens, d]; MLP ffn = 4d; attention heads of 64 (d/64 heads), sequences
// of min(tokens, 128) tokens. Parameters are drawn from N(0, 0.02) (LayerNorm weights ~1) in f32
// and cast to c.dtype.
//
// GPU timing: every step starts with each rank's stream drained and the ranks at a barrier; each
// rank records CUDA events on its stream around the step, and the step's time is the longest
// rank's event span (the card's time for the step, host launch gaps that starve it included),
// never the host time of asynchronous launches.
#ifndef SHARDMAP_BENCH_TP_LAYERS_H_
#define SHARDMAP_BENCH_TP_LAYERS_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/timed_communicator.h"
#include "tensor/dtype.h"

namespace shardmap::bench {

// kAsyncMlp: the sequence-parallel MLP as collective matmuls (models/parallel/async_tp.h: RingMlp);
// needs sp and a tp that divides tokens.
enum class Layer { kColumn, kRow, kMlp, kAttention, kBlock, kAsyncMlp };
const char* LayerName(Layer l);  // "column_parallel_linear", ..., "block", "async_tp_mlp"

// Where the ranks run: threads on the CPU (simulated devices), virtual ranks sharing GPU 0 (a
// stream each), or rank r on GPU r.
enum class Backend { kCpu, kSharedGpu, kGpuPerRank };
const char* BackendName(Backend b);  // "cpu", "cuda_shared", "cuda_per_gpu"

struct LayerCase {
  Layer layer = Layer::kMlp;
  int tp = 1;
  bool sp = false;
  bool fwd_bwd = false;
  int64_t tokens = 512;
  int64_t d = 512;
  int64_t head_dim = 64;
  int64_t seq_len = 0;  // tokens per sequence; 0: min(tokens, 128)
  Backend backend = Backend::kCpu;
  DType dtype = DType::kF32;  // bf16 on GPUs only (the CPU backend computes bf16 in f32)
  int64_t seq() const { return seq_len > 0 ? seq_len : (tokens < 128 ? tokens : 128); }
  int64_t ffn() const { return 4 * d; }
  // e.g. "mlp/tp:2/tokens:512/d:512/sp/fwd_bwd"; on GPUs with "/cuda_shared/bf16" appended.
  std::string Name() const;
};

// Matmul FLOPs of one step of the whole (unsharded) layer: 2mnk per GEMM, backward twice the
// forward (grads of inputs and weights). Elementwise ops are not counted.
double LayerFlops(const LayerCase& c);

struct LayerTiming {
  // Per measured step: on the CPU rank 0's wall time, fenced by barriers; on GPUs the longest
  // rank's CUDA-event span of the step.
  std::vector<double> seconds;
  // GPUs: rank 0's host wall time of the step, from the barrier after draining the streams to
  // the barrier after draining them again (launch + run + the barrier itself). CPU: = seconds.
  std::vector<double> fenced_seconds;
  double cpu_seconds = 0;        // mean over ranks and steps of the rank thread's CPU time
  // Mean per step, rank 0, wall time inside collectives. On GPUs the in-process collectives
  // drain the rank's stream on entry, so this includes compute queued before each call.
  double comm_seconds = 0;
  double comm_cpu_seconds = 0;   // mean over ranks and steps, CPU time inside collectives
  CommStats comm;                // rank 0, one step (the last)
  double Mean() const;
  double Min() const;
};

// Two CUDA events on this thread's current stream of `device` (the rank's, inside a StreamScope),
// timing work on the GPU. Throws OpError without CUDA or on a CUDA error.
class GpuStepTimer {
 public:
  explicit GpuStepTimer(int device);
  ~GpuStepTimer();
  GpuStepTimer(const GpuStepTimer&) = delete;
  GpuStepTimer& operator=(const GpuStepTimer&) = delete;
  void Start();           // records the start event
  double StopSeconds();   // records the stop event, waits for it, returns the span in seconds

 private:
  int device_;
  void* start_ = nullptr;  // cudaEvent_t
  void* stop_ = nullptr;
};

// Mean seconds per call of fn on GPU 0 (on a stream of its own, bound for fn), timed by CUDA
// events around `reps` calls after `warmup` untimed ones. FailedPrecondition without a GPU;
// fn's OpError as Internal.
absl::StatusOr<double> TimeOnGpu(const std::function<void()>& fn, int warmup, int reps);

// InvalidArgument for a bad case; FailedPrecondition (naming the reason) for a GPU backend
// without a usable GPU, or kGpuPerRank with fewer GPUs than c.tp.
absl::StatusOr<LayerTiming> RunLayer(const LayerCase& c, int warmup, int measured);
// The same layer with tensor parallelism off, on the calling thread (c.tp and c.sp ignored), on
// the CPU or (GPU backends) GPU 0 on a stream of its own.
absl::StatusOr<LayerTiming> RunUnsharded(const LayerCase& c, int warmup, int measured);

}  // namespace shardmap::bench

#endif  // SHARDMAP_BENCH_TP_LAYERS_H_
