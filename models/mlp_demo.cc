// README demo: trains a 2-D (dp x tp) Megatron MLP on 8 simulated devices (mesh dp:2 x tp:4,
// in-process backend) with SGD, and checks every step against the unsharded model computed
// independently on one device (plain tensor ops, hand-written backward).
//
//   bazel run //models:mlp_demo
//
// Exits 1 if a sharded loss or the final weights disagree with the unsharded run, if the loss
// does not decrease, or if the collectives differ from one all_reduce over tp each way.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <string>

#include "models/parallel_mlp.h"
#include "shardmap/mesh.h"
#include "shardmap/partition_spec.h"
#include "shardmap/visualize.h"

namespace shardmap {
namespace {

constexpr int kSteps = 5;
constexpr double kLr = 0.5;
constexpr double kLossTol = 1e-5;   // f32, relative to max(1, |loss|)
constexpr double kParamTol = 1e-5;

int Main() {
  absl::StatusOr<Mesh> mesh = Mesh::Create({{"dp", 2}, {"tp", 4}});
  if (!mesh.ok()) {
    std::cerr << mesh.status() << "\n";
    return 1;
  }
  MlpConfig cfg;
  MlpParams sharded = InitMlp(cfg);   // the same init for both runs
  MlpParams reference = sharded;
  MlpBatch batch = SyntheticBatch(cfg);

  std::cout << "== 2-D Megatron MLP: y = all_reduce_tp(gelu(x@w1 + b1) @ w2) + b2, MSE loss\n"
            << "   batch " << cfg.batch << ", d_model " << cfg.d_model << ", d_hidden "
            << cfg.d_hidden << ", " << kSteps << " SGD steps, lr " << kLr << "\n\n"
            << mesh->ToString() << "\n";
  const char* names[] = {"x", "target", "w1", "b1", "w2", "b2"};
  const Tensor* shapes[] = {&batch.x, &batch.target, &sharded.w1, &sharded.b1, &sharded.w2,
                            &sharded.b2};
  std::vector<PartitionSpec> specs = MlpInSpecs();
  for (int k : {0, 2, 3, 4, 5}) {
    std::cout << names[k] << ": " << VisualizeSharding(*mesh, specs[k], shapes[k]->shape())
              << "\n";
  }

  bool ok = true;
  double first_loss = 0, last_loss = 0;
  for (int step = 0; step < kSteps; ++step) {
    MlpTrace trace;
    absl::StatusOr<ShardedStep> s =
        ShardedTrainStep(*mesh, sharded, batch, step == 0 ? &trace : nullptr);
    if (!s.ok()) {
      std::cerr << "sharded step " << step << " failed: " << s.status() << "\n";
      return 1;
    }
    ReferenceStep r = ReferenceTrainStep(reference, batch);
    if (step == 0) {
      std::cout << "SPMD types of the per-device values (rank 0, step 0):\n";
      for (const auto& [name, type] : trace.types) {
        std::printf("  %-32s %s\n", name.c_str(), type.c_str());
      }
      std::cout << "  (weight gradients are P on dp; value_and_grad(shard_map) sums them at the\n"
                   "   boundary on the host, so no dp collective is logged)\n\n";
    }
    const double diff = s->loss - r.loss;
    const bool agree = std::fabs(diff) <= kLossTol * std::max(1.0, std::fabs(r.loss));
    ok = ok && agree;
    std::printf("step %d  loss sharded %.7f  unsharded %.7f  diff %+.1e %s  %s\n", step,
                s->loss, r.loss, diff, agree ? "ok" : "MISMATCH",
                SummarizeCollectives(*mesh, s->log).c_str());
    if (CountCollectives(*mesh, s->log, "all_reduce", "tp", false) != 1 ||
        CountCollectives(*mesh, s->log, "all_reduce", "tp", true) != 1 || s->log.size() != 2) {
      std::printf("  unexpected collectives (want one all_reduce over tp each way)\n");
      ok = false;
    }
    if (step == 0) first_loss = s->loss;
    last_loss = s->loss;
    SgdUpdate(sharded, s->grads, kLr);
    SgdUpdate(reference, r.grads, kLr);
  }
  const double wdiff = MaxParamDiff(sharded, reference);
  std::printf("\nfinal weights: max |sharded - unsharded| = %.1e %s\n", wdiff,
              wdiff <= kParamTol ? "ok" : "MISMATCH");
  std::printf("loss %.5f -> %.5f %s\n", first_loss, last_loss,
              last_loss < first_loss ? "(decreasing)" : "(NOT decreasing)");
  ok = ok && wdiff <= kParamTol && last_loss < first_loss;
  std::printf("%s\n", ok ? "PASS: the sharded run matches the unsharded one"
                         : "FAIL: the sharded run does not match the unsharded one");
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace shardmap

int main() { return shardmap::Main(); }
