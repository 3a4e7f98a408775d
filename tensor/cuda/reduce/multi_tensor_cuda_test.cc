// The multi-tensor ops (tensor/ops/multi_tensor.h) and the fused CUDA AdamW (models/components/optimizer.h)
// against their CPU paths on the same inputs: odd sizes, empty tensors, tensors longer than a
// chunk, unaligned views, mixed dtypes, clipping as grad_scale, no_decay, a restored step count.
// Skips without a GPU.
#include <cmath>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "models/components/optimizer.h"
#include "tensor/cuda/device_memory.h"
#include "tensor/cuda/graph.h"
#include "tensor/cuda/runtime.h"
#include "tensor/error.h"
#include "tensor/ops/multi_tensor.h"
#include "tensor/ops/shape_ops.h"
#include "tensor/tensor.h"
#include "tensor/testing/test_util.h"

namespace shardmap {
namespace {

using testing::ExpectAllClose;
using testing::ExpectOpError;
using testing::RandomTensor;

const Device kGpu = Device::Cuda(0);

std::vector<double> Values(const Tensor& t) { return t.To(Device::Cpu()).ToVector<double>(); }

void ExpectNear(const Tensor& gpu, const Tensor& cpu, double rtol, double atol,
                const std::string& what) {
  ASSERT_TRUE(gpu.is_cuda()) << what;
  ASSERT_EQ(gpu.shape(), cpu.shape()) << what;
  ASSERT_EQ(gpu.dtype(), cpu.dtype()) << what;
  ExpectAllClose(gpu.To(Device::Cpu()), Values(cpu), rtol, atol, what);
}

// Sizes around the chunk (16384) and the 4-element vector width, and empty ones.
std::vector<Tensor> Mixed(uint32_t seed) {
  return {RandomTensor({7, 13}, DType::kF32, seed, -3, 3),
          RandomTensor({0, 4}, DType::kF32, seed + 1),
          RandomTensor({16384 * 3 + 5}, DType::kF32, seed + 2),
          RandomTensor({33}, DType::kBF16, seed + 3),
          RandomTensor({5, 2, 3}, DType::kF16, seed + 4),
          RandomTensor({16384}, DType::kF32, seed + 5),
          RandomTensor({1}, DType::kF32, seed + 6)};
}

std::vector<Tensor> ToGpu(const std::vector<Tensor>& ts) {
  std::vector<Tensor> out;
  for (const Tensor& t : ts) out.push_back(t.To(kGpu));
  return out;
}

TEST(MultiTensorCudaTest, SumOfSquaresClipAndScaleMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  const std::vector<Tensor> cpu = Mixed(1);
  const std::vector<Tensor> gpu = ToGpu(cpu);
  const Tensor cs = SumOfSquares(cpu), gs = SumOfSquares(gpu);
  ExpectNear(gs, cs, 1e-6, 0, "sum_of_squares f32");
  std::vector<Tensor> cpu64 = cpu, gpu64 = gpu;
  cpu64.push_back(RandomTensor({1000}, DType::kF64, 9));
  gpu64.push_back(cpu64.back().To(kGpu));
  ExpectNear(SumOfSquares(gpu64), SumOfSquares(cpu64), 1e-12, 0, "sum_of_squares f64");
  // Unaligned views (offsets of 1 and 3 floats) take the scalar path.
  const Tensor base = RandomTensor({16384 * 2 + 9}, DType::kF32, 10).To(kGpu);
  const Tensor v1 = base.SliceRows(1, 16384 + 3), v3 = base.SliceRows(3, 16384 * 2);
  ExpectNear(SumOfSquares({v1, v3}), SumOfSquares({v1.To(Device::Cpu()), v3.To(Device::Cpu())}),
             1e-6, 0, "sum_of_squares of unaligned views");
  // Deterministic: the same list gives the same bits.
  EXPECT_EQ(Values(SumOfSquares(gpu)), Values(SumOfSquares(gpu)));
  EXPECT_EQ(SumOfSquares(std::vector<Tensor>{Tensor::Zeros({0}, DType::kF32, kGpu)}).To(
                Device::Cpu()).item(), 0.0);

  for (double max_norm : {0.5, 1e9}) {
    const Tensor cc = ClipCoefficient(cs, max_norm), gc = ClipCoefficient(gs, max_norm);
    ExpectNear(gc, cc, 1e-6, 0, "clip_coefficient " + std::to_string(max_norm));
    std::vector<Tensor> cpu_copy, gpu_copy;
    for (const Tensor& t : cpu) cpu_copy.push_back(t.Clone());
    for (const Tensor& t : gpu) gpu_copy.push_back(t.Clone());
    ScaleInPlace(cpu_copy, cc);
    ScaleInPlace(gpu_copy, gc);
    for (size_t i = 0; i < cpu.size(); ++i) {
      const bool half = IsFloating(cpu[i].dtype()) && DTypeSize(cpu[i].dtype()) == 2;
      ExpectNear(gpu_copy[i], cpu_copy[i], half ? 1e-2 : 1e-6, 0,
                 "scale_in_place tensor " + std::to_string(i));
    }
  }
  ExpectOpError([&] { ScaleInPlace(gpu, cs); }, {"scale_in_place", "scale", "cpu", "cuda"});
  ExpectOpError([&] { SumOfSquares({gpu[0], cpu[0]}); }, {"sum_of_squares", "tensor 1", "cpu"});
}

// Three AdamW steps with clipping and no_decay, the GPU's fused kernel against the CPU's tensor
// ops; then a fresh optimizer restored from the first one's state continues identically.
TEST(MultiTensorCudaTest, FusedAdamWMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  const std::vector<std::vector<int64_t>> shapes = {
      {7, 13}, {0, 3}, {16384 * 2 + 3}, {768}, {1}, {65, 129}};
  AdamWOptions o{.lr = 3e-3, .beta1 = 0.85, .beta2 = 0.99, .eps = 1e-7, .weight_decay = 0.1};
  o.no_decay = {"p3"};
  std::vector<NamedTensor> cp, gp;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const std::string name = "p" + std::to_string(i);
    cp.push_back({name, RandomTensor(shapes[i], DType::kF32, 20 + i, -1, 1)});
    gp.push_back({name, cp.back().tensor.To(kGpu)});
  }
  const Tensor gpu_storage0 = gp[0].tensor;
  AdamW copt(o), gopt(o);
  for (int step = 0; step < 3; ++step) {
    std::vector<NamedTensor> cg, gg;
    std::vector<Tensor> gpu_grads;
    for (size_t i = 0; i < shapes.size(); ++i) {
      cg.push_back({cp[i].name, RandomTensor(shapes[i], DType::kF32, 100 * step + i, -2, 2)});
      gg.push_back({cp[i].name, cg.back().tensor.To(kGpu)});
      gpu_grads.push_back(gg.back().tensor);
    }
    std::vector<Tensor> cpu_grads;
    for (const NamedTensor& g : cg) cpu_grads.push_back(g.tensor);
    // Clipping to 5: below the grads' norm, so the coefficient matters.
    const Tensor ccoef = ClipCoefficient(SumOfSquares(cpu_grads), 5.0);
    const Tensor gcoef = ClipCoefficient(SumOfSquares(gpu_grads), 5.0);
    ASSERT_LT(ccoef.item(), 1.0);
    ASSERT_TRUE(copt.Step(cp, cg, step == 1 ? Tensor() : ccoef).ok());
    ASSERT_TRUE(gopt.Step(gp, gg, step == 1 ? Tensor() : gcoef).ok());
    for (size_t i = 0; i < shapes.size(); ++i) {
      const std::string what = cp[i].name + " step " + std::to_string(step + 1);
      ExpectNear(gp[i].tensor, cp[i].tensor, 2e-6, 5e-7, what);
      ExpectNear(gopt.exp_avg(cp[i].name), copt.exp_avg(cp[i].name), 2e-6, 1e-7, what + " m");
      ExpectNear(gopt.exp_avg_sq(cp[i].name), copt.exp_avg_sq(cp[i].name), 2e-6, 1e-8,
                 what + " v");
    }
  }
  EXPECT_TRUE(gp[0].tensor.SharesStorageWith(gpu_storage0)) << "the GPU step is in place";
  EXPECT_EQ(gopt.steps(), 3);

  // Restore: moments from the CPU optimizer (on the CPU), the step count set on the host.
  AdamW restored(o);
  restored.set_steps(copt.steps());
  std::vector<NamedTensor> rp;
  for (size_t i = 0; i < shapes.size(); ++i) {
    restored.SetState(cp[i].name, copt.exp_avg(cp[i].name).Clone(),
                      copt.exp_avg_sq(cp[i].name).Clone());
    rp.push_back({cp[i].name, cp[i].tensor.To(kGpu)});
  }
  std::vector<NamedTensor> cg, rg;
  for (size_t i = 0; i < shapes.size(); ++i) {
    cg.push_back({cp[i].name, RandomTensor(shapes[i], DType::kF32, 900 + i)});
    rg.push_back({cp[i].name, cg.back().tensor.To(kGpu)});
  }
  ASSERT_TRUE(copt.Step(cp, cg).ok());
  ASSERT_TRUE(restored.Step(rp, rg).ok());
  for (size_t i = 0; i < shapes.size(); ++i) {
    ExpectNear(rp[i].tensor, cp[i].tensor, 2e-6, 5e-7, cp[i].name + " after restore (t = 4)");
  }

  // A gradient on the wrong device, a grad_scale on the wrong device.
  std::vector<NamedTensor> bad = rg;
  bad[0].tensor = cg[0].tensor;
  EXPECT_FALSE(restored.Step(rp, bad).ok());
  EXPECT_FALSE(restored.Step(rp, rg, Tensor::Scalar(0.5)).ok());
}

// A clipped AdamW step captured once as a CUDA graph and replayed: the device's step count
// advances with each replay (bias correction of t = 2, 3, ...), so three steps (one eager, two
// replays) equal three eager steps of another optimizer on the same gradients.
TEST(MultiTensorCudaTest, FusedAdamWWithClippingReplaysAsACudaGraph) {
  SKIP_WITHOUT_GPU();
  AdamWOptions o{.lr = 1e-2, .weight_decay = 0.05};
  const std::vector<std::vector<int64_t>> shapes = {{33, 17}, {16384 + 9}, {64}};
  std::vector<NamedTensor> a, b, grads;
  std::vector<Tensor> grad_list;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const std::string name = "p" + std::to_string(i);
    const Tensor p0 = RandomTensor(shapes[i], DType::kF32, 70 + i, -1, 1).To(kGpu);
    a.push_back({name, p0.Clone()});
    b.push_back({name, p0.Clone()});
    grads.push_back({name, RandomTensor(shapes[i], DType::kF32, 80 + i, -3, 3).To(kGpu)});
    grad_list.push_back(grads.back().tensor);
  }
  AdamW eager(o), graphed(o);
  auto step = [&](AdamW& opt, std::vector<NamedTensor>& params) {
    const Tensor coef = ClipCoefficient(SumOfSquares(grad_list), 2.0);
    if (!opt.Step(params, grads, coef).ok()) OpFail("step failed");
  };
  for (int i = 0; i < 3; ++i) step(eager, a);
  step(graphed, b);  // eager first step: state allocated, outside the graph
  cuda::CudaGraph graph(0);
  ASSERT_TRUE(graph.Capture([&] { step(graphed, b); }).ok());
  ASSERT_TRUE(graph.Replay().ok());
  ASSERT_TRUE(graph.Replay().ok());
  cuda::Synchronize(0);
  for (size_t i = 0; i < shapes.size(); ++i) {
    EXPECT_EQ(Values(b[i].tensor), Values(a[i].tensor)) << b[i].name << ": replay != eager";
  }
}

// AdamW's device control on the GPU (the lr read from a device scalar, a non-finite skip flag
// deciding on the device) against the CPU's host reading of the same control: a step at one lr,
// a skipped step (NaN, then inf: parameters, moments and the device's count unchanged), a step
// at another lr (bias correction t = 2). Then the same three steps captured once as a CUDA graph
// and replayed with the lr and the flag written into their device scalars before each replay.
TEST(MultiTensorCudaTest, FusedAdamWControlMatchesTheCpuEagerlyAndInAGraph) {
  SKIP_WITHOUT_GPU();
  AdamWOptions o{.lr = 99.0, .beta1 = 0.9, .beta2 = 0.95, .weight_decay = 0.1};
  o.no_decay = {"p1"};
  const std::vector<std::vector<int64_t>> shapes = {{33, 17}, {16384 + 9}, {5}};
  std::vector<NamedTensor> cp, gp, hp, cg, gg;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const std::string name = "p" + std::to_string(i);
    cp.push_back({name, RandomTensor(shapes[i], DType::kF32, 40 + i, -1, 1)});
    gp.push_back({name, cp.back().tensor.To(kGpu)});
    hp.push_back({name, cp.back().tensor.To(kGpu)});
    cg.push_back({name, RandomTensor(shapes[i], DType::kF32, 50 + i, -2, 2)});
    gg.push_back({name, cg.back().tensor.To(kGpu)});
  }
  const double nan = std::nan("");
  const std::vector<std::pair<double, double>> steps = {  // lr, flag
      {5e-3, 1.0}, {5e-3, nan}, {5e-3, INFINITY}, {1e-3, 2.0}};
  AdamW copt(o), gopt(o), hopt(o);
  for (size_t k = 0; k < steps.size(); ++k) {
    const std::string what = "step " + std::to_string(k);
    const AdamWStepControl cc{Tensor::Scalar(steps[k].first, DType::kF64),
                              Tensor::Scalar(steps[k].second, DType::kF32)};
    const AdamWStepControl gc{cc.lr.To(kGpu), cc.skip_if_nonfinite.To(kGpu)};
    const std::vector<Tensor> before = {gp[0].tensor.To(Device::Cpu())};
    ASSERT_TRUE(copt.Step(cp, cg, Tensor(), cc).ok()) << what;
    ASSERT_TRUE(gopt.Step(gp, gg, Tensor(), gc).ok()) << what;
    if (!std::isfinite(steps[k].second)) {
      EXPECT_EQ(Values(gp[0].tensor), before[0].ToVector<double>()) << what << ": skipped";
    }
    for (size_t i = 0; i < shapes.size(); ++i) {
      ExpectNear(gp[i].tensor, cp[i].tensor, 2e-6, 5e-7, cp[i].name + " " + what);
      ExpectNear(gopt.exp_avg(cp[i].name), copt.exp_avg(cp[i].name), 2e-6, 1e-7,
                 cp[i].name + " m " + what);
    }
  }
  EXPECT_EQ(copt.steps(), 2);  // the host path counts taken steps; the GPU's count is on it
  // Captured: one eager warm-up step, then the step recorded once and replayed with the
  // remaining controls written into the captured scalars.
  Tensor lr = Tensor::Scalar(steps[0].first, DType::kF64).To(kGpu);
  Tensor flag = Tensor::Scalar(steps[0].second, DType::kF32).To(kGpu);
  ASSERT_TRUE(hopt.Step(hp, gg, Tensor(), {lr, flag}).ok());
  cuda::CudaGraph graph(0);
  ASSERT_TRUE(graph.Capture([&] {
    if (!hopt.Step(hp, gg, Tensor(), {lr, flag}).ok()) OpFail("step failed");
  }).ok());
  for (size_t k = 1; k < steps.size(); ++k) {
    cuda::CopyInto(Tensor::Scalar(steps[k].first, DType::kF64), lr);
    cuda::CopyInto(Tensor::Scalar(steps[k].second, DType::kF32), flag);
    ASSERT_TRUE(graph.Replay().ok());
  }
  cuda::Synchronize(0);
  for (size_t i = 0; i < shapes.size(); ++i) {
    EXPECT_EQ(Values(hp[i].tensor), Values(gp[i].tensor)) << hp[i].name << ": replay != eager";
  }
}

}  // namespace
}  // namespace shardmap
