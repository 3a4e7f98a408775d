// What the summary's memory figures say, against the MemoryTracker and the gathered bytes:
// the activations the tape holds drop when FSDP reshards after the forward (the freed gathers
// are no longer counted); AdamW updates in place, so the step's peak is the forward + backward's
// (within 1.1x) on dp=2, dp_shard=2 and HSDP, with clipping active; a shape-only (meta) run of
// the same step reports the same figures.
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "models/gpt.h"
#include "models/train/gpt_shape_only.h"
#include "models/train/gpt_test_util.h"
#include "models/train/trainer.h"
#include "shardmap/mesh.h"

namespace shardmap {
namespace {

GptConfig Config() {
  GptConfig c = gpt_testing::SmallConfig();
  c.layers = 8;
  c.d_model = 48;
  c.heads = 4;
  c.seq = 32;
  return c;
}

absl::StatusOr<TrainResult> TrainOn(const std::string& mesh, TrainOptions o) {
  absl::StatusOr<GptLayout> layout = GptLayout::Create(*ParseMesh(mesh), Config(), false);
  if (!layout.ok()) return layout.status();
  return TrainGpt(*layout, InitGpt(Config(), 7), gpt_testing::Tokens(500, Config().vocab), o);
}

TEST(StepMemoryTest, ActivationsDropWhenFsdpReshardsAfterForward) {
  TrainOptions o = gpt_testing::ThreeSteps();
  o.steps = 1;
  o.batch = 4;
  int64_t saved[2], gathered[2];
  for (bool reshard : {false, true}) {
    o.overlap.reshard_after_forward = reshard;
    absl::StatusOr<TrainResult> r = TrainOn("dp_shard=2", o);
    ASSERT_TRUE(r.ok()) << r.status();
    saved[reshard] = r->peak_activation_bytes_per_rank;
    gathered[reshard] = r->peak_gathered_bytes_per_rank;
  }
  // Resharding frees the gathers of blocks 0 .. L-2 after their forward; each is regathered for
  // its backward while the tape still holds the forward's activations of the blocks below, so the
  // saved peak falls by what stays freed at the forward's end: at least the L-3 blocks (two may
  // be gathered again, the prefetched and the running one) that the gathered peak loses too.
  EXPECT_LT(saved[1], saved[0]);
  EXPECT_GE(saved[0] - saved[1], gathered[0] - gathered[1] - 2 * (gathered[0] / 8))
      << "saved " << saved[0] << " -> " << saved[1] << ", gathered " << gathered[0] << " -> "
      << gathered[1];
}

TEST(StepMemoryTest, TheStepPeakIsTheForwardAndBackwards) {
  for (const std::string mesh : {"dp=2", "dp_shard=2", "dp_replicate=2,dp_shard=2"}) {
    for (double clip : {0.0, 1e-6}) {  // 1e-6: clipping scales every gradient
      SCOPED_TRACE(absl::StrCat(mesh, " clip ", clip));
      TrainOptions o = gpt_testing::ThreeSteps();
      o.steps = 1;
      o.batch = 8;
      o.optimizer.clip = clip;
      absl::StatusOr<TrainResult> r = TrainOn(mesh, o);
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_GT(r->peak_backprop_bytes_per_rank, 0);
      // After the backward only the gradient reduction's output buffer (an out-of-place
      // all_reduce of the bucket: at most the gradients once more) may add to the peak; AdamW
      // and clipping add nothing.
      EXPECT_LE(r->peak_step_bytes_per_rank,
                r->peak_backprop_bytes_per_rank + r->gradient_bytes_per_rank);
      // With activations the size a training step has (seq 32 x batch 8 against a 48-wide
      // model), that is within 10% of the forward + backward's peak.
      EXPECT_LE(r->peak_step_bytes_per_rank, 1.1 * r->peak_backprop_bytes_per_rank)
          << "step " << r->peak_step_bytes_per_rank << ", forward + backward "
          << r->peak_backprop_bytes_per_rank << ", gradients " << r->gradient_bytes_per_rank;
      // The same figures from a shape-only run of rank 0 (meta tensors, nothing computed).
      absl::StatusOr<GptLayout> layout = GptLayout::Create(*ParseMesh(mesh), Config(), false);
      ASSERT_TRUE(layout.ok());
      absl::StatusOr<StepProfile> p = ProfileGptRank(*layout, o, 0);
      ASSERT_TRUE(p.ok()) << p.status();
      EXPECT_EQ(p->step_tensor_peak_bytes, r->peak_step_bytes_per_rank);
      EXPECT_EQ(p->backprop_tensor_peak_bytes, r->peak_backprop_bytes_per_rank);
      EXPECT_EQ(p->saved_activation_peak_bytes, r->peak_activation_bytes_per_rank);
      EXPECT_EQ(p->gathered_peak_bytes, r->peak_gathered_bytes_per_rank);
      EXPECT_EQ(p->gradient_bytes, r->gradient_bytes_per_rank);
    }
  }
}

}  // namespace
}  // namespace shardmap
