// Issue 47: the planner's memory for interleaved 1F1B pipelines in its default mode (recomputing
// variants' memory measured) against the trainer running --schedule=interleaved_1f1b for real on
// CPU ranks, and against plain 1F1B on the same mesh: interleaving holds a few more
// microbatches' activations (the timetable's), not multiples of the whole peak.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "models/planner/gpt_request.h"
#include "models/gpt.h"
#include "models/parallel/pipeline.h"
#include "models/planner/plan.h"
#include "models/planner/shape_only_source.h"
#include "models/train/gpt_shape_only.h"

namespace shardmap::planner {
namespace {

// Four stages of six layers (v = 2 and 3 split them evenly), a vocabulary large enough that
// the last stage's loss temporaries matter (as they do at Megatron's 51200).
const GptConfig kCfg{.layers = 24, .d_model = 64, .heads = 4, .vocab = 1024, .seq = 64,
                     .dtype = DType::kF32};
constexpr int kStages = 4, kMicrobatches = 8;
constexpr int64_t kBatch = 8;

PlanRequest Request(const std::string& mesh) {
  PlanRequest r;
  EXPECT_TRUE(SetGptModel(kCfg, &r).ok());
  r.gpus = kStages;
  r.global_batch = kBatch;
  r.only_meshes = {mesh};
  r.step.overlap = false;  // the trainer's reference schedule (what the CPU run below runs)
  return r;
}

HardwareProfile Gpu() {
  absl::StatusOr<HardwareProfile> hw = LoadHardwareProfile("h100_node");
  EXPECT_TRUE(hw.ok()) << hw.status();
  return *hw;
}

// The planner's row for `mesh` (fitting or not), every role's peak by stage.
std::vector<double> PlannedPeaks(const std::string& mesh) {
  absl::StatusOr<Plan> plan = PlanGpt(Request(mesh), Gpu(), ShapeOnlyProfiler());
  EXPECT_TRUE(plan.ok()) << plan.status();
  if (!plan.ok()) return {};
  const std::vector<PlanRow>& rows = plan->rows.empty() ? plan->unfit : plan->rows;
  EXPECT_EQ(rows.size(), 1u) << FormatPlan(*plan, 0);
  if (rows.empty()) return {};
  std::vector<double> peaks(kStages, 0);
  for (const RoleWork& w : rows[0].roles) {
    peaks[std::max(0, w.pp_stage)] = std::max(peaks[std::max(0, w.pp_stage)], w.peak_bytes);
  }
  return peaks;
}

TrainOptions Interleaved(int v, std::optional<RecomputeMode> rc) {
  TrainOptions o;
  o.steps = 1;
  o.batch = kBatch;
  o.pipeline.microbatches = kMicrobatches;
  o.pipeline.schedule = "interleaved_1f1b";
  o.pipeline.virtual_stages = v;
  o.recompute = rc;
  o.overlap.on = false;
  return o;
}

// A real CPU run of the trainer (rank 0: stage 0) and, for every stage, the trainer's step run
// for real on the CPU device (ProfileGptRank: real ops on zeros), against the planner.
TEST(InterleavedMemoryTest, PlannerMatchesTheTrainersCpuRun) {
  for (int v : {2, 3}) {
    for (bool full : {false, true}) {
      SCOPED_TRACE(absl::StrCat("v=", v, full ? " rc=full" : ""));
      const std::optional<RecomputeMode> rc =
          full ? std::optional<RecomputeMode>(RecomputeMode::kFull) : std::nullopt;
      const std::vector<double> planned = PlannedPeaks(absl::StrCat(
          "pp=", kStages, " interleaved_1f1b/m", kMicrobatches, "/v", v, full ? " rc=full" : ""));
      ASSERT_EQ(planned.size(), static_cast<size_t>(kStages));
      absl::StatusOr<GptLayout> layout =
          GptLayout::Create(*ParseMesh(absl::StrCat("pp=", kStages)), kCfg, false);
      ASSERT_TRUE(layout.ok()) << layout.status();
      const TrainOptions o = Interleaved(v, rc);
      std::vector<int64_t> tokens(4096);
      for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int64_t>(i * 7 % 1024);
      absl::StatusOr<TrainResult> run = TrainGpt(*layout, InitGpt(kCfg, 3), tokens, o);
      ASSERT_TRUE(run.ok()) << run.status();
      // Rank 0's whole memory at its peak: parameters and AdamW moments (held across steps) and
      // the step's own tensors (activations, gradients, temporaries).
      const double measured =
          static_cast<double>(run->param_bytes_per_rank + run->optimizer_bytes_per_rank -
                              run->gradient_bytes_per_rank + run->peak_step_bytes_per_rank);
      EXPECT_NEAR(planned[0] / measured, 1.0, 0.15)
          << "planned " << planned[0] << " B, the trainer's CPU run " << measured << " B";
      for (int s = 0; s < kStages; ++s) {
        absl::StatusOr<StepProfile> cpu = ProfileGptRank(*layout, o, s, "", Device::Cpu());
        ASSERT_TRUE(cpu.ok()) << cpu.status();
        EXPECT_NEAR(planned[s] / static_cast<double>(cpu->peak_bytes), 1.0, 0.15)
            << "stage " << s << ": planned " << planned[s] << " B, the trainer's CPU step "
            << cpu->peak_bytes << " B";
      }
    }
  }
}

// Interleaving costs what its timetable adds: stage s holds MaxInFlight(s) / v stage-sized
// microbatches instead of 1F1B's pp - s, so no stage's peak may grow by more than that ratio
// (its parameters and temporaries do not grow at all), nor the mesh's.
TEST(InterleavedMemoryTest, CostsTheTimetablesExtraMicrobatchesNotMultiples) {
  for (int v : {2, 3}) {
    for (const char* rc : {"", " rc=full"}) {
      SCOPED_TRACE(absl::StrCat("v=", v, rc));
      const std::vector<double> plain =
          PlannedPeaks(absl::StrCat("pp=", kStages, " 1f1b/m", kMicrobatches, rc));
      const std::vector<double> inter = PlannedPeaks(
          absl::StrCat("pp=", kStages, " interleaved_1f1b/m", kMicrobatches, "/v", v, rc));
      ASSERT_EQ(plain.size(), inter.size());
      absl::StatusOr<Timetable> tt =
          MakeTimetable(Schedule::kInterleaved1F1B, kStages, kMicrobatches, v);
      ASSERT_TRUE(tt.ok()) << tt.status();
      double bound = 1;
      for (int s = 0; s < kStages; ++s) {
        const double ratio = static_cast<double>(tt->MaxInFlight(s)) / v / (kStages - s);
        bound = std::max(bound, ratio);
        EXPECT_LE(inter[s], std::max(1.0, ratio) * plain[s] * 1.05) << "stage " << s;
      }
      const double mesh_ratio = *std::max_element(inter.begin(), inter.end()) /
                                *std::max_element(plain.begin(), plain.end());
      EXPECT_GE(mesh_ratio, 0.9);
      EXPECT_LE(mesh_ratio, std::min(bound, 1.5)) << "interleaved / 1F1B peak";
    }
  }
}

}  // namespace
}  // namespace shardmap::planner
