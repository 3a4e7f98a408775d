// README demo: trains a 2-D (dp x tp) Megatron MLP on simulated devices (default mesh dp:2 x tp:4,
// in-process backend) with SGD, and checks every step against the unsharded model computed
// independently on one device (plain tensor ops, hand-written backward).
//
//   bazel run //examples/mlp:mlp_demo                      # then the same run in bf16 mixed precision
//   bazel run //examples/mlp:mlp_demo -- --precision=fp16  # or f16 (with a dynamic loss scaler), f32,
//                                                    # none (skip the mixed-precision section)
//   bazel run //examples/mlp:mlp_demo -- --mesh=dp=3,tp=2 --batch=12 --d_hidden=10 --steps=8
//   bazel run //examples/mlp:mlp_demo -- --help
//
// Exits 1 if a sharded loss or the final weights disagree with the unsharded run, if the loss
// does not decrease, or if the collectives differ from one all_reduce over tp each way (also
// logged on a size-1 axis); 2 on a bad flag, with a message saying which and why. The mixed-precision section
// (examples/mlp/mixed_mlp.h) is printed for comparison and does not change the exit code.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "base/command_line.h"
#include "absl/flags/flag.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "examples/mlp/mixed_mlp.h"
#include "models/parallel/mixed_precision.h"
#include "examples/mlp/parallel_mlp.h"
#include "shardmap/mesh.h"
#include "shardmap/partition_spec.h"
#include "shardmap/visualize.h"

ABSL_FLAG(std::string, mesh, "dp=2,tp=4",
          "the device mesh: sizes of the axes dp (data parallel, shards the batch) and tp "
          "(tensor parallel, shards d_hidden), e.g. dp=2,tp=4; one simulated device per rank");
ABSL_FLAG(int64_t, batch, 8, "rows of the batch; a multiple of the dp size");
ABSL_FLAG(int64_t, d_model, 16, "model width (input and output of the block)");
ABSL_FLAG(int64_t, d_hidden, 32, "hidden width of the block; a multiple of the tp size");
ABSL_FLAG(int, steps, 5, "SGD steps (>= 2: the demo checks that the loss decreases)");
ABSL_FLAG(double, lr, 0.5, "SGD learning rate (> 0)");
ABSL_FLAG(uint64_t, seed, 1234, "seed of the weights and the synthetic batch");
ABSL_FLAG(std::string, precision, "bf16",
          "the mixed-precision run printed after the f32 check: bf16, fp16, f32 or none");

namespace shardmap {
namespace {

constexpr double kLossTol = 1e-5;   // f32, relative to max(1, |loss|)
constexpr double kParamTol = 1e-5;

// The same SGD run with f32 master weights and low-precision compute, next to the f32 losses.
void MixedSection(const Mesh& mesh, const MlpConfig& cfg, const MlpBatch& batch, int steps,
                  double lr, const PrecisionPolicy& pol, const std::vector<double>& f32_losses,
                  const MlpParams& f32_final) {
  std::cout << "\n== mixed precision: " << pol.ToString() << "\n";
  MlpParams p = InitMlp(cfg);
  const bool f16 = pol.compute == DType::kF16;
  LossScaler scaler({.init_scale = 65536.0, .growth_interval = 1000});
  double worst = 0;
  for (int step = 0; step < steps; ++step) {
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
    if (take) SgdUpdate(p, MlpFromNamed(g), lr);
  }
  double wmax = 0;
  for (const Tensor* t : {&f32_final.w1, &f32_final.b1, &f32_final.w2, &f32_final.b2}) {
    for (int64_t i = 0; i < t->numel(); ++i) wmax = std::max(wmax, std::fabs(t->at(i)));
  }
  std::printf("loss tracks f32 within %.1e (relative); final master weights (%s) within %.1e of "
              "f32 (relative to max |w|)\n",
              worst, DTypeName(p.w1.dtype()), MaxParamDiff(p, f32_final) / wmax);
}

// "dp=2,tp=4" -> a mesh with exactly the axes dp and tp (in that order), each >= 1.
absl::StatusOr<Mesh> ParseMesh(const std::string& text) {
  int dp = 0, tp = 0;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    std::pair<std::string, std::string> kv = absl::StrSplit(part, absl::MaxSplits('=', 1));
    int size = 0;
    if (!absl::SimpleAtoi(kv.second, &size) || size < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--mesh=", text, ": '", part, "' is not axis=size with a size >= 1 (e.g. dp=2,tp=4)"));
    }
    int* slot = kv.first == "dp" ? &dp : kv.first == "tp" ? &tp : nullptr;
    if (slot == nullptr || *slot != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--mesh=", text, ": axis '", kv.first,
          "' is unknown or repeated; the demo's model uses exactly the axes dp and tp"));
    }
    *slot = size;
  }
  if (dp == 0 || tp == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--mesh=", text, ": name both axes, dp and tp (e.g. dp=2,tp=4 or dp=1,tp=3)"));
  }
  constexpr int kMaxRanks = 64;  // one thread per simulated device
  if (static_cast<int64_t>(dp) * tp > kMaxRanks) {
    return absl::InvalidArgumentError(absl::StrCat("--mesh=", text, ": ", int64_t{dp} * tp,
                                                   " simulated devices; at most ", kMaxRanks));
  }
  return Mesh::Create({{"dp", dp}, {"tp", tp}});
}

// The sizes from the flags, checked against the mesh: every rank gets a whole, non-empty shard.
absl::StatusOr<MlpConfig> ConfigFromFlags(const Mesh& mesh) {
  MlpConfig cfg;
  cfg.batch = absl::GetFlag(FLAGS_batch);
  cfg.d_model = absl::GetFlag(FLAGS_d_model);
  cfg.d_hidden = absl::GetFlag(FLAGS_d_hidden);
  cfg.seed = absl::GetFlag(FLAGS_seed);
  const int dp = mesh.axis_size(0), tp = mesh.axis_size(1);
  constexpr int64_t kMax = 1 << 14;  // keeps the unsharded reference (naive loops) quick
  for (auto [name, v] : {std::pair<const char*, int64_t>{"batch", cfg.batch},
                         {"d_model", cfg.d_model},
                         {"d_hidden", cfg.d_hidden}}) {
    if (v < 1 || v > kMax) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, "=", v, ": must be between 1 and ", kMax));
    }
  }
  if (cfg.batch % dp != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--batch=", cfg.batch, " is not a multiple of dp=", dp, ": use e.g. --batch=", dp * 4));
  }
  if (cfg.d_hidden % tp != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--d_hidden=", cfg.d_hidden,
                                                   " is not a multiple of tp=", tp,
                                                   ": use e.g. --d_hidden=", tp * 8));
  }
  return cfg;
}

int Main(const Mesh& mesh_value, const MlpConfig& cfg, int steps, double lr,
         const PrecisionPolicy* mixed) {
  const Mesh* mesh = &mesh_value;
  MlpParams sharded = InitMlp(cfg);   // the same init for both runs
  MlpParams reference = sharded;
  MlpBatch batch = SyntheticBatch(cfg);

  std::cout << "== 2-D Megatron MLP: y = all_reduce_tp(gelu(x@w1 + b1) @ w2) + b2, MSE loss\n"
            << "   batch " << cfg.batch << ", d_model " << cfg.d_model << ", d_hidden "
            << cfg.d_hidden << ", " << steps << " SGD steps, lr " << lr << "\n\n"
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
  for (int step = 0; step < steps; ++step) {
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
    SgdUpdate(sharded, s->grads, lr);
    SgdUpdate(reference, r.grads, lr);
  }
  const double wdiff = MaxParamDiff(sharded, reference);
  std::printf("\nfinal weights: max |sharded - unsharded| = %.1e %s\n", wdiff,
              wdiff <= kParamTol ? "ok" : "MISMATCH");
  std::printf("loss %.5f -> %.5f %s\n", first_loss, last_loss,
              last_loss < first_loss ? "(decreasing)" : "(NOT decreasing)");
  ok = ok && wdiff <= kParamTol && last_loss < first_loss;
  std::printf("%s\n", ok ? "PASS: the sharded run matches the unsharded one"
                         : "FAIL: the sharded run does not match the unsharded one");
  if (mixed != nullptr) MixedSection(*mesh, cfg, batch, steps, lr, *mixed, losses, sharded);
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace shardmap

int main(int argc, char** argv) {
  auto usage_error = [](const std::string& what) {
    std::cerr << "mlp_demo: " << what << " (see --help)\n";
    return 2;
  };
  if (absl::Status s = shardmap::base::ParseFlagsOnly(
          argc, argv,
          {.usage = "Trains a dp x tp Megatron MLP on simulated devices and checks every step "
                    "against the unsharded run.\n  mlp_demo [--mesh=dp=2,tp=4] [--batch=8] "
                    "[--d_model=16] [--d_hidden=32] [--steps=5] [--lr=0.5] "
                    "[--precision=bf16|fp16|f32|none]",
           .positional_hint = ""});
      !s.ok()) {
    return usage_error(std::string(s.message()));
  }
  absl::StatusOr<shardmap::Mesh> mesh = shardmap::ParseMesh(absl::GetFlag(FLAGS_mesh));
  if (!mesh.ok()) return usage_error(std::string(mesh.status().message()));
  absl::StatusOr<shardmap::MlpConfig> cfg = shardmap::ConfigFromFlags(*mesh);
  if (!cfg.ok()) return usage_error(std::string(cfg.status().message()));
  const int steps = absl::GetFlag(FLAGS_steps);
  if (steps < 2 || steps > 10000) {
    return usage_error(absl::StrCat("--steps=", steps, ": must be between 2 and 10000"));
  }
  const double lr = absl::GetFlag(FLAGS_lr);
  if (!(lr > 0) || !std::isfinite(lr)) {
    return usage_error(absl::StrCat("--lr=", lr, ": must be a finite number > 0"));
  }
  const std::string precision = absl::GetFlag(FLAGS_precision);
  shardmap::PrecisionPolicy pol;
  if (precision != "none" && !shardmap::PrecisionPolicy::FromName(precision, &pol)) {
    return usage_error(absl::StrCat("--precision=", precision,
                                    ": use bf16, fp16 (or f16), f32 (or fp32), or none"));
  }
  return shardmap::Main(*mesh, *cfg, steps, lr, precision == "none" ? nullptr : &pol);
}
