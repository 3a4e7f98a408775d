// Mixed-precision training of the 2-D (dp x tp) Megatron MLP (examples/mlp/mixed_mlp.h), on CPU:
//   (a) one bf16-mixed step against the f32 step on the same weights: loss and every gradient
//       within bf16 tolerance; gradients and master weights stay f32; the f32 policy reproduces
//       the f32 shard_map step and the unsharded reference;
//   (b) 20 AdamW steps: the bf16 loss curve tracks the f32 one and decreases;
//   (d) f16 with a dynamic LossScaler: an injected overflow skips the step and halves the scale;
//       a scale too large for f16's range backs off until the steps go through;
//   (e) the collective log: one all_reduce over tp each way carrying bf16 (half the bytes of f32),
//       gradient all_reduces over dp in f32; activation reduce in f32 is bitwise the same on the
//       in-process backend (it sums bf16 in f32 and rounds once).
// Meshes (dp, tp): (1,1), (1,3), (2,2), (2,3), (3,1), (3,4).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "examples/mlp/mixed_mlp.h"
#include "models/parallel/mixed_precision.h"
#include "models/components/optimizer.h"
#include "examples/mlp/parallel_mlp.h"
#include "examples/mlp/params_near.h"
#include "shardmap/mesh.h"
#include "tests/test_util.h"

namespace shardmap {
namespace {

// batch 12 and d_hidden 24 divide by every dp and tp below (incl. 3).
MlpConfig Config() {
  MlpConfig c;
  c.batch = 12;
  c.d_model = 16;
  c.d_hidden = 24;
  return c;
}

// max |a - b| / max |b|, for the printout; the checks use TensorsNearScaled.
double RelErr(const Tensor& a, const Tensor& b) {
  double scale = 1e-30;
  for (int64_t i = 0; i < b.numel(); ++i) scale = std::max(scale, std::fabs(b.at(i)));
  return testing::MaxAbsDiff(a, b) / scale;
}

// A deep copy: `MlpParams before = p` would share storage with p and follow its updates.
MlpParams Snapshot(const MlpParams& p) {
  return {p.w1.Clone(), p.b1.Clone(), p.w2.Clone(), p.b2.Clone()};
}

std::vector<std::pair<int, int>> Meshes() {
  return {{1, 1}, {1, 3}, {2, 2}, {2, 3}, {3, 1}, {3, 4}};
}

Mesh MakeMesh(int dp, int tp) { return *Mesh::Create({{"dp", dp}, {"tp", tp}}); }

class MixedMeshTest : public ::testing::TestWithParam<std::pair<int, int>> {
 protected:
  Mesh mesh() const { return MakeMesh(GetParam().first, GetParam().second); }
};

std::string MeshName(const ::testing::TestParamInfo<std::pair<int, int>>& info) {
  return absl::StrCat("dp", info.param.first, "_tp", info.param.second);
}

// ---- (a) one step ------------------------------------------------------------------------

TEST_P(MixedMeshTest, Bf16StepMatchesF32StepWithinBf16Tolerance) {
  MlpConfig cfg = Config();
  MlpParams p = InitMlp(cfg);
  MlpBatch batch = SyntheticBatch(cfg);
  absl::StatusOr<MixedStep> f32 = MixedTrainStep(mesh(), p, batch, PrecisionPolicy::Fp32());
  ASSERT_TRUE(f32.ok()) << f32.status();
  absl::StatusOr<MixedStep> bf = MixedTrainStep(mesh(), p, batch, PrecisionPolicy::Bf16Mixed());
  ASSERT_TRUE(bf.ok()) << bf.status();

  EXPECT_NEAR(bf->loss, f32->loss, 1e-2 * std::fabs(f32->loss));
  std::vector<NamedTensor> gb = MlpNamed(bf->grads), gf = MlpNamed(f32->grads);
  std::printf("  loss rel err %.2e; grad rel err", std::fabs(bf->loss - f32->loss) / f32->loss);
  for (size_t k = 0; k < gb.size(); ++k) {
    std::printf(" %s %.2e", gb[k].name.c_str(), RelErr(gb[k].tensor, gf[k].tensor));
  }
  std::printf("\n");
  for (size_t k = 0; k < gb.size(); ++k) {
    SCOPED_TRACE(gb[k].name);
    EXPECT_EQ(gb[k].tensor.dtype(), DType::kF32) << "master gradients are f32";
    EXPECT_EQ(gb[k].tensor.shape(), gf[k].tensor.shape());
    EXPECT_TRUE(testing::TensorsNearScaled(gb[k].tensor, gf[k].tensor, 1.5e-2));  // ~2 bf16 ulps; seen <= 9.7e-3
    EXPECT_FALSE(testing::TensorsBitwiseEqual(gb[k].tensor, gf[k].tensor))
        << "bf16 compute changes the numbers";
  }
  // The master weights were not touched (and are still f32).
  for (const NamedTensor& t : MlpNamed(p)) EXPECT_EQ(t.tensor.dtype(), DType::kF32);

  // The f32 policy is the f32 model: same as the shard_map step and the unsharded reference.
  absl::StatusOr<ShardedStep> sm = ShardedTrainStep(mesh(), p, batch);
  ASSERT_TRUE(sm.ok()) << sm.status();
  ReferenceStep ref = ReferenceTrainStep(p, batch);
  EXPECT_NEAR(f32->loss, sm->loss, 1e-6 * std::fabs(sm->loss));
  EXPECT_NEAR(f32->loss, ref.loss, 1e-6 * std::fabs(ref.loss));
  EXPECT_TRUE(testing::ParamsNear(f32->grads, sm->grads, 1e-6));
  EXPECT_TRUE(testing::ParamsNear(f32->grads, ref.grads, 1e-6));
}

TEST(MixedStepTest, ErasedTypesGiveBitwiseTheSameBf16Step) {
  MlpConfig cfg = Config();
  Mesh mesh = MakeMesh(2, 3);
  MixedStepOptions erased;
  erased.check = TypeCheck::kErased;
  for (const PrecisionPolicy& pol : {PrecisionPolicy::Bf16Mixed(), PrecisionPolicy::Fp16Mixed()}) {
    SCOPED_TRACE(pol.ToString());
    absl::StatusOr<MixedStep> a = MixedTrainStep(mesh, InitMlp(cfg), SyntheticBatch(cfg), pol);
    absl::StatusOr<MixedStep> b =
        MixedTrainStep(mesh, InitMlp(cfg), SyntheticBatch(cfg), pol, erased);
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(a->loss, b->loss);
    EXPECT_TRUE(testing::ParamsNear(a->grads, b->grads, 0));
    EXPECT_EQ(a->log.size(), b->log.size());
  }
}

TEST(MixedStepTest, RejectsLowPrecisionMasterWeights) {
  MlpConfig cfg = Config();
  MlpParams p = InitMlp(cfg);
  p.w2 = Tensor::Zeros(p.w2.shape(), DType::kBF16);
  absl::StatusOr<MixedStep> s =
      MixedTrainStep(MakeMesh(1, 2), p, SyntheticBatch(cfg), PrecisionPolicy::Bf16Mixed());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(std::string(s.status().message()).find("'w2'"), std::string::npos) << s.status();
}

TEST(MixedStepTest, TraceShowsBf16ActivationsAndAnF32Loss) {
  MlpConfig cfg = Config();
  MlpTrace trace;
  MixedStepOptions o;
  o.trace = &trace;
  absl::StatusOr<MixedStep> s = MixedTrainStep(MakeMesh(2, 3), InitMlp(cfg), SyntheticBatch(cfg),
                                               PrecisionPolicy::Bf16Mixed(), o);
  ASSERT_TRUE(s.ok()) << s.status();
  std::map<std::string, std::string> types(trace.types.begin(), trace.types.end());
  EXPECT_EQ(types["h = x@w1 + b1"], "bf16[6,8]{dp:S0,tp:S1}");
  EXPECT_EQ(types["yp = a@w2"], "bf16[6,16]{dp:S0,tp:P}");
  EXPECT_EQ(types["y = all_reduce(yp, tp) + b2"], "bf16[6,16]{dp:S0,tp:R}");
  EXPECT_EQ(types["loss = sum_partial((f32(y)-t)^2)/n"], "f32[]{dp:P,tp:R}");
}

// ---- (b) training ------------------------------------------------------------------------

TEST_P(MixedMeshTest, Bf16AdamWLossCurveTracksF32AndDecreases) {
  MlpConfig cfg = Config();
  MlpBatch batch = SyntheticBatch(cfg);
  constexpr int kSteps = 20;
  std::vector<double> curves[2];
  MlpParams finals[2];
  int i = 0;
  for (const PrecisionPolicy& pol : {PrecisionPolicy::Fp32(), PrecisionPolicy::Bf16Mixed()}) {
    MlpParams p = InitMlp(cfg);
    AdamW opt({.lr = 1e-2, .weight_decay = 0.01});
    absl::StatusOr<TrainLog> log = TrainMixedMlp(mesh(), p, batch, pol, opt, kSteps);
    ASSERT_TRUE(log.ok()) << log.status();
    curves[i] = log->losses;
    finals[i] = p;
    for (const NamedTensor& t : MlpNamed(p)) EXPECT_EQ(t.tensor.dtype(), DType::kF32);
    ++i;
  }
  const std::vector<double>& f = curves[0];
  const std::vector<double>& b = curves[1];
  ASSERT_EQ(b.size(), static_cast<size_t>(kSteps));
  double worst = 0;
  for (int s = 0; s < kSteps; ++s) worst = std::max(worst, std::fabs(b[s] - f[s]) / f[s]);
  std::printf("  loss f32 %.5f -> %.5f, bf16 %.5f -> %.5f, worst relative gap %.2e\n", f[0],
              f.back(), b[0], b.back(), worst);
  EXPECT_LE(worst, 0.03) << "bf16 curve vs f32 curve, worst relative gap";
  EXPECT_LT(b.back(), 0.5 * b.front()) << "bf16 training decreases the loss";
  EXPECT_LT(f.back(), 0.5 * f.front());
  // Mostly monotone: AdamW at this lr never jumps up by more than 1%.
  for (int s = 1; s < kSteps; ++s) EXPECT_LT(b[s], b[s - 1] * 1.01) << "step " << s;
  // The weights themselves stay close.
  EXPECT_TRUE(testing::TensorsNearScaled(finals[1].w1, finals[0].w1, 2e-2));
}

// ---- (d) f16 loss scaling ----------------------------------------------------------------

TEST_P(MixedMeshTest, F16InjectedOverflowSkipsTheStepAndHalvesTheScale) {
  MlpConfig cfg = Config();
  MlpParams p = InitMlp(cfg);
  const MlpParams before = Snapshot(p);
  MlpBatch batch = SyntheticBatch(cfg);
  batch.x = batch.x.Clone();
  batch.x.data<float>()[5] = 1e5f;  // beyond f16's 65504: inf after the cast to compute
  LossScaler scaler({.init_scale = 1024, .growth_interval = 3});
  AdamW opt({.lr = 1e-2});
  absl::StatusOr<TrainLog> log =
      TrainMixedMlp(mesh(), p, batch, PrecisionPolicy::Fp16Mixed(), opt, 1, &scaler);
  ASSERT_TRUE(log.ok()) << log.status();
  EXPECT_TRUE(log->skipped[0]);
  EXPECT_FALSE(std::isfinite(log->losses[0]));
  EXPECT_EQ(scaler.scale(), 512);
  EXPECT_EQ(scaler.skipped_steps(), 1);
  EXPECT_EQ(opt.steps(), 0);
  EXPECT_TRUE(testing::ParamsNear(p, before, 0))
      << "a skipped step leaves the master weights alone";

  // The clean batch: steps go through, and the scale grows after growth_interval good steps.
  absl::StatusOr<TrainLog> clean =
      TrainMixedMlp(mesh(), p, SyntheticBatch(cfg), PrecisionPolicy::Fp16Mixed(), opt, 4,
                    &scaler);
  ASSERT_TRUE(clean.ok()) << clean.status();
  EXPECT_EQ(std::count(clean->skipped.begin(), clean->skipped.end(), true), 0);
  EXPECT_EQ(opt.steps(), 4);
  EXPECT_EQ(scaler.scale(), 1024);
  EXPECT_EQ(scaler.good_steps(), 1);
}

TEST(MixedLossScalingTest, F16ScaleTooLargeBacksOffThenTracksF32) {
  // The scaled loss's cotangent reaches f16 in the backward pass: 2 (y - t) / n * scale exceeds
  // 65504 for scale 2^24, so the first steps overflow, are skipped and halve the scale.
  MlpConfig cfg = Config();
  Mesh mesh = MakeMesh(2, 3);
  MlpBatch batch = SyntheticBatch(cfg);
  MlpParams p16 = InitMlp(cfg), p32 = InitMlp(cfg);
  LossScaler scaler({.init_scale = 16777216.0, .growth_interval = 1000});
  AdamW o16({.lr = 1e-2}), o32({.lr = 1e-2});
  absl::StatusOr<TrainLog> l16 =
      TrainMixedMlp(mesh, p16, batch, PrecisionPolicy::Fp16Mixed(), o16, 16, &scaler);
  ASSERT_TRUE(l16.ok()) << l16.status();
  const int64_t skipped = std::count(l16->skipped.begin(), l16->skipped.end(), true);
  std::printf("  f16: %lld of 16 steps skipped, scale now %g\n", static_cast<long long>(skipped),
              scaler.scale());
  EXPECT_GE(skipped, 1);
  EXPECT_LT(skipped, 12);
  for (int64_t s = 0; s < skipped; ++s) {
    EXPECT_TRUE(l16->skipped[s]) << "skips come first, step " << s;
    EXPECT_EQ(l16->scales[s], 16777216.0 / std::pow(2.0, static_cast<double>(s)));
  }
  EXPECT_EQ(scaler.scale(), 16777216.0 / std::pow(2.0, static_cast<double>(skipped)));
  // Then the f16 run trains like f32 run for the same number of applied steps.
  const int applied = 16 - static_cast<int>(skipped);
  absl::StatusOr<TrainLog> l32 =
      TrainMixedMlp(mesh, p32, batch, PrecisionPolicy::Fp32(), o32, applied + 1);
  ASSERT_TRUE(l32.ok()) << l32.status();
  for (int s = 0; s < applied; ++s) {
    EXPECT_NEAR(l16->losses[skipped + s], l32->losses[s], 0.02 * l32->losses[s]) << "step " << s;
  }
}

// ---- (e) the collectives and their dtypes ------------------------------------------------

int64_t Bytes(const std::vector<CollectiveRecord>& log, const Mesh& mesh, const std::string& axes,
              bool backward, int* count) {
  int64_t b = 0;
  *count = 0;
  for (const CollectiveRecord& r : log) {
    if (std::string(r.op) == "all_reduce" && r.backward == backward &&
        mesh.MaskToString(r.axes) == axes) {
      b += r.bytes;
      ++*count;
    }
  }
  return b;
}

TEST_P(MixedMeshTest, CollectivesCarryBf16ActivationsAndF32Gradients) {
  const auto [dp, tp] = GetParam();
  MlpConfig cfg = Config();
  MlpParams p = InitMlp(cfg);
  MlpBatch batch = SyntheticBatch(cfg);
  PrecisionPolicy f32r = PrecisionPolicy::Bf16Mixed();
  f32r.activation_reduce = DType::kF32;
  struct Run {
    PrecisionPolicy pol;
    int64_t act_bytes_per_elem;
  };
  std::vector<MixedStep> steps;
  for (const Run& run : {Run{PrecisionPolicy::Fp32(), 4}, Run{PrecisionPolicy::Bf16Mixed(), 2},
                         Run{f32r, 4}}) {
    SCOPED_TRACE(run.pol.ToString());
    absl::StatusOr<MixedStep> s = MixedTrainStep(mesh(), p, batch, run.pol);
    ASSERT_TRUE(s.ok()) << s.status();
    const Mesh m = mesh();
    const int64_t rows = cfg.batch / dp, d = cfg.d_model, h = cfg.d_hidden / tp;
    int n = 0;
    // Forward: the row-parallel partial sums, [rows, d], in the activation-reduce dtype.
    EXPECT_EQ(Bytes(s->log, m, "tp", false, &n), rows * d * run.act_bytes_per_elem);
    EXPECT_EQ(n, 1);
    // Backward: its transpose on the cotangent, same size and dtype.
    EXPECT_EQ(Bytes(s->log, m, "tp", true, &n), rows * d * run.act_bytes_per_elem);
    EXPECT_EQ(n, 1);
    // Gradient reductions in f32 whatever the compute dtype: w1, b1, w2 over dp ...
    EXPECT_EQ(Bytes(s->log, m, "dp", true, &n), (d * h + h + h * d) * 4);
    EXPECT_EQ(n, 3);
    // ... and b2 (used replicated over tp, seeded on tp index 0) over dp and tp.
    EXPECT_EQ(Bytes(s->log, m, "(dp,tp)", true, &n), d * 4);
    EXPECT_EQ(n, 1);
    EXPECT_EQ(s->log.size(), 6u) << SummarizeCollectiveBytes(m, s->log);
    steps.push_back(*std::move(s));
  }
  // In-process all-reduce sums bf16 in f32 and rounds once: sending f32 gives the same bits.
  EXPECT_EQ(steps[1].loss, steps[2].loss);
  EXPECT_TRUE(testing::ParamsNear(steps[1].grads, steps[2].grads, 0));
}

TEST(MixedCollectivesTest, SummaryNamesGroupsAndBytes) {
  MlpConfig cfg = Config();
  Mesh mesh = MakeMesh(2, 3);
  absl::StatusOr<MixedStep> s = MixedTrainStep(mesh, InitMlp(cfg), SyntheticBatch(cfg),
                                               PrecisionPolicy::Bf16Mixed());
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(SummarizeCollectiveBytes(mesh, s->log),
            "fwd: all_reduce(tp) x1 192B | bwd: all_reduce(tp) x1 192B, all_reduce(dp) x3 1056B, "
            "all_reduce((dp,tp)) x1 64B");
}

INSTANTIATE_TEST_SUITE_P(Meshes, MixedMeshTest, ::testing::ValuesIn(Meshes()), MeshName);

}  // namespace
}  // namespace shardmap
