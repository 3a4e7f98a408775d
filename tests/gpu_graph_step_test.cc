// A training step written with the framework (typed ops, tape autograd via value_and_grad, an
// in-place SGD update) captured in a CUDA graph on one GPU and replayed: N replays equal N eager
// steps, with new batches copied into the captured input between replays. Skips without a GPU.
#include <cmath>
#include <vector>

#include "autograd/value_and_grad.h"
#include "shardmap/collective_ops.h"
#include "gtest/gtest.h"
#include "shardmap/context.h"
#include "shardmap/ops.h"
#include "tensor/cuda/graph.h"
#include "tensor/cuda/runtime.h"
#include "tensor/error.h"
#include "tensor/ops/elementwise.h"
#include "tests/gpu_mlp_program.h"

namespace shardmap {
namespace {

using gpu_testing::NearReference;
using gpu_testing::UniformHost;

struct Model {
  Tensor x, target;
  std::vector<Value> params;  // w1, b1, w2, b2
  Tensor loss;
};

// megatron: typed for a mesh with one axis "tp" (w1 S1, b1 S0, w2 S0, b2 R), so the step
// all_reduces over tp; else a mesh without axes (everything R).
Model MakeModel(Device d, bool megatron = false) {
  Model m;
  m.x = UniformHost({32, 16}, 1, 1.0).To(d);
  m.target = UniformHost({32, 16}, 2, 1.0).To(d);
  auto typed = [&](Tensor t, AxisType a) {
    return megatron ? Value(std::move(t), SpmdType(1, a)) : Value::Replicated(std::move(t));
  };
  m.params = {typed(UniformHost({16, 64}, 3, 0.25).To(d), AxisType::Sharded(1)),
              typed(UniformHost({64}, 4, 0.1).To(d), AxisType::Sharded(0)),
              typed(UniformHost({64, 16}, 5, 0.125).To(d), AxisType::Sharded(0)),
              typed(UniformHost({16}, 6, 0.1).To(d), AxisType::R())};
  return m;
}

// Forward, backward (the tape), and p -= lr * g in place.
void TrainStep(Model& m, double lr, bool megatron = false) {
  const double n = static_cast<double>(m.target.numel());
  Value x = Value::Replicated(m.x), t = Value::Replicated(m.target);
  ValueAndGrad r = value_and_grad(
      [&](const std::vector<Value>& p) {
        Value yp = gelu(x.matmul(p[0]) + p[1]).matmul(p[2]);
        Value y = (megatron ? all_reduce(yp, "tp") : yp) + p[3];
        Value d = y - t;
        return sum(d * d, {}) / n;
      },
      m.params);
  m.loss = r.value.tensor;
  for (size_t k = 0; k < m.params.size(); ++k) {
    Tensor w = m.params[k].tensor;  // shares storage with the parameter
    AddInPlace(w, MulScalar(r.grads[k].tensor, -lr));
  }
}

// Constants a typed step makes on a GPU rank (Value::Scalar, axis_index) are filled on the device,
// so a capture records their values; a host->device copy would be refused under capture.
TEST(GpuGraphStepTest, ScalarConstantsOfAGpuRankAreCaptured) {
  if (!cuda::Available()) GTEST_SKIP() << "no GPU: " << cuda::UnavailableReason();
  SpmdOptions o;
  o.placement = DevicePlacement::SharedGpu();
  std::vector<float> got;
  absl::Status s = RunSpmd(
      *Mesh::Create({{"tp", 1}}),
      [&](RankContext& ctx) {
        const Tensor x = Tensor::Full({5}, 2.0, DType::kF32, ctx.device());
        Tensor out;
        cuda::CudaGraph graph(ctx.device().index);
        absl::Status c = graph.Capture([&] {
          Value v = Value::Replicated(x) * Value::Scalar(3.0) + axis_index_value("tp", DType::kF32);
          out = v.tensor;
        });
        if (!c.ok()) OpFail("capture: ", c.message());
        for (int i = 0; i < 2; ++i) {
          if (absl::Status r = graph.Replay(); !r.ok()) OpFail("replay: ", r.message());
        }
        got = out.ToVector<float>();
      },
      o);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(got, std::vector<float>(5, 6.0f));
}

TEST(GpuGraphStepTest, ValueAndGradStepReplayedEqualsEager) {
  if (!cuda::Available()) GTEST_SKIP() << "no GPU: " << cuda::UnavailableReason();
  const Device d = Device::Cuda(0);
  cuda::StreamScope scope(0, cuda::NewStream(0));
  SingleRankContext one{Mesh()};
  constexpr double kLr = 0.1;
  Model eager = MakeModel(d), graphed = MakeModel(d);
  cuda::CudaGraph graph(0);
  absl::Status c = graph.Capture([&] { TrainStep(graphed, kLr); });
  ASSERT_TRUE(c.ok()) << c;
  double first = 0, last = 0;
  for (int i = 0; i < 6; ++i) {
    Tensor batch = UniformHost({32, 16}, 10 + i, 1.0);
    eager.x = batch.To(d);
    TrainStep(eager, kLr);
    cuda::CopyInto(batch, graphed.x);  // new input into the captured input tensor
    ASSERT_TRUE(graph.Replay().ok());
    EXPECT_TRUE(NearReference(graphed.loss, eager.loss, 1e-5)) << "step " << i;
    (i == 0 ? first : last) = eager.loss.To(Device::Cpu()).item();
  }
  for (size_t k = 0; k < eager.params.size(); ++k) {
    EXPECT_TRUE(NearReference(graphed.params[k].tensor, eager.params[k].tensor, 1e-5))
        << "param " << k;
  }
  EXPECT_GT(first, 0.0);
  EXPECT_GT(last, 0.0);
}

TEST(GpuGraphStepTest, SingleRankMegatronStepOnGpu) {
  // The Megatron code (with its all_reduce over "tp") on one GPU through a SingleRankContext
  // over tp=1: the group of one is a device copy, so the step runs and captures; it matches the
  // same step on the CPU.
  if (!cuda::Available()) GTEST_SKIP() << "no GPU: " << cuda::UnavailableReason();
  const Device d = Device::Cuda(0);
  cuda::StreamScope scope(0, cuda::NewStream(0));
  SingleRankContext one(*Mesh::Create({{"tp", 1}}));
  Model cpu = MakeModel(Device::Cpu(), true), eager = MakeModel(d, true),
        graphed = MakeModel(d, true);
  cuda::CudaGraph graph(0);
  absl::Status c = graph.Capture([&] { TrainStep(graphed, 0.1, true); });
  ASSERT_TRUE(c.ok()) << c;
  for (int i = 0; i < 3; ++i) {
    TrainStep(cpu, 0.1, true);
    TrainStep(eager, 0.1, true);
    ASSERT_TRUE(graph.Replay().ok());
    EXPECT_TRUE(NearReference(eager.loss, cpu.loss, 1e-4)) << "step " << i;
    EXPECT_TRUE(NearReference(graphed.loss, eager.loss, 1e-5)) << "step " << i;
  }
  for (size_t k = 0; k < cpu.params.size(); ++k) {
    EXPECT_TRUE(NearReference(eager.params[k].tensor, cpu.params[k].tensor, 1e-4)) << "param " << k;
    EXPECT_TRUE(NearReference(graphed.params[k].tensor, eager.params[k].tensor, 1e-5))
        << "param " << k;
  }
}

}  // namespace
}  // namespace shardmap
