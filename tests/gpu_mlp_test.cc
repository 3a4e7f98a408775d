// GPU ranks: the Megatron MLP step (forward + backward, tests/gpu_mlp_program.h) under shard_map
// with the ranks on GPUs equals the same step on CPU ranks:
//   * shared GPU: tp=3 and (dp=2, tp=2) virtual ranks on GPU 0, each with its own stream,
//     in-process collectives on device memory;
//   * one GPU per rank (>= 2 GPUs);
// f32 within 1e-4 relative, bf16 inputs within 2e-2 of the f32 CPU run on the same (rounded)
// inputs. Also: per-device code sees its device, device mismatches and captured in-process
// collectives are clear errors. Every test skips without a GPU.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "shardmap/sharding.h"
#include "tensor/cuda/graph.h"
#include "tensor/cuda/runtime.h"
#include "tensor/error.h"
#include "tensor/ops/elementwise.h"
#include "tensor/ops/shape_ops.h"
#include "tests/gpu_mlp_program.h"
#include "tensor/testing/test_util.h"

namespace shardmap {
namespace {

using gpu_testing::MlpInputs;
using gpu_testing::MlpSizes;
using gpu_testing::NearReference;
using gpu_testing::RunMlpStep;

const char* kNames[] = {"x", "target", "w1", "b1", "w2", "b2"};

void ExpectSameStep(const ShardMapGrads& got, const ShardMapGrads& ref, double tol) {
  ASSERT_EQ(got.outputs.size(), 1u);
  EXPECT_FALSE(got.outputs[0].is_cuda());  // the global view hands back host tensors
  EXPECT_TRUE(NearReference(got.outputs[0], ref.outputs[0], tol))
      << "loss " << got.outputs[0].item() << " vs " << ref.outputs[0].item();
  ASSERT_EQ(got.grads.size(), ref.grads.size());
  for (size_t k = 0; k < ref.grads.size(); ++k) {
    EXPECT_FALSE(got.grads[k].is_cuda());
    EXPECT_TRUE(NearReference(got.grads[k], ref.grads[k], tol)) << "gradient of " << kNames[k];
  }
}

// The CPU run of the same step (f32 copies of the inputs).
ShardMapGrads CpuReference(const Mesh& mesh, const std::vector<Tensor>& in) {
  std::vector<Tensor> f32;
  for (const Tensor& t : in) f32.push_back(t.dtype() == DType::kF32 ? t : Cast(t, DType::kF32));
  absl::StatusOr<ShardMapGrads> r = RunMlpStep(mesh, f32, DevicePlacement::Cpu());
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : ShardMapGrads{};
}

void CheckMode(const Mesh& mesh, const DevicePlacement& placement, DType dtype, double tol) {
  SCOPED_TRACE(absl::StrCat(mesh.ShortString(), " on ", placement.ToString(), " ",
                            DTypeName(dtype)));
  std::vector<Tensor> in = MlpInputs(MlpSizes{}, dtype);
  ShardMapGrads ref = CpuReference(mesh, in);
  absl::StatusOr<ShardMapGrads> got = RunMlpStep(mesh, in, placement);
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectSameStep(*got, ref, tol);
}

TEST(GpuMlpTest, SharedGpuTp3F32) {
  SKIP_WITHOUT_GPU();
  CheckMode(*Mesh::Create({{"dp", 1}, {"tp", 3}}), DevicePlacement::SharedGpu(), DType::kF32,
            1e-4);
}

TEST(GpuMlpTest, SharedGpuDp2Tp2F32) {
  SKIP_WITHOUT_GPU();
  CheckMode(*Mesh::Create({{"dp", 2}, {"tp", 2}}), DevicePlacement::SharedGpu(), DType::kF32,
            1e-4);
}

TEST(GpuMlpTest, SharedGpuTp3Bf16) {
  SKIP_WITHOUT_GPU();
  CheckMode(*Mesh::Create({{"dp", 1}, {"tp", 3}}), DevicePlacement::SharedGpu(), DType::kBF16,
            2e-2);
}

TEST(GpuMlpTest, SharedGpuDp2Tp2Bf16) {
  SKIP_WITHOUT_GPU();
  CheckMode(*Mesh::Create({{"dp", 2}, {"tp", 2}}), DevicePlacement::SharedGpu(), DType::kBF16,
            2e-2);
}

TEST(GpuMlpTest, SharedGpuRepeatedCallsReuseStreams) {
  SKIP_WITHOUT_GPU();
  Mesh mesh = *Mesh::Create({{"dp", 1}, {"tp", 2}});
  SpmdOptions o;
  o.placement = DevicePlacement::SharedGpu();
  absl::StatusOr<std::vector<collectives::MemorySpace>> a = RankMemorySpaces(o, 2);
  absl::StatusOr<std::vector<collectives::MemorySpace>> b = RankMemorySpaces(o, 2);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE((*a)[0].stream, (*a)[1].stream);  // a stream per virtual rank
  EXPECT_EQ((*a)[0].stream, (*b)[0].stream);  // the same ones on the next call
  std::vector<Tensor> in = MlpInputs(MlpSizes{});
  ShardMapGrads ref = CpuReference(mesh, in);
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<ShardMapGrads> got = RunMlpStep(mesh, in, DevicePlacement::SharedGpu());
    ASSERT_TRUE(got.ok()) << got.status();
    ExpectSameStep(*got, ref, 1e-4);
  }
}

TEST(GpuMlpTest, GpuPerRank) {
  SKIP_WITHOUT_GPU();
  const int gpus = cuda::DeviceCount();
  if (gpus < 2) GTEST_SKIP() << "needs >= 2 GPUs, found " << gpus;
  const int tp = gpus >= 4 ? 4 : gpus;
  CheckMode(*Mesh::Create({{"dp", 1}, {"tp", tp}}), DevicePlacement::GpuPerRank(), DType::kF32,
            1e-4);
  if (gpus >= 4) {
    CheckMode(*Mesh::Create({{"dp", 2}, {"tp", 2}}), DevicePlacement::GpuPerRank(), DType::kF32,
              1e-4);
  }
  CheckMode(*Mesh::Create({{"dp", 1}, {"tp", 2}}), DevicePlacement::GpuPerRank(), DType::kBF16,
            2e-2);
}

TEST(GpuMlpTest, RanksSeeTheirDeviceAndStream) {
  SKIP_WITHOUT_GPU();
  Mesh mesh = *Mesh::Create({{"tp", 3}});
  SpmdOptions o;
  o.placement = DevicePlacement::SharedGpu();
  std::vector<cuda::StreamHandle> streams(3);
  absl::Status s = RunSpmd(
      mesh,
      [&](RankContext& ctx) {
        if (ctx.device() != Device::Cuda(0)) OpFail("rank on ", ctx.device().ToString());
        streams[ctx.rank()] = cuda::CurrentStream(0);
        if (streams[ctx.rank()] != ctx.world().memory_space().stream) {
          OpFail("thread not bound to the communicator's stream");
        }
        // Per-device code: tensors on ctx.device(); a collective over them.
        Value x(Tensor::Full({4}, ctx.rank() + 1.0, DType::kF32, ctx.device()),
                SpmdType(1, AxisType::V()));
        Value y = all_reduce(reinterpret(x, "tp"), "tp");
        if (!y.tensor.is_cuda()) OpFail("all_reduce output not on the GPU");
        if (y.tensor.To(Device::Cpu()).ToVector<float>() != std::vector<float>(4, 6.0f)) {
          OpFail("wrong all_reduce result");
        }
      },
      o);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_NE(streams[0], streams[1]);
  EXPECT_NE(streams[1], streams[2]);
}

TEST(GpuMlpTest, RanksSeeDeviceTensorsTheCallerJustMade) {
  // Made on this (unbound) thread's stream right before RunSpmd: the host->device copy (several
  // staging chunks, the last still in flight when To returns) and the fill are asynchronous, and
  // the ranks read the tensors on streams of their own.
  SKIP_WITHOUT_GPU();
  const int64_t n = (int64_t{24} << 20) + 3;
  std::vector<float> host(n);
  for (int64_t i = 0; i < n; ++i) host[i] = static_cast<float>(i % 1000);
  const std::vector<float> want_sum_ends = {host[0] + 7.0f, host[n - 1] + 7.0f};
  SpmdOptions o;
  o.placement = DevicePlacement::SharedGpu();
  for (int iter = 0; iter < 3; ++iter) {
    Tensor big = Tensor::FromVector<float>({n}, host).To(Device::Cuda(0));
    Tensor sevens = Tensor::Full({n}, 7.0, DType::kF32, Device::Cuda(0));
    std::vector<std::vector<float>> got(2);
    absl::Status s = RunSpmd(
        *Mesh::Create({{"tp", 2}}),
        [&](RankContext& ctx) {
          Tensor sum = Add(big, sevens);  // on the rank's stream
          got[ctx.rank()] = {static_cast<float>(sum.at(0)), static_cast<float>(sum.at(n - 1))};
          if (sum.To(Device::Cpu()).ToVector<float>()[n / 2] != host[n / 2] + 7.0f) {
            OpFail("rank ", ctx.rank(), " read a stale element");
          }
        },
        o);
    ASSERT_TRUE(s.ok()) << s;
    for (int r = 0; r < 2; ++r) EXPECT_EQ(got[r], want_sum_ends) << "iteration " << iter;
  }
}

TEST(GpuMlpTest, CpuTensorInGpuRankCollectiveIsAnError) {
  SKIP_WITHOUT_GPU();
  SpmdOptions o;
  o.placement = DevicePlacement::SharedGpu();
  absl::Status s = RunSpmd(
      *Mesh::Create({{"tp", 2}}),
      [&](RankContext&) {
        Value x(Tensor::Ones({4}), SpmdType(1, AxisType::P()));  // host tensor
        all_reduce(x, "tp");
      },
      o);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("lives on cpu"), std::string::npos) << s;
  EXPECT_NE(s.message().find("cuda:0"), std::string::npos) << s;
}

TEST(GpuMlpTest, LocalViewChecksShardDevices) {
  SKIP_WITHOUT_GPU();
  Mesh mesh = *Mesh::Create({{"dp", 1}, {"tp", 2}});
  std::vector<Tensor> in = MlpInputs(MlpSizes{});
  ShardMap f = gpu_testing::MlpShardMap(mesh, in[1].numel(), DevicePlacement::Cpu());
  ShardMapGrads ref = CpuReference(mesh, in);
  SpmdOptions o;
  o.placement = DevicePlacement::SharedGpu();
  // Host shards: a clear error.
  absl::Status bad = RunSpmd(
      mesh,
      [&](RankContext& ctx) {
        std::vector<Tensor> local;
        for (size_t k = 0; k < in.size(); ++k) {
          local.push_back(ShardOf(in[k], mesh, f.in_specs()[k], ctx.rank()));
        }
        f.CallLocal(local);
      },
      o);
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("lives on cpu"), std::string::npos) << bad;
  EXPECT_NE(bad.message().find("To(ctx.device())"), std::string::npos) << bad;
  // Shards moved to the rank's device: the local gradients match the global CPU run.
  std::vector<Tensor> w1_grads(2);
  absl::Status ok = RunSpmd(
      mesh,
      [&](RankContext& ctx) {
        std::vector<Tensor> local;
        for (size_t k = 0; k < in.size(); ++k) local.push_back(f.LocalInput(in[k], k, ctx));
        LocalGrads g = value_and_grad(f).CallLocal(local, /*reduce_partial_grads=*/true);
        w1_grads[ctx.rank()] = g.grads[2].tensor.To(Device::Cpu());
      },
      o);
  ASSERT_TRUE(ok.ok()) << ok;
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(NearReference(w1_grads[r], ShardOf(ref.grads[2], mesh, P(None, "tp"), r), 1e-4));
  }
}

TEST(GpuMlpTest, CapturingInProcessCollectivesIsRefused) {
  SKIP_WITHOUT_GPU();
  SpmdOptions o;
  o.placement = DevicePlacement::SharedGpu();
  std::vector<std::string> errors(2);
  absl::Status s = RunSpmd(
      *Mesh::Create({{"tp", 2}}),
      [&](RankContext& ctx) {
        Value x(Tensor::Ones({4}, DType::kF32, ctx.device()), SpmdType(1, AxisType::P()));
        cuda::CudaGraph graph(0);
        absl::Status c = graph.Capture([&] { all_reduce(x, "tp"); });
        errors[ctx.rank()] = std::string(c.message());
        // Eager still works afterwards.
        Value y = all_reduce(x, "tp");
        if (y.tensor.To(Device::Cpu()).ToVector<float>() != std::vector<float>(4, 2.0f)) {
          OpFail("wrong eager all_reduce after the refused capture");
        }
      },
      o);
  ASSERT_TRUE(s.ok()) << s;
  for (const std::string& e : errors) {
    EXPECT_NE(e.find("cannot be captured in a CUDA graph"), std::string::npos) << e;
    EXPECT_NE(e.find("NCCL"), std::string::npos) << e;
  }
}

}  // namespace
}  // namespace shardmap
