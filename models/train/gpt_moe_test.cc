// GPT-2 with mixture-of-experts MLPs (models/parallel/moe.h) is a pure refactoring across expert
// layouts: three f64 AdamW + clipping steps on ep2, ep3, dp2 x ep3, ep2 x tp2 (+sp), experts
// folded over dp2 or dp_shard2 (FSDP for the dense parameters) give the single-device losses,
// gradient norms, parameters and per-step dropped assignments (1e-9 relative); impossible
// layouts are errors before training.
#include <cmath>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/gpt.h"
#include "models/train/gpt_test_util.h"
#include "tests/test_util.h"

namespace shardmap {
namespace {

using ::testing::HasSubstr;

GptConfig MoeGpt(std::vector<std::string> expert_axes = {}) {
  GptConfig c = gpt_testing::SmallConfig();
  // capacity ceil(1.0 * 6 * 2 / 6) = 2 per expert and sequence: some assignments are dropped.
  c.moe = MoeConfig{.experts = 6, .topk = 2, .capacity_factor = 1.0, .aux_loss_coef = 0.05,
                    .expert_axes = std::move(expert_axes)};
  return c;
}

std::vector<int64_t> Tokens(int64_t n, int64_t vocab) {
  std::vector<int64_t> t(n);
  for (int64_t i = 0; i < n; ++i) t[i] = ((i % 9) * 5 + (i / 45) % 3) % vocab;
  return t;
}

absl::StatusOr<TrainResult> TrainMoe(const std::string& mesh, bool sp, const GptConfig& cfg) {
  absl::StatusOr<Mesh> m = ParseMesh(mesh);
  if (!m.ok()) return m.status();
  absl::StatusOr<GptLayout> layout = GptLayout::Create(*m, cfg, sp);
  if (!layout.ok()) return layout.status();
  TrainOptions o;
  o.steps = 3;
  o.batch = 12;
  o.optimizer.adamw.lr = 1e-2;
  o.optimizer.clip = 0.5;
  // Initialised from the config without expert axes: the same global tensors on every mesh.
  GptConfig init = cfg;
  init.moe.expert_axes.clear();
  return TrainGpt(*layout, InitGpt(init, 7), Tokens(500, cfg.vocab), o);
}

const TrainResult& Reference() {
  static const TrainResult* ref = [] {
    absl::StatusOr<TrainResult> r = TrainMoe("", false, MoeGpt());
    EXPECT_TRUE(r.ok()) << r.status();
    return new TrainResult(r.ok() ? *r : TrainResult{});
  }();
  return *ref;
}

double RelDiff(const Tensor& a, const Tensor& b) {
  double scale = 0;
  for (int64_t i = 0; i < b.numel(); ++i) scale = std::max(scale, std::fabs(b.at(i)));
  return testing::MaxAbsDiff(a, b) / std::max(scale, 1e-30);
}

struct Layout {
  std::string mesh;
  bool sp;
  std::vector<std::string> expert_axes;
  std::string name;
};

class GptMoeTest : public ::testing::TestWithParam<Layout> {};

TEST_P(GptMoeTest, ThreeAdamWStepsMatchSingleDevice) {
  const TrainResult& ref = Reference();
  ASSERT_EQ(ref.losses.size(), 3u);
  EXPECT_LT(ref.losses[2], ref.losses[0]);
  ASSERT_EQ(ref.moe_dropped.size(), 3u);
  EXPECT_GT(ref.moe_dropped[0], 0) << "the reference should drop assignments at capacity 2";
  absl::StatusOr<TrainResult> got =
      TrainMoe(GetParam().mesh, GetParam().sp, MoeGpt(GetParam().expert_axes));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->moe_dropped, ref.moe_dropped);
  for (int s = 0; s < 3; ++s) {
    EXPECT_NEAR(got->losses[s], ref.losses[s], 1e-9 * std::fabs(ref.losses[s])) << "step " << s;
    EXPECT_NEAR(got->grad_norms[s], ref.grad_norms[s], 1e-9 * ref.grad_norms[s]) << "step " << s;
  }
  ASSERT_EQ(got->params.size(), ref.params.size());
  for (size_t i = 0; i < ref.params.size(); ++i) {
    EXPECT_EQ(got->params[i].name, ref.params[i].name);
    EXPECT_LE(RelDiff(got->params[i].tensor, ref.params[i].tensor), 1e-9) << ref.params[i].name;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, GptMoeTest,
    ::testing::Values(Layout{"ep=2", false, {}, "ep2"}, Layout{"ep=3", false, {}, "ep3"},
                      Layout{"dp=2,ep=3", false, {}, "dp2_ep3"},
                      Layout{"ep=2,tp=2", false, {}, "ep2_tp2"},
                      Layout{"ep=2,tp=2", true, {}, "ep2_tp2_sp"},
                      Layout{"dp=2", false, {"dp"}, "folded_dp2"},
                      Layout{"dp_shard=2,ep=3", false, {"dp_shard", "ep"}, "folded_fsdp2_ep3"}),
    [](const auto& info) { return info.param.name; });

// Per layer: two all_to_alls over ep forward (dispatch, combine) and their two transposes
// backward, each moving the capacity-padded buffer [E, G*C, d]: 6 experts x (12 sequences / 2
// ranks x capacity 2) x d 12 f64 = 6912 bytes.
TEST(GptMoeTest, DispatchAndCombineAreAllToAllsOverEp) {
  absl::StatusOr<TrainResult> r = TrainMoe("ep=2", false, MoeGpt());
  ASSERT_TRUE(r.ok()) << r.status();
  int fwd = 0, bwd = 0;
  for (const CollectiveRecord& c : r->log) {
    if (std::string(c.op) != "all_to_all") continue;
    EXPECT_EQ(c.bytes, 6 * (12 / 2 * 2) * 12 * 8);
    ++(c.backward ? bwd : fwd);
  }
  EXPECT_EQ(fwd, 2 * 2);
  EXPECT_EQ(bwd, 2 * 2);
}

TEST(GptMoeTest, ImpossibleLayoutsAreErrorsBeforeTraining) {
  auto error = [](const std::string& mesh, GptConfig cfg) {
    absl::StatusOr<Mesh> m = ParseMesh(mesh);
    if (!m.ok()) return m.status().ToString();
    return GptLayout::Create(*m, cfg, false).status().ToString();
  };
  GptConfig dense = MoeGpt();
  dense.moe.experts = 0;
  EXPECT_THAT(error("ep=2", dense), HasSubstr("has an ep axis but the model has no experts"));
  GptConfig negative = MoeGpt();
  negative.moe.experts = -1;  // not a dense model: --experts=-1 is a mistake
  EXPECT_THAT(error("dp=2", negative), HasSubstr("experts = -1; expected >= 0"));
  EXPECT_THAT(error("ep=2", negative), HasSubstr("experts = -1; expected >= 0"));
  GptConfig odd = MoeGpt();
  odd.moe.experts = 5;
  EXPECT_THAT(error("ep=2", odd), HasSubstr("5 experts are not divisible by the 2"));
  GptConfig big_k = MoeGpt();
  big_k.moe.topk = 7;
  EXPECT_THAT(error("ep=2", big_k), HasSubstr("topk = 7 with 6 experts"));
  GptConfig seq8 = MoeGpt();
  seq8.seq = 8;
  EXPECT_THAT(error("ep=2,cp=2", seq8), HasSubstr("MoE with cp=2"));
  EXPECT_THAT(error("ep=2,tp=2", MoeGpt({"tp"})), HasSubstr("expert axis 'tp' is not a batch axis"));
  EXPECT_THAT(error("dp=4", MoeGpt({"dp"})), HasSubstr("6 experts are not divisible by the 4"));
}

}  // namespace
}  // namespace shardmap
