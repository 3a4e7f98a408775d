// Interleaved 1F1B in the trainer (--schedule=interleaved_1f1b --virtual_stages=V): three f64
// AdamW steps with clipping give the single-device losses, gradient norms and parameters to 1e-9
// relative on pp2 x v2, pp3 x v2 (a ring of three), pp2 x v3, pp2 x dp2, pp2 x tp2 + SP, pp2 x
// fsdp2, pp2 x fsdp3 x v3 (+ full recomputation) and with
// per-virtual-stage --stage_layers; with --recompute=full too; the overlapped step (gradients
// reduced in buckets as each chunk's become final) equals overlap off bitwise; a checkpoint
// saved interleaved resumes on one device and the reverse; evaluation's forward-only loss is the
// one device's. Each refusal names the setting.
#include <cstdlib>
#include <map>
#include <optional>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/train/evaluate.h"
#include "models/train/gpt_pipeline.h"
#include "models/train/gpt_test_util.h"

namespace shardmap {
namespace {

using ::testing::HasSubstr;
using gpt_testing::ExpectSameTraining;
using gpt_testing::SmallConfig;
using gpt_testing::ThreeSteps;
using gpt_testing::Tokens;

GptConfig Layers(int64_t n) {
  GptConfig c = SmallConfig();
  c.layers = n;
  return c;
}

struct Interleaving {
  std::string mesh;
  bool sp = false;
  int64_t layers = 4;
  int64_t microbatches = 2;
  int virtual_stages = 2;
  std::vector<int64_t> stage_layers = {};
  std::optional<RecomputeMode> recompute = std::nullopt;
  bool overlap = true;
  int64_t bucket_bytes = int64_t{25} << 20;
};

TrainOptions Options(const Interleaving& k) {
  TrainOptions o = ThreeSteps();
  o.pipeline.microbatches = k.microbatches;
  o.pipeline.schedule = "interleaved_1f1b";
  o.pipeline.virtual_stages = k.virtual_stages;
  o.pipeline.stage_layers = k.stage_layers;
  o.recompute = k.recompute;
  o.overlap.on = k.overlap;
  o.overlap.bucket_bytes = k.bucket_bytes;
  return o;
}

absl::StatusOr<TrainResult> Train(const Interleaving& k) {
  absl::StatusOr<Mesh> mesh = ParseMesh(k.mesh);
  if (!mesh.ok()) return mesh.status();
  absl::StatusOr<GptLayout> layout = GptLayout::Create(*mesh, Layers(k.layers), k.sp);
  if (!layout.ok()) return layout.status();
  return TrainGptPipeline(*layout, InitGpt(Layers(k.layers), 7),
                          Tokens(500, SmallConfig().vocab), Options(k));
}

// The single device's three steps of an n-layer model, once per n.
const TrainResult& Reference(int64_t layers) {
  static auto* refs = new std::map<int64_t, TrainResult>;
  auto it = refs->find(layers);
  if (it != refs->end()) return it->second;
  absl::StatusOr<GptLayout> layout = GptLayout::Create(Mesh(), Layers(layers), false);
  absl::StatusOr<TrainResult> r = TrainGpt(*layout, InitGpt(Layers(layers), 7),
                                           Tokens(500, SmallConfig().vocab), ThreeSteps());
  EXPECT_TRUE(r.ok()) << r.status();
  return (*refs)[layers] = r.ok() ? *r : TrainResult{};
}

void PrintTo(const Interleaving& k, std::ostream* os) {
  *os << "mesh '" << k.mesh << "'" << (k.sp ? " sp" : "") << " layers " << k.layers << " m "
      << k.microbatches << " v " << k.virtual_stages;
}

class GptInterleavedTest : public ::testing::TestWithParam<Interleaving> {};

TEST_P(GptInterleavedTest, ThreeAdamWStepsMatchSingleDevice) {
  const Interleaving& k = GetParam();
  const TrainResult& ref = Reference(k.layers);
  ASSERT_EQ(ref.losses.size(), 3u);
  EXPECT_GT(ref.grad_norms[0], ThreeSteps().optimizer.clip);  // clipping is active
  absl::StatusOr<TrainResult> got = Train(k);
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectSameTraining(*got, ref);
}

INSTANTIATE_TEST_SUITE_P(
    Meshes, GptInterleavedTest,
    ::testing::Values(Interleaving{.mesh = "pp=2", .layers = 4, .microbatches = 4},
                      Interleaving{.mesh = "pp=2", .layers = 4, .microbatches = 2},  // m == p
                      Interleaving{.mesh = "pp=3", .layers = 6, .microbatches = 3},
                      Interleaving{.mesh = "pp=2", .layers = 6, .microbatches = 2,
                                   .virtual_stages = 3},
                      Interleaving{.mesh = "pp=2,dp=2", .layers = 4, .microbatches = 2},
                      Interleaving{.mesh = "pp=2,tp=2", .sp = true, .layers = 4,
                                   .microbatches = 2},
                      // Per-virtual-stage sizes: stage 0 holds layers 0-1 and 3, stage 1 2
                      // and 4-5.
                      Interleaving{.mesh = "pp=2", .layers = 6, .microbatches = 2,
                                   .stage_layers = {2, 1, 1, 2}},
                      Interleaving{.mesh = "pp=2,dp=2", .layers = 4, .microbatches = 2,
                                   .recompute = RecomputeMode::kFull},
                      Interleaving{.mesh = "pp=3", .layers = 6, .microbatches = 3,
                                   .recompute = RecomputeMode::kFull},
                      // FSDP in the stages (stage_fsdp.h): each chunk's units gathered once.
                      Interleaving{.mesh = "pp=2,dp_shard=2", .layers = 4, .microbatches = 2},
                      Interleaving{.mesh = "pp=2,dp_shard=3", .layers = 6, .microbatches = 2,
                                   .virtual_stages = 3, .recompute = RecomputeMode::kFull}),
    [](const ::testing::TestParamInfo<Interleaving>& i) {
      std::string n = absl::StrCat(i.param.mesh, i.param.sp ? "_sp" : "", "_L", i.param.layers,
                                   "_m", i.param.microbatches, "_v", i.param.virtual_stages,
                                   i.param.stage_layers.empty() ? "" : "_sized",
                                   i.param.recompute ? "_full" : "");
      for (char& c : n) {
        if (c == '=' || c == ',') c = '_';
      }
      return n;
    });

void ExpectBitwise(const TrainResult& a, const TrainResult& b) {
  ASSERT_EQ(a.losses.size(), b.losses.size());
  for (size_t i = 0; i < a.losses.size(); ++i) {
    EXPECT_EQ(a.losses[i], b.losses[i]) << "step " << i;
    EXPECT_EQ(a.grad_norms[i], b.grad_norms[i]) << "step " << i;
  }
  ASSERT_EQ(a.params.size(), b.params.size());
  for (size_t i = 0; i < a.params.size(); ++i) {
    EXPECT_EQ(gpt_testing::RelDiff(a.params[i].tensor, b.params[i].tensor), 0.0)
        << a.params[i].name;
  }
}

TEST(GptInterleavedOverlapTest, OverlapOnIsBitwiseOverlapOff) {
  // dp and tp-replicated gradients reduced in buckets as each chunk's become final (1 KiB
  // buckets: many), against one blocking all_reduce per gradient after the pipeline; with full
  // recomputation too.
  for (const char* mesh : {"pp=2,dp=2", "pp=2,dp=3"}) {
    for (bool full : {false, true}) {
      SCOPED_TRACE(absl::StrCat(mesh, full ? " recompute=full" : ""));
      Interleaving k{.mesh = mesh, .layers = 4, .microbatches = 2, .bucket_bytes = 1024};
      if (std::string(mesh) == "pp=2,dp=3") k.layers = 4, k.microbatches = 4;
      if (full) k.recompute = RecomputeMode::kFull;
      absl::StatusOr<TrainResult> on = Train(k);
      k.overlap = false;
      absl::StatusOr<TrainResult> off = Train(k);
      ASSERT_TRUE(on.ok()) << on.status();
      ASSERT_TRUE(off.ok()) << off.status();
      ExpectBitwise(*on, *off);
    }
  }
}

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + name;
}

TEST(GptInterleavedCheckpointTest, SaveAndResumeAcrossInterleavedAndOneDevice) {
  // Checkpoints hold the global parameters by name: two steps interleaved on pp2 x v2 resume on
  // one device, and two on one device resume interleaved, to the uninterrupted run's third step.
  const TrainResult& ref = Reference(4);
  const Interleaving interleaved{.mesh = "pp=2", .layers = 4, .microbatches = 2};
  for (bool save_interleaved : {true, false}) {
    SCOPED_TRACE(save_interleaved ? "interleaved -> one device" : "one device -> interleaved");
    const std::string path = TempPath("interleaved_resume.safetensors");
    TrainOptions first = save_interleaved ? Options(interleaved) : ThreeSteps();
    first.steps = 2;
    first.checkpoint.save_path = path;
    TrainOptions rest = save_interleaved ? ThreeSteps() : Options(interleaved);
    rest.checkpoint.resume_path = path;
    const GptLayout pp2 = *GptLayout::Create(*ParseMesh("pp=2"), Layers(4), false);
    const GptLayout one = *GptLayout::Create(Mesh(), Layers(4), false);
    absl::StatusOr<TrainResult> a = TrainGpt(save_interleaved ? pp2 : one, InitGpt(Layers(4), 7),
                                             Tokens(500, 24), first);
    ASSERT_TRUE(a.ok()) << a.status();
    absl::StatusOr<TrainResult> b = TrainGpt(save_interleaved ? one : pp2, {}, Tokens(500, 24), rest);
    ASSERT_TRUE(b.ok()) << b.status();
    ASSERT_EQ(b->losses.size(), 1u);
    EXPECT_NEAR(b->losses[0], ref.losses[2], 1e-9 * ref.losses[2]);
    for (size_t i = 0; i < ref.params.size(); ++i) {
      EXPECT_LE(gpt_testing::RelDiff(b->params[i].tensor, ref.params[i].tensor), 1e-9)
          << ref.params[i].name;
    }
  }
}

TEST(GptInterleavedEvalTest, ForwardOnlyLossWalksTheVirtualStagesRoundTheRing) {
  // Evaluation's forward-only pass (and the trainer's --eval_every) on pp2 x v2, pp3 x v2 and
  // pp2 x v3 with per-virtual-stage sizes: the one-device loss.
  for (const Interleaving& k :
       {Interleaving{.mesh = "pp=2", .layers = 4, .microbatches = 2},
        Interleaving{.mesh = "pp=3", .layers = 6, .microbatches = 3},
        Interleaving{.mesh = "pp=2", .layers = 7, .microbatches = 2, .virtual_stages = 3,
                     .stage_layers = {1, 2, 1, 1, 1, 1}}}) {
    SCOPED_TRACE(k.mesh + " layers " + std::to_string(k.layers));
    const std::vector<NamedTensor> init = InitGpt(Layers(k.layers), 7);
    const std::vector<int64_t> tokens = Tokens(500, SmallConfig().vocab);
    absl::StatusOr<double> one = EvaluateGpt(*GptLayout::Create(Mesh(), Layers(k.layers), false),
                                             tokens, 2, ThreeSteps(), init);
    absl::StatusOr<double> piped = EvaluateGpt(
        *GptLayout::Create(*ParseMesh(k.mesh), Layers(k.layers), false), tokens, 2, Options(k),
        init);
    ASSERT_TRUE(one.ok()) << one.status();
    ASSERT_TRUE(piped.ok()) << piped.status();
    EXPECT_NEAR(*piped, *one, 1e-12 * *one);
  }
}

TEST(GptInterleavedRefusalTest, EachImpossibleSettingIsRefusedByName) {
  auto error = [](Interleaving k, const std::string& schedule = "interleaved_1f1b") {
    absl::StatusOr<Mesh> mesh = ParseMesh(k.mesh);
    absl::StatusOr<GptLayout> layout = GptLayout::Create(*mesh, Layers(k.layers), false);
    TrainOptions o = Options(k);
    o.pipeline.schedule = schedule;
    absl::StatusOr<RunPlan> plan = PlanRun(*layout, o);
    EXPECT_FALSE(plan.ok());
    EXPECT_TRUE(absl::IsInvalidArgument(plan.status())) << plan.status();
    return std::string(plan.status().message());
  };
  EXPECT_THAT(error({.mesh = "pp=2", .virtual_stages = 0}),
              HasSubstr("--virtual_stages 0 must be >= 1"));
  EXPECT_THAT(error({.mesh = "pp=2", .virtual_stages = 2}, "1f1b"),
              HasSubstr("--virtual_stages 2 with --schedule=1f1b: only the interleaved schedule"));
  EXPECT_THAT(error({.mesh = "pp=2", .virtual_stages = 2}, "gpipe"),
              HasSubstr("use --schedule=interleaved_1f1b or --virtual_stages=1"));
  EXPECT_THAT(error({.mesh = "pp=2", .virtual_stages = 1}),
              HasSubstr("interleaved_1f1b needs --virtual_stages >= 2"));
  EXPECT_THAT(error({.mesh = "dp=2", .microbatches = 2}), HasSubstr("without pp"));
  EXPECT_THAT(error({.mesh = "", .microbatches = 2}), HasSubstr("add pp >= 2 to the mesh"));
  EXPECT_THAT(error({.mesh = "pp=3", .layers = 6, .microbatches = 4}),
              HasSubstr("4 microbatches is not a multiple of 3; use --microbatches=6"));
  EXPECT_THAT(error({.mesh = "pp=2", .layers = 6, .microbatches = 2}),
              HasSubstr("6 layers do not split evenly into pp=2 x --virtual_stages=2 = 4"));
  EXPECT_THAT(error({.mesh = "pp=2", .layers = 3, .microbatches = 2}),
              HasSubstr("3 layers cannot fill pp=2 x --virtual_stages=2 = 4 virtual stages"));
  EXPECT_THAT(error({.mesh = "pp=2", .layers = 4, .microbatches = 2, .stage_layers = {2, 2}}),
              HasSubstr("--stage_layers gives 2 sizes but interleaving needs one per virtual "
                        "stage: pp=2 x --virtual_stages=2 = 4"));
  EXPECT_THAT(error({.mesh = "pp=2", .layers = 4, .microbatches = 2,
                     .stage_layers = {2, 1, 1, 1}}),
              HasSubstr("summing to the 4 layers"));
  EXPECT_THAT(error({.mesh = "pp=2", .layers = 4, .microbatches = 2,
                     .stage_layers = {2, 2, 0, 0}}),
              HasSubstr("give a stage no layers"));
  // grad_accum multiplies the microbatches the groups count.
  Interleaving k{.mesh = "pp=2", .layers = 4, .microbatches = 1};
  TrainOptions o = Options(k);
  o.grad_accum = 3;
  o.batch = 12;
  absl::StatusOr<RunPlan> plan =
      PlanRun(*GptLayout::Create(*ParseMesh("pp=2"), Layers(4), false), o);
  EXPECT_THAT(std::string(plan.status().message()),
              HasSubstr("3 microbatches (--microbatches x --grad_accum) is not a multiple of 2"));
}

TEST(GptInterleavedTraceTest, EveryRankRunsBothChunksOfEveryMicrobatch) {
  // pp2 x dp2, v2, m2: each rank's trace has F and B spans of microbatches 0-1 on chunks 0-1.
  Interleaving k{.mesh = "pp=2,dp=2", .layers = 4, .microbatches = 2};
  TrainOptions o = Options(k);
  o.steps = 1;
  o.tracing.keep_events = true;
  absl::StatusOr<TrainResult> r = TrainGpt(*GptLayout::Create(*ParseMesh(k.mesh), Layers(4), false),
                                           InitGpt(Layers(4), 7), Tokens(500, 24), o);
  ASSERT_TRUE(r.ok()) << r.status();
  std::map<int, std::set<std::string>> spans;
  for (const TraceEvent& e : r->trace) {
    if (e.category == "pipeline") spans[e.rank].insert(e.name);
  }
  ASSERT_EQ(spans.size(), 4u);
  for (const auto& [rank, names] : spans) {
    EXPECT_EQ(names, (std::set<std::string>{"F0.0", "F1.0", "F0.1", "F1.1", "B0.0", "B1.0",
                                            "B0.1", "B1.1"}))
        << "rank " << rank;
  }
}

TEST(GptInterleavedPlanTest, ChunkCOfStageSHoldsVirtualStageCPPlusS) {
  // pp2 x v2 over 4 layers: stage 0 holds blocks 0 and 2 (chunks 0, 1), wte and wpe; stage 1
  // blocks 1 and 3, ln_f and the lm_head's wte copy on its last chunk.
  const GptLayout layout = *GptLayout::Create(*ParseMesh("pp=2"), Layers(4), false);
  absl::StatusOr<RunPlan> plan =
      PlanRun(layout, Options({.mesh = "pp=2", .layers = 4, .microbatches = 2}));
  ASSERT_TRUE(plan.ok()) << plan.status();
  const StagePlan& sp = plan->stage_plan;
  EXPECT_EQ(sp.first_layer, (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(sp.StageLayers(0), 2);
  auto chunk_of = [&](int stage, const std::string& name) {
    const int k = layout.Find(name);
    for (size_t i = 0; i < sp.owned[stage].size(); ++i) {
      if (sp.owned[stage][i] == k) return sp.owned_chunk[stage][i];
    }
    return -1;
  };
  EXPECT_EQ(chunk_of(0, "wte.weight"), 0);
  EXPECT_EQ(chunk_of(0, "wpe.weight"), 0);
  EXPECT_EQ(chunk_of(0, "h.0.attn.c_attn.weight"), 0);
  EXPECT_EQ(chunk_of(0, "h.2.attn.c_attn.weight"), 1);
  EXPECT_EQ(chunk_of(0, "h.1.attn.c_attn.weight"), -1);
  EXPECT_EQ(chunk_of(1, "h.1.attn.c_attn.weight"), 0);
  EXPECT_EQ(chunk_of(1, "h.3.attn.c_attn.weight"), 1);
  EXPECT_EQ(chunk_of(1, "ln_f.weight"), 1);
  EXPECT_EQ(chunk_of(1, "wte.weight"), 1);
  EXPECT_EQ(plan->timetable->virtual_stages(), 2);
}

}  // namespace
}  // namespace shardmap
