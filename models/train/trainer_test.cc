// The trainer's guards: impossible settings are refused before the first step (each with a
// message naming the setting), a non-finite loss or gradient norm stops the run naming the step,
// checkpoint steps outside [0, 2^53] and directories are refused, --steps is the total count,
// and the parallel dims name the mesh's axes.
#include "models/train/trainer.h"

#include <cmath>
#include <fstream>
#include <functional>
#include <memory>
#include <set>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/components/checkpoint.h"
#include "models/gpt/gpt_checkpoint.h"
#include "models/train/gpt_test_util.h"
#include "models/parallel/parallel_dims.h"
#include "models/components/trace_writer.h"
#include "collectives/in_process.h"
#include "collectives/simulated_link.h"
#include "shardmap/spmd_runner.h"
#include "nlohmann/json.hpp"

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
      {[&](TrainOptions& o) { o.optimizer.adamw.lr = nan; }, "learning rate (--lr) nan"},
      {[&](TrainOptions& o) { o.optimizer.adamw.lr = inf; }, "learning rate (--lr) inf"},
      {[](TrainOptions& o) { o.optimizer.adamw.lr = -1; }, "learning rate (--lr) -1 must be finite and >= 0"},
      {[&](TrainOptions& o) { o.optimizer.adamw.beta1 = nan; }, "betas (--beta1, --beta2) = (nan, 0.95)"},
      {[](TrainOptions& o) { o.optimizer.adamw.beta2 = 1.0; }, "must lie in [0, 1)"},
      {[](TrainOptions& o) { o.optimizer.adamw.eps = 0; }, "eps (--eps) 0 must be finite and > 0"},
      {[&](TrainOptions& o) { o.optimizer.adamw.weight_decay = nan; }, "weight decay (--weight_decay) nan"},
      {[](TrainOptions& o) { o.optimizer.adamw.weight_decay = -0.1; }, "weight decay (--weight_decay) -0.1"},
      {[&](TrainOptions& o) { o.optimizer.clip = nan; }, "clip (--clip) nan must be finite"},
      {[](TrainOptions& o) { o.pipeline.microbatches = 0; }, "--microbatches 0 must be >= 1"},
      {[](TrainOptions& o) {
         o.checkpoint.init_path = "a.safetensors";
         o.checkpoint.resume_path = "b.safetensors";
       },
       "both --init ('a.safetensors') and --resume ('b.safetensors') are given"},
      {[](TrainOptions& o) { o.checkpoint.save_path = "/nonexistent-dir/x.safetensors"; },
       "directory '/nonexistent-dir' does not exist"},
      {[](TrainOptions& o) { o.checkpoint.save_path = "/tmp"; }, "'/tmp': it is a directory"},
      {[](TrainOptions& o) { o.checkpoint.init_path = "/tmp"; }, "checkpoint '/tmp' is a directory"},
      {[](TrainOptions& o) { o.checkpoint.resume_path = TempPath("missing.safetensors"); },
       "NOT_FOUND: checkpoint"},
  };
  for (const Case& c : cases) {
    TrainOptions o = ThreeSteps();
    int steps_seen = 0;
    o.hooks.on_step = [&](const StepInfo&) { ++steps_seen; };
    c.set(o);
    EXPECT_THAT(TrainError(o, InitGpt(SmallConfig(), 7)), HasSubstr(c.message));
    EXPECT_EQ(steps_seen, 0) << c.message;
  }
  // lr = 0 and clip = 0 (off) are possible settings.
  TrainOptions zero = ThreeSteps();
  zero.optimizer.adamw.lr = 0;
  zero.optimizer.clip = 0;
  EXPECT_EQ(TrainError(zero, InitGpt(SmallConfig(), 7)), "ok");
}

// CPU ranks never capture a CUDA graph, and the result says why (GPU runs:
// //tests:gpu_train_graph_test; the decision itself: cuda_graph_step_test).
TEST(TrainerOptionsTest, CpuRanksReportWhyTheStepIsNotACudaGraph) {
  absl::StatusOr<TrainResult> r =
      TrainGpt(OneDevice(), InitGpt(SmallConfig(), 7), Tokens(500, 24), ThreeSteps());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->cuda_graph_used);
  EXPECT_EQ(r->cuda_graph_replays, 0);
  EXPECT_THAT(r->cuda_graph_note, HasSubstr("CPU ranks"));
}

TEST(TrainerOptionsTest, NonFiniteLossOrNormStopsTheRunNamingTheStep) {
  // NaN weights in an --init file: step 0's loss is NaN.
  std::vector<NamedTensor> init = InitGpt(SmallConfig(), 7);
  init[0].tensor = Tensor::Full(init[0].tensor.shape(), std::nan(""), init[0].tensor.dtype());
  const std::string path = TempPath("nan_init.safetensors");
  ASSERT_TRUE(SaveGpt(path, OneDevice(), init, nullptr, 0).ok());
  TrainOptions o = ThreeSteps();
  o.checkpoint.init_path = path;
  int steps_seen = 0;
  o.hooks.on_step = [&](const StepInfo&) { ++steps_seen; };
  EXPECT_THAT(TrainError(o, {}),
              AllOf(HasSubstr("FAILED_PRECONDITION"), HasSubstr("step 0: the loss is nan"),
                    HasSubstr("--init file")));
  EXPECT_EQ(steps_seen, 0);
  // The same under dp2 x tp2 and under the pipeline: every rank stops together.
  for (const std::string mesh : {"dp=2,tp=2", "pp=2"}) {
    const GptLayout l = *GptLayout::Create(*ParseMesh(mesh), SmallConfig(), false);
    TrainOptions p = o;
    p.pipeline.microbatches = mesh == "pp=2" ? 2 : 1;
    absl::StatusOr<TrainResult> r = TrainGpt(l, {}, Tokens(500, 24), p);
    EXPECT_THAT(r.status().ToString(), HasSubstr("step 0: the loss is nan")) << mesh;
  }
  // A huge learning rate diverges: the run stops at the first non-finite step, not with exit 0.
  TrainOptions huge = ThreeSteps();
  huge.steps = 20;
  huge.optimizer.adamw.lr = 1e30;
  huge.optimizer.clip = 0;
  std::string e = TrainError(huge, InitGpt(SmallConfig(), 7));
  EXPECT_THAT(e, AllOf(HasSubstr("FAILED_PRECONDITION"), HasSubstr("not finite")));
}

// A world whose calls returned before their work was done reports a failure at the step's sync
// point (NCCL's watchdog, Communicator::AsyncError): here every rank's world at the second step
// (an NCCL world fails for all its ranks).
class FailsAtSecondSync : public collectives::SimulatedLinkCommunicator {
 public:
  FailsAtSecondSync(collectives::Communicator* inner)
      : SimulatedLinkCommunicator(inner, {.ring = {.alpha_s = 0, .busbw = 1e18}}) {}
  absl::Status AsyncError() override {
    if (++syncs_ == 2) return absl::UnavailableError("the watchdog found an AllReduce stuck");
    return absl::OkStatus();
  }

 private:
  int syncs_ = 0;
};

TEST(TrainerOptionsTest, AnAsynchronousCollectiveFailureStopsTheRunAtTheStepsSyncPoint) {
  for (const std::string mesh : {"dp=2", "pp=2", "dp=3"}) {
    SCOPED_TRACE(mesh);
    const GptLayout l = *GptLayout::Create(*ParseMesh(mesh), SmallConfig(), false);
    TrainOptions o = ThreeSteps();
    o.pipeline.microbatches = mesh == "pp=2" ? 2 : 1;
    o.batch = 6;
    std::vector<int64_t> steps_seen;
    o.hooks.on_step = [&](const StepInfo& s) { steps_seen.push_back(s.step); };
    o.hooks.spmd_runner = [](const Mesh& m,
                             const std::function<void(RankContext&)>& body) -> absl::Status {
      return collectives::RunInProcess(m.size(), [&](collectives::Communicator& world) {
        FailsAtSecondSync failing(&world);
        return RunOnCommunicator(failing, m, body);
      });
    };
    absl::StatusOr<TrainResult> r = TrainGpt(l, InitGpt(SmallConfig(), 7), Tokens(500, 24), o);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
    EXPECT_THAT(r.status().ToString(), HasSubstr("the watchdog found an AllReduce stuck"));
    EXPECT_EQ(steps_seen, std::vector<int64_t>{0});  // step 1's numbers were never reported
  }
}

TEST(TrainerCheckpointTest, ResumeStepsOutsideTheRangeAreRefused) {
  const GptLayout layout = OneDevice();
  TrainOptions save = ThreeSteps();
  save.steps = 1;
  save.checkpoint.save_path = TempPath("good.safetensors");
  absl::StatusOr<TrainResult> saved = TrainGpt(layout, InitGpt(SmallConfig(), 7),
                                               Tokens(500, 24), save);
  ASSERT_TRUE(saved.ok()) << saved.status();
  absl::StatusOr<SafetensorsFile> good = SafetensorsFile::Open(save.checkpoint.save_path);
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
    o.checkpoint.resume_path = path;
    EXPECT_THAT(TrainError(o, {}),
                AllOf(HasSubstr("step '" + step + "' is not a whole number in [0, 2^53]")));
  }
  // A step at or past the total has nothing to train; below it, the rest of the steps run.
  TrainOptions o = ThreeSteps();
  o.checkpoint.resume_path = save.checkpoint.save_path;
  o.steps = 1;
  EXPECT_THAT(TrainError(o, {}), HasSubstr("is at step 1 but the run's total is 1 steps"));
  o.steps = 2;
  absl::StatusOr<TrainResult> resumed = TrainGpt(layout, {}, Tokens(500, 24), o);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(resumed->losses.size(), 1u);
  EXPECT_EQ(resumed->steps_done, 2);
}

// ---- The trainer's run features (issue 29) -------------------------------------------------

absl::StatusOr<TrainResult> TrainOnMesh(const std::string& mesh, bool sp, const TrainOptions& o,
                                        const std::vector<int64_t>& tokens = Tokens(500, 24)) {
  absl::StatusOr<Mesh> m = ParseMesh(mesh);
  if (!m.ok()) return m.status();
  absl::StatusOr<GptLayout> layout = GptLayout::Create(*m, SmallConfig(), sp);
  if (!layout.ok()) return layout.status();
  return TrainGpt(*layout, InitGpt(SmallConfig(), 7), tokens, o);
}

TEST(TrainerFeaturesTest, GradientAccumulationGivesTheLargerBatchsNumbers) {
  const TrainResult& ref = gpt_testing::Reference();  // batch 12 at once, one device
  struct Case {
    std::string mesh;
    bool sp;
    int64_t accum, microbatches;
  };
  for (const Case& k : {Case{"", false, 3, 1}, Case{"", false, 2, 1},
                        Case{"dp=2,tp=2", true, 3, 1}, Case{"dp_shard=2,cp=3", false, 2, 1},
                        Case{"pp=2,dp=2", false, 3, 1}, Case{"pp=2", false, 2, 3}}) {
    SCOPED_TRACE(k.mesh + " accum " + std::to_string(k.accum));
    TrainOptions o = ThreeSteps();
    o.grad_accum = k.accum;
    o.pipeline.microbatches = k.microbatches;
    absl::StatusOr<TrainResult> r = TrainOnMesh(k.mesh, k.sp, o);
    ASSERT_TRUE(r.ok()) << r.status();
    gpt_testing::ExpectSameTraining(*r, ref);
  }
  TrainOptions bad = ThreeSteps();
  bad.grad_accum = 5;  // 12 sequences do not split into 5 microsteps
  EXPECT_THAT(TrainOnMesh("", false, bad).status().message(),
              HasSubstr("not divisible by grad_accum 5"));
  bad.grad_accum = 0;
  EXPECT_THAT(TrainOnMesh("", false, bad).status().message(), HasSubstr("--grad_accum 0"));
}

TEST(TrainerFeaturesTest, LearningRateScheduleSetsEachStepsRate) {
  // A constant schedule equal to adamw.lr is the plain run; the step line reports the rate.
  TrainOptions o = ThreeSteps();
  std::vector<double> lrs;
  std::vector<int64_t> totals, tokens_seen;
  o.hooks.on_step = [&](const StepInfo& s) {
    lrs.push_back(s.lr);
    totals.push_back(s.total_steps);
    tokens_seen.push_back(s.tokens_seen);
  };
  o.optimizer.lr_at = [&](int64_t) { return o.optimizer.adamw.lr; };
  absl::StatusOr<TrainResult> same = TrainOnMesh("dp=2", false, o);
  ASSERT_TRUE(same.ok()) << same.status();
  gpt_testing::ExpectSameTraining(*same, gpt_testing::Reference());
  EXPECT_EQ(lrs, (std::vector<double>{1e-2, 1e-2, 1e-2}));
  EXPECT_EQ(totals, (std::vector<int64_t>{3, 3, 3}));
  EXPECT_EQ(tokens_seen, (std::vector<int64_t>{72, 144, 216}));  // 12 sequences x 6 tokens
  // lr 0 at step 1: the parameters do not move (AdamW's decay is lr-scaled too), so steps 1 and
  // 2 see the same parameters only through step 1's (absent) update.
  lrs.clear();
  o.optimizer.lr_at = [](int64_t step) { return step == 1 ? 0.0 : 1e-2; };
  absl::StatusOr<TrainResult> frozen = TrainOnMesh("", false, o);
  ASSERT_TRUE(frozen.ok());
  EXPECT_EQ(lrs, (std::vector<double>{1e-2, 0.0, 1e-2}));
  EXPECT_NE(frozen->losses[2], gpt_testing::Reference().losses[2]);
  // A schedule giving NaN stops the run naming the step.
  o.optimizer.lr_at = [](int64_t step) { return step == 2 ? std::nan("") : 1e-3; };
  EXPECT_THAT(TrainOnMesh("", false, o).status().message(),
              HasSubstr("step 2: the learning-rate schedule gives nan"));
}

TEST(TrainerFeaturesTest, EvaluationReportsTheHeldOutLossOnAnyMesh) {
  // lr 0: the parameters stay InitGpt's, so the validation loss of batch 0 of the training data
  // is the training loss of step 0, on every mesh; evaluated at steps 1 and 2 (the last).
  std::vector<double> expected_val;
  for (auto [mesh, sp] : std::vector<std::pair<std::string, bool>>{
           {"", false}, {"dp=2,tp=2", true}, {"dp_shard=3", false}, {"cp=3", false},
           {"pp=2", false}, {"pp=2,tp=2", true}, {"pp=2,dp=2", false}}) {
    SCOPED_TRACE(mesh);
    TrainOptions o = ThreeSteps();
    if (mesh.rfind("pp", 0) == 0) o.pipeline.microbatches = 2;
    o.optimizer.adamw.lr = 0;
    o.eval.tokens = Tokens(500, 24);
    o.eval.every = 2;
    o.eval.steps = 1;
    o.grad_accum = mesh == "cp=3" ? 2 : 1;
    std::vector<double> val;
    o.hooks.on_step = [&](const StepInfo& s) { val.push_back(s.val_loss); };
    absl::StatusOr<TrainResult> r = TrainOnMesh(mesh, sp, o);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(val.size(), 3u);
    EXPECT_TRUE(std::isnan(val[0]));
    EXPECT_NEAR(val[1], r->losses[0], 1e-12 * r->losses[0]);
    EXPECT_NEAR(val[2], r->losses[0], 1e-12 * r->losses[0]);
  }
  // Two evaluation batches: the mean of the losses of batches 0 and 1 (= training steps 0, 1).
  TrainOptions o = ThreeSteps();
  o.optimizer.adamw.lr = 0;
  o.eval.tokens = Tokens(500, 24);
  o.eval.every = 3;
  o.eval.steps = 2;
  double val = 0;
  o.hooks.on_step = [&](const StepInfo& s) { val = s.val_loss; };
  absl::StatusOr<TrainResult> r = TrainOnMesh("dp=2", false, o);
  ASSERT_TRUE(r.ok());
  EXPECT_NEAR(val, (r->losses[0] + r->losses[1]) / 2, 1e-12);
  // Too little validation data is refused before the first step.
  o.eval.tokens = {1, 2};
  EXPECT_THAT(TrainOnMesh("", false, o).status().message(), HasSubstr("evaluation data"));
}

TEST(TrainerFeaturesTest, PeriodicSnapshotsHoldTheRunSoFar) {
  // Snapshots after steps 1 and 2 (of 3) equal the results of 1- and 2-step runs, on a
  // multi-axis mesh and under a pipeline.
  for (auto [mesh, m] : std::vector<std::pair<std::string, int64_t>>{
           {"dp_shard=2,tp=2", 1}, {"pp=2,dp=2", 2}, {"pp=2,tp=2", 3}}) {
    SCOPED_TRACE(mesh);
    TrainOptions o = ThreeSteps();
    o.pipeline.microbatches = m;
    o.checkpoint.save_every = 1;
    std::vector<TrainResult> snaps;
    o.checkpoint.on_save = [&](const TrainResult& r) {
      snaps.push_back(r);
      return absl::OkStatus();
    };
    absl::StatusOr<TrainResult> full = TrainOnMesh(mesh, false, o);
    ASSERT_TRUE(full.ok()) << full.status();
    ASSERT_EQ(snaps.size(), 3u);
    for (int n = 1; n <= 2; ++n) {
      TrainOptions shorter = ThreeSteps();
      shorter.steps = n;
      absl::StatusOr<TrainResult> want = TrainOnMesh("", false, shorter);
      ASSERT_TRUE(want.ok());
      const TrainResult& got = snaps[n - 1];
      EXPECT_EQ(got.steps_done, n);
      ASSERT_EQ(got.params.size(), want->params.size());
      ASSERT_EQ(got.adam_state.exp_avg.size(), want->params.size());
      for (size_t i = 0; i < want->params.size(); ++i) {
        EXPECT_LE(gpt_testing::RelDiff(got.params[i].tensor, want->params[i].tensor), 1e-9)
            << want->params[i].name;
        EXPECT_LE(gpt_testing::RelDiff(got.adam_state.exp_avg_sq[i].tensor,
                                       want->adam_state.exp_avg_sq[i].tensor),
                  1e-9);
      }
    }
  }
  // A failing save stops the run with the step named.
  TrainOptions o = ThreeSteps();
  o.checkpoint.save_every = 2;
  o.checkpoint.on_save = [](const TrainResult&) { return absl::PermissionDeniedError("disk says no"); };
  EXPECT_THAT(TrainOnMesh("dp=2", false, o).status().message(),
              HasSubstr("saving the checkpoint of step 2: disk says no"));
  o.checkpoint.on_save = nullptr;
  EXPECT_THAT(TrainOnMesh("", false, o).status().message(), HasSubstr("--save_every 2"));
}

TEST(TrainerFeaturesTest, StreamedTraceHoldsOnlyTheChosenSteps) {
  auto run = [](std::function<bool(int64_t)> filter, const std::string& name) {
    const std::string path = TempPath(name);
    absl::StatusOr<std::unique_ptr<TraceWriter>> w = TraceWriter::Open(path);
    EXPECT_TRUE(w.ok()) << w.status();
    TrainOptions o = ThreeSteps();
    o.tracing.writer = w->get();
    o.tracing.step_filter = std::move(filter);
    absl::StatusOr<TrainResult> r = TrainOnMesh("dp=2,tp=2", true, o);
    EXPECT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->trace.empty());  // streamed, not kept
    EXPECT_TRUE((*w)->Close().ok());
    std::ifstream f(path);
    nlohmann::json events = nlohmann::json::parse(f);
    int phases = 0;
    std::set<int> tracks;
    for (const auto& e : events) {
      if (e.value("cat", "") == "phase" && e["name"] == "optimizer") ++phases;
      if (e.value("ph", "") == "X") tracks.insert(e["tid"].get<int>());
    }
    // Each rank's track and its collectives track.
    const int c = kCollectiveTrackBase;
    EXPECT_EQ(tracks, (std::set<int>{0, 1, 2, 3, c, c + 1, c + 2, c + 3}));
    return phases;
  };
  EXPECT_EQ(run([](int64_t s) { return s == 1; }, "one_step.json"), 4);  // 4 ranks x 1 step
  EXPECT_EQ(run(nullptr, "all_steps.json"), 12);                        // 4 ranks x 3 steps
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
