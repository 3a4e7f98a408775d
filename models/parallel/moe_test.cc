#include "models/parallel/moe.h"

#include <atomic>
#include <cmath>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "autograd/value_and_grad.h"
#include "shardmap/collective_ops.h"
#include "shardmap/ops.h"
#include "shardmap/shard_map.h"
#include "spmd_testing/testing.h"
#include "tensor/ops/matmul.h"
#include "tensor/ops/nn.h"
#include "tensor/ops/routing.h"
#include "tensor/random.h"
#include "tensor/testing/compare.h"

namespace shardmap {
namespace {

constexpr int64_t kGroups = 6, kGroupTokens = 4, kD = 5, kH = 6;

MoeConfig Config(int64_t experts, int64_t k, double cf) {
  return MoeConfig{.experts = experts, .topk = k, .capacity_factor = cf, .aux_loss_coef = 0.01};
}

std::vector<Tensor> Inputs(int64_t e) {
  // A larger router scale makes the routing uneven, so capacity drops happen.
  return {RandomNormal({kGroups * kGroupTokens, kD}, 1, 0.0, 1.0, DType::kF64),
          RandomNormal({kD, e}, 2, 0.0, 1.5, DType::kF64),
          RandomNormal({e, kD, kH}, 3, 0.0, 0.5, DType::kF64),
          RandomNormal({e, kH}, 4, 0.0, 0.5, DType::kF64),
          RandomNormal({e, kH, kD}, 5, 0.0, 0.5, DType::kF64),
          RandomNormal({e, kD}, 6, 0.0, 0.5, DType::kF64)};
}

PartitionSpec Spec(std::vector<std::vector<std::string>> dims) { return PartitionSpec(dims); }

// The MoE layer under a shard_map: tokens split over every axis but tp, experts over
// `expert_axes` (those the mesh has), the experts' hidden dim over tp when the mesh has it.
// Outputs: loss = sum(y^2) + aux, y, aux. `dropped` sums the ranks' drops (tp index 0 only).
spmd_testing::ShardMapFactory Factory(MoeConfig cfg, std::vector<std::string> expert_axes,
                                      std::atomic<int64_t>* dropped = nullptr,
                                      TypeCheck check = TypeCheck::kOn) {
  return [=](const Mesh& mesh) {
    std::vector<std::string> tokens, experts;
    for (const std::string& a : mesh.axis_names()) {
      if (a != "tp") tokens.push_back(a);
    }
    for (const std::string& a : mesh.axis_names()) {
      for (const std::string& b : expert_axes) {
        if (a == b) experts.push_back(a);
      }
    }
    const bool tp = mesh.AxisIndex("tp") >= 0;
    MoeConfig c = cfg;
    c.expert_axes = experts;
    ShardFn fn = [=](const std::vector<Value>& in) -> std::vector<Value> {
      MoeMlp m{in[1], in[2], in[3], in[4], in[5], c, kGroupTokens, kGroups,
               tp ? TensorParallel{"tp", false} : TensorParallel{}};
      MoeOutput o = m(in[0]);
      if (dropped != nullptr && (!tp || axis_index("tp") == 0)) *dropped += o.dropped;
      Value aux = all_reduce(o.aux, Axes(tokens));
      Value loss = all_reduce(sum_partial(o.y * o.y, {}), Axes(tokens)) + aux;
      return {loss, o.y, aux};
    };
    const std::vector<std::string> t = tp ? std::vector<std::string>{"tp"}
                                          : std::vector<std::string>{};
    return shard_map(fn, mesh,
                     {Spec({tokens, {}}), P(), Spec({experts, {}, t}), Spec({experts, t}),
                      Spec({experts, t, {}}), Spec({experts, {}})},
                     {P(), Spec({tokens, {}}), P()}, ShardMapOptions{.check = check});
  };
}

double Gelu(double v) {
  return 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
}

struct Naive {
  std::vector<double> y;
  double aux = 0;
  int64_t dropped = 0, dropped_tokens = 0;
};

// The layer with plain loops over global tensors: selection top-k, capacity by priority
// position (choice j of every token before choice j+1, tokens in order within a group).
Naive NaiveMoe(const std::vector<Tensor>& in, const MoeConfig& c) {
  const int64_t n = in[0].dim(0), e = c.experts, k = c.topk;
  const int64_t cap = static_cast<int64_t>(std::ceil(c.capacity_factor * kGroupTokens * k / e));
  auto at = [](const Tensor& t, std::vector<int64_t> idx) {
    int64_t f = 0;
    for (size_t i = 0; i < idx.size(); ++i) f = f * t.dim(static_cast<int>(i)) + idx[i];
    return t.at(f);
  };
  std::vector<std::vector<double>> p(n, std::vector<double>(e));
  std::vector<std::vector<int64_t>> pick(n);
  for (int64_t t = 0; t < n; ++t) {
    double mx = -1e300, s = 0;
    for (int64_t j = 0; j < e; ++j) {
      for (int64_t a = 0; a < kD; ++a) p[t][j] += at(in[0], {t, a}) * at(in[1], {a, j});
      mx = std::max(mx, p[t][j]);
    }
    for (int64_t j = 0; j < e; ++j) s += std::exp(p[t][j] - mx);
    for (int64_t j = 0; j < e; ++j) p[t][j] = std::exp(p[t][j] - mx) / s;
    std::vector<bool> used(e);
    for (int64_t r = 0; r < k; ++r) {
      int64_t best = -1;
      for (int64_t j = 0; j < e; ++j) {
        if (!used[j] && (best < 0 || p[t][j] > p[t][best])) best = j;
      }
      used[best] = true;
      pick[t].push_back(best);
    }
  }
  Naive out;
  out.y.assign(n * kD, 0.0);
  std::vector<int64_t> lost(n, 0);
  for (int64_t g = 0; g < kGroups; ++g) {
    std::vector<int64_t> count(e, 0);
    for (int64_t r = 0; r < k; ++r) {
      for (int64_t t = g * kGroupTokens; t < (g + 1) * kGroupTokens; ++t) {
        const int64_t x = pick[t][r];
        if (count[x]++ >= cap) {
          ++out.dropped;
          if (++lost[t] == k) ++out.dropped_tokens;
          continue;
        }
        for (int64_t o = 0; o < kD; ++o) {
          double acc = at(in[5], {x, o});
          for (int64_t hh = 0; hh < kH; ++hh) {
            double pre = at(in[3], {x, hh});
            for (int64_t a = 0; a < kD; ++a) pre += at(in[0], {t, a}) * at(in[2], {x, a, hh});
            acc += Gelu(pre) * at(in[4], {x, hh, o});
          }
          out.y[t * kD + o] += p[t][x] * acc;
        }
      }
    }
    for (int64_t x = 0; x < e; ++x) {
      double mean_p = 0;
      for (int64_t t = g * kGroupTokens; t < (g + 1) * kGroupTokens; ++t) mean_p += p[t][x];
      mean_p /= kGroupTokens;
      out.aux += e * (static_cast<double>(count[x]) / (kGroupTokens * k)) * mean_p / kGroups;
    }
  }
  return out;
}

TEST(Moe, OneDeviceMatchesNaiveLoops) {
  for (auto [e, k, cf] : std::vector<std::tuple<int64_t, int64_t, double>>{
           {6, 2, 1.0}, {4, 1, 1.0}, {3, 3, 2.0}, {5, 2, 0.5}}) {
    MoeConfig cfg = Config(e, k, cf);
    std::vector<Tensor> in = Inputs(e);
    std::atomic<int64_t> dropped{0};
    absl::StatusOr<std::vector<Tensor>> out =
        Factory(cfg, {}, &dropped)(*Mesh::Create({{"dp", 1}}))(in);
    ASSERT_TRUE(out.ok()) << out.status();
    Naive want = NaiveMoe(in, cfg);
    EXPECT_EQ(dropped.load(), want.dropped) << "E=" << e << " k=" << k;
    std::vector<int64_t> experts = TopK(Softmax(Matmul(in[0], in[1]), -1), k).indices
                                       .ToVector<int64_t>();
    RoutingPlan plan = PlanRouting(experts, in[0].dim(0), k, e, kGroupTokens,
                                   MoeCapacity(cf, kGroupTokens, k, e));
    EXPECT_EQ(plan.dropped_tokens, want.dropped_tokens) << "E=" << e << " k=" << k;
    if (k == 1) {
      EXPECT_EQ(plan.dropped_tokens, plan.dropped);
    }
    for (int64_t i = 0; i < (*out)[1].numel(); ++i) {
      ASSERT_NEAR((*out)[1].at(i), want.y[i], 1e-12) << "E=" << e << " k=" << k << " at " << i;
    }
    EXPECT_NEAR((*out)[2].item(), want.aux, 1e-12);
    if (cf < 1.5) {
      EXPECT_GT(want.dropped, 0) << "the case should exercise drops";
    } else {
      EXPECT_EQ(want.dropped, 0);
    }
  }
}

TEST(Moe, PlanMatchesPositionsCountedIndependently) {
  // experts of 2 groups x 3 tokens x k=2; capacity 1.
  std::vector<int64_t> ex = {0, 1, 0, 2, 1, 0, 2, 2, 2, 1, 0, 1};
  RoutingPlan p = PlanRouting(ex, 6, 2, 3, 3, 1);
  int64_t dropped = 0;
  for (int64_t t = 0; t < 6; ++t) {
    for (int64_t j = 0; j < 2; ++j) {
      const int64_t g = t / 3, e = ex[t * 2 + j];
      int64_t pos = 0;  // earlier assignments to e in g: earlier choices, or same choice earlier
      for (int64_t u = g * 3; u < g * 3 + 3; ++u) {
        for (int64_t i = 0; i < 2; ++i) {
          if (ex[u * 2 + i] == e && (i < j || (i == j && u < t))) ++pos;
        }
      }
      if (pos >= 1) {
        ++dropped;
      } else {
        EXPECT_EQ(p.slot_token[(e * 2 + g) * 1 + pos], t);
        EXPECT_EQ(p.slot_pair[(e * 2 + g) * 1 + pos], t * 2 + j);
      }
    }
  }
  EXPECT_EQ(p.dropped, dropped);
  EXPECT_EQ(p.counts, (std::vector<int64_t>{3, 2, 1, 1, 2, 3}));
}

TEST(Moe, ExpertParallelMatchesOneDevice) {
  MoeConfig cfg = Config(6, 2, 1.0);
  std::vector<Tensor> in = Inputs(6);
  std::atomic<int64_t> one{0};
  ASSERT_TRUE(Factory(cfg, {}, &one)(*Mesh::Create({{"dp", 1}}))(in).ok());
  ASSERT_GT(one.load(), 0);
  for (auto [axes, meshes] :
       std::vector<std::pair<std::vector<std::string>, std::vector<spmd_testing::MeshAxes>>>{
           {{"ep"}, {{{"ep", 2}}, {{"ep", 3}}, {{"dp", 2}, {"ep", 3}}, {{"ep", 3}, {"tp", 2}}}},
           {{"dp"}, {{{"dp", 2}}, {{"dp", 3}}}},             // folded over the data ranks
           {{"dp", "ep"}, {{{"dp", 2}, {"ep", 3}}}}}) {      // over both: 6-way
    std::atomic<int64_t> dropped{0};
    EXPECT_TRUE(spmd_testing::ShardedMatchesOneDevice(Factory(cfg, axes, &dropped), meshes, in));
    // Each mesh runs sharded once and on one device once (value_and_grad).
    EXPECT_EQ(dropped.load(), static_cast<int64_t>(meshes.size()) * 2 * one.load());
  }
}

// Erased mode (no rules evaluated) computes the same numbers, forward and backward.
TEST(Moe, ErasedModeGivesTheSameNumbers) {
  MoeConfig cfg = Config(6, 2, 1.0);
  const Mesh mesh = *Mesh::Create({{"dp", 2}, {"ep", 3}});
  absl::StatusOr<ShardMapGrads> on =
      value_and_grad(Factory(cfg, {"ep"}, nullptr, TypeCheck::kOn)(mesh))(Inputs(6));
  absl::StatusOr<ShardMapGrads> erased =
      value_and_grad(Factory(cfg, {"ep"}, nullptr, TypeCheck::kErased)(mesh))(Inputs(6));
  ASSERT_TRUE(on.ok()) << on.status();
  ASSERT_TRUE(erased.ok()) << erased.status();
  for (size_t i = 0; i < on->outputs.size(); ++i) {
    EXPECT_TRUE(testing::TensorsNear(erased->outputs[i], on->outputs[i], 0, 0)) << "output " << i;
  }
  for (size_t i = 0; i < on->grads.size(); ++i) {
    EXPECT_TRUE(testing::TensorsNear(erased->grads[i], on->grads[i], 0, 0)) << "gradient " << i;
  }
}

TEST(Moe, GradientsMatchFiniteDifferences) {
  MoeConfig cfg = Config(4, 2, 1.0);
  spmd_testing::FiniteDifferenceOptions o;
  o.max_probes = 6;
  EXPECT_TRUE(spmd_testing::GradientsMatchFiniteDifferences(
      Factory(cfg, {"ep"})(*Mesh::Create({{"ep", 2}})), Inputs(4), o));
}

TEST(Moe, ExpertsNotSplitAsTheAxesSayAreRejected) {
  // Expert weights passed whole (replicated) while the config splits them over ep.
  MoeConfig cfg = Config(4, 1, 1.0);
  cfg.expert_axes = {"ep"};
  auto run = [](MoeConfig c) {
    ShardFn fn = [c](const std::vector<Value>& in) -> std::vector<Value> {
      MoeMlp m{in[1], in[2], in[3], in[4], in[5], c, kGroupTokens, kGroups};
      return {all_reduce(sum_partial(m(in[0]).y, {}), "ep")};
    };
    return shard_map(fn, *Mesh::Create({{"ep", 2}}), {P("ep", None), P(), P(), P(), P(), P()},
                     {P()})(Inputs(4));
  };
  EXPECT_TRUE(spmd_testing::RejectedWith([&] { return run(cfg); },
                                         {"holds 4 experts on this device", "need 2"}));
  cfg.expert_axes = {"xx"};
  EXPECT_TRUE(spmd_testing::RejectedWith([&] { return run(cfg); },
                                         {"expert axis 'xx' is not an axis of mesh"}));
}

TEST(Moe, BadConfigsAreRejected) {
  auto msg = [](MoeConfig c, int64_t ways) { return ValidateMoeConfig(c, ways).ToString(); };
  EXPECT_TRUE(ValidateMoeConfig(Config(6, 2, 1.0), 3).ok());
  EXPECT_THAT(msg(Config(6, 2, 1.0), 4),
              ::testing::HasSubstr("6 experts are not divisible by the 4"));
  EXPECT_THAT(msg(Config(4, 5, 1.0), 1), ::testing::HasSubstr("topk = 5 with 4 experts"));
  EXPECT_THAT(msg(Config(4, 0, 1.0), 1), ::testing::HasSubstr("topk = 0"));
  EXPECT_THAT(msg(Config(4, 1, 0.0), 1), ::testing::HasSubstr("capacity factor 0"));
  EXPECT_THAT(msg(Config(-1, 1, 1.0), 1), ::testing::HasSubstr("experts = -1"));
  MoeConfig c = Config(4, 1, 1.0);
  c.aux_loss_coef = -1;
  EXPECT_THAT(msg(c, 1), ::testing::HasSubstr("aux loss coefficient -1"));
  // Rows that are not whole routing groups.
  EXPECT_TRUE(spmd_testing::RejectedWith([] { PlanRouting({0, 1, 0}, 3, 1, 2, 2, 1); },
                                    {"3 tokens", "routing groups of 2"}));
}

}  // namespace
}  // namespace shardmap
