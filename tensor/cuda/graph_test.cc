// CudaGraph: an MLP training step (forward, hand-written backward, in-place SGD update) captured
// once and replayed N times equals N eager steps; capture errors come back as Statuses. Without
// a GPU only the CPU-testable parts run (errors naming the reason, CopyInto on the host).
#include "tensor/cuda/graph.h"

#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tensor/cuda/device_memory.h"
#include "tensor/cuda/runtime.h"
#include "tensor/error.h"
#include "tensor/ops/elementwise.h"
#include "tensor/ops/matmul.h"
#include "tensor/ops/reduce.h"
#include "tensor/tensor.h"
#include "tensor/testing/compare.h"

namespace shardmap::cuda {
namespace {

Tensor HostRand(std::vector<int64_t> shape, uint64_t seed, double scale) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  std::vector<float> v(n);
  uint64_t x = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (int64_t i = 0; i < n; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    v[i] = static_cast<float>(scale * (2.0 * static_cast<double>(x >> 11) / 9007199254740992.0 - 1));
  }
  return Tensor::FromVector<float>(absl::Span<const int64_t>(shape), v);
}

// Weights and the batch of a 2-layer MLP, all on one device.
struct Mlp {
  Tensor x, target, w1, b1, w2, b2;
  Tensor loss;  // written by Step
};

Mlp MakeMlp(Device d, int64_t batch, int64_t dm, int64_t dh) {
  Mlp m;
  m.x = HostRand({batch, dm}, 1, 1.0).To(d);
  m.target = HostRand({batch, dm}, 2, 1.0).To(d);
  m.w1 = HostRand({dm, dh}, 3, 1.0 / std::sqrt(static_cast<double>(dm))).To(d);
  m.b1 = HostRand({dh}, 4, 0.1).To(d);
  m.w2 = HostRand({dh, dm}, 5, 1.0 / std::sqrt(static_cast<double>(dh))).To(d);
  m.b2 = HostRand({dm}, 6, 0.1).To(d);
  return m;
}

// One SGD step of mean((gelu(x w1 + b1) w2 + b2 - target)^2), weights updated in place.
void Step(Mlp& m, double lr) {
  const double n = static_cast<double>(m.target.numel());
  Tensor h = Add(Matmul(m.x, m.w1), m.b1);
  Tensor a = Gelu(h);
  Tensor y = Add(Matmul(a, m.w2), m.b2);
  Tensor d = Sub(y, m.target);
  m.loss = MulScalar(Sum(Mul(d, d), {}), 1.0 / n);
  Tensor dy = MulScalar(d, 2.0 / n);
  Tensor da = Matmul(dy, m.w2, false, true);
  Tensor dh = GeluGrad(h, da);
  Tensor gw1 = Matmul(m.x, dh, true, false), gb1 = Sum(dh, {0});
  Tensor gw2 = Matmul(a, dy, true, false), gb2 = Sum(dy, {0});
  AddInPlace(m.w1, MulScalar(gw1, -lr));
  AddInPlace(m.b1, MulScalar(gb1, -lr));
  AddInPlace(m.w2, MulScalar(gw2, -lr));
  AddInPlace(m.b2, MulScalar(gb2, -lr));
}

TEST(CudaGraphTest, WithoutGpuCaptureAndReplayNameTheReason) {
  if (Available()) GTEST_SKIP() << "a GPU is present; this checks the no-GPU error";
  CudaGraph g(0);
  bool ran = false;
  absl::Status s = g.Capture([&] { ran = true; });
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find(UnavailableReason()), std::string::npos) << s;
  EXPECT_FALSE(ran);
  EXPECT_FALSE(g.captured());
  absl::Status r = g.Replay();
  EXPECT_EQ(r.code(), absl::StatusCode::kFailedPrecondition) << r;
  EXPECT_FALSE(IsCapturing(0));
}

// A tensor that outlives its graph (a captured output kept after the graph is destroyed),
// dropped while another graph is being captured: its block's synchronize and cudaFree wait for
// the capture's end (caching_allocator.h), so that capture is not invalidated and replays.
TEST(CudaGraphTest, ATensorOutlivingItsGraphDroppedDuringAnotherCapture) {
  if (!Available()) GTEST_SKIP() << "no GPU: " << UnavailableReason();
  const Device d = Device::Cuda(0);
  StreamScope scope(0, NewStream(0));
  const Tensor x = Tensor::Full({256, 256}, 0.5).To(d);
  std::optional<Tensor> kept;
  {
    CudaGraph first(0);
    ASSERT_TRUE(first.Capture([&] { kept.emplace(Matmul(x, x)); }).ok());
    ASSERT_TRUE(first.Replay().ok());
    Synchronize(0);
  }  // the graph and its pool are released; `kept` still holds a block of it
  const int64_t frees_before = DeviceAllocator(0).stats().raw_frees;
  Tensor y;
  CudaGraph second(0);
  const absl::Status st = second.Capture([&] {
    kept.reset();  // freed inside the capture
    y = Add(x, x);
  });
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_GT(DeviceAllocator(0).stats().raw_frees, frees_before) << "not freed after the capture";
  ASSERT_TRUE(second.Replay().ok());
  EXPECT_EQ(y.To(Device::Cpu()).at(0), 1.0);
  EXPECT_EQ(y.To(Device::Cpu()).at(256 * 256 - 1), 1.0);
}

TEST(CudaGraphTest, CopyIntoOnHostAndMismatch) {
  Tensor src = Tensor::FromVector<float>({2, 2}, {1, 2, 3, 4});
  Tensor dst = Tensor::Zeros({4});
  CopyInto(src, dst);
  EXPECT_EQ(dst.ToVector<float>(), (std::vector<float>{1, 2, 3, 4}));
  Tensor wrong = Tensor::Zeros({3});
  absl::Status s = CatchOpError([&] { CopyInto(src, wrong); });
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("static shapes"), std::string::npos) << s;
}

TEST(CudaGraphTest, MlpStepReplayedEqualsEagerSteps) {
  if (!Available()) GTEST_SKIP() << "no GPU: " << UnavailableReason();
  const Device d = Device::Cuda(0);
  StreamScope scope(0, NewStream(0));
  constexpr int kSteps = 5;
  constexpr double kLr = 0.05;

  Mlp eager = MakeMlp(d, 64, 32, 128);
  std::vector<double> eager_losses;
  for (int i = 0; i < kSteps; ++i) {
    Step(eager, kLr);
    eager_losses.push_back(eager.loss.item());
  }

  Mlp graphed = MakeMlp(d, 64, 32, 128);
  const Tensor w1_before = graphed.w1.To(Device::Cpu());
  CudaGraph graph(0);
  ASSERT_TRUE(graph.Capture([&] { Step(graphed, kLr); }).ok());
  EXPECT_TRUE(graph.captured());
  EXPECT_GT(graph.num_nodes(), 10);
  // Capture records; it does not run: the weights are unchanged.
  Synchronize(0);
  EXPECT_TENSOR_EQ(graphed.w1, w1_before);
  for (int i = 0; i < kSteps; ++i) {
    ASSERT_TRUE(graph.Replay().ok());
    const double loss = graphed.loss.item();  // the captured output tensor, rewritten per replay
    EXPECT_NEAR(loss, eager_losses[i], 1e-5 * std::fabs(eager_losses[i])) << "step " << i;
  }
  EXPECT_LT(eager_losses.back(), eager_losses.front());  // it trains
  EXPECT_TRUE(testing::TensorsNearScaled(graphed.w1, eager.w1, 1e-5));
  EXPECT_TRUE(testing::TensorsNearScaled(graphed.b1, eager.b1, 1e-5));
  EXPECT_TRUE(testing::TensorsNearScaled(graphed.w2, eager.w2, 1e-5));
  EXPECT_TRUE(testing::TensorsNearScaled(graphed.b2, eager.b2, 1e-5));
}

TEST(CudaGraphTest, NewInputsAreCopiedIntoTheCapturedInput) {
  if (!Available()) GTEST_SKIP() << "no GPU: " << UnavailableReason();
  const Device d = Device::Cuda(0);
  StreamScope scope(0, NewStream(0));
  Mlp eager = MakeMlp(d, 16, 8, 32);
  Mlp graphed = MakeMlp(d, 16, 8, 32);
  CudaGraph graph(0);
  ASSERT_TRUE(graph.Capture([&] { Step(graphed, 0.1); }).ok());
  for (int i = 0; i < 3; ++i) {
    Tensor batch = HostRand({16, 8}, 100 + i, 1.0);
    eager.x = batch.To(d);
    Step(eager, 0.1);
    CopyInto(batch, graphed.x);
    ASSERT_TRUE(graph.Replay().ok());
    EXPECT_NEAR(graphed.loss.item(), eager.loss.item(), 1e-5 * std::fabs(eager.loss.item()));
  }
  EXPECT_TRUE(testing::TensorsNearScaled(graphed.w1, eager.w1, 1e-5));
}

TEST(CudaGraphTest, HostSyncInsideCaptureIsAnError) {
  if (!Available()) GTEST_SKIP() << "no GPU: " << UnavailableReason();
  StreamScope scope(0, NewStream(0));
  Tensor x = Tensor::Ones({4}, DType::kF32, Device::Cuda(0));
  CudaGraph graph(0);
  absl::Status s = graph.Capture([&] { (void)Add(x, x).item(); });
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("while capturing a CUDA graph on cuda:0"), std::string::npos) << s;
  EXPECT_FALSE(graph.captured());
  EXPECT_EQ(graph.Replay().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(IsCapturing(0));
  // The stream is usable again: eager work after the failed capture runs.
  EXPECT_EQ(Add(x, x).ToVector<float>(), (std::vector<float>{2, 2, 2, 2}));
}

TEST(CudaGraphTest, HostToDeviceCopyInsideCaptureIsRefused) {
  if (!Available()) GTEST_SKIP() << "no GPU: " << UnavailableReason();
  StreamScope scope(0, NewStream(0));
  const Tensor host = Tensor::FromVector<float>({4}, {1, 2, 3, 4});
  Tensor y;
  CudaGraph graph(0);
  // Recorded, the copy would read the pinned staging chunk at each replay (whatever later copies
  // left there), and leave the chunk's event recorded in the capture.
  absl::Status s = graph.Capture([&] { y = host.To(Device::Cuda(0)); });
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("cannot be captured in a CUDA graph"), std::string::npos) << s;
  EXPECT_FALSE(graph.captured());
  EXPECT_FALSE(IsCapturing(0));
  // This thread's later host->device copies (same staging chunks) still work.
  for (int i = 0; i < 3; ++i) {
    Tensor dev = Tensor::Full({4}, i, DType::kF32).To(Device::Cuda(0));
    EXPECT_EQ(dev.ToVector<float>(), std::vector<float>(4, static_cast<float>(i)));
  }
}

TEST(CudaGraphTest, ReplayBeforeCaptureAndSecondCapture) {
  if (!Available()) GTEST_SKIP() << "no GPU: " << UnavailableReason();
  StreamScope scope(0, NewStream(0));
  CudaGraph graph(0);
  EXPECT_EQ(graph.Replay().code(), absl::StatusCode::kFailedPrecondition);
  Tensor x = Tensor::Ones({4}, DType::kF32, Device::Cuda(0));
  Tensor y;
  ASSERT_TRUE(graph.Capture([&] { y = Add(x, x); }).ok());
  EXPECT_EQ(graph.Capture([&] {}).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(graph.Replay().ok());
  EXPECT_EQ(y.ToVector<float>(), (std::vector<float>{2, 2, 2, 2}));
}

TEST(CudaGraphTest, CaptureFromAThreadWithoutABoundStream) {
  if (!Available()) GTEST_SKIP() << "no GPU: " << UnavailableReason();
  // No StreamScope: eager work and replays on the per-thread default stream; the capture runs on
  // a stream of the graph's own.
  Mlp eager = MakeMlp(Device::Cuda(0), 16, 8, 32);
  Mlp graphed = MakeMlp(Device::Cuda(0), 16, 8, 32);
  CudaGraph graph(0);
  ASSERT_TRUE(graph.Capture([&] { Step(graphed, 0.1); }).ok());
  for (int i = 0; i < 3; ++i) {
    Step(eager, 0.1);
    ASSERT_TRUE(graph.Replay().ok());
    EXPECT_NEAR(graphed.loss.item(), eager.loss.item(), 1e-5 * std::fabs(eager.loss.item()));
  }
  EXPECT_TRUE(testing::TensorsNearScaled(graphed.w2, eager.w2, 1e-5));
}

}  // namespace
}  // namespace shardmap::cuda
