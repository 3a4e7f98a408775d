// An MLP training step on one GPU, eager vs replayed from a CUDA graph (tensor/cuda/graph.h).
// The step: y = gelu(x w1 + b1) w2 + b2, MSE loss, hand-written backward, in-place SGD update of
// the four weights (about 25 kernels). Registered into the binary that links this library
// (//bench:cuda_bench); without a GPU every case skips with the reason. Names and filters:
//   ./cuda_bench --benchmark_filter='^mlp_step/mode:graph/dtype:bf16/'
//   ./cuda_bench --benchmark_filter='^mlp_step/.*/batch:64/'    # the launch-bound shape
//
// Reported per step: real_time (manual: CUDA events around the step on its stream, so GPU idle
// time waiting for the host counts), host_us (host time to enqueue the step: op dispatch,
// allocation and launches for eager, one cudaGraphLaunch for the graph) and kernels (graph
// nodes). Small shapes are launch/host bound, where the graph wins; large ones are GEMM bound.
#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "tensor/cuda/graph.h"
#include "tensor/cuda/runtime.h"
#include "tensor/error.h"
#include "tensor/ops/elementwise.h"
#include "tensor/ops/matmul.h"
#include "tensor/ops/reduce.h"
#include "tensor/random.h"
#include "tensor/tensor.h"

#if SHARDMAP_HAS_CUDA
#include <cuda_runtime.h>
#endif

namespace shardmap {
namespace {

struct MlpState {
  Tensor x, target, w1, b1, w2, b2, loss;
};

[[maybe_unused]] MlpState MakeState(int64_t batch, int64_t d, int64_t h, DType dtype, Device dev) {
  auto rnd = [&](std::initializer_list<int64_t> shape, uint64_t seed, double std) {
    return RandomNormal(shape, seed, 0.0, std, dtype).To(dev);
  };
  MlpState m;
  m.x = rnd({batch, d}, 1, 1.0);
  m.target = rnd({batch, d}, 2, 1.0);
  m.w1 = rnd({d, h}, 3, 1.0 / std::sqrt(static_cast<double>(d)));
  m.b1 = rnd({h}, 4, 0.02);
  m.w2 = rnd({h, d}, 5, 1.0 / std::sqrt(static_cast<double>(h)));
  m.b2 = rnd({d}, 6, 0.02);
  return m;
}

[[maybe_unused]] void Step(MlpState& m, double lr) {
  const double n = static_cast<double>(m.target.numel());
  Tensor hid = Add(Matmul(m.x, m.w1), m.b1);
  Tensor a = Gelu(hid);
  Tensor y = Add(Matmul(a, m.w2), m.b2);
  Tensor diff = Sub(y, m.target);
  m.loss = MulScalar(Sum(Mul(diff, diff), {}), 1.0 / n);
  Tensor dy = MulScalar(diff, 2.0 / n);
  Tensor dh = GeluGrad(hid, Matmul(dy, m.w2, false, true));
  AddInPlace(m.w1, MulScalar(Matmul(m.x, dh, true, false), -lr));
  AddInPlace(m.b1, MulScalar(Sum(dh, {0}), -lr));
  AddInPlace(m.w2, MulScalar(Matmul(a, dy, true, false), -lr));
  AddInPlace(m.b2, MulScalar(Sum(dy, {0}), -lr));
}

#if SHARDMAP_HAS_CUDA

// CUDA events on the bound stream; one step per iteration.
void RunMlp(benchmark::State& state, bool graphed, DType dtype, int64_t batch, int64_t d,
            int64_t h) {
  if (!cuda::Available()) {
    state.SkipWithError(absl::StrCat("no GPU: ", cuda::UnavailableReason()).c_str());
    return;
  }
  absl::Status status = CatchOpError([&] {
    // One stream for every case and every call (Google Benchmark calls this function several
    // times per case while it sizes the iteration count): a new stream per call would strand
    // the previous call's cached blocks (several GiB at the large shape) and a 32 MiB cuBLASLt
    // workspace per stream, since streams and workspaces live until the process ends.
    static const cuda::StreamHandle stream = cuda::NewStream(0);
    cuda::StreamScope scope(0, stream);
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    MlpState m = MakeState(batch, d, h, dtype, Device::Cuda(0));
    constexpr double kLr = 1e-3;
    std::unique_ptr<cuda::CudaGraph> graph;
    if (graphed) {
      graph = std::make_unique<cuda::CudaGraph>(0);
      absl::Status c = graph->Capture([&] { Step(m, kLr); });
      if (!c.ok()) throw OpError(c);
    }
    auto enqueue = [&] {
      if (graphed) {
        absl::Status r = graph->Replay();
        if (!r.ok()) throw OpError(r);
      } else {
        Step(m, kLr);
      }
    };
    for (int i = 0; i < 3; ++i) enqueue();  // warm up: allocator cache, cuBLASLt plans
    cuda::Synchronize(0);
    cudaEvent_t start, stop;
    cudaEventCreate(&start);
    cudaEventCreate(&stop);
    double host_s = 0;
    for (auto _ : state) {
      cudaEventRecord(start, s);
      const auto t0 = std::chrono::steady_clock::now();
      enqueue();
      host_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      cudaEventRecord(stop, s);
      cudaEventSynchronize(stop);
      float ms = 0;
      cudaEventElapsedTime(&ms, start, stop);
      state.SetIterationTime(ms / 1e3);
    }
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    // 5 GEMMs of 2*batch*d*h each: x@w1, a@w2 forward; dy@w2^T, x^T@dh, a^T@dy backward (no dx).
    const double flops = 5.0 * 2.0 * static_cast<double>(batch) * d * h;
    state.counters["host_us"] =
        benchmark::Counter(host_s * 1e6 / static_cast<double>(state.iterations()));
    state.counters["TFLOPS"] = benchmark::Counter(
        flops * static_cast<double>(state.iterations()) / 1e12, benchmark::Counter::kIsRate);
    if (graphed) state.counters["kernels"] = static_cast<double>(graph->num_nodes());
  });
  if (!status.ok()) state.SkipWithError(std::string(status.message()).c_str());
}

#else  // !SHARDMAP_HAS_CUDA

void RunMlp(benchmark::State& state, bool, DType, int64_t, int64_t, int64_t) {
  state.SkipWithError("no GPU: built without the CUDA toolkit");
}

#endif  // SHARDMAP_HAS_CUDA

// Registered at load time (so that --benchmark_list_tests shows them without a GPU too), as
// mlp_step/mode:<eager|graph>/dtype:<f32|bf16>/batch:B/d:D/h:H; without a GPU each case skips
// with the reason. Small shapes are host/launch bound, the large one GEMM bound.
const bool kRegistered = [] {
  const int64_t shapes[][3] = {{64, 256, 1024}, {256, 1024, 4096}, {8192, 4096, 16384}};
  for (bool graphed : {false, true}) {
    for (DType dt : {DType::kF32, DType::kBF16}) {
      for (const auto& [batch, d, h] : shapes) {
        const std::string name =
            absl::StrCat("mlp_step/mode:", graphed ? "graph" : "eager", "/dtype:", DTypeName(dt),
                         "/batch:", batch, "/d:", d, "/h:", h);
        benchmark::RegisterBenchmark(name.c_str(), RunMlp, graphed, dt, batch, d, h)
            ->UseManualTime()
            ->Unit(benchmark::kMicrosecond);
      }
    }
  }
  return true;
}();

}  // namespace
}  // namespace shardmap
