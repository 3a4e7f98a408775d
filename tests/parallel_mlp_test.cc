// End-to-end equivalence of the classic parallel layouts with the unsharded computation (f64):
// Megatron tensor-parallel MLP, sequence-parallel MLP, data-parallel linear, 2-D (dp x tp) MLP.
// Outputs and gradients of the global inputs are compared with a single-device run of the plain
// program, and the collectives issued forward and backward are checked (with bytes) through the
// public testing library (spmd_testing), which also runs the 2-D MLP against its one-device
// run on several meshes and against f64 finite differences. Each layout also runs with types
// erased and must give bitwise the same numbers.
#include <string>
#include <vector>

#include "autograd/value_and_grad.h"
#include "gtest/gtest.h"
#include "shardmap/collective_ops.h"
#include "shardmap/context.h"
#include "shardmap/nn_ops.h"
#include "shardmap/ops.h"
#include "shardmap/shard_map.h"
#include "shardmap/sharding.h"
#include "spmd_testing/testing.h"
#include "tests/test_util.h"

namespace shardmap {
namespace {

using testing::Rand;

constexpr double kTol = 1e-12;

// The unsharded reference: fn on one device (a mesh without axes), with its gradients.
struct Reference {
  Tensor loss;
  std::vector<Tensor> grads;
};

Reference RunReference(const std::function<Value(const std::vector<Value>&)>& fn,
                       const std::vector<Tensor>& inputs) {
  SingleRankContext one{Mesh()};
  std::vector<Value> params;
  for (const Tensor& t : inputs) params.push_back(Value::Replicated(t));
  ValueAndGrad r = value_and_grad(fn, params);
  Reference ref{r.value.tensor, {}};
  for (const Value& g : r.grads) ref.grads.push_back(g.tensor);
  return ref;
}

void ExpectMatches(const ShardMapGrads& got, const Reference& ref) {
  EXPECT_TENSOR_NEAR(got.outputs[0], ref.loss, kTol * (1 + std::fabs(ref.loss.item())));
  ASSERT_EQ(got.grads.size(), ref.grads.size());
  for (size_t k = 0; k < ref.grads.size(); ++k) {
    SCOPED_TRACE(absl::StrCat("gradient of input ", k));
    EXPECT_TENSOR_NEAR(got.grads[k], ref.grads[k], 1e-10);
  }
}

void ExpectBitwiseSame(const ShardMapGrads& a, const ShardMapGrads& b) {
  for (size_t k = 0; k < a.outputs.size(); ++k) {
    EXPECT_TRUE(testing::TensorsBitwiseEqual(a.outputs[k], b.outputs[k])) << "output " << k;
  }
  for (size_t k = 0; k < a.grads.size(); ++k) {
    EXPECT_TRUE(testing::TensorsBitwiseEqual(a.grads[k], b.grads[k])) << "grad " << k;
  }
}

// ---- Megatron MLP, two layers ------------------------------------------------------------

Value MlpRef(const std::vector<Value>& p) {
  Value y1 = gelu(p[0].matmul(p[1])).matmul(p[2]);
  Value y2 = gelu(y1.matmul(p[3])).matmul(p[4]);
  return sum(y2 * y2, {});
}

class MegatronTest : public ::testing::TestWithParam<int> {};

TEST_P(MegatronTest, MatchesUnshardedWithOneAllReducePerLayerEachWay) {
  const int tp = GetParam();
  Mesh mesh = *Mesh::Create({{"tp", tp}});
  const int64_t b = 5, d = 7, h = 4 * tp;
  std::vector<Tensor> in = {Rand({b, d}, 1), Rand({d, h}, 2), Rand({h, d}, 3), Rand({d, h}, 4),
                            Rand({h, d}, 5)};
  ShardFn fn = [](const std::vector<Value>& p) -> std::vector<Value> {
    Value y1 = all_reduce(gelu(p[0].matmul(p[1])).matmul(p[2]), "tp");
    Value y2 = all_reduce(gelu(y1.matmul(p[3])).matmul(p[4]), "tp");
    return {sum(y2 * y2, {}), y2};
  };
  std::vector<CollectiveRecord> log;
  ShardMapOptions opts;
  opts.collective_log = &log;
  std::vector<PartitionSpec> in_specs = {P(), P(None, "tp"), P("tp", None), P(None, "tp"),
                                         P("tp", None)};
  ShardMap f = shard_map(fn, mesh, in_specs, {P(), P()}, opts);
  absl::StatusOr<ShardMapGrads> got = value_and_grad(f)(in);
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectMatches(*got, RunReference(MlpRef, in));
  // Each layer: its [b, d] f64 output forward, the gradient of its [b, d] input backward.
  spmd_testing::ExpectCollectives(mesh, log, {spmd_testing::AllReduce("tp", 2).Bytes(b * d * 8)},
                                  {spmd_testing::AllReduce("tp", 2).Bytes(b * d * 8)});

  // Forward-only call agrees with the differentiable one.
  absl::StatusOr<std::vector<Tensor>> fwd = f(in);
  ASSERT_TRUE(fwd.ok()) << fwd.status();
  EXPECT_TRUE(testing::TensorsBitwiseEqual((*fwd)[1], got->outputs[1]));

  // Erased types: bitwise the same numbers.
  ShardMapOptions erased = opts;
  erased.check = TypeCheck::kErased;
  absl::StatusOr<ShardMapGrads> got_erased =
      value_and_grad(shard_map(fn, mesh, in_specs, {P(), P()}, erased))(in);
  ASSERT_TRUE(got_erased.ok()) << got_erased.status();
  ExpectBitwiseSame(*got, *got_erased);
}

INSTANTIATE_TEST_SUITE_P(Tp, MegatronTest, ::testing::Values(1, 2, 3, 4));

// ---- Sequence-parallel MLP ---------------------------------------------------------------

Value SpRef(const std::vector<Value>& p) {
  Value y = gelu(p[0].matmul(p[1])).matmul(p[2]);
  return sum(y * y, {});
}

class SequenceParallelTest : public ::testing::TestWithParam<int> {};

TEST_P(SequenceParallelTest, AllGatherAndReduceScatterEachWay) {
  const int tp = GetParam();
  Mesh mesh = *Mesh::Create({{"tp", tp}});
  const int64_t s = 3 * tp, d = 5, h = 2 * tp;
  std::vector<Tensor> in = {Rand({s, d}, 11), Rand({d, h}, 12), Rand({h, d}, 13)};
  ShardFn fn = [](const std::vector<Value>& p) -> std::vector<Value> {
    Value x = all_gather(p[0], 0, "tp");                          // S0 -> R
    Value y = reduce_scatter(gelu(x.matmul(p[1])).matmul(p[2]), 0, "tp");  // P -> S0
    return {sum_partial(y * y, {}), y};
  };
  std::vector<CollectiveRecord> log;
  ShardMapOptions opts;
  opts.collective_log = &log;
  std::vector<PartitionSpec> in_specs = {P("tp", None), P(None, "tp"), P("tp", None)};
  std::vector<PartitionSpec> out_specs = {P().Unreduced({"tp"}), P("tp", None)};
  absl::StatusOr<ShardMapGrads> got = value_and_grad(shard_map(fn, mesh, in_specs, out_specs,
                                                               opts))(in);
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectMatches(*got, RunReference(SpRef, in));
  spmd_testing::ExpectCollectives(
      mesh, log, {spmd_testing::AllGather("tp"), spmd_testing::ReduceScatter("tp")},
      {spmd_testing::AllGather("tp"), spmd_testing::ReduceScatter("tp")});

  ShardMapOptions erased = opts;
  erased.check = TypeCheck::kErased;
  absl::StatusOr<ShardMapGrads> e =
      value_and_grad(shard_map(fn, mesh, in_specs, out_specs, erased))(in);
  ASSERT_TRUE(e.ok()) << e.status();
  ExpectBitwiseSame(*got, *e);
}

INSTANTIATE_TEST_SUITE_P(Tp, SequenceParallelTest, ::testing::Values(1, 2, 3));

// ---- Data-parallel linear ----------------------------------------------------------------

TEST(DataParallelTest, GradientOfReplicatedWeightIsSummedOnce) {
  for (int dp : {2, 3}) {
    SCOPED_TRACE(absl::StrCat("dp=", dp));
    Mesh mesh = *Mesh::Create({{"dp", dp}});
    const int64_t b = 2 * dp + dp, d = 3, o = 5;
    std::vector<Tensor> in = {Rand({b, d}, 21), Rand({d, o}, 22), Rand({o}, 23)};
    // Per device: the local share of the global sum of squares (P on dp), no communication.
    ShardFn fn = [](const std::vector<Value>& p) -> std::vector<Value> {
      Value y = p[0].matmul(p[1]) + p[2];
      return {sum_partial(y * y, {})};
    };
    std::vector<CollectiveRecord> log;
    ShardMapOptions opts;
    opts.collective_log = &log;
    absl::StatusOr<ShardMapGrads> got = value_and_grad(
        shard_map(fn, mesh, {P("dp", None), P(), P()}, {P().Unreduced({"dp"})}, opts))(in);
    ASSERT_TRUE(got.ok()) << got.status();
    ExpectMatches(*got, RunReference(
                            [](const std::vector<Value>& p) {
                              Value y = p[0].matmul(p[1]) + p[2];
                              return sum(y * y, {});
                            },
                            in));
    spmd_testing::ExpectCollectives(mesh, log, /*forward=*/{}, /*backward=*/{});
  }
}

TEST(DataParallelTest, PerDeviceValueAndGradLeavesPendingSumsOrReducesThem) {
  Mesh mesh = *Mesh::Create({{"dp", 3}});
  Tensor x = Rand({6, 4}, 31), w = Rand({4, 2}, 32);
  Reference ref = RunReference(
      [](const std::vector<Value>& p) {
        Value y = p[0].matmul(p[1]);
        return sum(y * y, {});
      },
      {x, w});
  absl::Status s = RunSpmd(mesh, [&](RankContext& ctx) {
    Value xl(ShardOf(x, mesh, P("dp"), ctx.rank()), P("dp").InputType(mesh));
    Value wl = Value::Replicated(w);
    auto loss = [&](const std::vector<Value>& p) {
      Value y = xl.matmul(p[0]);
      return sum_partial(y * y, {});
    };
    ValueAndGrad pending = value_and_grad(loss, {wl});
    EXPECT_EQ(pending.grads[0].type[0].kind, AxisKind::kP);
    ValueAndGrad reduced = value_and_grad(loss, {wl}, /*reduce_partial_grads=*/true);
    EXPECT_EQ(reduced.grads[0].type[0].kind, AxisKind::kR);
    EXPECT_TENSOR_NEAR(reduced.grads[0].tensor, ref.grads[1], 1e-10);
    EXPECT_EQ(ctx.CountCollectives("all_reduce", 1, false), 1);
  });
  ASSERT_TRUE(s.ok()) << s;
}

// ---- 2-D (dp x tp) MLP -------------------------------------------------------------------

TEST(TwoDimMlpTest, MatchesUnshardedOnDpByTp) {
  for (auto [dp, tp] : std::vector<std::pair<int, int>>{{2, 3}, {3, 2}, {2, 2}}) {
    SCOPED_TRACE(absl::StrCat("dp=", dp, " tp=", tp));
    Mesh mesh = *Mesh::Create({{"dp", dp}, {"tp", tp}});
    const int64_t b = 3 * dp, d = 5, h = 2 * tp;
    std::vector<Tensor> in = {Rand({b, d}, 41), Rand({d, h}, 42), Rand({h}, 43), Rand({h, d}, 44),
                              Rand({d}, 45)};
    ShardFn fn = [](const std::vector<Value>& p) -> std::vector<Value> {
      Value a = gelu(p[0].matmul(p[1]) + p[2]);
      Value y = all_reduce(a.matmul(p[3]), "tp") + p[4];
      return {sum_partial(y * y, {}), y};
    };
    std::vector<PartitionSpec> in_specs = {P("dp", None), P(None, "tp"), P("tp"), P("tp", None),
                                           P()};
    std::vector<PartitionSpec> out_specs = {P().Unreduced({"dp"}), P("dp", None)};
    std::vector<CollectiveRecord> log;
    ShardMapOptions opts;
    opts.collective_log = &log;
    absl::StatusOr<ShardMapGrads> got =
        value_and_grad(shard_map(fn, mesh, in_specs, out_specs, opts))(in);
    ASSERT_TRUE(got.ok()) << got.status();
    ExpectMatches(*got, RunReference(
                            [](const std::vector<Value>& p) {
                              Value a = gelu(p[0].matmul(p[1]) + p[2]);
                              Value y = a.matmul(p[3]) + p[4];
                              return sum(y * y, {});
                            },
                            in));
    // This rank's [b/dp, d] rows each way; the dp gradient sums happen at the boundary.
    spmd_testing::ExpectCollectives(mesh, log, {spmd_testing::AllReduce("tp").Bytes(3 * d * 8)},
                                    {spmd_testing::AllReduce("tp").Bytes(3 * d * 8)});

    ShardMapOptions erased = opts;
    erased.check = TypeCheck::kErased;
    absl::StatusOr<ShardMapGrads> e =
        value_and_grad(shard_map(fn, mesh, in_specs, out_specs, erased))(in);
    ASSERT_TRUE(e.ok()) << e.status();
    ExpectBitwiseSame(*got, *e);
  }
}

// The same block through the public testing library: one input set for every mesh (odd and
// non-power-of-two sizes), compared with its one-device run and with finite differences.
ShardMap TwoDimMlp(const Mesh& mesh) {
  ShardFn fn = [](const std::vector<Value>& p) -> std::vector<Value> {
    Value a = gelu(p[0].matmul(p[1]) + p[2]);
    Value y = all_reduce(a.matmul(p[3]), "tp") + p[4];
    return {sum_partial(y * y, {}), y};
  };
  ShardMapOptions o;
  o.input_names = {"x", "w1", "b1", "w2", "b2"};
  o.output_names = {"loss", "y"};
  return shard_map(fn, mesh, {P("dp", None), P(None, "tp"), P("tp"), P("tp", None), P()},
                   {P().Unreduced({"dp"}), P("dp", None)}, o);
}

TEST(TwoDimMlpTest, MatchesOneDeviceAndFiniteDifferencesThroughTheTestingLibrary) {
  std::vector<Tensor> in = {Rand({6, 5}, 46), Rand({5, 6}, 47), Rand({6}, 48), Rand({6, 5}, 49),
                            Rand({5}, 50)};
  EXPECT_TRUE(spmd_testing::ShardedMatchesOneDevice(
      TwoDimMlp, {{{"dp", 1}, {"tp", 1}}, {{"dp", 2}, {"tp", 3}}, {{"dp", 3}, {"tp", 2}},
                  {{"dp", 1}, {"tp", 6}}, {{"dp", 6}, {"tp", 1}}},
      in));
  EXPECT_TRUE(spmd_testing::GradientsMatchFiniteDifferences(
      TwoDimMlp(*Mesh::Create({{"dp", 3}, {"tp", 2}})), in));
}

// ---- Tensor-parallel causal self-attention (heads sharded on tp) ---------------------------

// x [b*s, d]; wq/wk/wv [d, nh*hd] (column-parallel: heads split), wo [nh*hd, d] (row-parallel).
Value Attention(const std::vector<Value>& p, int64_t b, int64_t s, int64_t hd) {
  const Value& x = p[0];
  auto heads = [&](const Value& w) {
    Value t = x.matmul(w);                         // [b*s, nh*hd]
    int64_t nh = t.dim(1) / hd;
    return permute(t.reshape({b, s, nh, hd}), {0, 2, 1, 3});  // [b, nh, s, hd]
  };
  Value q = heads(p[1]), k = heads(p[2]), v = heads(p[3]);
  Value scores = matmul(q, k, false, true) * (1.0 / std::sqrt(static_cast<double>(hd)));
  Value a = softmax(causal_mask(scores), -1).matmul(v);   // [b, nh, s, hd]
  int64_t nh = a.dim(1);
  Value merged = permute(a, {0, 2, 1, 3}).reshape({b * s, nh * hd});
  return merged.matmul(p[4]);                             // P on tp when heads are split
}

TEST(TensorParallelAttentionTest, MatchesUnshardedAndTracksHeadSharding) {
  for (int tp : {1, 2, 3}) {
    SCOPED_TRACE(absl::StrCat("tp=", tp));
    Mesh mesh = *Mesh::Create({{"tp", tp}});
    const int64_t b = 2, s = 3, d = 5, hd = 2, nh = 2 * tp;
    std::vector<Tensor> in = {Rand({b * s, d}, 61), Rand({d, nh * hd}, 62),
                              Rand({d, nh * hd}, 63), Rand({d, nh * hd}, 64),
                              Rand({nh * hd, d}, 65)};
    ShardFn fn = [=](const std::vector<Value>& p) -> std::vector<Value> {
      Value yp = Attention(p, b, s, hd);
      EXPECT_EQ(yp.type[0].kind, AxisKind::kP) << yp.ToString();
      Value y = all_reduce(yp, "tp");
      return {sum(y * y, {}), y};
    };
    std::vector<CollectiveRecord> log;
    ShardMapOptions opts;
    opts.collective_log = &log;
    std::vector<PartitionSpec> in_specs = {P(), P(None, "tp"), P(None, "tp"), P(None, "tp"),
                                           P("tp", None)};
    absl::StatusOr<ShardMapGrads> got =
        value_and_grad(shard_map(fn, mesh, in_specs, {P(), P()}, opts))(in);
    ASSERT_TRUE(got.ok()) << got.status();
    ExpectMatches(*got, RunReference(
                            [=](const std::vector<Value>& p) {
                              Value y = Attention(p, b, s, hd);
                              return sum(y * y, {});
                            },
                            in));
    spmd_testing::ExpectCollectives(mesh, log, {spmd_testing::AllReduce("tp").Bytes(b * s * d * 8)},
                                    {spmd_testing::AllReduce("tp").Bytes(b * s * d * 8)});
  }
}

// ---- Vocab-parallel cross-entropy (Megatron), I loss on tp ---------------------------------

TEST(VocabParallelTest, CrossEntropyMatchesUnsharded) {
  for (int tp : {2, 3}) {
    SCOPED_TRACE(absl::StrCat("tp=", tp));
    Mesh mesh = *Mesh::Create({{"tp", tp}});
    const int64_t n = 5, v = 4 * tp;
    std::vector<int64_t> tv;
    for (int i = 0; i < n; ++i) tv.push_back((i * 7 + 3) % v);
    std::vector<Tensor> in = {Rand({n, v}, 51), Tensor::FromVector<int64_t>({n}, tv)};
    ShardFn fn = [n](const std::vector<Value>& p) -> std::vector<Value> {
      const Value& logits = p[0];  // S1 on tp
      Value m = all_reduce(local_max(logits, {1}, true), "tp", To::kR, ReduceKind::kMax);
      Value z = logits - m;
      Value se = all_reduce(sum_partial(exp(z), {1}, true), "tp");
      Value picked = all_reduce(take_along_last(z, p[1]), "tp", To::kI);
      Value rows = convert(log(se).reshape({n}), "tp", Convert::kRToP);  // keep one copy
      Value loss = all_reduce(rows, "tp", To::kI) - picked;                // I on tp
      return {sum(loss, {}) / static_cast<double>(n)};
    };
    std::vector<CollectiveRecord> log;
    ShardMapOptions opts;
    opts.collective_log = &log;
    absl::StatusOr<ShardMapGrads> got =
        value_and_grad(shard_map(fn, mesh, {P(None, "tp"), P()}, {P()}, opts))(in);
    ASSERT_TRUE(got.ok()) << got.status();
    Reference ref = RunReference(
        [n](const std::vector<Value>& p) {
          return sum(cross_entropy(p[0], p[1]), {}) / static_cast<double>(n);
        },
        in);
    EXPECT_TENSOR_NEAR(got->outputs[0], ref.loss, 1e-12);
    EXPECT_TENSOR_NEAR(got->grads[0], ref.grads[0], 1e-12);
  }
}

}  // namespace
}  // namespace shardmap
