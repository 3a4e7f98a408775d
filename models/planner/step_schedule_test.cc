// The step's two lanes against hand-worked timelines: gradient buckets (the last one exposed),
// FSDP's prefetched gathers (the first exposed, the bound on gathered layers), the backward's
// gathers and reduce-scatters, the asynchronous pipeline's bubble for 1F1B, GPipe and the
// interleaved schedule, and the whole overlapped step against its serial version.
#include "models/planner/step_schedule.h"

#include "gtest/gtest.h"

namespace shardmap::planner {
namespace {

TEST(TwoLanesTest, EachTaskWaitsForItsLaneAndItsDependency) {
  // compute: c0 (2 s), c1 (2 s) after comm m0; comm: m0 (3 s) after c0, m1 (1 s).
  absl::StatusOr<TwoLaneTimes> t = RunTwoLanes({{2, -1}, {2, 0}}, {{3, 0}, {1, -1}});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_DOUBLE_EQ(t->compute_end, 2 + 3 + 2);  // c1 waits for m0 (ends at 5)
  EXPECT_DOUBLE_EQ(t->end, 7);                  // m1 runs 5..6
  EXPECT_DOUBLE_EQ(t->busy, 4);
  EXPECT_DOUBLE_EQ(t->exposed(), 3);
}

TEST(TwoLanesTest, BadDependenciesAreErrors) {
  EXPECT_FALSE(RunTwoLanes({{1, 3}}, {}).ok());             // no comm task 3
  EXPECT_FALSE(RunTwoLanes({{1, 0}}, {{1, 0}}).ok());       // each waits for the other
  EXPECT_TRUE(RunTwoLanes({}, {}).ok());
}

TEST(BucketsTest, OnlyTheLastBucketIsExposedWhenTheLinkKeepsUp) {
  // 4 buckets of 25 bytes over a 4 s backward (1 s each), each reduction 0.5 s: the first three
  // hide under the next second of compute, the last starts at 4 s.
  auto cost = [](double bytes) { return bytes / 50.0; };
  EXPECT_DOUBLE_EQ(*BucketedBackwardSeconds(4, 100, 25, cost), 4.5);
  // A slow link (2 s a bucket): the lane is the bottleneck, 1 + 4 * 2.
  auto slow = [](double bytes) { return bytes / 12.5; };
  EXPECT_DOUBLE_EQ(*BucketedBackwardSeconds(4, 100, 25, slow), 9);
  // A remainder bucket: 30 bytes in 25-byte buckets = 25 + 5.
  EXPECT_DOUBLE_EQ(*BucketedBackwardSeconds(3, 30, 25, cost), 3 + 0.1);
  EXPECT_DOUBLE_EQ(*BucketedBackwardSeconds(3, 0, 25, cost), 3);
  EXPECT_FALSE(BucketedBackwardSeconds(3, 30, 0, cost).ok());
}

TEST(FsdpTest, ForwardExposesTheFirstGatherAndBoundsTheGatheredLayers) {
  // 4 layers of 2 ms, gathers of 1 ms: only the first is exposed.
  EXPECT_DOUBLE_EQ(*FsdpForwardSeconds({.layers = 4, .compute_s = 8, .gather_s = 4}), 9);
  // Gathers of 3 ms with prefetch 1: gather i+1 may start only when layer i-1 is done.
  // g0 0-3, c0 3-5, g1 3-6, c1 6-8, g2 (after c0: 5) 6-9, c2 9-11, g3 (after c1) 9-12, c3 12-14.
  EXPECT_DOUBLE_EQ(*FsdpForwardSeconds({.layers = 4, .compute_s = 8, .gather_s = 12}), 14);
  // Deeper prefetch lets the lane run ahead: the gathers back to back (12) + the last layer.
  EXPECT_DOUBLE_EQ(
      *FsdpForwardSeconds({.layers = 4, .compute_s = 8, .gather_s = 12, .prefetch = 3}), 14);
  EXPECT_DOUBLE_EQ(*FsdpForwardSeconds({.layers = 2, .compute_s = 8, .gather_s = 0}), 8);
  EXPECT_FALSE(FsdpForwardSeconds({.layers = 0}).ok());
  EXPECT_FALSE(FsdpForwardSeconds({.layers = 2, .prefetch = 0}).ok());
}

TEST(FsdpTest, BackwardGathersAgainAndExposesTheLastReduceScatter) {
  // 2 layers of 2 ms; gather 1 ms each, reduce-scatter 1 ms each, prefetch 1.
  // lane: g0 0-1, g1 1-2, [b0 1-3], r0 3-4, [b1 3-5], r1 5-6.
  EXPECT_DOUBLE_EQ(*FsdpBackwardSeconds(
                       {.layers = 2, .compute_s = 4, .gather_s = 2, .reduce_s = 2}),
                   6);
  // Kept from the forward (no gathers): b0 0-2, r0 2-3, b1 2-4, r1 4-5.
  EXPECT_DOUBLE_EQ(*FsdpBackwardSeconds({.layers = 2, .compute_s = 4, .reduce_s = 2}), 5);
  // HSDP: each layer's replicate all-reduce follows its reduce-scatter on the lane.
  EXPECT_DOUBLE_EQ(*FsdpBackwardSeconds(
                       {.layers = 2, .compute_s = 4, .reduce_s = 2, .replicate_s = 2}),
                   6);
}

TEST(AsyncPipelineTest, OneFOneBHasTheTextbookBubbleWithUnequalPasses) {
  // p = 4, m = 8, forward 1, backward 2 per microbatch: (m + p - 1)(f + b) = 33, bubble 3/11.
  double bubble = -1;
  absl::StatusOr<double> t =
      AsyncPipelineSeconds("1f1b", 4, 8, 1, {1, 1, 1, 1}, {2, 2, 2, 2}, 0, &bubble);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_DOUBLE_EQ(*t, 33);
  EXPECT_NEAR(bubble, 3.0 / 11, 1e-12);
  EXPECT_DOUBLE_EQ(*AsyncPipelineSeconds("gpipe", 4, 8, 1, {1, 1, 1, 1}, {2, 2, 2, 2}, 0), 33);
  // Transfers: at least one on each of the 2 (p - 1) hops of fill and drain, and less than
  // lockstep's one per tick (2 (m + p - 1) ticks).
  const double with = *AsyncPipelineSeconds("1f1b", 4, 8, 1, {1, 1, 1, 1}, {2, 2, 2, 2}, 0.5);
  EXPECT_GE(with, 33 + 6 * 0.5);
  EXPECT_LT(with, 33 + 22 * 0.5);
  // One slow stage sets the pace: its m (f + b) plus the others' fill and drain.
  EXPECT_DOUBLE_EQ(*AsyncPipelineSeconds("1f1b", 2, 4, 1, {1, 2}, {2, 4}, 0), 1 + 4 * 6 + 2);
}

TEST(AsyncPipelineTest, InterleavingShrinksTheBubbleByTheChunks) {
  // Megatron-LM's bubble: (p - 1) (f + b) / v on top of m (f + b).
  for (int v : {2, 4}) {
    double bubble = 0;
    absl::StatusOr<double> t = AsyncPipelineSeconds("interleaved_1f1b", 4, 8, v, {1, 1, 1, 1},
                                                    {2, 2, 2, 2}, 0, &bubble);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_NEAR(*t, 8 * 3 + 3.0 * 3 / v, 1e-9) << "v=" << v;
  }
  EXPECT_FALSE(AsyncPipelineSeconds("interleaved_1f1b", 4, 6, 2, {1, 1, 1, 1}, {2, 2, 2, 2}, 0)
                   .ok());  // m not a multiple of p
  EXPECT_FALSE(AsyncPipelineSeconds("1f1b", 4, 8, 1, {1, 1}, {2, 2}, 0).ok());
  EXPECT_FALSE(AsyncPipelineSeconds("zigzag", 4, 8, 1, {1, 1, 1, 1}, {2, 2, 2, 2}, 0).ok());
}

TEST(OverlappedStepTest, OverlapHidesAllButTheUnhideableParts) {
  OverlappedStepInput in;
  in.layers = 4;
  in.forward_s = 4;
  in.backward_s = 8;
  in.optimizer_s = 1;
  in.grad_bytes = 100;
  in.bucket_bytes = 25;
  in.grad_bucket_seconds = [](double bytes) { return bytes / 50.0; };  // 0.5 s a bucket
  // Overlapped: 4 + 8 + the last bucket (0.5) + 1.
  EXPECT_DOUBLE_EQ(*PredictOverlappedStep(in), 13.5);
  in.overlap = false;
  EXPECT_DOUBLE_EQ(*PredictOverlappedStep(in), 4 + 8 + 2 + 1);
  // FSDP, 2 microsteps, resharding: each microstep's forward exposes its first gather (0.25),
  // its backward the first gather and the last reduce-scatter (0.25 + 0.25).
  OverlappedStepInput f;
  f.layers = 4;
  f.forward_s = 4;
  f.backward_s = 8;
  f.microsteps = 2;
  f.fsdp_gather_s = 1;
  f.fsdp_reduce_s = 1;
  EXPECT_DOUBLE_EQ(*PredictOverlappedStep(f), 2 * (4.25 + 8.5));
  f.reshard_after_forward = false;  // gathered once, kept: only the first gather is exposed
  EXPECT_DOUBLE_EQ(*PredictOverlappedStep(f), 4.25 + 8.25 + 4 + 8.25);
  f.overlap = false;
  EXPECT_DOUBLE_EQ(*PredictOverlappedStep(f), 1 + 2 * (4 + 8 + 1));
  f.microsteps = 0;
  EXPECT_FALSE(PredictOverlappedStep(f).ok());
}

}  // namespace
}  // namespace shardmap::planner
