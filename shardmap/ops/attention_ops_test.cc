// causal_attention: the fused typed op equals the materialised composite (einsum, causal_softmax,
// einsum) in value and gradient, sharded over batch and heads equals one device and f64 finite
// differences, and it rejects a sharded sequence, unlike shardings of q/k/v and pending sums.
// Grouped-query attention (fewer kv heads) against the grouped materialised path.
#include "shardmap/ops/attention_ops.h"

#include <cmath>
#include <vector>

#include "autograd/value_and_grad.h"
#include "gtest/gtest.h"
#include "shardmap/ops/collective_ops.h"
#include "shardmap/ops/einsum.h"
#include "shardmap/ops/nn_ops.h"
#include "shardmap/ops/ops.h"
#include "shardmap/shard_map.h"
#include "spmd_testing/testing.h"
#include "tensor/random.h"

namespace shardmap {
namespace {

// q, k, v, w [b, t, h, d], b S0 over dp and heads S2 over tp: loss = sum(attn(q, k, v) * w).
ShardMap MakeAttn(const Mesh& mesh, bool fused, double scale, int64_t offset = 0) {
  ShardFn fn = [fused, scale, offset](const std::vector<Value>& in) -> std::vector<Value> {
    Value o;
    if (fused) {
      o = causal_attention(in[0], in[1], in[2], scale, offset);
    } else {
      Value p = causal_softmax(einsum("bthd,bshd->bhts", in[0] * scale, in[1]), offset);
      o = einsum("bhts,bshd->bthd", p, in[2]);
    }
    return {all_reduce(sum_partial(o * in[3], {}), {"dp", "tp"}), o};
  };
  const PartitionSpec s = P("dp", None, "tp", None);
  return shard_map(fn, mesh, {s, s, s, s}, {P(), s});
}

std::vector<Tensor> Inputs(int64_t b, int64_t tq, int64_t tk, int64_t h, int64_t d, DType dt,
                           uint64_t seed) {
  return {RandomNormal({b, tq, h, d}, seed, 0.0, 1.0, dt),
          RandomNormal({b, tk, h, d}, seed + 1, 0.0, 1.0, dt),
          RandomNormal({b, tk, h, d}, seed + 2, 0.0, 1.0, dt),
          RandomNormal({b, tq, h, d}, seed + 3, 0.0, 1.0, dt)};
}

TEST(CausalAttention, MatchesMaterialisedPathInValueAndGradient) {
  Mesh mesh = *Mesh::Create({{"dp", 1}, {"tp", 1}});
  struct Case {
    int64_t b, t, h, d;
  };
  for (DType dt : {DType::kF64, DType::kF32}) {
    for (Case c : {Case{2, 7, 3, 8}, Case{1, 5, 1, 4}, Case{2, 9, 2, 64}, Case{1, 3, 2, 128}}) {
      SCOPED_TRACE(::testing::Message() << DTypeName(dt) << " b" << c.b << " t" << c.t << " h"
                                      << c.h << " d" << c.d);
      const std::vector<Tensor> in = Inputs(c.b, c.t, c.t, c.h, c.d, dt, 10);
      const double scale = 1 / std::sqrt(static_cast<double>(c.d));
      absl::StatusOr<ShardMapGrads> a = value_and_grad(MakeAttn(mesh, true, scale))(in);
      absl::StatusOr<ShardMapGrads> m = value_and_grad(MakeAttn(mesh, false, scale))(in);
      ASSERT_TRUE(a.ok() && m.ok()) << a.status() << m.status();
      const double tol = dt == DType::kF64 ? 1e-12 : 2e-5;
      EXPECT_TRUE(testing::TensorsNearScaled(a->outputs[1], m->outputs[1], tol));
      for (int i = 0; i < 3; ++i) {
        EXPECT_TRUE(testing::TensorsNearScaled(a->grads[i], m->grads[i], tol)) << "input " << i;
      }
    }
  }
}

TEST(CausalAttention, ShardedOverBatchAndHeadsMatchesOneDeviceAndFiniteDifferences) {
  const std::vector<Tensor> in = Inputs(3, 5, 5, 4, 3, DType::kF64, 20);
  auto make = [](const Mesh& m) { return MakeAttn(m, true, 0.6); };
  EXPECT_TRUE(spmd_testing::ShardedMatchesOneDevice(
      make, {{{"dp", 3}, {"tp", 1}}, {{"dp", 1}, {"tp", 2}}, {{"dp", 3}, {"tp", 4}}}, in));
  EXPECT_TRUE(
      spmd_testing::GradientsMatchFiniteDifferences(make(*Mesh::Create({{"dp", 3}, {"tp", 2}})), in));
}

TEST(CausalAttention, OffsetKeysMatchMaterialisedPath) {
  Mesh mesh = *Mesh::Create({{"dp", 1}, {"tp", 1}});
  for (int64_t offset : {int64_t{4}, int64_t{-2}}) {  // -2: the first queries see no key
    const std::vector<Tensor> in = Inputs(2, 5, 9, 2, 4, DType::kF64, 30);
    absl::StatusOr<ShardMapGrads> a = value_and_grad(MakeAttn(mesh, true, 0.5, offset))(in);
    absl::StatusOr<ShardMapGrads> m = value_and_grad(MakeAttn(mesh, false, 0.5, offset))(in);
    ASSERT_TRUE(a.ok() && m.ok()) << a.status() << m.status();
    EXPECT_TENSOR_NEAR(a->outputs[1], m->outputs[1], 1e-12);
    for (int i = 0; i < 3; ++i) EXPECT_TENSOR_NEAR(a->grads[i], m->grads[i], 1e-12);
  }
}

// Grouped-query attention: k, v [b, t, kvh, d] with kvh dividing the query heads h, heads S2
// over tp for all three (each device keeps whole groups). The fused op against the materialised
// grouped einsum (query head g * rep + r reads kv head g, as HF's repeat_kv), in value and
// gradient (dk, dv summed over each group); sharded over tp = 3 and dp = 3 equal to one device;
// f64 finite differences.
ShardMap MakeGqa(const Mesh& mesh, bool fused, double scale, int64_t offset = 0) {
  ShardFn fn = [fused, scale, offset](const std::vector<Value>& in) -> std::vector<Value> {
    const Value &q = in[0], &k = in[1], &v = in[2];
    Value o;
    if (fused) {
      o = causal_attention(q, k, v, scale, offset);
    } else {
      const int64_t b = q.dim(0), t = q.dim(1), h = q.dim(2), d = q.dim(3), g = k.dim(2);
      Value qg = (q * scale).reshape({b, t, g, h / g, d});
      Value p = causal_softmax(einsum("btgrd,bsgd->bgrts", qg, k), offset);
      o = einsum("bgrts,bsgd->btgrd", p, v).reshape({b, t, h, d});
    }
    return {all_reduce(sum_partial(o * in[3], {}), {"dp", "tp"}), o};
  };
  const PartitionSpec s = P("dp", None, "tp", None);
  return shard_map(fn, mesh, {s, s, s, s}, {P(), s});
}

std::vector<Tensor> GqaInputs(int64_t b, int64_t tq, int64_t tk, int64_t h, int64_t kvh,
                              int64_t d, uint64_t seed) {
  return {RandomNormal({b, tq, h, d}, seed, 0.0, 1.0, DType::kF64),
          RandomNormal({b, tk, kvh, d}, seed + 1, 0.0, 1.0, DType::kF64),
          RandomNormal({b, tk, kvh, d}, seed + 2, 0.0, 1.0, DType::kF64),
          RandomNormal({b, tq, h, d}, seed + 3, 0.0, 1.0, DType::kF64)};
}

TEST(CausalAttention, GroupedKvHeadsMatchMaterialisedGroupedPath) {
  Mesh mesh = *Mesh::Create({{"dp", 1}, {"tp", 1}});
  struct Case {
    int64_t b, tq, tk, h, kvh, d, offset;
  };
  for (Case c : {Case{2, 7, 7, 6, 2, 4, 0}, Case{1, 5, 5, 3, 1, 8, 0}, Case{3, 3, 8, 4, 2, 4, 5},
                 Case{1, 6, 4, 6, 3, 4, -2}}) {
    SCOPED_TRACE(::testing::Message() << "h" << c.h << " kvh" << c.kvh << " tq" << c.tq << " tk"
                                      << c.tk << " offset " << c.offset);
    const std::vector<Tensor> in = GqaInputs(c.b, c.tq, c.tk, c.h, c.kvh, c.d, 40);
    absl::StatusOr<ShardMapGrads> a = value_and_grad(MakeGqa(mesh, true, 0.5, c.offset))(in);
    absl::StatusOr<ShardMapGrads> m = value_and_grad(MakeGqa(mesh, false, 0.5, c.offset))(in);
    ASSERT_TRUE(a.ok() && m.ok()) << a.status() << m.status();
    ASSERT_EQ(a->grads[1].shape(), in[1].shape());
    EXPECT_TENSOR_NEAR(a->outputs[1], m->outputs[1], 1e-12);
    for (int i = 0; i < 3; ++i) EXPECT_TENSOR_NEAR(a->grads[i], m->grads[i], 1e-12) << i;
  }
}

TEST(CausalAttention, GroupedKvHeadsShardedOverTpMatchOneDeviceAndFiniteDifferences) {
  // 6 query heads over 3 kv heads: tp = 3 leaves each device 2 query heads and their kv head.
  const std::vector<Tensor> in = GqaInputs(3, 5, 5, 6, 3, 3, 50);
  auto make = [](const Mesh& m) { return MakeGqa(m, true, 0.6); };
  EXPECT_TRUE(spmd_testing::ShardedMatchesOneDevice(
      make, {{{"dp", 3}, {"tp", 1}}, {{"dp", 1}, {"tp", 3}}, {{"dp", 3}, {"tp", 3}}}, in));
  EXPECT_TRUE(spmd_testing::GradientsMatchFiniteDifferences(
      make(*Mesh::Create({{"dp", 3}, {"tp", 3}})), in));
}

TEST(CausalAttention, RejectsShardedSequenceUnlikeShardingsAndPendingSums) {
  Mesh mesh = *Mesh::Create({{"dp", 2}});
  const Tensor x = RandomNormal({2, 4, 2, 4}, 1);
  auto run = [&](ShardFn fn, PartitionSpec qs, PartitionSpec ks) {
    return shard_map(fn, mesh, {qs, ks}, {P()})({x, x});
  };
  ShardFn plain = [](const std::vector<Value>& in) -> std::vector<Value> {
    return {all_reduce(sum_partial(causal_attention(in[0], in[1], in[1], 1.0), {}), "dp")};
  };
  EXPECT_TRUE(spmd_testing::RejectedWith(
      [&] { return run(plain, P(None, "dp", None, None), P(None, "dp", None, None)); },
      {"causal_attention", "whole sequences", "RingCausalAttention"}));
  EXPECT_TRUE(spmd_testing::RejectedWith(
      [&] { return run(plain, P(None, None, None, "dp"), P(None, None, None, "dp")); },
      {"causal_attention", "head_dim"}));
  EXPECT_TRUE(spmd_testing::RejectedWith(
      [&] { return run(plain, P(None, None, "dp", None), P()); },
      {"causal_attention", "q is S2 but k is R", "shard q, k and v alike"}));
  EXPECT_TRUE(spmd_testing::RejectedWith(
      [&] {
        return run(
            [](const std::vector<Value>& in) -> std::vector<Value> {
              Value q = reinterpret(in[0], "dp");  // P on dp
              return {all_reduce(sum(causal_attention(q, in[1], in[1], 1.0), {}), "dp")};
            },
            P("dp", None, None, None), P("dp", None, None, None));
      },
      {"causal_attention", "P"}));
  EXPECT_TRUE(spmd_testing::RejectedWith(
      [&] {
        return run(
            [](const std::vector<Value>& in) -> std::vector<Value> {
              return {causal_attention(in[0].reshape({8, 2, 4}), in[1], in[1], 1.0)};
            },
            P(), P());
      },
      {"causal_attention", "rank 4"}));
}

}  // namespace
}  // namespace shardmap
