// Activation recomputation (GptConfig::recompute, TrainOptions::recompute) changes no bit: three
// AdamW + clipping steps with recompute=full and =selective give the losses, gradient norms,
// parameters and AdamW moments of recompute=none exactly, in f64 and f32, on one device, dp,
// fsdp, hsdp, fsdp3 x tp2 + SP, dp x tp + SP, tp3 + SP, cp3 (ring attention), pipelines (1F1B,
// GPipe x dp, pp x fsdp), MoE (ep) and bf16 mixed precision. The collective log is none's plus the
// recomputed collectives (FSDP and SP all_gathers / reduce_scatters per block; the ring's
// ppermutes under selective), each tagged recomputed; the shape-only step counts exactly one
// more forward of the blocks (full) or of the attention cores (selective); the activation peak
// falls.
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "models/gpt.h"
#include "models/train/gpt_shape_only.h"
#include "models/train/gpt_test_util.h"
#include "shardmap/context.h"
#include "tensor/op_counter.h"

namespace shardmap {
namespace {

using gpt_testing::SmallConfig;
using gpt_testing::ThreeSteps;
using gpt_testing::Tokens;

struct Case {
  std::string name, mesh;
  bool sp = false;
  int64_t microbatches = 1;
  std::string schedule = "1f1b";
  bool moe = false, bf16 = false;
};

GptConfig ConfigOf(const Case& c, DType dtype) {
  GptConfig cfg = SmallConfig();
  cfg.dtype = dtype;
  if (c.bf16) {
    cfg.dtype = DType::kF32;
    cfg.compute = DType::kBF16;
  }
  if (c.moe) {
    cfg.moe = MoeConfig{.experts = 6, .topk = 2, .capacity_factor = 1.0, .aux_loss_coef = 0.05};
  }
  return cfg;
}

TrainResult TrainWith(const Case& c, DType dtype, std::optional<RecomputeMode> mode,
                      RecomputeMode in_config = RecomputeMode::kNone, int64_t steps = 3,
                      bool overlap = true) {
  GptConfig cfg = ConfigOf(c, dtype);
  cfg.recompute = in_config;
  absl::StatusOr<GptLayout> layout = GptLayout::Create(*ParseMesh(c.mesh), cfg, c.sp);
  EXPECT_TRUE(layout.ok()) << layout.status();
  if (!layout.ok()) return {};
  TrainOptions o = ThreeSteps();
  o.steps = steps;
  o.pipeline.microbatches = c.microbatches;
  o.pipeline.schedule = c.schedule;
  o.recompute = mode;
  o.overlap.on = overlap;
  absl::StatusOr<TrainResult> r = TrainGpt(*layout, InitGpt(cfg, 7), Tokens(500, cfg.vocab), o);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : TrainResult{};
}

bool Bitwise(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

void ExpectBitwiseSame(const TrainResult& got, const TrainResult& ref) {
  ASSERT_EQ(got.losses.size(), ref.losses.size());
  ASSERT_FALSE(ref.losses.empty());
  for (size_t s = 0; s < ref.losses.size(); ++s) {
    EXPECT_EQ(got.losses[s], ref.losses[s]) << "step " << s;
    EXPECT_EQ(got.grad_norms[s], ref.grad_norms[s]) << "step " << s;
  }
  ASSERT_EQ(got.params.size(), ref.params.size());
  for (size_t i = 0; i < ref.params.size(); ++i) {
    EXPECT_TRUE(Bitwise(got.params[i].tensor, ref.params[i].tensor)) << ref.params[i].name;
    EXPECT_TRUE(Bitwise(got.adam_state.exp_avg[i].tensor, ref.adam_state.exp_avg[i].tensor))
        << ref.params[i].name;
  }
}

class RecomputeEquivalenceTest : public ::testing::TestWithParam<Case> {};

TEST_P(RecomputeEquivalenceTest, FullAndSelectiveGiveTheSameBits) {
  for (DType dt : {DType::kF64, DType::kF32}) {
    if (GetParam().bf16 && dt == DType::kF64) continue;  // bf16 compute has f32 master weights
    SCOPED_TRACE(DTypeName(dt));
    const TrainResult none = TrainWith(GetParam(), dt, std::nullopt);
    EXPECT_EQ(none.recompute, "none");
    EXPECT_LT(none.losses.back(), none.losses.front());  // it trains
    for (RecomputeMode m : {RecomputeMode::kFull, RecomputeMode::kSelective}) {
      SCOPED_TRACE(RecomputeModeName(m));
      const TrainResult r = TrainWith(GetParam(), dt, m);
      EXPECT_EQ(r.recompute, RecomputeModeName(m));
      ExpectBitwiseSame(r, none);
      EXPECT_LT(r.peak_activation_bytes_per_rank, none.peak_activation_bytes_per_rank);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, RecomputeEquivalenceTest,
    ::testing::Values(Case{"one_device", ""}, Case{"dp2", "dp=2"},
                      Case{"fsdp2", "dp_shard=2"},
                      Case{"hsdp", "dp_replicate=2,dp_shard=2"},
                      Case{"fsdp3_tp2_sp", "dp_shard=3,tp=2", true},
                      Case{"dp2_tp2_sp", "dp=2,tp=2", true}, Case{"tp3_sp", "tp=3", true},
                      Case{"cp3", "cp=3"}, Case{"pp2_1f1b", "pp=2", false, 2, "1f1b"},
                      Case{"pp2_dp2_gpipe", "pp=2,dp=2", false, 3, "gpipe"},
                      Case{"pp2_fsdp2_1f1b", "pp=2,dp_shard=2", false, 2, "1f1b"},
                      Case{"pp2_fsdp3_gpipe_bf16", "pp=2,dp_shard=3", false, 2, "gpipe", false,
                           true},
                      Case{"ep2_moe", "ep=2", false, 1, "1f1b", true},
                      Case{"dp2_tp2_sp_bf16", "dp=2,tp=2", true, 1, "1f1b", false, true}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

TEST(RecomputeTest, TheConfigFieldAndTheOptionAreTheSameAndTheOptionWins) {
  const Case c{"dp2", "dp=2"};
  const TrainResult via_option = TrainWith(c, DType::kF64, RecomputeMode::kFull);
  const TrainResult via_config = TrainWith(c, DType::kF64, std::nullopt, RecomputeMode::kFull);
  EXPECT_EQ(via_config.recompute, "full");
  ExpectBitwiseSame(via_config, via_option);
  EXPECT_EQ(via_config.peak_activation_bytes_per_rank, via_option.peak_activation_bytes_per_rank);
  const TrainResult overridden =
      TrainWith(c, DType::kF64, RecomputeMode::kNone, RecomputeMode::kFull);
  EXPECT_EQ(overridden.recompute, "none");
  EXPECT_GT(overridden.peak_activation_bytes_per_rank, via_config.peak_activation_bytes_per_rank);
}

// ---- The collectives ---------------------------------------------------------------------------

std::string Key(const CollectiveRecord& r, const Mesh& mesh) {
  return absl::StrCat(r.op, "(", mesh.MaskToString(r.axes), ") ", r.bytes, " B",
                      r.backward ? " bwd" : "");
}

std::map<std::string, int> RecomputedCounts(const std::vector<CollectiveRecord>& log,
                                            const Mesh& mesh) {
  std::map<std::string, int> m;
  for (const CollectiveRecord& r : log) {
    if (r.recomputed) ++m[absl::StrCat(r.op, "(", mesh.MaskToString(r.axes), ")")];
  }
  return m;
}

// The full/selective log, its recomputed records dropped, is none's, in the same order.
void ExpectNoneLogPlusRecomputed(const std::vector<CollectiveRecord>& got,
                                 const std::vector<CollectiveRecord>& none, const Mesh& mesh) {
  std::vector<std::string> a, b;
  for (const CollectiveRecord& r : got) {
    if (r.recomputed) {
      EXPECT_TRUE(r.backward) << Key(r, mesh);
    } else {
      a.push_back(Key(r, mesh));
    }
  }
  for (const CollectiveRecord& r : none) {
    EXPECT_FALSE(r.recomputed);
    b.push_back(Key(r, mesh));
  }
  EXPECT_EQ(a, b);
}

// The reference schedule (overlap off): FSDP gathers each parameter at its use, inside the
// block, so the recomputed block gathers again.
TEST(RecomputeTest, FullReissuesEachBlocksFsdpAndSpCollectivesInTheBackward) {
  const Case c{"fsdp3_tp2_sp", "dp_shard=3,tp=2", true};
  const Mesh mesh = *ParseMesh(c.mesh);
  const TrainResult none =
      TrainWith(c, DType::kF64, std::nullopt, RecomputeMode::kNone, 1, /*overlap=*/false);
  const TrainResult full =
      TrainWith(c, DType::kF64, RecomputeMode::kFull, RecomputeMode::kNone, 1, /*overlap=*/false);
  ExpectNoneLogPlusRecomputed(full.log, none.log, mesh);
  // Per block: the SP all_gathers entering attention and the MLP, the reduce_scatters leaving
  // them, and one all_gather per FSDP-split block parameter.
  const GptLayout layout = *GptLayout::Create(mesh, SmallConfig(), true);
  int fsdp_block_params = 0;
  for (const ParamInfo& p : layout.params()) {
    fsdp_block_params += p.name.rfind("h.", 0) == 0 && p.fsdp_dim >= 0 ? 1 : 0;
  }
  EXPECT_GT(fsdp_block_params, 0);
  const int64_t L = SmallConfig().layers;
  EXPECT_EQ(RecomputedCounts(full.log, mesh),
            (std::map<std::string, int>{{"all_gather(dp_shard)", fsdp_block_params},
                                        {"all_gather(tp)", 2 * L},
                                        {"reduce_scatter(tp)", 2 * L}}));
}

// The overlapped schedule: FSDP's gatherer (models/train/fsdp_params.h) gathers outside the
// recomputed blocks (their captured inputs) and regathers resharded blocks itself, so only the
// SP collectives are recomputed; the step's collectives are otherwise the same as without
// recomputation.
TEST(RecomputeTest, FullWithOverlappedFsdpRecomputesOnlyTheSpCollectives) {
  const Case c{"fsdp3_tp2_sp", "dp_shard=3,tp=2", true};
  const Mesh mesh = *ParseMesh(c.mesh);
  const TrainResult none = TrainWith(c, DType::kF64, std::nullopt, RecomputeMode::kNone, 1);
  const TrainResult full = TrainWith(c, DType::kF64, RecomputeMode::kFull, RecomputeMode::kNone, 1);
  ExpectNoneLogPlusRecomputed(full.log, none.log, mesh);
  const int64_t L = SmallConfig().layers;
  EXPECT_EQ(RecomputedCounts(full.log, mesh),
            (std::map<std::string, int>{{"all_gather(tp)", 2 * L}, {"reduce_scatter(tp)", 2 * L}}));
}

// In pipeline stages FSDP gathers each unit once per step outside the blocks
// (models/train/stage_fsdp.h), in both schedules: a recomputed block re-issues no collective.
TEST(RecomputeTest, FullInFsdpPipelineStagesRecomputesNoCollective) {
  const Case c{"pp2_fsdp2_1f1b", "pp=2,dp_shard=2", false, 2, "1f1b"};
  const Mesh mesh = *ParseMesh(c.mesh);
  for (bool overlap : {false, true}) {
    SCOPED_TRACE(overlap ? "overlap on" : "overlap off");
    const TrainResult none =
        TrainWith(c, DType::kF64, std::nullopt, RecomputeMode::kNone, 1, overlap);
    const TrainResult full =
        TrainWith(c, DType::kF64, RecomputeMode::kFull, RecomputeMode::kNone, 1, overlap);
    ExpectNoneLogPlusRecomputed(full.log, none.log, mesh);
    EXPECT_TRUE(RecomputedCounts(full.log, mesh).empty());
  }
}

TEST(RecomputeTest, SelectiveReissuesOnlyTheRingAttentionsPpermutes) {
  for (const Case& c : {Case{"cp3", "cp=3"}, Case{"dp2_tp2_sp", "dp=2,tp=2", true}}) {
    SCOPED_TRACE(c.name);
    const Mesh mesh = *ParseMesh(c.mesh);
    const TrainResult none = TrainWith(c, DType::kF64, std::nullopt, RecomputeMode::kNone, 1);
    const TrainResult sel =
        TrainWith(c, DType::kF64, RecomputeMode::kSelective, RecomputeMode::kNone, 1);
    ExpectNoneLogPlusRecomputed(sel.log, none.log, mesh);
    int forward_ppermutes = 0;
    for (const CollectiveRecord& r : none.log) {
      forward_ppermutes += std::string(r.op) == "ppermute" && !r.backward ? 1 : 0;
    }
    std::map<std::string, int> expected;
    if (forward_ppermutes > 0) expected["ppermute(cp)"] = forward_ppermutes;
    EXPECT_EQ(RecomputedCounts(sel.log, mesh), expected);
  }
}

// ---- FLOPs and memory of the step (shape-only, exact) ----------------------------------------

GptConfig MidConfig() {
  GptConfig c;
  c.layers = 3;
  c.d_model = 32;
  c.heads = 4;
  c.vocab = 64;
  c.seq = 64;
  c.dtype = DType::kF32;
  return c;
}

StepProfile Profile(RecomputeMode mode) {
  TrainOptions o;
  o.batch = 4;
  o.recompute = mode;
  absl::StatusOr<StepProfile> p =
      ProfileGptRank(*GptLayout::Create(Mesh(), MidConfig(), false), o, 0);
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? *p : StepProfile{};
}

// The FLOPs of one forward of every block, counted on its own (no tape, no trainer).
double BlocksForwardFlops() {
  const GptConfig c = MidConfig();
  GptLayout layout = *GptLayout::Create(Mesh(), c, false);
  SingleRankContext one{Mesh()};
  std::vector<Value> params;
  for (const ParamInfo& p : layout.params()) {
    params.push_back(Value(Tensor::Zeros(p.global_shape, c.dtype, Device::Meta()), SpmdType()));
  }
  const ParamFn use = GptParamUse(layout, params);
  Value x(Tensor::Zeros({4 * c.seq, c.d_model}, c.dtype, Device::Meta()), SpmdType());
  OpCounter counter;
  for (int64_t i = 0; i < c.layers; ++i) x = GptBlock(layout, use, i, x);
  return counter.flops();
}

TEST(RecomputeTest, FullCountsOneMoreForwardOfTheBlocksSelectiveOfTheAttentionCores) {
  const StepProfile none = Profile(RecomputeMode::kNone);
  const StepProfile full = Profile(RecomputeMode::kFull);
  const StepProfile sel = Profile(RecomputeMode::kSelective);
  const double blocks = BlocksForwardFlops();
  EXPECT_GT(blocks, 0);
  EXPECT_EQ(full.flops, none.flops + blocks);
  // The attention core per block: q * scale (rows x d), the scores and the product with v
  // (2 b h t t hd each), the causal softmax (5 per score) and the einsum's sum of v over its
  // size-1 q|k|v dim (rows x d).
  const GptConfig c = MidConfig();
  const double b = 4, h = c.heads, t = c.seq, hd = c.head_dim();
  const double core =
      2 * b * t * c.d_model + 2 * (2 * b * h * t * t * hd) + 5 * b * h * t * t;
  EXPECT_EQ(sel.flops, none.flops + c.layers * core);
  // Activation memory (MemoryTracker's peak less parameters, gradients and moments) falls.
  EXPECT_LT(full.activation_peak_bytes, sel.activation_peak_bytes);
  EXPECT_LT(sel.activation_peak_bytes, none.activation_peak_bytes);
}

}  // namespace
}  // namespace shardmap
