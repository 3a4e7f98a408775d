// SimulatedLinkSpmdRunner drives a whole TrainGpt run over simulated links: the same losses,
// gradient norms and parameters as the plain in-process run (bitwise: the link only delays),
// every rank's collectives paid on the link, and a bad link refused before any rank starts.
#include "models/train/simulated_link_runner.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/train/gpt_test_util.h"

namespace shardmap {
namespace {

TrainResult TrainOn(const std::string& mesh, const TrainOptions& o) {
  absl::StatusOr<Mesh> m = ParseMesh(mesh);
  EXPECT_TRUE(m.ok()) << m.status();
  absl::StatusOr<GptLayout> layout = GptLayout::Create(*m, gpt_testing::SmallConfig(), false);
  EXPECT_TRUE(layout.ok()) << layout.status();
  absl::StatusOr<TrainResult> r =
      TrainGpt(*layout, InitGpt(gpt_testing::SmallConfig(), 7),
               gpt_testing::Tokens(500, gpt_testing::SmallConfig().vocab), o);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : TrainResult{};
}

TEST(SimulatedLinkRunnerTest, ATrainingRunOverTheLinkEqualsThePlainRunBitwise) {
  for (const std::string mesh : {"dp=2", "dp=3"}) {
    const TrainResult plain = TrainOn(mesh, gpt_testing::ThreeSteps());
    TrainOptions o = gpt_testing::ThreeSteps();
    std::vector<collectives::LinkStats> stats;
    const collectives::SimulatedLink link{.ring = {.alpha_s = 1e-4, .busbw = 1e9}};
    o.hooks.spmd_runner = SimulatedLinkSpmdRunner(link, &stats);
    const TrainResult slow = TrainOn(mesh, o);
    ASSERT_EQ(slow.losses.size(), plain.losses.size()) << mesh;
    for (size_t i = 0; i < plain.losses.size(); ++i) {
      EXPECT_EQ(slow.losses[i], plain.losses[i]) << mesh << " step " << i;
    }
    ASSERT_EQ(slow.params.size(), plain.params.size());
    for (size_t k = 0; k < plain.params.size(); ++k) {
      EXPECT_EQ(gpt_testing::RelDiff(slow.params[k].tensor, plain.params[k].tensor), 0.0)
          << mesh << " " << plain.params[k].name;
    }
    ASSERT_EQ(stats.size(), static_cast<size_t>(mesh == "dp=2" ? 2 : 3));
    for (const collectives::LinkStats& s : stats) {
      EXPECT_GT(s.calls, 3) << mesh << ": every step reduces gradients over the link";
      EXPECT_GT(s.modelled_seconds, s.calls * link.ring.alpha_s * 0.999) << mesh;
    }
  }
}

TEST(SimulatedLinkRunnerTest, ABadLinkIsRefusedBeforeTheRanksStart) {
  TrainOptions o = gpt_testing::ThreeSteps();
  o.hooks.spmd_runner = SimulatedLinkSpmdRunner({.ring = {.alpha_s = 0, .busbw = 0}});
  absl::StatusOr<Mesh> m = ParseMesh("dp=2");
  ASSERT_TRUE(m.ok());
  absl::StatusOr<GptLayout> layout = GptLayout::Create(*m, gpt_testing::SmallConfig(), false);
  ASSERT_TRUE(layout.ok());
  absl::StatusOr<TrainResult> r =
      TrainGpt(*layout, InitGpt(gpt_testing::SmallConfig(), 7),
               gpt_testing::Tokens(500, gpt_testing::SmallConfig().vocab), o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_THAT(std::string(r.status().message()), ::testing::HasSubstr("busbw"));
}

}  // namespace
}  // namespace shardmap
