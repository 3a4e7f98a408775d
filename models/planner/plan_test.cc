#include "models/planner/plan.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "models/planner/gpt_request.h"
#include "models/planner/shape_only_source.h"

namespace shardmap::planner {
namespace {

HardwareProfile Node(int gpus_per_node = 4) {
  HardwareProfile p;
  p.name = "test_node";
  p.gpus_per_node = gpus_per_node;
  p.memory_bytes = 1e12;
  p.memory_bandwidth = 1e9;
  p.gemm[DType::kF32] = {{1, 1e9}};
  p.peak_flops[DType::kF32] = 2e9;
  p.intra = {1e-6, 1e9};
  p.inter = {1e-5, 1e8};
  return p;
}

PlanRequest Small(int gpus) {
  PlanRequest r;
  EXPECT_TRUE(SetGptModel(
      GptConfig{.layers = 2, .d_model = 16, .heads = 4, .vocab = 32, .seq = 8},
      &r).ok());
  r.global_batch = 8;
  r.gpus = gpus;
  r.schedules = {"1f1b"};
  r.microbatch_factors = {1};
  return r;
}

// A stand-in for the shape-only run: 1 GFLOP of GEMMs split over the mesh, a tp all_reduce of
// 1 MB per rank, memory = 1 GB / (tp x dp_shard x pp).
Profiler FakeProfiler(double memory = 1e9) {
  return [memory](const Candidate& c, const PlanRequest&) -> absl::StatusOr<std::vector<RoleWork>> {
    std::vector<RoleWork> roles;
    const int pp = c.pipeline.stages;
    for (int s = 0; s < std::max(1, pp); ++s) {
      RoleWork w;
      w.pp_stage = pp > 1 || c.pipeline.microbatches > 1 ? s : -1;
      const int64_t k = 1000000 / c.mesh.world();
      w.gemms.push_back({.m = 1, .n = 500, .k = k});
      const int tp = c.mesh.size("tp");
      if (tp > 1) w.collectives.push_back({"all_reduce", {"tp"}, tp, 1e6, false, "tp"});
      w.peak_bytes = memory / (tp * c.mesh.size("dp_shard") * pp);
      roles.push_back(w);
    }
    return roles;
  };
}

bool Refused(const Plan& p, const std::string& name, const std::string& why) {
  for (const Refusal& r : p.refused) {
    if (r.candidate == name && absl::StrContains(r.reason, why)) return true;
  }
  return false;
}

TEST(EnumerateTest, CountsAndRefusalsOnFourGpus) {
  std::vector<Refusal> refused;
  absl::StatusOr<std::vector<Candidate>> c = EnumerateCandidates(Small(4), Node(), &refused);
  ASSERT_TRUE(c.ok()) << c.status();
  // pp=1: tp=1 {dp=4, dp_shard=4, dp_replicate=2 x dp_shard=2, cp=2 x {dp, dp_shard}, cp=4} = 6,
  //       tp=2 x {no sp, sp} x {dp=2, dp_shard=2, cp=2} = 6, tp=4 x {no sp, sp} = 2;
  // pp=2: {dp=2, dp_shard=2, cp=2} + tp=2 x 2 = 5; pp=4: 1. 20 in all; pp=2,cp=2 (no cp under a
  // pipeline) and pp=4 (4 stages for 2 layers) refused.
  EXPECT_EQ(c->size() + refused.size(), 20u);
  EXPECT_EQ(c->size(), 18u);
  ASSERT_EQ(refused.size(), 2u);
  Plan p;
  p.refused = refused;
  EXPECT_TRUE(Refused(p, "pp=2,cp=2 1f1b/m2", "cp"));
  EXPECT_TRUE(Refused(p, "pp=4 1f1b/m4", "layers"));
  for (const Candidate& x : *c) EXPECT_EQ(x.mesh.world(), 4) << x.Name();
  // Every (mesh, sp) pair once.
  std::vector<std::string> names;
  for (const Candidate& x : *c) names.push_back(x.Name());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(std::unique(names.begin(), names.end()), names.end());
}

TEST(EnumerateTest, TpStaysInsideANodeUnlessAsked) {
  PlanRequest r = Small(8);
  r.args.heads = 8;
  std::vector<Refusal> refused;
  ASSERT_TRUE(EnumerateCandidates(r, Node(4), &refused).ok());
  Plan p;
  p.refused = refused;
  EXPECT_TRUE(Refused(p, "tp=8", "spans more than a node of 4"));
  r.tp_across_nodes = true;
  refused.clear();
  absl::StatusOr<std::vector<Candidate>> c = EnumerateCandidates(r, Node(4), &refused);
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(std::any_of(c->begin(), c->end(), [](const Candidate& x) { return x.Name() == "tp=8"; }));
}

TEST(EnumerateTest, MaxPpAndCpLimitTheEnumeration) {
  PlanRequest r = Small(4);
  r.max_pp = 1;
  r.max_cp = 2;
  std::vector<Refusal> refused;
  absl::StatusOr<std::vector<Candidate>> c = EnumerateCandidates(r, Node(), &refused);
  ASSERT_TRUE(c.ok());
  // 18 + 2 refused without limits; less every pp (5 + 1) and cp=4 (1).
  EXPECT_EQ(c->size() + refused.size(), 13u);
  for (const Candidate& x : *c) {
    EXPECT_EQ(x.mesh.size("pp"), 1);
    EXPECT_LE(x.mesh.size("cp"), 2);
  }
}

TEST(EnumerateTest, BadRequestsGetClearErrors) {
  std::vector<Refusal> refused;
  PlanRequest r = Small(0);
  EXPECT_TRUE(absl::StrContains(EnumerateCandidates(r, Node(), &refused).status().message(),
                                "--gpus 0 must be >= 1"));
  r = Small(6);  // 1.5 nodes of 4
  EXPECT_TRUE(absl::StrContains(EnumerateCandidates(r, Node(), &refused).status().message(),
                                "not a whole number of nodes"));
  r = Small(4);
  r.global_batch = 0;
  EXPECT_FALSE(EnumerateCandidates(r, Node(), &refused).ok());
  r = Small(4);
  r.only_meshes = {"dp=2,tp=4"};  // 8 ranks for 4 GPUs: the mesh does not divide
  EXPECT_TRUE(absl::StrContains(EnumerateCandidates(r, Node(), &refused).status().message(),
                                "must multiply to the GPU count"));
  r.only_meshes = {"dp=2,tp=2 +xp"};
  EXPECT_TRUE(absl::StrContains(EnumerateCandidates(r, Node(), &refused).status().message(),
                                "neither +sp"));
  r.only_meshes = {"qq=4"};
  EXPECT_TRUE(absl::StrContains(EnumerateCandidates(r, Node(), &refused).status().message(),
                                "unknown axis"));
}

TEST(EnumerateTest, OnlyMeshesTakesSpAndPipeline) {
  PlanRequest r = Small(4);
  r.only_meshes = {"pp=2,dp=2 gpipe/m4", "dp=2,tp=2 +sp"};
  std::vector<Refusal> refused;
  absl::StatusOr<std::vector<Candidate>> c = EnumerateCandidates(r, Node(), &refused);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->size(), 2u);
  EXPECT_EQ((*c)[0].pipeline.schedule, "gpipe");
  EXPECT_EQ((*c)[0].pipeline.microbatches, 4);
  EXPECT_TRUE((*c)[1].sp);
  // A mesh the model does not divide is refused with the layout's reason.
  r.only_meshes = {"tp=4"};
  r.args.heads = 2;
  refused.clear();
  c = EnumerateCandidates(r, Node(), &refused);
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->empty());
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_TRUE(absl::StrContains(refused[0].reason, "heads")) << refused[0].reason;
}

TEST(PlanTest, RanksByPredictedStepTime) {
  absl::StatusOr<Plan> p = PlanGpt(Small(4), Node(), FakeProfiler());
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->rows.size(), 18u);
  for (size_t i = 1; i < p->rows.size(); ++i) {
    EXPECT_LE(p->rows[i - 1].prediction.step_s, p->rows[i].prediction.step_s);
  }
  // Without tp the fake work has no communication: those meshes come first.
  EXPECT_EQ(p->rows[0].candidate.mesh.size("tp"), 1) << p->rows[0].candidate.Name();
  EXPECT_GT(p->rows.back().candidate.mesh.size("tp"), 1);
  const PlanRow& best = p->rows[0];
  EXPECT_NEAR(best.tokens_per_s, 64 / best.prediction.step_s, 1e-6);
  EXPECT_NEAR(best.mfu, p->model_flops_per_step / (best.prediction.step_s * 4 * 2e9), 1e-12);
  const std::string text = FormatPlan(*p, 5);
  EXPECT_TRUE(absl::StrContains(text, "18 ranked, 2 refused")) << text;
  EXPECT_TRUE(absl::StrContains(text, "... 13 more ranked meshes")) << text;
  EXPECT_TRUE(absl::StrContains(text, "refused (2):")) << text;
  EXPECT_TRUE(absl::StrContains(text, "  pp=4 1f1b/m4: pipeline: 2 layers")) << text;
  // The trainer summary's memory parts for the top meshes.
  EXPECT_TRUE(absl::StrContains(text, "memory per rank of the top meshes")) << text;
  EXPECT_TRUE(absl::StrContains(text, ": parameters 0.0 MiB, gradients 0.0 MiB")) << text;
}

TEST(PlanTest, MemoryThatDoesNotFitIsRefused) {
  HardwareProfile hw = Node();
  hw.memory_bytes = 3e9;
  hw.memory_reserved_bytes = 0.5e9;  // 2.5 GB usable: only meshes sharding 4 ways fit 4 GB
  absl::StatusOr<Plan> p = PlanGpt(Small(4), hw, FakeProfiler(4e9));
  ASSERT_TRUE(p.ok()) << p.status();
  for (const PlanRow& r : p->rows) {
    EXPECT_LE(r.prediction.peak_bytes, 2.5e9) << r.candidate.Name();
    EXPECT_TRUE(r.fits);
  }
  EXPECT_TRUE(Refused(*p, "dp=4", "out of memory: peak 3.7 GiB per GPU > 2.3 GiB usable"));
  // The meshes that do not fit are priced too, marked so.
  ASSERT_FALSE(p->unfit.empty());
  EXPECT_FALSE(p->unfit[0].fits);
  EXPECT_GT(p->unfit[0].prediction.step_s, 0);
  EXPECT_TRUE(absl::StrContains(FormatPlan(*p, 5), "does not fit (priced anyway")) << FormatPlan(*p, 5);
  // Nothing fits: no ranked rows, the prices of the others and the smallest need named.
  hw.memory_bytes = 0.6e9;
  absl::StatusOr<Plan> none = PlanGpt(Small(4), hw, FakeProfiler(4e9));
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->rows.empty());
  ASSERT_FALSE(none->unfit.empty());
  for (size_t i = 1; i < none->unfit.size(); ++i) {
    EXPECT_LE(none->unfit[i - 1].prediction.peak_bytes, none->unfit[i].prediction.peak_bytes);
  }
  const std::string text = FormatPlan(*none, 5);
  EXPECT_TRUE(absl::StrContains(text, "no mesh fits test_node's 0.1 GiB: the smallest peak is"))
      << text;
  EXPECT_TRUE(absl::StrContains(text, "OOM")) << text;
}

TEST(PlanTest, FsdpPadsSizesTheMeshDoesNotDivide) {
  // d_model 16, 4 d 64, vocab 32, seq 8, c_attn's 3: none divisible by 9. The trainer pads them
  // (ParamInfo::fsdp_pad), so the planner prices dp_shard=9 as it prices dp_shard=8.
  PlanRequest r = Small(9);
  r.global_batch = 9;
  r.only_meshes = {"dp_shard=9"};
  HardwareProfile hw = Node(9);
  absl::StatusOr<Plan> p = PlanGpt(r, hw, FakeProfiler());
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->rows.size(), 1u);
  r = Small(8);
  r.only_meshes = {"dp_shard=8"};
  p = PlanGpt(r, Node(8), FakeProfiler());
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->rows.size(), 1u);
}

TEST(PlanTest, GradAccumTakesAnyDivisorOfTheLocalBatch) {
  // 6 sequences per rank; activations of 6 GB at ga1 against 2.9 GB usable beyond 1 GB of
  // state: ga2 (3 GB) does not fit, ga3 (2 GB) does, a power of two would jump to ga6.
  PlanRequest r = Small(1);
  r.global_batch = 6;
  r.only_meshes = {"single"};
  r.recompute = {Recompute::kNone};
  HardwareProfile hw = Node();
  hw.memory_bytes = 3.9e9;
  Profiler prof = [](const Candidate& c, const PlanRequest&) -> absl::StatusOr<std::vector<RoleWork>> {
    RoleWork w;
    w.gemms.push_back({.m = 1, .n = 500, .k = 1000});
    w.activation_peak_bytes = 6e9 / c.grad_accum;
    w.peak_bytes = 1e9 + w.activation_peak_bytes;
    return std::vector<RoleWork>{w};
  };
  absl::StatusOr<Plan> p = PlanGpt(r, hw, prof);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->rows.size(), 1u);
  EXPECT_EQ(p->rows[0].candidate.grad_accum, 3) << p->rows[0].candidate.Name();
}

TEST(PlanTest, RecomputationIsChosenWhenNothingElseFits) {
  // A pipeline (no gradient accumulation to fall back on) whose activations fit only with full
  // recomputation: the row says rc=full and the peak is the estimate's.
  PlanRequest r = Small(2);
  EXPECT_TRUE(SetGptModel(
      GptConfig{.layers = 4, .d_model = 64, .heads = 4, .vocab = 32, .seq = 64},
      &r).ok());
  r.only_meshes = {"pp=2 1f1b/m2"};
  HardwareProfile hw = Node();
  Profiler prof = [](const Candidate& c, const PlanRequest&) -> absl::StatusOr<std::vector<RoleWork>> {
    std::vector<RoleWork> roles;
    for (int s = 0; s < 2; ++s) {
      RoleWork w;
      w.pp_stage = s;
      w.gemms.push_back({.m = 64, .n = 64, .k = 64});
      w.activation_peak_bytes = 20e6 / (s + 1);  // 1F1B: stage s holds 2 - s microbatches
      w.peak_bytes = 1e6 + w.activation_peak_bytes;
      roles.push_back(w);
    }
    return roles;
  };
  // Stage 0 holds 2 microbatches of 2 blocks: none 21 MB; selective keeps 34/54 of the 20 MB of
  // activations (13.6 MB: 14.6 MB), full 2/54 and one block's 5 MB (5.7 MB: 6.7 MB).
  hw.memory_bytes = 10e6;
  r.measure_recompute = false;  // the estimator's memory (this profiler ignores --recompute)
  absl::StatusOr<Plan> p = PlanGpt(r, hw, prof);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->rows.size(), 1u) << FormatPlan(*p, 5);
  EXPECT_EQ(p->rows[0].candidate.recompute, Recompute::kFull) << p->rows[0].candidate.Name();
  EXPECT_LE(p->rows[0].prediction.peak_bytes, 10e6);
  EXPECT_TRUE(absl::StrContains(p->rows[0].candidate.Name(), "rc=full"));
  // With room, no recomputation (it only costs time).
  hw.memory_bytes = 1e9;
  p = PlanGpt(r, hw, prof);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->rows[0].candidate.recompute, Recompute::kNone);
}

TEST(PlanTest, RecomputingVariantsTakeTheTrainersOwnMemoryAndAreProfiledOnlyWhenNeeded) {
  // A profiler that runs --recompute as the candidate says (the shape-only step's memory per
  // mode: none 20 MB, selective 12 MB, full 4 MB of activations on 1 MB of state); the
  // estimator's work stays. Recomputing profiles are made only when no variant without fits.
  PlanRequest r = Small(1);
  EXPECT_TRUE(SetGptModel(
      GptConfig{.layers = 4, .d_model = 64, .heads = 4, .vocab = 32, .seq = 64},
      &r).ok());
  r.only_meshes = {"single"};
  r.global_batch = 1;  // no gradient accumulation to fall back on
  std::map<Recompute, int> calls;
  Profiler prof = [&](const Candidate& c,
                      const PlanRequest&) -> absl::StatusOr<std::vector<RoleWork>> {
    ++calls[c.recompute];
    RoleWork w;
    w.layers = 4;
    w.gemms.push_back({.m = 64, .n = 64, .k = 64});
    w.activation_peak_bytes = c.recompute == Recompute::kNone        ? 20e6
                              : c.recompute == Recompute::kSelective ? 12e6
                                                                     : 4e6;
    w.peak_bytes = 1e6 + w.activation_peak_bytes;
    return std::vector<RoleWork>{w};
  };
  HardwareProfile hw = Node();
  hw.memory_bytes = 10e6;  // only full fits: 5 MB
  absl::StatusOr<Plan> p = PlanGpt(r, hw, prof);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->rows.size(), 1u) << FormatPlan(*p, 5);
  EXPECT_EQ(p->rows[0].candidate.recompute, Recompute::kFull);
  EXPECT_DOUBLE_EQ(p->rows[0].prediction.peak_bytes, 5e6);  // the profiled one, not an estimate
  EXPECT_EQ(calls[Recompute::kSelective], 1);
  EXPECT_EQ(calls[Recompute::kFull], 1);
  // With room for the variant without recomputation: nothing recomputing is profiled.
  calls.clear();
  hw.memory_bytes = 1e9;
  p = PlanGpt(r, hw, prof);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->rows[0].candidate.recompute, Recompute::kNone);
  EXPECT_EQ(calls[Recompute::kNone], 1);
  EXPECT_EQ(calls.count(Recompute::kSelective) + calls.count(Recompute::kFull), 0u);
  // A mesh that asks for full recomputation is profiled with it.
  calls.clear();
  r.only_meshes = {"single rc=full"};
  p = PlanGpt(r, hw, prof);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_DOUBLE_EQ(p->rows[0].prediction.peak_bytes, 5e6);
  EXPECT_EQ(calls[Recompute::kFull], 1);
}

TEST(PlanTest, MemoryLowerBoundRefusesBeforeProfiling) {
  PlanRequest r = Small(4);
  r.args.d_model = 4096;
  r.args.heads = 32;
  r.args.vocab = 4096;
  HardwareProfile hw = Node();
  hw.memory_bytes = 3e9;  // 2 layers of d 4096: 420M parameters, 6.7 GB of f32 state
  int calls = 0;
  Profiler counting = [&](const Candidate& c, const PlanRequest& q) {
    ++calls;
    return FakeProfiler(1e6)(c, q);
  };
  absl::StatusOr<Plan> p = PlanGpt(r, hw, counting);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(Refused(*p, "dp=4", "memory never fits"));
  EXPECT_EQ(calls, p->profiled);
  EXPECT_LT(calls, p->candidates - 2);
}

TEST(PlanTest, ProfilerErrorsBecomeRefusals) {
  Profiler failing = [](const Candidate& c, const PlanRequest& q) -> absl::StatusOr<std::vector<RoleWork>> {
    if (c.mesh.size("cp") > 1) return absl::UnimplementedError("no cp here");
    return FakeProfiler()(c, q);
  };
  absl::StatusOr<Plan> p = PlanGpt(Small(4), Node(), failing);
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(Refused(*p, "cp=4", "shape-only run: no cp here"));
}

// Issue 35: the profiles reused across microbatch counts and pipeline stages
// (profile_reuse.h) must price every mesh exactly as its own full shape-only step does.
PlanRequest Reused(bool on) {
  PlanRequest r;
  // 10 layers: pp=4 splits them 3/3/2/2 and pp=8 2/2/1/.../1 (two middle groups); 8 heads
  // for tp up to 8.
  EXPECT_TRUE(SetGptModel(
      GptConfig{.layers = 10, .d_model = 16, .heads = 8, .vocab = 32, .seq = 8,
                .dtype = DType::kF32},
      &r).ok());
  r.global_batch = 64;
  r.gpus = 8;
  r.schedules = {"1f1b", "gpipe", "interleaved_1f1b"};
  r.virtual_stages = {2};
  r.microbatch_factors = {1, 4};
  r.data_parallel = {"dp", "hsdp"};
  r.reuse_profiles = on;
  return r;
}

// Every mesh's row (its best variant, in the same rank) and every unfit mesh's price alike.
void ExpectSamePlan(const Plan& full, const Plan& reused) {
  auto rows = [](const Plan& p) {
    std::map<std::string, const PlanRow*> m;
    for (const PlanRow& r : p.rows) m[r.candidate.Name()] = &r;
    for (const PlanRow& r : p.unfit) m["OOM " + r.candidate.Name()] = &r;
    return m;
  };
  const std::map<std::string, const PlanRow*> a = rows(full), b = rows(reused);
  for (const auto& [name, x] : a) {
    auto it = b.find(name);
    if (it == b.end()) {
      ADD_FAILURE() << name << " is not in the plan with reuse";
      continue;
    }
    const StepPrediction &u = x->prediction, &v = it->second->prediction;
    for (auto [p, q] : {std::pair{u.step_s, v.step_s}, {u.compute_s, v.compute_s},
                        {u.blocking_comm_s, v.blocking_comm_s},
                        {u.exposed_comm_s, v.exposed_comm_s},
                        {u.overlapped_comm_s, v.overlapped_comm_s}, {u.bubble, v.bubble},
                        {u.peak_bytes, v.peak_bytes}}) {
      EXPECT_NEAR(p, q, 1e-9 * std::abs(p)) << name;
    }
    EXPECT_EQ(u.critical_role, v.critical_role) << name;
    EXPECT_EQ(u.bytes_by_kind, v.bytes_by_kind) << name;
  }
  EXPECT_EQ(a.size(), b.size());
  EXPECT_EQ(full.refused.size(), reused.refused.size());
  for (size_t i = 0; i < std::min(full.rows.size(), reused.rows.size()); ++i) {
    EXPECT_EQ(full.rows[i].candidate.Name(), reused.rows[i].candidate.Name()) << "rank " << i + 1;
  }
}

TEST(ProfileReuseTest, PlansEveryMeshExactlyAsItsOwnStep) {
  HardwareProfile hw = Node(4);
  hw.memory_bytes = 400e3;  // some meshes out of memory, others recomputing
  absl::StatusOr<Plan> full = PlanGpt(Reused(false), hw, ShapeOnlyProfiler(Device::Meta(), false));
  absl::StatusOr<Plan> reused = PlanGpt(Reused(true), hw, ShapeOnlyProfiler(Device::Meta(), true));
  ASSERT_TRUE(full.ok()) << full.status();
  ASSERT_TRUE(reused.ok()) << reused.status();
  ExpectSamePlan(*full, *reused);
  // The reuse took place: pipelines of 4 and 8 microbatches per stage extrapolated.
  EXPECT_GT(reused->extrapolated, 10);
  EXPECT_EQ(full->extrapolated, 0);
  EXPECT_GT(full->rows.size(), 40u) << full->unfit.size() << " unfit, " << full->refused.size() << " refused";
  EXPECT_FALSE(full->unfit.empty());
}

TEST(ProfileReuseTest, GradientAccumulationExtrapolatesExactly) {
  PlanRequest r = Reused(false);
  r.global_batch = 192;
  r.only_meshes = {"dp=2,tp=4 +sp ga8",       "dp_shard=4,cp=2 ga8",  "dp_replicate=2,dp_shard=4 ga24",
                   "dp=8 ga6",                "pp=4,dp_shard=2 1f1b/m24", "pp=8 1f1b/m64",
                   "pp=2,tp=4 interleaved_1f1b/m32/v5", "pp=4,dp=2 gpipe/m24"};
  HardwareProfile hw = Node(8);
  absl::StatusOr<Plan> full = PlanGpt(r, hw, ShapeOnlyProfiler(Device::Meta(), false));
  r.reuse_profiles = true;
  absl::StatusOr<Plan> reused = PlanGpt(r, hw, ShapeOnlyProfiler(Device::Meta(), true));
  ASSERT_TRUE(full.ok()) << full.status();
  ASSERT_TRUE(reused.ok()) << reused.status();
  EXPECT_EQ(full->rows.size(), 8u) << FormatPlan(*full, 0);
  ExpectSamePlan(*full, *reused);
  EXPECT_EQ(reused->extrapolated, 7);  // all but GPipe's
}

TEST(ModelTest, ParametersAndFlopsOfGpt2Small) {
  PlanRequest r;
  r.args.preset = "gpt2";
  absl::StatusOr<std::unique_ptr<Model>> m = RequestModel(r);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(ModelParameters(**m), 124439808.0);  // Hugging Face's count for gpt2
  const double n = 124439808.0 - 1024 * 768;
  EXPECT_DOUBLE_EQ(ModelFlopsPerStep(**m, 2), 6 * n * 2048 + 12.0 * 12 * 768 * 1024 * 2048);
}

// GPT-2 and Llama 3 of one width, depth, head count and vocabulary planned on FSDP: each rank's
// forward gathers are its model's own table (from the shapes, independently: GPT-2's block
// 12 d^2 + 13 d, wte and wpe tied into the head; Llama's q and o d^2 each, k and v at
// 2 kv heads of 8, SwiGLU's 3 d f, an untied head), and their FLOPs per step differ by the same.
TEST(ModelTest, LlamaAndGpt2PlansDifferInKvAndFfn) {
  const int64_t d = 64, layers = 2, vocab = 96, seq = 32, f = 160;
  auto gathered = [](const Plan& p) {
    double b = 0;
    for (const CollectiveWork& c : p.rows.at(0).roles.at(0).collectives) {
      if (c.op == "all_gather" && !c.backward) b += c.bytes;
    }
    return b;
  };
  PlanRequest gpt;
  ASSERT_TRUE(SetGptModel(GptConfig{.layers = layers, .d_model = d, .heads = 8, .vocab = vocab,
                                    .seq = seq},
                          &gpt)
                  .ok());
  PlanRequest llama = gpt;
  llama.model = "llama3";
  llama.args = ModelArgs{.layers = layers, .d_model = d, .heads = 8, .kv_heads = 2,
                         .ffn_dim = f, .vocab = vocab, .seq = seq, .dtype = "f32"};
  HardwareProfile hw = *LoadHardwareProfile("h100_node");
  for (PlanRequest* r : {&gpt, &llama}) {
    r->gpus = 2;
    r->global_batch = 4;
    r->only_meshes = {"dp_shard=2 ga1"};
    r->recompute = {Recompute::kNone};
    r->reshard_after_forward = {true};
  }
  absl::StatusOr<Plan> g = PlanGpt(gpt, hw, ShapeOnlyProfiler());
  absl::StatusOr<Plan> l = PlanGpt(llama, hw, ShapeOnlyProfiler());
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_TRUE(l.ok()) << l.status();
  ASSERT_FALSE(g->rows.empty());
  ASSERT_FALSE(l->rows.empty());
  const double gpt_n = layers * (12.0 * d * d + 13 * d) + vocab * d + seq * d + 2 * d;
  const double kv = 2.0 * (d / 8);  // 2 kv heads of head_dim d / 8
  const double llama_n =
      layers * (2.0 * d * d + 2 * d * kv + 3.0 * d * f + 2 * d) + 2.0 * vocab * d + d;
  EXPECT_EQ(g->parameters, gpt_n);
  EXPECT_EQ(l->parameters, llama_n);
  EXPECT_EQ(gathered(*g), gpt_n * 4 / 2);  // f32, half of each tensor gathered from the peer
  EXPECT_EQ(gathered(*l), llama_n * 4 / 2);
  // FLOPs per step: 6 N' T + 12 L d s T, N' without GPT-2's wpe and Llama's embedding lookup.
  const double tokens = 4.0 * seq, attention = 12.0 * layers * d * seq * tokens;
  EXPECT_DOUBLE_EQ(g->model_flops_per_step, 6 * (gpt_n - seq * d) * tokens + attention);
  EXPECT_DOUBLE_EQ(l->model_flops_per_step, 6 * (llama_n - vocab * d) * tokens + attention);
}

TEST(ModelTest, BadModelsAreRefusedWithTheirNames) {
  PlanRequest r;
  r.model = "llama";
  absl::StatusOr<std::unique_ptr<Model>> m = RequestModel(r);
  ASSERT_FALSE(m.ok());
  EXPECT_TRUE(absl::StrContains(m.status().message(), "registered: gpt2, llama3"))
      << m.status();
  r.model = "llama3";
  r.args.preset = "llama3_9b";
  m = RequestModel(r);
  ASSERT_FALSE(m.ok());
  EXPECT_TRUE(absl::StrContains(m.status().message(), "--model=llama3 --preset=llama3_9b: "))
      << m.status();
  r.args = ModelArgs{.layers = 2, .d_model = 64, .heads = 8, .kv_heads = 3};
  m = RequestModel(r);
  ASSERT_FALSE(m.ok());
  EXPECT_TRUE(absl::StrContains(m.status().message(), "not divisible by kv_heads 3"))
      << m.status();
  // EnumerateCandidates says the same before anything runs.
  std::vector<Refusal> refused;
  EXPECT_FALSE(EnumerateCandidates(r, Node(), &refused).ok());
}

}  // namespace
}  // namespace shardmap::planner
