// Shape-only GPT steps against real ones: for dp, FSDP, HSDP, tp+sp, pp (1F1B, GPipe and
// interleaved 1F1B; x FSDP), cp, ep (MoE), gradient accumulation and mixes, on meshes with odd
// sizes, every rank's shape-only profile (one rank run alone, on the meta device and on the
// CPU) has exactly the collectives a real TrainGpt step logs on that rank (a CollectiveRecorder
// per rank thread), the MemoryTracker peak that rank's thread measured, and its FLOPs; the
// roles; the error paths.
#include "models/train/gpt_shape_only.h"

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "collectives/shape_only_communicator.h"
#include "models/parallel/parallel_dims.h"
#include "models/train/shape_only_truth.h"
#include "shardmap/collective_recorder.h"

namespace shardmap {
namespace {

using ::testing::HasSubstr;
using shape_only_testing::RankTruth;
using shape_only_testing::RealStep;

GptConfig Config(bool moe = false, bool bf16 = false) {
  GptConfig c{.layers = 4, .d_model = 12, .heads = 6, .vocab = 24, .seq = 12};
  if (bf16) c.compute = DType::kBF16;  // f32 master weights, bf16 compute
  if (moe) {
    c.moe = MoeConfig{.experts = 6, .topk = 2, .capacity_factor = 1.0, .aux_loss_coef = 0.05};
  }
  return c;
}

struct Case {
  std::string name, mesh;
  bool sp = false;
  int64_t batch = 6, microbatches = 1, grad_accum = 1;
  std::string schedule = "1f1b";
  bool moe = false;
  bool bf16 = false;
  int virtual_stages = 1;
};

std::string CaseName(const ::testing::TestParamInfo<Case>& info) { return info.param.name; }

class ShapeOnlyGptTest : public ::testing::TestWithParam<Case> {};

TEST_P(ShapeOnlyGptTest, EveryRankMatchesTheRealStep) {
  const Case& k = GetParam();
  absl::StatusOr<Mesh> mesh = ParseMesh(k.mesh);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  absl::StatusOr<GptLayout> layout = GptLayout::Create(*mesh, Config(k.moe, k.bf16), k.sp);
  ASSERT_TRUE(layout.ok()) << layout.status();
  TrainOptions o;
  o.batch = k.batch;
  o.pipeline.microbatches = k.microbatches;
  o.grad_accum = k.grad_accum;
  o.pipeline.schedule = k.schedule;
  o.pipeline.virtual_stages = k.virtual_stages;
  // Clipping scales the gradients only when the norm exceeds the limit, a fact of the data: off
  // here so that both runs take the same branch (a meta run reads a norm of 0).
  o.optimizer.clip = 0;
  const std::map<int, RankTruth> truth = RealStep(*layout, o);
  ASSERT_EQ(truth.size(), static_cast<size_t>(mesh->size()));
  for (const Device device : {Device::Cpu(), Device::Meta()}) {
    SCOPED_TRACE(device.ToString());
    for (int rank = 0; rank < mesh->size(); ++rank) {
      SCOPED_TRACE(RankDescription(*mesh, rank));
      absl::StatusOr<StepProfile> p = ProfileGptRank(*layout, o, rank, "", device);
      ASSERT_TRUE(p.ok()) << p.status();
      const RankTruth& t = truth.at(rank);
      ASSERT_EQ(p->collectives.size(), t.log.size());
      int64_t bytes = 0;
      for (size_t i = 0; i < t.log.size(); ++i) {
        SCOPED_TRACE(i);
        const CollectiveTraffic& c = p->collectives[i];
        EXPECT_EQ(c.op, t.log[i].op);
        EXPECT_EQ(c.axes, mesh->AxisNamesOf(t.log[i].axes));
        EXPECT_EQ(c.group_size, mesh->GroupSize(t.log[i].axes));
        EXPECT_EQ(c.bytes, t.log[i].bytes);
        EXPECT_EQ(c.backward, t.log[i].backward);
        EXPECT_EQ(c.dtype, t.log[i].dtype);
        EXPECT_EQ(c.phase == "backward", t.log[i].backward && c.phase != "optimizer");
        bytes += c.bytes;
      }
      EXPECT_EQ(p->collective_bytes, bytes);
      EXPECT_EQ(p->peak_bytes, t.peak);
      EXPECT_DOUBLE_EQ(p->flops, t.flops);
      EXPECT_GT(p->flops, 0);
      EXPECT_GT(p->parameter_bytes, 0);
      EXPECT_EQ(p->optimizer_bytes, 2 * p->parameter_bytes);  // AdamW's two moments
      EXPECT_GE(p->peak_bytes, p->parameter_bytes + p->gradient_bytes + p->optimizer_bytes);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Meshes, ShapeOnlyGptTest,
    ::testing::Values(
        Case{.name = "dp3", .mesh = "dp=3"},
        Case{.name = "fsdp3", .mesh = "dp_shard=3", .batch = 3},
        Case{.name = "hsdp2x3", .mesh = "dp_replicate=2,dp_shard=3"},
        Case{.name = "tp3_sp", .mesh = "tp=3", .sp = true, .batch = 2},
        Case{.name = "pp2_1f1b", .mesh = "pp=2", .batch = 4, .microbatches = 4},
        Case{.name = "pp3_gpipe", .mesh = "pp=3", .batch = 3, .microbatches = 3,
             .schedule = "gpipe"},
        Case{.name = "dp2_cp3", .mesh = "dp=2,cp=3", .batch = 2},
        Case{.name = "ep3_moe", .mesh = "ep=3", .moe = true},
        Case{.name = "pp2_fsdp2_tp2_sp", .mesh = "pp=2,dp_shard=2,tp=2", .sp = true, .batch = 4,
             .microbatches = 2},
        Case{.name = "dp2_cp2_tp3_sp", .mesh = "dp=2,cp=2,tp=3", .sp = true, .batch = 2},
        Case{.name = "dp2_accum2", .mesh = "dp=2", .batch = 8, .grad_accum = 2},
        Case{.name = "fsdp2_tp2_sp_bf16", .mesh = "dp_shard=2,tp=2", .sp = true, .batch = 2,
             .bf16 = true},
        Case{.name = "pp2_tp2_gpipe_bf16", .mesh = "pp=2,tp=2", .batch = 4, .microbatches = 2,
             .schedule = "gpipe", .bf16 = true},
        Case{.name = "pp2_dp2_interleaved_v2", .mesh = "pp=2,dp=2", .batch = 4,
             .microbatches = 2, .schedule = "interleaved_1f1b", .virtual_stages = 2},
        // FSDP in pipeline stages (stage_fsdp.h): placeholders refilled by the flat gathers,
        // freed as each unit's reduce-scatter starts.
        Case{.name = "pp2_fsdp3", .mesh = "pp=2,dp_shard=3", .batch = 6, .microbatches = 2},
        Case{.name = "pp2_fsdp2_interleaved_v2_bf16", .mesh = "pp=2,dp_shard=2", .batch = 4,
             .microbatches = 2, .schedule = "interleaved_1f1b", .bf16 = true,
             .virtual_stages = 2}),
    CaseName);

TEST(ShapeOnlyGpt, ClippingIsTheOneDataDependentBranchAndIsBounded) {
  // With the norm over the limit, the real step scales every gradient (one multiply per element,
  // a new tensor each); a meta run reads a norm of 0 and does not. Same collectives; the FLOPs
  // differ by exactly the gradient elements, the peak by at most the gradients' bytes.
  GptLayout layout = *GptLayout::Create(*ParseMesh("dp=2,tp=2"), Config(), false);
  TrainOptions o;
  o.batch = 2;
  o.optimizer.clip = 1e-6;  // always active
  const std::map<int, RankTruth> truth = RealStep(layout, o);
  for (int rank = 0; rank < 4; ++rank) {
    absl::StatusOr<StepProfile> p = ProfileGptRank(layout, o, rank);
    ASSERT_TRUE(p.ok()) << p.status();
    const RankTruth& t = truth.at(rank);
    ASSERT_EQ(p->collectives.size(), t.log.size());
    for (size_t i = 0; i < t.log.size(); ++i) EXPECT_EQ(p->collectives[i].bytes, t.log[i].bytes);
    EXPECT_DOUBLE_EQ(t.flops - p->flops, static_cast<double>(p->gradient_bytes / 4));
    EXPECT_GE(t.peak, p->peak_bytes);
    EXPECT_LE(t.peak, p->peak_bytes + p->gradient_bytes);
  }
}

TEST(ShapeOnlyGpt, RolesOfAPipeline) {
  absl::StatusOr<GptLayout> layout = GptLayout::Create(*ParseMesh("pp=3,dp=2"), Config(), false);
  ASSERT_TRUE(layout.ok());
  TrainOptions o;
  o.batch = 4;
  o.pipeline.microbatches = 2;
  absl::StatusOr<std::vector<StepProfile>> roles = ProfileGptStep(*layout, o);
  ASSERT_TRUE(roles.ok()) << roles.status();
  ASSERT_EQ(roles->size(), 3u);
  EXPECT_THAT((*roles)[0].role, HasSubstr("pp stage 0 (first): layers 2"));
  EXPECT_THAT((*roles)[2].role, HasSubstr("(last)"));
  EXPECT_EQ((*roles)[1].ranks_like_this, (std::vector<int>{2, 3}));
  EXPECT_EQ((*roles)[2].rank, 4);
  // One rank alone: its role and the ranks of that role.
  absl::StatusOr<StepProfile> one = ProfileGptRank(*layout, o, 3);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_THAT(one->role, HasSubstr("pp stage 1: layers 1"));
  EXPECT_EQ(one->ranks_like_this, (std::vector<int>{2, 3}));
  EXPECT_EQ(one->collectives.size(), (*roles)[1].collectives.size());
  EXPECT_EQ(one->peak_bytes, (*roles)[1].peak_bytes);
  // 1F1B over 3 stages and 2 microbatches: stage 0 runs F0 F1 first; the bubble is (p-1)/(m+p-1)
  // of the ticks on every stage.
  for (const StepProfile& p : *roles) {
    EXPECT_NEAR(p.pipeline_bubble, 2.0 / 4.0, 1e-12);
    EXPECT_EQ(p.pipeline_timetable.size(), 8u);
  }
  EXPECT_EQ((*roles)[0].pipeline_timetable[0], "F0");
  // The first stage embeds and the last computes the loss over the vocabulary: different work.
  EXPECT_NE((*roles)[0].flops, (*roles)[2].flops);
  EXPECT_THAT(FormatStepProfile((*roles)[0]), HasSubstr("ppermute over (pp) of 3"));
  // Interleaved, pp2 x 2 chunks over 4 layers: each stage holds 2 layers in 2 chunks, and its
  // timetable names the chunk (stage 0 starts F0.0 F1.0 F0.1).
  layout = GptLayout::Create(*ParseMesh("pp=2"), Config(), false);
  o.pipeline.schedule = "interleaved_1f1b";
  o.pipeline.virtual_stages = 2;
  roles = ProfileGptStep(*layout, o);
  ASSERT_TRUE(roles.ok()) << roles.status();
  ASSERT_EQ(roles->size(), 2u);
  EXPECT_THAT((*roles)[0].role, HasSubstr("pp stage 0 (first): layers 2 in 2 chunks"));
  ASSERT_GE((*roles)[0].pipeline_timetable.size(), 3u);
  EXPECT_EQ((*roles)[0].pipeline_timetable[2], "F0.1");
  o.pipeline.schedule = "1f1b";
  o.pipeline.virtual_stages = 1;
  // Without a pipeline: one role, every rank.
  layout = GptLayout::Create(*ParseMesh("dp=5"), Config(), false);
  o.batch = 5;
  o.pipeline.microbatches = 1;
  roles = ProfileGptStep(*layout, o);
  ASSERT_TRUE(roles.ok()) << roles.status();
  ASSERT_EQ(roles->size(), 1u);
  EXPECT_EQ((*roles)[0].ranks_like_this.size(), 5u);
  EXPECT_TRUE((*roles)[0].pipeline_timetable.empty());
  for (const CollectiveTraffic& c : (*roles)[0].collectives) {
    EXPECT_EQ(c.phase, "optimizer") << c.op;  // dp: gradient and loss reductions only
  }
}

TEST(ShapeOnlyGpt, ABillionParametersOnThousandsOfRanks) {
  // GPT-3 2.7B-like on 4096 ranks: runs in seconds (bench/shape_only_bench.cc times it).
  GptConfig c{.layers = 8, .d_model = 2560, .heads = 32, .vocab = 50304, .seq = 2048,
              .dtype = DType::kF32, .compute = DType::kBF16};
  absl::StatusOr<GptLayout> layout =
      GptLayout::Create(*ParseMesh("pp=4,dp_shard=128,tp=8"), c, true);
  ASSERT_TRUE(layout.ok()) << layout.status();
  TrainOptions o;
  o.batch = 512;
  o.pipeline.microbatches = 4;
  absl::StatusOr<std::vector<StepProfile>> roles = ProfileGptStep(*layout, o);
  ASSERT_TRUE(roles.ok()) << roles.status();
  ASSERT_EQ(roles->size(), 4u);
  EXPECT_EQ((*roles)[3].ranks_like_this.size(), 1024u);
  // Parameters per rank of stage 1 (layers 2 and 3): each block's f32 shard, its global size
  // (FSDP-padded: StoredShape) over the blocks its spec cuts it into; about 12 d^2 /
  // (dp_shard * tp) per layer.
  int64_t want = 0;
  for (const ParamInfo& pi : layout->params()) {
    if (pi.name.rfind("h.2.", 0) != 0 && pi.name.rfind("h.3.", 0) != 0) continue;
    int64_t n = 1;
    const Shape stored = StoredShape(pi);
    for (int d = 0; d < static_cast<int>(stored.size()); ++d) {
      n *= stored[d] / std::max(1, pi.spec.NumBlocks(layout->mesh(), d));
    }
    want += 4 * n;
  }
  EXPECT_EQ((*roles)[1].parameter_bytes, want);
  EXPECT_NEAR(want, 2 * 12.0 * 2560 * 2560 / (128 * 8) * 4, 0.05 * want);
  EXPECT_EQ((*roles)[1].optimizer_bytes, 2 * want);
  // The step's work: per token and layer about 6 * 12 d^2 FLOPs (forward + backward) over
  // tp; 512 sequences of 2048 tokens over dp_shard 128: 4 sequences x 2 layers on this rank.
  const double gemm = 6.0 * 12 * 2560.0 * 2560 / 8 * (4 * 2048) * 2;
  EXPECT_GT((*roles)[1].gemm_flops, gemm);
  EXPECT_LT((*roles)[1].gemm_flops, 1.5 * gemm);  // + attention scores
  EXPECT_GT((*roles)[1].peak_bytes, 3 * want);
}

TEST(ShapeOnlyGpt, Errors) {
  // A mesh that does not divide the model: the layout says so before any profile.
  absl::StatusOr<GptLayout> bad = GptLayout::Create(*ParseMesh("tp=5"), Config(), false);
  EXPECT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("tp"));
  GptLayout layout = *GptLayout::Create(*ParseMesh("dp=3,tp=2"), Config(), false);
  TrainOptions o;
  auto message = [&](const absl::Status& s) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    return std::string(s.message());
  };
  o.batch = 4;  // not divisible by dp=3: the trainer's own message
  EXPECT_THAT(message(ProfileGptStep(layout, o).status()), HasSubstr("batch 4 is not divisible"));
  o.batch = 6;
  EXPECT_THAT(message(ProfileGptRank(layout, o, 6).status()),
              HasSubstr("rank 6 is outside the 6 ranks"));
  EXPECT_THAT(message(ProfileGptRank(layout, o, -1).status()), HasSubstr("rank -1"));
  TrainOptions save = o;
  save.checkpoint.save_path = "/tmp/x.safetensors";
  EXPECT_THAT(message(ProfileGptStep(layout, save).status()), HasSubstr("save_path"));
  TrainOptions eval = o;
  eval.eval.every = 1;
  EXPECT_THAT(message(ProfileGptStep(layout, eval).status()), HasSubstr("evaluation"));
  TrainOptions lr = o;
  lr.optimizer.adamw.lr = -1;
  EXPECT_THAT(message(ProfileGptStep(layout, lr).status()), HasSubstr("learning rate"));
  EXPECT_THAT(message(ProfileGptRank(layout, o, 0, "", Device::Cuda(0)).status()),
              HasSubstr("meta device"));
  // The trainer's hooks are checked with its other options.
  TrainOptions hooks = o;
  hooks.hooks.only_rank = 2;
  EXPECT_THAT(message(CheckTrainOptions(layout, hooks)), HasSubstr("only_rank 2 needs an spmd_runner"));
  hooks.hooks.spmd_runner = [](const Mesh&, const std::function<void(RankContext&)>&) {
    return absl::OkStatus();
  };
  hooks.hooks.only_rank = 6;
  EXPECT_THAT(message(CheckTrainOptions(layout, hooks)), HasSubstr("(0 to 5)"));
  hooks.hooks.only_rank = -1;
  collectives::ShapeOnlyCommunicator comm(6, 0);
  hooks.runtime.comm = &comm;
  EXPECT_THAT(message(CheckTrainOptions(layout, hooks)), HasSubstr("give one"));
  // A configuration the trainer refuses: a pipeline with cp.
  GptLayout pp_cp = *GptLayout::Create(*ParseMesh("pp=2,cp=2"), Config(), false);
  o.batch = 2;
  o.pipeline.microbatches = 2;
  EXPECT_THAT(message(ProfileGptStep(pp_cp, o).status()), HasSubstr("does not support cp"));
}

}  // namespace
}  // namespace shardmap
