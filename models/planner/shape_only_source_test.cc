#include "models/planner/shape_only_source.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "models/planner/cost_model.h"
#include "models/planner/gpt_request.h"
#include "models/train/trainer.h"

namespace shardmap::planner {
namespace {

TEST(ToRoleWorkTest, ConvertsAStepProfile) {
  StepProfile p;
  p.role = "pp stage 0 (first)";
  p.ranks_like_this = {0, 1};
  p.gemms.push_back({.batch = 2, .m = 8, .n = 16, .k = 4, .dtype = DType::kBF16, .trans_b = true,
                     .count = 3});
  p.ops.push_back({"matmul", DType::kBF16, 3, 2.0 * 2 * 8 * 16 * 4 * 3, 1000});
  p.ops.push_back({"layer_norm", DType::kF32, 2, 800, 4000});
  p.ops.push_back({"causal_attention", DType::kBF16, 1, 5000, 100});
  p.collectives.push_back({"all_gather", {"dp_shard"}, 4, 1024, DType::kF32, false, "forward"});
  p.collectives.push_back({"reduce_scatter", {"dp_shard"}, 4, 4096, DType::kF32, true, "backward"});
  p.collectives.push_back({"all_reduce", {"tp"}, 2, 512, DType::kBF16, false, "forward"});
  p.collectives.push_back({"ppermute", {"pp"}, 2, 256, DType::kBF16, false, "forward"});
  p.collectives.push_back({"all_reduce", {"dp"}, 2, 8192, DType::kF32, false, "optimizer"});
  p.collectives.push_back({"all_reduce", {"pp", "dp"}, 4, 8, DType::kF64, false, "optimizer"});
  p.collectives.push_back({"all_reduce", {"dp"}, 2, 8, DType::kF64, false, "optimizer"});
  p.collectives.push_back({"all_to_all", {"ep"}, 2, 64, DType::kF32, false, "forward"});
  p.collectives.push_back({"ppermute", {"cp"}, 2, 64, DType::kF32, true, "backward"});
  p.peak_bytes = 1 << 20;
  p.activation_peak_bytes = 1 << 19;
  p.parameter_bytes = 100;
  RoleWork w = ToRoleWork(p, 0);
  EXPECT_EQ(w.role, "pp stage 0 (first)");
  EXPECT_EQ(w.ranks, 2);
  EXPECT_EQ(w.pp_stage, 0);
  ASSERT_EQ(w.gemms.size(), 1u);
  EXPECT_EQ(w.gemms[0].count, 3);
  EXPECT_FALSE(w.gemms[0].trans_a);
  EXPECT_TRUE(w.gemms[0].trans_b);  // the layout travels: shape-exact rates key on it
  EXPECT_DOUBLE_EQ(w.gemm_flops(), 2.0 * 2 * 8 * 16 * 4 * 3);
  EXPECT_EQ(w.op_count, 6);  // every op, GEMMs included
  ASSERT_EQ(w.others.size(), 2u);  // matmul is priced by its shape
  EXPECT_FALSE(w.others[0].attention);
  EXPECT_TRUE(w.others[1].attention);
  std::vector<std::string> phases;
  for (const CollectiveWork& c : w.collectives) phases.push_back(c.phase);
  EXPECT_EQ(phases, (std::vector<std::string>{"fsdp", "fsdp", "tp", "pp", "grad", "tied", "norm",
                                              "ep", "cp"}));
  EXPECT_DOUBLE_EQ(w.peak_bytes, 1 << 20);
  EXPECT_DOUBLE_EQ(w.activation_peak_bytes, 1 << 19);
}

PlanRequest Tiny(int gpus) {
  PlanRequest r;
  EXPECT_TRUE(SetGptModel(
      GptConfig{.layers = 2, .d_model = 16, .heads = 4, .vocab = 32, .seq = 8},
      &r).ok());
  r.global_batch = 8;
  r.gpus = gpus;
  return r;
}

TEST(ShapeOnlyProfilerTest, FsdpTpSpMeshOnMeta) {
  absl::StatusOr<Candidate> c = ParseCandidate("dp_shard=2,tp=2", /*sp=*/true, "1f1b", 1);
  ASSERT_TRUE(c.ok());
  absl::StatusOr<std::vector<RoleWork>> roles = ShapeOnlyProfiler()(*c, Tiny(4));
  ASSERT_TRUE(roles.ok()) << roles.status();
  ASSERT_EQ(roles->size(), 1u);
  const RoleWork& w = (*roles)[0];
  EXPECT_EQ(w.pp_stage, -1);
  EXPECT_GT(w.gemm_flops(), 0);
  EXPECT_GT(w.peak_bytes, w.param_bytes);
  auto has = [&](const std::string& op, const std::string& phase) {
    return std::any_of(w.collectives.begin(), w.collectives.end(), [&](const CollectiveWork& x) {
      return x.op == op && x.phase == phase;
    });
  };
  EXPECT_TRUE(has("all_gather", "fsdp"));
  EXPECT_TRUE(has("reduce_scatter", "fsdp"));
  EXPECT_TRUE(has("all_gather", "tp"));      // SP entering a TP region
  EXPECT_TRUE(has("reduce_scatter", "tp"));  // and leaving it
}

TEST(ShapeOnlyProfilerTest, PipelineRolesCoverEveryStageOnCpuAndMetaAlike) {
  absl::StatusOr<Candidate> c = ParseCandidate("pp=2,dp=2", false, "gpipe", 4);
  ASSERT_TRUE(c.ok());
  absl::StatusOr<std::vector<RoleWork>> meta = ShapeOnlyProfiler(Device::Meta())(*c, Tiny(4));
  absl::StatusOr<std::vector<RoleWork>> cpu = ShapeOnlyProfiler(Device::Cpu())(*c, Tiny(4));
  ASSERT_TRUE(meta.ok()) << meta.status();
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  ASSERT_EQ(meta->size(), 2u);
  std::vector<int> stages;
  for (const RoleWork& w : *meta) stages.push_back(w.pp_stage);
  std::sort(stages.begin(), stages.end());
  EXPECT_EQ(stages, (std::vector<int>{0, 1}));
  for (size_t i = 0; i < meta->size(); ++i) {
    EXPECT_DOUBLE_EQ((*meta)[i].gemm_flops(), (*cpu)[i].gemm_flops());
    EXPECT_DOUBLE_EQ((*meta)[i].peak_bytes, (*cpu)[i].peak_bytes);
    EXPECT_EQ((*meta)[i].collectives.size(), (*cpu)[i].collectives.size());
    EXPECT_TRUE(std::any_of((*meta)[i].collectives.begin(), (*meta)[i].collectives.end(),
                            [](const CollectiveWork& x) { return x.phase == "pp"; }));
  }
  // And the cost model takes them: a pipeline with a bubble.
  HardwareProfile hw = *LoadHardwareProfile("h100_node");
  absl::StatusOr<StepPrediction> p = PredictStep(*meta, c->mesh, c->pipeline, hw);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_GT(p->bubble, 0);
}

// A meta rank's token batch is meta (trainer.cc's StepBatch): its rows (cp's load-balanced
// ones, gradient accumulation's microsteps and a pipeline's microbatches included) allocate
// what a CPU rank's host rows do, so the two profiles' peaks agree to the byte.
TEST(ShapeOnlyProfilerTest, MetaTokenBatchCountsAsTheCpuOne) {
  struct Case {
    const char* spec;
    int gpus, microbatches, grad_accum;
  };
  for (const Case& m : {Case{"dp=2,cp=2", 4, 1, 1}, Case{"dp=2,cp=2", 4, 1, 2},
                        Case{"dp=2", 2, 1, 2}, Case{"pp=2,dp=2", 4, 4, 1}}) {
    SCOPED_TRACE(absl::StrCat(m.spec, " ga", m.grad_accum));
    absl::StatusOr<Candidate> c = ParseCandidate(m.spec, false, "1f1b", m.microbatches);
    ASSERT_TRUE(c.ok()) << c.status();
    c->grad_accum = m.grad_accum;
    absl::StatusOr<std::vector<RoleWork>> meta =
        ShapeOnlyProfiler(Device::Meta())(*c, Tiny(m.gpus));
    absl::StatusOr<std::vector<RoleWork>> cpu = ShapeOnlyProfiler(Device::Cpu())(*c, Tiny(m.gpus));
    ASSERT_TRUE(meta.ok() && cpu.ok()) << meta.status() << cpu.status();
    ASSERT_EQ(meta->size(), cpu->size());
    for (size_t i = 0; i < meta->size(); ++i) {
      EXPECT_GT((*meta)[i].peak_bytes, 0);
      EXPECT_EQ((*meta)[i].peak_bytes, (*cpu)[i].peak_bytes);
      EXPECT_EQ((*meta)[i].activation_peak_bytes, (*cpu)[i].activation_peak_bytes);
    }
  }
}

// dp_shard=3 divides none of d_model 16, 4 d 64, vocab 32, seq 8 (only c_attn's 3): the trainer
// pads them (ParamInfo::fsdp_pad), and the planner's memory is the trainer's: per rank each
// parameter's ceil(rows / 3) rows, the gradients as much, the moments twice, the same as a real
// TrainGpt run holds; the breakdown names the summary's parts.
TEST(ShapeOnlyProfilerTest, FsdpPaddingIsPricedAsTheTrainerHoldsIt) {
  absl::StatusOr<Candidate> c = ParseCandidate("dp_shard=3", false, "1f1b", 1);
  ASSERT_TRUE(c.ok());
  const GptConfig config{.layers = 2, .d_model = 16, .heads = 4, .vocab = 32, .seq = 8};
  PlanRequest req = Tiny(3);  // the same GPT
  req.global_batch = 3;
  absl::StatusOr<std::vector<RoleWork>> roles = ShapeOnlyProfiler()(*c, req);
  ASSERT_TRUE(roles.ok()) << roles.status();
  ASSERT_EQ(roles->size(), 1u);
  const RoleWork& w = (*roles)[0];
  const GptLayout layout = *GptLayout::Create(*ParseMesh("dp_shard=3"), config, false);
  double want = 0, unpadded = 0;
  for (const ParamInfo& p : layout.params()) {
    ASSERT_GE(p.fsdp_dim, 0) << p.name;
    const int64_t n = NumElements(p.global_shape), rows = p.global_shape[p.fsdp_dim];
    want += 4.0 * ((rows + 2) / 3) * (n / rows);  // ceil(rows / 3) rows, f32
    unpadded += 4.0 * n / 3;
  }
  EXPECT_DOUBLE_EQ(w.param_bytes, want);
  EXPECT_GT(w.param_bytes, unpadded);  // the padding is priced
  EXPECT_DOUBLE_EQ(w.grad_bytes, want);
  EXPECT_DOUBLE_EQ(w.optimizer_bytes, 2 * want);
  absl::StatusOr<TrainResult> real = TrainGpt(layout, InitGpt(config, 1),
                                               std::vector<int64_t>(64, 1),
                                               CandidateTrainOptions(*c, req));
  ASSERT_TRUE(real.ok()) << real.status();
  EXPECT_DOUBLE_EQ(w.param_bytes, real->param_bytes_per_rank);
  EXPECT_DOUBLE_EQ(w.grad_bytes, real->gradient_bytes_per_rank);
  const std::string text = FormatMemory(RoleMemory(w));
  for (const char* part : {"parameters ", "gradients ", "optimizer state ", " saved at most",
                           "step peak "}) {
    EXPECT_NE(text.find(part), std::string::npos) << part << " in " << text;
  }
}

TEST(ShapeOnlyProfilerTest, FrameworkErrorsComeBack) {
  Candidate c = *ParseCandidate("tp=4", false, "1f1b", 1);
  PlanRequest r = Tiny(4);
  r.args.heads = 2;
  absl::StatusOr<std::vector<RoleWork>> roles = ShapeOnlyProfiler()(c, r);
  EXPECT_FALSE(roles.ok());
  EXPECT_NE(roles.status().message().find("heads"), std::string::npos) << roles.status();
}

}  // namespace
}  // namespace shardmap::planner
