// Tensor-parallel GPT layers (models/parallel/layers.h) on TP = 1, 2, 4, 8 in-process ranks:
// ColumnParallelLinear (d -> 4d), RowParallelLinear (4d -> d), the Megatron MLP, causal attention
// (heads of 64), a whole pre-LN block, and async TP (the SP MLP as collective matmuls,
// models/parallel/async_tp.h); forward and forward + backward; with and without sequence parallelism.
//
//   bazel run -c opt --config=opt //bench:tp_bench                       # CPU, tokens 512, d 512
//   bazel run -c opt --config=opt //bench:tp_bench -- --d=1024 --steps=5
//       --benchmark_filter=mlp/.*fwd_bwd   (one line)
//   tp_bench --device=cuda --tokens=4096 --d=2048 --profile_out=gpu_profile.txt   # on a GPU
//   tp_bench --device=cuda --placement=per_gpu        # rank r on GPU r (TP up to the GPU count)
//
// --device=cpu: simulated devices (one thread per rank, BLAS single-threaded, f32). Each row is
// one RunInProcess running `--warmup` + `--steps` steps, fenced by barriers, timed on rank 0.
// The ranks share the machine's cores: with more ranks than idle cores, compute cannot speed up
// beyond the core count; read the rows with the core count and load printed in the context.
//
// --device=cuda: --placement=shared puts the t ranks on GPU 0 as virtual ranks (a stream each,
// in-process collectives on device memory): this measures how the layer's sharded shapes run on
// the card and what the sharding itself costs (the collectives, smaller GEMMs), not a speedup.
// --placement=per_gpu puts rank r on GPU r (the real thing; in-process peer copies, not NCCL).
// Every step starts with the streams drained and the ranks at a barrier; the step's time is the
// longest rank's CUDA-event span (bench/tp_layers.h). --dtype=f32,bf16 (default both on CUDA).
// Also on CUDA, for the TP model (bench/tp_model_gpu.h):
//   gemm/...        every per-rank GEMM shape of the layers at each TP degree, alone on GPU 0
//                   (CUDA events, mean of 20 calls): TFLOP/s;
//   collective/...  all_reduce / all_gather / reduce_scatter of one [tokens, d] activation over
//                   t virtual ranks on GPU 0 (the layers' collectives), longest rank's span;
//   link/...        (per_gpu) all_reduce / all_gather / reduce_scatter over t GPUs at 3 sizes.
// --profile_out=FILE writes them and the layer rows as the profile tp_model_gpu_report reads,
// a line as each row finishes.
//
// Counters:
//   FLOP/s        matmul FLOPs of the whole layer per second of step time (all ranks together)
//   comm_bytes    bytes rank 0 passed to collectives per step (bench/timed_communicator.h)
//   comm_ms       rank 0's wall time inside collectives per step (waiting for peers included;
//                 on GPUs the collectives also drain the rank's stream on entry)
//   compute_ms    step time minus comm_ms (CPU only)
//   fenced_ms     (GPU) rank 0's host time of the step between barriers, streams drained
//   cpu_ms        mean rank thread CPU time per step (outside and inside collectives)
//   vs_unsharded  step time over the same layer's unsharded step on one device in this run
//                 (the `.../unsharded/...` rows); < 1 means TP made the step faster
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/bench_help.h"
#include "bench/tp_layers.h"
#include "bench/tp_model.h"
#include "bench/tp_model_gpu.h"
#include "benchmark/benchmark.h"
#include "collectives/in_process.h"
#include "shardmap/context.h"
#include "tensor/cuda/runtime.h"
#include "tensor/error.h"
#include "tensor/ops/matmul.h"
#include "tensor/ops/shape_ops.h"
#include "tensor/random.h"

#if SHARDMAP_HAS_CUDA
#include <cuda_runtime.h>
#endif

namespace shardmap::bench {
namespace {

struct Flags {
  int64_t tokens = 512, d = 512;
  int steps = 3, warmup = 1;
  Backend backend = Backend::kCpu;
  std::vector<DType> dtypes = {DType::kF32};
  std::vector<int> tps = {1, 2, 4, 8};
};
Flags flags;

std::ofstream* profile = nullptr;  // --profile_out
void ProfileLine(const std::string& line) {
  if (profile == nullptr) return;
  *profile << line << "\n";
  profile->flush();
}

using Key = std::tuple<int, int, bool, bool, int>;  // layer, tp (0 = unsharded), sp, fwd_bwd, dtype

const absl::StatusOr<LayerTiming>& Cached(const LayerCase& c, bool unsharded) {
  static auto* cache = new std::map<Key, absl::StatusOr<LayerTiming>>();
  const Key key{static_cast<int>(c.layer), unsharded ? 0 : c.tp, unsharded ? false : c.sp,
                c.fwd_bwd, static_cast<int>(c.dtype)};
  auto it = cache->find(key);
  if (it == cache->end()) {
    it = cache
             ->emplace(key, unsharded ? RunUnsharded(c, flags.warmup, flags.steps)
                                      : RunLayer(c, flags.warmup, flags.steps))
             .first;
  }
  return it->second;
}

void SetTimes(benchmark::State& state, const std::vector<double>& seconds) {
  size_t i = 0;
  for (auto _ : state) state.SetIterationTime(seconds[i++ % seconds.size()]);
}

double MeanOf(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / v.size();
}

void BM_Unsharded(benchmark::State& state, LayerCase c) {
  const absl::StatusOr<LayerTiming>& t = Cached(c, true);
  if (!t.ok()) {
    state.SkipWithError(std::string(t.status().message()).c_str());
    return;
  }
  SetTimes(state, t->seconds);
  state.counters["FLOP/s"] = LayerFlops(c) / t->Mean();
  state.counters["cpu_ms"] = 1e3 * t->cpu_seconds;
  if (c.backend != Backend::kCpu) {
    state.counters["fenced_ms"] = 1e3 * MeanOf(t->fenced_seconds);
    ProfileLine(LayerLine(absl::StrCat(LayerName(c.layer), "/unsharded/tokens:", c.tokens, "/d:",
                                       c.d, c.fwd_bwd ? "/fwd_bwd/" : "/fwd/",
                                       BackendName(c.backend), "/", DTypeName(c.dtype)),
                          t->Mean(), MeanOf(t->fenced_seconds)));
  }
}

void BM_Layer(benchmark::State& state, LayerCase c) {
  const absl::StatusOr<LayerTiming>& t = Cached(c, false);
  if (!t.ok()) {
    state.SkipWithError(std::string(t.status().message()).c_str());
    return;
  }
  SetTimes(state, t->seconds);
  const double mean = t->Mean();
  state.counters["FLOP/s"] = LayerFlops(c) / mean;
  state.counters["comm_bytes"] = t->comm.Total().bytes;
  state.counters["comm_ms"] = 1e3 * t->comm_seconds;
  state.counters["cpu_ms"] = 1e3 * t->cpu_seconds;
  if (c.backend == Backend::kCpu) {
    state.counters["compute_ms"] = 1e3 * (mean - t->comm_seconds);
  } else {
    state.counters["fenced_ms"] = 1e3 * MeanOf(t->fenced_seconds);
    ProfileLine(LayerLine(c.Name(), mean, MeanOf(t->fenced_seconds)));
  }
  const absl::StatusOr<LayerTiming>& one = Cached(c, true);
  if (one.ok()) state.counters["vs_unsharded"] = mean / one->Mean();
}

// ---- GPU-only rows: the TP model's inputs ---------------------------------------------------

constexpr int kGemmWarmup = 3, kGemmReps = 20;

void BM_Gemm(benchmark::State& state, DType dtype, GemmShape g) {
  // Operands drawn on the GPU (random values: zeros would draw less power and clock higher).
  absl::StatusOr<double> seconds = absl::InternalError("not run");
  try {
    const Device gpu = Device::Cuda(0);
    auto operand = [&](std::vector<int64_t> shape, uint64_t seed) {
      Tensor x = RandomNormal(shape, seed, 0.0, 1.0, DType::kF32, gpu);
      return dtype == DType::kF32 ? x : Cast(x, dtype);
    };
    Tensor a = g.batch == 1 ? operand({g.m, g.k}, 1) : operand({g.batch, g.m, g.k}, 1);
    Tensor b = g.batch == 1 ? operand({g.k, g.n}, 2) : operand({g.batch, g.k, g.n}, 2);
    cuda::Synchronize(0);
    seconds = TimeOnGpu([&] { (void)Matmul(a, b); }, kGemmWarmup, kGemmReps);
  } catch (const std::exception& e) {
    seconds = absl::InternalError(e.what());
  }
  if (!seconds.ok()) {
    state.SkipWithError(std::string(seconds.status().message()).c_str());
    return;
  }
  for (auto _ : state) state.SetIterationTime(*seconds);
  state.counters["TFLOP/s"] = g.Flops() / *seconds / 1e12;
  ProfileLine(GemmLine(dtype, g, *seconds));
}

// One collective of `full_bytes` over t in-process ranks on `backend`'s GPUs; the longest rank's
// CUDA-event span, mean of `reps` calls after a warm-up. Each call starts with the streams
// drained and the ranks at a barrier.
absl::StatusOr<double> TimeGpuCollective(Backend backend, CollectiveKind kind, DType dtype, int t,
                                         double full_bytes, int reps) {
  SpmdOptions o;
  o.placement = backend == Backend::kSharedGpu ? DevicePlacement::SharedGpu()
                                               : DevicePlacement::GpuPerRank();
  absl::StatusOr<std::vector<collectives::MemorySpace>> spaces = RankMemorySpaces(o, t);
  if (!spaces.ok()) return spaces.status();
  collectives::InProcessOptions io;
  io.memory_space = [s = *spaces](int r) { return s[r]; };
  const collectives::DataType dt =
      dtype == DType::kF32 ? collectives::DataType::kF32 : collectives::DataType::kBF16;
  const size_t elems = static_cast<size_t>(full_bytes) / DTypeSize(dtype) / t * t;
  std::vector<std::vector<double>> span(t, std::vector<double>(reps + 1, 0.0));
  absl::Status s = collectives::RunInProcess(
      t,
      [&](collectives::Communicator& comm) -> absl::Status {
        const collectives::MemorySpace m = comm.memory_space();
        try {
          cuda::StreamScope scope(m.device_index, m.stream);
          const Device dev = Device::Cuda(m.device_index);
          const int64_t n = static_cast<int64_t>(elems);
          Tensor in = Tensor::Full({n}, 1.0, dtype, dev), out = Tensor::Zeros({n}, dtype, dev);
          GpuStepTimer timer(m.device_index);
          for (int i = 0; i < reps + 1; ++i) {
            cuda::Synchronize(m.device_index);
            if (absl::Status b = comm.Barrier(); !b.ok()) return b;
            timer.Start();
            absl::Status st;
            switch (kind) {
              case CollectiveKind::kAllReduce:
                st = comm.AllReduce(in.raw_data(), out.raw_data(), elems, dt,
                                    collectives::ReduceOp::kSum);
                break;
              case CollectiveKind::kAllGather:
                st = comm.AllGather(in.raw_data(), out.raw_data(), elems / t, dt);
                break;
              case CollectiveKind::kReduceScatter:
                st = comm.ReduceScatter(in.raw_data(), out.raw_data(), elems / t, dt,
                                        collectives::ReduceOp::kSum);
                break;
            }
            if (!st.ok()) return st;
            span[comm.rank()][i] = timer.StopSeconds();
          }
        } catch (const std::exception& e) {
          return absl::InternalError(e.what());
        }
        return absl::OkStatus();
      },
      io);
  if (!s.ok()) return s;
  double total = 0;
  for (int i = 1; i <= reps; ++i) {  // the first call is a warm-up
    double m = 0;
    for (int r = 0; r < t; ++r) m = std::max(m, span[r][i]);
    total += m;
  }
  return total / reps;
}

void BM_Collective(benchmark::State& state, Backend backend, CollectiveKind kind, DType dtype,
                   int t, double full_bytes) {
  absl::StatusOr<double> seconds = TimeGpuCollective(backend, kind, dtype, t, full_bytes, 10);
  if (!seconds.ok()) {
    state.SkipWithError(std::string(seconds.status().message()).c_str());
    return;
  }
  for (auto _ : state) state.SetIterationTime(*seconds);
  // nccl-tests' bus bandwidth: all_reduce 2(t-1)/t S / time, the others (t-1)/t S / time.
  const double factor = (kind == CollectiveKind::kAllReduce ? 2.0 : 1.0) * (t - 1) / t;
  state.counters["busbw_GB/s"] = factor * full_bytes / *seconds / 1e9;
  if (backend == Backend::kSharedGpu) {
    ProfileLine(CollectiveLine(kind, dtype, t, full_bytes, *seconds));
  } else {
    ProfileLine(LinkLine(kind, t, full_bytes, *seconds));
  }
}

constexpr Layer kLayers[] = {Layer::kColumn, Layer::kRow,   Layer::kMlp,
                             Layer::kAttention, Layer::kBlock, Layer::kAsyncMlp};

void RegisterLayers() {
  for (DType dtype : flags.dtypes) {
    for (Layer layer : kLayers) {
      for (bool fwd_bwd : {false, true}) {
        LayerCase base{layer, 1, false, fwd_bwd, flags.tokens, flags.d};
        base.backend = flags.backend;
        base.dtype = dtype;
        std::string one = std::string(LayerName(layer)) + "/unsharded/tokens:" +
                          std::to_string(flags.tokens) + "/d:" + std::to_string(flags.d) +
                          (fwd_bwd ? "/fwd_bwd" : "/fwd");
        if (flags.backend != Backend::kCpu) {
          absl::StrAppend(&one, "/", BackendName(flags.backend), "/", DTypeName(dtype));
        }
        if (layer != Layer::kAsyncMlp) {
          benchmark::RegisterBenchmark(one.c_str(), BM_Unsharded, base)
              ->UseManualTime()
              ->Iterations(flags.steps)
              ->Unit(benchmark::kMillisecond);
        }
        for (bool sp : {false, true}) {
          if (layer == Layer::kAsyncMlp && !sp) continue;  // async TP is the SP MLP
          for (int tp : flags.tps) {
            LayerCase c = base;
            c.tp = tp;
            c.sp = sp;
            benchmark::RegisterBenchmark(c.Name().c_str(), BM_Layer, c)
                ->UseManualTime()
                ->Iterations(flags.steps)
                ->Unit(benchmark::kMillisecond);
          }
        }
      }
    }
  }
}

void RegisterGpuProfile() {
  for (DType dtype : flags.dtypes) {
    std::set<GemmShape> shapes;
    for (Layer layer : kLayers) {
      for (int tp : flags.tps) {
        for (bool fwd_bwd : {false, true}) {
          LayerCase c{layer, tp, false, fwd_bwd, flags.tokens, flags.d};
          for (const GemmShape& g : RankGemms(c)) {
            // Fewer heads than ranks gives empty batches: that layer cannot run at this t.
            if (g.batch >= 1 && g.m >= 1 && g.k >= 1 && g.n >= 1) shapes.insert(g);
          }
        }
      }
    }
    for (const GemmShape& g : shapes) {
      const std::string name = absl::StrCat("gemm/dtype:", DTypeName(dtype), "/batch:", g.batch,
                                            "/m:", g.m, "/k:", g.k, "/n:", g.n);
      benchmark::RegisterBenchmark(name.c_str(), BM_Gemm, dtype, g)
          ->UseManualTime()
          ->Iterations(1)
          ->Unit(benchmark::kMicrosecond);
    }
  }
  const CollectiveKind kinds[] = {CollectiveKind::kAllReduce, CollectiveKind::kAllGather,
                                  CollectiveKind::kReduceScatter};
  for (DType dtype : flags.dtypes) {
    const double act = static_cast<double>(flags.tokens) * flags.d * DTypeSize(dtype);
    for (CollectiveKind kind : kinds) {
      for (int t : {1, 2, 4, 8}) {
        const std::string name =
            absl::StrCat("collective/", CollectiveName(kind), "/cuda_shared/dtype:",
                         DTypeName(dtype), "/t:", t, "/bytes:", static_cast<int64_t>(act));
        benchmark::RegisterBenchmark(name.c_str(), BM_Collective, Backend::kSharedGpu, kind,
                                     dtype, t, act)
            ->UseManualTime()
            ->Iterations(1)
            ->Unit(benchmark::kMicrosecond);
      }
    }
  }
  if (flags.backend != Backend::kGpuPerRank) return;
  const double act = static_cast<double>(flags.tokens) * flags.d * 4;
  for (CollectiveKind kind : kinds) {
    for (int t : flags.tps) {
      if (t < 2) continue;
      for (double bytes : {act / 4, act, 4 * act}) {
        const std::string name = absl::StrCat("link/", CollectiveName(kind), "/cuda_per_gpu/t:",
                                              t, "/bytes:", static_cast<int64_t>(bytes));
        benchmark::RegisterBenchmark(name.c_str(), BM_Collective, Backend::kGpuPerRank, kind,
                                     DType::kF32, t, bytes)
            ->UseManualTime()
            ->Iterations(1)
            ->Unit(benchmark::kMicrosecond);
      }
    }
  }
}

// "NVIDIA H100 80GB HBM3 (sm_90, 132 SMs, 79.1 GiB)" for GPU 0.
std::string GpuName() {
#if SHARDMAP_HAS_CUDA
  cudaDeviceProp p;
  if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) return "GPU 0 (cudaGetDeviceProperties failed)";
  char buf[512];
  std::snprintf(buf, sizeof(buf), "%s (sm_%d%d, %d SMs, %.1f GiB)", p.name, p.major, p.minor,
                p.multiProcessorCount, p.totalGlobalMem / 1073741824.0);
  return buf;
#else
  return "none";
#endif
}

std::string LoadAverage() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return a + " " + b + " " + c;
}

}  // namespace
}  // namespace shardmap::bench

ABSL_FLAG(int64_t, tokens, 512, "tokens per layer step (global, before the tp split)");
ABSL_FLAG(int64_t, d, 512, "hidden size (ffn 4d; heads of 64)");
ABSL_FLAG(int32_t, steps, 3, "measured steps per row");
ABSL_FLAG(int32_t, warmup, 1, "warm-up steps per row");
ABSL_FLAG(std::string, device, "cpu", "cpu (simulated devices) or cuda");
ABSL_FLAG(std::string, placement, "shared",
          "with --device=cuda: shared (the t ranks as virtual ranks on GPU 0, a stream each) or "
          "per_gpu (rank r on GPU r)");
ABSL_FLAG(std::string, dtype, "",
          "comma-separated f32, bf16 (default: f32 on the CPU, f32,bf16 on CUDA)");
ABSL_FLAG(std::string, profile_out, "",
          "with --device=cuda: write the GEMM, collective and layer times here (the profile "
          "tp_model_gpu_report reads)");

namespace {
int Usage(const std::string& what) {
  std::fprintf(stderr, "tp_bench: %s\n", what.c_str());
  return 2;
}
}  // namespace

int main(int argc, char** argv) {
  using namespace shardmap;
  using namespace shardmap::bench;
  absl::SetProgramUsageMessage(
      "tp_bench: tensor-parallel layers and the GPT block, ours against the one-device "
      "computation, on CPU ranks or GPUs (--device=cuda); the rows are Google Benchmark's");
  // Takes the --benchmark_* flags out of argv; --help lists tp_bench's flags, then these.
  InitializeBenchmark(&argc, argv, "tp_bench");
  absl::ParseCommandLine(argc, argv);
  Flags& f = flags;
  f.tokens = absl::GetFlag(FLAGS_tokens);
  f.d = absl::GetFlag(FLAGS_d);
  f.steps = absl::GetFlag(FLAGS_steps);
  f.warmup = absl::GetFlag(FLAGS_warmup);
  if (f.tokens < 1 || f.d < 64 || f.d % 64 != 0 || f.steps < 1 || f.warmup < 0) {
    return Usage(absl::StrCat("--tokens=", f.tokens, " --d=", f.d, " --steps=", f.steps,
                              " --warmup=", f.warmup, ": need tokens >= 1, d a positive multiple "
                              "of 64 (heads of 64), steps >= 1, warmup >= 0"));
  }
  const std::string device = absl::GetFlag(FLAGS_device),
                    placement = absl::GetFlag(FLAGS_placement),
                    dtypes = absl::GetFlag(FLAGS_dtype),
                    profile_out = absl::GetFlag(FLAGS_profile_out);
  if (device != "cpu" && device != "cuda") {
    return Usage("--device=" + device + ": expected cpu or cuda");
  }
  if (placement != "shared" && placement != "per_gpu") {
    return Usage("--placement=" + placement + ": expected shared or per_gpu");
  }
  const bool cuda_run = device == "cuda";
  if (!cuda_run && placement != "shared") {
    return Usage("--placement=" + placement + " needs --device=cuda");
  }
  if (!cuda_run && !profile_out.empty()) {
    return Usage("--profile_out needs --device=cuda (the profile holds GPU times)");
  }
  f.dtypes.clear();
  for (absl::string_view s : absl::StrSplit(dtypes.empty() ? (cuda_run ? "f32,bf16" : "f32")
                                                            : dtypes.c_str(),
                                            ',')) {
    if (s == "f32") {
      f.dtypes.push_back(DType::kF32);
    } else if (s == "bf16" && cuda_run) {
      f.dtypes.push_back(DType::kBF16);
    } else {
      return Usage(absl::StrCat("--dtype=", dtypes, ": expected a comma-separated list of f32",
                                cuda_run ? ", bf16" : " (bf16 needs --device=cuda)"));
    }
  }
  if (cuda_run) {
    if (!cuda::Available()) {
      return Usage("--device=cuda needs a GPU but none is usable: " + cuda::UnavailableReason() +
                   ". Run with --device=cpu (the default) for simulated devices, or on a "
                   "machine with a GPU");
    }
    f.backend = placement == "shared" ? Backend::kSharedGpu : Backend::kGpuPerRank;
    if (f.backend == Backend::kGpuPerRank) {
      const int gpus = cuda::DeviceCount();
      if (gpus < 2) {
        return Usage(absl::StrCat("--placement=per_gpu needs at least 2 GPUs; ", gpus,
                                  " is visible. Use --placement=shared (virtual ranks on one "
                                  "GPU, a stream each)"));
      }
      f.tps.clear();
      for (int t : {1, 2, 4, 8}) {
        if (t <= gpus) f.tps.push_back(t);
      }
    }
  }
  std::unique_ptr<std::ofstream> profile_file;
  if (!profile_out.empty()) {
    profile_file = std::make_unique<std::ofstream>(profile_out);
    if (!*profile_file) return Usage("--profile_out=" + profile_out + ": cannot write it");
    profile = profile_file.get();
    ProfileLine("# tp_bench GPU profile (bench/tp_model_gpu.h), tokens " +
                std::to_string(f.tokens) + ", d " + std::to_string(f.d));
  }
  benchmark::AddCustomContext("hardware_threads",
                              std::to_string(std::thread::hardware_concurrency()));
  benchmark::AddCustomContext("loadavg_at_start", LoadAverage());
  if (cuda_run) {
    benchmark::AddCustomContext(
        "devices", absl::StrCat(f.backend == Backend::kSharedGpu
                                    ? "virtual ranks sharing GPU 0, a stream each"
                                    : "rank r on GPU r",
                                " (", cuda::DeviceCount(), " GPU(s) visible)"));
    benchmark::AddCustomContext("gpu0", GpuName());
    ProfileLine("device " + GpuName());
  } else {
    benchmark::AddCustomContext("devices", "simulated CPU (in-process ranks, f32)");
  }
  // The model's inputs first: short rows, so a run cut short by a time limit still has them.
  if (cuda_run) RegisterGpuProfile();
  RegisterLayers();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
