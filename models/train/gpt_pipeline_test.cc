// Pipeline-parallel GPT-2 training is a pure refactoring: three f64 AdamW steps with clipping on
// pp2 (GPipe and 1F1B), pp3 with an uneven split (2,1,1 layers), dp2 x tp2 x pp2 and
// pp2 x fsdp2 x tp2+sp (8 simulated devices), pp2 x fsdp3, pp2 x fsdp2 (4 layers), and one
// stage accumulating microbatches, give the single-device losses and parameters to
// 1e-9 relative (the tied wte gradient summed over the first and last stage). 1F1B holds
// p/m of GPipe's activations on stage 0. Impossible layouts are errors before training.
#include "models/train/gpt_pipeline.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <ostream>
#include <set>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/train/gpt_test_util.h"

namespace shardmap {
namespace {

using ::testing::HasSubstr;
using gpt_testing::ExpectSameTraining;
using gpt_testing::SmallConfig;
using gpt_testing::ThreeSteps;
using gpt_testing::Tokens;

absl::StatusOr<TrainResult> TrainPipe(const std::string& mesh, bool sp, const GptConfig& cfg,
                                      int64_t microbatches, const std::string& schedule) {
  absl::StatusOr<Mesh> m = ParseMesh(mesh);
  if (!m.ok()) return m.status();
  absl::StatusOr<GptLayout> layout = GptLayout::Create(*m, cfg, sp);
  if (!layout.ok()) return layout.status();
  TrainOptions o = ThreeSteps();
  o.pipeline.microbatches = microbatches;
  o.pipeline.schedule = schedule;
  return TrainGptPipeline(*layout, InitGpt(cfg, 7), Tokens(500, cfg.vocab), o);
}

GptConfig FourLayers() {
  GptConfig c = SmallConfig();
  c.layers = 4;
  return c;
}

struct PipeLayout {
  std::string mesh;
  bool sp;
  int64_t microbatches;
  std::string schedule;
  bool four_layers;
};

void PrintTo(const PipeLayout& l, std::ostream* os) {
  *os << "mesh '" << l.mesh << "'" << (l.sp ? " sp" : "") << " m=" << l.microbatches << " "
      << l.schedule << (l.four_layers ? " 4 layers" : "");
}

std::string Name(const ::testing::TestParamInfo<PipeLayout>& info) {
  std::string n = absl::StrCat(info.param.mesh.empty() ? "one" : info.param.mesh, info.param.sp ? "_sp" : "", "_m",
                               info.param.microbatches, "_", info.param.schedule);
  for (char& c : n) {
    if (c == '=' || c == ',') c = '_';
  }
  return n;
}

const TrainResult& FourLayerReference() {
  static const TrainResult* ref = [] {
    absl::StatusOr<GptLayout> layout = GptLayout::Create(Mesh(), FourLayers(), false);
    absl::StatusOr<TrainResult> r = TrainGpt(*layout, InitGpt(FourLayers(), 7),
                                             Tokens(500, FourLayers().vocab), ThreeSteps());
    EXPECT_TRUE(r.ok()) << r.status();
    return new TrainResult(r.ok() ? *r : TrainResult{});
  }();
  return *ref;
}

class GptPipelineEquivalenceTest : public ::testing::TestWithParam<PipeLayout> {};

TEST_P(GptPipelineEquivalenceTest, ThreeAdamWStepsMatchSingleDevice) {
  const PipeLayout& l = GetParam();
  const TrainResult& ref = l.four_layers ? FourLayerReference() : gpt_testing::Reference();
  ASSERT_EQ(ref.losses.size(), 3u);
  EXPECT_LT(ref.losses[2], ref.losses[0]);
  EXPECT_GT(ref.grad_norms[0], ThreeSteps().optimizer.clip);
  absl::StatusOr<TrainResult> got =
      TrainPipe(l.mesh, l.sp, l.four_layers ? FourLayers() : SmallConfig(), l.microbatches,
                l.schedule);
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectSameTraining(*got, ref);
}

INSTANTIATE_TEST_SUITE_P(
    Meshes, GptPipelineEquivalenceTest,
    ::testing::Values(PipeLayout{"pp=2", false, 4, "gpipe", false},
                      PipeLayout{"pp=2", false, 4, "1f1b", false},
                      PipeLayout{"pp=3", false, 6, "1f1b", true},
                      PipeLayout{"pp=3", false, 3, "gpipe", true},
                      PipeLayout{"pp=2,dp=2,tp=2", false, 2, "1f1b", false},
                      PipeLayout{"pp=2,dp_shard=2,tp=2", true, 3, "1f1b", false},
                      // FSDP in the stages (stage_fsdp.h): odd dp_shard, 4 layers over GPipe.
                      PipeLayout{"pp=2,dp_shard=3", false, 2, "1f1b", false},
                      PipeLayout{"pp=2,dp_shard=2", false, 3, "gpipe", true},
                      // One stage: gradient accumulation over the microbatches.
                      PipeLayout{"", false, 3, "gpipe", false},
                      PipeLayout{"pp=1,dp=2", false, 2, "1f1b", false}),
    Name);

TEST(GptPipelineMemoryTest, OneFOneBHoldsPOverMOfGpipesActivations) {
  // Stage 0 (rank 0): GPipe keeps all m = 4 microbatches' activations, 1F1B p = 2 of them.
  absl::StatusOr<TrainResult> gpipe = TrainPipe("pp=2", false, SmallConfig(), 4, "gpipe");
  absl::StatusOr<TrainResult> ofob = TrainPipe("pp=2", false, SmallConfig(), 4, "1f1b");
  ASSERT_TRUE(gpipe.ok()) << gpipe.status();
  ASSERT_TRUE(ofob.ok()) << ofob.status();
  ASSERT_GT(ofob->peak_activation_bytes_per_rank, 0);
  EXPECT_EQ(ofob->peak_activation_bytes_per_rank * 4, gpipe->peak_activation_bytes_per_rank * 2);
  // Against the unpipelined run, stage 0 under GPipe holds the embedding and its one block of
  // the whole batch: less than the single device's whole model.
  EXPECT_LT(gpipe->peak_activation_bytes_per_rank,
            gpt_testing::Reference().peak_activation_bytes_per_rank);
}

TEST(GptPipelineCollectivesTest, StageZeroSendsEachMicrobatchOnceEachWayAndSharesWte) {
  // pp2, m=4: stage 0 takes part in 4 forward transfers (its forwards) and 4 backward ones (stage
  // 1's backwards), each one [18 rows, d 12] f64 activation, then one wte gradient exchange.
  absl::StatusOr<Mesh> mesh = ParseMesh("pp=2");
  absl::StatusOr<GptLayout> layout = GptLayout::Create(*mesh, SmallConfig(), false);
  ASSERT_TRUE(layout.ok());
  TrainOptions o = ThreeSteps();
  o.pipeline.microbatches = 4;
  absl::StatusOr<TrainResult> r =
      TrainGptPipeline(*layout, InitGpt(SmallConfig(), 7), Tokens(500, 24), o);
  ASSERT_TRUE(r.ok()) << r.status();
  int ppermutes = 0, all_reduces = 0;
  int64_t ppermute_bytes = 0;
  for (const CollectiveRecord& c : r->log) {
    if (std::string(c.op) == "ppermute") {
      ++ppermutes;
      ppermute_bytes += c.bytes;
    }
    all_reduces += std::string(c.op) == "all_reduce";
  }
  EXPECT_EQ(ppermutes, 2 * 4 + 1);
  EXPECT_EQ(ppermute_bytes, 2 * 4 * (18 * 12 * 8) + 24 * 12 * 8);
  EXPECT_EQ(all_reduces, 2);  // the norm and the loss (no data-parallel axis)
}

TEST(GptPipelineValidationTest, ImpossibleLayoutsAreErrorsBeforeTraining) {
  auto error = [](const std::string& mesh, int64_t m, const std::string& schedule) {
    absl::StatusOr<TrainResult> r = TrainPipe(mesh, false, SmallConfig(), m, schedule);
    return r.ok() ? std::string("ok") : std::string(r.status().message());
  };
  EXPECT_THAT(error("pp=3", 3, "1f1b"), HasSubstr("2 layers cannot fill pp=3"));
  EXPECT_THAT(error("pp=2", 5, "1f1b"), HasSubstr("not divisible by microbatches 5"));
  EXPECT_THAT(error("pp=2,dp=2", 4, "1f1b"), HasSubstr("pick batch a multiple of 8"));
  EXPECT_THAT(error("pp=2", 2, "zero_bubble"), HasSubstr("unknown pipeline schedule"));
  EXPECT_THAT(error("pp=2", 0, "1f1b"), HasSubstr("must be >= 1"));
  EXPECT_THAT(error("pp=1,cp=3", 2, "1f1b"), HasSubstr("does not support cp"));
  EXPECT_THAT(error("pp=2,cp=3", 2, "1f1b"), HasSubstr("not supported"));
  // MoE is refused with pp, in CheckTrainOptions.
  GptConfig moe = SmallConfig();
  moe.moe.experts = 2;
  EXPECT_THAT(std::string(TrainPipe("pp=2", false, moe, 2, "1f1b").status().message()),
              HasSubstr("does not support MoE"));
  TrainOptions moe_options = ThreeSteps();
  moe_options.pipeline.microbatches = 2;
  EXPECT_THAT(CheckTrainOptions(*GptLayout::Create(*ParseMesh("pp=2"), moe, false), moe_options)
                  .message(),
              HasSubstr("does not support MoE"));
  // stage_layers without a pipeline.
  TrainOptions staged = ThreeSteps();
  staged.pipeline.stage_layers = {1, 1};
  EXPECT_THAT(std::string(TrainGpt(*GptLayout::Create(Mesh(), SmallConfig(), false),
                                   InitGpt(SmallConfig(), 7), Tokens(500, 24), staged)
                              .status()
                              .message()),
              HasSubstr("stage_layers is a pipeline"));
  // The mesh order puts pp first whatever the user wrote.
  EXPECT_EQ(ParseMesh("tp=2,pp=2")->axis_names()[0], "pp");
}

// The one trainer: every feature of TrainGpt works under the pipeline strategy.
std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + name;
}

TEST(GptPipelineFeaturesTest, TrainGptOnAPpMeshRunsThePipelineStrategy) {
  const GptLayout pp2 = *GptLayout::Create(*ParseMesh("pp=2"), SmallConfig(), false);
  absl::StatusOr<TrainResult> r =
      TrainGpt(pp2, InitGpt(SmallConfig(), 7), Tokens(500, 24), ThreeSteps());
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectSameTraining(*r, gpt_testing::Reference());
}

TEST(GptPipelineFeaturesTest, SaveAndResumeAcrossPipelinedAndUnpipelinedMeshes) {
  const TrainResult& ref = gpt_testing::Reference();
  // Two steps on pp2 x dp2 (1F1B, 2 microbatches), saved; resumed to the total of three on
  // one device, and the reverse: the uninterrupted run's last loss and parameters.
  struct Case {
    std::string save_mesh, resume_mesh;
    int64_t save_m, resume_m;
  };
  for (const Case& k : {Case{"pp=2,dp=2", "", 2, 1}, Case{"", "pp=2,tp=2", 1, 3}}) {
    SCOPED_TRACE(k.save_mesh + " -> " + k.resume_mesh);
    const std::string path = TempPath("pipe_resume.safetensors");
    TrainOptions first = ThreeSteps();
    first.steps = 2;
    first.pipeline.microbatches = k.save_m;
    first.checkpoint.save_path = path;
    const GptLayout a = *GptLayout::Create(*ParseMesh(k.save_mesh), SmallConfig(), false);
    absl::StatusOr<TrainResult> ra = TrainGpt(a, InitGpt(SmallConfig(), 7), Tokens(500, 24), first);
    ASSERT_TRUE(ra.ok()) << ra.status();
    TrainOptions rest = ThreeSteps();
    rest.pipeline.microbatches = k.resume_m;
    rest.checkpoint.resume_path = path;
    const GptLayout b = *GptLayout::Create(*ParseMesh(k.resume_mesh), SmallConfig(), false);
    absl::StatusOr<TrainResult> rb = TrainGpt(b, {}, Tokens(500, 24), rest);
    ASSERT_TRUE(rb.ok()) << rb.status();
    ASSERT_EQ(rb->losses.size(), 1u);
    EXPECT_NEAR(rb->losses[0], ref.losses[2], 1e-9 * ref.losses[2]);
    EXPECT_EQ(rb->steps_done, 3);
    for (size_t i = 0; i < ref.params.size(); ++i) {
      EXPECT_LE(gpt_testing::RelDiff(rb->params[i].tensor, ref.params[i].tensor), 1e-9)
          << ref.params[i].name;
    }
  }
  // --init on pp2: the saved model's loss on batch 0, as on one device.
  TrainOptions init = ThreeSteps();
  init.steps = 1;
  init.checkpoint.init_path = TempPath("pipe_resume.safetensors");
  init.pipeline.microbatches = 2;
  absl::StatusOr<TrainResult> one =
      TrainGpt(*GptLayout::Create(Mesh(), SmallConfig(), false), {}, Tokens(500, 24), init);
  absl::StatusOr<TrainResult> piped = TrainGpt(
      *GptLayout::Create(*ParseMesh("pp=2"), SmallConfig(), false), {}, Tokens(500, 24), init);
  ASSERT_TRUE(one.ok() && piped.ok());
  EXPECT_NEAR(piped->losses[0], one->losses[0], 1e-9 * one->losses[0]);
}

TEST(GptPipelineFeaturesTest, TraceAndTypesUnderPp) {
  const GptLayout pp2 = *GptLayout::Create(*ParseMesh("pp=2,tp=2"), SmallConfig(), true);
  TrainOptions o = ThreeSteps();
  o.steps = 1;
  o.pipeline.microbatches = 2;
  o.tracing.keep_events = true;
  TypeTrace types;
  o.tracing.types = &types;
  absl::StatusOr<TrainResult> r = TrainGpt(pp2, InitGpt(SmallConfig(), 7), Tokens(500, 24), o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(types.empty());  // rank 0 holds block 0
  // Every rank: F0 F1 B0 B1 spans, backward-op spans, the phases after the pipeline.
  std::map<int, std::set<std::string>> names;
  for (const TraceEvent& e : r->trace) names[e.rank].insert(e.category + ":" + e.name);
  ASSERT_EQ(names.size(), 4u);
  for (auto& [rank, n] : names) {
    SCOPED_TRACE(rank);
    for (const char* want : {"pipeline:F0", "pipeline:F1", "pipeline:B0", "pipeline:B1",
                             "phase:grad reduce + clip", "phase:optimizer"}) {
      EXPECT_TRUE(n.count(want)) << want;
    }
    EXPECT_TRUE(std::any_of(n.begin(), n.end(), [](const std::string& x) {
      return x.rfind("backward op:", 0) == 0;
    }));
  }
}

}  // namespace
}  // namespace shardmap
