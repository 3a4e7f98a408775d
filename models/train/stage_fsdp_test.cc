// StageFsdp against the independent reference, each parameter's own all_gather and each
// gradient's own reduce_scatter, on pp2 x dp_shard=3 (every rank of both stages): the values at
// use and the shard gradients bitwise, overlapped and not; one call per unit overlapped, one per
// parameter not; the gathered bytes; a rank failing with gathers or reduce-scatters in flight
// fails every rank with its status (no hang); and the error paths.
#include "models/train/stage_fsdp.h"

#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/parallel/pipeline.h"
#include "models/train/gpt_test_util.h"
#include "models/train/run_plan.h"
#include "models/train/strategies.h"
#include "shardmap/collective_ops.h"
#include "shardmap/context.h"
#include "shardmap/type_rules.h"
#include "spmd_testing/testing.h"
#include "tensor/error.h"
#include "tests/test_util.h"

namespace shardmap {
namespace {

using ::testing::HasSubstr;

struct StageSetup {
  GptLayout layout;
  RunPlan plan;
};

StageSetup MakeSetup(const std::string& mesh) {
  GptLayout layout = *GptLayout::Create(*ParseMesh(mesh), gpt_testing::SmallConfig(), false);
  TrainOptions o = gpt_testing::ThreeSteps();
  o.pipeline.microbatches = 2;
  absl::StatusOr<RunPlan> plan = PlanRun(layout, o);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return {std::move(layout), plan.ok() ? *plan : RunPlan{}};
}

std::vector<int64_t> ToVec(const Shape& s) { return std::vector<int64_t>(s.begin(), s.end()); }

// This rank's held shards, different per rank and parameter.
std::vector<Value> Shards(const StageSetup& s, int stage, int rank) {
  const Mesh& mesh = s.layout.mesh();
  std::vector<Value> out;
  for (int i : s.plan.stage_plan.owned[stage]) {
    const ParamInfo& info = s.layout.params()[i];
    out.emplace_back(testing::Rand(ToVec(LocalShape(info, mesh)), 1000 * rank + i),
                     s.plan.ParamType(mesh, info));
  }
  return out;
}

int StageOf(const RankContext& ctx) { return ctx.coord(ctx.mesh().AxisIndex("pp")); }

TEST(StageFsdpTest, BitwiseEachParametersGatherAndScatter) {
  const StageSetup s = MakeSetup("pp=2,dp_shard=3");
  for (bool overlap : {false, true}) {
    SCOPED_TRACE(overlap ? "overlap" : "reference");
    std::mutex mu;
    std::vector<std::string> failures;
    absl::Status st = RunSpmd(s.layout.mesh(), [&](RankContext& ctx) {
      CreateAllCommunicators(ctx);
      const int stage = StageOf(ctx);
      const std::vector<int>& held = s.plan.stage_plan.owned[stage];
      const std::vector<Value> shards = Shards(s, stage, ctx.rank());
      std::vector<std::string> bad;
      // The reference first (its calls are not in the window counted below).
      std::vector<Value> want_full, grads, want_grad;
      int fsdp_params = 0;
      int64_t full_bytes = 0;
      for (size_t k = 0; k < shards.size(); ++k) {
        const int dim = s.layout.params()[held[k]].fsdp_dim;
        Value full = dim < 0 ? shards[k] : all_gather(shards[k], dim, "dp_shard");
        fsdp_params += dim >= 0;
        full_bytes += dim >= 0 ? static_cast<int64_t>(full.tensor.nbytes()) : 0;
        grads.emplace_back(testing::Rand(ToVec(full.shape()), 7000 + 100 * ctx.rank() + k),
                           Dual(full.type));
        Value g = dim < 0 ? grads[k] : reduce_scatter(grads[k], dim, "dp_shard");
        if (dim >= 0) g.type = CotangentType(g.type, shards[k].type);
        want_full.push_back(full);
        want_grad.push_back(g);
      }
      const size_t before = ctx.collective_log().size();
      StageFsdp f(s.layout, s.plan, stage, shards, {.overlap = overlap, .prefetch = 1}, nullptr);
      std::vector<Value> all(s.layout.params().size());
      for (size_t k = 0; k < held.size(); ++k) all[held[k]] = f.params()[k];
      const ParamFn use = f.Use(all);
      for (size_t k = 0; k < held.size(); ++k) {
        const Value got = use(s.layout.params()[held[k]].name);
        if (!testing::TensorsBitwiseEqual(got.tensor, want_full[k].tensor) ||
            got.type != want_full[k].type) {
          bad.push_back(absl::StrCat("value ", k, ": ", got.ToString(), " vs ",
                                     want_full[k].ToString()));
        }
      }
      std::vector<Value> got_grads;
      if (overlap) {
        const auto hook = f.FinalGradHook();
        for (int k = static_cast<int>(held.size()) - 1; k >= 0; --k) hook(k, grads[k]);
        got_grads = f.Finish({});
      } else {
        got_grads = f.Finish(grads);
      }
      for (size_t k = 0; k < held.size() && k < got_grads.size(); ++k) {
        if (!testing::TensorsBitwiseEqual(got_grads[k].tensor, want_grad[k].tensor) ||
            got_grads[k].type != want_grad[k].type) {
          bad.push_back(absl::StrCat("grad ", k, ": ", got_grads[k].ToString(), " vs ",
                                     want_grad[k].ToString()));
        }
      }
      if (got_grads.size() != held.size()) bad.push_back("grads missing");
      int gathers = 0, scatters = 0;
      for (size_t i = before; i < ctx.collective_log().size(); ++i) {
        gathers += std::string(ctx.collective_log()[i].op) == "all_gather";
        scatters += std::string(ctx.collective_log()[i].op) == "reduce_scatter";
      }
      // Units: stage 0 the embeddings and block 0; stage 1 block 1, ln_f and the tied wte.
      const int calls = overlap ? (stage == 0 ? 2 : 3) : fsdp_params;
      if (gathers != calls || scatters != calls) {
        bad.push_back(absl::StrCat(gathers, " gathers and ", scatters, " scatters, want ", calls));
      }
      if (f.peak_gathered_bytes() != full_bytes) {
        bad.push_back(absl::StrCat("peak ", f.peak_gathered_bytes(), " want ", full_bytes));
      }
      std::lock_guard<std::mutex> lock(mu);
      for (const std::string& b : bad) {
        failures.push_back(absl::StrCat("rank ", ctx.rank(), " ", b));
      }
    });
    ASSERT_TRUE(st.ok()) << st;
    EXPECT_TRUE(failures.empty()) << absl::StrJoin(failures, "\n");
  }
}

// Rank 1 fails (a) with its first gathers in flight, (b) with a unit's reduce-scatter in flight:
// every rank's run ends with its status, promptly.
TEST(StageFsdpTest, ARankFailingWithCallsInFlightFailsEveryRank) {
  const StageSetup s = MakeSetup("pp=2,dp_shard=3");
  for (bool mid_scatter : {false, true}) {
    SCOPED_TRACE(mid_scatter ? "reduce-scatter in flight" : "gathers in flight");
    absl::Status st = RunSpmd(s.layout.mesh(), [&](RankContext& ctx) {
      CreateAllCommunicators(ctx);
      const int stage = StageOf(ctx);
      const std::vector<int>& held = s.plan.stage_plan.owned[stage];
      const std::vector<Value> shards = Shards(s, stage, ctx.rank());
      StageFsdp f(s.layout, s.plan, stage, shards, {.overlap = true, .prefetch = 2}, nullptr);
      if (ctx.rank() == 1 && !mid_scatter) OpFail("rank 1 lost its device");
      std::vector<Value> all(s.layout.params().size());
      for (size_t k = 0; k < held.size(); ++k) all[held[k]] = f.params()[k];
      const ParamFn use = f.Use(all);
      for (int i : held) (void)use(s.layout.params()[i].name);
      const auto hook = f.FinalGradHook();
      for (int k = static_cast<int>(held.size()) - 1; k >= 0; --k) {
        hook(k, Value(testing::Rand(ToVec(f.params()[k].shape()), k), Dual(f.params()[k].type)));
        if (ctx.rank() == 1 && mid_scatter && k == 1) OpFail("rank 1 lost its device");
      }
      (void)f.Finish({});
    });
    ASSERT_FALSE(st.ok());
    EXPECT_THAT(std::string(st.message()), HasSubstr("rank 1 lost its device"));
  }
}

TEST(StageFsdpTest, MisuseIsAClearError) {
  const StageSetup pp = MakeSetup("pp=2");
  const StageSetup fsdp = MakeSetup("pp=2,dp_shard=3");
  std::mutex mu;
  std::vector<std::string> errors;
  absl::Status st = RunSpmd(fsdp.layout.mesh(), [&](RankContext& ctx) {
    CreateAllCommunicators(ctx);
    const int stage = StageOf(ctx);
    const std::vector<int>& held = fsdp.plan.stage_plan.owned[stage];
    const std::vector<Value> shards = Shards(fsdp, stage, ctx.rank());
    std::vector<std::string> mine;
    auto expect_error = [&](const std::function<void()>& fn) {
      try {
        fn();
        mine.push_back("no error");
      } catch (const OpError& e) {
        mine.push_back(e.what());
      }
    };
    expect_error([&] { StageFsdp f(pp.layout, pp.plan, stage, shards, {}, nullptr); });
    expect_error([&] { StageFsdp f(fsdp.layout, fsdp.plan, stage, shards, {true, 0}, nullptr); });
    expect_error([&] {
      StageFsdp f(fsdp.layout, fsdp.plan, stage, {shards[0]}, {false, 1}, nullptr);
    });
    expect_error([&] {  // a parameter asked for after its unit's gradients were final
      StageFsdp f(fsdp.layout, fsdp.plan, stage, shards, {true, 1}, nullptr);
      std::vector<Value> all(fsdp.layout.params().size());
      for (size_t k = 0; k < held.size(); ++k) all[held[k]] = f.params()[k];
      const ParamFn use = f.Use(all);
      for (int i : held) (void)use(fsdp.layout.params()[i].name);
      const auto hook = f.FinalGradHook();
      for (int k = static_cast<int>(held.size()) - 1; k >= 0; --k) {
        hook(k, Value(Tensor::Zeros(f.params()[k].shape(), DType::kF64), Dual(f.params()[k].type)));
      }
      (void)f.Finish({});
      (void)use(fsdp.layout.params()[held[0]].name);
    });
    expect_error([&] {  // Finish before every unit's gradients came
      StageFsdp f(fsdp.layout, fsdp.plan, stage, shards, {true, 1}, nullptr);
      std::vector<Value> all(fsdp.layout.params().size());
      for (size_t k = 0; k < held.size(); ++k) all[held[k]] = f.params()[k];
      const ParamFn use = f.Use(all);
      for (int i : held) (void)use(fsdp.layout.params()[i].name);
      (void)f.Finish({});
    });
    std::lock_guard<std::mutex> lock(mu);
    errors.insert(errors.end(), mine.begin(), mine.end());
  });
  EXPECT_TRUE(st.ok()) << st;
  const std::vector<std::string> want = {"has no FSDP axis", "at least 1", "were passed",
                                         "after its gradients were final", "final gradients"};
  ASSERT_EQ(errors.size(), 6 * want.size());
  for (size_t i = 0; i < errors.size(); ++i) {
    EXPECT_THAT(errors[i], HasSubstr(want[i % want.size()])) << i;
  }
}

}  // namespace
}  // namespace shardmap
