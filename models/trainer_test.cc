// The trainer's guards: impossible settings are refused before the first step (each with a
// message naming the setting), a non-finite loss or gradient norm stops the run naming the step,
// checkpoint steps outside [0, 2^53] and directories are refused, --steps is the total count,
// and the parallel dims name the mesh's axes.
#include "models/trainer.h"

#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/checkpoint.h"
#include "models/gpt_checkpoint.h"
#include "models/gpt_test_util.h"
#include "models/parallel_dims.h"

namespace shardmap {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using gpt_testing::SmallConfig;
using gpt_testing::ThreeSteps;
using gpt_testing::Tokens;

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + name;
}

GptLayout OneDevice() { return *GptLayout::Create(Mesh(), SmallConfig(), false); }

std::string TrainError(const TrainOptions& o, const std::vector<NamedTensor>& init) {
  absl::StatusOr<TrainResult> r = TrainGpt(OneDevice(), init, Tokens(500, 24), o);
  return r.ok() ? std::string("ok") : std::string(r.status().ToString());
}

TEST(TrainerOptionsTest, ImpossibleHyperParametersAreRefusedBeforeTheFirstStep) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  struct Case {
    std::function<void(TrainOptions&)> set;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](TrainOptions& o) { o.steps = 0; }, "steps (--steps) 0 must be >= 1"},
      {[](TrainOptions& o) { o.steps = -1; }, "steps (--steps) -1 must be >= 1"},
      {[&](TrainOptions& o) { o.adamw.lr = nan; }, "learning rate (--lr) nan"},
      {[&](TrainOptions& o) { o.adamw.lr = inf; }, "learning rate (--lr) inf"},
      {[](TrainOptions& o) { o.adamw.lr = -1; }, "learning rate (--lr) -1 must be finite and >= 0"},
      {[&](TrainOptions& o) { o.adamw.beta1 = nan; }, "betas (--beta1, --beta2) = (nan, 0.95)"},
      {[](TrainOptions& o) { o.adamw.beta2 = 1.0; }, "must lie in [0, 1)"},
      {[](TrainOptions& o) { o.adamw.eps = 0; }, "eps (--eps) 0 must be finite and > 0"},
      {[&](TrainOptions& o) { o.adamw.weight_decay = nan; }, "weight decay (--weight_decay) nan"},
      {[](TrainOptions& o) { o.adamw.weight_decay = -0.1; }, "weight decay (--weight_decay) -0.1"},
      {[&](TrainOptions& o) { o.clip = nan; }, "clip (--clip) nan must be finite"},
      {[](TrainOptions& o) { o.microbatches = 0; }, "--microbatches 0 must be >= 1"},
      {[](TrainOptions& o) {
         o.init_path = "a.safetensors";
         o.resume_path = "b.safetensors";
       },
       "both --init ('a.safetensors') and --resume ('b.safetensors') are given"},
      {[](TrainOptions& o) { o.save_path = "/nonexistent-dir/x.safetensors"; },
       "directory '/nonexistent-dir' does not exist"},
      {[](TrainOptions& o) { o.save_path = "/tmp"; }, "'/tmp': it is a directory"},
      {[](TrainOptions& o) { o.init_path = "/tmp"; }, "checkpoint '/tmp' is a directory"},
      {[](TrainOptions& o) { o.resume_path = TempPath("missing.safetensors"); },
       "NOT_FOUND: checkpoint"},
  };
  for (const Case& c : cases) {
    TrainOptions o = ThreeSteps();
    int steps_seen = 0;
    o.on_step = [&](const StepInfo&) { ++steps_seen; };
    c.set(o);
    EXPECT_THAT(TrainError(o, InitGpt(SmallConfig(), 7)), HasSubstr(c.message));
    EXPECT_EQ(steps_seen, 0) << c.message;
  }
  // lr = 0 and clip = 0 (off) are possible settings.
  TrainOptions zero = ThreeSteps();
  zero.adamw.lr = 0;
  zero.clip = 0;
  EXPECT_EQ(TrainError(zero, InitGpt(SmallConfig(), 7)), "ok");
}

TEST(TrainerOptionsTest, NonFiniteLossOrNormStopsTheRunNamingTheStep) {
  // NaN weights in an --init file: step 0's loss is NaN.
  std::vector<NamedTensor> init = InitGpt(SmallConfig(), 7);
  init[0].tensor = Tensor::Full(init[0].tensor.shape(), std::nan(""), init[0].tensor.dtype());
  const std::string path = TempPath("nan_init.safetensors");
  ASSERT_TRUE(SaveGpt(path, OneDevice(), init, nullptr, 0).ok());
  TrainOptions o = ThreeSteps();
  o.init_path = path;
  int steps_seen = 0;
  o.on_step = [&](const StepInfo&) { ++steps_seen; };
  EXPECT_THAT(TrainError(o, {}),
              AllOf(HasSubstr("FAILED_PRECONDITION"), HasSubstr("step 0: the loss is nan"),
                    HasSubstr("--init file")));
  EXPECT_EQ(steps_seen, 0);
  // The same under dp2 x tp2 and under the pipeline: every rank stops together.
  for (const std::string mesh : {"dp=2,tp=2", "pp=2"}) {
    const GptLayout l = *GptLayout::Create(*ParseMesh(mesh), SmallConfig(), false);
    TrainOptions p = o;
    p.microbatches = mesh == "pp=2" ? 2 : 1;
    absl::StatusOr<TrainResult> r = TrainGpt(l, {}, Tokens(500, 24), p);
    EXPECT_THAT(r.status().ToString(), HasSubstr("step 0: the loss is nan")) << mesh;
  }
  // A huge learning rate diverges: the run stops at the first non-finite step, not with exit 0.
  TrainOptions huge = ThreeSteps();
  huge.steps = 20;
  huge.adamw.lr = 1e30;
  huge.clip = 0;
  std::string e = TrainError(huge, InitGpt(SmallConfig(), 7));
  EXPECT_THAT(e, AllOf(HasSubstr("FAILED_PRECONDITION"), HasSubstr("not finite")));
}

TEST(TrainerCheckpointTest, ResumeStepsOutsideTheRangeAreRefused) {
  const GptLayout layout = OneDevice();
  TrainOptions save = ThreeSteps();
  save.steps = 1;
  save.save_path = TempPath("good.safetensors");
  absl::StatusOr<TrainResult> saved = TrainGpt(layout, InitGpt(SmallConfig(), 7),
                                               Tokens(500, 24), save);
  ASSERT_TRUE(saved.ok()) << saved.status();
  absl::StatusOr<SafetensorsFile> good = SafetensorsFile::Open(save.save_path);
  ASSERT_TRUE(good.ok());
  for (const std::string step : {"-1", "4611686018427387904", "abc", "", "9007199254740993"}) {
    SCOPED_TRACE(step);
    std::vector<NamedTensor> tensors;
    for (const SafetensorsEntry& e : good->entries()) {
      tensors.push_back({e.name, *good->Read(e.name)});
    }
    const std::string path = TempPath("bad_step.safetensors");
    ASSERT_TRUE(WriteSafetensors(path, tensors, {{"format", "pt"}, {"step", step}}).ok());
    TrainOptions o = ThreeSteps();
    o.resume_path = path;
    EXPECT_THAT(TrainError(o, {}),
                AllOf(HasSubstr("step '" + step + "' is not a whole number in [0, 2^53]")));
  }
  // A step at or past the total has nothing to train; below it, the rest of the steps run.
  TrainOptions o = ThreeSteps();
  o.resume_path = save.save_path;
  o.steps = 1;
  EXPECT_THAT(TrainError(o, {}), HasSubstr("is at step 1 but the run's total is 1 steps"));
  o.steps = 2;
  absl::StatusOr<TrainResult> resumed = TrainGpt(layout, {}, Tokens(500, 24), o);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(resumed->losses.size(), 1u);
  EXPECT_EQ(resumed->steps_done, 2);
}

TEST(ParallelDimsTest, NamesTheAxesByRole) {
  absl::StatusOr<ParallelDims> d =
      ParallelDims::Create(*ParseMesh("tp=2,dp_shard=3,pp=2,dp_replicate=1,ep=2,cp=1"), true);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->mesh().axis_names(),
            (std::vector<std::string>{axis::kPp, axis::kDpReplicate, axis::kDpShard, axis::kEp,
                                      axis::kCp, axis::kTp}));
  EXPECT_EQ(d->batch_axes(),
            (std::vector<std::string>{axis::kDpReplicate, axis::kDpShard, axis::kEp}));
  EXPECT_EQ(d->batch_ways(), 6);
  EXPECT_EQ(d->fsdp_axis(), axis::kDpShard);
  EXPECT_EQ(d->cp_axis(), axis::kCp);
  EXPECT_EQ(d->cp_ways(), 1);
  EXPECT_EQ(d->pp_ways(), 2);
  EXPECT_TRUE(d->pipelined());
  EXPECT_EQ(d->size(axis::kDp), 1);  // absent
  EXPECT_FALSE(d->has(axis::kDp));
  EXPECT_EQ(d->world(), 24);
  EXPECT_THAT(ParallelDims::Create(*ParseMesh("dp=2"), true).status().message(),
              HasSubstr("--sp (sequence parallelism) needs a tp axis"));
  EXPECT_THAT(ParallelDims::Create(*Mesh::Create({{"tp", 2}, {"dp", 2}}), false)
                  .status()
                  .message(),
              HasSubstr("tp must be the last axis"));
  EXPECT_THAT(ParallelDims::Create(*Mesh::Create({{"dp", 2}, {"pp", 2}}), false)
                  .status()
                  .message(),
              HasSubstr("pp must be the first axis"));
  EXPECT_THAT(ParallelDims::Create(*Mesh::Create({{"x", 2}}), false).status().message(),
              HasSubstr("unknown axis 'x'"));
}

}  // namespace
}  // namespace shardmap
