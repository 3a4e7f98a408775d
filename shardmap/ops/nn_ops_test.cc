// causal_softmax: the fused op equals the composite softmax(causal_mask(x), -1) in value and
// gradient (f64 and f32, odd sizes, offsets), keeps the composite's types and rejects what it
// rejects.
#include "shardmap/ops/nn_ops.h"

#include <vector>

#include "autograd/value_and_grad.h"
#include "gtest/gtest.h"
#include "shardmap/ops/collective_ops.h"
#include "shardmap/ops/ops.h"
#include "shardmap/shard_map.h"
#include "spmd_testing/testing.h"
#include "tensor/random.h"

namespace shardmap {
namespace {

// x [b, h, s, t] and w S0 over dp: loss = sum(attn(x) * w), attn fused or composite.
ShardMap MakeAttn(const Mesh& mesh, bool fused, int64_t offset) {
  ShardFn fn = [fused, offset](const std::vector<Value>& in) -> std::vector<Value> {
    Value p = fused ? causal_softmax(in[0], offset) : softmax(causal_mask(in[0], offset), -1);
    return {all_reduce(sum_partial(p * in[1], {}), "dp"), p};
  };
  const PartitionSpec s0 = P("dp", None, None, None);
  return shard_map(fn, mesh, {s0, s0}, {P(), s0});
}

TEST(CausalSoftmax, MatchesCompositeInValueAndGradient) {
  Mesh mesh = *Mesh::Create({{"dp", 1}});
  for (DType dt : {DType::kF64, DType::kF32}) {
    for (int64_t offset : {0, 2, 4}) {  // offsets >= 0: every row has a visible key
      std::vector<Tensor> in = {RandomNormal({3, 2, 5, 7}, 1, 0.0, 2.0, dt),
                                RandomNormal({3, 2, 5, 7}, 2, 0.0, 1.0, dt)};
      absl::StatusOr<ShardMapGrads> a = value_and_grad(MakeAttn(mesh, true, offset))(in);
      absl::StatusOr<ShardMapGrads> b = value_and_grad(MakeAttn(mesh, false, offset))(in);
      ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
      const double tol = dt == DType::kF64 ? 1e-14 : 1e-6;
      EXPECT_TENSOR_NEAR(a->outputs[1], b->outputs[1], tol);
      EXPECT_TENSOR_NEAR(a->grads[0], b->grads[0], tol);
    }
  }
}

TEST(CausalSoftmax, ShardedMatchesOneDeviceAndFiniteDifferences) {
  std::vector<Tensor> in = {RandomNormal({3, 2, 4, 5}, 3, 0.0, 1.0, DType::kF64),
                            RandomNormal({3, 2, 4, 5}, 4, 0.0, 1.0, DType::kF64)};
  auto make = [](const Mesh& m) { return MakeAttn(m, true, 1); };
  EXPECT_TRUE(spmd_testing::ShardedMatchesOneDevice(make, {{{"dp", 3}}}, in));
  EXPECT_TRUE(spmd_testing::GradientsMatchFiniteDifferences(make(*Mesh::Create({{"dp", 3}})), in));
}

TEST(CausalSoftmax, RowsWithNoVisibleKeyAreZero) {
  Mesh mesh = *Mesh::Create({{"dp", 1}});
  std::vector<Tensor> in = {RandomNormal({1, 1, 4, 3}, 5, 0.0, 1.0, DType::kF64),
                            RandomNormal({1, 1, 4, 3}, 6, 0.0, 1.0, DType::kF64)};
  absl::StatusOr<ShardMapGrads> r = value_and_grad(MakeAttn(mesh, true, -2))(in);
  ASSERT_TRUE(r.ok()) << r.status();
  for (int64_t j = 0; j < 3; ++j) {  // rows 0, 1 see no key; row 2 sees key 0 only
    EXPECT_EQ(r->outputs[1].at(j), 0.0);
    EXPECT_EQ(r->outputs[1].at(3 + j), 0.0);
    EXPECT_EQ(r->grads[0].at(j), 0.0);
    EXPECT_EQ(r->outputs[1].at(6 + j), j == 0 ? 1.0 : 0.0);
  }
}

TEST(CausalSoftmax, RejectsShardedKeysQueriesAndPendingSums) {
  Mesh mesh = *Mesh::Create({{"dp", 2}});
  auto run = [&](ShardFn fn, PartitionSpec spec) {
    return shard_map(fn, mesh, {spec}, {P()})({RandomNormal({2, 4, 4}, 1)});
  };
  ShardFn plain = [](const std::vector<Value>& in) -> std::vector<Value> {
    return {all_reduce(sum_partial(causal_softmax(in[0]), {}), "dp")};
  };
  EXPECT_TRUE(spmd_testing::RejectedWith([&] { return run(plain, P(None, None, "dp")); },
                                         {"causal_softmax", "gather the keys"}));
  EXPECT_TRUE(spmd_testing::RejectedWith([&] { return run(plain, P(None, "dp", None)); },
                                         {"causal_softmax", "gather the queries"}));
  EXPECT_TRUE(spmd_testing::RejectedWith(
      [&] {
        return run(
            [](const std::vector<Value>& in) -> std::vector<Value> {
              return {all_reduce(sum(causal_softmax(reinterpret(in[0], "dp")), {}), "dp")};
            },
            P("dp", None, None));
      },
      {"causal_softmax", "P"}));
}

}  // namespace
}  // namespace shardmap
