#include "models/planner/profile_reuse.h"

#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "models/planner/gpt_request.h"
#include "models/planner/shape_only_source.h"

namespace shardmap::planner {
namespace {

// A role as the cost model reads it, written out independently of profile_reuse.cc: every
// GEMM shape with its count, every op with its FLOPs and bytes, every collective with its
// count (order aside), and the scalars.
std::string Canonical(const RoleWork& w) {
  std::map<std::string, double> e;
  for (const GemmWork& g : w.gemms) {
    e[absl::StrCat("gemm ", g.batch, "x", g.m, "x", g.n, "x", g.k, " ", DTypeName(g.dtype), " ",
                   g.backward, g.trans_a, g.trans_b)] += static_cast<double>(g.count);
  }
  for (const OtherWork& o : w.others) {
    e[absl::StrCat("op ", o.op, " ", DTypeName(o.dtype), " ", o.attention, " flops")] += o.flops;
    e[absl::StrCat("op ", o.op, " ", DTypeName(o.dtype), " ", o.attention, " bytes")] += o.bytes;
  }
  for (const CollectiveWork& c : w.collectives) {
    e[absl::StrCat("col ", c.op, " ", absl::StrJoin(c.axes, "+"), " ", c.group_size, " ",
                   c.bytes, " ", c.backward, " ", c.phase, " ", DTypeName(c.dtype))] += 1;
  }
  std::string s = absl::StrCat(w.role, " stage ", w.pp_stage, " ranks ", w.ranks, " layers ",
                               w.layers, " in_flight ", w.in_flight, " ops ", w.op_count,
                               " params ", w.param_bytes, " grads ", w.grad_bytes, " adamw ",
                               w.optimizer_bytes, " act ", w.activation_peak_bytes, " peak ",
                               w.peak_bytes, " others ", w.others.size(), "\n");
  for (const auto& [k, v] : e) absl::StrAppend(&s, "  ", k, ": ", v, "\n");
  return s;
}

std::string Canonical(const std::vector<RoleWork>& roles) {
  std::string s;
  for (const RoleWork& w : roles) s += Canonical(w);
  return s;
}

PlanRequest Tiny(int gpus, int64_t batch) {
  PlanRequest r;
  EXPECT_TRUE(SetGptModel(
      GptConfig{.layers = 10, .d_model = 16, .heads = 8, .vocab = 32, .seq = 8,
                .dtype = DType::kF32},
      &r).ok());
  r.global_batch = batch;
  r.gpus = gpus;
  return r;
}

struct Case {
  std::string mesh;
  std::string schedule;  // "" : gradient accumulation
  int n;                 // microbatches or microsteps
  int rows;              // per microbatch, per rank of the batch axes
};

// The extrapolated profile equals the shape-only step of n microbatches, field by field.
TEST(ExtrapolateMicrobatchesTest, EqualsTheFullStep) {
  const Case cases[] = {
      {"pp=2,tp=4 +sp", "1f1b", 9, 2},  {"pp=4,dp=2", "1f1b", 17, 1},
      {"pp=4,dp_shard=2", "1f1b", 13, 3}, {"pp=3,dp_replicate=2", "1f1b", 11, 1},
      {"pp=5", "1f1b", 16, 1},          {"pp=2,dp=2,tp=2", "1f1b", 40, 2},
      {"dp=2,tp=4", "", 7, 2},          {"dp_shard=4,cp=2", "", 6, 1},
      {"dp_replicate=2,dp_shard=3", "", 9, 1}, {"tp=2,cp=2 +sp", "", 12, 1},
      // GPipe (not extrapolated by the planner) is here to show why: below.
      {"pp=4,dp=2", "gpipe", 17, 1},
  };
  const Profiler full_profiler = ShapeOnlyProfiler(Device::Meta(), /*share_stages=*/false);
  for (const Case& k : cases) {
    SCOPED_TRACE(absl::StrCat(k.mesh, " ", k.schedule, " n=", k.n));
    const bool piped = !k.schedule.empty();
    const size_t space = k.mesh.find(' ');
    absl::StatusOr<Candidate> c =
        ParseCandidate(k.mesh.substr(0, space), space != std::string::npos,
                       piped ? k.schedule : "1f1b", 1);
    ASSERT_TRUE(c.ok()) << c.status();
    const int world = c->mesh.world();
    const int data = world / (c->mesh.size("pp") * c->mesh.size("tp") * c->mesh.size("cp"));
    const int n1 = piped ? c->mesh.size("pp") + 1 : 2;
    auto at = [&](int n) {
      Candidate x = *c;
      if (piped) {
        x.pipeline.microbatches = n;
      } else {
        x.grad_accum = n;
      }
      return full_profiler(x, Tiny(world, static_cast<int64_t>(k.rows) * n * data));
    };
    absl::StatusOr<std::vector<RoleWork>> lo = at(n1), hi = at(n1 + 1), want = at(k.n);
    ASSERT_TRUE(lo.ok()) << lo.status();
    ASSERT_TRUE(hi.ok()) << hi.status();
    ASSERT_TRUE(want.ok()) << want.status();
    absl::StatusOr<std::vector<RoleWork>> got = ExtrapolateMicrobatches(*lo, *hi, n1, k.n);
    ASSERT_TRUE(got.ok()) << got.status();
    // GPipe too: AdamW updates in place, so no step's peak is the optimizer's (it was at few
    // microbatches, and the extrapolation then missed the activations' peak at many).
    EXPECT_EQ(Canonical(*got), Canonical(*want));
  }
}

// The interleaved schedule takes microbatches in groups of pp: its work at n from the steps at
// 2 pp and 3 pp (step pp) equals its own step of n, field by field, every stage; its peak does
// not (it grows by less with each later group of pp than from 2 pp to 3 pp), which is why the
// planner profiles interleaved pipelines in full.
TEST(ExtrapolateMicrobatchesTest, InterleavedWorkInStepsOfPpButNotItsPeak) {
  const std::tuple<const char*, int, int> cases[] = {{"pp=2", 5, 10}, {"pp=2,dp=2", 5, 14},
                                                     {"pp=5", 2, 35}, {"pp=2,tp=2", 5, 12}};
  const Profiler full_profiler = ShapeOnlyProfiler(Device::Meta(), /*share_stages=*/false);
  auto without_peak = [](std::vector<RoleWork> roles) {
    for (RoleWork& w : roles) w.peak_bytes = w.activation_peak_bytes = 0;
    return Canonical(roles);
  };
  int peaks_off = 0;
  for (const auto& [mesh, v, n] : cases) {
    SCOPED_TRACE(absl::StrCat(mesh, " v=", v, " n=", n));
    absl::StatusOr<Candidate> c = ParseCandidate(mesh, false, "interleaved_1f1b", n, v);
    ASSERT_TRUE(c.ok()) << c.status();
    const int p = c->mesh.size("pp");
    const int data = c->mesh.world() / (p * c->mesh.size("tp"));
    auto at = [&](int m) {
      Candidate x = *c;
      x.pipeline.microbatches = m;
      return full_profiler(x, Tiny(c->mesh.world(), static_cast<int64_t>(m) * data));
    };
    absl::StatusOr<std::vector<RoleWork>> lo = at(2 * p), hi = at(3 * p), want = at(n);
    ASSERT_TRUE(lo.ok()) << lo.status();
    ASSERT_TRUE(hi.ok()) << hi.status();
    ASSERT_TRUE(want.ok()) << want.status();
    absl::StatusOr<std::vector<RoleWork>> got = ExtrapolateMicrobatches(*lo, *hi, 2 * p, n, p);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(without_peak(*got), without_peak(*want));
    peaks_off += Canonical(*got) != Canonical(*want);
  }
  EXPECT_GT(peaks_off, 0) << "the interleaved peak extrapolates exactly: the planner could too";
  // Not a whole number of steps away, or not beyond the second profile: refused.
  EXPECT_EQ(ExtrapolateMicrobatches({}, {}, 4, 9, 2).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ExtrapolateMicrobatches({}, {}, 4, 6, 2).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// plan_validate's pipeline of 8 microbatches (its model, its batch), on the CPU device it
// profiles with: the ops run for real, the memory is the CPU's.
TEST(ExtrapolateMicrobatchesTest, EqualsTheValidationsCpuStep) {
  PlanRequest r;
  EXPECT_TRUE(SetGptModel(
      GptConfig{.layers = 4, .d_model = 128, .heads = 4, .vocab = 512, .seq = 64,
                .dtype = DType::kF32},
      &r).ok());
  r.gpus = 2;
  absl::StatusOr<Candidate> c = ParseCandidate("pp=2", false, "1f1b", 8);
  ASSERT_TRUE(c.ok()) << c.status();
  const Profiler cpu = ShapeOnlyProfiler(Device::Cpu(), false);
  auto at = [&](int m) {
    Candidate x = *c;
    x.pipeline.microbatches = m;
    PlanRequest q = r;
    q.global_batch = 2 * m;  // 2 rows per microbatch, as batch 16 over 8
    return cpu(x, q);
  };
  absl::StatusOr<std::vector<RoleWork>> lo = at(3), hi = at(4), want = at(8);
  ASSERT_TRUE(lo.ok() && hi.ok() && want.ok()) << lo.status() << hi.status() << want.status();
  absl::StatusOr<std::vector<RoleWork>> got = ExtrapolateMicrobatches(*lo, *hi, 3, 8);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(Canonical(*got), Canonical(*want));
}

TEST(ExtrapolateMicrobatchesTest, RefusesWhatIsNotOneStepApart) {
  RoleWork a;
  a.role = "all ranks";
  a.gemms.push_back({.m = 2, .n = 3, .k = 4, .count = 2});
  a.collectives.push_back({"all_reduce", {"tp"}, 2, 64, false, "tp"});
  a.param_bytes = 100;
  a.peak_bytes = 300;
  RoleWork b = a;
  b.gemms[0].count = 3;
  b.collectives.push_back(b.collectives[0]);
  b.peak_bytes = 310;
  absl::StatusOr<std::vector<RoleWork>> w = ExtrapolateMicrobatches({a}, {b}, 2, 6);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ((*w)[0].gemms[0].count, 6);
  EXPECT_EQ((*w)[0].collectives.size(), 5u);
  EXPECT_EQ((*w)[0].peak_bytes, 340);
  // n must be beyond the two profiles.
  EXPECT_EQ(ExtrapolateMicrobatches({a}, {b}, 2, 3).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ExtrapolateMicrobatches({a}, {b}, 0, 5).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Other roles, other parameters, counts that would go negative: not extrapolated.
  EXPECT_EQ(ExtrapolateMicrobatches({a}, {b, b}, 2, 6).status().code(),
            absl::StatusCode::kFailedPrecondition);
  RoleWork other = b;
  other.param_bytes = 200;
  EXPECT_TRUE(absl::StrContains(ExtrapolateMicrobatches({a}, {other}, 2, 6).status().message(),
                                "parameter"));
  RoleWork fewer = a;
  fewer.gemms[0].count = 1;
  EXPECT_EQ(ExtrapolateMicrobatches({a}, {fewer}, 2, 6).status().code(),
            absl::StatusCode::kFailedPrecondition);
  other = b;
  other.role = "pp stage 1";
  EXPECT_EQ(ExtrapolateMicrobatches({a}, {other}, 2, 6).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(StageInFlightTest, MovesThePeakAlongTheTwoStages) {
  RoleWork a;
  a.role = "pp stage 1";
  a.pp_stage = 1;
  a.gemms.push_back({.m = 2, .n = 3, .k = 4});
  a.param_bytes = 100;
  a.activation_peak_bytes = 400;
  a.peak_bytes = 500;
  RoleWork b = a;
  b.role = "pp stage 2";
  b.pp_stage = 2;
  b.activation_peak_bytes = 300;
  b.peak_bytes = 400;
  absl::StatusOr<RoleWork> s = StageInFlight(a, 4, b, 3, 1, 4, "pp stage 4");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->peak_bytes, 200);
  EXPECT_EQ(s->activation_peak_bytes, 100);
  EXPECT_EQ(s->pp_stage, 4);
  EXPECT_EQ(s->role, "pp stage 4");
  // The same in-flight count, other work, or a fraction of a byte per microbatch: refused.
  EXPECT_EQ(StageInFlight(a, 4, b, 4, 1, 4, "x").status().code(),
            absl::StatusCode::kFailedPrecondition);
  RoleWork c = b;
  c.gemms[0].count = 2;
  EXPECT_FALSE(StageInFlight(a, 4, c, 3, 1, 4, "x").ok());
  c = b;
  c.peak_bytes = 401;
  c.activation_peak_bytes = 301;
  EXPECT_FALSE(StageInFlight(a, 4, c, 2, 1, 4, "x").ok());
}

// A pipeline's middle stages from two of them equal every stage's own step.
TEST(SharedStagesTest, EqualEveryStagesOwnStep) {
  const std::pair<const char*, const char*> cases[] = {
      {"pp=8", "1f1b"}, {"pp=8", "gpipe"}, {"pp=5,dp_shard=2", "1f1b"}, {"pp=6,tp=2", "1f1b"},
      {"pp=5", "interleaved_1f1b"}};
  for (const auto& [mesh, sched] : cases) {
    const bool interleaved = std::string(sched) == "interleaved_1f1b";
    for (int m : interleaved ? std::vector<int>{5, 10, 20} : std::vector<int>{3, 8, 17}) {
      SCOPED_TRACE(absl::StrCat(mesh, " ", sched, " m=", m));
      absl::StatusOr<Candidate> c = ParseCandidate(mesh, false, sched, m, interleaved ? 2 : 1);
      ASSERT_TRUE(c.ok()) << c.status();
      const int world = c->mesh.world();
      const PlanRequest r = Tiny(world, static_cast<int64_t>(m) * world / c->mesh.size("pp") /
                                            c->mesh.size("tp"));
      absl::StatusOr<std::vector<RoleWork>> each =
          ShapeOnlyProfiler(Device::Meta(), false)(*c, r);
      absl::StatusOr<std::vector<RoleWork>> shared =
          ShapeOnlyProfiler(Device::Meta(), true)(*c, r);
      ASSERT_TRUE(each.ok()) << each.status();
      ASSERT_TRUE(shared.ok()) << shared.status();
      EXPECT_EQ(Canonical(*shared), Canonical(*each));
    }
  }
}

}  // namespace
}  // namespace shardmap::planner
