// The overlapped step changes no bit: on dp, fsdp (dp_shard), hsdp, dp x tp + SP, an odd dp and
// a pipeline mesh, in f64 and f32, with and without gradient accumulation, five AdamW steps with
// gradients reduced in buckets started during the backward (at the default 25 MiB and at 1 KiB,
// which makes many buckets) give the losses, gradient norms and parameters of the reference
// schedule (one blocking all_reduce per gradient after the backward) bitwise. The collective log
// shows the buckets: fewer, larger all-reduces, the full ones issued during the backward.
#include <chrono>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensor/error.h"
#include "tensor/memory_tracker.h"
#include "models/gpt.h"
#include "models/train/gpt_test_util.h"
#include "shardmap/mesh.h"
#include "spmd_testing/testing.h"

namespace shardmap {
namespace {

using gpt_testing::SmallConfig;
using gpt_testing::Tokens;

struct Case {
  std::string mesh;
  bool sp = false;
  DType dtype = DType::kF64;
  int64_t grad_accum = 1;
  int64_t microbatches = 1;  // > 1: a pipeline (mesh has pp)
  int64_t layers = 2;
  int prefetch = 1;
  bool reshard = true;
  bool mixed = false;  // bf16 compute, f32 master weights
  int virtual_stages = 1;  // > 1: interleaved 1F1B
};

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  std::string n = c.mesh + (c.sp ? "_sp" : "") + (c.dtype == DType::kF32 ? "_f32" : "_f64") +
                  "_ga" + std::to_string(c.grad_accum) + "_mb" + std::to_string(c.microbatches) +
                  "_l" + std::to_string(c.layers) + "_pf" + std::to_string(c.prefetch) +
                  (c.reshard ? "" : "_keep") + (c.mixed ? "_bf16" : "") +
                  (c.virtual_stages > 1 ? "_v" + std::to_string(c.virtual_stages) : "");
  for (char& ch : n) {
    if (ch == '=' || ch == ',') ch = '_';
  }
  return n;
}

TrainResult TrainCase(const Case& c, bool overlap, int64_t bucket_bytes) {
  GptConfig cfg = SmallConfig();
  cfg.dtype = c.dtype;
  cfg.layers = c.layers;
  if (c.mixed) cfg.compute = DType::kBF16;
  absl::StatusOr<Mesh> m = ParseMesh(c.mesh);
  EXPECT_TRUE(m.ok()) << m.status();
  absl::StatusOr<GptLayout> layout = GptLayout::Create(*m, cfg, c.sp);
  EXPECT_TRUE(layout.ok()) << layout.status();
  TrainOptions o = gpt_testing::ThreeSteps();
  o.steps = 5;
  o.grad_accum = c.grad_accum;
  o.pipeline.microbatches = c.microbatches;
  if (c.virtual_stages > 1) {
    o.pipeline.schedule = "interleaved_1f1b";
    o.pipeline.virtual_stages = c.virtual_stages;
  }
  o.overlap.on = overlap;
  o.overlap.bucket_bytes = bucket_bytes;
  o.overlap.fsdp_prefetch = c.prefetch;
  o.overlap.reshard_after_forward = c.reshard;
  absl::StatusOr<TrainResult> r = TrainGpt(*layout, InitGpt(cfg, 7), Tokens(500, cfg.vocab), o);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : TrainResult{};
}

int CountAllReduces(const std::vector<CollectiveRecord>& log, bool backward) {
  int n = 0;
  for (const CollectiveRecord& r : log) n += std::string(r.op) == "all_reduce" && r.backward == backward;
  return n;
}

class OverlapTest : public ::testing::TestWithParam<Case> {};

TEST_P(OverlapTest, BucketsChangeNoBit) {
  const Case& c = GetParam();
  const TrainResult ref = TrainCase(c, /*overlap=*/false, int64_t{25} << 20);
  ASSERT_EQ(ref.losses.size(), 5u);
  for (int64_t bucket : {int64_t{25} << 20, int64_t{1024}}) {
    SCOPED_TRACE(absl::StrCat("bucket bytes ", bucket));
    const TrainResult got = TrainCase(c, /*overlap=*/true, bucket);
    ASSERT_EQ(got.losses.size(), 5u);
    for (int s = 0; s < 5; ++s) {
      EXPECT_EQ(got.losses[s], ref.losses[s]) << "step " << s;
      EXPECT_EQ(got.grad_norms[s], ref.grad_norms[s]) << "step " << s;
    }
    ASSERT_EQ(got.params.size(), ref.params.size());
    for (size_t i = 0; i < ref.params.size(); ++i) {
      EXPECT_TRUE(testing::TensorsBitwiseEqual(got.params[i].tensor, ref.params[i].tensor))
          << ref.params[i].name;
    }
    // The reference reduces after the backward, gradient by gradient; the buckets are fewer,
    // and at 1 KiB the full ones start during the backward (logged as backward collectives).
    const int ref_after = CountAllReduces(ref.log, false);
    const int got_during = CountAllReduces(got.log, true) - CountAllReduces(ref.log, true);
    const int got_after = CountAllReduces(got.log, false);
    if (ref_after > 2) {
      EXPECT_LT(got_during + got_after, ref_after);
      if (bucket == 1024) {
        EXPECT_GT(got_during, 0);
      }
    }
  }
}

// A rank that fails while its gradient buckets are in flight (started during the backward,
// not yet waited) fails the whole run with its own error, promptly: the others, waiting for
// those buckets, see the poisoned world instead of hanging.
TEST(OverlapFaultTest, ARankFailingMidBucketFailsTheRunWithItsStatus) {
  // The pipeline: HSDP in the stages, whose gradient shards (reduce-scattered during the last
  // backward, stage_fsdp.h) fill dp_replicate buckets started before the failure.
  for (const char* mesh : {"dp=3", "dp_shard=2", "dp_replicate=2,dp_shard=2",
                           "pp=2,dp_replicate=2,dp_shard=2"}) {
    SCOPED_TRACE(mesh);
    GptConfig cfg = SmallConfig();
    cfg.layers = 3;
    absl::StatusOr<GptLayout> layout = GptLayout::Create(*ParseMesh(mesh), cfg, false);
    ASSERT_TRUE(layout.ok()) << layout.status();
    TrainOptions o = gpt_testing::ThreeSteps();
    o.overlap.bucket_bytes = 512;  // many buckets, most started during the backward
    if (std::string(mesh).rfind("pp=", 0) == 0) o.pipeline.microbatches = 3;
    o.hooks.on_phase = [](const char* phase) {
      if (std::string(phase) == "optimizer" && RankContext::Current()->rank() == 1) {
        throw OpError(absl::DataLossError("rank 1 lost its device"));
      }
    };
    const auto t0 = std::chrono::steady_clock::now();
    absl::StatusOr<TrainResult> r = TrainGpt(*layout, InitGpt(cfg, 7), Tokens(500, cfg.vocab), o);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << r.status();
    EXPECT_THAT(std::string(r.status().message()), ::testing::HasSubstr("rank 1 lost its device"));
    EXPECT_LT(s, 30) << "the other ranks waited for the failed rank's buckets";
  }
}

// FSDP's reshard_after_forward in the forward + backward's MemoryTracker peak (rank 0,
// TrainResult::peak_backprop_bytes_per_rank: activations, gathered parameters, gradients;
// AdamW's temporaries, the whole step's peak on so small a model, come after): without it every
// block's gathered parameters are alive when the backward begins; with it at most the last
// block and two more (the one whose backward runs and the prefetched one), so the peak falls
// by at least L - 3 blocks' gathered bytes: FSDP's (1 - 1/dp_shard) parameter saving holds
// during the step too.
TEST(OverlapMemoryTest, ReshardAfterForwardKeepsFewGatheredBlocks) {
  for (int n : {2, 3}) {
    SCOPED_TRACE(absl::StrCat("dp_shard=", n));
    GptConfig c = SmallConfig();
    c.layers = 8;
    c.d_model = 48;
    c.heads = 4;
    absl::StatusOr<GptLayout> layout =
        GptLayout::Create(*ParseMesh(absl::StrCat("dp_shard=", n)), c, false);
    ASSERT_TRUE(layout.ok()) << layout.status();
    int64_t block_bytes = 0;  // one block's parameters, gathered (f64)
    for (const ParamInfo& p : layout->params()) {
      if (p.name.rfind("h.0.", 0) == 0) block_bytes += NumElements(p.global_shape) * 8;
    }
    TrainOptions o = gpt_testing::ThreeSteps();
    o.steps = 1;
    o.batch = 2 * n;
    int64_t peak[2], gathered[2];
    for (bool reshard : {false, true}) {
      o.overlap.reshard_after_forward = reshard;
      absl::StatusOr<TrainResult> r = TrainGpt(*layout, InitGpt(c, 7), Tokens(500, c.vocab), o);
      ASSERT_TRUE(r.ok()) << r.status();
      peak[reshard] = r->peak_backprop_bytes_per_rank;
      gathered[reshard] = r->peak_gathered_bytes_per_rank;
    }
    EXPECT_GE(peak[0] - peak[1], (c.layers - 3) * block_bytes)
        << "peak without reshard " << peak[0] << ", with " << peak[1] << ", block " << block_bytes;
    EXPECT_LE(gathered[1], gathered[0] - (c.layers - 3) * block_bytes);
    EXPECT_GE(gathered[0], c.layers * block_bytes);  // every block at once without
  }
}

// The backward's first regather (block L-2: the last block stays gathered) is started as the
// last block's backward begins, before that block's reduce-scatter, not after it: in the log
// (calls are logged when they start) the first backward all_gather precedes the second
// backward reduce_scatter (the first is the final LayerNorm's).
TEST(OverlapScheduleTest, TheFirstRegatherIsPrefetchedAcrossTheLastBlock) {
  for (int layers : {3, 4}) {
    SCOPED_TRACE(absl::StrCat("layers=", layers));
    GptConfig c = SmallConfig();
    c.layers = layers;
    absl::StatusOr<GptLayout> layout = GptLayout::Create(*ParseMesh("dp_shard=2"), c, false);
    ASSERT_TRUE(layout.ok()) << layout.status();
    TrainOptions o = gpt_testing::ThreeSteps();
    o.steps = 1;
    std::vector<std::string> backward;
    o.hooks.on_step = [&](const StepInfo& s) {
      if (s.log == nullptr) return;
      for (const CollectiveRecord& r : *s.log) {
        if (r.backward) backward.push_back(r.op);
      }
    };
    absl::StatusOr<TrainResult> r = TrainGpt(*layout, InitGpt(c, 7), Tokens(500, c.vocab), o);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_GE(backward.size(), 3u);
    EXPECT_EQ(backward[0], "reduce_scatter");  // the final LayerNorm's
    EXPECT_EQ(backward[1], "all_gather") << absl::StrJoin(backward, " ");
    EXPECT_EQ(backward[2], "reduce_scatter");  // the last block's
  }
}

// FSDP in a pipeline stage (pp2 x dp_shard=2, 3 microbatches; rank 0 is stage 0: the embeddings
// and block 0): each unit is gathered once per step and its gradients reduce-scattered once,
// overlapped: one flat call per unit, the reduce-scatters issued during the last backward; off:
// one blocking call per parameter each way, the reduce-scatters after the backward. The same
// bytes either way (f64: the gathers move the master dtype).
TEST(OverlapPipelineFsdpTest, EachUnitIsGatheredAndReducedOncePerStep) {
  GptConfig c = SmallConfig();
  absl::StatusOr<GptLayout> layout = GptLayout::Create(*ParseMesh("pp=2,dp_shard=2"), c, false);
  ASSERT_TRUE(layout.ok()) << layout.status();
  int stage0_fsdp = 0;  // FSDP-sharded parameters of stage 0
  for (const ParamInfo& p : layout->params()) {
    const bool stage0 = p.name.rfind("h.0.", 0) == 0 || p.name == "wte.weight" ||
                        p.name == "wpe.weight";
    stage0_fsdp += stage0 && p.fsdp_dim >= 0;
  }
  ASSERT_GT(stage0_fsdp, 2);
  struct Tally {
    int gathers = 0, scatters = 0, scatters_in_backward = 0, calls = 0;
    int64_t gather_bytes = 0, scatter_bytes = 0;
  };
  Tally t[2];
  for (bool on : {false, true}) {
    TrainOptions o = gpt_testing::ThreeSteps();
    o.steps = 1;
    o.pipeline.microbatches = 3;
    o.overlap.on = on;
    absl::StatusOr<TrainResult> r = TrainGpt(*layout, InitGpt(c, 7), Tokens(500, c.vocab), o);
    ASSERT_TRUE(r.ok()) << r.status();
    for (const CollectiveRecord& rec : r->log) {
      const std::string op = rec.op;
      ++t[on].calls;
      if (op == "all_gather") {
        ++t[on].gathers;
        t[on].gather_bytes += rec.bytes;
      }
      if (op == "reduce_scatter") {
        ++t[on].scatters;
        t[on].scatters_in_backward += rec.backward;
        t[on].scatter_bytes += rec.bytes;
      }
    }
    EXPECT_EQ(r->peak_gathered_bytes_per_rank, t[on].gather_bytes * 2) << on;  // all of stage 0
  }
  std::cout << "pp=2,dp_shard=2, 3 microbatches, rank 0: off " << t[0].calls << " calls ("
            << t[0].gathers << " all_gather, " << t[0].scatters << " reduce_scatter), on "
            << t[1].calls << " calls (" << t[1].gathers << " all_gather, " << t[1].scatters
            << " reduce_scatter)\n";
  EXPECT_EQ(t[0].gathers, stage0_fsdp);
  EXPECT_EQ(t[0].scatters, stage0_fsdp);
  EXPECT_EQ(t[0].scatters_in_backward, 0);
  EXPECT_EQ(t[1].gathers, 2);  // the embeddings, block 0
  EXPECT_EQ(t[1].scatters, 2);
  EXPECT_EQ(t[1].scatters_in_backward, 2);
  EXPECT_EQ(t[1].gather_bytes, t[0].gather_bytes);
  EXPECT_EQ(t[1].scatter_bytes, t[0].scatter_bytes);
}

INSTANTIATE_TEST_SUITE_P(
    Meshes, OverlapTest,
    ::testing::Values(Case{"dp=2"}, Case{"dp=3", false, DType::kF32},
                      Case{"dp=2", false, DType::kF64, /*grad_accum=*/3},
                      Case{"dp_shard=2"}, Case{"dp_shard=2", false, DType::kF32},
                      Case{"dp_replicate=2,dp_shard=2"},
                      Case{"dp_replicate=2,dp_shard=2", false, DType::kF32, 3},
                      Case{"dp=2,tp=2", true}, Case{"dp=2,tp=2", true, DType::kF32},
                      Case{"pp=2,dp=2", false, DType::kF64, 1, /*microbatches=*/3},
                      Case{"pp=2,dp=2", false, DType::kF32, 1, 2},
                      // FSDP's prefetch and reshard over 5 blocks, odd dp_shard, mixed precision.
                      Case{"dp_shard=2", false, DType::kF64, 1, 1, 5, 1},
                      Case{"dp_shard=3", false, DType::kF32, 1, 1, 5, 2},
                      Case{"dp_shard=2", false, DType::kF64, 2, 1, 5, 3, /*reshard=*/false},
                      Case{"dp_replicate=2,dp_shard=2", false, DType::kF32, 1, 1, 5, 2},
                      Case{"dp_shard=2,tp=2", true, DType::kF64, 1, 1, 5, 1},
                      Case{"dp_shard=2", false, DType::kF32, 1, 1, 5, 1, true, /*mixed=*/true},
                      // FSDP in pipeline stages (stage_fsdp.h): gathered once per step, reduced
                      // once; odd dp_shard, accumulation, prefetch 2, HSDP, interleaved, bf16.
                      Case{"pp=2,dp_shard=2", false, DType::kF64, 1, 3},
                      Case{"pp=2,dp_shard=2", false, DType::kF32, 2, 3},
                      Case{"pp=2,dp_shard=3", false, DType::kF64, 1, 2},
                      Case{"pp=2,dp_shard=3", false, DType::kF32, 1, 2, 5, 2},
                      Case{"pp=2,dp_replicate=2,dp_shard=2", false, DType::kF64, 1, 3},
                      Case{"pp=2,dp_shard=2", false, DType::kF64, 1, 2, 4, 1, true, false, 2},
                      Case{"pp=2,dp_shard=2", false, DType::kF32, 1, 3, 2, 1, true, true}),
    CaseName);

}  // namespace
}  // namespace shardmap
