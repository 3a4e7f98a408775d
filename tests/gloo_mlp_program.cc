// The Megatron MLP training steps (examples/mlp/parallel_mlp.h: MegatronMlp + MseLossShare, SGD on the
// local shards) in the local view, one process per rank over the Gloo backend, started by
// collectives/launch (or torchrun / srun). Each process also runs the same local-view program on
// all ranks in-process (threads) and checks that its rank's losses, gradients and updated weight
// shards agree with the in-process rank's in f64 to 1e-12 relative (they are bitwise equal:
// both backends reduce in rank order with the same kernel).
//
//   collectives/launch --nproc_per_node=4 -- tests/gloo_mlp_program --dp=2   # mesh dp:2 x tp:2
//
// Prints "gloo_mlp ok: rank R of N ..." and exits 0 on a match, 1 on a mismatch or error.
// --die_rank=R: rank R kills itself (SIGKILL) before step 1's collectives, for failure tests;
// the others must fail naming it. --reorder_rank=R: before training, every rank reduces over tp
// then dp, and then again with rank R reducing over dp first: the ranks must fail naming both
// calls (the call tags travel in Gloo's call descriptors), never train on wrong sums.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "autograd/value_and_grad.h"
#include "collectives/gloo_communicator.h"
#include "examples/mlp/parallel_mlp.h"
#include "shardmap/collective_ops.h"
#include "shardmap/context.h"
#include "shardmap/shard_map.h"
#include "tensor/ops/elementwise.h"
#include "tensor/ops/shape_ops.h"

ABSL_FLAG(int, dp, 1, "data-parallel size; tensor-parallel size = world size / dp");
ABSL_FLAG(int, steps, 3, "SGD steps");
ABSL_FLAG(int, die_rank, -1, "this rank SIGKILLs itself before step 1 (failure tests)");
ABSL_FLAG(int, timeout_s, 60, "Gloo timeout per call, seconds");
ABSL_FLAG(int, reorder_rank, -1,
          "this rank issues its second pair of all_reduces over dp then tp, the others over tp "
          "then dp (agreement tests)");

namespace shardmap {
namespace {

constexpr double kLr = 0.5;
constexpr double kTol = 1e-12;

// Per rank: the loss share of every step, then the local gradient and weight shards.
struct LocalRun {
  std::vector<double> losses;
  std::vector<Tensor> grads;    // last step's gradients of w1, b1, w2, b2
  std::vector<Tensor> weights;  // w1, b1, w2, b2 after all steps
};

ShardMap MlpShardMap(const Mesh& mesh, int64_t count) {
  ShardFn fn = [count](const std::vector<Value>& in) -> std::vector<Value> {
    Value y = MegatronMlp(in[0], in[2], in[3], in[4], in[5], "tp");
    return {MseLossShare(y, in[1], count)};
  };
  ShardMapOptions o;
  o.input_names = {"x", "target", "w1", "b1", "w2", "b2"};
  o.output_names = {"loss"};
  return shard_map(fn, mesh, MlpInSpecs(), {P().Unreduced({"dp"})}, o);
}

LocalRun Train(RankContext& ctx, const ShardMap& f, const std::vector<Tensor>& global,
               int steps, int die_rank) {
  std::vector<Tensor> local;
  for (size_t k = 0; k < global.size(); ++k) local.push_back(f.LocalInput(global[k], k, ctx));
  LocalRun run;
  for (int step = 0; step < steps; ++step) {
    if (step == 1 && ctx.rank() == die_rank) {
      std::fprintf(stderr, "rank %d: killing itself (--die_rank)\n", die_rank);
      std::fflush(stderr);
      ::kill(::getpid(), SIGKILL);
    }
    LocalGrads g = value_and_grad(f).CallLocal(local, /*reduce_partial_grads=*/true);
    run.losses.push_back(g.outputs[0].tensor.item());
    run.grads.clear();
    for (size_t k = 2; k < local.size(); ++k) {
      run.grads.push_back(g.grads[k].tensor);
      local[k] = Sub(local[k], MulScalar(g.grads[k].tensor, kLr));
    }
  }
  run.weights.assign(local.begin() + 2, local.end());
  return run;
}

// max |a - b| / max(|b|, tiny).
double RelDiff(const Tensor& a, const Tensor& b) {
  std::vector<double> x = a.ToVector<double>(), y = b.ToVector<double>();
  if (x.size() != y.size()) return INFINITY;
  double m = 0, scale = 1e-300;
  for (size_t i = 0; i < x.size(); ++i) {
    m = std::max(m, std::fabs(x[i] - y[i]));
    scale = std::max(scale, std::fabs(y[i]));
  }
  return m / scale;
}

int Main() {
  collectives::GlooOptions options;
  options.timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout_s));
  absl::StatusOr<std::unique_ptr<collectives::Communicator>> comm =
      collectives::CreateGlooCommunicatorFromEnv(options);
  if (!comm.ok()) {
    std::fprintf(stderr, "gloo_mlp_program: %s\n", comm.status().ToString().c_str());
    return 1;
  }
  const int n = (*comm)->size();
  const int me = (*comm)->rank();
  const int dp = absl::GetFlag(FLAGS_dp);
  if (dp < 1 || n % dp != 0) {
    std::fprintf(stderr, "gloo_mlp_program: --dp=%d does not divide the world size %d\n", dp, n);
    return 1;
  }
  absl::StatusOr<Mesh> mesh = Mesh::Create({{"dp", dp}, {"tp", n / dp}});
  if (!mesh.ok()) {
    std::fprintf(stderr, "gloo_mlp_program: %s\n", mesh.status().ToString().c_str());
    return 1;
  }
  if (const int reorder = absl::GetFlag(FLAGS_reorder_rank); reorder >= 0) {
    absl::Status s = RunOnCommunicator(**comm, *mesh, [&](RankContext& ctx) {
      auto sum = [](const Value& x, const char* axis) {
        return all_reduce(reinterpret(x, axis), axis);
      };
      Value x = vary(Value::Replicated(Tensor::Full({3}, ctx.rank() + 1.0, DType::kF64)),
                     ctx.mesh().axis_names());
      (void)sum(sum(x, "tp"), "dp");  // the same order on every rank: both groups exist
      (void)(ctx.rank() == reorder ? sum(sum(x, "dp"), "tp") : sum(sum(x, "tp"), "dp"));
    });
    std::fprintf(stderr, "gloo_mlp_program: rank %d: reorder: %s\n", me, s.ToString().c_str());
    return s.ok() ? 0 : 1;
  }
  const MlpConfig cfg;  // batch 8, d_model 16, d_hidden 32: divisible by dp <= 2, tp <= 4
  const MlpParams p = InitMlp(cfg);
  const MlpBatch batch = SyntheticBatch(cfg);
  std::vector<Tensor> global;
  for (const Tensor& t : {batch.x, batch.target, p.w1, p.b1, p.w2, p.b2}) {
    global.push_back(Cast(t, DType::kF64));
  }
  const ShardMap f = MlpShardMap(*mesh, batch.target.numel());
  const int steps = absl::GetFlag(FLAGS_steps);
  const int die_rank = absl::GetFlag(FLAGS_die_rank);
  if (steps < 1) {
    std::fprintf(stderr, "gloo_mlp_program: --steps must be >= 1, got %d\n", steps);
    return 1;
  }

  LocalRun gloo;
  absl::Status s = RunOnCommunicator(**comm, *mesh, [&](RankContext& ctx) {
    gloo = Train(ctx, f, global, steps, die_rank);
  });
  if (!s.ok()) {
    std::fprintf(stderr, "gloo_mlp_program: rank %d: %s\n", me, s.ToString().c_str());
    return 1;
  }
  LocalRun in_process;
  s = RunSpmd(*mesh, [&](RankContext& ctx) {
    LocalRun r = Train(ctx, f, global, steps, /*die_rank=*/-1);
    if (ctx.rank() == me) in_process = std::move(r);
  });
  if (!s.ok()) {
    std::fprintf(stderr, "gloo_mlp_program: in-process run: %s\n", s.ToString().c_str());
    return 1;
  }
  double worst = 0;
  bool bitwise = true;
  for (int i = 0; i < steps; ++i) {
    const double d = std::fabs(gloo.losses[i] - in_process.losses[i]) /
                     std::max(1e-300, std::fabs(in_process.losses[i]));
    worst = std::max(worst, d);
    bitwise = bitwise && gloo.losses[i] == in_process.losses[i];
  }
  const char* names[] = {"w1", "b1", "w2", "b2"};
  for (int k = 0; k < 4; ++k) {
    for (const auto& [a, b, what] : {std::tuple{gloo.grads[k], in_process.grads[k], "gradient"},
                                     std::tuple{gloo.weights[k], in_process.weights[k], "weight"}}) {
      const double d = RelDiff(a, b);
      if (d > kTol) {
        std::fprintf(stderr, "gloo_mlp_program: rank %d: %s shard of %s differs by %g\n", me,
                     what, names[k], d);
        return 1;
      }
      worst = std::max(worst, d);
      bitwise = bitwise && d == 0;
    }
  }
  if (worst > kTol) {
    std::fprintf(stderr, "gloo_mlp_program: rank %d: losses differ by %g\n", me, worst);
    return 1;
  }
  std::printf("gloo_mlp ok: rank %d of %d (dp=%d, tp=%d), %d f64 steps, loss share %.6f -> %.6f, "
              "max rel diff to in-process %g%s\n",
              me, n, dp, n / dp, steps, gloo.losses.front(), gloo.losses.back(), worst,
              bitwise ? " (bitwise equal)" : "");
  return 0;
}

}  // namespace
}  // namespace shardmap

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return shardmap::Main();
}
