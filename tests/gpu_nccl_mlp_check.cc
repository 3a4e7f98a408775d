// One GPU per process over NCCL: the Megatron MLP step (tests/gpu_mlp_program.h) in the local
// view under RunOnCommunicator, each process on its GPU (the thread bound to the NCCL
// communicator's device and stream), against the same step on CPU ranks in this process.
// Started by collectives/launch (see gpu_nccl_mlp_test). Exit 0 = match; 2 = no GPU/NCCL.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "collectives/nccl_communicator.h"
#include "shardmap/sharding.h"
#include "tensor/cuda/runtime.h"
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

int Main() {
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

int main() { return shardmap::Main(); }
