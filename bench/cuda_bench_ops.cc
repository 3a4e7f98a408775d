// The memory-bound GPU ops side by side with PyTorch (bench/peers/torch_cuda_ops.py times the
// same cases under the same names): norms forward and backward, softmax, causal softmax, cross
// entropy, GELU and its gradient, the f32 -> bf16 cast and the fused AdamW step. Each case is
// timed with CUDA events against a device-to-device copy of the same traffic (bytes read +
// written by an ideal kernel; the table's "fraction of a copy"). Registered into the binary that
// links this library (//bench:cuda_bench); without a GPU every case skips with the reason.
//
//   ./cuda_bench --benchmark_filter='^ops/' --benchmark_format=json   # bench/peers/cuda_ops_table.sh
//
// Names: ops/<case>/dtype:<f32|bf16>. Counters: GBs (traffic / our time), copy_GBs, copy_frac
// (copy time / our time: 1 is copy speed).
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "models/components/optimizer.h"
#include "tensor/cuda/runtime.h"
#include "tensor/error.h"
#include "tensor/ops/elementwise.h"
#include "tensor/ops/nn.h"
#include "tensor/ops/shape_ops.h"
#include "tensor/random.h"
#include "tensor/tensor.h"

#if SHARDMAP_HAS_CUDA
#include <cuda_runtime.h>

#include "tensor/cuda/device_memory.h"
#include "tensor/cuda/internal/cuda_check.h"

namespace shardmap {
namespace {

constexpr int kDevice = 0;
constexpr int kWarmup = 3;
constexpr int kReps = 5;

cudaStream_t Stream() { return static_cast<cudaStream_t>(cuda::CurrentStream(kDevice)); }

double TimeSeconds(const std::function<void()>& f, int reps) {
  cudaEvent_t a, b;
  SM_CUDA_CHECK(cudaEventCreate(&a));
  SM_CUDA_CHECK(cudaEventCreate(&b));
  SM_CUDA_CHECK(cudaEventRecord(a, Stream()));
  for (int r = 0; r < reps; ++r) f();
  SM_CUDA_CHECK(cudaEventRecord(b, Stream()));
  SM_CUDA_CHECK(cudaEventSynchronize(b));
  float ms = 0;
  SM_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms * 1e-3 / reps;
}

Tensor Rand(absl::Span<const int64_t> shape, DType dt, uint64_t seed, double lo = -1,
            double hi = 1) {
  return RandomUniform(shape, seed, lo, hi, dt, Device::Cuda(kDevice));  // generated on the GPU
}

// A case: set-up (outside the timing) returns the op to time; traffic in bytes.
struct OpCase {
  std::string name;
  std::function<std::function<void()>(DType)> make;
  std::function<double(DType)> traffic;
};

void RunCase(benchmark::State& state, const OpCase* c, DType dt) {
  try {
    const std::function<void()> op = c->make(dt);
    const double traffic = c->traffic(dt);
    const size_t copy_bytes = static_cast<size_t>(traffic / 2);
    void* src = cuda::DeviceAllocate(kDevice, copy_bytes);
    void* dst = cuda::DeviceAllocate(kDevice, copy_bytes);
    SM_CUDA_CHECK(cudaMemsetAsync(src, 0, copy_bytes, Stream()));
    auto copy = [&] {
      SM_CUDA_CHECK(cudaMemcpyAsync(dst, src, copy_bytes, cudaMemcpyDeviceToDevice, Stream()));
    };
    for (int i = 0; i < kWarmup; ++i) {
      op();
      copy();
    }
    cuda::Synchronize(kDevice);
    std::vector<double> ours, theirs;
    for (auto _ : state) {
      const double t = TimeSeconds(op, kReps);
      ours.push_back(t);
      theirs.push_back(TimeSeconds(copy, kReps));
      state.SetIterationTime(t);
    }
    double so = 0, st = 0;
    for (double v : ours) so += v;
    for (double v : theirs) st += v;
    state.counters["GBs"] = traffic * ours.size() / so / 1e9;
    state.counters["copy_GBs"] = traffic * theirs.size() / st / 1e9;
    state.counters["copy_frac"] = st / so;
    cuda::DeviceFree(kDevice, src);
    cuda::DeviceFree(kDevice, dst);
  } catch (const OpError& e) {
    state.SkipWithError(e.what());
  }
}

double Es(DType dt) { return static_cast<double>(DTypeSize(dt)); }

// Shapes: norms/softmax [16384, 4096]; causal softmax [16, 12, 1024, 1024] (GPT-2 scores);
// cross entropy [8192, 50304] (GPT-2 logits); GELU/cast 64M elements; AdamW 64M f32 params.
constexpr int64_t kRows = 16384, kH = 4096, kElems = int64_t{1} << 26;

const std::vector<OpCase>& Cases() {
  static const auto* cases = new std::vector<OpCase>{
      {"layer_norm_fwd/rows:16384/h:4096",
       [](DType dt) {
         const Tensor x = Rand({kRows, kH}, dt, 1), g = Rand({kH}, dt, 2), b = Rand({kH}, dt, 3);
         return std::function<void()>([=] { LayerNorm(x, g, b, 1e-5); });
       },
       [](DType dt) { return 2.0 * kRows * kH * Es(dt); }},
      {"layer_norm_bwd/rows:16384/h:4096",
       [](DType dt) {
         const Tensor x = Rand({kRows, kH}, dt, 1), g = Rand({kH}, dt, 2), b = Rand({kH}, dt, 3);
         const Tensor dy = Rand({kRows, kH}, dt, 4);
         const LayerNormResult r = LayerNorm(x, g, b, 1e-5);
         return std::function<void()>([=] { LayerNormBackward(x, g, r.mean, r.rstd, dy); });
       },
       [](DType dt) { return 3.0 * kRows * kH * Es(dt); }},
      {"rms_norm_fwd/rows:16384/h:4096",
       [](DType dt) {
         const Tensor x = Rand({kRows, kH}, dt, 1), g = Rand({kH}, dt, 2);
         return std::function<void()>([=] { RmsNorm(x, g, 1e-6); });
       },
       [](DType dt) { return 2.0 * kRows * kH * Es(dt); }},
      {"rms_norm_bwd/rows:16384/h:4096",
       [](DType dt) {
         const Tensor x = Rand({kRows, kH}, dt, 1), g = Rand({kH}, dt, 2);
         const Tensor dy = Rand({kRows, kH}, dt, 4);
         const RmsNormResult r = RmsNorm(x, g, 1e-6);
         return std::function<void()>([=] { RmsNormBackward(x, g, r.rstd, dy); });
       },
       [](DType dt) { return 3.0 * kRows * kH * Es(dt); }},
      {"softmax_fwd/rows:16384/h:4096",
       [](DType dt) {
         const Tensor x = Rand({kRows, kH}, dt, 1, -4, 4);
         return std::function<void()>([=] { Softmax(x, -1); });
       },
       [](DType dt) { return 2.0 * kRows * kH * Es(dt); }},
      {"softmax_bwd/rows:16384/h:4096",
       [](DType dt) {
         const Tensor y = Softmax(Rand({kRows, kH}, dt, 1, -4, 4), -1);
         const Tensor dy = Rand({kRows, kH}, dt, 2);
         return std::function<void()>([=] { SoftmaxBackward(y, dy, -1); });
       },
       [](DType dt) { return 3.0 * kRows * kH * Es(dt); }},
      {"causal_softmax_fwd/b:16/h:12/t:1024",
       [](DType dt) {
         const Tensor s = Rand({16, 12, 1024, 1024}, dt, 1, -4, 4);
         return std::function<void()>([=] { CausalSoftmax(s, 0); });
       },
       [](DType dt) { return 2.0 * 16 * 12 * 1024 * 1024 * Es(dt); }},
      {"cross_entropy_fwd/rows:8192/v:50304",
       [](DType dt) {
         const Tensor logits = Rand({8192, 50304}, dt, 1, -4, 4);
         const Tensor t = RandomInts({8192}, 50304, 5, Device::Cuda(kDevice));
         return std::function<void()>([=] { CrossEntropy(logits, t); });
       },
       [](DType dt) { return 1.0 * 8192 * 50304 * Es(dt); }},
      {"cross_entropy_bwd/rows:8192/v:50304",
       [](DType dt) {
         const Tensor logits = Rand({8192, 50304}, dt, 1, -4, 4);
         const Tensor t = RandomInts({8192}, 50304, 5, Device::Cuda(kDevice));
         const Tensor dl = Rand({8192}, DType::kF32, 6);
         return std::function<void()>([=] { CrossEntropyBackward(logits, t, dl); });
       },
       [](DType dt) { return 2.0 * 8192 * 50304 * Es(dt); }},
      {"gelu_fwd/elems:67108864",
       [](DType dt) {
         const Tensor x = Rand({kElems}, dt, 1, -4, 4);
         return std::function<void()>([=] { Gelu(x, GeluApprox::kTanh); });
       },
       [](DType dt) { return 2.0 * kElems * Es(dt); }},
      {"gelu_bwd/elems:67108864",
       [](DType dt) {
         const Tensor x = Rand({kElems}, dt, 1, -4, 4), dy = Rand({kElems}, dt, 2);
         return std::function<void()>([=] { GeluGrad(x, dy, GeluApprox::kTanh); });
       },
       [](DType dt) { return 3.0 * kElems * Es(dt); }},
      {"cast_to_other/elems:67108864",  // f32 -> bf16, or bf16 -> f32
       [](DType dt) {
         const Tensor x = Rand({kElems}, dt, 1);
         const DType to = dt == DType::kF32 ? DType::kBF16 : DType::kF32;
         return std::function<void()>([=] { Cast(x, to); });
       },
       [](DType) { return 6.0 * kElems; }},
  };
  return *cases;
}

// AdamW over 64M f32 parameters in 4 tensors (the master weights of mixed precision): reads p,
// g, m, v and writes p, m, v: 28 bytes per parameter. Registered for f32 only.
void AdamWCase(benchmark::State& state) {
  static const OpCase c{
      "adamw",
      [](DType) {
        auto params = std::make_shared<std::vector<NamedTensor>>();
        auto grads = std::make_shared<std::vector<NamedTensor>>();
        for (int i = 0; i < 4; ++i) {
          const std::string name = "p" + std::to_string(i);
          params->push_back({name, Rand({kElems / 4}, DType::kF32, 10 + i)});
          grads->push_back({name, Rand({kElems / 4}, DType::kF32, 20 + i)});
        }
        auto opt = std::make_shared<AdamW>(AdamWOptions{.lr = 1e-4, .weight_decay = 0.1});
        return std::function<void()>([=] {
          if (!opt->Step(*params, *grads).ok()) OpFail("adamw bench: step failed");
        });
      },
      [](DType) { return 28.0 * kElems; }};
  RunCase(state, &c, DType::kF32);
}

const bool kRegistered = [] {
  for (const OpCase& c : Cases()) {
    for (DType dt : {DType::kF32, DType::kBF16}) {
      benchmark::RegisterBenchmark(("ops/" + c.name + "/dtype:" + DTypeName(dt)).c_str(),
                                   RunCase, &c, dt)
          ->UseManualTime()
          ->Iterations(5)
          ->Unit(benchmark::kMillisecond);
    }
  }
  benchmark::RegisterBenchmark("ops/adamw/params:67108864/dtype:f32", AdamWCase)
      ->UseManualTime()
      ->Iterations(5)
      ->Unit(benchmark::kMillisecond);
  return true;
}();

}  // namespace
}  // namespace shardmap

#endif  // SHARDMAP_HAS_CUDA
