// One GPU per process over NCCL: the Megatron MLP step (tests/gpu_mlp_program.h) in the local
// view under RunOnCommunicator, each process on its GPU (the thread bound to the NCCL
// communicator's device and stream), against the same step on CPU ranks in this process.
// With --graph: the same step plus an in-place SGD update is captured in a CUDA graph (the NCCL
// all-reduces recorded into it) and replayed; replays must equal eager steps.
// Started by collectives/launch (see gpu_nccl_mlp_test). Exit 0 = match; 2 = no GPU/NCCL.
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "collectives/nccl_communicator.h"
#include "shardmap/sharding.h"
#include "tensor/cuda/graph.h"
#include "tensor/cuda/runtime.h"
#include "tensor/ops/elementwise.h"
#include "tensor/error.h"
#include "tensor/ops/shape_ops.h"
#include "tests/gpu_mlp_program.h"

namespace shardmap {
namespace {

using gpu_testing::MlpInputs;
using gpu_testing::MlpSizes;
using gpu_testing::RelDiff;

absl::Status CheckStep(collectives::Communicator& comm, DType dtype, double tol) {
  const int n = comm.size();
  Mesh mesh = *Mesh::Create({{"dp", 1}, {"tp", n}});
  std::vector<Tensor> in = MlpInputs(MlpSizes{}, dtype);
  std::vector<Tensor> in_f32;
  for (const Tensor& t : in) in_f32.push_back(dtype == DType::kF32 ? t : Cast(t, DType::kF32));
  absl::StatusOr<ShardMapGrads> ref = gpu_testing::RunMlpStep(mesh, in_f32, DevicePlacement::Cpu());
  if (!ref.ok()) return ref.status();
  ShardMap f = gpu_testing::MlpShardMap(mesh, in[1].numel(), DevicePlacement::Cpu());
  return RunOnCommunicator(comm, mesh, [&](RankContext& ctx) {
    if (!ctx.device().is_cuda()) OpFail("the NCCL rank runs on ", ctx.device().ToString());
    if (cuda::CurrentStream(ctx.device().index) != comm.memory_space().stream) {
      OpFail("the rank thread is not bound to the communicator's stream");
    }
    std::vector<Tensor> local;
    for (size_t k = 0; k < in.size(); ++k) local.push_back(f.LocalInput(in[k], k, ctx));
    LocalGrads g = value_and_grad(f).CallLocal(local, /*reduce_partial_grads=*/true);
    const double dl = RelDiff(g.outputs[0].tensor, ref->outputs[0]);
    if (dl > tol) OpFail(DTypeName(dtype), " loss differs from the CPU run by ", dl);
    for (size_t k = 0; k < in.size(); ++k) {
      Tensor want = ShardOf(ref->grads[k], mesh, f.in_specs()[k], ctx.rank());
      const double dg = RelDiff(g.grads[k].tensor, want);
      if (dg > tol) {
        OpFail(DTypeName(dtype), " gradient of ", f.InputName(k), " differs by ", dg);
      }
    }
  });
}

// Captured vs eager: local shards of the weights updated in place by SGD, 4 steps.
absl::Status CheckGraphStep(collectives::Communicator& comm) {
  const int n = comm.size();
  Mesh mesh = *Mesh::Create({{"dp", 1}, {"tp", n}});
  std::vector<Tensor> in = MlpInputs(MlpSizes{});
  ShardMap f = gpu_testing::MlpShardMap(mesh, in[1].numel(), DevicePlacement::Cpu());
  return RunOnCommunicator(comm, mesh, [&](RankContext& ctx) {
    auto shards = [&] {
      std::vector<Tensor> local;
      for (size_t k = 0; k < in.size(); ++k) local.push_back(f.LocalInput(in[k], k, ctx));
      return local;
    };
    std::vector<Tensor> eager = shards(), graphed = shards();
    Tensor eager_loss, graphed_loss;
    auto step = [&](std::vector<Tensor>& local, Tensor& loss) {
      LocalGrads g = value_and_grad(f).CallLocal(local, /*reduce_partial_grads=*/true);
      loss = g.outputs[0].tensor;
      for (size_t k = 2; k < local.size(); ++k) {  // w1, b1, w2, b2
        AddInPlace(local[k], MulScalar(g.grads[k].tensor, -0.1));
      }
    };
    cuda::CudaGraph graph(ctx.device().index);
    absl::Status c = graph.Capture([&] { step(graphed, graphed_loss); });
    if (!c.ok()) throw OpError(c);
    for (int i = 0; i < 4; ++i) {
      step(eager, eager_loss);
      absl::Status r = graph.Replay();
      if (!r.ok()) throw OpError(r);
      const double dl = RelDiff(graphed_loss, eager_loss);
      if (dl > 1e-5) OpFail("graph step ", i, ": loss differs from eager by ", dl);
    }
    for (size_t k = 2; k < in.size(); ++k) {
      const double dw = RelDiff(graphed[k], eager[k]);
      if (dw > 1e-5) OpFail("graph steps: ", f.InputName(k), " differs from eager by ", dw);
    }
  });
}

int Main(bool graph) {
  if (!cuda::Available() || !collectives::NcclCompiledIn()) {
    std::fprintf(stderr, "gpu_nccl_mlp_check: no GPU or NCCL: %s\n",
                 cuda::UnavailableReason().c_str());
    return 2;
  }
  absl::StatusOr<std::unique_ptr<collectives::Communicator>> comm =
      collectives::CreateNcclCommunicatorFromEnv({});
  if (!comm.ok()) {
    std::fprintf(stderr, "gpu_nccl_mlp_check: %s\n", comm.status().ToString().c_str());
    return 1;
  }
  if (graph) {
    absl::Status s = CheckGraphStep(**comm);
    if (!s.ok()) {
      std::fprintf(stderr, "gpu_nccl_mlp_check --graph: rank %d: %s\n", (*comm)->rank(),
                   s.ToString().c_str());
      return 1;
    }
    std::printf("gpu_nccl_mlp_check graph ok: rank %d of %d\n", (*comm)->rank(),
                (*comm)->size());
    return 0;
  }
  for (auto [dtype, tol] : {std::pair{DType::kF32, 1e-4}, std::pair{DType::kBF16, 2e-2}}) {
    absl::Status s = CheckStep(**comm, dtype, tol);
    if (!s.ok()) {
      std::fprintf(stderr, "gpu_nccl_mlp_check: rank %d: %s\n", (*comm)->rank(),
                   s.ToString().c_str());
      return 1;
    }
  }
  std::printf("gpu_nccl_mlp_check ok: rank %d of %d\n", (*comm)->rank(), (*comm)->size());
  return 0;
}

}  // namespace
}  // namespace shardmap

int main(int argc, char** argv) {
  return shardmap::Main(argc > 1 && std::string(argv[1]) == "--graph");
}
