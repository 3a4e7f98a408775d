// README demo: trains a 2-D (dp x tp) Megatron MLP on 8 simulated devices (mesh dp:2 x tp:4,
// in-process backend) with SGD, and checks every step against the unsharded model computed
// independently on one device (plain tensor ops, hand-written backward).
//
//   bazel run //models:mlp_demo                      # then the same run in bf16 mixed precision
//   bazel run //models:mlp_demo -- --precision=fp16  # or f16 (with a dynamic loss scaler), f32
//
// Exits 1 if a sharded loss or the final weights disagree with the unsharded run, if the loss
// does not decrease, or if the collectives differ from one all_reduce over tp each way. The
// mixed-precision section (models/mixed_mlp.h) is printed for comparison and does not change the
// exit code.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "models/mixed_mlp.h"
#include "models/mixed_precision.h"
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

// The same SGD run with f32 master weights and low-precision compute, next to the f32 losses.
void MixedSection(const Mesh& mesh, const MlpConfig& cfg, const MlpBatch& batch,
                  const PrecisionPolicy& pol, const std::vector<double>& f32_losses,
                  const MlpParams& f32_final) {
  std::cout << "\n== mixed precision: " << pol.ToString() << "\n";
  MlpParams p = InitMlp(cfg);
  const bool f16 = pol.compute == DType::kF16;
  LossScaler scaler({.init_scale = 65536.0, .growth_interval = 1000});
  double worst = 0;
  for (int step = 0; step < kSteps; ++step) {
    MlpTrace trace;
    MixedStepOptions o;
    o.trace = step == 0 ? &trace : nullptr;
    o.loss_scale = f16 ? scaler.scale() : 1.0;
    absl::StatusOr<MixedStep> s = MixedTrainStep(mesh, p, batch, pol, o);
    if (!s.ok()) {
      std::cout << "mixed step " << step << " failed: " << s.status() << "\n";
      return;
    }
    if (step == 0) {
      for (const auto& [name, type] : trace.types) {
        std::printf("  %-34s %s\n", name.c_str(), type.c_str());
      }
    }
    std::vector<NamedTensor> g = MlpNamed(s->grads);
    const bool take = f16 ? scaler.UnscaleAndCheck(g) : true;
    const double rel = std::fabs(s->loss - f32_losses[step]) / f32_losses[step];
    worst = std::max(worst, rel);
    std::printf("step %d  loss %s %.7f  f32 %.7f  rel diff %.1e%s\n", step,
                DTypeName(pol.compute), s->loss, f32_losses[step], rel,
                take ? "" : "  (skipped: non-finite grads)");
    if (step == 0) {
      std::printf("  collectives (rank 0, bytes sent):\n    %s\n",
                  SummarizeCollectiveBytes(mesh, s->log).c_str());
    }
    if (take) SgdUpdate(p, MlpFromNamed(g), kLr);
  }
  double wmax = 0;
  for (const Tensor* t : {&f32_final.w1, &f32_final.b1, &f32_final.w2, &f32_final.b2}) {
    for (int64_t i = 0; i < t->numel(); ++i) wmax = std::max(wmax, std::fabs(t->at(i)));
  }
  std::printf("loss tracks f32 within %.1e (relative); final master weights (%s) within %.1e of "
              "f32 (relative to max |w|)\n",
              worst, DTypeName(p.w1.dtype()), MaxParamDiff(p, f32_final) / wmax);
}

int Main(const PrecisionPolicy* mixed) {
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
  std::vector<double> losses;
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
    losses.push_back(s->loss);
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
  if (mixed != nullptr) MixedSection(*mesh, cfg, batch, *mixed, losses, sharded);
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace shardmap

int main(int argc, char** argv) {
  shardmap::PrecisionPolicy pol = shardmap::PrecisionPolicy::Bf16Mixed();
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--precision=", 0) != 0 ||
        !shardmap::PrecisionPolicy::FromName(a.substr(12), &pol)) {
      std::cerr << "usage: mlp_demo [--precision=bf16|fp16|f32]\n";
      return 2;
    }
  }
  return shardmap::Main(&pol);
}
