// GPT-2 training is a pure refactoring across parallelisms: three f64 steps of AdamW with
// global-norm clipping on dp2, tp2, tp2+sp, fsdp2, hsdp 2x2, dp2 x tp2, fsdp2 x tp2+sp (and
// tp3 / dp3, non-powers of two; cp2, cp3, cp2 x tp2 (+sp), dp2 x cp2, fsdp2 x cp3 with ring
// attention) give the single-device losses and parameters to 1e-9 relative (f32: 1e-4);
// the collective log of one step has exactly the collectives each layout implies.
#include "models/gpt.h"

#include <cstdlib>
#include <iostream>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/components/checkpoint.h"
#include "models/gpt/gpt_checkpoint.h"
#include "models/train/gpt_test_util.h"
#include "tests/test_util.h"

namespace shardmap {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

using gpt_testing::ExpectSameTraining;
using gpt_testing::Reference;
using gpt_testing::RelDiff;
using gpt_testing::SmallConfig;
using gpt_testing::ThreeSteps;
using gpt_testing::Tokens;
using gpt_testing::Train;

using gpt_testing::Layout;
using gpt_testing::LayoutName;

class GptEquivalenceTest : public ::testing::TestWithParam<Layout> {};

TEST_P(GptEquivalenceTest, ThreeAdamWStepsMatchSingleDevice) {
  const TrainResult& ref = Reference();
  ASSERT_EQ(ref.losses.size(), 3u);
  // The reference actually trains and clips.
  EXPECT_LT(ref.losses[2], ref.losses[0]);
  EXPECT_GT(ref.grad_norms[0], ThreeSteps().optimizer.clip);
  ExpectSameTraining(Train(GetParam().mesh, GetParam().sp), ref);
}

INSTANTIATE_TEST_SUITE_P(
    Meshes, GptEquivalenceTest,
    ::testing::Values(Layout{"dp=2", false}, Layout{"tp=2", false}, Layout{"tp=2", true},
                      Layout{"dp_shard=2", false}, Layout{"dp_replicate=2,dp_shard=2", false},
                      Layout{"dp=2,tp=2", false}, Layout{"dp_shard=2,tp=2", true},
                      Layout{"tp=3", true}, Layout{"dp=3", false},
                      Layout{"tp=6", false}, Layout{"tp=6", true},  // one head per device
                      Layout{"dp=2,tp=2", true}),                  // SP x DP
    LayoutName);

// ---- Collectives of one step, per layout ---------------------------------------------------

// "op(axes) fwd|bwd" -> {count, bytes} over rank 0's log of the last step. "fwd" is everything
// outside the backward pass (forward, gradient reduction, loss and norm reductions).
struct Tally {
  int count = 0;
  int64_t bytes = 0;
  bool operator==(const Tally& o) const { return count == o.count && bytes == o.bytes; }
};
std::ostream& operator<<(std::ostream& os, const Tally& t) {
  return os << "{" << t.count << " x, " << t.bytes << " B}";
}

// The log's collectives as "op(axes) fwd|bwd" -> tally.
std::map<std::string, Tally> TallyLog(const std::vector<CollectiveRecord>& log, const Mesh& mesh) {
  std::map<std::string, Tally> m;
  for (const CollectiveRecord& c : log) {
    Tally& t = m[std::string(c.op) + "(" + mesh.MaskToString(c.axes) + ") " +
                 (c.backward ? "bwd" : "fwd")];
    t.count += 1;
    t.bytes += c.bytes;
  }
  return m;
}

// overlap: the overlapped schedule (buckets, FSDP prefetch and reshard); else the reference.
std::map<std::string, Tally> Collectives(const std::string& mesh_text, bool sp,
                                         GptLayout* layout_out = nullptr, bool overlap = false) {
  Mesh mesh = *ParseMesh(mesh_text);
  GptLayout layout = *GptLayout::Create(mesh, SmallConfig(), sp);
  TrainOptions o = ThreeSteps();
  o.steps = 1;
  o.overlap.on = overlap;
  absl::StatusOr<TrainResult> r =
      TrainGpt(layout, InitGpt(SmallConfig(), 7), Tokens(500, SmallConfig().vocab), o);
  EXPECT_TRUE(r.ok()) << r.status();
  if (layout_out != nullptr) *layout_out = layout;
  return TallyLog(r->log, mesh);
}

// Bytes of the whole parameters, and of those replicated over tp (their gradients are P on tp).
struct ParamBytes {
  int64_t all = 0, tp_replicated = 0;
  int count = 0, tp_replicated_count = 0;
};
ParamBytes CountParams(const GptLayout& layout) {
  ParamBytes b;
  for (const ParamInfo& p : layout.params()) {
    int64_t bytes = NumElements(p.global_shape) * 8;
    b.all += bytes;
    b.count += 1;
    bool tp_split = false;
    for (const auto& axes : p.spec.dims()) {
      for (const std::string& a : axes) tp_split |= a == "tp";
    }
    if (!tp_split) {
      b.tp_replicated += bytes;
      b.tp_replicated_count += 1;
    }
  }
  return b;
}

TEST(GptCollectivesTest, DataParallelAllReducesEachGradientOnce) {
  GptLayout layout = *GptLayout::Create(*ParseMesh("dp=2"), SmallConfig(), false);
  std::map<std::string, Tally> got = Collectives("dp=2", false, &layout);
  ParamBytes pb = CountParams(layout);
  // One all_reduce per gradient, plus the loss and the squared norm (one f64 each).
  std::map<std::string, Tally> want = {{"all_reduce(dp) fwd", {pb.count + 2, pb.all + 16}}};
  EXPECT_EQ(got, want);
}

TEST(GptCollectivesTest, FsdpGathersForwardAndReduceScattersBackward) {
  GptLayout layout = *GptLayout::Create(*ParseMesh("dp_shard=2"), SmallConfig(), false);
  std::map<std::string, Tally> got = Collectives("dp_shard=2", false);
  ParamBytes pb = CountParams(layout);
  std::map<std::string, Tally> want = {
      {"all_gather(dp_shard) fwd", {pb.count, pb.all / 2}},      // each rank sends its half
      {"reduce_scatter(dp_shard) bwd", {pb.count, pb.all}},      // the whole gradient in
      {"all_reduce(dp_shard) fwd", {2, 16}}};                    // loss, norm
  EXPECT_EQ(got, want);
}

TEST(GptCollectivesTest, HsdpReduceScattersOverShardAndAllReducesOverReplicate) {
  GptLayout layout =
      *GptLayout::Create(*ParseMesh("dp_replicate=2,dp_shard=2"), SmallConfig(), false);
  std::map<std::string, Tally> got = Collectives("dp_replicate=2,dp_shard=2", false);
  ParamBytes pb = CountParams(layout);
  std::map<std::string, Tally> want = {
      {"all_gather(dp_shard) fwd", {pb.count, pb.all / 2}},
      {"reduce_scatter(dp_shard) bwd", {pb.count, pb.all}},
      {"all_reduce(dp_replicate) fwd", {pb.count, pb.all / 2}},  // the local gradient shards
      {"all_reduce((dp_replicate,dp_shard)) fwd", {2, 16}}};
  EXPECT_EQ(got, want);
}

TEST(GptCollectivesTest, TensorParallelAndSequenceParallelRegions) {
  const GptConfig c = SmallConfig();
  const int64_t L = c.layers, rows = 12 * c.seq, d = c.d_model;
  for (bool sp : {false, true}) {
    SCOPED_TRACE(sp ? "tp=2 + sp" : "tp=2");
    GptLayout layout = *GptLayout::Create(*ParseMesh("tp=2"), c, sp);
    std::map<std::string, Tally> got = Collectives("tp=2", sp);
    ParamBytes pb = CountParams(layout);
    const int64_t act = rows * d * 8;                  // one [rows, d] f64 activation
    const int64_t ce = 2 * rows * 8 + rows * 8;        // max and sum of exps [rows,1], picked [rows]
    std::map<std::string, Tally> want;
    if (!sp) {
      // Embedding + 2 per layer (attention, MLP) + 3 in the cross-entropy; the gradients of the
      // tp-replicated parameters; the norm.
      want["all_reduce(tp) fwd"] = {static_cast<int>(1 + 2 * L + 3 + pb.tp_replicated_count + 1),
                                    (1 + 2 * L) * act + ce + pb.tp_replicated + 8};
      // Transposes: embedding, 2 per layer, sum of exps and picked (the max has no gradient).
      want["all_reduce(tp) bwd"] = {static_cast<int>(1 + 2 * L + 2),
                                    (1 + 2 * L) * act + 2 * rows * 8};
    } else {
      want["reduce_scatter(tp) fwd"] = {static_cast<int>(1 + 2 * L), (1 + 2 * L) * act};
      want["all_gather(tp) fwd"] = {static_cast<int>(2 * L + 1), (2 * L + 1) * act / 2};
      want["all_reduce(tp) fwd"] = {static_cast<int>(3 + pb.tp_replicated_count + 1),
                                    ce + pb.tp_replicated + 8};
      want["all_gather(tp) bwd"] = {static_cast<int>(1 + 2 * L), (1 + 2 * L) * act / 2};
      want["reduce_scatter(tp) bwd"] = {static_cast<int>(2 * L + 1), (2 * L + 1) * act};
      want["all_reduce(tp) bwd"] = {2, 2 * rows * 8};
    }
    EXPECT_EQ(got, want);
  }
}

// The overlapped schedule: one bucket per gradient kind (the small model's gradients fit one
// 25 MiB bucket, reduced when the backward is over), FSDP's gathers in the forward plus the
// regather of block 0 (resharded after its forward; the last block is not) in the backward.
TEST(GptCollectivesTest, OverlappedScheduleBucketsGradientsAndRegathersResharded) {
  GptLayout layout = *GptLayout::Create(*ParseMesh("dp=2"), SmallConfig(), false);
  ParamBytes pb = CountParams(layout);
  EXPECT_EQ(Collectives("dp=2", false, nullptr, true),
            (std::map<std::string, Tally>{{"all_reduce(dp) fwd", {1 + 2, pb.all + 16}}}));
  // FSDP gathers each unit (the embeddings, each block, the final LayerNorm) in one flat call.
  const int units = static_cast<int>(SmallConfig().layers) + 2;
  int64_t block0_bytes = 0;
  for (const ParamInfo& p : layout.params()) {
    if (p.name.rfind("h.0.", 0) == 0) block0_bytes += NumElements(p.global_shape) * 8;
  }
  EXPECT_EQ(Collectives("dp_shard=2", false, nullptr, true),
            (std::map<std::string, Tally>{
                {"all_gather(dp_shard) fwd", {units, pb.all / 2}},
                {"all_gather(dp_shard) bwd", {1, block0_bytes / 2}},  // the regather
                {"reduce_scatter(dp_shard) bwd", {units, pb.all}},
                {"all_reduce(dp_shard) fwd", {2, 16}}}));
  // HSDP: the dp_replicate all-reduce of the gradient shards is one bucket.
  EXPECT_EQ(Collectives("dp_replicate=2,dp_shard=2", false, nullptr, true),
            (std::map<std::string, Tally>{
                {"all_gather(dp_shard) fwd", {units, pb.all / 2}},
                {"all_gather(dp_shard) bwd", {1, block0_bytes / 2}},
                {"reduce_scatter(dp_shard) bwd", {units, pb.all}},
                {"all_reduce(dp_replicate) fwd", {1, pb.all / 2}},
                {"all_reduce((dp_replicate,dp_shard)) fwd", {2, 16}}}));
}

TEST(GptMemoryTest, FsdpHoldsHalfTheParametersAndOptimizerStateOfDp) {
  TrainOptions o = ThreeSteps();
  o.steps = 1;
  auto run = [&](const std::string& mesh) {
    GptLayout layout = *GptLayout::Create(*ParseMesh(mesh), SmallConfig(), false);
    return *TrainGpt(layout, InitGpt(SmallConfig(), 7), Tokens(500, SmallConfig().vocab), o);
  };
  TrainResult dp = run("dp=2"), fsdp = run("dp_shard=2");
  EXPECT_EQ(2 * fsdp.param_bytes_per_rank, dp.param_bytes_per_rank);
  EXPECT_EQ(2 * fsdp.optimizer_bytes_per_rank, dp.optimizer_bytes_per_rank);
  EXPECT_EQ(dp.optimizer_bytes_per_rank, 3 * dp.param_bytes_per_rank);  // grad + 2 moments
}


// ---- Checkpoints: save on one mesh, resume on another -------------------------------------

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + name;
}

absl::StatusOr<TrainResult> TrainOn(const std::string& mesh, bool sp, TrainOptions o,
                                    std::vector<NamedTensor> init) {
  absl::StatusOr<Mesh> m = ParseMesh(mesh);
  if (!m.ok()) return m.status();
  absl::StatusOr<GptLayout> layout = GptLayout::Create(*m, SmallConfig(), sp);
  if (!layout.ok()) return layout.status();
  return TrainGpt(*layout, init, Tokens(500, SmallConfig().vocab), o);
}

TEST(GptCheckpointTest, SaveOnOneMeshResumeOnAnotherContinuesWithTheSameLosses) {
  const TrainResult& ref = Reference();
  const std::string path = TempPath("gpt_resume.safetensors");
  TrainOptions first = ThreeSteps();
  first.steps = 2;
  first.checkpoint.save_path = path;
  absl::StatusOr<TrainResult> a = TrainOn("dp_shard=2,tp=2", true, first, InitGpt(SmallConfig(), 7));
  ASSERT_TRUE(a.ok()) << a.status();
  for (auto [mesh, sp] : std::vector<std::pair<std::string, bool>>{{"tp=3", true}, {"dp=2", false}}) {
    SCOPED_TRACE(mesh);
    TrainOptions rest = ThreeSteps();
    rest.steps = 3;  // the total: one more step after the saved two
    rest.checkpoint.resume_path = path;
    absl::StatusOr<TrainResult> b = TrainOn(mesh, sp, rest, {});
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(b->steps_done, 3);
    EXPECT_NEAR(b->losses[0], ref.losses[2], 1e-9 * ref.losses[2]);
    for (size_t i = 0; i < ref.params.size(); ++i) {
      EXPECT_LE(RelDiff(b->params[i].tensor, ref.params[i].tensor), 1e-9) << ref.params[i].name;
    }
  }
  // --init loads the parameters only (fresh AdamW): the first loss is the saved model's loss on
  // batch 0, the same on any mesh.
  TrainOptions init = ThreeSteps();
  init.steps = 1;
  init.checkpoint.init_path = path;
  absl::StatusOr<TrainResult> c1 = TrainOn("", false, init, {});
  absl::StatusOr<TrainResult> c2 = TrainOn("dp=2,tp=2", false, init, {});
  ASSERT_TRUE(c1.ok() && c2.ok());
  EXPECT_NEAR(c2->losses[0], c1->losses[0], 1e-9 * c1->losses[0]);
}

TEST(GptCheckpointTest, MissingOrMisShapedTensorsAreErrorsBeforeTheFirstStep) {
  const std::string path = TempPath("gpt_small.safetensors");
  TrainOptions save = ThreeSteps();
  save.steps = 1;
  save.checkpoint.save_path = path;
  ASSERT_TRUE(TrainOn("", false, save, InitGpt(SmallConfig(), 7)).ok());
  // Another model size: mis-shaped.
  GptConfig big = SmallConfig();
  big.d_model = 18;
  GptLayout layout = *GptLayout::Create(Mesh(), big, false);
  TrainOptions load = ThreeSteps();
  load.checkpoint.init_path = path;
  absl::StatusOr<TrainResult> r = TrainGpt(layout, {}, Tokens(500, big.vocab), load);
  EXPECT_THAT(std::string(r.status().message()),
              AllOf(HasSubstr("tensor 'wte.weight' is [24,12]"), HasSubstr("needs [24,18]")));
  // More layers than the file has: missing.
  GptConfig deep = SmallConfig();
  deep.layers = 3;
  layout = *GptLayout::Create(Mesh(), deep, false);
  r = TrainGpt(layout, {}, Tokens(500, deep.vocab), load);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("no tensor 'h.2.ln_1.weight'"));
  // A parameter-only file cannot be resumed from.
  TrainOptions resume = ThreeSteps();
  resume.checkpoint.resume_path = TempPath("params_only.safetensors");
  GptLayout small = *GptLayout::Create(Mesh(), SmallConfig(), false);
  ASSERT_TRUE(SaveGpt(resume.checkpoint.resume_path, small, InitGpt(SmallConfig(), 1), nullptr, 0).ok());
  r = TrainOn("", false, resume, {});
  EXPECT_THAT(std::string(r.status().message()),
              AllOf(HasSubstr("no tensor 'optimizer.exp_avg.wte.weight'"),
                    HasSubstr("--resume needs a checkpoint saved by train_gpt --save")));
}

TEST(GptValidationTest, BadLayoutsAndDataAreClearErrors) {
  auto create = [](const std::string& mesh, GptConfig c, bool sp) {
    absl::StatusOr<Mesh> m = ParseMesh(mesh);
    if (!m.ok()) return std::string(m.status().message());
    return std::string(GptLayout::Create(*m, c, sp).status().message());
  };
  GptConfig c = SmallConfig();
  EXPECT_THAT(create("xp=2", c, false), HasSubstr("unknown axis 'xp'"));
  EXPECT_THAT(create("dp=2,dp=2", c, false), HasSubstr("given twice"));
  EXPECT_THAT(create("dp=x", c, false), HasSubstr("is not axis=size"));
  EXPECT_THAT(create("tp=4", c, false), HasSubstr("heads 6 are not divisible by tp=4"));
  EXPECT_THAT(create("dp=2", c, true), HasSubstr("needs a tp axis"));
  GptConfig odd = c;
  odd.vocab = 25;
  EXPECT_THAT(create("tp=2", odd, false), HasSubstr("vocab 25 is not divisible by tp=2"));
  GptLayout layout = *GptLayout::Create(*ParseMesh("dp=5"), c, false);
  TrainOptions o = ThreeSteps();
  EXPECT_THAT(std::string(TrainGpt(layout, InitGpt(c, 1), Tokens(500, c.vocab), o)
                              .status().message()),
              HasSubstr("batch 12 is not divisible by the 5 data-parallel ways"));
  layout = *GptLayout::Create(Mesh(), c, false);
  EXPECT_THAT(std::string(TrainGpt(layout, InitGpt(c, 1), Tokens(4, c.vocab), o)
                              .status().message()),
              HasSubstr("the data has 4 tokens; a sample needs seq+1 = 7"));
  EXPECT_THAT(std::string(TrainGpt(layout, InitGpt(c, 1), {1, 2, 3, 4, 5, 6, 7, 99}, o)
                              .status().message()),
              HasSubstr("token id 99 is outside the vocabulary"));
}


TEST(GptEquivalenceF32Test, ThreeStepsMatchSingleDeviceTo1e4) {
  GptConfig c = SmallConfig();
  c.dtype = DType::kF32;
  auto run = [&](const std::string& mesh, bool sp) {
    GptLayout layout = *GptLayout::Create(*ParseMesh(mesh), c, sp);
    return *TrainGpt(layout, InitGpt(c, 7), Tokens(500, c.vocab), ThreeSteps());
  };
  TrainResult ref = run("", false);
  for (auto [mesh, sp] : std::vector<std::pair<std::string, bool>>{{"dp_shard=2,tp=2", true},
                                                                   {"dp=3", false},
                                                                   {"cp=3", false}}) {
    SCOPED_TRACE(mesh);
    TrainResult got = run(mesh, sp);
    for (int s = 0; s < 3; ++s) {
      EXPECT_NEAR(got.losses[s], ref.losses[s], 1e-4 * ref.losses[s]) << "step " << s;
    }
    for (size_t i = 0; i < ref.params.size(); ++i) {
      EXPECT_LE(RelDiff(got.params[i].tensor, ref.params[i].tensor), 1e-4) << ref.params[i].name;
    }
  }
}


// ---- Context parallelism (ring attention over cp) --------------------------------------------

// seq 12: 2*cp divides it for cp = 2, 3 (and 6).
GptConfig CpConfig() {
  GptConfig c = SmallConfig();
  c.seq = 12;
  return c;
}

TrainResult TrainCp(const std::string& mesh, bool sp, TrainOptions o = ThreeSteps()) {
  absl::StatusOr<GptLayout> layout = GptLayout::Create(*ParseMesh(mesh), CpConfig(), sp);
  EXPECT_TRUE(layout.ok()) << layout.status();
  absl::StatusOr<TrainResult> r =
      TrainGpt(*layout, InitGpt(CpConfig(), 7), Tokens(500, CpConfig().vocab), o);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : TrainResult{};
}

class GptContextParallelTest : public ::testing::TestWithParam<Layout> {};

TEST_P(GptContextParallelTest, ThreeAdamWStepsMatchSingleDevice) {
  static const TrainResult* ref = new TrainResult(TrainCp("", false));
  ASSERT_EQ(ref->losses.size(), 3u);
  EXPECT_LT(ref->losses[2], ref->losses[0]);
  ExpectSameTraining(TrainCp(GetParam().mesh, GetParam().sp), *ref);
}

INSTANTIATE_TEST_SUITE_P(
    Meshes, GptContextParallelTest,
    ::testing::Values(Layout{"cp=2", false}, Layout{"cp=3", false}, Layout{"cp=2,tp=2", false},
                      Layout{"cp=2,tp=2", true}, Layout{"cp=2,tp=6", false},  // 1 head each
                      Layout{"dp=2,cp=2", false},
                      Layout{"dp_shard=2,cp=3", false}),
    LayoutName);

TEST(GptCollectivesTest, ContextParallelPassesKeysAndValuesRoundTheRing) {
  const GptConfig c = CpConfig();
  for (int cp : {2, 3}) {
    SCOPED_TRACE(absl::StrCat("cp=", cp));
    const std::string mesh = absl::StrCat("cp=", cp);
    GptLayout layout = *GptLayout::Create(*ParseMesh(mesh), c, false);
    TrainOptions o = ThreeSteps();
    o.steps = 1;
    std::map<std::string, Tally> got = TallyLog(TrainCp(mesh, false, o).log, layout.mesh());
    ParamBytes pb = CountParams(layout);
    // Per layer cp-1 ring steps, each K and V of this rank's 12*seq/cp rows; the backward ring
    // is their transpose. Then the gradients (P on cp) in one bucket (the default overlapped
    // schedule; they fit 25 MiB) and the loss and norm.
    const int64_t kv = 12 * c.seq / cp * 2 * c.d_model * 8;
    std::map<std::string, Tally> want = {
        {"ppermute(cp) fwd", {static_cast<int>(c.layers * (cp - 1)), c.layers * (cp - 1) * kv}},
        {"ppermute(cp) bwd", {static_cast<int>(c.layers * (cp - 1)), c.layers * (cp - 1) * kv}},
        {"all_reduce(cp) fwd", {1 + 2, pb.all + 16}}};
    EXPECT_EQ(got, want);
  }
}

// Activations per rank fall ~1/cp at a long sequence (the scores dominate one device's
// attention): the tape's bytes at cp = 2 and 4 against each other and the one-device run.
TEST(GptMemoryTest, ContextParallelActivationBytesFallAsOneOverCp) {
  GptConfig c = SmallConfig();
  c.layers = 1;
  c.seq = 96;
  c.d_model = 8;
  c.heads = 2;
  TrainOptions o = ThreeSteps();
  o.steps = 1;
  o.batch = 2;
  auto run = [&](const std::string& mesh) {
    GptLayout layout = *GptLayout::Create(*ParseMesh(mesh), c, false);
    return *TrainGpt(layout, InitGpt(c, 7), Tokens(500, c.vocab), o);
  };
  TrainResult one = run(""), cp2 = run("cp=2"), cp4 = run("cp=4");
  const double r2 = static_cast<double>(cp2.activation_bytes_per_rank) /
                    one.activation_bytes_per_rank;
  const double r4 = static_cast<double>(cp4.activation_bytes_per_rank) /
                    one.activation_bytes_per_rank;
  std::cout << "activation bytes per rank: cp1 " << one.activation_bytes_per_rank << ", cp2 "
            << cp2.activation_bytes_per_rank << " (" << r2 << "), cp4 "
            << cp4.activation_bytes_per_rank << " (" << r4 << "); largest: "
            << one.largest_activation_bytes << ", " << cp2.largest_activation_bytes << ", "
            << cp4.largest_activation_bytes << "\n";
  // cp2 -> cp4 halves the bytes. Against one device the ratio is a little above 1/cp: one
  // device records two [b, h, t, t] tensors per layer (the scores and causal_softmax's
  // probabilities) while a ring tile records four (scores, causal mask, shifted scores, exp).
  EXPECT_LT(r4 / r2, 0.5 * 1.15);
  EXPECT_GT(r4 / r2, 0.5 * 0.85);
  EXPECT_LT(r2, 0.5 * 1.4);
  EXPECT_GT(r2, 0.5 * 0.6);
  EXPECT_LT(r4, 0.25 * 1.6);
  EXPECT_GT(r4, 0.25 * 0.6);
  // One device's [batch, heads, seq, seq] scores are its largest activation; a ring block is
  // [batch, heads, c, 2c] with c = seq/(2cp).
  EXPECT_EQ(one.largest_activation_bytes, o.batch * c.heads * c.seq * c.seq * 8);
  EXPECT_LT(cp4.largest_activation_bytes, one.largest_activation_bytes / 8);
}

TEST(GptValidationTest, ContextParallelRejectsImpossibleLayoutsBeforeTraining) {
  GptConfig c = SmallConfig();  // seq 6
  EXPECT_THAT(std::string(GptLayout::Create(*ParseMesh("cp=2"), c, false).status().message()),
              AllOf(HasSubstr("seq 6 is not divisible by 2*cp = 4"),
                    HasSubstr("device i holds chunks i and 2cp-1-i")));
  // SP under cp splits each rank's batch/dp * seq/cp rows over tp: 1 * 4/2 = 2 rows over tp=3.
  c.seq = 4;
  GptLayout layout = *GptLayout::Create(*ParseMesh("cp=2,tp=3"), c, true);
  TrainOptions o = ThreeSteps();
  o.batch = 1;
  EXPECT_THAT(std::string(TrainGpt(layout, InitGpt(c, 1), Tokens(500, c.vocab), o)
                              .status().message()),
              HasSubstr("splits each rank's 2 tokens over tp=3: make batch/dp * seq/cp divisible"));
}

}  // namespace
}  // namespace shardmap
