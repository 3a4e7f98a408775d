// Device placement on any machine (runs on CPU-only CI): the default is unchanged (CPU ranks,
// host memory), and asking for GPU ranks that are not there is a clear Status, never a crash or
// a hang. With GPUs present the "too few GPUs" case is still exercised (one rank more than GPUs).
#include <atomic>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "shardmap/sharding.h"
#include "tensor/cuda/runtime.h"
#include "tensor/error.h"
#include "tests/gpu_mlp_program.h"

namespace shardmap {
namespace {

using gpu_testing::MlpInputs;
using gpu_testing::MlpSizes;
using gpu_testing::NearReference;
using gpu_testing::RunMlpStep;

bool Contains(const absl::Status& s, const std::string& what) {
  return s.message().find(what) != std::string::npos;
}

TEST(GpuPlacementTest, DefaultIsCpu) {
  SpmdOptions o;
  EXPECT_TRUE(o.placement.is_cpu());
  absl::StatusOr<std::vector<collectives::MemorySpace>> spaces = RankMemorySpaces(o, 4);
  ASSERT_TRUE(spaces.ok()) << spaces.status();
  for (const collectives::MemorySpace& m : *spaces) EXPECT_FALSE(m.device);
  std::vector<Device> devices(4, Device::Cuda(7));
  absl::Status s = RunSpmd(*Mesh::Create({{"dp", 2}, {"tp", 2}}), [&](RankContext& ctx) {
    devices[ctx.rank()] = ctx.device();
    if (ctx.world().memory_space().device) OpFail("host memory expected");
  });
  ASSERT_TRUE(s.ok()) << s;
  for (const Device& d : devices) EXPECT_EQ(d, Device::Cpu());
}

TEST(GpuPlacementTest, CpuRunOfTheMlpIsUnchanged) {
  // The explicit CPU placement and the default give bitwise the same step.
  Mesh mesh = *Mesh::Create({{"dp", 2}, {"tp", 2}});
  std::vector<Tensor> in = MlpInputs(MlpSizes{});
  absl::StatusOr<ShardMapGrads> a = RunMlpStep(mesh, in, DevicePlacement{});
  absl::StatusOr<ShardMapGrads> b = RunMlpStep(mesh, in, DevicePlacement::Cpu());
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TENSOR_EQ(a->outputs[0], b->outputs[0]);
  for (size_t k = 0; k < a->grads.size(); ++k) EXPECT_TENSOR_EQ(a->grads[k], b->grads[k]);
  // And the step matches an unsharded run (1 rank).
  absl::StatusOr<ShardMapGrads> one =
      RunMlpStep(*Mesh::Create({{"dp", 1}, {"tp", 1}}), in, DevicePlacement::Cpu());
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_TRUE(NearReference(a->outputs[0], one->outputs[0], 1e-5));
  for (size_t k = 0; k < a->grads.size(); ++k) {
    EXPECT_TRUE(NearReference(a->grads[k], one->grads[k], 1e-5)) << "gradient " << k;
  }
}

TEST(GpuPlacementTest, GpuPerRankWithTooFewGpus) {
  const int gpus = cuda::DeviceCount();
  const int n = gpus + 1 < 2 ? 2 : gpus + 1;
  SpmdOptions o;
  o.placement = DevicePlacement::GpuPerRank();
  std::atomic<int> ran{0};
  absl::Status s = RunSpmd(*Mesh::Create({{"tp", n}}), [&](RankContext&) { ++ran; }, o);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(ran.load(), 0);
  if (gpus == 0) {
    EXPECT_TRUE(Contains(s, "needs a GPU")) << s;
    EXPECT_TRUE(Contains(s, cuda::UnavailableReason())) << s;
  } else {
    EXPECT_TRUE(Contains(s, absl::StrCat("each of the ", n, " ranks"))) << s;
    EXPECT_TRUE(Contains(s, absl::StrCat("only ", gpus, " GPU"))) << s;
    EXPECT_TRUE(Contains(s, "SharedGpu")) << s;
  }
}

TEST(GpuPlacementTest, SharedGpuWithoutGpu) {
  if (cuda::Available()) GTEST_SKIP() << "a GPU is present; this checks the no-GPU error";
  SpmdOptions o;
  o.placement = DevicePlacement::SharedGpu();
  absl::Status s = RunSpmd(*Mesh::Create({{"tp", 3}}), [&](RankContext&) {}, o);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(Contains(s, "shared-gpu(0) needs a GPU")) << s;
  EXPECT_TRUE(Contains(s, "DevicePlacement::Cpu()")) << s;

  // Through shard_map and value_and_grad(shard_map): the same Status, the caller's API intact.
  Mesh mesh = *Mesh::Create({{"dp", 1}, {"tp", 3}});
  std::vector<Tensor> in = MlpInputs(MlpSizes{});
  absl::StatusOr<ShardMapGrads> g = RunMlpStep(mesh, in, DevicePlacement::SharedGpu());
  EXPECT_EQ(g.status().code(), absl::StatusCode::kFailedPrecondition) << g.status();
  ShardMap f = gpu_testing::MlpShardMap(mesh, in[1].numel(), DevicePlacement::SharedGpu());
  absl::StatusOr<std::vector<Tensor>> out = f(in);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kFailedPrecondition) << out.status();
}

TEST(GpuPlacementTest, CustomPlacementMixingCpuAndGpuIsRefused) {
  SpmdOptions o;
  o.placement = DevicePlacement::Custom(
      [](int r) { return r == 0 ? Device::Cuda(0) : Device::Cpu(); });
  std::atomic<int> ran{0};
  absl::Status s = RunSpmd(*Mesh::Create({{"tp", 2}}), [&](RankContext&) { ++ran; }, o);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(ran.load(), 0);
  if (cuda::Available()) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_TRUE(Contains(s, "all ranks on GPUs or all on the CPU")) << s;
  } else {
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  }
  // A custom placement of CPU ranks only is the CPU run.
  o.placement = DevicePlacement::Custom([](int) { return Device::Cpu(); });
  s = RunSpmd(*Mesh::Create({{"tp", 2}}), [&](RankContext& ctx) {
    if (ctx.device() != Device::Cpu()) OpFail("cpu expected");
  }, o);
  EXPECT_TRUE(s.ok()) << s;
}

TEST(GpuPlacementTest, MemorySpaceOnMissingGpuIsAStatus) {
  if (cuda::Available()) GTEST_SKIP() << "a GPU is present";
  SpmdOptions o;
  o.comm.memory_space = [](int) { return collectives::MemorySpace{true, 0, nullptr}; };
  absl::Status s = RunSpmd(*Mesh::Create({{"tp", 2}}), [&](RankContext&) {}, o);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(Contains(s, "comm.memory_space puts rank 0 on cuda:0")) << s;
}

TEST(GpuPlacementTest, AssembleSumsBf16PartialsInF32) {
  // Gradients of replicated bf16 inputs are pending sums; Assemble adds them (in f32).
  Mesh mesh = *Mesh::Create({{"tp", 2}});
  std::vector<Tensor> locals = {Cast(Tensor::FromVector<float>({2}, {1.5f, 2.0f}), DType::kBF16),
                                Cast(Tensor::FromVector<float>({2}, {0.25f, -1.0f}),
                                     DType::kBF16)};
  absl::StatusOr<Tensor> whole = Assemble(mesh, P(), locals, SpmdType(1, AxisType::P()));
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(whole->dtype(), DType::kBF16);
  EXPECT_EQ(whole->ToVector<float>(), (std::vector<float>{1.75f, 1.0f}));
}

}  // namespace
}  // namespace shardmap
