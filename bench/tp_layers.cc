#include "bench/tp_layers.h"

#include <time.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "autograd/value_and_grad.h"
#include "collectives/in_process.h"
#include "models/parallel/async_tp.h"
#include "models/parallel/layers.h"
#include "shardmap/context.h"
#include "shardmap/ops.h"
#include "shardmap/partition_spec.h"
#include "shardmap/sharding.h"
#include "tensor/cuda/runtime.h"
#include "tensor/error.h"
#include "tensor/ops/shape_ops.h"
#include "tensor/random.h"

#if SHARDMAP_HAS_CUDA
#include <cuda_runtime.h>
#endif

namespace shardmap::bench {
namespace {

double ThreadCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct Inputs {
  std::vector<Tensor> whole;
  std::vector<PartitionSpec> specs;
};

Tensor Init(std::vector<int64_t> shape, uint64_t seed, double mean = 0.0) {
  return RandomNormal(shape, seed, mean, 0.02, DType::kF32);
}

// The layer's inputs (activations first) and how each is split over tp.
Inputs MakeInputsUncached(const LayerCase& c) {
  const int64_t t = c.tokens, d = c.d, f = c.ffn();
  const PartitionSpec rows = c.sp ? P("tp") : P();
  switch (c.layer) {
    case Layer::kColumn:
      return {{Init({t, d}, 1), Init({d, f}, 2), Init({f}, 3)}, {rows, P(None, "tp"), P("tp")}};
    case Layer::kRow:
      return {{Init({t, f}, 1), Init({f, d}, 2), Init({d}, 3)}, {P(None, "tp"), P("tp", None), P()}};
    case Layer::kMlp:
    case Layer::kAsyncMlp:
      return {{Init({t, d}, 1), Init({d, f}, 2), Init({f}, 3), Init({f, d}, 4), Init({d}, 5)},
              {rows, P(None, "tp"), P("tp"), P("tp", None), P()}};
    case Layer::kAttention:
      return {{Init({t, d}, 1), Init({d, 3, d}, 2), Init({3, d}, 3), Init({d, d}, 4), Init({d}, 5)},
              {rows, P(None, None, "tp"), P(None, "tp"), P("tp", None), P()}};
    case Layer::kBlock:
      return {{Init({t, d}, 1), Init({d}, 2, 1.0), Init({d}, 3), Init({d, 3, d}, 4),
               Init({3, d}, 5), Init({d, d}, 6), Init({d}, 7), Init({d}, 8, 1.0), Init({d}, 9),
               Init({d, f}, 10), Init({f}, 11), Init({f, d}, 12), Init({d}, 13)},
              {rows, P(), P(), P(None, None, "tp"), P(None, "tp"), P("tp", None), P(), P(), P(),
               P(None, "tp"), P("tp"), P("tp", None), P()}};
  }
  OpFail("tp_layers: unknown layer");
}

// The same, with the tensors drawn once per (layer, tokens, d) and kept: drawing a block's
// parameters at d 2048 takes longer than running it on a GPU. SP changes only how the
// activation (the first input) is split. Called from one thread (the benchmark's).
Inputs MakeInputs(const LayerCase& c) {
  static auto* cache = new std::map<std::tuple<int, int64_t, int64_t>, Inputs>();
  const auto key = std::make_tuple(static_cast<int>(c.layer), c.tokens, c.d);
  auto it = cache->find(key);
  if (it == cache->end()) {
    LayerCase no_sp = c;
    no_sp.sp = false;
    it = cache->emplace(key, MakeInputsUncached(no_sp)).first;
  }
  Inputs in = it->second;  // tensors share their storage
  if (c.sp && c.layer != Layer::kRow) in.specs[0] = P("tp");
  return in;
}

// The input as a rank holds it: cast to c.dtype, on `device`.
Tensor Place(const Tensor& t, const LayerCase& c, Device device) {
  Tensor x = c.dtype == DType::kF32 ? t : Cast(t, c.dtype);
  return device.is_cuda() ? x.To(device) : x;
}

bool OnGpu(const LayerCase& c) { return c.backend != Backend::kCpu; }

// The stream of GPU 0 this benchmark's single-device work runs on (made once, kept).
cuda::StreamHandle BenchStream() {
  static cuda::StreamHandle stream = cuda::NewStream(0);
  return stream;
}

// The layer's output for inputs p (per-device code; tp.axis empty = unsharded).
Value Forward(const LayerCase& c, const std::vector<Value>& p, const TensorParallel& tp) {
  switch (c.layer) {
    case Layer::kColumn:
      return ColumnParallelLinear{p[1], p[2], tp}(p[0]);
    case Layer::kRow:
      return RowParallelLinear{p[1], p[2], tp}(p[0]);
    case Layer::kMlp:
      return Mlp{ColumnParallelLinear{p[1], p[2], tp}, RowParallelLinear{p[3], p[4], tp}}(p[0]);
    case Layer::kAttention:
      return CausalSelfAttention{p[1], p[2], RowParallelLinear{p[3], p[4], tp}, c.head_dim,
                                 c.seq(), tp}(p[0]);
    case Layer::kBlock:
      return Block{LayerNorm{p[1], p[2]},
                   CausalSelfAttention{p[3], p[4], RowParallelLinear{p[5], p[6], tp}, c.head_dim,
                                       c.seq(), tp},
                   LayerNorm{p[7], p[8]},
                   Mlp{ColumnParallelLinear{p[9], p[10], tp},
                       RowParallelLinear{p[11], p[12], tp}}}(p[0]);
    case Layer::kAsyncMlp:
      if (!tp.on()) {  // the unsharded reference: the plain MLP
        return Mlp{ColumnParallelLinear{p[1], p[2], tp}, RowParallelLinear{p[3], p[4], tp}}(p[0]);
      }
      return RingMlp{RingColumnParallelLinear{p[1], p[2], tp},
                     RingRowParallelLinear{p[3], p[4], tp}}(p[0]);
  }
  OpFail("tp_layers: unknown layer");
}

// One step: the forward, or value_and_grad of sum(y^2) (a share, P, where y is split over tp).
void Step(const LayerCase& c, const std::vector<Value>& p, const TensorParallel& tp) {
  if (!c.fwd_bwd) {
    (void)Forward(c, p, tp);
    return;
  }
  const bool split_out = tp.on() && (c.layer == Layer::kColumn || tp.sp);
  auto loss = [&](const std::vector<Value>& q) {
    Value y = Forward(c, q, tp);
    return split_out ? sum_partial(y * y, {}) : sum(y * y, {});
  };
  (void)value_and_grad(loss, p);
}

absl::Status CheckCase(const LayerCase& c) {
  if (c.tp < 1 || c.tokens < 1 || c.d < 1 || c.head_dim < 1) {
    return absl::InvalidArgumentError(absl::StrCat("tp_layers: ", c.Name(),
                                                   ": tp, tokens, d and head_dim must be >= 1"));
  }
  if (c.d % c.head_dim != 0 || c.tokens % c.seq() != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tp_layers: ", c.Name(), ": d must be a multiple of head_dim (", c.head_dim,
        ") and tokens a multiple of the sequence length (", c.seq(), ")"));
  }
  if (c.layer == Layer::kAsyncMlp && !c.sp) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tp_layers: ", c.Name(), ": async TP (collective matmul) is the sequence-parallel MLP; "
        "set sp"));
  }
  if (c.sp && c.tokens % c.tp != 0) {
    return absl::InvalidArgumentError(absl::StrCat("tp_layers: ", c.Name(),
                                                   ": sequence parallelism splits the tokens "
                                                   "over tp: tokens must be a multiple of tp"));
  }
  if (c.dtype != DType::kF32 && c.dtype != DType::kBF16) {
    return absl::InvalidArgumentError(absl::StrCat("tp_layers: ", c.Name(), ": dtype ",
                                                   DTypeName(c.dtype), " is not f32 or bf16"));
  }
  if (c.dtype != DType::kF32 && !OnGpu(c)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tp_layers: ", c.Name(), ": the CPU backend runs f32 only (bf16 computes in f32 there); "
        "use a GPU backend for bf16"));
  }
  return absl::OkStatus();
}

}  // namespace

const char* LayerName(Layer l) {
  switch (l) {
    case Layer::kColumn: return "column_parallel_linear";
    case Layer::kRow: return "row_parallel_linear";
    case Layer::kMlp: return "mlp";
    case Layer::kAttention: return "attention";
    case Layer::kBlock: return "block";
    case Layer::kAsyncMlp: return "async_tp_mlp";
  }
  return "?";
}

const char* BackendName(Backend b) {
  switch (b) {
    case Backend::kCpu: return "cpu";
    case Backend::kSharedGpu: return "cuda_shared";
    case Backend::kGpuPerRank: return "cuda_per_gpu";
  }
  return "?";
}

std::string LayerCase::Name() const {
  std::string name = absl::StrCat(LayerName(layer), "/tp:", tp, "/tokens:", tokens, "/d:", d,
                                  sp ? "/sp" : "", fwd_bwd ? "/fwd_bwd" : "/fwd");
  if (backend != Backend::kCpu) absl::StrAppend(&name, "/", BackendName(backend), "/", DTypeName(dtype));
  return name;
}

double LayerFlops(const LayerCase& c) {
  const double t = c.tokens, d = c.d, f = c.ffn(), s = c.seq();
  const double col = 2 * t * d * f, row = 2 * t * f * d;
  const double attn = 2 * t * d * 3 * d + 2 * t * s * d * 2 + 2 * t * d * d;
  double fwd = 0;
  switch (c.layer) {
    case Layer::kColumn: fwd = col; break;
    case Layer::kRow: fwd = row; break;
    case Layer::kMlp:
    case Layer::kAsyncMlp: fwd = col + row; break;
    case Layer::kAttention: fwd = attn; break;
    case Layer::kBlock: fwd = attn + col + row; break;
  }
  return c.fwd_bwd ? 3 * fwd : fwd;
}

double LayerTiming::Mean() const {
  double s = 0;
  for (double x : seconds) s += x;
  return seconds.empty() ? 0 : s / seconds.size();
}

double LayerTiming::Min() const {
  return seconds.empty() ? 0 : *std::min_element(seconds.begin(), seconds.end());
}

#if SHARDMAP_HAS_CUDA
namespace {
void CudaCheck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) OpFail("tp_layers: ", what, ": ", cudaGetErrorString(e));
}
cudaStream_t StreamOf(int device) { return static_cast<cudaStream_t>(cuda::CurrentStream(device)); }
}  // namespace

GpuStepTimer::GpuStepTimer(int device) : device_(device) {
  cuda::DeviceGuard guard(device_);
  cudaEvent_t a = nullptr, b = nullptr;
  CudaCheck(cudaEventCreate(&a), "cudaEventCreate");
  start_ = a;
  CudaCheck(cudaEventCreate(&b), "cudaEventCreate");
  stop_ = b;
}
GpuStepTimer::~GpuStepTimer() {
  if (start_ != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(start_));
  if (stop_ != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(stop_));
}
void GpuStepTimer::Start() {
  CudaCheck(cudaEventRecord(static_cast<cudaEvent_t>(start_), StreamOf(device_)), "cudaEventRecord");
}
double GpuStepTimer::StopSeconds() {
  cudaEvent_t stop = static_cast<cudaEvent_t>(stop_);
  CudaCheck(cudaEventRecord(stop, StreamOf(device_)), "cudaEventRecord");
  CudaCheck(cudaEventSynchronize(stop), "cudaEventSynchronize");
  float ms = 0;
  CudaCheck(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start_), stop),
            "cudaEventElapsedTime");
  return 1e-3 * ms;
}
#else
GpuStepTimer::GpuStepTimer(int device) : device_(device) {
  OpFail("tp_layers: GPU timing needs a CUDA build: ", cuda::UnavailableReason());
}
GpuStepTimer::~GpuStepTimer() = default;
void GpuStepTimer::Start() {}
double GpuStepTimer::StopSeconds() { return 0; }
#endif

absl::StatusOr<double> TimeOnGpu(const std::function<void()>& fn, int warmup, int reps) {
  if (!cuda::Available()) {
    return absl::FailedPreconditionError(
        absl::StrCat("tp_layers: no usable GPU: ", cuda::UnavailableReason()));
  }
  if (reps < 1) return absl::InvalidArgumentError("tp_layers: TimeOnGpu needs reps >= 1");
  try {
    cuda::StreamScope scope(0, BenchStream());
    for (int i = 0; i < warmup; ++i) fn();
    cuda::Synchronize(0);
    GpuStepTimer timer(0);
    timer.Start();
    for (int i = 0; i < reps; ++i) fn();
    return timer.StopSeconds() / reps;
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("tp_layers: ", e.what()));
  }
}

absl::StatusOr<LayerTiming> RunLayer(const LayerCase& c, int warmup, int measured) {
  if (absl::Status s = CheckCase(c); !s.ok()) return s;
  if (measured < 1) return absl::InvalidArgumentError("tp_layers: measured steps must be >= 1");
  absl::StatusOr<Mesh> mesh = Mesh::Create({{"tp", c.tp}});
  if (!mesh.ok()) return mesh.status();
  collectives::InProcessOptions comm_options;
  if (OnGpu(c)) {
    SpmdOptions o;
    o.placement = c.backend == Backend::kSharedGpu ? DevicePlacement::SharedGpu()
                                                   : DevicePlacement::GpuPerRank();
    absl::StatusOr<std::vector<collectives::MemorySpace>> spaces = RankMemorySpaces(o, c.tp);
    if (!spaces.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("tp_layers: ", c.Name(), ": ", spaces.status().message()));
    }
    comm_options.memory_space = [spaces = *spaces](int r) { return spaces[r]; };
  }
  const Inputs in = MakeInputs(c);
  std::vector<CommStats> stats(c.tp);
  std::vector<double> cpu(c.tp, 0), comm_cpu(c.tp, 0);
  // gpu[r][i]: rank r's event span of measured step i.
  std::vector<std::vector<double>> gpu(c.tp, std::vector<double>(measured, 0.0));
  LayerTiming out;
  double comm_wall = 0;
  absl::Status s = collectives::RunInProcess(c.tp, [&](collectives::Communicator& comm) {
    const int r = comm.rank();
    TimedCommunicator timed(&comm, &stats[r]);
    return RunOnCommunicator(timed, *mesh, [&](RankContext& ctx) {
      const Device device = ctx.device();
      std::vector<Value> params;
      for (size_t k = 0; k < in.whole.size(); ++k) {
        Value v(Place(ShardOf(in.whole[k], *mesh, in.specs[k], r), c, device),
                in.specs[k].InputType(*mesh));
        v.type.set_mesh_id(mesh->id());
        params.push_back(v);
      }
      std::unique_ptr<GpuStepTimer> events;
      if (device.is_cuda()) events = std::make_unique<GpuStepTimer>(device.index);
      const TensorParallel par{"tp", c.sp};
      for (int step = 0; step < warmup + measured; ++step) {
        if (device.is_cuda()) cuda::Synchronize(device.index);
        if (!comm.Barrier().ok()) OpFail("tp_layers: barrier failed");
        stats[r].Clear();
        const double t0 = Now(), cpu0 = ThreadCpuSeconds();
        if (events) events->Start();
        Step(c, params, par);
        const double span = events ? events->StopSeconds() : 0.0;
        const double cpu1 = ThreadCpuSeconds();
        if (!comm.Barrier().ok()) OpFail("tp_layers: barrier failed");
        const double t1 = Now();
        if (step < warmup) continue;
        gpu[r][step - warmup] = span;
        cpu[r] += cpu1 - cpu0;
        comm_cpu[r] += stats[r].Total().cpu_seconds;
        if (r == 0) {
          out.fenced_seconds.push_back(t1 - t0);
          comm_wall += stats[0].Total().seconds;
        }
      }
      (void)ctx;
    });
  }, comm_options);
  if (!s.ok()) return s;
  for (int r = 0; r < c.tp; ++r) {
    out.cpu_seconds += cpu[r] / (c.tp * measured);
    out.comm_cpu_seconds += comm_cpu[r] / (c.tp * measured);
  }
  if (OnGpu(c)) {
    for (int i = 0; i < measured; ++i) {
      double longest = 0;
      for (int r = 0; r < c.tp; ++r) longest = std::max(longest, gpu[r][i]);
      out.seconds.push_back(longest);
    }
  } else {
    out.seconds = out.fenced_seconds;
  }
  out.comm_seconds = comm_wall / measured;
  out.comm = stats[0];
  return out;
}

absl::StatusOr<LayerTiming> RunUnsharded(const LayerCase& c, int warmup, int measured) {
  if (absl::Status s = CheckCase(c); !s.ok()) return s;
  if (measured < 1) return absl::InvalidArgumentError("tp_layers: measured steps must be >= 1");
  LayerCase one = c;
  one.sp = false;
  one.tp = 1;
  if (OnGpu(c) && !cuda::Available()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "tp_layers: ", c.Name(), ": needs a GPU but none is usable: ", cuda::UnavailableReason(),
        "; run on the CPU backend"));
  }
  const Inputs in = MakeInputs(one);
  LayerTiming out;
  try {
    // GPU: GPU 0 on a stream of this benchmark's own (made once), as a rank would run.
    std::unique_ptr<cuda::StreamScope> scope;
    std::unique_ptr<GpuStepTimer> events;
    const Device device = OnGpu(c) ? Device::Cuda(0) : Device::Cpu();
    if (device.is_cuda()) {
      scope = std::make_unique<cuda::StreamScope>(0, BenchStream());
      events = std::make_unique<GpuStepTimer>(0);
    }
    SingleRankContext ctx{Mesh()};
    std::vector<Value> params;
    for (const Tensor& t : in.whole) params.push_back(Value::Replicated(Place(t, c, device)));
    for (int step = 0; step < warmup + measured; ++step) {
      if (device.is_cuda()) cuda::Synchronize(0);
      const double t0 = Now(), cpu0 = ThreadCpuSeconds();
      if (events) events->Start();
      Step(one, params, TensorParallel{});
      const double span = events ? events->StopSeconds() : 0.0;
      const double cpu1 = ThreadCpuSeconds(), t1 = Now();
      if (step < warmup) continue;
      out.fenced_seconds.push_back(t1 - t0);
      out.seconds.push_back(events ? span : t1 - t0);
      out.cpu_seconds += (cpu1 - cpu0) / measured;
    }
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("tp_layers: unsharded ", c.Name(), ": ", e.what()));
  }
  return out;
}

}  // namespace shardmap::bench
